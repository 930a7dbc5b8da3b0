//! What a consumer has done: its cursor, the set of events it processed, and the writes
//! that record both with its rows (R-ARCH-5: an event applied twice changes nothing).

use anyhow::Context as _;
use sqlx::{Any, Row, Transaction};

use super::Projection;
use super::sql::{Arg, bind_all, for_sqlite, rows_per_statement, upsert_cursor};
use crate::store::{Cursor, Db, DbKind, StoredEvent};

/// A statement of [`Projection::blind_write`] and its arguments, in order.
#[derive(Debug)]
pub struct BlindWrite {
    pub statement: String,
    pub args: Vec<Arg>,
}

/// Applies `events` with `projection`'s [`Projection::blind_write`], when it has one, in
/// one round trip with the cursor (PostgreSQL: and the processed set, in one statement of
/// its own transaction, committed asynchronously like every consumer's; SQLite: two
/// statements under the writer's turn, each its own transaction, so a crash between them
/// leaves the cursor behind and the batch is applied again, to no effect). Whether it did.
async fn write_blind(db: &Db, name: &str, events: &[StoredEvent], projection: &dyn Projection) -> anyhow::Result<bool> {
    let Some(last) = events.last() else { return Ok(false) };
    let context = || format!("{name} cannot apply the events up to {}", last.event_id);
    match db.kind() {
        DbKind::Postgres => {
            if events.len() > rows_per_statement(1) {
                return Ok(false);
            }
            let Some(write) = projection.blind_write(events, 4 + events.len()).with_context(context)? else { return Ok(false) };
            let (with, args) = advance_and_mark(name, events);
            let sql = format!("{with} {}", write.statement);
            let args: Vec<Arg> = args.into_iter().chain(write.args).collect();
            bind_all(sqlx::query(&sql), &args).execute(db.any()).await.with_context(context)?;
        }
        DbKind::Sqlite => {
            let Some(write) = projection.blind_write(events, 1).with_context(context)? else { return Ok(false) };
            let k = write.args.len() + 1;
            let sql = format!("{};\n{}", write.statement, upsert_cursor(&format!("VALUES (${k}, ${}, ${})", k + 1, k + 2)));
            let sql = for_sqlite(sql);
            let cursor = [Arg::Text(name.to_owned()), Arg::Int(last.tx_id), Arg::Int(last.position)];
            let args: Vec<Arg> = write.args.into_iter().chain(cursor).collect();
            let turn = db.write_turn().await;
            bind_all(sqlx::query(&sql), &args).execute(db.any()).await.with_context(context)?;
            drop(turn);
        }
    }
    db.progressed_to(name, last.cursor(), events.iter().map(|e| e.event_id.as_str()));
    Ok(true)
}

/// PostgreSQL: the `WITH` of a consumer's write of a batch in one statement (its own
/// transaction, committed asynchronously like every consumer's): consumer `name`'s cursor
/// moved to the last of `events` (never back) and their ids marked processed, with the
/// arguments it binds (`$1` to `$3 + events`). The statement's own write follows it and
/// binds from `$4 + events` on. Empty `events` are the caller's mistake.
pub fn advance_and_mark(name: &str, events: &[StoredEvent]) -> (String, Vec<Arg>) {
    let last = events.last().map_or(Cursor::START, StoredEvent::cursor);
    let marks = (0..events.len()).map(|i| format!("($1, ${})", i + 4)).collect::<Vec<_>>().join(", ");
    let with = format!(
        "WITH advanced AS ({}),
         marked AS (INSERT INTO projection_processed (name, event_id) VALUES {marks} ON CONFLICT DO NOTHING)",
        upsert_cursor(&format!("SELECT $1, $2, $3 FROM {}", crate::store::ASYNC_COMMIT)),
    );
    let args =
        [Arg::Text(name.to_owned()), Arg::Int(last.tx_id), Arg::Int(last.position)].into_iter().chain(events.iter().map(|e| Arg::Text(e.event_id.clone())));
    (with, args.collect())
}

/// The stored checkpoint's position (0 before the first event). Positions are commit
/// order only in SQLite; compare [`cursor`]s to know what a consumer has read.
pub async fn checkpoint(db: &Db, name: &str) -> anyhow::Result<i64> {
    Ok(cursor(db, name).await?.position)
}

