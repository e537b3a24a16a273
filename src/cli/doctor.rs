//! `regbroker doctor [REGISTRY...]`: the setup, checked. With the configuration and
//! environment `serve` would use: for each compiled-in cloud, the identity it would use
//! and why, and one real call to its identity endpoint (the provider's own
//! [`diagnose`](regbroker_provider::Provider::diagnose), which words causes and fixes);
//! for each REGISTRY, the routing decision as `resolve` prints it and one real exchange,
//! the secret never shown. Text by default, `--output json` for scripts.
//!
//! Exit codes: 0 every check passed (warnings allowed), 1 a check failed, 64 bad usage
//! or configuration. Every network check is bounded by `--timeout`.
//!
//! A cloud whose identity is not configured explicitly (only an ambient metadata endpoint
//! was probed) and that no rule or REGISTRY uses is reported, but its failures are shown
//! as `skip`: a machine without AWS is not broken for a user of GCR.

use std::collections::BTreeSet;
use std::time::Duration;

use clap::{Args, ValueEnum};
use regbroker_provider::diagnosis::{human, rfc3339};
use regbroker_provider::{Diagnosis, Finding, Registry, Status};
use serde_json::{Value, json};

use super::{Failure, Sources, build_core};
use crate::broker::providers::KNOWN;
use crate::broker::routing::Source;
use crate::broker::{Broker, Reason, Route};

#[derive(Debug, Args)]
pub(super) struct DoctorArgs {
    /// Registries to route and fetch once (host, host:port, URL or image reference).
    registries: Vec<String>,

    /// Output format.
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,

    /// Check only these clouds (repeatable, or comma-separated): aws, azure, gcp.
    #[arg(long = "provider", value_name = "NAME", value_delimiter = ',')]
    providers: Vec<String>,

    /// Bound on each network check (e.g. 5s, 500ms; at most 1h).
    #[arg(long, default_value = "5s", value_parser = parse_timeout)]
    timeout: Duration,

    #[command(flatten)]
    sources: Sources,
}

/// The longest `--timeout`: each check's bound is multiplied and added to clock readings
/// (by the checks and their HTTP clients), which a duration of centuries overflows.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| e.to_string())?;
    if d > MAX_TIMEOUT {
        return Err(format!(
            "at most {} (a bound on each network check)",
            humantime::format_duration(MAX_TIMEOUT)
        ));
    }
    Ok(d)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Text,
    Json,
}

/// A section of the report: the configuration, a cloud, or a registry.
struct Section {
    title: String,
    meta: Value,
    findings: Vec<Finding>,
}

