//! Setup diagnostics: what `regbroker doctor` prints and `GET /v1/providers` answers.
//!
//! A provider describes the identity it would use ([`IdentityKind`]) and, when asked,
//! checks it with one real call, answering [`Finding`]s: a check name, a status, a
//! one-line detail and, for anything not passing, the fix. The wording of causes and
//! fixes stays in the crate that knows the cloud; the CLI only renders them as text or
//! JSON. No finding ever holds a secret or a token: a projected token's claims are read
//! (issuer, audience, subject, times), never its text or signature.
//!
//! Reads no env var. [`check_token_file`] reads the one file it is given.

use std::fmt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use base64::Engine as _;

/// How a check went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// The check passed.
    Pass,
    /// Information only (what was found), nothing to fix.
    Info,
    /// Something looks wrong but need not break anything (the fix says what to check).
    Warn,
    /// The check failed: the detail names the cause, the fix what to change.
    Fail,
    /// Not checked (not configured and not needed, or an earlier check failed).
    Skip,
}

impl Status {
    /// `pass`, `info`, `warn`, `fail` or `skip`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pass => "pass",
            Status::Info => "info",
            Status::Warn => "warn",
            Status::Fail => "fail",
            Status::Skip => "skip",
        }
    }
}

/// One check's outcome. `detail` and `fix` are one line each and never hold a secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// A stable dotted name, e.g. `aws.token_file`, `azure.entra_token`.
    pub check: String,
    /// How it went.
    pub status: Status,
    /// What was found, or the cause of a failure.
    pub detail: String,
    /// What to change, for a warning or a failure.
    pub fix: Option<String>,
}

impl Finding {
    fn new(check: impl Into<String>, status: Status, detail: impl Into<String>) -> Finding {
        Finding {
            check: check.into(),
            status,
            detail: detail.into(),
            fix: None,
        }
    }

    /// A passed check.
    pub fn pass(check: impl Into<String>, detail: impl Into<String>) -> Finding {
        Finding::new(check, Status::Pass, detail)
    }

    /// Information only.
    pub fn info(check: impl Into<String>, detail: impl Into<String>) -> Finding {
        Finding::new(check, Status::Info, detail)
    }

    /// A warning with its fix.
    pub fn warn(
        check: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding::new(check, Status::Warn, detail).with_fix(fix)
    }

    /// A failure: `detail` names the cause, `fix` what to change.
    pub fn fail(
        check: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding::new(check, Status::Fail, detail).with_fix(fix)
    }

    /// A check that was not made, and why.
    pub fn skip(check: impl Into<String>, detail: impl Into<String>) -> Finding {
        Finding::new(check, Status::Skip, detail)
    }

    /// Sets the fix.
    pub fn with_fix(mut self, fix: impl Into<String>) -> Finding {
        self.fix = Some(fix.into());
        self
    }
}

/// The kind of identity a provider would use, from its env vars and files alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IdentityKind {
    /// AWS: EKS IRSA (`AWS_ROLE_ARN` + `AWS_WEB_IDENTITY_TOKEN_FILE`).
    Irsa,
    /// AWS: EKS Pod Identity or an ECS container endpoint.
    PodIdentity,
    /// AWS: the EC2 instance metadata service (IMDSv2).
    InstanceMetadata,
    /// AWS access keys in the env, or an Azure service principal secret.
    StaticKeys,
    /// AWS: a named or default profile in `~/.aws`.
    Profile,
    /// Azure: AKS Workload Identity (a federated service-account token).
    WorkloadIdentity,
    /// Azure: a managed identity (IMDS or the App Service endpoint).
    ManagedIdentity,
    /// GCP: the GCE / GKE metadata server (GKE Workload Identity, a VM's account).
    MetadataServer,
    /// GCP: a service-account key file.
    KeyFile,
    /// GCP: an `external_account` file (workload identity federation).
    ExternalAccount,
    /// Federated providers: the OIDC token each routing rule names (a projected
    /// ServiceAccount token file, or the workload's own token), never an ambient one.
    RuleToken,
    /// Nothing found.
    None,
}

