//! Logging: text or JSON on stderr, the user's `REGBROKER_LOG` filter, and caps on the
//! library targets that would log secrets, which no user filter can lift.

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

/// Installs the global subscriber: `REGBROKER_LOG` (or `default_level`) under the caps.
pub(super) fn init_tracing(format: LogFormat, default_level: &str) {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let user = std::env::var("REGBROKER_LOG").unwrap_or_else(|_| default_level.to_string());
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
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
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;

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
