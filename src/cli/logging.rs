//! Logging: text or JSON on stderr, the user's `REGBROKER_LOG` filter, and caps on the
//! library targets that would log secrets, which no user filter can lift. Text is
//! coloured only when stderr is a terminal and `NO_COLOR` is unset or empty
//! (<https://no-color.org>).

use clap::ValueEnum;

/// Log format (`--log-format`, `REGBROKER_LOG_FORMAT`).
#[derive(Clone, Copy, Debug, ValueEnum)]
pub(super) enum LogFormat {
    Text,
    Json,
}

/// The log filter: `user` (EnvFilter syntax, e.g. `info` or `regbroker=debug`) and, on
/// top, caps on library targets that would log secrets (the AWS SDK logs session tokens at
/// TRACE; kube-client quotes unparsable response bodies, such as a Secret, at WARN). The
/// caps only ever lower a level: an event must pass both filters, so `REGBROKER_LOG=trace`
/// cannot undo a cap, and a cap never turns on a library's debug logs.
pub fn log_filter<S>(
    user: &str,
) -> impl tracing_subscriber::layer::Filter<S> + Send + Sync + 'static
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::filter::{FilterExt as _, LevelFilter, Targets};
    let user = tracing_subscriber::EnvFilter::try_new(user).unwrap_or_else(|e| {
        eprintln!("regbroker: ignoring invalid REGBROKER_LOG ({e}); using `info`");
        tracing_subscriber::EnvFilter::new("info")
    });
    let caps = crate::broker::providers::log_directives()
        .into_iter()
        .chain(crate::kubernetes::LOG_DIRECTIVES.iter().copied())
        .filter_map(|d| {
            let (target, level) = d.split_once('=')?;
            Some((target.to_string(), level.parse::<LevelFilter>().ok()?))
        });
    let caps = Targets::new()
        .with_default(LevelFilter::TRACE)
        .with_targets(caps);
    user.and(caps)
}

/// The env var holding the user's log filter.
pub(super) const LOG_ENV: &str = "REGBROKER_LOG";

/// Whether text on stderr gets ANSI colour: only on a terminal, and never when `NO_COLOR`
/// is set to a non-empty value (<https://no-color.org>).
pub(super) fn use_colour(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Whether this process's stderr gets colour (see [`use_colour`]).
pub(super) fn stderr_colour() -> bool {
    use std::io::IsTerminal as _;
    use_colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

/// Installs the global subscriber: `REGBROKER_LOG` (or `default_level`) under the caps.
/// An invalid `REGBROKER_LOG` is a configuration error naming the variable.
pub(super) fn init_tracing(format: LogFormat, default_level: &str) -> Result<(), String> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let user = match std::env::var(LOG_ENV) {
        Ok(v) if !v.trim().is_empty() => v,
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(format!("{LOG_ENV} is not valid UTF-8"));
        }
        _ => default_level.to_string(),
    };
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&user) {
        return Err(format!(
            "{LOG_ENV}: not a log filter ({e}); use a level such as `info` or directives such as `regbroker=debug`"
        ));
    }
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(stderr_colour())
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => tracing_subscriber::registry()
            .with(layer.with_filter(log_filter(&user)))
            .try_init(),
        LogFormat::Json => tracing_subscriber::registry()
            .with(
                layer
                    .json()
                    .flatten_event(true)
                    .with_filter(log_filter(&user)),
            )
            .try_init(),
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        let cases = [
            (true, None, true),
            (true, Some(""), true),
            (true, Some("1"), false),
            (true, Some("false"), false),
            (false, None, false),
            (false, Some(""), false),
            (false, Some("1"), false),
        ];
        for (tty, no_color, want) in cases {
            assert_eq!(
                super::use_colour(tty, no_color.map(OsStr::new)),
                want,
                "terminal {tty}, NO_COLOR {no_color:?}"
            );
        }
    }

    #[derive(Clone, Default)]
    struct Capture(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Capture {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Emits one event per (library, level) case under `log_filter(user)`; returns the
    /// names of the events that got through.
    fn passed(user: &str) -> String {
        let capture = Capture::default();
        let writer = capture.clone();
        let layer = tracing_subscriber::fmt::layer()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .with_filter(super::log_filter(user));
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layer), || {
            tracing::debug!(target: "regbroker::broker", "own-debug");
            tracing::debug!(target: "hyper_util::client", "hyper-debug");
            tracing::debug!(target: "aws_smithy_runtime::client", "aws-debug");
            tracing::trace!(target: "aws_smithy_runtime::client", "aws-trace");
            tracing::warn!(target: "kube_client::client", "kube-warn");
            tracing::error!(target: "kube_client::client", "kube-error");
        });
        String::from_utf8(capture.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn caps_never_raise_a_level() {
        let out = passed("warn");
        for quiet in [
            "own-debug",
            "hyper-debug",
            "aws-debug",
            "aws-trace",
            "kube-warn",
        ] {
            assert!(!out.contains(quiet), "{quiet} logged at `warn`:\n{out}");
        }
        assert!(out.contains("kube-error"));
        let out = passed("regbroker=debug");
        assert!(
            out.contains("own-debug") && !out.contains("hyper-debug"),
            "{out}"
        );
    }

    #[cfg(feature = "aws")]
    #[test]
    fn caps_hold_even_at_trace() {
        let out = passed("trace");
        assert!(
            out.contains("own-debug") && out.contains("aws-debug"),
            "{out}"
        );
        assert!(
            !out.contains("aws-trace"),
            "the AWS SDK's TRACE logs hold secrets:\n{out}"
        );
        assert!(
            !out.contains("kube-warn"),
            "kube-client's WARN may quote a Secret:\n{out}"
        );
    }
}
