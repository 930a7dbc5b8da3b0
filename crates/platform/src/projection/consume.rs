//! The loop every consumer runs: feed after the cursor, handle a batch, record it; transient
//! failures wait and read again, an event that cannot be applied stalls the consumer.

use std::time::Duration;

use anyhow::Context as _;

use super::checkpoint::{cursor, record};
use crate::feed::{FeedSource, Pause};
use crate::store::{Db, StoredEvent};

/// [`consume_batches`] for consumers whose effects are commands, not rows (activation,
/// provisioning): `handle` acts on each event `acts_on` selects and marks it processed
/// itself; the events between are marked processed together, one transaction for each run
/// of them, so a feed of events that need nothing costs a write per batch, not per event.
pub async fn consume_selected<F, Fut>(
    db: Db,
    feeds: FeedSource,
    name: &'static str,
    aggregate_types: &'static [&'static str],
    shutdown: tokio::sync::watch::Receiver<bool>,
    acts_on: fn(&StoredEvent) -> bool,
    handle: F,
) where
    F: Fn(StoredEvent) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let marker = db.clone();
    consume_batches(db, feeds, name, aggregate_types, shutdown, |batch: Vec<StoredEvent>| {
        let (handle, db) = (&handle, &marker);
        async move {
            let mut passed = Vec::new();
            for event in batch {
                if !acts_on(&event) {
                    passed.push(event);
                    continue;
                }
                record(db, name, &std::mem::take(&mut passed), None).await?;
                let id = event.event_id.clone();
                handle(event).await.with_context(|| format!("{name} cannot handle event {id}"))?;
            }
            record(db, name, &passed, None).await?;
            Ok(())
        }
    })
    .await
}

/// The pause of a consumer stopped at an event it cannot apply: 500 ms, doubled up to 30 s
/// while the event keeps failing.
const STALLED: Pause = Pause::new(Duration::from_millis(500), Duration::from_secs(30));

/// The pause of a consumer waiting for the database: 100 ms, doubled up to 1 s, so the
/// consumer is ready again within about a second of the database's return.
const WAITING: Pause = Pause::new(Duration::from_millis(100), Duration::from_secs(1));

/// How long a consumer that is told to stop lets the batch in flight finish.
const FINISH_ON_SHUTDOWN: Duration = Duration::from_secs(5);

