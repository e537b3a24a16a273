//! What a reconcile found, turned into the object's status and the Events worth sending,
//! by the Kubernetes API conventions and kstatus as Flux applies them: `Ready` always,
//! `Reconciling` and `Stalled` only while True, `lastTransitionTime` moved only when a
//! condition's status flips, and nothing that changes on every pass (so a steady state
//! writes no status).

use std::time::SystemTime;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use super::api::{RegistryCredentialStatus, RegistryStatus};

/// The summary condition.
pub const READY: &str = "Ready";
/// Present (True) while a refresh is being retried.
pub const RECONCILING: &str = "Reconciling";
/// Present (True) while something retrying cannot fix stops the object.
pub const STALLED: &str = "Stalled";

/// Flux's reason for a Ready object.
pub const SUCCEEDED: &str = "Succeeded";
/// Flux's reason while a failed step is retried.
pub const PROGRESSING_WITH_RETRY: &str = "ProgressingWithRetry";
/// `spec.suspend` is set.
pub const SUSPENDED: &str = "Suspended";

/// Why an object is Stalled: each a fix the tenant or the operator must make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallReason {
    /// No `spec.serviceAccountName`, and no `--default-service-account`.
    ServiceAccountRequired,
    /// The ServiceAccount does not exist.
    ServiceAccountNotFound,
    /// Its annotations do not configure the provider (missing or malformed).
    IdentityNotConfigured,
    /// A registry that cannot be parsed.
    InvalidRegistry,
    /// A registry no provider serves for tenants.
    RegistryNotServed,
    /// The target Secret belongs to something else (another object, regbroker's own
    /// configuration, or nobody regbroker knows).
    SecretConflict,
    /// `spec.secretRef` names a Secret that is not a docker config, or the target itself.
    InvalidSecretRef,
}

impl StallReason {
    /// The CamelCase reason.
    pub fn as_str(self) -> &'static str {
        match self {
            StallReason::ServiceAccountRequired => "ServiceAccountRequired",
            StallReason::ServiceAccountNotFound => "ServiceAccountNotFound",
            StallReason::IdentityNotConfigured => "IdentityNotConfigured",
            StallReason::InvalidRegistry => "InvalidRegistry",
            StallReason::RegistryNotServed => "RegistryNotServed",
            StallReason::SecretConflict => "SecretConflict",
            StallReason::InvalidSecretRef => "InvalidSecretRef",
        }
    }
}

/// What one reconcile found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Something retrying cannot fix; nothing was written.
    Stalled {
        /// Why.
        reason: StallReason,
        /// What to fix, naming the field.
        message: String,
    },
    /// `spec.suspend`: nothing was written; the Secret holds what it held.
    Suspended,
    /// The Secret was brought up to date with what could be fetched.
    Synced {
        /// One per registry of the spec, in its order.
        registries: Vec<RegistryStatus>,
        /// Whether the Secret's data was written in this pass (a refresh).
        written: bool,
        /// The failures being retried, `(reason, message)`, if any.
        retrying: Option<(String, String)>,
    },
    /// A step failed before anything could be fetched (the API, a missing `secretRef`);
    /// retried with backoff. The Secret holds what it held.
    Failed {
        /// CamelCase.
        reason: String,
        /// No secret in it.
        message: String,
    },
}

/// Timestamps as the API stores them: whole seconds (so a status written again with the
/// same instant compares equal to what was read back).
pub fn time(t: SystemTime) -> Time {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // 9999-12-31T23:59:59Z, the last second the timestamp type holds.
    let secs = i64::try_from(secs).unwrap_or(i64::MAX).min(253_402_300_799);
    Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap_or_default())
}

