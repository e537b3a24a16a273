//! Workload-identity federation for registries outside the three clouds: an OIDC token
//! (the pod's projected ServiceAccount token, or the workload's own under KEP-4412 or
//! TokenRequest) in, a short-lived registry credential out.
//!
//! Four providers, each chosen only by an explicit routing rule (none recognises a host
//! by itself, so a token never reaches a host the operator did not name):
//!
//! - `quay`: Quay robot-account federation;
//! - `artifactory`: the JFrog Platform's OIDC token exchange;
//! - `cloudsmith`: Cloudsmith's OIDC exchange for a service account;
//! - `oidc`: pass-through, the token itself as the password, for registries that
//!   validate it (Zot, Harbor next).
//!
//! README.md names the vendor documentation behind each protocol, and what was chosen
//! where it is silent.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod exchange;
mod http;
mod options;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::SystemTime;

use regbroker_provider::diagnosis::{
    Claims, Diagnosis, Finding, IdentityKind, TokenFile, check_token_file, rfc3339,
};
use regbroker_provider::{
    BoxFuture, Credential, Error, ExposeSecret, Options, Provider, Registry, SecretString,
    SharedClock, Target, WorkloadIdentity, fingerprint, system_clock,
};

pub use http::HttpSettings;

/// Which registry protocol a provider speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Quay robot-account federation.
    Quay,
    /// JFrog Artifactory's OIDC token exchange.
    Artifactory,
    /// Cloudsmith's OIDC exchange.
    Cloudsmith,
    /// Pass-through: the OIDC token is the password.
    Oidc,
}

impl Kind {
    /// Every kind, in the order the broker lists them.
    pub const ALL: [Kind; 4] = [Kind::Quay, Kind::Artifactory, Kind::Cloudsmith, Kind::Oidc];

    /// The provider name used in rules, metrics and responses.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Quay => "quay",
            Kind::Artifactory => "artifactory",
            Kind::Cloudsmith => "cloudsmith",
            Kind::Oidc => "oidc",
        }
    }
}

/// The default docker username of the pass-through provider (its `username` option
/// changes it). Registries that validate the token read the identity from the token.
pub const OIDC_USERNAME: &str = "oidc";

/// Cloudsmith's API, where its exchange lives unless a rule's `url` says otherwise.
pub const CLOUDSMITH_API: &str = "https://api.cloudsmith.io";

/// One federated provider.
#[derive(Debug)]
pub struct FederatedProvider {
    kind: Kind,
    http: http::Http,
    clock: SharedClock,
}

impl FederatedProvider {
    /// The provider of `kind`, with default HTTP settings and the system clock. Reads no
    /// env var: everything it needs is in the rules that name it.
    pub fn new(kind: Kind) -> Result<FederatedProvider, String> {
        FederatedProvider::with_settings(kind, HttpSettings::default())
    }

    /// As [`FederatedProvider::new`] with these HTTP timeouts and retries.
    pub fn with_settings(kind: Kind, settings: HttpSettings) -> Result<FederatedProvider, String> {
        Ok(FederatedProvider {
            kind,
            http: http::Http::new(settings),
            clock: system_clock(),
        })
    }

    /// The four providers, in [`Kind::ALL`] order.
    pub fn all() -> Result<Vec<FederatedProvider>, String> {
        Kind::ALL.into_iter().map(FederatedProvider::new).collect()
    }

    /// This provider reading time from `clock` (tests).
    pub fn with_clock(mut self, clock: SharedClock) -> FederatedProvider {
        self.clock = clock;
        self
    }

    /// The kind.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// The subject token for `target`: the workload's own when bound, else the rule's
    /// `token_file`; a JWT for the rule's audience, not expired. The error says which
    /// source and what to change, never the token.
    fn subject(
        &self,
        target: &Target,
        now: SystemTime,
    ) -> Result<(SecretString, SystemTime), Error> {
        let audience = target.param(options::AUDIENCE).unwrap_or_default();
        let (token, from, fix) = match (target.workload(), target.param(options::TOKEN_FILE)) {
            (Some(w), _) => (
                w.token().clone(),
                format!("the ServiceAccount token of {}", w.service_account()),
                format!(
                    "the token must be requested for audience `{audience}` (in kubelet mode: the provider's tokenAttributes.serviceAccountTokenAudience)"
                ),
            ),
            (None, Some(file)) => (
                regbroker_provider::subject_token::read_text(Path::new(file))?,
                format!("token file {file}"),
                format!(
                    "project a ServiceAccount token with `audience: {audience}` at that path, or set the rule's `audience` to the token's"
                ),
            ),
            (None, None) => {
                return Err(Error::identity_missing(format!(
                    "the {} rule for {} names no `token_file`, and this request carries no workload token: set `token_file` to a projected ServiceAccount token for audience `{audience}`",
                    self.kind.name(),
                    target.registry()
                )));
            }
        };
        let claims = Claims::of_jwt(token.expose_secret()).ok_or_else(|| {
            Error::invalid_config(format!("{from} is not a JWT (header.payload.signature)"))
        })?;
        if !claims.audiences.iter().any(|a| a == audience) {
            let had = if claims.audiences.is_empty() {
                "no audience".to_string()
            } else {
                format!("audience {}", claims.audiences.join(", "))
            };
            // The token is refused as the registry would refuse it (403 at the sidecar),
            // before it is sent anywhere; the message says which side to change.
            return Err(Error::identity_rejected(format!(
                "{from} has {had}, not the rule's `{audience}`: {fix}"
            )));
        }
        let expires_at = claims
            .expires_at
            .ok_or_else(|| Error::invalid_config(format!("{from} has no `exp`")))?;
        if expires_at <= now {
            return Err(Error::identity_missing(format!(
                "{from} expired at {}",
                rfc3339(expires_at)
            )));
        }
        Ok((token, expires_at))
    }

