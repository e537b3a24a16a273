//! How environment values read one way everywhere: booleans, and the names of every
//! variable a mode reads besides its flags' env forms (listed by its `--help`).
//!
//! A boolean variable (`REGBROKER_INSECURE_LISTEN`, `REGBROKER_LEADER_ELECT`,
//! `REGBROKER_INSECURE_ENDPOINT`) takes `true`/`false`, `1`/`0`, `yes`/`no`, `on`/`off`
//! (also `y`/`n`, `t`/`f`), in any case; anything else is a configuration error naming
//! the variable. The same words clap's `BoolishValueParser` takes, so a flag's env form
//! and a variable read outside clap agree.

/// The words that read as `true`, lower case.
pub const TRUE_WORDS: &[&str] = &["true", "t", "yes", "y", "on", "1"];
/// The words that read as `false`, lower case.
pub const FALSE_WORDS: &[&str] = &["false", "f", "no", "n", "off", "0"];

/// A boolean value by the rule above (surrounding blanks ignored); empty is `false`, as
/// `VAR=` is the usual way to switch a variable off. The error says which words are
/// accepted, never the value.
pub fn parse_bool(value: &str) -> Result<bool, String> {
    let v = value.trim().to_ascii_lowercase();
    if v.is_empty() {
        Ok(false)
    } else if TRUE_WORDS.contains(&v.as_str()) {
        Ok(true)
    } else if FALSE_WORDS.contains(&v.as_str()) {
        Ok(false)
    } else {
        Err("expected true or false (also 1/0, yes/no, on/off)".to_string())
    }
}

/// The boolean variable `var`: unset or empty is `false`, otherwise [`parse_bool`],
/// whose error then names `var`.
pub fn bool_var(var: &str, value: Option<&str>) -> Result<bool, String> {
    match value.map(str::trim).filter(|v| !v.is_empty()) {
        None => Ok(false),
        Some(v) => parse_bool(v).map_err(|e| format!("{var}: {e}")),
    }
}

/// A group of variables read outside the command line parser, for `--help`.
#[derive(Clone, Debug)]
pub struct Group {
    /// What they set.
    pub title: &'static str,
    /// Their names.
    pub vars: Vec<&'static str>,
    /// A note after the names, if any.
    pub note: &'static str,
}

/// The ways regbroker runs, as far as the environment is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `serve`.
    Serve,
    /// `resolve` and `doctor`: a broker in this process, once.
    Check,
    /// `credential-helper` (`docker-credential-regbroker`) and
    /// `kubelet-credential-provider`.
    OneShot,
}

/// The variables `mode` reads besides its flags' env forms (clap lists those itself).
pub fn read_by(mode: Mode) -> Vec<Group> {
    use crate::oneshot::backend as b;
    let mut out = vec![Group {
        title: "logs",
        vars: vec!["REGBROKER_LOG", "NO_COLOR"],
        note: "(REGBROKER_LOG: a level or EnvFilter directives; NO_COLOR set: no colour)",
    }];
    match mode {
        Mode::OneShot => out.push(Group {
            title: "settings",
            vars: vec![
                b::ENDPOINT_ENV,
                b::CA_FILE_ENV,
                b::AUTH_TOKEN_FILE_ENV,
                b::INSECURE_ENDPOINT_ENV,
                b::CONFIG_ENV,
                b::DOCKER_CONFIG_ENV,
                crate::oneshot::disk_cache::ENV,
            ],
            note: "",
        }),
        Mode::Serve => out.push(Group {
            title: "leader election",
            vars: vec!["POD_NAMESPACE", "POD_NAME", "HOSTNAME", "KUBECONFIG"],
            note: "(the Lease's namespace and holder; the API client's usual configuration)",
        }),
        Mode::Check => {}
    }
    out.extend(providers());
    out
}

/// What the compiled-in providers read.
fn providers() -> Vec<Group> {
    vec![
        #[cfg(feature = "aws")]
        Group {
            title: "aws",
            vars: vec![regbroker_aws::ECR_RATE_ENV, regbroker_aws::STS_RATE_ENV],
            note: "and the AWS SDK's own (AWS_REGION, AWS_ROLE_ARN, AWS_WEB_IDENTITY_TOKEN_FILE, AWS_CONTAINER_CREDENTIALS_FULL_URI, AWS_ACCESS_KEY_ID, AWS_PROFILE, AWS_ENDPOINT_URL, ...)",
        },
        #[cfg(feature = "azure")]
        Group {
            title: "azure",
            vars: regbroker_azure::Env::NAMES.to_vec(),
            note: "",
        },
        #[cfg(feature = "gcp")]
        Group {
            title: "gcp",
            vars: vec![
                regbroker_gcp::CREDENTIALS_ENV,
                regbroker_gcp::METADATA_HOST_ENV,
                regbroker_gcp::workload::GKE_CLUSTER_ENV,
                regbroker_gcp::workload::STS_URL_ENV,
                regbroker_gcp::workload::IAM_CREDENTIALS_URL_ENV,
            ],
            note: "",
        },
    ]
}

/// `--help`'s section for `mode`.
pub fn help_section(mode: Mode) -> String {
    let mut out =
        String::from("Environment variables read (besides any [env: ...] shown above):\n");
    for g in read_by(mode) {
        out.push_str(&format!("  {}: {}", g.title, g.vars.join(", ")));
        if !g.note.is_empty() {
            out.push(' ');
            out.push_str(g.note);
        }
        out.push('\n');
    }
    out.push_str(
        "An invalid value of any of regbroker's own variables is invalid configuration (exit 64).",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_read_one_way() {
        for v in ["1", "true", "TRUE", "Yes", "on", " y "] {
            assert_eq!(parse_bool(v), Ok(true), "{v}");
        }
        for v in ["0", "false", "False", "NO", "off", "n"] {
            assert_eq!(parse_bool(v), Ok(false), "{v}");
        }
        for v in ["2", "enabled", "truee", "-1"] {
            assert!(parse_bool(v).is_err(), "{v}");
        }
        assert_eq!(parse_bool(""), Ok(false));
        assert_eq!(parse_bool("  "), Ok(false));
        assert_eq!(bool_var("X", None), Ok(false));
        assert_eq!(bool_var("X", Some("")), Ok(false));
        let e = bool_var("REGBROKER_X", Some("sekrit")).unwrap_err();
        assert!(
            e.starts_with("REGBROKER_X: ") && !e.contains("sekrit"),
            "{e}"
        );
    }

    /// The same words as clap's `BoolishValueParser`, which a reader might expect.
    #[test]
    fn the_words_are_claps_boolish_words() {
        use clap::builder::TypedValueParser as _;
        let cmd = clap::Command::new("t");
        let parser = clap::builder::BoolishValueParser::new();
        for (words, want) in [(TRUE_WORDS, true), (FALSE_WORDS, false)] {
            for w in words {
                let got = parser
                    .parse_ref(&cmd, None, std::ffi::OsStr::new(w))
                    .unwrap();
                assert_eq!(got, want, "{w}");
            }
        }
    }
}