/// The status after a reconcile of generation `generation` that found `found`, given the
/// previous status, at `now`. `secret_name` is the target; `requested` the
/// `regbroker.dev/requestedAt` annotation handled.
pub fn next(
    previous: &RegistryCredentialStatus,
    generation: Option<i64>,
    secret_name: &str,
    requested: Option<&str>,
    found: Found,
    now: SystemTime,
) -> RegistryCredentialStatus {
    let mut status = RegistryCredentialStatus {
        observed_generation: generation,
        secret_name: Some(secret_name.to_string()),
        expires_at: previous.expires_at.clone(),
        refresh_time: previous.refresh_time.clone(),
        last_handled_reconcile_at: requested
            .map(str::to_string)
            .or_else(|| previous.last_handled_reconcile_at.clone()),
        registries: previous.registries.clone(),
        conditions: Vec::new(),
    };
    let valid_until = |registries: &[RegistryStatus]| earliest(registries);
    let still_valid = |registries: &[RegistryStatus]| {
        !registries.is_empty()
            && registries
                .iter()
                .all(|r| held(r) && r.expires_at.as_ref().is_none_or(|e| e > &time(now)))
    };
    let (ready, reconciling, stalled) = match found {
        Found::Stalled { reason, message } => (
            (false, reason.as_str().to_string(), message.clone()),
            None,
            Some((reason.as_str().to_string(), message)),
        ),
        Found::Suspended => {
            let valid = still_valid(&status.registries);
            let message = if valid {
                format!(
                    "suspended (spec.suspend): Secret {secret_name} is not refreshed; {}",
                    validity(&status.registries)
                )
            } else {
                format!(
                    "suspended (spec.suspend): Secret {secret_name} is not refreshed and holds no valid credential for every registry"
                )
            };
            ((valid, SUSPENDED.to_string(), message), None, None)
        }
        Found::Synced {
            registries,
            written,
            retrying,
        } => {
            if written {
                status.refresh_time = Some(time(now));
            }
            status.expires_at = valid_until(&registries);
            status.registries = registries;
            let valid = still_valid(&status.registries);
            let ready = match (&retrying, valid) {
                (_, true) => (
                    true,
                    SUCCEEDED.to_string(),
                    format!(
                        "Secret {secret_name} holds credentials for {} {}; {}",
                        status.registries.len(),
                        plural(status.registries.len()),
                        validity(&status.registries)
                    ),
                ),
                (Some((reason, message)), false) => (false, reason.clone(), message.clone()),
                (None, false) => (
                    false,
                    PROGRESSING_WITH_RETRY.to_string(),
                    format!("Secret {secret_name} lacks a valid credential for a registry"),
                ),
            };
            let reconciling = retrying.map(|(reason, message)| {
                (
                    PROGRESSING_WITH_RETRY.to_string(),
                    format!("{reason}: {message}"),
                )
            });
            (ready, reconciling, None)
        }
        Found::Failed { reason, message } => {
            let valid = still_valid(&status.registries);
            let ready = if valid {
                let prev = find(&previous.conditions, READY);
                (
                    true,
                    prev.map_or(SUCCEEDED.to_string(), |c| c.reason.clone()),
                    prev.map_or_else(|| validity(&status.registries), |c| c.message.clone()),
                )
            } else {
                (false, reason.clone(), message.clone())
            };
            (
                ready,
                Some((
                    PROGRESSING_WITH_RETRY.to_string(),
                    format!("{reason}: {message}"),
                )),
                None,
            )
        }
    };
    let (ok, reason, message) = ready;
    status.conditions.push(condition(
        previous, READY, ok, reason, message, generation, now,
    ));
    if let Some((reason, message)) = reconciling {
        status.conditions.push(condition(
            previous,
            RECONCILING,
            true,
            reason,
            message,
            generation,
            now,
        ));
    }
    if let Some((reason, message)) = stalled {
        status.conditions.push(condition(
            previous, STALLED, true, reason, message, generation, now,
        ));
    }
    status
}

/// When the controller last found an object's Secret holding every registry fresh, and
/// when it last failed to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Checks {
    /// The last look that found every registry fetched and the Secret written.
    pub success: Option<SystemTime>,
    /// The last look that did not (a fetch failed, or the object is Stalled).
    pub failure: Option<SystemTime>,
}

