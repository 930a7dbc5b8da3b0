//! The cluster-wide admission of a principal assertion (the shared replay cache, R-ARCH-13)
//! without a round trip of its own: in a service whose requests change nothing but the
//! store, the admission rides in the statement of the request's first append (PostgreSQL:
//! one statement inserts the assertion's tag and, only if that tag is new, the events), so
//! a replayed command appends nothing. A request that appends nothing (a read, a refusal)
//! is admitted on its own once its answer is ready, before the answer goes out.
//!
//! The state lives in a task-local for the request's task: the append runs in it.

use std::cell::Cell;
use std::future::Future;

tokio::task_local! {
    static ADMISSION: Cell<State>;
}

/// Where a request's admission stands.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// Nothing to admit (no assertion, or admitted before the request ran).
    #[default]
    None,
    /// Admitted by this process, not yet by the cluster.
    Pending { tag: [u8; 32], expires_at_ms: i64 },
    /// The cluster admitted it with the request's first append.
    Admitted,
    /// Some process admitted it before: a replay. The append carrying it stored nothing.
    Replayed,
}

/// Runs `request` with a place for its admission; its output, and where the admission
/// stands after it.
pub async fn scope<F: Future>(request: F) -> (F::Output, State) {
    ADMISSION
        .scope(Cell::new(State::None), async {
            let output = request.await;
            (output, current().unwrap_or_default())
        })
        .await
}

fn current() -> Option<State> {
    ADMISSION.try_with(Cell::get).ok()
}

fn set(new: State) -> bool {
    ADMISSION.try_with(|state| state.set(new)).is_ok()
}

/// Leaves the admission of `tag` to the request's first append (or its end); `false`
/// outside a request's [`scope`], where the caller admits it at once.
pub fn defer(tag: [u8; 32], expires_at_ms: i64) -> bool {
    set(State::Pending { tag, expires_at_ms })
}

/// The admission the next append is to carry, if one is pending.
pub fn pending() -> Option<([u8; 32], i64)> {
    match current()? {
        State::Pending { tag, expires_at_ms } => Some((tag, expires_at_ms)),
        _ => None,
    }
}

/// Whether the request's assertion turned out to be a replay.
pub fn replayed() -> bool {
    current() == Some(State::Replayed)
}

/// What the append that carried the pending admission found (a failed append leaves it
/// pending: a retry carries it again).
pub fn settle(admitted: bool) {
    set(if admitted { State::Admitted } else { State::Replayed });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn given_a_deferred_admission_when_an_append_settles_it_then_the_scope_reports_it() {
        let ((), state) = scope(async {
            assert!(defer([1; 32], 5));
            assert_eq!(pending(), Some(([1; 32], 5)));
            settle(false);
            assert_eq!(pending(), None, "settled: the next append carries nothing");
        })
        .await;
        assert_eq!(state, State::Replayed);
        let ((), state) = scope(async {
            defer([2; 32], 6);
        })
        .await;
        assert_eq!(state, State::Pending { tag: [2; 32], expires_at_ms: 6 }, "nothing appended: left to the end of the request");
        assert!(!defer([3; 32], 7), "outside a request's scope nothing is deferred");
        assert_eq!(pending(), None);
    }
}
