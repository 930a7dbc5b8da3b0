//! IO glue shared by every service: the one event store (SQLite embedded, PostgreSQL in
//! cluster mode), the bus (NATS or in-process, same subjects and bytes), event feeds with
//! one durable-consumer abstraction, the outbox relay, the projection runner, and PATs.
//!
//! Architecture Invariant: services see only the traits and types of this crate; whether
//! they run embedded or clustered is decided once, in the binary, when it builds a
//! [`Runtime`].

pub mod auth;
pub mod bus;
pub mod command;
pub mod db;
pub mod feed;
pub mod projection;
pub mod relay;
pub mod service;

use std::sync::Arc;

use atasira_domain::assertion::AssertionKeys;

/// Crash-test hook: when `ATASIRA_FAILPOINT` names this point, the process is SIGKILLed here, so tests can prove that nothing committed before it is lost.
pub fn failpoint(name: &str) {
    if std::env::var("ATASIRA_FAILPOINT").is_ok_and(|v| v.split(',').any(|p| p == name)) {
        eprintln!("failpoint {name}: killing this process");
        // A real SIGKILL (no unwinding, no flushing), like `kill -9` from outside.
        let _ = std::process::Command::new("kill").arg("-KILL").arg(std::process::id().to_string()).status();
        std::process::abort();
    }
}

/// Test hook for races: when `ATASIRA_FAILPOINT_DELAY` holds `name:millis` (comma
/// separated), this point waits that long, so a test can force an interleaving.
pub async fn failpoint_delay(name: &str) {
    let Ok(spec) = std::env::var("ATASIRA_FAILPOINT_DELAY") else { return };
    for item in spec.split(',') {
        if let Some((point, ms)) = item.split_once(':')
            && point == name
            && let Ok(ms) = ms.parse::<u64>()
        {
            tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
        }
    }
}

/// Everything a service needs from the outside world.
#[derive(Clone)]
pub struct Runtime {
    pub db: db::Db,
    pub bus: Arc<dyn bus::Bus>,
    pub feeds: feed::FeedSource,
    /// Verifies (and, in the gateway, signs) principal assertions (R-ARCH-3).
    pub assertion_keys: Arc<AssertionKeys>,
}

impl Runtime {
    /// Tells embedded feeds that new events are in the store (no-op in cluster mode,
    /// where the relay publishes them).
    pub fn notify_committed(&self) {
        if let feed::FeedSource::Store { wake } = &self.feeds {
            wake.notify_waiters();
        }
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("db", &self.db.kind()).finish_non_exhaustive()
    }
}