    async fn fetch_credential(&self, target: &Target) -> Result<Credential, Error> {
        let now = self.clock.now();
        let (subject, subject_expires) = self.subject(target, now)?;
        let answer = match self.kind {
            Kind::Quay => exchange::quay(&self.http, target, &subject).await?,
            Kind::Artifactory => exchange::artifactory(&self.http, target, &subject, now).await?,
            Kind::Cloudsmith => exchange::cloudsmith(&self.http, target, &subject).await?,
            Kind::Oidc => {
                let username = target.param(options::USERNAME).unwrap_or(OIDC_USERNAME);
                return Ok(
                    Credential::issued(username, subject, Some(subject_expires), now)
                        .passing_subject_token(),
                );
            }
        };
        // The earlier of the answer's expiry and the subject token's: a registry that
        // checks the token behind its answer refuses it once that token is gone.
        let answered = answer
            .expires_at
            .unwrap_or(now + exchange::FALLBACK_LIFETIME);
        let expires_at = answered.min(subject_expires);
        tracing::debug!(
            provider = self.kind.name(),
            registry = %target.registry(),
            "Exchanged an OIDC token for a registry credential"
        );
        Ok(Credential::issued(
            answer.username,
            answer.secret,
            Some(expires_at),
            now,
        ))
    }
}

impl Provider for FederatedProvider {
    fn name(&self) -> &'static str {
        self.kind.name()
    }

    /// Never: a federated provider serves only the hosts a rule names.
    fn recognise(&self, _registry: &Registry) -> Option<Target> {
        None
    }

    fn check_options(&self, options: &Options) -> Result<(), String> {
        options::check(self.kind, options)
    }

    fn target(&self, registry: &Registry, options: &Options) -> Result<Target, Error> {
        options::check(self.kind, options).map_err(Error::invalid_config)?;
        // The exchange's base URL: the rule's, else the registry's own host for the
        // registries that serve their exchange themselves (Quay, the JFrog Platform).
        let url = match (options.get(options::URL), self.kind) {
            (Some(u), _) => Some(options::base_url(u).map_err(Error::invalid_config)?),
            (None, Kind::Quay | Kind::Artifactory) => Some(format!("https://{registry}")),
            (None, Kind::Cloudsmith) => Some(CLOUDSMITH_API.to_string()),
            (None, Kind::Oidc) => None,
        };
        let mut named: Vec<(&str, Option<&str>)> = vec![("provider", Some(self.kind.name()))];
        named.push(("url", url.as_deref()));
        for key in options::known(self.kind) {
            if *key != options::URL {
                named.push((key, options.get(*key).map(String::as_str)));
            }
        }
        // The scope names everything the credential depends on: the exchange, the
        // robot / integration / service, the audience and the token source.
        let scope = format!("{}:{}", self.kind.name(), fingerprint(&named));
        let mut target = Target::new(registry.clone(), scope);
        for key in options::known(self.kind) {
            if let Some(v) = options.get(*key)
                && *key != options::URL
            {
                target = target.with_param(key, v.clone());
            }
        }
        if let Some(url) = url {
            target = target.with_param(options::URL, url);
        }
        Ok(target)
    }

    fn bind_workload(&self, target: Target, workload: WorkloadIdentity) -> Result<Target, Error> {
        // The identity is the token itself: no annotation is read. The scope then names
        // the ServiceAccount, so no workload ever reads another's credential.
        Ok(target.for_workload(workload))
    }

    fn workload_audience(
        &self,
        target: &Target,
        _annotations: &BTreeMap<String, String>,
    ) -> Result<String, Error> {
        target
            .param(options::AUDIENCE)
            .map(str::to_string)
            .ok_or_else(|| {
                Error::invalid_config(format!("the {} rule has no `audience`", self.kind.name()))
            })
    }

    fn fetch<'a>(&'a self, target: &'a Target) -> BoxFuture<'a, Result<Credential, Error>> {
        Box::pin(self.fetch_credential(target))
    }

    fn identity_kind(&self) -> IdentityKind {
        IdentityKind::RuleToken
    }

    fn passes_subject_token(&self) -> bool {
        self.kind == Kind::Oidc
    }

    fn diagnose_target(&self, target: &Target) -> Vec<Finding> {
        let check = format!("{}.token_file", self.kind.name());
        let audience = target.param(options::AUDIENCE).unwrap_or_default();
        let Some(file) = target.param(options::TOKEN_FILE) else {
            return vec![Finding::info(
                check,
                "the rule names no token_file: only a workload's own token is used (Secrets and RegistryCredentials with a ServiceAccount, the kubelet's KEP-4412 token)",
            )];
        };
        let fix = format!(
            "project the ServiceAccount token with `audience: {audience}` (the rule's `audience` option), or set the rule's audience to the one the registry trusts"
        );
        check_token_file(&TokenFile {
            check: &check,
            named_by: "the rule's token_file",
            path: Path::new(file),
            expected_audiences: &[audience],
            audience_fix: &fix,
            now: self.clock.now(),
        })
        .findings
    }

    fn diagnose(&self, _timeout: std::time::Duration) -> BoxFuture<'_, Diagnosis> {
        let name = self.kind.name();
        Box::pin(async move {
            Diagnosis {
                identity: IdentityKind::RuleToken,
                explicit: false,
                findings: vec![Finding::info(
                    format!("{name}.identity"),
                    format!(
                        "{name} serves only the registries a rule names, with the token that rule names: `regbroker doctor REGISTRY` checks one (its token file, then one exchange)"
                    ),
                )],
            }
        })
    }
}

#[cfg(test)]
mod tests;
