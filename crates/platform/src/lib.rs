//! IO glue shared by every service: the one event store (SQLite embedded, PostgreSQL in
//! cluster mode), the bus (NATS or in-process, same subjects and bytes), event feeds with
//! one durable-consumer abstraction, the outbox relay, the projection runner, and PATs.
//!
//! Architecture Invariant: services see only the traits and types of this crate; whether
//! they run embedded or clustered is decided once, in the binary, when it builds a
//! [`Runtime`].

pub mod admission;
pub mod auth;
pub mod bus;
pub mod client;
pub mod cursor;
pub mod exclusive;
pub mod failpoints;
pub mod failure;
pub mod feed;
pub mod guard;
pub mod keys;
pub mod metrics;
pub mod org_policy;
pub mod projection;
pub mod ratelimit;
pub mod refusal;
pub mod relay;
pub mod sentinel;
pub mod service;
pub mod store;
pub mod trace;

use std::sync::Arc;

pub use failpoints::{failpoint, failpoint_delay};

/// Everything a service needs from the outside world.
#[derive(Clone)]
pub struct Runtime {
    pub db: store::Db,
    pub bus: Arc<dyn bus::Bus>,
    pub feeds: feed::FeedSource,
    /// Verifies principal assertions with published public keys, and signs them in the
    /// processes that call others for a principal (R-ARCH-3, R-ARCH-13).
    pub assertion_keys: keys::AssertionKeys,
    /// The process's request limits, replay cache and violation rate limit.
    pub guards: Arc<guard::Guards>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("db", &self.db.kind()).finish_non_exhaustive()
    }
}
