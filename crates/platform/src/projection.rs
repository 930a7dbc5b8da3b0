//! Projections: read models built from events. Each applies an event and stores its
//! checkpoint in the same transaction as its rows, and skips an event id it has already
//! applied (R-ARCH-5), so at-least-once delivery is exactly-once in effect.

use std::sync::Arc;
use std::time::Duration;

use sqlx::{Any, Row, Transaction};

use crate::db::{Db, StoredEvent};
use crate::feed::FeedSource;

#[async_trait::async_trait]
pub trait Projection: Send + Sync + 'static {
    /// Unique name: checkpoint key and durable consumer name.
    fn name(&self) -> &'static str;
    /// The aggregate types whose events it reads.
    fn aggregate_types(&self) -> &'static [&'static str];
    /// Idempotent DDL for its tables.
    fn tables(&self) -> &'static [&'static str];
    /// The tables to empty on rebuild.
    fn table_names(&self) -> &'static [&'static str];
    /// Applies one event inside the runner's transaction.
    async fn apply(&self, tx: &mut Transaction<'static, Any>, event: &StoredEvent) -> anyhow::Result<()>;
}

/// The stored checkpoint of a projection (0 before the first event).
pub async fn checkpoint(db: &Db, name: &str) -> anyhow::Result<i64> {
    let row = sqlx::query("SELECT position FROM projection_checkpoints WHERE name = $1").bind(name).fetch_optional(db.any()).await?;
    Ok(match row {
        Some(r) => r.try_get::<i64, _>(0)?,
        None => 0,
    })
}

/// Applies one event unless it was applied before; returns whether it was new.
pub async fn apply_one(db: &Db, projection: &dyn Projection, event: &StoredEvent) -> anyhow::Result<bool> {
    record(db, projection.name(), event, Some(projection)).await
}

/// Marks an event as handled by consumer `name` (for waits by event id and for resuming)
/// without rows of its own: consumers whose effects are commands, not rows.
pub async fn mark_processed(db: &Db, name: &str, event: &StoredEvent) -> anyhow::Result<bool> {
    record(db, name, event, None).await
}

/// One transaction: the processed-set insert (dedup by event id), the rows (if new), the
/// checkpoint.
async fn record(db: &Db, name: &str, event: &StoredEvent, projection: Option<&dyn Projection>) -> anyhow::Result<bool> {
    let mut tx = db.any().begin().await?;
    let inserted = sqlx::query("INSERT INTO projection_processed (name, event_id) VALUES ($1, $2) ON CONFLICT DO NOTHING")
        .bind(name)
        .bind(&event.event_id)
        .execute(&mut *tx)
        .await?
        .rows_affected();
    if let Some(p) = projection.filter(|_| inserted == 1) {
        p.apply(&mut tx, event).await?;
    }
    sqlx::query(
        "INSERT INTO projection_checkpoints (name, position) VALUES ($1, $2)
         ON CONFLICT (name) DO UPDATE SET position = CASE WHEN projection_checkpoints.position > excluded.position THEN projection_checkpoints.position ELSE excluded.position END",
    )
    .bind(name)
    .bind(event.position)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(inserted == 1)
}

/// The durable-consumer loop every consumer shares (R-ARCH-6): open feed `name` after its
/// stored checkpoint, hand each event to `handle`, ack after it returned (its effects
/// committed, checkpoint included); on failure reopen from the checkpoint after a pause.
/// Shutdown may cut a handler short: nothing is checkpointed then, so the event is
/// delivered again and the handler must be idempotent.
pub async fn consume<F, Fut>(
    db: Db,
    feeds: FeedSource,
    name: &'static str,
    aggregate_types: &'static [&'static str],
    mut shutdown: tokio::sync::watch::Receiver<bool>,
    handle: F,
) where
    F: Fn(StoredEvent) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    loop {
        let result: anyhow::Result<()> = async {
            let from = checkpoint(&db, name).await?;
            let mut feed = feeds.open(&db, name, aggregate_types, from).await?;
            loop {
                if *shutdown.borrow() {
                    return Ok(());
                }
                let batch = tokio::select! {
                    b = feed.next() => b?,
                    _ = shutdown.changed() => return Ok(()),
                };
                for delivery in batch {
                    tokio::select! {
                        r = handle(delivery.event.clone()) => r?,
                        _ = shutdown.changed() => return Ok(()),
                    }
                    delivery.ack().await?;
                }
            }
        }
        .await;
        match result {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(consumer = name, error = %e, "consumer failed; retrying from its checkpoint");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = shutdown.changed() => return,
                }
            }
        }
    }
}

