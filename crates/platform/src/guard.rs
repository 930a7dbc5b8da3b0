//! What bounds a service process against its callers: how many requests it runs at once,
//! which principal assertions it has already accepted (each is good once), and how many
//! refused assertions per sender it records as security violations (R-AUDIT-5), so that a
//! flood of bad requests can neither exhaust the process nor fill the ledger.
//!
//! The replay cache here is each process's first check. An assertion is bound to the
//! subject of the one service it is for, but a service may run as several replicas (a NATS
//! queue group) and a process may restart, so every assertion is also admitted once for the
//! whole cluster in the store (`admission`, the `assertion_replay` table), until it
//! expires.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use atasira_domain::Principal;
use atasira_domain::assertion::{REPLAY_CACHE_CAPACITY, ReplayCache, ReplayError, Verified};
use chrono::{DateTime, Utc};

/// Requests one service handles at once by default; more are answered `busy` at once
/// (R-ARCH-4: a bounded number of tasks on a bounded database pool).
pub const MAX_IN_FLIGHT: usize = 64;

/// Security violations recorded per sender and window; more are counted and logged only.
pub const VIOLATIONS_PER_WINDOW: u32 = 10;

/// The rate-limit window of recorded violations.
pub const VIOLATION_WINDOW: Duration = Duration::from_secs(60);

/// Senders tracked at once by the violation limit; beyond, new senders share one budget.
const MAX_SOURCES: usize = 1024;

/// The process's limits, shared by every service it runs (`Runtime::guards`).
#[derive(Debug)]
pub struct Guards {
    /// Requests one service runs at once.
    pub max_in_flight: usize,
    replay: Mutex<ReplayCache>,
    violations: Mutex<ViolationLimit>,
    /// Requests each NATS publisher's token may send (R-ARCH-15).
    client_rate: crate::ratelimit::Limits,
}

impl Default for Guards {
    fn default() -> Self {
        Self::new(MAX_IN_FLIGHT, REPLAY_CACHE_CAPACITY)
    }
}

impl Guards {
    pub fn new(max_in_flight: usize, replay_capacity: usize) -> Self {
        Self {
            max_in_flight: max_in_flight.max(1),
            replay: Mutex::new(ReplayCache::new(replay_capacity)),
            violations: Mutex::new(ViolationLimit::new(VIOLATIONS_PER_WINDOW, VIOLATION_WINDOW)),
            client_rate: crate::ratelimit::Limits::new(None),
        }
    }

    /// The same limits with a request rate for each NATS publisher's token (the gateway's
    /// rate per user, `ATASIRA_RATE_LIMIT`).
    pub fn with_client_rate(mut self, rate: crate::ratelimit::Rate) -> Self {
        self.client_rate = crate::ratelimit::Limits::new(Some(rate));
        self
    }

    /// `Ok` when the holder of `token_hash` may send one more request now; else how long
    /// until it may.
    pub fn client_rate(&self, token_hash: &str) -> Result<(), Duration> {
        self.client_rate.check(token_hash)
    }

    /// The same limits with another violation budget (`per_window` recorded per sender and
    /// `window`).
    pub fn with_violation_limit(mut self, per_window: u32, window: Duration) -> Self {
        self.violations = Mutex::new(ViolationLimit::new(per_window, window));
        self
    }

    /// Accepts a verified assertion once (see [`ReplayCache::admit`]).
    pub fn admit(&self, verified: Verified, now: DateTime<Utc>) -> Result<Principal, ReplayError> {
        // A poisoned lock only means another request panicked mid-insert; the set is intact.
        self.replay.lock().unwrap_or_else(std::sync::PoisonError::into_inner).admit(verified, now)
    }

    /// Whether a violation by `source` at `now` is recorded; see [`ViolationLimit::check`].
    pub fn violation(&self, source: &str, now: Instant) -> Verdict {
        self.violations.lock().unwrap_or_else(std::sync::PoisonError::into_inner).check(source, now)
    }
}

/// What to do with one security violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Record it. `suppressed` violations of this sender went unrecorded in its previous
    /// window (worth a log line).
    Record { suppressed: u64 },
    /// Count it only; `first` is the first one of this window (worth a log line).
    Suppress { first: bool },
}

#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    recorded: u32,
    suppressed: u64,
}

/// At most `per_window` recorded violations per sender in each fixed window.
#[derive(Debug)]
pub struct ViolationLimit {
    per_window: u32,
    window: Duration,
    sources: HashMap<String, Window>,
}

/// The budget shared by senders beyond [`MAX_SOURCES`].
const OTHERS: &str = "(other senders)";

impl ViolationLimit {
    pub fn new(per_window: u32, window: Duration) -> Self {
        Self { per_window, window, sources: HashMap::new() }
    }