impl Checks {
    /// Records what a look found at `now` (a suspended object records nothing).
    pub fn record(&mut self, found: &Found, now: SystemTime) {
        match found {
            Found::Synced { retrying: None, .. } => self.success = Some(now),
            Found::Suspended => {}
            Found::Synced { .. } | Found::Failed { .. } | Found::Stalled { .. } => {
                self.failure = Some(now);
            }
        }
    }
}

/// An object's health series (`/metrics`) from its latest `status`: the Secret `sink`
/// (`secret/NAMESPACE/NAME`), each condition, and each held credential's expiry.
pub fn health(
    namespace: &str,
    name: &str,
    sink: String,
    status: &RegistryCredentialStatus,
    checks: Checks,
) -> crate::metrics::health::TenantHealth {
    let condition = |type_: &str| match find(&status.conditions, type_) {
        Some(c) => (
            match c.status.as_str() {
                "True" => "True",
                "False" => "False",
                _ => "Unknown",
            },
            c.reason.clone(),
        ),
        None if type_ == READY => ("Unknown", String::new()),
        None => ("False", String::new()),
    };
    let unix = |t: &Time| {
        SystemTime::UNIX_EPOCH
            + std::time::Duration::from_secs(u64::try_from(t.0.as_second()).unwrap_or(0))
    };
    crate::metrics::health::TenantHealth {
        namespace: namespace.to_string(),
        name: name.to_string(),
        sink,
        conditions: [condition(READY), condition(RECONCILING), condition(STALLED)],
        expiries: status
            .registries
            .iter()
            .filter(|r| held(r))
            .filter_map(|r| Some((r.name.clone(), unix(r.expires_at.as_ref()?))))
            .collect(),
        failed_registries: status
            .registries
            .iter()
            .filter(|r| r.reason != SUCCEEDED)
            .count(),
        last_success: checks.success,
        last_failure: checks.failure,
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "registry" } else { "registries" }
}

/// Whether the Secret holds an entry for this registry.
fn held(r: &RegistryStatus) -> bool {
    r.provider.is_some()
}

fn earliest(registries: &[RegistryStatus]) -> Option<Time> {
    registries.iter().filter_map(|r| r.expires_at.clone()).min()
}

fn validity(registries: &[RegistryStatus]) -> String {
    match earliest(registries) {
        Some(t) => format!("valid until {}", t.0),
        None => "none expires".to_string(),
    }
}

fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// A condition, with the previous one's `lastTransitionTime` when its status is the same.
fn condition(
    previous: &RegistryCredentialStatus,
    type_: &str,
    ok: bool,
    reason: String,
    message: String,
    generation: Option<i64>,
    now: SystemTime,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let last_transition_time = find(&previous.conditions, type_)
        .filter(|c| c.status == status)
        .map_or_else(|| time(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason,
        message,
        observed_generation: generation,
        last_transition_time,
    }
}

/// An Event to send about a transition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transition {
    /// Warning (true) or Normal.
    pub warning: bool,
    /// CamelCase.
    pub reason: String,
    /// No secret in it.
    pub note: String,
}