/// The durable-consumer loop every consumer shares (R-ARCH-6): open feed `name` after its
/// stored checkpoint, hand each batch to `handle`, which commits its effect with the
/// checkpoint; on failure log it, report the consumer stalled (`Db::stalled`), and read
/// again from the checkpoint after a pause: a consumer that cannot get past an event stops
/// alone, visibly, and the process goes on.
/// A projection applies a batch in one transaction.
/// Shutdown lets a batch in flight finish for up to `FINISH_ON_SHUTDOWN`, then cuts it
/// short; so may losing the lock. Nothing is checkpointed then, so the event is delivered
/// again and the handler must be idempotent.
pub async fn consume_batches<F, Fut>(
    db: Db,
    feeds: FeedSource,
    name: &'static str,
    aggregate_types: &'static [&'static str],
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    handle: F,
) where
    F: Fn(Vec<StoredEvent>) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let (mut stalled, mut waiting) = (STALLED, WAITING);
    loop {
        // One process runs this consumer; other replicas stand by (`exclusive.rs`).
        let Some(mut lease) = crate::exclusive::acquire(&db, name, &mut shutdown).await else { return };
        let lost = lease.lost();
        tokio::pin!(lost);
        let result: anyhow::Result<bool> = async {
            let from = cursor(&db, name).await?;
            db.consumer_opened(name, from).await?;
            crate::metrics::global().reader_at(name, "consumer", aggregate_types, from);
            let mut feed = feeds.open(&db, name, aggregate_types, from).await?;
            // Reading again: a wait for the database is over.
            if db.reconnected(name) {
                tracing::info!(consumer = name, "the database answers again; consumer moving again");
                stalled.reset();
            }
            loop {
                if *shutdown.borrow() {
                    return Ok(true);
                }
                let batch = tokio::select! {
                    b = feed.next() => b?,
                    _ = shutdown.changed() => return Ok(true),
                    () = &mut lost => return Ok(false),
                };
                if batch.is_empty() {
                    continue;
                }
                let events: Vec<StoredEvent> = batch.into_iter().map(|d| d.event).collect();
                let span = batch_span(name, &events);
                let work = tracing::Instrument::instrument(handle(events), span);
                tokio::pin!(work);
                tokio::select! {
                    r = &mut work => r?,
                    // The batch in flight is let finish, for a while: dropped, its writes
                    // could still commit (a queued SQLite write, a COMMIT already sent)
                    // after whatever the caller does once the consumer has stopped, such
                    // as the audit service's closing checkpoint.
                    _ = shutdown.changed() => {
                        if tokio::time::timeout(FINISH_ON_SHUTDOWN, &mut work).await.is_err() {
                            tracing::warn!(consumer = name, "stopped with a batch unfinished; it is applied again on the next start");
                        }
                        return Ok(true);
                    }
                    // Cut short, nothing is checkpointed: whoever holds the lock next
                    // applies the batch again (handlers are idempotent).
                    () = &mut lost => return Ok(false),
                }
                if db.recovered(name) {
                    tracing::info!(consumer = name, "consumer moving again");
                    stalled.reset();
                }
                waiting.reset();
            }
        }
        .await;
        match result {
            Ok(true) => return,
            Ok(false) => tracing::warn!(consumer = name, "lost the lock that makes this process the consumer's only runner; competing for it again"),
            Err(e) => {
                crate::metrics::global().consumer_retries.get_or_create(&crate::metrics::Named { name: name.to_owned() }).inc();
                // The database away (restarting, a connection lost) passes by itself: the
                // consumer says it waits and asks again soon, so it is ready again within
                // about a second of the database's return. Only an event it cannot apply
                // stalls it, with a growing pause.
                let wait = if crate::failure::is_transient(&e) {
                    tracing::warn!(consumer = name, error = format!("{e:#}"), "consumer waiting for the database; retrying from its checkpoint");
                    db.waiting(name, &format!("waiting for the database: {e:#}"));
                    waiting.take()
                } else {
                    tracing::error!(consumer = name, error = format!("{e:#}"), "consumer stopped at an event it cannot handle; retrying from its checkpoint");
                    db.stalled(name, &format!("{e:#}"));
                    stalled.take()
                };
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
    }
}

/// The span of a batch (R-OPS-1): a child of the command that appended its first event,
/// linked to the commands of the others, so an event's consumers join its API call's trace.
fn batch_span(name: &'static str, events: &[StoredEvent]) -> tracing::Span {
    let span = tracing::info_span!("consume", consumer = name, events = events.len());
    if let Some((first, rest)) = events.split_first() {
        crate::trace::follow_event(&span, &first.metadata);
        for e in rest.iter().filter(|e| e.metadata.get(crate::trace::TRACEPARENT) != first.metadata.get(crate::trace::TRACEPARENT)) {
            crate::trace::link_event(&span, &e.metadata);
        }
    }
    span
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use atasira_domain::aggregates::draft::Draft;

    use crate::store::testing;

    #[tokio::test]
    async fn r_arch_6_a_consumer_told_to_stop_lets_its_batch_in_flight_finish() {
        // given a consumer whose handler is busy with a batch (one submitted draft)
        let store = testing::TempDb::new().await;
        let db = store.db.clone();
        db.cqrs::<Draft>().execute_new("d1", testing::submit("d1"), std::collections::HashMap::new()).await.expect("submit");
        let (started, finished) = (Arc::new(tokio::sync::Notify::new()), Arc::new(AtomicBool::new(false)));
        let (tx, rx) = tokio::sync::watch::channel(false);
        let consumer = tokio::spawn({
            let (db, started, finished) = (db.clone(), started.clone(), finished.clone());
            consume_batches(db, FeedSource::default(), "slow", &["draft"], rx, move |_| {
                let (started, finished) = (started.clone(), finished.clone());
                async move {
                    started.notify_one();
                    tokio::time::sleep(Duration::from_millis(300)).await;
                    finished.store(true, Ordering::SeqCst);
                    Ok(())
                }
            })
        });
        started.notified().await;
        // when it is told to stop; then it returns only after the batch finished
        tx.send(true).expect("shutdown");
        consumer.await.expect("joined");
        assert!(finished.load(Ordering::SeqCst), "the consumer returned while its batch was still being written");
    }
}