impl IdentityKind {
    /// A stable snake_case name, as `GET /v1/providers` answers it.
    pub fn as_str(self) -> &'static str {
        match self {
            IdentityKind::Irsa => "irsa",
            IdentityKind::PodIdentity => "pod_identity",
            IdentityKind::InstanceMetadata => "instance_metadata",
            IdentityKind::StaticKeys => "static_keys",
            IdentityKind::Profile => "profile",
            IdentityKind::WorkloadIdentity => "workload_identity",
            IdentityKind::ManagedIdentity => "managed_identity",
            IdentityKind::MetadataServer => "metadata_server",
            IdentityKind::KeyFile => "key_file",
            IdentityKind::ExternalAccount => "external_account",
            IdentityKind::RuleToken => "rule_token",
            IdentityKind::None => "none",
        }
    }
}

impl fmt::Display for IdentityKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a provider found about its identity, and its checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnosis {
    /// The identity it would use.
    pub identity: IdentityKind,
    /// Whether that identity was configured explicitly (env vars or files), rather than
    /// only assumed from the surroundings (a metadata endpoint that may not exist).
    pub explicit: bool,
    /// The checks, in the order they were made.
    pub findings: Vec<Finding>,
}

impl Diagnosis {
    /// Whether any check failed.
    pub fn failed(&self) -> bool {
        self.findings.iter().any(|f| f.status == Status::Fail)
    }
}

/// The claims of a JWT that say who issued it, for whom, about whom and when: read
/// without verifying (the cloud verifies), and holding nothing of the token itself.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claims {
    /// `iss`.
    pub issuer: Option<String>,
    /// `aud` (a string or a list).
    pub audiences: Vec<String>,
    /// `sub`.
    pub subject: Option<String>,
    /// `exp`.
    pub expires_at: Option<SystemTime>,
    /// `iat`.
    pub issued_at: Option<SystemTime>,
    /// `nbf`.
    pub not_before: Option<SystemTime>,
}

impl Claims {
    /// The claims of `jwt` (`header.payload.signature`); `None` if it is not one. Only
    /// the payload is decoded; the signature is never looked at.
    pub fn of_jwt(jwt: &str) -> Option<Claims> {
        let mut parts = jwt.trim().split('.');
        let (Some(_), Some(payload), Some(_), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return None;
        };
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload.trim_end_matches('='))
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
        let obj = v.as_object()?;
        let text = |k: &str| obj.get(k).and_then(|v| v.as_str()).map(shown);
        let time = |k: &str| {
            obj.get(k)
                .and_then(serde_json::Value::as_u64)
                .and_then(|s| SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(s)))
        };
        let audiences = match obj.get("aud") {
            Some(serde_json::Value::String(s)) => vec![shown(s)],
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .filter_map(|v| v.as_str())
                .take(8)
                .map(shown)
                .collect(),
            _ => Vec::new(),
        };
        Some(Claims {
            issuer: text("iss"),
            audiences,
            subject: text("sub"),
            expires_at: time("exp"),
            issued_at: time("iat"),
            not_before: time("nbf"),
        })
    }

    /// `issuer X, audience Y, subject Z, expires T (in D)`, for a finding.
    pub fn describe(&self, now: SystemTime) -> String {
        let or_none = |o: &Option<String>| o.clone().unwrap_or_else(|| "(none)".into());
        let aud = if self.audiences.is_empty() {
            "(none)".to_string()
        } else {
            self.audiences.join(", ")
        };
        let exp = match self.expires_at {
            Some(t) if t > now => format!("{} (in {})", rfc3339(t), human(since(now, t))),
            Some(t) => format!("{} ({} ago)", rfc3339(t), human(since(t, now))),
            None => "(no exp)".into(),
        };
        format!(
            "issuer {}, audience {aud}, subject {}, expires {exp}",
            or_none(&self.issuer),
            or_none(&self.subject)
        )
    }
}

/// How far a token's `iat` may be ahead of this clock before doctor blames the clock.
pub const CLOCK_SKEW_LIMIT: Duration = Duration::from_secs(5 * 60);