/// The Events worth sending for the move from `before` to `after`: became Ready or
/// recovered, a refresh that started failing (or fails differently), stalled (or for
/// another reason). A condition that stays as it was sends nothing, so a failing object
/// does not flood the API.
pub fn transitions(
    before: &RegistryCredentialStatus,
    after: &RegistryCredentialStatus,
) -> Vec<Transition> {
    let key = |s: &RegistryCredentialStatus, t: &str| {
        find(&s.conditions, t).map(|c| (c.status.clone(), c.reason.clone()))
    };
    let mut out = Vec::new();
    if let Some(c) = find(&after.conditions, STALLED)
        && key(before, STALLED) != key(after, STALLED)
    {
        out.push(Transition {
            warning: true,
            reason: c.reason.clone(),
            note: c.message.clone(),
        });
    }
    if let Some(c) = find(&after.conditions, RECONCILING)
        && find(&before.conditions, RECONCILING).map(|c| &c.message) != Some(&c.message)
    {
        out.push(Transition {
            warning: true,
            reason: "RefreshFailed".to_string(),
            note: c.message.clone(),
        });
    }
    let ready = find(&after.conditions, READY);
    let was_ready = find(&before.conditions, READY).is_some_and(|c| c.status == "True");
    if let Some(c) = ready
        && c.status == "True"
        && !was_ready
    {
        let recovered = !before.conditions.is_empty();
        out.push(Transition {
            warning: false,
            reason: if recovered { "Recovered" } else { SUCCEEDED }.to_string(),
            note: c.message.clone(),
        });
    }
    if let Some(c) = ready
        && c.status == "False"
        && was_ready
        && find(&after.conditions, STALLED).is_none()
    {
        out.push(Transition {
            warning: true,
            reason: c.reason.clone(),
            note: c.message.clone(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn reg(name: &str, expires: Option<u64>, reason: &str) -> RegistryStatus {
        RegistryStatus {
            name: name.to_string(),
            provider: Some("aws".to_string()),
            expires_at: expires.map(|e| time(at(e))),
            reason: reason.to_string(),
        }
    }

    fn synced(registries: Vec<RegistryStatus>, written: bool) -> Found {
        Found::Synced {
            registries,
            written,
            retrying: None,
        }
    }

    fn cond<'a>(s: &'a RegistryCredentialStatus, t: &str) -> Option<&'a Condition> {
        find(&s.conditions, t)
    }

    #[test]
    fn a_synced_object_is_ready_with_the_earliest_expiry_and_a_steady_state_changes_nothing() {
        let empty = RegistryCredentialStatus::default();
        let regs = vec![
            reg("a.test", Some(7200), SUCCEEDED),
            reg("b.test", Some(3600), SUCCEEDED),
        ];
        let first = next(
            &empty,
            Some(1),
            "pull",
            None,
            synced(regs.clone(), true),
            at(0),
        );
        assert_eq!(first.observed_generation, Some(1));
        assert_eq!(first.secret_name.as_deref(), Some("pull"));
        assert_eq!(first.expires_at, Some(time(at(3600))));
        assert_eq!(first.refresh_time, Some(time(at(0))));
        let ready = cond(&first, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", SUCCEEDED)
        );
        assert!(
            ready
                .message
                .starts_with("Secret pull holds credentials for 2 registries; valid until "),
            "{}",
            ready.message
        );
        assert_eq!(ready.last_transition_time, time(at(0)));
        assert!(cond(&first, RECONCILING).is_none() && cond(&first, STALLED).is_none());
        assert_eq!(transitions(&empty, &first)[0].reason, SUCCEEDED);
        // Later, nothing written (the Secret is up to date): the very same status, so
        // nothing to write back and no Event.
        let again = next(&first, Some(1), "pull", None, synced(regs, false), at(600));
        assert_eq!(again, first);
        assert!(transitions(&first, &again).is_empty());
    }

    #[test]
    fn a_failed_refresh_keeps_ready_while_valid_then_ready_turns_false_at_expiry() {
        let empty = RegistryCredentialStatus::default();
        let ok = next(
            &empty,
            Some(2),
            "pull",
            None,
            synced(vec![reg("a.test", Some(3600), SUCCEEDED)], true),
            at(0),
        );
        let found = || Found::Synced {
            registries: vec![reg("a.test", Some(3600), "UpstreamUnavailable")],
            written: false,
            retrying: Some(("UpstreamUnavailable".into(), "a.test: aws: down".into())),
        };
        let failing = |now| next(&ok, Some(2), "pull", None, found(), now);
        let retrying = failing(at(3000));
        let ready = cond(&retrying, READY).unwrap();
        assert_eq!(ready.status, "True", "still valid: still Ready");
        assert_eq!(
            ready.last_transition_time,
            time(at(0)),
            "no flip, no new time"
        );
        let rec = cond(&retrying, RECONCILING).unwrap();
        assert_eq!(
            (rec.status.as_str(), rec.reason.as_str()),
            ("True", PROGRESSING_WITH_RETRY)
        );
        assert!(rec.message.contains("UpstreamUnavailable"));
        assert_eq!(retrying.refresh_time, ok.refresh_time, "nothing refreshed");
        let events = transitions(&ok, &retrying);
        assert_eq!(events.len(), 1);
        assert!(events[0].warning && events[0].reason == "RefreshFailed");
        // At the expiry, Ready turns False with the failure's reason, at that instant.
        let expired = failing(at(3600));
        let ready = cond(&expired, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "UpstreamUnavailable")
        );
        assert_eq!(ready.last_transition_time, time(at(3600)));
        let flip = transitions(&retrying, &expired);
        assert_eq!(flip.len(), 1, "{flip:?}");
        assert!(flip[0].warning && flip[0].reason == "UpstreamUnavailable");
        // Failing the same way again sends no second Event, and changes nothing.
        let twice = next(&expired, Some(2), "pull", None, found(), at(3700));
        assert_eq!(twice, expired);
        assert!(transitions(&expired, &twice).is_empty());
        // Recovery: Ready again, Reconciling gone, one Normal Event.
        let back = next(
            &expired,
            Some(2),
            "pull",
            None,
            synced(vec![reg("a.test", Some(9000), SUCCEEDED)], true),
            at(3800),
        );
        assert!(cond(&back, RECONCILING).is_none());
        let ev = transitions(&expired, &back);
        assert_eq!(ev.len(), 1);
        assert!(!ev[0].warning && ev[0].reason == "Recovered");
    }

    #[test]
    fn health_reports_each_condition_each_held_expiry_and_the_looks() {
        // Before any status: Ready Unknown, the others False (kstatus: absent is False).
        let none = health(
            "ns",
            "o",
            "secret/ns/t".into(),
            &Default::default(),
            Checks::default(),
        );
        assert_eq!(
            none.conditions,
            [
                ("Unknown", String::new()),
                ("False", String::new()),
                ("False", String::new())
            ]
        );
        assert!(none.expiries.is_empty() && none.last_success.is_none());

        let mut failing = reg("b.example.com", None, "UpstreamUnavailable");
        failing.provider = None; // not held: no entry in the Secret
        let mut down = reg("c.example.com", None, "UpstreamUnavailable");
        down.provider = None;
        let regs = vec![reg("a.example.com", Some(5_000), SUCCEEDED), failing, down];
        let mut checks = Checks::default();
        let found = Found::Synced {
            registries: regs.clone(),
            written: true,
            retrying: Some(("UpstreamUnavailable".into(), "down".into())),
        };
        checks.record(&found, at(100));
        checks.record(&synced(regs.clone(), false), at(200));
        checks.record(&Found::Suspended, at(300));
        assert_eq!(
            (checks.success, checks.failure),
            (Some(at(200)), Some(at(100)))
        );
        let s = next(&Default::default(), Some(1), "t", None, found, at(100));
        let h = health("ns", "o", "secret/ns/t".into(), &s, checks);
        // One registry missing from the Secret: not Ready.
        assert_eq!(
            h.conditions[0],
            ("False", "UpstreamUnavailable".to_string())
        );
        assert_eq!(
            h.conditions[1],
            ("True", PROGRESSING_WITH_RETRY.to_string())
        );
        assert_eq!(h.conditions[2].0, "False");
        assert_eq!(h.expiries, [("a.example.com".to_string(), at(5_000))]);
        assert_eq!(h.failed_registries, 2);
        assert_eq!(
            (h.last_success, h.last_failure),
            (Some(at(200)), Some(at(100)))
        );
        let stalled = Found::Stalled {
            reason: StallReason::ServiceAccountNotFound,
            message: "m".into(),
        };
        checks.record(&stalled, at(400));
        assert_eq!(checks.failure, Some(at(400)));
    }

    #[test]
    fn a_stall_is_ready_false_and_stalled_true_once_and_the_fix_clears_it() {
        let empty = RegistryCredentialStatus::default();
        let stall = || Found::Stalled {
            reason: StallReason::ServiceAccountNotFound,
            message: "spec.serviceAccountName: ServiceAccount team-a/puller does not exist".into(),
        };
        let s = next(&empty, Some(1), "pull", None, stall(), at(0));
        let ready = cond(&s, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "ServiceAccountNotFound")
        );
        let st = cond(&s, STALLED).unwrap();
        assert_eq!(st.status, "True");
        assert!(st.message.contains("spec.serviceAccountName"));
        assert!(cond(&s, RECONCILING).is_none());
        let ev = transitions(&empty, &s);
        assert_eq!(ev.len(), 1);
        assert!(ev[0].warning && ev[0].reason == "ServiceAccountNotFound");
        // Stalled again, same reason: no Event, same transition time.
        let s2 = next(&s, Some(1), "pull", None, stall(), at(60));
        assert_eq!(s2, s);
        assert!(transitions(&s, &s2).is_empty());
        // Fixed: Ready, Stalled gone.
        let fixed = next(
            &s2,
            Some(1),
            "pull",
            None,
            synced(vec![reg("a.test", Some(3600), SUCCEEDED)], true),
            at(120),
        );
        assert!(cond(&fixed, STALLED).is_none());
        assert_eq!(
            cond(&fixed, READY).unwrap().last_transition_time,
            time(at(120))
        );
        assert_eq!(transitions(&s2, &fixed)[0].reason, "Recovered");
    }

    #[test]
    fn a_new_generation_and_a_handled_request_are_recorded() {
        let empty = RegistryCredentialStatus::default();
        let regs = vec![reg("a.test", None, SUCCEEDED)];
        let s = next(
            &empty,
            Some(1),
            "pull",
            Some("t1"),
            synced(regs.clone(), true),
            at(0),
        );
        assert_eq!(s.last_handled_reconcile_at.as_deref(), Some("t1"));
        assert_eq!(s.expires_at, None, "a static entry does not expire");
        assert_eq!(
            cond(&s, READY).unwrap().message,
            "Secret pull holds credentials for 1 registry; none expires"
        );
        let s2 = next(&s, Some(2), "pull", None, synced(regs, false), at(10));
        assert_eq!(s2.observed_generation, Some(2));
        assert_eq!(cond(&s2, READY).unwrap().observed_generation, Some(2));
        assert_eq!(s2.last_handled_reconcile_at.as_deref(), Some("t1"), "kept");
    }

    #[test]
    fn suspended_says_so_in_ready_and_turns_false_once_expired() {
        let empty = RegistryCredentialStatus::default();
        let s = next(
            &empty,
            Some(1),
            "pull",
            None,
            synced(vec![reg("a.test", Some(3600), SUCCEEDED)], true),
            at(0),
        );
        let held = next(&s, Some(2), "pull", None, Found::Suspended, at(100));
        let ready = cond(&held, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("True", SUSPENDED)
        );
        assert!(ready.message.contains("suspended"));
        let gone = next(&held, Some(2), "pull", None, Found::Suspended, at(3600));
        assert_eq!(cond(&gone, READY).unwrap().status, "False");
    }

    #[test]
    fn a_registry_missing_from_the_secret_is_not_ready() {
        let empty = RegistryCredentialStatus::default();
        let missing = RegistryStatus {
            name: "b.test".into(),
            provider: None,
            expires_at: None,
            reason: "IdentityRejected".into(),
        };
        let s = next(
            &empty,
            Some(1),
            "pull",
            None,
            Found::Synced {
                registries: vec![reg("a.test", Some(3600), SUCCEEDED), missing],
                written: true,
                retrying: Some(("IdentityRejected".into(), "b.test: denied".into())),
            },
            at(0),
        );
        let ready = cond(&s, READY).unwrap();
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "IdentityRejected")
        );
        assert_eq!(cond(&s, RECONCILING).unwrap().status, "True");
    }
}