/// The stored cursor of consumer `name` ([`Cursor::START`] before the first event).
pub async fn cursor(db: &Db, name: &str) -> anyhow::Result<Cursor> {
    let row = sqlx::query("SELECT tx_id, position FROM projection_checkpoints WHERE name = $1").bind(name).fetch_optional(db.any()).await?;
    Ok(match row {
        Some(r) => Cursor { tx_id: r.try_get(0)?, position: r.try_get(1)? },
        None => Cursor::START,
    })
}

/// Moves consumer `name`'s checkpoint forward to `cursor` (never back).
pub(super) async fn advance_to(tx: &mut Transaction<'static, Any>, name: &str, cursor: Cursor) -> anyhow::Result<()> {
    sqlx::query(&upsert_cursor("VALUES ($1, $2, $3)")).bind(name).bind(cursor.tx_id).bind(cursor.position).execute(&mut **tx).await?;
    Ok(())
}

/// Applies one event unless it was applied before (see [`processed`]); returns whether it
/// was new.
pub async fn apply_one(db: &Db, projection: &dyn Projection, event: &StoredEvent) -> anyhow::Result<bool> {
    if event.cursor() <= cursor(db, projection.name()).await? {
        return Ok(false);
    }
    Ok(record(db, projection.name(), std::slice::from_ref(event), Some(projection)).await? == 1)
}

/// Marks an event as handled by consumer `name` (for waits by event id and for resuming)
/// without rows of its own: consumers whose effects are commands, not rows.
pub async fn mark_processed(db: &Db, name: &str, event: &StoredEvent) -> anyhow::Result<bool> {
    Ok(record(db, name, std::slice::from_ref(event), None).await? == 1)
}

/// Marks a batch of a consumer's feed as handled when none of it has an effect: one
/// statement, like [`mark_processed`] for one event; how many were new.
pub async fn mark_batch_processed(db: &Db, name: &str, events: &[StoredEvent]) -> anyhow::Result<usize> {
    record(db, name, events, None).await
}

/// Records `events` as processed by consumer `name` and moves its cursor to the last of
/// them (never back), inside the transaction that makes their effect; which of them were
/// new (not processed before), by event id. PostgreSQL: the processed set and the cursor
/// in one statement; SQLite: the cursor alone ([`sqlite_advance`]).
pub async fn mark_and_advance(tx: &mut Transaction<'static, Any>, name: &str, events: &[StoredEvent]) -> anyhow::Result<std::collections::HashSet<String>> {
    if tx.backend_name() != "PostgreSQL" {
        return sqlite_advance(tx, name, events).await;
    }
    postgres_mark_and_advance(tx, name, events, "VALUES ($1, $2, $3)").await
}

/// SQLite: moves consumer `name`'s cursor to the last of `events` (never back) and
/// answers their ids as new when it moved, none when the cursor was there already. SQLite
/// has one writer, so rowid order is commit order: a consumer reads its types after its
/// cursor and everything up to the cursor was applied. The cursor says all a processed set
/// would, one statement less for every batch.
async fn sqlite_advance(conn: &mut sqlx::AnyConnection, name: &str, events: &[StoredEvent]) -> anyhow::Result<std::collections::HashSet<String>> {
    let Some(last) = events.last() else { return Ok(Default::default()) };
    let moved = sqlx::query(&format!("{} RETURNING position", upsert_cursor("VALUES ($1, $2, $3)")))
        .bind(name)
        .bind(last.tx_id)
        .bind(last.position)
        .fetch_optional(conn)
        .await?;
    Ok(match moved {
        Some(_) => events.iter().map(|e| e.event_id.clone()).collect(),
        None => Default::default(),
    })
}

/// PostgreSQL: the processed-set inserts of `events`, the first statement also moving the
/// checkpoint to the last of them (never back); `checkpoint_row` is the source of the
/// checkpoint row's `($1, $2, $3)`.
async fn postgres_mark_and_advance(
    conn: &mut sqlx::AnyConnection,
    name: &str,
    events: &[StoredEvent],
    checkpoint_row: &str,
) -> anyhow::Result<std::collections::HashSet<String>> {
    let mut new = std::collections::HashSet::with_capacity(events.len());
    let Some(last) = events.last() else { return Ok(new) };
    for (i, chunk) in events.chunks(rows_per_statement(1)).enumerate() {
        let values = (0..chunk.len()).map(|j| format!("($1, ${})", j + 4)).collect::<Vec<_>>().join(", ");
        let advance = if i == 0 { format!("WITH advanced AS ({}) ", upsert_cursor(checkpoint_row)) } else { String::new() };
        let sql = format!("{advance}INSERT INTO projection_processed (name, event_id) VALUES {values} ON CONFLICT DO NOTHING RETURNING event_id");
        let mut query = sqlx::query(&sql).bind(name).bind(last.tx_id).bind(last.position);
        for event in chunk {
            query = query.bind(&event.event_id);
        }
        for row in query.fetch_all(&mut *conn).await? {
            new.insert(row.try_get::<String, _>(0)?);
        }
    }
    Ok(new)
}