    pub fn check(&mut self, source: &str, now: Instant) -> Verdict {
        if !self.sources.contains_key(source) && self.sources.len() >= MAX_SOURCES {
            let window = self.window;
            self.sources.retain(|_, w| now.saturating_duration_since(w.started) < window);
        }
        let key = if self.sources.contains_key(source) || self.sources.len() < MAX_SOURCES { source } else { OTHERS };
        let w = self.sources.entry(key.to_owned()).or_insert(Window { started: now, recorded: 0, suppressed: 0 });
        let mut suppressed_before = 0;
        if now.saturating_duration_since(w.started) >= self.window {
            suppressed_before = w.suppressed;
            *w = Window { started: now, recorded: 0, suppressed: 0 };
        }
        if w.recorded < self.per_window {
            w.recorded += 1;
            Verdict::Record { suppressed: suppressed_before }
        } else {
            w.suppressed += 1;
            Verdict::Suppress { first: w.suppressed == 1 }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r_audit_5_violations_are_recorded_up_to_the_limit_per_sender_and_window() {
        // given a limit of 3 per minute
        let mut limit = ViolationLimit::new(3, Duration::from_secs(60));
        let t0 = Instant::now();
        // when one sender causes 5 in a minute; then 3 are recorded, 2 counted
        let verdicts: Vec<Verdict> = (0..5).map(|i| limit.check("gateway", t0 + Duration::from_secs(i))).collect();
        assert_eq!(
            verdicts,
            [
                Verdict::Record { suppressed: 0 },
                Verdict::Record { suppressed: 0 },
                Verdict::Record { suppressed: 0 },
                Verdict::Suppress { first: true },
                Verdict::Suppress { first: false }
            ]
        );
        // and another sender has a budget of its own
        assert_eq!(limit.check("approval", t0 + Duration::from_secs(5)), Verdict::Record { suppressed: 0 });
        // when the window has passed; then recording resumes and says how many went unrecorded
        assert_eq!(limit.check("gateway", t0 + Duration::from_secs(61)), Verdict::Record { suppressed: 2 });
        assert_eq!(limit.check("gateway", t0 + Duration::from_secs(62)), Verdict::Record { suppressed: 0 });
    }

    #[test]
    fn r_audit_5_the_limit_tracks_a_bounded_number_of_senders() {
        // given as many senders as are tracked, each with its budget used up
        let mut limit = ViolationLimit::new(1, Duration::from_secs(60));
        let t0 = Instant::now();
        for i in 0..MAX_SOURCES {
            assert_eq!(limit.check(&format!("s{i}"), t0), Verdict::Record { suppressed: 0 });
        }
        // when yet more senders come within the window; then they share one budget
        assert_eq!(limit.check("new-1", t0), Verdict::Record { suppressed: 0 });
        assert_eq!(limit.check("new-2", t0), Verdict::Suppress { first: true });
        assert_eq!(limit.sources.len(), MAX_SOURCES + 1);
        // and once the window has passed, old senders are forgotten for new ones
        assert_eq!(limit.check("new-3", t0 + Duration::from_secs(60)), Verdict::Record { suppressed: 0 });
        assert!(limit.sources.len() <= 2, "{}", limit.sources.len());
    }
}

/// How many requests NATS publishers (people and agents with a PAT) may have in one
/// service at once, all together and each token alone (R-ARCH-15): apart from the budget
/// of atasira's own processes, so no token, and no crowd of tokens, can take the slots the
/// gateway needs.
#[derive(Debug)]
pub struct ClientBudget {
    total: usize,
    per_token: usize,
    held: Mutex<std::collections::HashMap<String, usize>>,
}

impl ClientBudget {
    pub fn new(total: usize, per_token: usize) -> Self {
        Self { total: total.max(1), per_token: per_token.max(1), held: Mutex::new(std::collections::HashMap::new()) }
    }

    /// A slot for the holder of `token_hash`, or `None` when it or everyone holds enough.
    pub fn enter(self: &std::sync::Arc<Self>, token_hash: &str) -> Option<ClientSlot> {
        let mut held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let all: usize = held.values().sum();
        let mine = held.get(token_hash).copied().unwrap_or(0);
        if all >= self.total || mine >= self.per_token {
            return None;
        }
        held.insert(token_hash.to_owned(), mine + 1);
        Some(ClientSlot { budget: self.clone(), token_hash: token_hash.to_owned() })
    }
}

/// A NATS publisher's slot in a service; given back when dropped.
#[derive(Debug)]
pub struct ClientSlot {
    budget: std::sync::Arc<ClientBudget>,
    token_hash: String,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut held = self.budget.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = held.get_mut(&self.token_hash) {
            *n -= 1;
            if *n == 0 {
                held.remove(&self.token_hash);
            }
        }
    }
}

#[cfg(test)]
mod client_budget_tests {
    use super::*;

    #[test]
    fn r_arch_15_a_token_gets_its_share_and_the_crowd_the_total() {
        let budget = std::sync::Arc::new(ClientBudget::new(3, 2));
        let a1 = budget.enter("a").expect("first");
        let _a2 = budget.enter("a").expect("second");
        assert!(budget.enter("a").is_none(), "a third for one token");
        let _b1 = budget.enter("b").expect("another token");
        assert!(budget.enter("c").is_none(), "the total is spent");
        drop(a1);
        assert!(budget.enter("c").is_some(), "a slot given back is taken again");
    }
}
