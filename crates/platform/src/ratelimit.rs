//! Request rates per caller (R-ARCH-15): a token bucket per key (`governor`). The gateway
//! keys it by user, for REST and MCP tool calls alike (429 `rate_limited` with
//! `Retry-After`); a service keys it by the token of a NATS publisher.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock as _, DefaultClock};
use governor::state::keyed::HashMapStateStore;
use governor::{Quota, RateLimiter};

/// A rate: `per_second` requests a second on average, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rate {
    pub per_second: NonZeroU32,
    pub burst: NonZeroU32,
}

/// One limiter, a bucket per key; `None` inside: no limit.
pub struct Limits {
    limiter: Option<RateLimiter<String, HashMapStateStore<String>, DefaultClock>>,
    clock: DefaultClock,
}

impl std::fmt::Debug for Limits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limits").field("on", &self.limiter.is_some()).finish()
    }
}

impl Limits {
    pub fn new(rate: Option<Rate>) -> Self {
        let limiter = rate.map(|r| RateLimiter::hashmap(Quota::per_second(r.per_second).allow_burst(r.burst)));
        Self { limiter, clock: DefaultClock::default() }
    }

    /// `Ok` when `key` may send one more request now; else how long until it may.
    pub fn check(&self, key: &str) -> Result<(), Duration> {
        let Some(limiter) = &self.limiter else { return Ok(()) };
        limiter.check_key(&key.to_owned()).map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// Forgets users whose buckets are full again (called now and then, so the map holds
    /// only recent callers).
    pub fn forget_idle(&self) {
        if let Some(limiter) = &self.limiter {
            limiter.retain_recent();
        }
    }
}

/// Whole seconds to put in `Retry-After` (rounded up, at least 1).
pub fn retry_after_seconds(wait: Duration) -> u64 {
    (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(per_second: u32, burst: u32) -> Option<Rate> {
        Some(Rate { per_second: NonZeroU32::new(per_second).expect("rate"), burst: NonZeroU32::new(burst).expect("burst") })
    }

    #[test]
    fn r_arch_15_a_user_gets_its_burst_then_waits_and_others_are_not_held() {
        let limits = Limits::new(rate(1, 3));
        for _ in 0..3 {
            assert_eq!(limits.check("mallory"), Ok(()));
        }
        let wait = limits.check("mallory").expect_err("over the burst");
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(1), "{wait:?}");
        assert_eq!(limits.check("alice"), Ok(()), "another user has a bucket of its own");
        assert_eq!(Limits::new(None).check("mallory"), Ok(()), "no rate: no limit");
    }

    #[test]
    fn retry_after_is_whole_seconds_and_never_zero() {
        assert_eq!(retry_after_seconds(Duration::from_millis(200)), 1);
        assert_eq!(retry_after_seconds(Duration::from_millis(1200)), 2);
        assert_eq!(retry_after_seconds(Duration::from_secs(3)), 3);
        assert_eq!(retry_after_seconds(Duration::ZERO), 1);
    }
}