/// Runs the checks and prints the report; `Err(Failure::Checks)` when one failed.
pub(super) async fn run(args: DoctorArgs) -> Result<(), Failure> {
    let registries = args
        .registries
        .iter()
        .map(|r| {
            // The error never repeats userinfo; neither does this message.
            Registry::from_registry_or_image(r)
                .map(|p| (r.clone(), p))
                .map_err(|e| Failure::Usage(format!("invalid REGISTRY argument: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    for p in &args.providers {
        if !KNOWN.contains(&p.as_str()) {
            return Err(Failure::Usage(format!(
                "--provider `{}`: expected one of {}",
                shown(p),
                KNOWN.join(", ")
            )));
        }
    }
    let core = build_core(&args.sources)?;
    let broker = &core.broker;
    let timeout = args.timeout.max(Duration::from_millis(100));

    let mut sections = vec![config_section(&args.sources, broker)];

    // Which clouds the configuration or the registries asked about use.
    let mut needed: BTreeSet<&'static str> = BTreeSet::new();
    for rule in broker.router().rules() {
        if let Source::Provider { name, .. } = &rule.source
            && let Some(p) = broker.providers().get(name)
        {
            needed.insert(p.name());
        }
    }
    let decisions: Vec<_> = registries
        .iter()
        .map(|(input, r)| {
            let d = broker.decide(r);
            match &d.route {
                Route::Provider(p, _) => {
                    needed.insert(p.name());
                }
                Route::Failed(name, _) => {
                    needed.insert(name);
                }
                _ => {}
            }
            (input, r, d)
        })
        .collect();

    let wanted = |name: &str| args.providers.is_empty() || args.providers.iter().any(|p| p == name);
    let checks = broker
        .providers()
        .iter()
        .filter(|p| wanted(p.name()))
        .map(|p| async move {
            // The provider bounds each call; this bounds the whole, whatever it does.
            let whole = timeout * 4 + Duration::from_secs(1);
            let d = match tokio::time::timeout(whole, p.diagnose(timeout)).await {
                Ok(d) => d,
                Err(_) => Diagnosis {
                    identity: p.identity_kind(),
                    explicit: true,
                    findings: vec![Finding::fail(
                        format!("{}.identity", p.name()),
                        format!(
                            "the {} checks did not finish within {}",
                            p.name(),
                            human(whole)
                        ),
                        "check egress to the cloud's identity endpoints",
                    )],
                },
            };
            (p.name(), d)
        });
    let diagnoses = futures_util::future::join_all(checks).await;
    for (name, d) in diagnoses {
        let is_needed = needed.contains(name);
        let mut findings = d.findings;
        if !d.explicit && !is_needed {
            for f in &mut findings {
                if f.status == Status::Fail {
                    f.status = Status::Skip;
                    f.detail = format!("{} ({})", f.detail, not_counted(name));
                }
            }
        }
        sections.push(Section {
            title: format!("{name} (identity: {})", d.identity),
            meta: json!({
                "name": name,
                "compiledIn": true,
                "identity": d.identity.as_str(),
                "explicit": d.explicit,
                "needed": is_needed,
            }),
            findings,
        });
    }
    let compiled: Vec<&str> = broker.providers().iter().map(|p| p.name()).collect();
    for name in KNOWN.iter().filter(|n| !compiled.contains(n) && wanted(n)) {
        let findings = if needed.contains(name) {
            vec![Finding::fail(
                format!("{name}.identity"),
                format!("the {name} provider is not compiled into this build"),
                format!(
                    "build with the cargo feature `{}` (on by default)",
                    crate::broker::providers::feature_of(name)
                ),
            )]
        } else {
            vec![Finding::skip(
                format!("{name}.identity"),
                format!(
                    "not compiled in (cargo feature `{}`)",
                    crate::broker::providers::feature_of(name)
                ),
            )]
        };
        sections.push(Section {
            title: format!("{name} (not compiled in)"),
            meta: json!({"name": name, "compiledIn": false, "identity": Value::Null, "explicit": false, "needed": needed.contains(name)}),
            findings,
        });
    }

    for (input, registry, decision) in decisions {
        sections.push(registry_section(broker, input, registry, decision, timeout).await);
    }

    let failed = sections
        .iter()
        .flat_map(|s| &s.findings)
        .any(|f| f.status == Status::Fail);
    match args.output {
        Output::Text => print!("{}", render_text(&sections)),
        Output::Json => println!("{}", render_json(&sections)),
    }
    if failed { Err(Failure::Checks) } else { Ok(()) }
}

/// Why a failure of an ambient identity is shown as `skip`. It says what was found (an
/// ambient metadata endpoint), so it never contradicts a finding that an identity exists.
fn not_counted(name: &str) -> String {
    format!(
        "not counted: {name} was only tried through an ambient metadata endpoint (no {name} identity variables are set), and no rule or REGISTRY uses {name}"
    )
}

fn config_section(sources: &Sources, broker: &Broker) -> Section {
    let config = match &sources.config {
        Some(p) => format!("{}, {} rules", p.display(), broker.router().rules().len()),
        None => {
            "no config file (REGBROKER_CONFIG / --config): no rules, auto-detection only".into()
        }
    };
    let statics = broker.statics().snapshot().len();
    let docker = if sources.docker_config.is_empty() {
        "no docker config (REGBROKER_DOCKER_CONFIG / --docker-config)".to_string()
    } else {
        format!(
            "docker config {}: {statics} static entries",
            sources
                .docker_config
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    };
    Section {
        title: "configuration".into(),
        meta: json!({}),
        findings: vec![Finding::pass("config", format!("{config}; {docker}"))],
    }
}

async fn registry_section(
    broker: &Broker,
    input: &str,
    registry: &Registry,
    decision: crate::broker::Decision,
    timeout: Duration,
) -> Section {
    let mut findings = Vec::new();
    let source = match &decision.route {
        Route::Static(_) => "static".to_string(),
        Route::Provider(p, t) => format!("{} (scope {})", p.name(), t.scope()),
        Route::NotConfigured(_) => "none".to_string(),
        Route::Failed(p, _) => p.to_string(),
    };
    let why = match &decision.reason {
        Reason::StaticEntry => "a static docker config entry names it".to_string(),
        Reason::Rule { index, pattern } => format!("rule {} (match = {pattern:?})", index + 1),
        Reason::AutoDetected => "auto-detected by the provider's host patterns".to_string(),
        Reason::NoMatch => "no static entry, rule or provider matches".to_string(),
    };
    let meta =
        json!({"input": input, "registry": registry.as_str(), "decided": why, "source": source});
    let route_detail = format!("decided: {why}; source: {source}");
    match (&decision.reason, &decision.route) {
        (Reason::NoMatch, _) => {
            findings.push(Finding::fail(
                "registry.route",
                format!(
                    "a host no provider recognises: {registry} matches no static entry, no rule, and no provider's host patterns"
                ),
                rule_for(registry),
            ));
            return Section {
                title: format!("registry {registry}"),
                meta,
                findings,
            };
        }
        (Reason::Rule { .. }, Route::NotConfigured(msg)) => {
            let disabled = broker
                .router()
                .route(registry)
                .is_some_and(|(_, r)| r.source == Source::None);
            findings.push(if disabled {
                Finding::info(
                    "registry.route",
                    format!("{route_detail}: {msg}; clients go anonymous"),
                )
            } else {
                Finding::fail(
                    "registry.route",
                    format!("{route_detail}: {msg}"),
                    "add an entry for exactly this registry to a docker config (--docker-config), or change the rule's source",
                )
            });
            return Section {
                title: format!("registry {registry}"),
                meta,
                findings,
            };
        }
        _ => findings.push(Finding::info("registry.route", route_detail)),
    }
    if let Route::Provider(p, target) = &decision.route {
        findings.extend(p.diagnose_target(target));
    }
    let served = tokio::time::timeout(timeout * 2, broker.serve(registry, decision.route)).await;
    findings.push(match &served {
        Err(_) => Finding::fail(
            "registry.exchange",
            format!("no credential within {}", human(timeout * 2)),
            "see the identity checks above; check egress to the registry's token endpoint",
        ),
        Ok(Err(e)) => Finding::fail(
            "registry.exchange",
            format!("no credential: {} ({})", e.detail(false), e.kind().code()),
            exchange_fix(e.kind()),
        ),
        Ok(Ok(s)) => {
            let expires = match s.credential.expires_at() {
                Some(t) if t > broker.now() => rfc3339(t),
                Some(t) => format!("{} (already past by our clock)", rfc3339(t)),
                None => "unknown".into(),
            };
            Finding::pass(
                "registry.exchange",
                format!(
                    "credential from {}: username {}, password <redacted>, expires {expires}",
                    s.source,
                    s.credential.username()
                ),
            )
        }
    });
    if let Ok(Ok(s)) = &served {
        findings.push(registry_check(broker, s).await);
    }
    Section {
        title: format!("registry {registry}"),
        meta,
        findings,
    }
}

/// The registry's own verdict on the credential (`registry.check`), as the sinks ask it
/// before writing.
async fn registry_check(broker: &Broker, served: &crate::broker::Served) -> Finding {
    use crate::broker::check::Verdict;
    let enabled = broker.check_policy(&served.registry).enabled;
    let off = if enabled {
        ""
    } else {
        " (the rule has check = false: the sinks do not ask)"
    };
    match broker.verify(served).await {
        Verdict::Accepted(status) => Finding::pass(
            "registry.check",
            format!("the registry accepted the credential (HTTP {status}){off}"),
        ),
        Verdict::Refused(status) => Finding::fail(
            "registry.check",
            format!("the registry refused the credential (HTTP {status}){off}"),
            "the identity got a credential the registry does not take: check its permissions on this registry (ECR: the repository policy and ecr:BatchGetImage; ACR: AcrPull on this registry; Artifact Registry: roles/artifactregistry.reader on the repository), or for a static entry, rotate the password in its docker config",
        ),
        Verdict::Skipped(why) => {
            Finding::skip("registry.check", format!("not checked: {why}{off}"))
        }
    }
}

fn exchange_fix(kind: regbroker_provider::ErrorKind) -> String {
    use regbroker_provider::ErrorKind as K;
    match kind {
        K::IdentityMissing => "give the process the identity named above (see that cloud's checks)",
        K::IdentityRejected => "the cloud refused the identity or the exchange: check the identity's role binding for this registry (ECR: ecr:GetAuthorizationToken; ACR: AcrPull; Artifact Registry: roles/artifactregistry.reader)",
        K::InvalidConfig => "fix the rule's options or the provider's env vars named in the message",
        K::Throttled | K::Unavailable | K::TimedOut => "check egress to the registry and the cloud's token endpoints (NetworkPolicy, proxy, DNS), then retry",
        _ => "see the identity checks above",
    }
    .to_string()
}

/// The rule that would route `registry`, for a host nothing recognises: a TOML snippet
/// that parses as it stands (placeholders are valid values, marked by comments), on
/// lines of its own so it can be pasted.
fn rule_for(registry: &Registry) -> String {
    let host = registry.host();
    let (source, options) = if host.contains("ecr") || host.contains("amazonaws") {
        (
            "\"aws\"",
            "\noptions = { region = \"us-east-1\", account = \"123456789012\" }  # the registry's region and account",
        )
    } else if host.contains("azurecr") {
        ("\"azure\"", "")
    } else if host.contains("gcr") || host.contains("pkg.dev") {
        ("\"gcp\"", "")
    } else {
        ("\"aws\"  # or \"azure\" or \"gcp\"", "")
    };
    // A parsed registry is host[:port] (letters, digits, `.-:[]`): nothing to escape.
    let pattern = format!("\"{registry}\"");
    format!(
        "give it a static entry in a docker config (--docker-config), or add this rule to the config file (--config), only for a host you run (the rule hands that cloud's credentials to it):\n[[rule]]\nmatch = {pattern}\nsource = {source}{options}"
    )
}

fn render_text(sections: &[Section]) -> String {
    let mut out = String::new();
    let mut counts = [0usize; 5];
    for s in sections {
        out.push_str(&s.title);
        out.push('\n');
        for f in &s.findings {
            counts[index(f.status)] += 1;
            let mark = match f.status {
                Status::Fail => "FAIL",
                Status::Warn => "WARN",
                other => other.as_str(),
            };
            out.push_str(&format!("  {mark:<4}  {}: {}\n", f.check, f.detail));
            if let Some(fix) = &f.fix {
                // A fix of several lines (a config snippet) keeps them, indented.
                let mut lines = fix.lines();
                out.push_str(&format!(
                    "        fix: {}\n",
                    lines.next().unwrap_or_default()
                ));
                for line in lines {
                    out.push_str(&format!("          {line}\n"));
                }
            }
        }
    }
    out.push_str(&format!(
        "summary: {} failed, {} warnings, {} passed, {} skipped\n",
        counts[index(Status::Fail)],
        counts[index(Status::Warn)],
        counts[index(Status::Pass)],
        counts[index(Status::Skip)]
    ));
    out
}

fn index(s: Status) -> usize {
    match s {
        Status::Pass => 0,
        Status::Info => 1,
        Status::Warn => 2,
        Status::Fail => 3,
        _ => 4,
    }
}

fn finding_json(f: &Finding) -> Value {
    json!({"check": f.check, "status": f.status.as_str(), "detail": f.detail, "fix": f.fix})
}

fn render_json(sections: &[Section]) -> Value {
    let mut counts = [0usize; 5];
    for f in sections.iter().flat_map(|s| &s.findings) {
        counts[index(f.status)] += 1;
    }
    let mut iter = sections.iter();
    let config = iter
        .next()
        .map(|s| s.findings.iter().map(finding_json).collect::<Vec<_>>());
    let mut providers = Vec::new();
    let mut registries = Vec::new();
    for s in iter {
        let mut entry = s.meta.clone();
        entry["findings"] = s.findings.iter().map(finding_json).collect();
        if entry.get("input").is_some() {
            registries.push(entry);
        } else {
            providers.push(entry);
        }
    }
    json!({
        "ok": counts[index(Status::Fail)] == 0,
        "summary": {
            "pass": counts[index(Status::Pass)],
            "info": counts[index(Status::Info)],
            "warn": counts[index(Status::Warn)],
            "fail": counts[index(Status::Fail)],
            "skip": counts[index(Status::Skip)],
        },
        "config": {"findings": config.unwrap_or_default()},
        "providers": providers,
        "registries": registries,
    })
}

/// A user-given value for an error message: printable, bounded.
fn shown(s: &str) -> String {
    s.chars()
        .take(80)
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The note on a skipped ambient identity says what was tried, and never denies that
    /// an identity exists: the finding it is appended to may have found and used one
    /// (IMDS, the metadata server, a managed identity).
    #[test]
    fn the_not_counted_note_never_denies_a_found_identity() {
        for name in KNOWN {
            let note = not_counted(name);
            assert!(!note.contains("configured"), "{note}");
            assert!(note.contains("ambient metadata endpoint"), "{note}");
        }
    }
}
