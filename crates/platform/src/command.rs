//! The one way a service runs a command: a refusal of the aggregate is answered with its
//! own code; an optimistic-concurrency conflict (someone else appended to the same stream
//! first) is retried on fresh state, then answered `conflict`, or `busy` for a contended
//! stream; a store failure is ours (`internal`).

use std::collections::HashMap;
use std::time::Duration;

use atasira_domain::{ErrorCode, Refusing};
use cqrs_es::{Aggregate, AggregateError};

use crate::db::{Committed, Cqrs};
use crate::service::Refusal;

/// How often, and how patiently, a conflicting command is retried.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Attempts in all, the first included.
    pub attempts: u32,
    /// The wait before the second attempt; it doubles up to `max_backoff`, plus jitter.
    pub backoff: Duration,
    pub max_backoff: Duration,
    /// The answer when every attempt conflicted.
    pub exhausted: ErrorCode,
}

impl Retry {
    /// A stream few writers share (a draft, a Box): one retry on fresh state, then 409.
    pub const ONCE: Retry = Retry { attempts: 2, backoff: Duration::ZERO, max_backoff: Duration::ZERO, exhausted: ErrorCode::Conflict };
    /// A stream every approval writes (the box_type namespace): patient, then 503 busy.
    pub const CONTENDED: Retry = Retry { attempts: 200, backoff: Duration::from_millis(2), max_backoff: Duration::from_millis(50), exhausted: ErrorCode::Busy };
}

/// Runs `command` on a stream this process has just named (a fresh UUID, see
/// [`Cqrs::execute_new`]); what it committed. A conflict (the stream existed after all) is
/// answered `conflict`.
pub async fn execute_new<A>(cqrs: &Cqrs<A>, aggregate_id: &str, command: A::Command, metadata: HashMap<String, String>) -> Result<Committed, Refusal>
where
    A: Aggregate<Services = ()>,
    A::Error: Refusing,
{
    match cqrs.execute_new(aggregate_id, command, metadata).await {
        Ok(committed) => Ok(committed),
        Err(AggregateError::UserError(e)) => Err(e.into()),
        Err(AggregateError::AggregateConflict) => Err(Refusal::new(ErrorCode::Conflict, "a concurrent change to the same thing was recorded first; retry")),
        Err(_) if crate::admission::replayed() => Err(Refusal::replayed()),
        Err(other) => Err(store_failure::<A>(aggregate_id, other)),
    }
}

/// Runs `command` on `aggregate_id`, retrying conflicts as `retry` says; what it
/// committed (see [`Committed`]).
pub async fn execute<A>(cqrs: &Cqrs<A>, aggregate_id: &str, command: A::Command, metadata: HashMap<String, String>, retry: Retry) -> Result<Committed, Refusal>
where
    A: Aggregate<Services = ()>,
    A::Command: Clone,
    A::Error: Refusing,
{
    let mut delay = retry.backoff;
    for attempt in 1..=retry.attempts.max(1) {
        match cqrs.execute(aggregate_id, command.clone(), metadata.clone()).await {
            Ok(committed) => return Ok(committed),
            Err(AggregateError::UserError(e)) => return Err(e.into()),
            Err(AggregateError::AggregateConflict) if attempt < retry.attempts => {
                if !delay.is_zero() {
                    let jitter = Duration::from_micros(u64::from(uuid::Uuid::new_v4().as_fields().1) % 3000);
                    tokio::time::sleep(delay + jitter).await;
                    delay = (delay * 2).min(retry.max_backoff);
                }
            }
            Err(AggregateError::AggregateConflict) => break,
            Err(_) if crate::admission::replayed() => return Err(Refusal::replayed()),
            Err(other) => return Err(store_failure::<A>(aggregate_id, other)),
        }
    }
    Err(match retry.exhausted {
        ErrorCode::Busy => Refusal::new(ErrorCode::Busy, "too many concurrent changes right now; retry in a moment"),
        code => Refusal::new(code, "a concurrent change to the same thing was recorded first; retry"),
    })
}

/// A store failure as the answer (see [`Refusal::store`]).
fn store_failure<A: Aggregate>(aggregate_id: &str, error: AggregateError<A::Error>) -> Refusal {
    let transient = matches!(&error, AggregateError::DatabaseConnectionError(e) if e.downcast_ref::<sqlx::Error>().is_some_and(crate::failure::sqlx_transient));
    Refusal::store(transient, format!("{} {aggregate_id}: {error}", A::TYPE))
}
