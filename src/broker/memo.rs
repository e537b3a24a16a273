//! Answers kept ready: the body a request for a credential was answered with, kept so
//! the same request is answered again without parsing the registry, deciding its source
//! or looking up the cache (a cache hit's own work was twice a bare server's).
//!
//! A kept answer is exactly what the broker would answer, for as long as it is kept:
//!
//! - **Every change forgets every answer at once.** A static reload, and a credential
//!   cached, replaced, dropped or evicted, call [`Memo::changed`], which empties the memo.
//!   A kept body holding a secret is therefore dropped (and zeroised by its owner) when
//!   the entry it was made from goes, not at some later request.
//! - **An answer made across a change is not kept.** [`Memo::kept`] reads the change
//!   count before the request is decided; [`Memo::keep`] keeps the answer only if no
//!   change came since (checked under the writers' lock [`Memo::changed`] also takes).
//! - **An answer is kept only until its credential's refresh point** (and never past its
//!   expiry): from there on the cache's answer differs (it starts a background refresh),
//!   so the request is decided again.
//!
//! The memo is keyed by the request's exact query string: another spelling of the same
//! registry is another request. It holds at most [`SLOTS`] answers (a sidecar serves a
//! few registries); a new one replaces the oldest, so requests in endless spellings only
//! make each other decide afresh. Readers never lock: the slots are an [`ArcSwap`]ped
//! list, rebuilt by the (rare) writers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use bytes::Bytes;
use regbroker_provider::Registry;

/// Most answers kept.
pub const SLOTS: usize = 32;

/// One kept answer. Its Debug form leaves the body out (it holds the secret).
#[derive(Clone)]
pub struct Answer {
    /// The answer's body.
    pub body: Bytes,
    /// The registry it is for (for the log line a served credential writes).
    pub registry: Registry,
    /// `static` or the provider's name.
    pub source: &'static str,
    /// Whether it came from the cache (and a repeat counts as a cache hit).
    pub cached: bool,
    /// From this instant on it is not the broker's answer; `None`: until a change.
    pub until: Option<SystemTime>,
}

impl std::fmt::Debug for Answer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Answer")
            .field(
                "body",
                &format_args!("[REDACTED; {} bytes]", self.body.len()),
            )
            .field("registry", &self.registry)
            .field("source", &self.source)
            .field("cached", &self.cached)
            .field("until", &self.until)
            .finish()
    }
}

#[derive(Debug)]
struct Slot {
    request: Box<str>,
    answer: Answer,
}

/// The kept answers; see the module docs.
#[derive(Debug, Default)]
pub struct Memo {
    slots: ArcSwap<Vec<Slot>>,
    changes: AtomicU64,
    writers: Mutex<()>,
}

/// A request the memo had no answer for, with the change count read before it was
/// decided: the only way to [`Memo::keep`] its answer.
#[derive(Debug)]
#[must_use = "a miss is what keeps the answer the request gets"]
pub struct Miss {
    changes: u64,
}

impl Memo {
    /// The body kept for `request` if it is still the broker's answer at `now` (read
    /// only when the answer has an end), after `served` saw the whole answer; else a
    /// [`Miss`] to keep the one decided now.
    pub fn kept(
        &self,
        request: &str,
        now: impl FnOnce() -> SystemTime,
        served: impl FnOnce(&Answer),
    ) -> Result<Bytes, Miss> {
        // Read first: a change after this makes whatever is decided next unkeepable.
        let changes = self.changes.load(Ordering::Acquire);
        let slots = self.slots.load();
        match slots.iter().find(|s| *s.request == *request) {
            Some(slot) if slot.answer.until.is_none_or(|until| now() < until) => {
                served(&slot.answer);
                Ok(slot.answer.body.clone())
            }
            _ => Err(Miss { changes }),
        }
    }

    /// Keeps `answer` for the request that missed with `miss`, unless something changed
    /// since the miss or the answer already ended at `now`.
    pub fn keep(&self, request: &str, miss: Miss, answer: Answer, now: SystemTime) {
        if answer.until.is_some_and(|until| until <= now) {
            return;
        }
        let _writing = self.writers.lock().unwrap_or_else(PoisonError::into_inner);
        if self.changes.load(Ordering::Acquire) != miss.changes {
            return;
        }
        let old = self.slots.load();
        let mut slots = Vec::with_capacity(old.len().min(SLOTS - 1) + 1);
        // The oldest goes first: to make room, and any answer that ended (a request
        // kept again after its refresh point).
        let skip = (old.len() + 1).saturating_sub(SLOTS);
        slots.extend(
            old.iter()
                .skip(skip)
                .filter(|s| *s.request != *request && s.answer.until.is_none_or(|u| now < u))
                .map(|s| Slot {
                    request: s.request.clone(),
                    answer: s.answer.clone(),
                }),
        );
        slots.push(Slot {
            request: request.into(),
            answer,
        });
        self.slots.store(Arc::new(slots));
    }

    /// Something an answer may have been made from changed: forgets every kept answer,
    /// and keeps none decided before now.
    pub fn changed(&self) {
        let _writing = self.writers.lock().unwrap_or_else(PoisonError::into_inner);
        self.changes.fetch_add(1, Ordering::AcqRel);
        self.slots.store(Arc::default());
    }

    /// How many answers are kept.
    pub fn len(&self) -> usize {
        self.slots.load().len()
    }