/// How long a SQLite consumer's cursor waits to be stored after a batch with nothing
/// else to write.
const STORE_CURSOR_AFTER: std::time::Duration = std::time::Duration::from_millis(25);

/// Stores consumer `name`'s cursor (never back) [`STORE_CURSOR_AFTER`] from now, with
/// whatever later cursor it reaches meanwhile; a failure only means its last events are
/// delivered again after a restart.
fn store_cursor_soon(db: &Db, name: &str, cursor: Cursor) {
    if !db.cursor_to_store(name, cursor) {
        return;
    }
    let (db, name) = (db.clone(), name.to_owned());
    tokio::spawn(async move {
        tokio::time::sleep(STORE_CURSOR_AFTER).await;
        let Some(cursor) = db.take_cursor_to_store(&name) else { return };
        let turn = db.write_turn().await;
        let stored = sqlx::query(&upsert_cursor("VALUES ($1, $2, $3)")).bind(name.as_str()).bind(cursor.tx_id).bind(cursor.position).execute(db.any()).await;
        drop(turn);
        if let Err(e) = stored {
            tracing::warn!(consumer = %name, error = %e, "could not store the consumer's cursor; its last events are delivered again after a restart");
        }
    });
}

/// One transaction for a batch: what was processed and the cursor ([`mark_and_advance`]),
/// then the rows of the new events. Returns how many events were new. `events` follow
/// the consumer's cursor in commit order (a feed's batch, or one event checked against the
/// cursor, or the next event a command-driven consumer handled).
pub(super) async fn record(db: &Db, name: &str, events: &[StoredEvent], projection: Option<&dyn Projection>) -> anyhow::Result<usize> {
    let Some(last) = events.last() else { return Ok(0) };
    // Tests slow a consumer down here (a replica's waits must not depend on winning a race).
    crate::failpoints::failpoint_delay("consumer.before_record").await;
    if let Some(p) = projection
        && write_blind(db, name, events, p).await?
    {
        return Ok(events.len());
    }
    if projection.is_none() && db.kind() == crate::store::DbKind::Postgres {
        // Nothing but the processed set and the checkpoint: one statement (for a batch of
        // up to a hundred events), its own transaction, committed asynchronously like
        // every consumer's (`Db::begin_consumer`).
        let checkpoint_row = format!("SELECT $1, $2, $3 FROM {}", crate::store::ASYNC_COMMIT);
        let fresh = if events.len() <= rows_per_statement(1) {
            postgres_mark_and_advance(&mut *db.any().acquire().await?, name, events, &checkpoint_row).await?
        } else {
            let mut tx = db.begin_consumer().await?;
            let fresh = mark_and_advance(&mut tx, name, events).await?;
            tx.commit().await?;
            fresh
        };
        db.progressed_to(name, last.cursor(), events.iter().map(|e| e.event_id.as_str()));
        return Ok(fresh.len());
    }
    if projection.is_none() {
        // SQLite, nothing but the cursor: known here at once (waits read it from memory:
        // SQLite serves one process), stored a moment later in one write for the batches
        // of that moment, instead of taking the only writer for each. A crash before the
        // write delivers those events again: they changed nothing, or their handlers,
        // like every consumer's, are idempotent.
        let fresh = db.progress_of(name).is_none_or(|at| at < last.cursor());
        db.progressed_to(name, last.cursor(), events.iter().map(|e| e.event_id.as_str()));
        store_cursor_soon(db, name, last.cursor());
        return Ok(if fresh { events.len() } else { 0 });
    }
    let turn = db.write_turn().await;
    let mut tx = db.begin_consumer().await?;
    let fresh = mark_and_advance(&mut tx, name, events).await?;
    if let Some(p) = projection
        && !fresh.is_empty()
    {
        let new: Vec<StoredEvent>;
        let batch = if fresh.len() == events.len() {
            events
        } else {
            new = events.iter().filter(|e| fresh.contains(&e.event_id)).cloned().collect();
            &new
        };
        p.apply_batch(&mut tx, batch).await.with_context(|| match batch {
            [one] => format!("{name} cannot apply event {}", one.event_id),
            [first, .., last] => format!("{name} cannot apply the events from {} to {}", first.event_id, last.event_id),
            [] => format!("{name} cannot apply an empty batch"),
        })?;
    }
    tx.commit().await?;
    drop(turn);
    db.progressed_to(name, last.cursor(), events.iter().map(|e| e.event_id.as_str()));
    Ok(fresh.len())
}

