//! Projections: read models built from events. Each applies an event and stores its
//! checkpoint in the same transaction as its rows, and skips an event id it has already
//! applied (R-ARCH-5), so at-least-once delivery is exactly-once in effect.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use sqlx::{Any, Row, Transaction};

use crate::feed::{FeedSource, Pause};
use crate::store::{Cursor, Db, DbKind, StoredEvent, TextEvent};

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
    /// Applies a batch of new events, in order, inside the runner's transaction: the same
    /// effect as [`Projection::apply`] on each in turn. A projection whose events meet the
    /// same rows overrides it to read and write each row once per batch (a rebuild applies
    /// 1000 events a batch).
    async fn apply_batch(&self, tx: &mut Transaction<'static, Any>, events: &[StoredEvent]) -> anyhow::Result<()> {
        for event in events {
            self.apply(tx, event).await?;
        }
        Ok(())
    }
    /// Applies a page of a rebuild, the events as stored text ([`TextEvent`]), in order,
    /// inside the rebuild's transaction: the same effect as [`Projection::apply_batch`] on
    /// the same events (by default it parses them and calls it). A projection overrides it
    /// to decode the payloads straight into its own event types.
    async fn apply_page(&self, tx: &mut Transaction<'static, Any>, events: &[TextEvent]) -> anyhow::Result<()> {
        let events = events.iter().cloned().map(TextEvent::into_stored).collect::<anyhow::Result<Vec<_>>>()?;
        self.apply_batch(tx, &events).await
    }
    /// The one statement that applies a batch of new events without reading the view, its
    /// parameters numbered from `$first`, when the batch allows it and applying it twice
    /// changes nothing (the drafts view's batch of submissions: rows inserted unless
    /// there). The runner sends it with the cursor (and in PostgreSQL the processed set) in
    /// one round trip; `None` (the default): [`Projection::apply_batch`] in a transaction.
    fn blind_write(&self, events: &[StoredEvent], first: usize) -> anyhow::Result<Option<BlindWrite>> {
        let _ = (events, first);
        Ok(None)
    }
}

/// Events a rebuild reads and applies at a time, one transaction each.
pub const REBUILD_PAGE: i64 = 5000;

/// Parameters per statement when a batch's rows are written (or looked up) together: far
/// below the databases' bind limits, and short, since SQLite finds each parameter by a
/// scan of the statement's parameter list (so a long statement costs more per parameter).
const PARAMS_PER_STATEMENT: usize = 200;

/// Rows of `columns` parameters each that go into one statement.
pub fn rows_per_statement(columns: usize) -> usize {
    (PARAMS_PER_STATEMENT / columns.max(1)).max(1)
}

/// `($1, $2), ($3, $4), ...`: the VALUES of a multi-row insert of `rows` rows of `columns`.
pub fn values_list(rows: usize, columns: usize) -> String {
    values_list_from(1, rows, columns)
}

/// [`values_list`] whose first parameter is `$first`.
pub fn values_list_from(first: usize, rows: usize, columns: usize) -> String {
    let mut out = String::with_capacity(rows * columns * 5);
    for r in 0..rows {
        out.push_str(if r == 0 { "(" } else { ", (" });
        for c in 0..columns {
            if c > 0 {
                out.push_str(", ");
            }
            out.push('$');
            out.push_str(&(first + r * columns + c).to_string());
        }
        out.push(')');
    }
    out
}