    /// Whether no answer is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn answer(body: &'static str, until: Option<SystemTime>) -> Answer {
        Answer {
            body: Bytes::from_static(body.as_bytes()),
            registry: Registry::parse("registry.example.com").unwrap(),
            source: "static",
            cached: false,
            until,
        }
    }

    fn body(memo: &Memo, request: &str, now: SystemTime) -> Option<Bytes> {
        memo.kept(request, || now, |_| {}).ok()
    }

    #[test]
    fn a_kept_answer_is_served_for_the_same_request_only() {
        let memo = Memo::default();
        let miss = memo.kept("registry=a", || at(0), |_| {}).unwrap_err();
        memo.keep("registry=a", miss, answer("A", None), at(0));
        assert_eq!(body(&memo, "registry=a", at(0)).as_deref(), Some(&b"A"[..]));
        assert_eq!(body(&memo, "registry=A", at(0)), None);
        assert_eq!(body(&memo, "registry=a&", at(0)), None);
        assert_eq!(body(&memo, "registry=", at(0)), None);
    }

    #[test]
    fn an_answer_ends_exactly_at_its_until_and_is_not_kept_if_already_ended() {
        let memo = Memo::default();
        let miss = memo.kept("r", || at(0), |_| {}).unwrap_err();
        memo.keep("r", miss, answer("A", Some(at(10))), at(0));
        assert!(body(&memo, "r", at(9)).is_some());
        assert!(body(&memo, "r", at(10)).is_none());

        let memo = Memo::default();
        let miss = memo.kept("r", || at(0), |_| {}).unwrap_err();
        memo.keep("r", miss, answer("A", Some(at(10))), at(10));
        assert!(memo.is_empty(), "an answer that already ended was kept");
    }

    #[test]
    fn a_change_forgets_every_answer_and_refuses_one_decided_before_it() {
        let memo = Memo::default();
        let first = memo.kept("a", || at(0), |_| {}).unwrap_err();
        memo.keep("a", first, answer("A", None), at(0));
        let before = memo.kept("b", || at(0), |_| {}).unwrap_err();
        memo.changed();
        assert!(memo.is_empty(), "a change left an answer kept");
        assert!(body(&memo, "a", at(0)).is_none());
        memo.keep("b", before, answer("B", None), at(0));
        assert!(
            memo.is_empty(),
            "an answer decided before a change was kept"
        );
        let after = memo.kept("b", || at(0), |_| {}).unwrap_err();
        memo.keep("b", after, answer("B", None), at(0));
        assert!(body(&memo, "b", at(0)).is_some());
    }

    #[test]
    fn at_most_slots_answers_are_kept_and_the_oldest_goes_first() {
        let memo = Memo::default();
        let names: Vec<String> = (0..=SLOTS).map(|i| format!("registry={i}")).collect();
        for name in &names {
            let miss = memo.kept(name, || at(0), |_| {}).unwrap_err();
            memo.keep(name, miss, answer("x", None), at(0));
        }
        assert_eq!(memo.len(), SLOTS);
        assert!(body(&memo, &names[0], at(0)).is_none(), "the oldest stayed");
        assert!(body(&memo, &names[1], at(0)).is_some());
        assert!(body(&memo, &names[SLOTS], at(0)).is_some());
    }

    #[test]
    fn keeping_a_request_again_replaces_its_answer_and_drops_ended_ones() {
        let memo = Memo::default();
        let miss = memo.kept("a", || at(0), |_| {}).unwrap_err();
        memo.keep("a", miss, answer("old", Some(at(5))), at(0));
        let miss = memo.kept("b", || at(0), |_| {}).unwrap_err();
        memo.keep("b", miss, answer("B", Some(at(10))), at(0));
        let miss = memo.kept("a", || at(6), |_| {}).unwrap_err();
        memo.keep("a", miss, answer("new", Some(at(20))), at(6));
        assert_eq!(memo.len(), 2);
        assert_eq!(body(&memo, "a", at(6)).as_deref(), Some(&b"new"[..]));
        let miss = memo.kept("c", || at(12), |_| {}).unwrap_err();
        memo.keep("c", miss, answer("C", None), at(12));
        assert_eq!(memo.len(), 2, "an answer past its end stayed kept");
        assert!(body(&memo, "b", at(12)).is_none());
    }

    #[test]
    fn keeping_another_answer_at_the_instant_one_ends_drops_it() {
        let memo = Memo::default();
        let miss = memo.kept("a", || at(0), |_| {}).unwrap_err();
        memo.keep("a", miss, answer("A", Some(at(10))), at(0));
        assert!(!memo.is_empty());
        let miss = memo.kept("b", || at(10), |_| {}).unwrap_err();
        memo.keep("b", miss, answer("B", None), at(10));
        assert_eq!(
            memo.len(),
            1,
            "an answer that ended at this instant stayed kept"
        );
        assert!(body(&memo, "b", at(10)).is_some());
    }

    #[test]
    fn debug_output_never_shows_a_kept_body() {
        let memo = Memo::default();
        let miss = memo.kept("a", || at(0), |_| {}).unwrap_err();
        memo.keep("a", miss, answer("{\"password\":\"s3cret\"}", None), at(0));
        let shown = format!("{memo:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("[REDACTED; 21 bytes]"), "{shown}");
    }

    #[test]
    fn an_answer_without_an_end_never_reads_the_clock() {
        let memo = Memo::default();
        let miss = memo.kept("a", || at(0), |_| {}).unwrap_err();
        memo.keep("a", miss, answer("A", None), at(0));
        let mut seen = None;
        let body = memo.kept(
            "a",
            || unreachable!("the clock was read"),
            |a| seen = Some(a.source),
        );
        assert_eq!(body.ok().as_deref(), Some(&b"A"[..]));
        assert_eq!(seen, Some("static"), "the answer was not shown to `served`");
    }
}