/// Creates the projection's tables.
pub async fn prepare(db: &Db, projection: &dyn Projection) -> anyhow::Result<()> {
    db.ensure_tables(projection.tables()).await
}

/// Runs a projection until `shutdown` resolves.
pub async fn run(db: Db, feeds: FeedSource, projection: Arc<dyn Projection>, shutdown: tokio::sync::watch::Receiver<bool>) {
    let (name, types) = (projection.name(), projection.aggregate_types());
    let apply_db = db.clone();
    consume(db, feeds, name, types, shutdown, move |event| {
        let (db, projection) = (apply_db.clone(), projection.clone());
        async move { apply_one(&db, projection.as_ref(), &event).await.map(|_| ()) }
    })
    .await
}

/// Drops a projection's rows and rebuilds it from the whole event store (R-ARCH-5).
pub async fn rebuild(db: &Db, projection: &dyn Projection) -> anyhow::Result<u64> {
    prepare(db, projection).await?;
    let mut tx = db.any().begin().await?;
    for table in projection.table_names() {
        sqlx::query(&format!("DELETE FROM {table}")).execute(&mut *tx).await?;
    }
    sqlx::query("DELETE FROM projection_processed WHERE name = $1").bind(projection.name()).execute(&mut *tx).await?;
    sqlx::query("DELETE FROM projection_checkpoints WHERE name = $1").bind(projection.name()).execute(&mut *tx).await?;
    tx.commit().await?;
    let mut position = 0;
    let mut applied = 0;
    loop {
        let batch = db.events_after(position, projection.aggregate_types(), 1000).await?;
        let Some(last) = batch.last() else { break };
        position = last.position;
        for event in &batch {
            if apply_one(db, projection, event).await? {
                applied += 1;
            }
        }
    }
    Ok(applied)
}

/// R-BOX-9: waits until every projection in `names` has applied `position`, at most
/// `timeout`; returns the names still behind.
pub async fn wait_for(db: &Db, names: &[&'static str], position: i64, timeout: Duration) -> anyhow::Result<Vec<String>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut lagging = Vec::new();
        for name in names {
            if checkpoint(db, name).await? < position {
                lagging.push((*name).to_owned());
            }
        }
        if lagging.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(lagging);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// R-BOX-9, exact form: waits until every projection that reads an event's aggregate type
/// has applied that event (by id), at most `timeout`; returns the names still behind.
pub async fn wait_for_events(
    db: &Db,
    projections: &[(&'static str, &'static [&'static str])],
    event_ids: &[String],
    timeout: Duration,
) -> anyhow::Result<Vec<String>> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let mut lagging = Vec::new();
        for (name, types) in projections {
            for id in event_ids {
                let aggregate_type = id.split('/').next().unwrap_or_default();
                if !types.contains(&aggregate_type) {
                    continue;
                }
                let done = sqlx::query("SELECT 1 FROM projection_processed WHERE name = $1 AND event_id = $2")
                    .bind(*name)
                    .bind(id)
                    .fetch_optional(db.any())
                    .await?
                    .is_some();
                if !done {
                    lagging.push((*name).to_owned());
                    break;
                }
            }
        }
        if lagging.is_empty() || tokio::time::Instant::now() >= deadline {
            return Ok(lagging);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Answers a `WaitForPosition` for a service's projections (by event ids when given,
/// by position otherwise).
pub async fn answer_wait(
    db: &Db,
    projections: &[(&'static str, &'static [&'static str])],
    request: &atasira_contracts::v1::WaitForPosition,
) -> anyhow::Result<Vec<String>> {
    let timeout = Duration::from_millis(u64::from(request.timeout_ms.min(30_000)));
    if request.event_ids.is_empty() {
        let names: Vec<&'static str> = projections.iter().map(|(n, _)| *n).collect();
        wait_for(db, &names, request.position, timeout).await
    } else {
        wait_for_events(db, projections, &request.event_ids, timeout).await
    }
}
