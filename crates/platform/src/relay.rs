//! The outbox relay (R-ARCH-6): publishes a service's committed events to JetStream in
//! global-position order with `Nats-Msg-Id` = event id, and advances its checkpoint only
//! after JetStream acknowledged. It resumes from the checkpoint after a crash; JetStream
//! deduplicates repeats inside its window and consumers dedup by event id beyond it.

use std::time::Duration;

use async_nats::jetstream;
use sqlx::Row;

use crate::db::Db;
use crate::feed::{encode_notification, ensure_stream};

async fn checkpoint(db: &Db, name: &str) -> anyhow::Result<i64> {
    let row = sqlx::query("SELECT position FROM relay_checkpoints WHERE name = $1").bind(name).fetch_optional(db.any()).await?;
    Ok(row.map(|r| r.try_get::<i64, _>(0)).transpose()?.unwrap_or(0))
}

/// Stores the checkpoint without waiting for the WAL flush (PostgreSQL
/// `synchronous_commit = off`): a checkpoint lost in a database crash only means events are
/// published again, which JetStream and consumers drop by event id. This saves one fsync
/// per relayed batch on the command path's disk.
async fn save(db: &Db, name: &str, position: i64) -> anyhow::Result<()> {
    let mut tx = db.any().begin().await?;
    if db.kind() == crate::db::DbKind::Postgres {
        sqlx::query("SET LOCAL synchronous_commit = off").execute(&mut *tx).await?;
    }
    sqlx::query("INSERT INTO relay_checkpoints (name, position) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET position = excluded.position")
        .bind(name)
        .bind(position)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// Publishes one batch; returns how many events went out.
pub async fn relay_once(db: &Db, js: &jetstream::Context, service: &str, aggregate_types: &[&str]) -> anyhow::Result<usize> {
    let name = format!("relay-{service}");
    let from = checkpoint(db, &name).await?;
    let events = db.events_after(from, aggregate_types, 256).await?;
    let subject = atasira_contracts::subjects::events(service);
    for event in &events {
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", event.event_id.as_str());
        let ack =
            js.publish_with_headers(subject.clone(), headers, encode_notification(event).into()).await.map_err(|e| anyhow::anyhow!("publish failed: {e}"))?;
        ack.await.map_err(|e| anyhow::anyhow!("JetStream did not acknowledge: {e}"))?;
    }
    if let Some(last) = events.last() {
        save(db, &name, last.position).await?;
    }
    Ok(events.len())
}

/// Runs the relay until shutdown; failures (NATS down) are retried with a pause and no
/// event is skipped.
pub async fn run(
    db: Db,
    js: jetstream::Context,
    service: &'static str,
    aggregate_types: &'static [&'static str],
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    let mut stream_ready = false;
    loop {
        if *shutdown.borrow() {
            return;
        }
        let result = async {
            if !stream_ready {
                ensure_stream(&js).await?;
                stream_ready = true;
            }
            relay_once(&db, &js, service, aggregate_types).await
        }
        .await;
        let pause = match result {
            Ok(0) => Duration::from_millis(10),
            Ok(_) => Duration::ZERO,
            Err(e) => {
                tracing::warn!(service, error = %e, "relay failed; retrying");
                Duration::from_millis(500)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = shutdown.changed() => return,
        }
    }
}