/// A projected service-account token file to check (see [`check_token_file`]).
#[derive(Clone, Copy, Debug)]
pub struct TokenFile<'a> {
    /// The finding's check name, e.g. `aws.token_file`.
    pub check: &'a str,
    /// The env var (or setting) that names the file, for messages.
    pub named_by: &'a str,
    /// The file.
    pub path: &'a Path,
    /// Audiences the cloud accepts by default; the token should carry one of them.
    pub expected_audiences: &'a [&'a str],
    /// The cloud's own advice for an audience mismatch.
    pub audience_fix: &'a str,
    /// Now, by the injected clock.
    pub now: SystemTime,
}

/// What [`check_token_file`] found.
#[derive(Clone, Debug, Default)]
pub struct TokenFileReport {
    /// Its findings, in order.
    pub findings: Vec<Finding>,
    /// The token's claims, when it is a JWT.
    pub claims: Option<Claims>,
    /// `Some(false)` when the token's audience is none of the expected ones.
    pub audience_ok: Option<bool>,
}

impl TokenFileReport {
    /// Whether a check failed (the file cannot be used as it is).
    pub fn failed(&self) -> bool {
        self.findings.iter().any(|f| f.status == Status::Fail)
    }

    /// The token's audiences joined, or `(none)`.
    pub fn audiences(&self) -> String {
        match &self.claims {
            Some(c) if !c.audiences.is_empty() => c.audiences.join(", "),
            _ => "(none)".into(),
        }
    }
}

/// Checks a projected token file: present, readable, a JWT, not expired, not issued in
/// the future by this clock, and for one of the expected audiences (a mismatch is a
/// warning here: the cloud may be set up for another audience; the caller's real call
/// decides). The token's text never reaches a finding.
pub fn check_token_file(t: &TokenFile<'_>) -> TokenFileReport {
    let mut report = TokenFileReport::default();
    let shown_path = t.path.display();
    let raw = match read_bounded(t.path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            report.findings.push(Finding::fail(
                t.check,
                format!("token file missing: {} names {shown_path}, which does not exist", t.named_by),
                format!(
                    "mount the projected service-account token there (a `serviceAccountToken` volume projection; the cloud's webhook adds it when the service account is annotated, then restart the pod), or correct {}",
                    t.named_by
                ),
            ));
            return report;
        }
        Err(e) => {
            report.findings.push(Finding::fail(
                t.check,
                format!(
                    "token file unreadable: {shown_path} ({} names it) cannot be read: {}",
                    t.named_by,
                    io_reason(&e)
                ),
                "let this process's user read it: set the pod's securityContext.fsGroup (or runAsUser) so the projected volume is readable, and check the projection's defaultMode",
            ));
            return report;
        }
    };
    let Some(claims) = std::str::from_utf8(&raw).ok().and_then(Claims::of_jwt) else {
        report.findings.push(Finding::fail(
            t.check,
            format!("token file {shown_path} does not hold a JWT (three base64url parts with JSON claims)"),
            format!("{} must name a projected service-account token, not another file", t.named_by),
        ));
        return report;
    };
    report.findings.push(Finding::info(
        t.check,
        format!("{shown_path}: {}", claims.describe(t.now)),
    ));
    if let Some(iat) = claims.issued_at
        && iat > t.now + CLOCK_SKEW_LIMIT
    {
        report.findings.push(Finding::fail(
            format!("{}.clock", t.check),
            format!(
                "clock far from the token's iat: it was issued at {}, {} ahead of this machine's clock ({}); this clock is behind the issuer's",
                rfc3339(iat),
                human(since(t.now, iat)),
                rfc3339(t.now)
            ),
            "fix the node's time synchronisation (NTP, chrony): clouds refuse tokens that are not yet valid by their clock, and this clock will judge expiries wrongly too",
        ));
    }
    match claims.expires_at {
        Some(exp) if exp <= t.now => report.findings.push(Finding::fail(
            format!("{}.expiry", t.check),
            format!(
                "token expired: its exp is {}, {} before this machine's clock ({})",
                rfc3339(exp),
                human(since(exp, t.now)),
                rfc3339(t.now)
            ),
            "the kubelet rewrites a projected token well before it expires, so this file is not a live projection (a copy, or a Secret) or this clock is ahead: mount a `serviceAccountToken` projection and check the node's time synchronisation",
        )),
        Some(_) => {}
        None => report.findings.push(Finding::warn(
            format!("{}.expiry", t.check),
            "the token has no exp claim",
            "projected service-account tokens always carry one: check that the file is a projected token",
        )),
    }
    if !t.expected_audiences.is_empty() {
        let ok = claims
            .audiences
            .iter()
            .any(|a| t.expected_audiences.contains(&a.as_str()));
        report.audience_ok = Some(ok);
        if !ok {
            let aud = if claims.audiences.is_empty() {
                "(none)".to_string()
            } else {
                claims.audiences.join(", ")
            };
            report.findings.push(Finding::warn(
                format!("{}.audience", t.check),
                format!(
                    "audience mismatch: the token's audience is {aud}; expected {}",
                    t.expected_audiences.join(" or ")
                ),
                t.audience_fix,
            ));
        }
    }
    report.claims = Some(claims);
    report
}

