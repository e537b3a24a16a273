//! `regbroker resolve REGISTRY`: which rule and source serve a registry and why, then one
//! fetch, with the secret redacted unless `--show-secret`.

use clap::Args;
use regbroker_provider::{ExposeSecret, Registry};

use super::{Failure, Sources, build_core};
use crate::broker::{Reason, Route};

#[derive(Debug, Args)]
pub(super) struct ResolveArgs {
    /// What a client would send: host, host:port, URL or image reference.
    registry: String,

    /// Print the password or token instead of redacting it.
    #[arg(long)]
    show_secret: bool,

    #[command(flatten)]
    sources: Sources,
}

/// Prints the routing decision for one registry and fetches its credential once.
pub(super) async fn run(args: ResolveArgs) -> Result<(), Failure> {
    let registry = Registry::from_registry_or_image(&args.registry)
        .map_err(|e| Failure::Runtime(format!("invalid registry: {e}")))?;
    let core = build_core(&args.sources)?;
    let decision = core.broker.decide(&registry);
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
    println!("registry:  {registry}");
    println!("decided:   {why}");
    println!("source:    {source}");
    let served = core
        .broker
        .serve(&registry, decision.route)
        .await
        .map_err(|e| {
            // The causes too: the broker's own warning about them is not shown by default.
            Failure::Runtime(format!(
                "no credential: {}{}",
                e.detail(true),
                crate::broker::doctor_hint(e.kind())
            ))
        })?;
    println!("username:  {}", served.credential.username());
    if args.show_secret {
        println!("password:  {}", served.credential.secret().expose_secret());
    } else {
        println!("password:  <redacted; pass --show-secret to print it>");
    }
    match served.credential.expires_at() {
        Some(t) if t > core.broker.now() => println!("expires:   {}", crate::rfc3339(t)),
        Some(t) => println!(
            "expires:   {} (already past by our clock)",
            crate::rfc3339(t)
        ),
        None => println!("expires:   unknown"),
    }
    Ok(())
}