/// Whether consumer `name` processed event `event_id`: the event is in its processed set,
/// or at or behind its cursor. A consumer reads its types in commit order, so everything
/// of them up to its cursor was applied; a rebuild records only the cursor.
pub async fn processed(db: &Db, name: &str, event_id: &str) -> anyhow::Result<bool> {
    // `<aggregate_type>/<aggregate_id>/<sequence>`; an aggregate id may hold `/`.
    let stream = event_id.split_once('/').and_then(|(t, rest)| rest.rsplit_once('/').map(|(id, seq)| (t, id, seq.parse::<i64>())));
    let Some((aggregate_type, aggregate_id, Ok(sequence))) = stream else {
        let row =
            sqlx::query("SELECT 1 FROM projection_processed WHERE name = $1 AND event_id = $2").bind(name).bind(event_id).fetch_optional(db.any()).await?;
        return Ok(row.is_some());
    };
    let behind = match db.kind() {
        DbKind::Sqlite => "e.rowid <= c.position",
        DbKind::Postgres => "(e.tx_id, e.global_position) <= (CAST(CAST(c.tx_id AS TEXT) AS xid8), c.position)",
    };
    let sql = format!(
        "SELECT 1 WHERE EXISTS (SELECT 1 FROM projection_processed WHERE name = $1 AND event_id = $2)
            OR EXISTS (SELECT 1 FROM events e JOIN projection_checkpoints c ON c.name = $1
                        WHERE e.aggregate_type = $3 AND e.aggregate_id = $4 AND e.sequence = $5 AND {behind})"
    );
    let row = sqlx::query(&sql).bind(name).bind(event_id).bind(aggregate_type).bind(aggregate_id).bind(sequence).fetch_optional(db.any()).await?;
    Ok(row.is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    use atasira_domain::aggregates::draft::Draft;

    use crate::store::testing;

    #[tokio::test]
    async fn r_arch_6_an_embedded_consumer_keeps_its_cursor_alone_and_takes_nothing_twice() {
        // given the embedded store with three submitted drafts
        let store = testing::TempDb::new().await;
        let db = &store.db;
        for id in ["d1", "d2", "d3"] {
            db.cqrs::<Draft>().execute_new(id, testing::submit(id), std::collections::HashMap::new()).await.expect("submit");
        }
        let events = db.read(Cursor::START, &["draft"], 10).await.expect("read").events;
        // when a consumer marks the first two processed, one at a time, and the first again
        assert!(mark_processed(db, "c", &events[0]).await.expect("mark"), "the first event is new");
        assert!(mark_processed(db, "c", &events[1]).await.expect("mark"), "the second event is new");
        assert!(!mark_processed(db, "c", &events[0]).await.expect("mark"), "an event behind the cursor is not new again");
        // then its cursor is at the second, which tells what it processed: known here at
        // once, and stored a moment later (one write for the marks of that moment)
        assert_eq!(db.progress_of("c"), Some(events[1].cursor()), "a second mark of the first did not move the cursor back");
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while cursor(db, "c").await.expect("cursor") != events[1].cursor() {
            assert!(tokio::time::Instant::now() < deadline, "the cursor was never stored");
            tokio::time::sleep(STORE_CURSOR_AFTER).await;
        }
        for (event, done) in events.iter().zip([true, true, false]) {
            assert_eq!(processed(db, "c", &event.event_id).await.expect("processed"), done, "{}", event.event_id);
        }
        // and it wrote nothing but its cursor: SQLite's commit order is its rowid order
        assert_eq!(db.count("SELECT COUNT(*) FROM projection_processed").await.expect("count"), 0);
    }
}