fn read_bounded(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut out = Vec::new();
    std::fs::File::open(path)?
        .take(crate::subject_token::MAX_TOKEN_FILE)
        .read_to_end(&mut out)?;
    Ok(out)
}

use crate::subject_token::io_reason;

/// A claim value for a message: printable ASCII, at most 200 characters.
fn shown(s: &str) -> String {
    s.chars()
        .take(200)
        .map(|c| {
            if c.is_ascii_graphic() || c == ' ' {
                c
            } else {
                '?'
            }
        })
        .collect()
}

fn since(from: SystemTime, to: SystemTime) -> Duration {
    to.duration_since(from).unwrap_or_default()
}

/// `2026-01-01T00:00:00Z` (clamped to what can be printed).
pub fn rfc3339(t: SystemTime) -> String {
    let last = SystemTime::UNIX_EPOCH + Duration::from_secs(253_402_300_799);
    humantime::format_rfc3339_seconds(t.clamp(SystemTime::UNIX_EPOCH, last)).to_string()
}

/// A duration in its two largest units: `3h 2m`, `45s`, `2d 1h`.
pub fn human(d: Duration) -> String {
    let s = d.as_secs();
    let (days, hours, mins, secs) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    match (days, hours, mins) {
        (0, 0, 0) => format!("{secs}s"),
        (0, 0, m) => format!("{m}m {secs}s"),
        (0, h, m) => format!("{h}h {m}m"),
        (d, h, _) => format!("{d}d {h}h"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const NOW: u64 = 1_767_225_600; // 2026-01-01T00:00:00Z

    fn at(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    fn jwt(claims: serde_json::Value) -> String {
        let e = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        format!(
            "{}.{}.c2lnbmF0dXJlLXNlY3JldA",
            e.encode(r#"{"alg":"RS256"}"#),
            e.encode(claims.to_string())
        )
    }

    fn check(dir: &Path, token: Option<&str>) -> TokenFileReport {
        let path = dir.join("token");
        if let Some(t) = token {
            std::fs::write(&path, t).unwrap();
        }
        check_token_file(&TokenFile {
            check: "x.token_file",
            named_by: "X_TOKEN_FILE",
            path: &path,
            expected_audiences: &["sts.amazonaws.com"],
            audience_fix: "set the audience to sts.amazonaws.com",
            now: at(NOW),
        })
    }

    fn claims(aud: &str, iat: u64, exp: u64) -> String {
        jwt(
            serde_json::json!({"iss": "https://oidc.example", "aud": aud, "sub": "system:serviceaccount:ns:sa", "iat": iat, "exp": exp}),
        )
    }

    fn texts(r: &TokenFileReport) -> String {
        r.findings
            .iter()
            .map(|f| format!("{} {} {} {:?}", f.status.as_str(), f.check, f.detail, f.fix))
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn claims_are_read_without_the_signature() {
        let token = claims("sts.amazonaws.com", NOW - 60, NOW + 3600);
        let c = Claims::of_jwt(&token).unwrap();
        assert_eq!(c.issuer.as_deref(), Some("https://oidc.example"));
        assert_eq!(c.audiences, ["sts.amazonaws.com"]);
        assert_eq!(c.expires_at, Some(at(NOW + 3600)));
        let d = c.describe(at(NOW));
        assert!(d.contains("expires 2026-01-01T01:00:00Z (in 1h 0m)"), "{d}");
        assert!(!d.contains("c2ln"), "{d}");
        let list = jwt(serde_json::json!({"aud": ["a", "b"]}));
        assert_eq!(Claims::of_jwt(&list).unwrap().audiences, ["a", "b"]);
        assert!(Claims::of_jwt("not-a-jwt").is_none());
        assert!(Claims::of_jwt("a.b.c.d").is_none());
    }

    #[test]
    fn good_token_file_passes_and_never_shows_the_token() {
        let dir = tempfile_dir();
        let token = claims("sts.amazonaws.com", NOW - 60, NOW + 3600);
        let r = check(&dir, Some(&token));
        assert!(!r.failed(), "{}", texts(&r));
        assert_eq!(r.audience_ok, Some(true));
        let all = texts(&r);
        assert!(all.contains("subject system:serviceaccount:ns:sa"), "{all}");
        for part in token.split('.') {
            assert!(!all.contains(part), "token text in findings: {all}");
        }
    }

    #[test]
    fn missing_unreadable_and_not_a_jwt_name_the_cause() {
        let dir = tempfile_dir();
        let r = check(&dir, None);
        assert!(r.failed());
        assert!(texts(&r).contains("token file missing"), "{}", texts(&r));
        assert!(texts(&r).contains("X_TOKEN_FILE"), "{}", texts(&r));
        std::fs::create_dir(dir.join("token")).unwrap();
        let r = check(&dir, None);
        assert!(texts(&r).contains("token file unreadable"), "{}", texts(&r));
        std::fs::remove_dir(dir.join("token")).unwrap();
        let r = check(&dir, Some("plain-secret-text"));
        assert!(texts(&r).contains("does not hold a JWT"), "{}", texts(&r));
        assert!(!texts(&r).contains("plain-secret-text"));
    }

    #[test]
    fn expired_token_and_clock_behind_are_failures() {
        let dir = tempfile_dir();
        let r = check(
            &dir,
            Some(&claims("sts.amazonaws.com", NOW - 7200, NOW - 3600)),
        );
        assert!(r.failed());
        assert!(texts(&r).contains("token expired"), "{}", texts(&r));
        assert!(texts(&r).contains("1h 0m before"), "{}", texts(&r));
        let r = check(
            &dir,
            Some(&claims("sts.amazonaws.com", NOW + 7200, NOW + 10_800)),
        );
        assert!(r.failed());
        let t = texts(&r);
        assert!(t.contains("clock far from the token's iat"), "{t}");
        assert!(t.contains("2h 0m ahead"), "{t}");
        assert!(t.contains("NTP"), "{t}");
        // Within the skew limit: no complaint.
        let r = check(
            &dir,
            Some(&claims("sts.amazonaws.com", NOW + 60, NOW + 3600)),
        );
        assert!(!r.failed(), "{}", texts(&r));
    }

    #[test]
    fn audience_mismatch_names_the_expected_audience() {
        let dir = tempfile_dir();
        let r = check(
            &dir,
            Some(&claims("api://AzureADTokenExchange", NOW, NOW + 3600)),
        );
        assert_eq!(r.audience_ok, Some(false));
        let t = texts(&r);
        assert!(t.contains("audience mismatch"), "{t}");
        assert!(t.contains("expected sts.amazonaws.com"), "{t}");
        assert!(t.contains("set the audience"), "{t}");
    }

    #[test]
    fn human_durations() {
        assert_eq!(human(Duration::from_secs(45)), "45s");
        assert_eq!(human(Duration::from_secs(125)), "2m 5s");
        assert_eq!(human(Duration::from_secs(3 * 3600 + 120)), "3h 2m");
        assert_eq!(human(Duration::from_secs(2 * 86_400 + 3600)), "2d 1h");
    }

    fn tempfile_dir() -> std::path::PathBuf {
        use std::sync::atomic::{AtomicUsize, Ordering};
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "regbroker-diagnosis-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }
}
