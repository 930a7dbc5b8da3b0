//! Rebuilding a projection from the whole store (R-ARCH-5), a page of events at a time.

use std::time::Duration;

use anyhow::Context as _;

use super::checkpoint::advance_to;
use super::{DecodedPage, Projection, prepare};
use crate::store::{Cursor, Db, DbKind, StoredEvent, TextEvent};

/// Events a rebuild reads and applies at a time, one transaction each.
pub const REBUILD_PAGE: i64 = 2500;

/// Drops a projection's rows and rebuilds it from the whole event store (R-ARCH-5).
pub async fn rebuild(db: &Db, projection: &dyn Projection) -> anyhow::Result<u64> {
    rebuild_in_pages(db, projection, REBUILD_PAGE).await
}

/// Rebuilds every one of `projections` at once (R-ARCH-5): they share no table, so one's
/// page is read and decoded while another's is written (in SQLite their writes still take
/// turns, [`Db::write_turn`]). `done` is told of each as it ends, with the events it
/// applied; the events each applied, in the order of `projections`. The first failure
/// ends them all.
pub async fn rebuild_all(db: &Db, projections: &[&dyn Projection], done: impl Fn(&str, u64)) -> anyhow::Result<Vec<u64>> {
    let each = projections.iter().map(|projection| async {
        let applied = rebuild(db, *projection).await?;
        done(projection.name(), applied);
        anyhow::Ok(applied)
    });
    futures::future::try_join_all(each).await
}

/// [`rebuild`], `page` events a transaction: the projection applies each page in memory
/// ([`Projection::apply_page`]) and the checkpoint moves to its last event. The processed
/// set stays empty: after a rebuild the cursor alone says what was applied (every event
/// of the projection's types up to it, see [`processed`]).
pub async fn rebuild_in_pages(db: &Db, projection: &dyn Projection, page: i64) -> anyhow::Result<u64> {
    let name = projection.name();
    prepare(db, projection).await?;
    let turn = db.write_turn().await;
    let mut tx = db.any().begin().await?;
    for table in projection.table_names() {
        sqlx::query(&format!("DELETE FROM {table}")).execute(&mut *tx).await?;
    }
    sqlx::query("DELETE FROM projection_processed WHERE name = $1").bind(name).execute(&mut *tx).await?;
    sqlx::query("DELETE FROM projection_checkpoints WHERE name = $1").bind(name).execute(&mut *tx).await?;
    tx.commit().await?;
    drop(turn);
    // The next page is read (through the typed pool's connection) and decoded (on another
    // thread) while this one is applied.
    let (types, skipped, decode) = (projection.aggregate_types(), projection.ignored_event_types(), projection.page_decoder());
    let read = |at: Cursor| {
        let db = db.clone();
        tokio::spawn(async move {
            let mut batch = db.read_text(at, types, skipped, page.max(1)).await?;
            // The events of skipped types only move the cursor past them.
            let end = batch.events.last().map(TextEvent::cursor);
            batch.events.retain(|e| !skipped.contains(&e.event_type.as_str()));
            let decoded = tokio::task::spawn_blocking(move || {
                let decoded = decode(&batch.events).with_context(|| format!("{name} cannot decode {}", span(&batch.events)));
                (batch, decoded)
            });
            let (batch, decoded) = decoded.await.context("a rebuild's decoding stopped")?;
            anyhow::Ok((batch, end, decoded?))
        })
    };
    let (mut at, mut next, mut applied) = (Cursor::START, read(Cursor::START), 0);
    loop {
        let (batch, end, decoded) = next.await.context("a rebuild's read of the store stopped")??;
        let Some(end) = end else {
            if batch.held_back {
                tokio::time::sleep(Duration::from_millis(5)).await;
                next = read(at);
                continue;
            }
            break;
        };
        at = end;
        next = read(at);
        let result = apply_page(db, projection, &batch.events, decoded, at).await;
        if result.is_err() {
            next.abort();
        }
        result?;
        applied += batch.events.len() as u64;
    }
    Ok(applied)
}

/// One page of a rebuild in one transaction: the projection's rows, then its checkpoint.
async fn apply_page(db: &Db, projection: &dyn Projection, events: &[TextEvent], decoded: DecodedPage, at: Cursor) -> anyhow::Result<()> {
    let name = projection.name();
    let turn = db.write_turn().await;
    let mut tx = db.begin_consumer().await?;
    if db.kind() == DbKind::Postgres {
        // The view's tables fill up during a rebuild: a plan PostgreSQL cached for a
        // statement while they were empty (a sequential scan) would stay for the rest.
        sqlx::query("SET LOCAL plan_cache_mode = force_custom_plan").execute(&mut *tx).await?;
    }
    projection.apply_page(&mut tx, events, decoded).await.with_context(|| format!("{name} cannot apply {}", span(events)))?;
    advance_to(&mut tx, name, at).await?;
    tx.commit().await?;
    drop(turn);
    db.progressed_to(name, at, std::iter::empty());
    Ok(())
}

/// "the events from <first> to <last>", for errors.
fn span(events: &[TextEvent]) -> String {
    let id = |e: &TextEvent| StoredEvent::event_id_of(&e.aggregate_type, &e.aggregate_id, e.sequence);
    format!("the events from {} to {}", events.first().map(id).unwrap_or_default(), events.last().map(id).unwrap_or_default())
}