/// `$1, $2, ...`: `n` placeholders, for `IN (...)`.
pub fn placeholders(n: usize) -> String {
    (1..=n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// The statement that moves consumer `name`'s cursor (never back) to the row `source`
/// gives (`VALUES ($1, $2, $3)`, or a `SELECT`): name, tx_id, position.
fn upsert_cursor(source: &str) -> String {
    format!(
        "INSERT INTO projection_checkpoints (name, tx_id, position) {source}
         ON CONFLICT (name) DO UPDATE SET tx_id = excluded.tx_id, position = excluded.position
          WHERE projection_checkpoints.tx_id < excluded.tx_id
             OR (projection_checkpoints.tx_id = excluded.tx_id AND projection_checkpoints.position < excluded.position)"
    )
}

/// A value bound to a statement of [`BlindWrite`].
#[derive(Debug, Clone, PartialEq)]
pub enum Arg {
    Text(String),
    Int(i64),
    MaybeText(Option<String>),
    MaybeInt(Option<i64>),
}

/// Binds `args` to `query`, in order.
pub fn bind_all<'q>(
    mut query: sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>>,
    args: &'q [Arg],
) -> sqlx::query::Query<'q, Any, sqlx::any::AnyArguments<'q>> {
    for arg in args {
        query = match arg {
            Arg::Text(v) => query.bind(v.as_str()),
            Arg::Int(v) => query.bind(*v),
            Arg::MaybeText(v) => query.bind(v.as_deref()),
            Arg::MaybeInt(v) => query.bind(*v),
        };
    }
    query
}

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
    let cursor = [Arg::Text(name.to_owned()), Arg::Int(last.tx_id), Arg::Int(last.position)];
    match db.kind() {
        DbKind::Postgres => {
            if events.len() > rows_per_statement(1) {
                return Ok(false);
            }
            let Some(write) = projection.blind_write(events, 4 + events.len()).with_context(context)? else { return Ok(false) };
            let marks = (0..events.len()).map(|i| format!("($1, ${})", i + 4)).collect::<Vec<_>>().join(", ");
            let sql = format!(
                "WITH advanced AS ({}),
                 marked AS (INSERT INTO projection_processed (name, event_id) VALUES {marks} ON CONFLICT DO NOTHING)
                 {}",
                upsert_cursor(&format!("SELECT $1, $2, $3 FROM {}", crate::store::ASYNC_COMMIT)),
                write.statement
            );
            let args: Vec<Arg> = cursor.into_iter().chain(events.iter().map(|e| Arg::Text(e.event_id.clone()))).chain(write.args).collect();
            bind_all(sqlx::query(&sql), &args).execute(db.any()).await.with_context(context)?;
        }
        DbKind::Sqlite => {
            let Some(write) = projection.blind_write(events, 1).with_context(context)? else { return Ok(false) };
            let k = write.args.len() + 1;
            let sql = format!("{};\n{}", write.statement, upsert_cursor(&format!("VALUES (${k}, ${}, ${})", k + 1, k + 2)));
            let args: Vec<Arg> = write.args.into_iter().chain(cursor).collect();
            let turn = db.write_turn().await;
            bind_all(sqlx::query(&sql), &args).execute(db.any()).await.with_context(context)?;
            drop(turn);
        }
    }
    db.progressed_to(name, last.cursor(), events.iter().map(|e| e.event_id.as_str()));
    Ok(true)
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
async fn advance_to(tx: &mut Transaction<'static, Any>, name: &str, cursor: Cursor) -> anyhow::Result<()> {
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

/// One transaction for a batch: what was processed and the cursor ([`mark_and_advance`]),
/// then the rows of the new events. Returns how many events were new. `events` follow
/// the consumer's cursor in commit order (a feed's batch, or one event checked against the
/// cursor, or the next event a command-driven consumer handled).
async fn record(db: &Db, name: &str, events: &[StoredEvent], projection: Option<&dyn Projection>) -> anyhow::Result<usize> {
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
    let turn = db.write_turn().await;
    if projection.is_none() {
        // SQLite, nothing but the cursor: one statement, its own transaction (under the
        // writer's turn like every write).
        let fresh = sqlite_advance(&mut *db.any().acquire().await?, name, events).await?;
        drop(turn);
        db.progressed_to(name, last.cursor(), events.iter().map(|e| e.event_id.as_str()));
        return Ok(fresh.len());
    }
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
            db.consumer_opened(name, from);
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

/// Creates the projection's tables.
pub async fn prepare(db: &Db, projection: &dyn Projection) -> anyhow::Result<()> {
    db.ensure_tables(projection.tables()).await
}

/// Runs a projection until `shutdown` resolves, a batch per transaction.
pub async fn run(db: Db, feeds: FeedSource, projection: Arc<dyn Projection>, shutdown: tokio::sync::watch::Receiver<bool>) {
    let (name, types) = (projection.name(), projection.aggregate_types());
    let apply_db = db.clone();
    consume_batches(db, feeds, name, types, shutdown, move |events| {
        let (db, projection) = (apply_db.clone(), projection.clone());
        async move { record(&db, name, &events, Some(projection.as_ref())).await.map(|_| ()) }
    })
    .await
}

/// Drops a projection's rows and rebuilds it from the whole event store (R-ARCH-5).
pub async fn rebuild(db: &Db, projection: &dyn Projection) -> anyhow::Result<u64> {
    rebuild_in_pages(db, projection, REBUILD_PAGE).await
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
    // The next page is read (on another thread, through the typed pool's connection) while
    // this one is applied.
    let types = projection.aggregate_types();
    let read = |at: Cursor| {
        let db = db.clone();
        tokio::spawn(async move { db.read_text(at, types, page.max(1)).await })
    };
    let (mut at, mut next, mut applied) = (Cursor::START, read(Cursor::START), 0);
    loop {
        let batch = next.await.context("a rebuild's read of the store stopped")??;
        let Some(last) = batch.events.last() else {
            if batch.held_back {
                tokio::time::sleep(Duration::from_millis(5)).await;
                next = read(at);
                continue;
            }
            break;
        };
        at = last.cursor();
        next = read(at);
        let result = apply_page(db, projection, &batch.events, at).await;
        if result.is_err() {
            next.abort();
        }
        result?;
        applied += batch.events.len() as u64;
    }
    Ok(applied)
}

/// One page of a rebuild in one transaction: the projection's rows, then its checkpoint.
async fn apply_page(db: &Db, projection: &dyn Projection, events: &[TextEvent], at: Cursor) -> anyhow::Result<()> {
    let name = projection.name();
    let turn = db.write_turn().await;
    let mut tx = db.begin_consumer().await?;
    if db.kind() == DbKind::Postgres {
        // The view's tables fill up during a rebuild: a plan PostgreSQL cached for a
        // statement while they were empty (a sequential scan) would stay for the rest.
        sqlx::query("SET LOCAL plan_cache_mode = force_custom_plan").execute(&mut *tx).await?;
    }
    projection.apply_page(&mut tx, events).await.with_context(|| {
        let id = |e: &TextEvent| StoredEvent::event_id_of(&e.aggregate_type, &e.aggregate_id, e.sequence);
        format!("{name} cannot apply the events from {} to {}", events.first().map(id).unwrap_or_default(), events.last().map(id).unwrap_or_default())
    })?;
    advance_to(&mut tx, name, at).await?;
    tx.commit().await?;
    drop(turn);
    db.progressed_to(name, at, std::iter::empty());
    Ok(())
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

/// R-BOX-9: waits until every projection in `names` has applied `position`, at most
/// `timeout`; returns the names still behind. By position: exact in SQLite, where
/// positions are commit order; callers in cluster mode wait by event id.
pub async fn wait_for(db: &Db, names: &[&'static str], position: i64, timeout: Duration) -> anyhow::Result<Vec<String>> {
    until(db, timeout, |look| async move {
        let mut lagging = Vec::new();
        for name in names {
            let seen = db.progress_of(name).is_some_and(|c| c.position >= position);
            let from_memory = look == Look::Rung || (look == Look::Remote && db.runs_here(name));
            if !seen && (from_memory || checkpoint(db, name).await? < position) {
                lagging.push((*name).to_owned());
            }
        }
        Ok(lagging)
    })
    .await
}

/// R-BOX-9, exact form: waits until every projection that reads an event's aggregate type
/// has applied that event (by id), at most `timeout`; returns the names still behind.
/// `position` is the write's (the last of its events; 0 when not known): in SQLite a
/// consumer that opened its feed in this process before it is answered from memory.
pub async fn wait_for_events(
    db: &Db,
    projections: &[(&'static str, &'static [&'static str])],
    event_ids: &[String],
    position: i64,
    timeout: Duration,
) -> anyhow::Result<Vec<String>> {
    until(db, timeout, |look| async move {
        let mut lagging = Vec::new();
        for (name, types) in projections {
            // The events precede `position`: none was processed before the feed opened.
            let memory_knows = position > 0 && db.follows_here(name, position.saturating_sub(event_ids.len() as i64));
            for id in event_ids {
                let aggregate_type = id.split('/').next().unwrap_or_default();
                if !types.contains(&aggregate_type) || db.processed_lately(name, id) {
                    continue;
                }
                let ask_the_store = match look {
                    Look::First => !memory_knows,
                    Look::Rung => false,
                    Look::Remote => !db.runs_here(name),
                    Look::SafetyNet => true,
                };
                let done = ask_the_store && processed(db, name, id).await?;
                if !done {
                    lagging.push((*name).to_owned());
                    break;
                }
            }
        }
        Ok(lagging)
    })
    .await
}

/// Why a wait looks (again): what it may take from memory and what it must ask the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    /// The first look: what happened before this process started is only in the store.
    First,
    /// A consumer of this process committed: what it did is in memory.
    Rung,
    /// A consumer of another process committed (PostgreSQL's progress notification): the
    /// store knows what the consumers that do not run here did.
    Remote,
    /// The safety net's look, a second after the last: a consumer of another process, or
    /// an event that left the memory's window.
    SafetyNet,
}

impl Look {
    fn label(self) -> &'static str {
        match self {
            Look::First => "first",
            Look::Rung => "local",
            Look::Remote => "remote",
            Look::SafetyNet => "safety_net",
        }
    }
}

/// Asks `behind` again each time a consumer made progress, until it says nothing is behind
/// or `timeout` passed; returns its last answer. The consumers a service answers for
/// usually run in its own process, so their progress bell is the signal to look, and what
/// they committed is in memory ([`Db::progressed_to`]), so a look after a ring asks no
/// database. A replica standing by for them (they run in another one) looks in the store
/// when PostgreSQL says some consumer committed.
async fn until<F, Fut>(db: &Db, timeout: Duration, behind: F) -> anyhow::Result<Vec<String>>
where
    F: Fn(Look) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Vec<String>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut progress = db.on_progress();
    let mut remote = db.on_remote_progress();
    let mut look = Look::First;
    loop {
        progress.borrow_and_update();
        remote.borrow_and_update();
        let lagging = behind(look).await?;
        if lagging.is_empty() || tokio::time::Instant::now() >= deadline {
            let outcome = if lagging.is_empty() { "applied" } else { "lagging" };
            crate::metrics::global().consistency_waits.get_or_create(&crate::metrics::WaitLabels { look: look.label(), outcome }).inc();
            return Ok(lagging);
        }
        let safety_net = deadline.min(tokio::time::Instant::now() + Duration::from_secs(1));
        // The bells live as long as `db`, so `changed` fails only when it is gone.
        look = tokio::select! {
            Ok(()) = progress.changed() => Look::Rung,
            Ok(()) = remote.changed() => Look::Remote,
            () = tokio::time::sleep_until(safety_net) => Look::SafetyNet,
        };
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
        wait_for_events(db, projections, &request.event_ids, request.position, timeout).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        // then its cursor is at the second, which tells what it processed
        assert_eq!(cursor(db, "c").await.expect("cursor"), events[1].cursor(), "a second mark of the first did not move the cursor back");
        for (event, done) in events.iter().zip([true, true, false]) {
            assert_eq!(processed(db, "c", &event.event_id).await.expect("processed"), done, "{}", event.event_id);
        }
        // and it wrote nothing but its cursor: SQLite's commit order is its rowid order
        assert_eq!(db.count("SELECT COUNT(*) FROM projection_processed").await.expect("count"), 0);
    }
}
