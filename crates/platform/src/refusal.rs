//! A typed refusal on its way to the wire: what every service answers instead of a reply.

use atasira_contracts::{Refused, Reply, reply_error};
use atasira_domain::{ErrorCode, FieldError, Refusing};

/// The reason word of a principal assertion admitted before.
pub(crate) const REPLAYED: &str = "replayed";

/// A typed refusal on its way to the wire (the spec's code, a message, the keys at fault).
#[derive(Debug)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
    pub field_errors: Vec<FieldError>,
    /// The events the refusal recorded (a security violation): their position and ids
    /// travel in the reply, so the caller's next read sees them.
    pub position: i64,
    pub event_ids: Vec<String>,
}

impl Refusal {
    /// Another service's refusal, passed on as it came.
    pub fn passed_on(r: Refused) -> Self {
        Self { code: r.code, message: r.message, field_errors: r.field_errors, position: r.position, event_ids: r.event_ids }
    }

    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), field_errors: Vec::new(), position: 0, event_ids: Vec::new() }
    }

    /// This refusal recorded the event `event_id` at `position` (R-AUDIT-5).
    pub fn recorded(mut self, (event_id, position): (String, i64)) -> Self {
        self.event_ids.push(event_id);
        self.position = self.position.max(position);
        self
    }

    /// A principal assertion some process admitted before.
    pub fn replayed() -> Self {
        Self::new(ErrorCode::Unauthenticated, format!("invalid principal assertion: {REPLAYED}"))
    }

    /// A store failure: `service_unavailable` when it is `transient` (the database away; the
    /// caller retries), else [`Refusal::internal`]. Logged with its cause either way.
    pub fn store(transient: bool, e: impl std::fmt::Display) -> Self {
        if !transient {
            return Self::internal(e);
        }
        tracing::warn!(error = %e, "the database did not answer");
        Self::new(ErrorCode::ServiceUnavailable, "the store is not answering right now; retry in a moment")
    }

    /// A failure of ours: logged with its cause, answered without it.
    pub fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "service failure");
        Self::new(ErrorCode::Internal, "internal failure; retry")
    }

    pub fn into_reply(self) -> Reply {
        Reply { position: self.position, event_ids: self.event_ids, ..reply_error(self.code, self.message, &self.field_errors) }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

/// Every coded domain or wire error converts with `?`.
impl<E: Refusing> From<E> for Refusal {
    fn from(e: E) -> Self {
        Self { code: e.error_code(), message: e.to_string(), field_errors: e.field_errors(), position: 0, event_ids: Vec::new() }
    }
}
