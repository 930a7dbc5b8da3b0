//! The one database: the shared event store (R-ARCH-1) plus each component's own tables.
//!
//! Two pools point at the same database: a typed one for cqrs-es (postgres-es or
//! sqlite-es need `Pool<Postgres>` / `Pool<Sqlite>`) and an `Any` pool for everything this
//! project writes itself, so that projection, checkpoint and token SQL is written once for
//! both backends (`$n` placeholders work on both).

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use cqrs_es::Aggregate;
use cqrs_es::persist::PersistedEventStore;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AnyPool, PgPool, Row, SqlitePool};
use std::sync::Arc;
use tokio::sync::watch;

/// Which backend a [`Db`] talks to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    Sqlite,
    Postgres,
}

#[derive(Clone)]
enum Typed {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// Handle to the database; cheap to clone.
#[derive(Clone)]
pub struct Db {
    typed: Typed,
    any: AnyPool,
    signals: Arc<Signals>,
}

/// What a process learns without asking the database: events were appended (rung after a
/// local commit, and in PostgreSQL on every commit anywhere, by `LISTEN`), a consumer of
/// this process made progress; and, for SQLite, the one writer's turn.
struct Signals {
    appended: watch::Sender<Appended>,
    /// PostgreSQL: `LISTEN` is in place, so every commit (this process's too) rings the
    /// appended bell by notification; a local ring after a commit would only wake readers
    /// a second time for the same events.
    listening: std::sync::atomic::AtomicBool,
    progressed: watch::Sender<u64>,
    /// PostgreSQL: a consumer of any process committed (`LISTEN` on the progress channel),
    /// for the waits of a process whose consumers run in another replica.
    remote_progressed: watch::Sender<u64>,
    /// SQLite allows one writer at a time; writers queue here instead of retrying on
    /// `SQLITE_BUSY` (which backs off in sleeps of up to 100 ms).
    writer: Option<Arc<tokio::sync::Mutex<()>>>,
    /// SQLite: where commands on new streams hand their appends, to be written together
    /// with the others waiting for the writer's turn ([`append_in_groups`]).
    appends: Option<tokio::sync::mpsc::UnboundedSender<AppendJob>>,
    /// What the group appender wrote so far.
    grouped: Arc<Grouped>,
    /// The connection [`Db::read`] keeps between reads (see there).
    reader: tokio::sync::Mutex<Option<sqlx::pool::PoolConnection<sqlx::Any>>>,
    /// Consumers of this process that cannot go on: name -> the error, and whether it is
    /// transient (waiting for the database) rather than an event it cannot apply.
    stalled: std::sync::Mutex<std::collections::BTreeMap<String, (String, bool)>>,
    /// What the consumers of this process committed, so that a read-your-writes wait looks
    /// here when the progress bell rings instead of asking the database.
    progress: std::sync::Mutex<HashMap<String, Consumed>>,
}

/// One consumer's progress as this process saw it commit: its cursor and the ids of the
/// events it processed lately (the last [`Consumed::RECENT`]).
#[derive(Default)]
struct Consumed {
    /// Where the consumer's feed opened in this process (everything after it that the
    /// consumer processed, it processed here).
    opened_at: Option<Cursor>,
    cursor: Cursor,
    recent: std::collections::HashSet<String>,
    order: std::collections::VecDeque<String>,
}

impl Consumed {
    /// Enough for every write in flight: a wait whose event left this window (or was
    /// processed before the process started) is answered by the database instead.
    const RECENT: usize = 8192;

    fn record<'a>(&mut self, cursor: Cursor, event_ids: impl IntoIterator<Item = &'a str>) {
        if cursor > self.cursor {
            self.cursor = cursor;
        }
        for id in event_ids {
            if self.recent.insert(id.to_owned()) {
                self.order.push_back(id.to_owned());
            }
        }
        while self.order.len() > Self::RECENT {
            if let Some(old) = self.order.pop_front() {
                self.recent.remove(&old);
            }
        }
    }
}

impl Signals {
    /// Rings the appended bell after a commit of this process, unless the database's
    /// notification will.
    fn committed(&self, ring: impl FnOnce(&mut Appended)) {
        if !self.listening.load(std::sync::atomic::Ordering::Acquire) {
            self.appended.send_modify(ring);
        }
    }

    /// The writer's turn ([`Db::write_turn`]).
    async fn write_turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        match &self.writer {
            Some(writer) => Some(writer.clone().lock_owned().await),
            None => None,
        }
    }

    /// The signals of a store; for SQLite (given its typed pool) the writer's turn, and the
    /// task that appends commands' events in groups.
    fn new(sqlite: Option<SqlitePool>) -> Arc<Signals> {
        let writer = sqlite.as_ref().map(|_| Arc::new(tokio::sync::Mutex::new(())));
        let grouped = Arc::new(Grouped::default());
        let appends = sqlite.zip(writer.clone()).map(|(pool, turn)| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(append_in_groups(pool, turn, rx, grouped.clone()));
            tx
        });
        Arc::new(Signals {
            appended: watch::channel(Appended::default()).0,
            listening: std::sync::atomic::AtomicBool::new(false),
            progressed: watch::channel(0).0,
            remote_progressed: watch::channel(0).0,
            writer,
            appends,
            grouped,
            reader: Default::default(),
            stalled: Default::default(),
            progress: Default::default(),
        })
    }
}

/// The appends a process was told of, counted per aggregate type (slots in the order of
/// `types::ALL`, plus one for types it does not know), so that a reader wakes only when a
/// type it reads was appended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Appended([u64; APPENDED_SLOTS]);

const APPENDED_SLOTS: usize = atasira_domain::aggregates::types::ALL.len() + 1;

impl Appended {
    fn slot(aggregate_type: &str) -> usize {
        atasira_domain::aggregates::types::ALL.iter().position(|t| *t == aggregate_type).unwrap_or(APPENDED_SLOTS - 1)
    }

    /// Counts an append of `aggregate_type`.
    fn ring(&mut self, aggregate_type: &str) {
        let slot = Self::slot(aggregate_type);
        self.0[slot] = self.0[slot].wrapping_add(1);
    }

    /// Counts an append of every type (what was appended is not known).
    fn ring_all(&mut self) {
        for n in &mut self.0 {
            *n = n.wrapping_add(1);
        }
    }

    /// A number that changes whenever one of `aggregate_types` (all types when empty) or
    /// an unknown type was appended.
    pub fn of(&self, aggregate_types: &[&str]) -> u64 {
        if aggregate_types.is_empty() {
            return self.0.iter().fold(0, |a, n| a.wrapping_add(*n));
        }
        let own = aggregate_types.iter().map(|t| Self::slot(t)).filter(|s| *s != APPENDED_SLOTS - 1);
        own.chain([APPENDED_SLOTS - 1]).fold(0, |a, s| a.wrapping_add(self.0[s]))
    }
}

/// Where a reader of the store stands. Events are read in commit order: PostgreSQL orders
/// them by `(tx_id, position)`, and only events of finished transactions are read, so an
/// event can never appear behind a cursor that has passed it (a position alone can: a
/// transaction that started first may take a higher position and commit first). SQLite
/// has one writer, so its positions are commit order and `tx_id` is always 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub tx_id: i64,
    pub position: i64,
}

impl Cursor {
    /// Before the first event.
    pub const START: Cursor = Cursor { tx_id: 0, position: 0 };

    /// Right after `event`.
    pub fn of(event: &StoredEvent) -> Cursor {
        Cursor { tx_id: event.tx_id, position: event.position }
    }
}

/// One read of the store: the events after a cursor, and whether committed events were
/// held back because an older transaction is still running (read again shortly).
#[derive(Debug, Default)]
pub struct Batch {
    pub events: Vec<StoredEvent>,
    pub held_back: bool,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Db({:?})", self.kind())
    }
}

/// cqrs-es over either backend (`EventStore` is not object safe, hence the enum): cqrs-es
/// loads the aggregate, and this module appends (see [`append`]).
enum Framework<A: Aggregate<Services = ()>> {
    Sqlite(PersistedEventStore<sqlite_es::SqliteEventRepository, A>, SqlitePool),
    Postgres(PersistedEventStore<postgres_es::PostgresEventRepository, A>, PgPool),
}

/// What a command committed: the id and global position of each event it appended, in
/// order, from the append itself (empty when the command appended nothing; the caller
/// then asks the store, [`Db::last_event`], when it needs the stream's last event).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Committed {
    pub events: Vec<(String, i64)>,
}

impl Committed {
    /// The last event's id and position, when known.
    pub fn last(&self) -> Option<(String, i64)> {
        self.events.last().cloned()
    }
}

/// cqrs-es over the shared store, with this process's signals: SQLite writes take the
/// writer's turn, and every commit rings the appended bell.
pub struct Cqrs<A: Aggregate<Services = ()>> {
    cqrs: Framework<A>,
    signals: Arc<Signals>,
}

impl<A: Aggregate<Services = ()>> std::fmt::Debug for Cqrs<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cqrs<{}>", A::TYPE)
    }
}

impl<A: Aggregate<Services = ()>> Cqrs<A> {
    /// Runs a command with event metadata; optimistic concurrency conflicts come back as
    /// `AggregateError::AggregateConflict`.
    pub async fn execute(
        &self,
        aggregate_id: &str,
        command: A::Command,
        metadata: std::collections::HashMap<String, String>,
    ) -> Result<Committed, cqrs_es::AggregateError<A::Error>> {
        self.run(aggregate_id, command, metadata, false).await
    }

    /// [`Cqrs::execute`] on a stream this process has just named (a fresh UUID), which
    /// holds no events yet: PostgreSQL skips loading it (should the stream exist after all,
    /// the append conflicts).
    pub async fn execute_new(
        &self,
        aggregate_id: &str,
        command: A::Command,
        metadata: std::collections::HashMap<String, String>,
    ) -> Result<Committed, cqrs_es::AggregateError<A::Error>> {
        self.run(aggregate_id, command, metadata, true).await
    }

    async fn run(
        &self,
        aggregate_id: &str,
        command: A::Command,
        metadata: std::collections::HashMap<String, String>,
        new_stream: bool,
    ) -> Result<Committed, cqrs_es::AggregateError<A::Error>> {
        // The command's trace context travels with its events to every consumer (R-OPS-1).
        let mut metadata = metadata;
        crate::trace::inject(|k, v| {
            metadata.insert(k.to_owned(), v);
        });
        let started = std::time::Instant::now();
        let result = match (&self.signals.appends, new_stream) {
            // SQLite, a stream with nothing to load: the appender takes the writer's turn
            // for this append and the others waiting.
            (Some(appends), true) => self.cqrs.execute(aggregate_id, command, metadata, Appender::Grouped(appends)).await,
            // Otherwise the load and the append hold the turn (SQLite), so commands of this
            // process on one stream never conflict.
            _ => {
                let turn = self.signals.write_turn().await;
                let result = self.cqrs.execute(aggregate_id, command, metadata, Appender::Direct { new_stream }).await;
                drop(turn);
                result
            }
        };
        let metrics = crate::metrics::global();
        metrics.append_seconds.get_or_create(&crate::metrics::AggregateLabel { aggregate_type: A::TYPE.to_owned() }).observe(started.elapsed().as_secs_f64());
        // Every security violation is a command on a `<service>_security` aggregate.
        if result.is_ok()
            && let Some(service) = A::TYPE.strip_suffix("_security")
        {
            metrics.security_violations.get_or_create(&crate::metrics::ServiceLabel { service: service.replace('_', "-") }).inc();
        }
        if result.is_ok() {
            self.signals.committed(|a| a.ring(A::TYPE));
        }
        result
    }
}

impl<A: Aggregate<Services = ()>> std::fmt::Debug for Framework<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cqrs<{}>", A::TYPE)
    }
}

/// How a command's events reach the store.
enum Appender<'a> {
    /// Appended by the command itself; `new_stream`: the stream holds nothing yet, so
    /// nothing is loaded.
    Direct { new_stream: bool },
    /// SQLite, a new stream: handed to the group appender ([`append_in_groups`]).
    Grouped(&'a tokio::sync::mpsc::UnboundedSender<AppendJob>),
}

impl<A: Aggregate<Services = ()>> Framework<A> {
    async fn execute(
        &self,
        aggregate_id: &str,
        command: A::Command,
        metadata: std::collections::HashMap<String, String>,
        appender: Appender<'_>,
    ) -> Result<Committed, cqrs_es::AggregateError<A::Error>> {
        use cqrs_es::EventStore as _;
        let new_stream = match appender {
            Appender::Direct { new_stream } => new_stream,
            Appender::Grouped(_) => true,
        };
        let (mut aggregate, sequence) = if new_stream {
            (A::default(), 0)
        } else {
            let context = match self {
                Framework::Sqlite(store, _) => store.load_aggregate(aggregate_id).await?,
                Framework::Postgres(store, _) => store.load_aggregate(aggregate_id).await?,
            };
            (context.aggregate, context.current_sequence)
        };
        let sink = cqrs_es::event_sink::EventSink::default();
        aggregate.handle(command, &(), &sink).await.map_err(cqrs_es::AggregateError::UserError)?;
        let events = sink.collect().await;
        let unexpected = |e: serde_json::Error| cqrs_es::AggregateError::UnexpectedError(Box::new(e));
        let Some(rows) = AppendRows::of::<A>(aggregate_id, sequence, &events, &metadata).map_err(unexpected)? else {
            return Ok(Committed::default());
        };
        let stored = match (appender, self) {
            (Appender::Grouped(appends), _) => {
                let (reply, answer) = tokio::sync::oneshot::channel();
                if appends.send(AppendJob { rows, reply }).is_err() {
                    return Err(cqrs_es::AggregateError::DatabaseConnectionError("the store's appender has stopped".into()));
                }
                answer.await.unwrap_or_else(|_| Err(sqlx::Error::PoolClosed))
            }
            (Appender::Direct { .. }, Framework::Sqlite(_, pool)) => insert_rows!(pool, false, &[&rows]).map(positions),
            // The request's principal assertion is admitted for the cluster in the same
            // statement: a replayed command stores nothing (`admission`).
            (Appender::Direct { .. }, Framework::Postgres(_, pool)) => match crate::admission::pending() {
                Some((tag, expires_at_ms)) => {
                    let stored = insert_rows!(pool, &rows, admitting & tag, expires_at_ms);
                    if let Ok(stored) = &stored {
                        crate::admission::settle(!stored.is_empty());
                        if stored.is_empty() {
                            return Err(cqrs_es::AggregateError::UnexpectedError("a replayed principal assertion: nothing appended".into()));
                        }
                    }
                    stored.map(positions)
                }
                None => insert_rows!(pool, true, &[&rows]).map(positions),
            },
        };
        let mut committed = stored.map_err(|e| match &e {
            sqlx::Error::Database(d) if d.is_unique_violation() => cqrs_es::AggregateError::AggregateConflict,
            _ => cqrs_es::AggregateError::DatabaseConnectionError(Box::new(e)),
        })?;
        committed.sort_unstable();
        Ok(Committed {
            events: committed.into_iter().map(|(sequence, position)| (StoredEvent::event_id_of(A::TYPE, aggregate_id, sequence), position)).collect(),
        })
    }
}

/// A command's events as the rows cqrs-es would write (same columns, the same JSON).
struct AppendRows {
    aggregate_type: &'static str,
    aggregate_id: String,
    metadata: String,
    /// Per event: sequence, type, version, payload.
    rows: Vec<(i64, String, String, String)>,
}

impl AppendRows {
    /// The rows of `events` appended after `after_sequence`; `None` when there are none.
    fn of<A: Aggregate>(
        aggregate_id: &str,
        after_sequence: usize,
        events: &[A::Event],
        metadata: &HashMap<String, String>,
    ) -> serde_json::Result<Option<AppendRows>> {
        use cqrs_es::DomainEvent as _;
        if events.is_empty() {
            return Ok(None);
        }
        let mut rows = Vec::with_capacity(events.len());
        for (i, event) in events.iter().enumerate() {
            let sequence = i64::try_from(after_sequence + i + 1).unwrap_or(i64::MAX);
            rows.push((sequence, event.event_type(), event.event_version(), serde_json::to_string(event)?));
        }
        Ok(Some(AppendRows { aggregate_type: A::TYPE, aggregate_id: aggregate_id.to_owned(), metadata: serde_json::to_string(metadata)?, rows }))
    }
}

/// The statement that appends `rows` rows in one go (a statement outside a transaction
/// block is its own atomic transaction: all rows or none), returning each row's stream,
/// sequence and position (PostgreSQL's `global_position`, SQLite's rowid); `json` casts
/// the payload and metadata for PostgreSQL's `json` columns. A sequence another writer took
/// first fails the statement: the optimistic-concurrency conflict, as in postgres-es and
/// sqlite-es.
fn insert_statement(rows: usize, json: bool) -> String {
    let position = if json { "global_position" } else { "rowid" };
    format!(
        "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata) VALUES {}
         RETURNING aggregate_type, aggregate_id, sequence, {position}",
        insert_values(rows, json)
    )
}

/// The VALUES of [`insert_statement`]: seven parameters per row, from `$1`.
fn insert_values(rows: usize, json: bool) -> String {
    let (open, close) = if json { ("CAST(", " AS json)") } else { ("", "") };
    let values: Vec<String> = (0..rows)
        .map(|i| 1 + 7 * i)
        .map(|k| format!("(${k}, ${}, ${}, ${}, ${}, {open}${}{close}, {open}${}{close})", k + 1, k + 2, k + 3, k + 4, k + 5, k + 6))
        .collect();
    values.join(", ")
}

/// [`insert_statement`] for PostgreSQL that also admits a principal assertion for the
/// cluster (its tag and expiry are the last two parameters): the rows are stored only if
/// the tag is new, so a replayed command stores nothing and returns no rows.
fn admitted_insert_statement(rows: usize) -> String {
    let tag = 7 * rows + 1;
    format!(
        "WITH admitted AS (INSERT INTO assertion_replay (tag, expires_at_ms) VALUES (${tag}, ${}) ON CONFLICT (tag) DO NOTHING RETURNING tag)
         INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata)
         SELECT v.* FROM (VALUES {}) AS v (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata)
         WHERE EXISTS (SELECT 1 FROM admitted)
         RETURNING aggregate_type, aggregate_id, sequence, global_position",
        tag + 1,
        insert_values(rows, true)
    )
}

/// Runs [`insert_statement`] for `appends` on `$pool` (`$json`: PostgreSQL's casts): the
/// stream, sequence and position of every row stored.
macro_rules! insert_rows {
    ($pool:expr, $json:expr, $appends:expr) => {{
        let appends: &[&AppendRows] = $appends;
        let sql = insert_statement(appends.iter().map(|a| a.rows.len()).sum(), $json);
        insert_rows!(@run $pool, &sql, appends)
    }};
    // PostgreSQL: one append that also admits an assertion ([`admitted_insert_statement`]).
    ($pool:expr, $append:expr, admitting $tag:expr, $expires_at_ms:expr) => {{
        let appends: &[&AppendRows] = &[$append];
        let sql = admitted_insert_statement(appends[0].rows.len());
        insert_rows!(@run $pool, &sql, appends, hex::encode($tag), $expires_at_ms)
    }};
    (@run $pool:expr, $sql:expr, $appends:expr $(, $extra:expr)*) => {{
        let appends: &[&AppendRows] = $appends;
        let mut query = sqlx::query($sql);
        for a in appends {
            for (sequence, event_type, version, payload) in &a.rows {
                query = query
                    .bind(a.aggregate_type)
                    .bind(a.aggregate_id.as_str())
                    .bind(*sequence)
                    .bind(event_type.as_str())
                    .bind(version.as_str())
                    .bind(payload.as_str())
                    .bind(a.metadata.as_str());
            }
        }
        $(query = query.bind($extra);)*
        query.fetch_all($pool).await.and_then(|stored| {
            stored
                .iter()
                .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<String, _>(1)?, r.try_get::<i64, _>(2)?, r.try_get::<i64, _>(3)?)))
                .collect::<Result<Vec<_>, sqlx::Error>>()
        })
    }};
}
use insert_rows;

/// The sequence and position of each row [`insert_rows`] stored for one stream.
fn positions(stored: Vec<(String, String, i64, i64)>) -> Vec<(i64, i64)> {
    stored.into_iter().map(|(_, _, sequence, position)| (sequence, position)).collect()
}

/// A command's append handed to the group appender, and where its outcome goes: the
/// sequence and position of each row.
struct AppendJob {
    rows: AppendRows,
    reply: tokio::sync::oneshot::Sender<Result<Vec<(i64, i64)>, sqlx::Error>>,
}

/// What SQLite's group appender wrote: commits, and the appends they held.
#[derive(Debug, Default)]
struct Grouped {
    commits: std::sync::atomic::AtomicU64,
    appends: std::sync::atomic::AtomicU64,
}

impl Grouped {
    fn wrote(&self, commits: usize, appends: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.commits.fetch_add(commits as u64, Relaxed);
        self.appends.fetch_add(appends as u64, Relaxed);
    }
}

/// Appends written together at most (SQLite binds them all in one statement).
const APPEND_GROUP: usize = 32;

/// SQLite's group commit: takes the writer's turn for the appends waiting, and writes them
/// in one statement (one trip to the connection's thread, one transaction), instead of a
/// turn and a trip each. Should that statement fail (a stream another command took first,
/// or anything else), every append of the group is written alone, so each learns its own
/// outcome. Runs until the store's handles are gone.
async fn append_in_groups(
    pool: SqlitePool,
    turn: Arc<tokio::sync::Mutex<()>>,
    mut jobs: tokio::sync::mpsc::UnboundedReceiver<AppendJob>,
    grouped: Arc<Grouped>,
) {
    while let Some(first) = jobs.recv().await {
        let mut group = vec![first];
        let held = turn.lock().await;
        // Those that came while this one waited for the turn go with it.
        while group.len() < APPEND_GROUP
            && let Ok(job) = jobs.try_recv()
        {
            group.push(job);
        }
        let together = match group.len() {
            1 => None,
            _ => insert_rows!(&pool, false, &group.iter().map(|j| &j.rows).collect::<Vec<_>>()).ok(),
        };
        match together {
            Some(stored) => {
                drop(held);
                grouped.wrote(1, group.len());
                for job in group {
                    let r = &job.rows;
                    let own = stored.iter().filter(|(t, id, _, _)| t == r.aggregate_type && *id == r.aggregate_id).map(|(_, _, s, p)| (*s, *p)).collect();
                    let _ = job.reply.send(Ok(own));
                }
            }
            None => {
                grouped.wrote(group.len(), group.len());
                for job in group {
                    let stored = insert_rows!(&pool, false, &[&job.rows]).map(positions);
                    let _ = job.reply.send(stored);
                }
                drop(held);
            }
        }
    }
}

/// One stored event with its place in the global order.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    /// `<aggregate_type>/<aggregate_id>/<sequence>`: stable and unique, used for dedup
    /// (JetStream `Nats-Msg-Id`, consumers' processed sets).
    pub event_id: String,
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub position: i64,
    /// The appending transaction (PostgreSQL `xid8`; 0 in SQLite): with `position`, the
    /// commit order readers follow (see [`Cursor`]).
    pub tx_id: i64,
    pub event_type: String,
    pub event_version: String,
    pub payload: serde_json::Value,
    pub metadata: serde_json::Value,
    pub recorded_at_ms: i64,
}

impl StoredEvent {
    pub fn event_id_of(aggregate_type: &str, aggregate_id: &str, sequence: i64) -> String {
        format!("{aggregate_type}/{aggregate_id}/{sequence}")
    }

    /// The event as a projection applies it.
    pub fn as_event(&self) -> EventRef<'_> {
        EventRef { aggregate_type: &self.aggregate_type, aggregate_id: &self.aggregate_id, position: self.position, payload: Payload::Parsed(&self.payload) }
    }
}

/// One stored event as a rebuild reads it ([`Db::read_text`]): a [`StoredEvent`] whose
/// payload and metadata are still the stored JSON text, so that a projection decodes the
/// payload straight into its own event type instead of through a `serde_json::Value`.
#[derive(Debug, Clone, PartialEq)]
pub struct TextEvent {
    pub aggregate_type: String,
    pub aggregate_id: String,
    pub sequence: i64,
    pub position: i64,
    pub tx_id: i64,
    pub event_type: String,
    pub event_version: String,
    pub payload: String,
    pub metadata: String,
    pub recorded_at_ms: i64,
}

impl TextEvent {
    /// The event as a projection applies it.
    pub fn as_event(&self) -> EventRef<'_> {
        EventRef { aggregate_type: &self.aggregate_type, aggregate_id: &self.aggregate_id, position: self.position, payload: Payload::Text(&self.payload) }
    }

    /// Right after this event.
    pub fn cursor(&self) -> Cursor {
        Cursor { tx_id: self.tx_id, position: self.position }
    }

    /// The [`StoredEvent`], payload and metadata parsed.
    pub fn into_stored(self) -> anyhow::Result<StoredEvent> {
        Ok(StoredEvent {
            event_id: StoredEvent::event_id_of(&self.aggregate_type, &self.aggregate_id, self.sequence),
            payload: serde_json::from_str(&self.payload)?,
            metadata: serde_json::from_str(&self.metadata)?,
            aggregate_type: self.aggregate_type,
            aggregate_id: self.aggregate_id,
            sequence: self.sequence,
            position: self.position,
            tx_id: self.tx_id,
            event_type: self.event_type,
            event_version: self.event_version,
            recorded_at_ms: self.recorded_at_ms,
        })
    }
}

/// An event as a projection applies it, whichever way it was read ([`StoredEvent`] or
/// [`TextEvent`]): its stream, its place, and its payload, decoded into the projection's
/// own event type.
#[derive(Debug, Clone, Copy)]
pub struct EventRef<'a> {
    pub aggregate_type: &'a str,
    pub aggregate_id: &'a str,
    pub position: i64,
    payload: Payload<'a>,
}

#[derive(Debug, Clone, Copy)]
enum Payload<'a> {
    Parsed(&'a serde_json::Value),
    Text(&'a str),
}

impl EventRef<'_> {
    /// The payload as a `T` (the same value from the text as from the parsed payload).
    pub fn decode<T: serde::de::DeserializeOwned>(&self) -> serde_json::Result<T> {
        match self.payload {
            Payload::Parsed(value) => T::deserialize(value),
            Payload::Text(text) => serde_json::from_str(text),
        }
    }
}

/// One read of the store as text ([`Db::read_text`]); see [`Batch`].
#[derive(Debug, Default)]
pub struct TextBatch {
    pub events: Vec<TextEvent>,
    pub held_back: bool,
}

const SQLITE_SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS events (
        aggregate_type TEXT NOT NULL,
        aggregate_id TEXT NOT NULL,
        sequence INTEGER NOT NULL CHECK (sequence >= 0),
        event_type TEXT NOT NULL,
        event_version TEXT NOT NULL,
        payload TEXT NOT NULL,
        metadata TEXT NOT NULL,
        recorded_at_ms INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
        PRIMARY KEY (aggregate_type, aggregate_id, sequence)
    )",
    "CREATE TABLE IF NOT EXISTS snapshots (
        aggregate_type TEXT NOT NULL,
        aggregate_id TEXT NOT NULL,
        last_sequence INTEGER NOT NULL,
        current_snapshot INTEGER NOT NULL,
        payload TEXT NOT NULL,
        PRIMARY KEY (aggregate_type, aggregate_id, last_sequence)
    )",
    // Readers of some aggregate types in position order (see `sqlite_after`); SQLite
    // appends the rowid to every index entry.
    "CREATE INDEX IF NOT EXISTS events_type_order ON events (aggregate_type)",
    "CREATE TRIGGER IF NOT EXISTS events_append_only_update BEFORE UPDATE ON events
        BEGIN SELECT RAISE(ABORT, 'events are append-only'); END",
    "CREATE TRIGGER IF NOT EXISTS events_append_only_delete BEFORE DELETE ON events
        BEGIN SELECT RAISE(ABORT, 'events are append-only'); END",
];

const POSTGRES_SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS events (
        aggregate_type text NOT NULL,
        aggregate_id text NOT NULL,
        sequence bigint NOT NULL CHECK (sequence >= 0),
        event_type text NOT NULL,
        event_version text NOT NULL,
        payload json NOT NULL,
        metadata json NOT NULL,
        global_position bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
        recorded_at_ms bigint NOT NULL DEFAULT (extract(epoch FROM clock_timestamp()) * 1000)::bigint,
        tx_id xid8 NOT NULL DEFAULT pg_current_xact_id(),
        PRIMARY KEY (aggregate_type, aggregate_id, sequence)
    )",
    "CREATE TABLE IF NOT EXISTS snapshots (
        aggregate_type text NOT NULL,
        aggregate_id text NOT NULL,
        last_sequence bigint NOT NULL,
        current_snapshot bigint NOT NULL,
        payload json NOT NULL,
        PRIMARY KEY (aggregate_type, aggregate_id, last_sequence)
    )",
    "CREATE OR REPLACE FUNCTION atasira_events_append_only() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN RAISE EXCEPTION 'events are append-only'; END $$",
    "DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'events_append_only') THEN
            CREATE TRIGGER events_append_only BEFORE UPDATE OR DELETE ON events
                FOR EACH ROW EXECUTE FUNCTION atasira_events_append_only();
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'events_no_truncate' AND tgrelid = 'events'::regclass) THEN
            CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
                FOR EACH STATEMENT EXECUTE FUNCTION atasira_events_append_only();
        END IF;
    END $$",
    // Who may append what (R-ARCH-13): `atasira db roles` lists each service role's
    // aggregate types (and, where two services share a type, event types; NULL: any). A
    // role listed here may append only what its rows name; a role not listed (the owner,
    // a single service role set up by hand) is not held by this table.
    "CREATE TABLE IF NOT EXISTS event_writers (
        role text NOT NULL,
        aggregate_type text NOT NULL,
        event_type text,
        UNIQUE (role, aggregate_type, event_type)
    )",
    "CREATE OR REPLACE FUNCTION atasira_events_writer_check() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN
            IF EXISTS (SELECT 1 FROM event_writers WHERE role = current_user::text) AND NOT EXISTS (
                SELECT 1 FROM event_writers WHERE role = current_user::text AND aggregate_type = NEW.aggregate_type
                    AND (event_type IS NULL OR event_type = NEW.event_type)) THEN
                RAISE EXCEPTION 'role % may not append % events of aggregate type %', current_user, NEW.event_type, NEW.aggregate_type
                    USING ERRCODE = 'insufficient_privilege';
            END IF;
            RETURN NEW;
        END $$",
    "DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'events_writer_check' AND tgrelid = 'events'::regclass) THEN
            CREATE TRIGGER events_writer_check BEFORE INSERT ON events
                FOR EACH ROW EXECUTE FUNCTION atasira_events_writer_check();
        END IF;
    END $$",
    // Readers follow commit order (see `Cursor`).
    "CREATE INDEX IF NOT EXISTS events_commit_order ON events (tx_id, global_position)",
    // A reader of some aggregate types finds its events in commit order per type, whatever
    // the planner believes about how the types are spread (see `pg_after`).
    "CREATE INDEX IF NOT EXISTS events_type_commit_order ON events (aggregate_type, tx_id, global_position)",
    // The doorbell: a notification naming the aggregate types a statement appended
    // (PostgreSQL folds repeats within a transaction), delivered at commit.
    // (A store prepared by an older version has a trigger without the transition table:
    // dropped before the function that reads the table replaces its function.)
    "DO $$ BEGIN
        IF EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'events_notify' AND tgrelid = 'events'::regclass) THEN
            DROP TRIGGER events_notify ON events;
        END IF;
    END $$",
    "CREATE OR REPLACE FUNCTION atasira_events_notify() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN
            PERFORM pg_notify('atasira_events', COALESCE((SELECT string_agg(DISTINCT aggregate_type, ',') FROM appended), ''));
            RETURN NULL;
        END $$",
    "DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'events_notify_types' AND tgrelid = 'events'::regclass) THEN
            CREATE TRIGGER events_notify_types AFTER INSERT ON events REFERENCING NEW TABLE AS appended
                FOR EACH STATEMENT EXECUTE FUNCTION atasira_events_notify();
        END IF;
    END $$",
];

/// PostgreSQL: every commit of a consumer (its processed set or its checkpoint) notifies
/// the progress channel, so a replica that stands by for a consumer, and answers
/// read-your-writes waits for it, learns of the progress without polling.
const POSTGRES_PROGRESS: &[&str] = &[
    "CREATE OR REPLACE FUNCTION atasira_progress_notify() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN PERFORM pg_notify('atasira_progress', ''); RETURN NULL; END $$",
    "DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'processed_notify' AND tgrelid = 'projection_processed'::regclass) THEN
            CREATE TRIGGER processed_notify AFTER INSERT ON projection_processed
                FOR EACH STATEMENT EXECUTE FUNCTION atasira_progress_notify();
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'checkpoint_notify' AND tgrelid = 'projection_checkpoints'::regclass) THEN
            CREATE TRIGGER checkpoint_notify AFTER INSERT OR UPDATE ON projection_checkpoints
                FOR EACH STATEMENT EXECUTE FUNCTION atasira_progress_notify();
        END IF;
    END $$",
];

/// Tables every component shares the shape of: projection checkpoints and processed sets.
/// A checkpoint is a [`Cursor`]: `(tx_id, position)`.
const COMMON_SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS projection_checkpoints (name TEXT PRIMARY KEY, position BIGINT NOT NULL, tx_id BIGINT NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS projection_processed (name TEXT NOT NULL, event_id TEXT NOT NULL, PRIMARY KEY (name, event_id))",
    "CREATE TABLE IF NOT EXISTS relay_checkpoints (name TEXT PRIMARY KEY, position BIGINT NOT NULL, tx_id BIGINT NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS relay_dead_letters (name TEXT NOT NULL, event_id TEXT NOT NULL, position BIGINT NOT NULL, reason TEXT NOT NULL,
        recorded_at_ms BIGINT NOT NULL, PRIMARY KEY (name, event_id))",
];

/// PostgreSQL: the principal assertions some process of the cluster admitted, until they
/// expire, so that replicas of a service admit each assertion once between them.
const POSTGRES_REPLAY: &[&str] = &["CREATE TABLE IF NOT EXISTS assertion_replay (tag TEXT PRIMARY KEY, expires_at_ms BIGINT NOT NULL)"];

/// Checkpoint tables of stores created before checkpoints were cursors.
const CURSOR_COLUMNS: &[&str] = &["projection_checkpoints", "relay_checkpoints"];

/// How long a PostgreSQL statement waits for a connection of its pool (one in use by
/// others, or a new one while the database is away) before it fails.
const PG_ACQUIRE: Duration = Duration::from_secs(5);

impl Db {
    /// Connects to `postgres://...` or `sqlite://...`, creating what the event store needs.
    pub async fn connect(url: &str) -> anyhow::Result<Db> {
        sqlx::any::install_default_drivers();
        let db = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            // No ping before each use (a round trip per statement): a connection that died
            // fails its statement, and every writer retries from its checkpoint. While the
            // database is away, a request waits at most PG_ACQUIRE for a connection, then
            // fails (503 to its caller) instead of hanging.
            let pool = PgPoolOptions::new()
                .max_connections(8)
                .test_before_acquire(false)
                .acquire_timeout(PG_ACQUIRE)
                .connect(url)
                .await
                .with_context(|| format!("failed to connect to {}", redact(url)))?;
            let any = AnyPoolOptions::new()
                .max_connections(8)
                .test_before_acquire(false)
                .acquire_timeout(PG_ACQUIRE)
                .connect(url)
                .await
                .context("failed to open the Any pool")?;
            let signals = Signals::new(None);
            tokio::spawn(listen_for_appends(pool.clone(), Arc::downgrade(&signals)));
            Db { typed: Typed::Postgres(pool), any, signals }
        } else if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(10))
                .foreign_keys(true);
            // One connection for commands: they write one at a time anyway (the writer's
            // turn), and a connection keeps its page cache only while no other connection
            // writes, so rotating through several would read the store afresh on each.
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .test_before_acquire(false)
                .connect_with(options)
                .await
                .with_context(|| format!("failed to open {url}"))?;
            // The same settings as the typed pool's: `synchronous` holds per connection
            // (FULL, the default, would sync the disk on every projection commit). No memory
            // map: a connection drops its map whenever another one committed, so under
            // writes each read would map the file again (an unmap costs every core a TLB
            // flush), more than the read calls it saves.
            let any = AnyPoolOptions::new()
                .max_connections(4)
                .test_before_acquire(false)
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        sqlx::query("PRAGMA busy_timeout = 10000").execute(&mut *conn).await?;
                        sqlx::query("PRAGMA synchronous = NORMAL").execute(&mut *conn).await?;
                        Ok(())
                    })
                })
                .connect(url)
                .await
                .context("failed to open the Any pool")?;
            Db { typed: Typed::Sqlite(pool.clone()), any, signals: Signals::new(Some(pool)) }
        } else {
            anyhow::bail!("unsupported database URL {:?}: use postgres://... or sqlite://...", redact(url));
        };
        db.migrate().await?;
        Ok(db)
    }

    /// `sqlite://<dir>/atasira.db?mode=rwc` for a data directory.
    pub fn sqlite_url(data_dir: &Path) -> String {
        format!("sqlite://{}?mode=rwc", data_dir.join("atasira.db").display())
    }

    pub fn kind(&self) -> DbKind {
        match self.typed {
            Typed::Sqlite(_) => DbKind::Sqlite,
            Typed::Postgres(_) => DbKind::Postgres,
        }
    }

    /// The pool for this project's own SQL.
    pub fn any(&self) -> &AnyPool {
        &self.any
    }

    /// Creates the shared event store tables (idempotent; every component may call it).
    async fn migrate(&self) -> anyhow::Result<()> {
        let schema = match self.kind() {
            DbKind::Sqlite => SQLITE_SCHEMA,
            DbKind::Postgres => POSTGRES_SCHEMA,
        };
        let (progress, replay): (&[&str], &[&str]) = if self.kind() == DbKind::Postgres { (POSTGRES_PROGRESS, POSTGRES_REPLAY) } else { (&[], &[]) };
        let all: Vec<&str> = schema.iter().chain(COMMON_SCHEMA).chain(progress).chain(replay).copied().collect();
        self.ensure_tables(&all).await?;
        for table in CURSOR_COLUMNS {
            let add = format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS tx_id BIGINT NOT NULL DEFAULT 0");
            match self.kind() {
                DbKind::Postgres => self.ensure_tables(&[&add]).await?,
                DbKind::Sqlite => {
                    let has = format!("SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = 'tx_id'");
                    if sqlx::query(&has).fetch_one(&self.any).await?.try_get::<i64, _>(0)? == 0 {
                        self.ensure_tables(&[&add.replace(" IF NOT EXISTS", "")]).await?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Admits an assertion (by its tag, the SHA-256 of its signature) for the whole cluster:
    /// `false` when some process admitted it before. PostgreSQL only (one insert, committed
    /// without waiting for the disk: a database crash forgets at most the last moment's
    /// admissions, of assertions that live a minute); SQLite serves one process, whose own
    /// replay cache suffices.
    pub async fn admit_assertion(&self, tag: &[u8; 32], expires_at_ms: i64) -> anyhow::Result<bool> {
        if self.kind() != DbKind::Postgres {
            return Ok(true);
        }
        let sql = format!("INSERT INTO assertion_replay (tag, expires_at_ms) SELECT $1, $2 FROM {ASYNC_COMMIT} ON CONFLICT (tag) DO NOTHING");
        let done = sqlx::query(&sql).bind(hex::encode(tag)).bind(expires_at_ms).execute(&self.any).await?;
        Ok(done.rows_affected() == 1)
    }

    /// Forgets admitted assertions expired before `before_ms` (they verify no more).
    pub async fn forget_assertions(&self, before_ms: i64) -> anyhow::Result<u64> {
        if self.kind() != DbKind::Postgres {
            return Ok(0);
        }
        Ok(sqlx::query("DELETE FROM assertion_replay WHERE expires_at_ms < $1").bind(before_ms).execute(&self.any).await?.rows_affected())
    }

    /// Runs idempotent DDL. In PostgreSQL, concurrent `CREATE ... IF NOT EXISTS` of the same
    /// table can still collide (processes starting together), so DDL holds an advisory lock.
    ///
    /// A PostgreSQL role that may not create objects in its schema (a service role that
    /// cannot alter the append-only triggers, see README) runs no DDL: the tables must exist
    /// already (`atasira db prepare` as the owning role creates them), and a missing one is
    /// named.
    pub async fn ensure_tables(&self, statements: &[&str]) -> anyhow::Result<()> {
        let mut conn = self.any.acquire().await?;
        let postgres = self.kind() == DbKind::Postgres;
        if postgres {
            let may_create: bool =
                sqlx::query("SELECT COALESCE(has_schema_privilege(current_schema(), 'CREATE'), false)").fetch_one(&mut *conn).await?.try_get(0)?;
            if !may_create {
                return expect_tables(&mut conn, statements).await;
            }
            sqlx::query("SELECT pg_advisory_lock(424242)").execute(&mut *conn).await?;
        }
        let mut result = Ok(());
        for stmt in statements {
            if let Err(e) = sqlx::query(stmt).execute(&mut *conn).await {
                result = Err(anyhow::Error::new(e).context(format!("failed to create tables: {}", stmt.lines().next().unwrap_or_default())));
                break;
            }
        }
        if postgres {
            sqlx::query("SELECT pg_advisory_unlock(424242)").execute(&mut *conn).await?;
        }
        result
    }

    /// A cqrs-es framework for aggregate `A` on the shared event store.
    pub fn cqrs<A>(&self) -> Cqrs<A>
    where
        A: Aggregate<Services = ()> + 'static,
    {
        let cqrs = match &self.typed {
            Typed::Sqlite(pool) => Framework::Sqlite(PersistedEventStore::new_event_store(sqlite_es::SqliteEventRepository::new(pool.clone())), pool.clone()),
            Typed::Postgres(pool) => {
                Framework::Postgres(PersistedEventStore::new_event_store(postgres_es::PostgresEventRepository::new(pool.clone())), pool.clone())
            }
        };
        Cqrs { cqrs, signals: self.signals.clone() }
    }

    /// SQLite: how many commits the commands on new streams took so far, and how many
    /// commands they held (more commands than commits: commands written together).
    pub fn appends_per_commit(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.signals.grouped.commits.load(Relaxed), self.signals.grouped.appends.load(Relaxed))
    }

    /// Rings the appended bell: events were committed (by this process; the store's own
    /// commands ring it themselves).
    pub fn appended(&self) {
        self.signals.committed(Appended::ring_all);
    }

    /// The appended bell: changes after events were committed; [`Appended::of`] says
    /// whether of the types a reader reads.
    pub fn on_append(&self) -> watch::Receiver<Appended> {
        self.signals.appended.subscribe()
    }

    /// Rings the progress bell: a consumer of this process committed its checkpoint.
    pub fn progressed(&self) {
        self.signals.progressed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The progress bell (read-your-writes waits on it).
    pub fn on_progress(&self) -> watch::Receiver<u64> {
        self.signals.progressed.subscribe()
    }

    /// The remote progress bell: in PostgreSQL, a consumer of any process committed.
    pub fn on_remote_progress(&self) -> watch::Receiver<u64> {
        self.signals.remote_progressed.subscribe()
    }

    /// Whether consumer `name` runs in this process (its feed opened here), so what it
    /// commits is known here without asking the database; a replica standing by for it
    /// (`exclusive.rs`) has to ask.
    pub fn runs_here(&self, name: &str) -> bool {
        self.signals.progress.lock().is_ok_and(|p| p.get(name).is_some_and(|c| c.opened_at.is_some()))
    }

    /// Consumer `name` of this process committed up to `cursor`, processing `event_ids`:
    /// remembers it, then rings the progress bell.
    pub fn progressed_to<'a>(&self, name: &str, cursor: Cursor, event_ids: impl IntoIterator<Item = &'a str>) {
        if let Ok(mut progress) = self.signals.progress.lock() {
            progress.entry(name.to_owned()).or_default().record(cursor, event_ids);
        }
        crate::metrics::global().reader_moved(name, cursor);
        self.progressed();
    }

    /// Consumer `name` of this process opened its feed at `cursor`.
    pub fn consumer_opened(&self, name: &str, cursor: Cursor) {
        if let Ok(mut progress) = self.signals.progress.lock() {
            let consumed = progress.entry(name.to_owned()).or_default();
            consumed.opened_at = Some(consumed.opened_at.map_or(cursor, |c| c.min(cursor)));
        }
    }

    /// SQLite, where positions are commit order: whether consumer `name` opened its feed in
    /// this process before `position`, so that if it processed that event it did so here and
    /// [`Db::processed_lately`] knows (while the event is among the recent ones).
    pub fn follows_here(&self, name: &str, position: i64) -> bool {
        self.kind() == DbKind::Sqlite
            && self.signals.progress.lock().is_ok_and(|p| p.get(name).and_then(|c| c.opened_at).is_some_and(|at| at.position < position))
    }

    /// Whether consumer `name` of this process processed `event_id` lately (`false` also
    /// when it did so long ago or in another process: ask the database then).
    pub fn processed_lately(&self, name: &str, event_id: &str) -> bool {
        self.signals.progress.lock().map(|p| p.get(name).is_some_and(|c| c.recent.contains(event_id))).unwrap_or(false)
    }

    /// Where consumer `name` of this process last committed, if it did since the start.
    pub fn progress_of(&self, name: &str) -> Option<Cursor> {
        self.signals.progress.lock().ok()?.get(name).map(|c| c.cursor)
    }

    /// Asks the database a trivial question (readiness, `/readyz`).
    pub async fn ping(&self) -> anyhow::Result<()> {
        sqlx::query("SELECT 1").execute(&self.any).await.context("the database did not answer")?;
        Ok(())
    }

    /// Reports consumer `name` stuck at an event it cannot handle (readiness, `/readyz`).
    pub fn stalled(&self, name: &str, error: &str) {
        self.report(name, error, false);
    }

    /// Reports consumer `name` waiting for the database to come back (readiness): cleared
    /// as soon as it reads again ([`Db::reconnected`]).
    pub fn waiting(&self, name: &str, error: &str) {
        self.report(name, error, true);
    }

    fn report(&self, name: &str, error: &str, transient: bool) {
        if let Ok(mut stalled) = self.signals.stalled.lock() {
            stalled.insert(name.to_owned(), (error.to_owned(), transient));
        }
    }

    /// Clears a stall report; whether there was one.
    pub fn recovered(&self, name: &str) -> bool {
        self.signals.stalled.lock().map(|mut s| s.remove(name).is_some()).unwrap_or(false)
    }

    /// Clears a report of [`Db::waiting`] (not one of an event the consumer cannot apply,
    /// which stays until it gets past the event); whether there was one.
    pub fn reconnected(&self, name: &str) -> bool {
        let Ok(mut stalled) = self.signals.stalled.lock() else { return false };
        if stalled.get(name).is_some_and(|(_, transient)| *transient) {
            stalled.remove(name);
            return true;
        }
        false
    }

    /// The consumers of this process that are stuck or waiting, with their errors.
    pub fn stalled_consumers(&self) -> Vec<(String, String)> {
        self.signals.stalled.lock().map(|s| s.iter().map(|(k, (e, _))| (k.clone(), e.clone())).collect()).unwrap_or_default()
    }

    /// A transaction for a projection's rows and checkpoint. In PostgreSQL its commit does not wait for the disk: a crash can lose only
    /// the consumer's last steps, and it takes them again from the store, since its
    /// checkpoint is in the same transaction. Events are always committed durably.
    pub async fn begin_consumer(&self) -> sqlx::Result<sqlx::Transaction<'static, sqlx::Any>> {
        match self.kind() {
            DbKind::Postgres => self.any.begin_with("BEGIN; SET LOCAL synchronous_commit = off").await,
            DbKind::Sqlite => self.any.begin().await,
        }
    }

    /// The writer's turn (SQLite: one writer at a time, queued here; PostgreSQL: none
    /// needed). Hold it from `begin` to `commit` of a write transaction.
    pub async fn write_turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.signals.write_turn().await
    }

    /// Loads an aggregate's current state (for look-ups before a command).
    pub async fn load<A>(&self, aggregate_id: &str) -> anyhow::Result<A>
    where
        A: Aggregate<Services = ()> + 'static,
    {
        use cqrs_es::EventStore;
        Ok(match &self.typed {
            Typed::Sqlite(pool) => {
                let store = PersistedEventStore::<_, A>::new_event_store(sqlite_es::SqliteEventRepository::new(pool.clone()));
                store.load_aggregate(aggregate_id).await.map_err(|e| anyhow::anyhow!("{e}"))?.aggregate
            }
            Typed::Postgres(pool) => {
                let store = PersistedEventStore::<_, A>::new_event_store(postgres_es::PostgresEventRepository::new(pool.clone()));
                store.load_aggregate(aggregate_id).await.map_err(|e| anyhow::anyhow!("{e}"))?.aggregate
            }
        })
    }

    fn position_expr(&self) -> &'static str {
        match self.kind() {
            DbKind::Sqlite => "rowid",
            DbKind::Postgres => "global_position",
        }
    }

    /// The id and position of an aggregate's latest event.
    pub async fn last_event(&self, aggregate_type: &str, aggregate_id: &str) -> anyhow::Result<Option<(String, i64)>> {
        self.end_event(aggregate_type, aggregate_id, "DESC").await
    }

    /// The id and position of an aggregate's first event.
    pub async fn first_event(&self, aggregate_type: &str, aggregate_id: &str) -> anyhow::Result<Option<(String, i64)>> {
        self.end_event(aggregate_type, aggregate_id, "ASC").await
    }

    /// The id and position of an aggregate's event at one end of its stream (`order`: `ASC`
    /// for the first, `DESC` for the latest).
    async fn end_event(&self, aggregate_type: &str, aggregate_id: &str, order: &str) -> anyhow::Result<Option<(String, i64)>> {
        let sql =
            format!("SELECT sequence, {} FROM events WHERE aggregate_type = $1 AND aggregate_id = $2 ORDER BY sequence {order} LIMIT 1", self.position_expr());
        let row = sqlx::query(&sql).bind(aggregate_type).bind(aggregate_id).fetch_optional(&self.any).await?;
        Ok(match row {
            Some(r) => Some((StoredEvent::event_id_of(aggregate_type, aggregate_id, r.try_get(0)?), r.try_get(1)?)),
            None => None,
        })
    }

    /// Events after `position` in global order, of the given aggregate types (all when
    /// empty), at most `limit`.
    ///
    /// PostgreSQL: only events of transactions older than every transaction still in flight
    /// (`tx_id < pg_snapshot_xmin(pg_current_snapshot())`) are returned, so an event whose
    /// transaction commits after a later position was read is never skipped. SQLite has a
    /// single writer, so positions appear in commit order.
    pub async fn events_after(&self, position: i64, aggregate_types: &[&str], limit: i64) -> anyhow::Result<Vec<StoredEvent>> {
        let pos = self.position_expr();
        let visible = match self.kind() {
            DbKind::Sqlite => "",
            DbKind::Postgres => " AND tx_id < pg_snapshot_xmin(pg_current_snapshot())",
        };
        let types = types_clause(aggregate_types);
        let (tx_id, after) = match self.kind() {
            DbKind::Sqlite => ("0", sqlite_after(&types)),
            DbKind::Postgres => ("CAST(CAST(tx_id AS TEXT) AS BIGINT)", format!("{pos} > $1{visible}{types}")),
        };
        let sql = format!(
            "SELECT aggregate_type, aggregate_id, sequence, {pos}, event_type, event_version, CAST(payload AS TEXT), CAST(metadata AS TEXT), recorded_at_ms, {tx_id}
               FROM events WHERE {after} ORDER BY {pos} LIMIT $2"
        );
        let rows = sqlx::query(&sql).bind(position).bind(limit).fetch_all(&self.any).await?;
        rows.iter().map(row_to_event).collect()
    }

    /// Events after `after` in commit order (see [`Cursor`]), of the given aggregate types
    /// (all when empty), at most `limit`: the gap-safe read every consumer and the relay
    /// use. PostgreSQL returns only events of transactions older than every transaction
    /// still in flight, so nothing can later appear behind the cursor; `held_back` says
    /// that committed events wait for such an older transaction (read again soon). So a
    /// batch shorter than `limit` and not held back holds everything committed so far: a
    /// reader may wait for the appended bell (marked seen before the read) instead of
    /// reading again.
    ///
    /// Both reads find their events in an index from the cursor (PostgreSQL:
    /// `events_type_commit_order` per type, see `pg_after`, or `events_commit_order` for
    /// every type, from the row `(tx_id, global_position)`, ordered by the columns, not by
    /// the selected `tx_id` cast, which shares their name; SQLite:
    /// `events_type_order`, see `sqlite_after`), so a read costs what it returns, not the
    /// size of the store.
    pub async fn read(&self, after: Cursor, aggregate_types: &[&str], limit: i64) -> anyhow::Result<Batch> {
        let types = types_clause(aggregate_types);
        // The process's feeds and relays read on one connection, kept between reads: a
        // connection going back to the pool is tested with a round trip of its own (sqlx),
        // which every read (one per commit, at low load) would pay for. Taken out while
        // in use, so a read cut short (its caller stopped) returns it to the pool, which
        // brings it back to a known state, instead of leaving it here mid-statement.
        let mut kept = self.signals.reader.lock().await;
        let mut conn = match kept.take() {
            Some(conn) => conn,
            None => self.any.acquire().await?,
        };
        let read = match self.kind() {
            DbKind::Sqlite => {
                let sql = format!(
                    "SELECT aggregate_type, aggregate_id, sequence, rowid, event_type, event_version, payload, metadata, recorded_at_ms, 0
                       FROM events WHERE {} ORDER BY rowid",
                    sqlite_after(&types)
                );
                sqlx::query(&sql).bind(after.position).bind(limit).fetch_all(&mut *conn).await
            }
            DbKind::Postgres => sqlx::query(&pg_read_statement(aggregate_types)).bind(after.tx_id).bind(after.position).bind(limit).fetch_all(&mut *conn).await,
        };
        // A failed read's connection goes back to the pool (which tests it) instead.
        let rows = read?;
        *kept = Some(conn);
        drop(kept);
        match self.kind() {
            DbKind::Sqlite => {
                let events = rows.iter().map(row_to_event).collect::<anyhow::Result<Vec<_>>>()?;
                Ok(Batch { events, held_back: false })
            }
            DbKind::Postgres => {
                let held_back = match rows.first() {
                    Some(row) => row.try_get::<bool, _>(10)?,
                    None => false,
                };
                let mut events = Vec::with_capacity(rows.len());
                for row in &rows {
                    if row.try_get::<Option<String>, _>(0)?.is_some() {
                        events.push(row_to_event(row)?);
                    }
                }
                Ok(Batch { events, held_back })
            }
        }
    }

    /// [`Db::read`] for a rebuild, which reads the whole store: the same events, read
    /// through the typed pool, payloads left as text ([`TextEvent`]).
    pub async fn read_text(&self, after: Cursor, aggregate_types: &[&str], limit: i64) -> anyhow::Result<TextBatch> {
        let sql = self.read_sql(aggregate_types);
        let events = match &self.typed {
            Typed::Sqlite(pool) => {
                let rows = sqlx::query(&sql).bind(after.position).bind(limit).fetch_all(pool).await?;
                rows.iter().map(text_event).collect::<anyhow::Result<Vec<_>>>()?
            }
            Typed::Postgres(pool) => {
                let rows = sqlx::query(&sql).bind(after.tx_id).bind(after.position).bind(limit).fetch_all(pool).await?;
                rows.iter().map(text_event).collect::<anyhow::Result<Vec<_>>>()?
            }
        };
        let held_back = events.is_empty() && self.held_back(aggregate_types).await?;
        Ok(TextBatch { events, held_back })
    }

    /// The statement of [`Db::read`]: binds the cursor (SQLite its position, PostgreSQL
    /// `tx_id` then position) and the limit.
    fn read_sql(&self, aggregate_types: &[&str]) -> String {
        let types = types_clause(aggregate_types);
        match self.kind() {
            DbKind::Sqlite => format!(
                "SELECT aggregate_type, aggregate_id, sequence, rowid, event_type, event_version, payload, metadata, recorded_at_ms, 0
                   FROM events WHERE {} ORDER BY rowid",
                sqlite_after(&types)
            ),
            DbKind::Postgres => pg_after(PG_EVENT_COLUMNS, aggregate_types),
        }
    }

    /// PostgreSQL: whether committed events of these types wait for an older transaction
    /// still in flight (see [`Db::read`]); SQLite: never.
    async fn held_back(&self, aggregate_types: &[&str]) -> anyhow::Result<bool> {
        if self.kind() != DbKind::Postgres {
            return Ok(false);
        }
        let sql = format!("SELECT {}", pg_held(aggregate_types));
        Ok(sqlx::query(&sql).fetch_one(&self.any).await?.try_get::<bool, _>(0)?)
    }

    /// One aggregate's history: the events of stream `(aggregate_type, aggregate_id)` and of
    /// every stream of `child_type` whose id starts with `<aggregate_id>/` (its satellites,
    /// such as a Box's `access` streams), in commit order after `after` (see [`Cursor`]),
    /// at most `limit`. Like [`Db::read`], PostgreSQL returns only events of transactions
    /// older than every transaction still in flight, so a page never passes an event that
    /// commits later. The streams are found by the primary key, then sorted: a history costs
    /// what it holds, not the size of the store.
    pub async fn history(&self, aggregate_type: &str, aggregate_id: &str, child_type: &str, after: Cursor, limit: i64) -> anyhow::Result<Vec<StoredEvent>> {
        let prefix = format!("{aggregate_id}/");
        // A literal: the length of our own text, not input.
        let chars = prefix.chars().count();
        let streams = format!("((aggregate_type = $1 AND aggregate_id = $2) OR (aggregate_type = $3 AND substr(aggregate_id, 1, {chars}) = $4))");
        let sql = match self.kind() {
            DbKind::Sqlite => format!(
                "SELECT aggregate_type, aggregate_id, sequence, rowid, event_type, event_version, payload, metadata, recorded_at_ms, 0
                   FROM events WHERE {streams} AND rowid > $6 AND $5 >= 0 ORDER BY rowid LIMIT $7"
            ),
            DbKind::Postgres => format!(
                "SELECT aggregate_type, aggregate_id, sequence, global_position, event_type, event_version, CAST(payload AS TEXT),
                        CAST(metadata AS TEXT), recorded_at_ms, CAST(CAST(tx_id AS TEXT) AS BIGINT)
                   FROM events
                  WHERE {streams}
                    AND (tx_id, global_position) > (CAST(CAST(CAST($5 AS BIGINT) AS TEXT) AS xid8), CAST($6 AS BIGINT))
                    AND tx_id < pg_snapshot_xmin(pg_current_snapshot())
                  ORDER BY events.tx_id, events.global_position LIMIT $7"
            ),
        };
        let rows = sqlx::query(&sql)
            .bind(aggregate_type)
            .bind(aggregate_id)
            .bind(child_type)
            .bind(prefix)
            .bind(after.tx_id)
            .bind(after.position)
            .bind(limit)
            .fetch_all(&self.any)
            .await?;
        rows.iter().map(row_to_event).collect()
    }

    /// `SELECT` of every column [`row_to_event`] reads, from `events` of one stream; the
    /// caller adds its conditions after `aggregate_type = $1 AND aggregate_id = $2`.
    fn select_stream(&self) -> String {
        let (pos, tx_id) = match self.kind() {
            DbKind::Sqlite => ("rowid", "0"),
            DbKind::Postgres => ("global_position", "CAST(CAST(tx_id AS TEXT) AS BIGINT)"),
        };
        format!(
            "SELECT aggregate_type, aggregate_id, sequence, {pos}, event_type, event_version, CAST(payload AS TEXT), CAST(metadata AS TEXT), recorded_at_ms, {tx_id}
               FROM events WHERE aggregate_type = $1 AND aggregate_id = $2"
        )
    }

    /// One stored event by its stream and sequence.
    pub async fn event(&self, aggregate_type: &str, aggregate_id: &str, sequence: i64) -> anyhow::Result<Option<StoredEvent>> {
        let sql = format!("{} AND sequence = $3", self.select_stream());
        let row = sqlx::query(&sql).bind(aggregate_type).bind(aggregate_id).bind(sequence).fetch_optional(&self.any).await?;
        row.as_ref().map(row_to_event).transpose()
    }

    /// Every committed event of one stream, in sequence order. Read directly (not through
    /// the commit-order feed), so an event committed a moment ago is seen whatever else is in
    /// flight.
    pub async fn stream(&self, aggregate_type: &str, aggregate_id: &str) -> anyhow::Result<Vec<StoredEvent>> {
        let sql = format!("{} ORDER BY sequence", self.select_stream());
        let rows = sqlx::query(&sql).bind(aggregate_type).bind(aggregate_id).fetch_all(&self.any).await?;
        rows.iter().map(row_to_event).collect()
    }

    /// How many committed events of `aggregate_types` (all when empty) lie after `after`: how
    /// far a reader at `after` is behind (the metrics' lag).
    pub async fn count_after(&self, after: Cursor, aggregate_types: &[&str]) -> anyhow::Result<i64> {
        let types = types_clause(aggregate_types);
        let row = match self.kind() {
            DbKind::Sqlite => sqlx::query(&format!("SELECT COUNT(*) FROM events WHERE rowid > $1{types}")).bind(after.position).fetch_one(&self.any).await?,
            DbKind::Postgres => {
                let sql = format!(
                    "SELECT COUNT(*) FROM events WHERE (tx_id, global_position) > (CAST(CAST(CAST($1 AS BIGINT) AS TEXT) AS xid8), CAST($2 AS BIGINT)){types}"
                );
                sqlx::query(&sql).bind(after.tx_id).bind(after.position).fetch_one(&self.any).await?
            }
        };
        Ok(row.try_get::<i64, _>(0)?)
    }

    /// Where a reader that wants only what comes next starts: right after the last event
    /// in commit order that [`Db::read`] would return now ([`Cursor::START`] when empty).
    pub async fn head_cursor(&self) -> anyhow::Result<Cursor> {
        let sql = match self.kind() {
            DbKind::Sqlite => "SELECT 0, COALESCE(MAX(rowid), 0) FROM events",
            DbKind::Postgres => {
                "SELECT CAST(CAST(tx_id AS TEXT) AS BIGINT), global_position FROM events
                  WHERE tx_id < pg_snapshot_xmin(pg_current_snapshot())
                  ORDER BY tx_id DESC, global_position DESC LIMIT 1"
            }
        };
        Ok(match sqlx::query(sql).fetch_optional(&self.any).await? {
            Some(row) => Cursor { tx_id: row.try_get::<i64, _>(0)?, position: row.try_get::<i64, _>(1)? },
            None => Cursor::START,
        })
    }

    /// PostgreSQL: a connection of its own, out of the pool (it ends when dropped), for a
    /// session that must outlive one query (an advisory lock, `exclusive.rs`).
    pub async fn pg_connection(&self) -> anyhow::Result<sqlx::PgConnection> {
        match &self.typed {
            Typed::Postgres(pool) => Ok(pool.acquire().await?.detach()),
            Typed::Sqlite(_) => anyhow::bail!("SQLite has no session locks"),
        }
    }

    /// The one number a `SELECT COUNT(*) ...` answers (a read model's count for the metrics).
    pub async fn count(&self, sql: &str) -> anyhow::Result<i64> {
        Ok(sqlx::query(sql).fetch_one(&self.any).await?.try_get::<i64, _>(0)?)
    }

    /// The highest committed position (0 when empty).
    pub async fn head_position(&self) -> anyhow::Result<i64> {
        let sql = format!("SELECT COALESCE(MAX({}), 0) FROM events", self.position_expr());
        Ok(sqlx::query(&sql).fetch_one(&self.any).await?.try_get::<i64, _>(0)?)
    }
}

/// SQLite: the rowids of at most `$2` events after rowid `$1` of the types in `types`,
/// found in `events_type_order` (one entry per event, type then rowid), so a read costs
/// what it returns whether its types are frequent or rare; only those rows are fetched.
/// (Without it SQLite answers a type filter from the primary key index and sorts every
/// stored event of those types, whole, on each read.)
fn sqlite_after(types: &str) -> String {
    format!("rowid IN (SELECT rowid FROM events WHERE rowid > $1{types} ORDER BY rowid LIMIT $2)")
}

/// The columns of a stored event as [`row_to_event`] and [`text_event`] read them, from
/// PostgreSQL (payload and metadata as text, `tx_id` as a number).
const PG_EVENT_COLUMNS: &str = "aggregate_type, aggregate_id, sequence, global_position, event_type, event_version, CAST(payload AS TEXT) AS payload,
     CAST(metadata AS TEXT) AS metadata, recorded_at_ms, CAST(CAST(tx_id AS TEXT) AS BIGINT) AS tx_id";

/// ` AND aggregate_type = '<type>'` for each of `aggregate_types`, once each (none when
/// empty): the branches of a per-type read.
fn each_type(aggregate_types: &[&str]) -> Vec<String> {
    let types: std::collections::BTreeSet<&str> = aggregate_types.iter().copied().collect();
    types.iter().map(|t| format!(" AND aggregate_type = '{}'", t.replace('\'', "''"))).collect()
}

/// The statement [`Db::read`] runs on PostgreSQL (binds: the cursor's `tx_id`, its
/// position, the limit), public so that tests can look at its plan. One round trip: the
/// events, and on every row (on the one row of NULLs when there are none) whether
/// committed events of these types are held back by an older transaction still in flight
/// (the same snapshot).
pub fn pg_read_statement(aggregate_types: &[&str]) -> String {
    let events = pg_after(PG_EVENT_COLUMNS, aggregate_types);
    let held = pg_held(aggregate_types);
    format!(
        "SELECT e.aggregate_type, e.aggregate_id, e.sequence, e.global_position, e.event_type, e.event_version, e.payload, e.metadata,
                e.recorded_at_ms, e.tx_id, h.held
           FROM (SELECT {held} AS held) h
           LEFT JOIN LATERAL ({events}) e ON true
          ORDER BY e.tx_id, e.global_position"
    )
}

/// PostgreSQL: whether committed events of `aggregate_types` (any when empty) wait for an
/// older transaction still in flight (see [`Db::read`]); each type looked up apart in
/// `events_type_commit_order`, as in [`pg_after`] (a list of types let the planner scan the
/// whole table).
fn pg_held(aggregate_types: &[&str]) -> String {
    let exists = |only: &str| format!("EXISTS (SELECT 1 FROM events WHERE tx_id >= pg_snapshot_xmin(pg_current_snapshot()){only})");
    let each = each_type(aggregate_types);
    if each.is_empty() {
        return exists("");
    }
    format!("({})", each.iter().map(|only| exists(only)).collect::<Vec<_>>().join(" OR "))
}

/// PostgreSQL: `columns` (which name `global_position` and a `tx_id`) of the events after
/// the cursor (`$1` its `tx_id`, `$2` its position) of `aggregate_types` (all when empty),
/// in commit order, at most `$3`; only events of transactions older than every transaction
/// still in flight (see [`Db::read`]).
///
/// Each type is read apart, from `events_type_commit_order`, which holds its events in
/// commit order: the read then costs what it returns, whatever the planner's statistics
/// say. (A single statement filtering by type let the planner answer from the primary key
/// when its statistics were stale, as in a young store: every stored event of the types,
/// on every read, a few milliseconds at 5,000 events.)
fn pg_after(columns: &str, aggregate_types: &[&str]) -> String {
    let branch = |only: &str| {
        format!(
            "SELECT {columns} FROM events
              WHERE (tx_id, global_position) > (CAST(CAST(CAST($1 AS BIGINT) AS TEXT) AS xid8), CAST($2 AS BIGINT))
                AND tx_id < pg_snapshot_xmin(pg_current_snapshot()){only}
              ORDER BY events.tx_id, events.global_position LIMIT $3"
        )
    };
    let each = each_type(aggregate_types);
    if each.is_empty() {
        return branch("");
    }
    let branches: Vec<String> = each.iter().map(|only| format!("({})", branch(only))).collect();
    format!("SELECT * FROM ({}) AS by_type ORDER BY by_type.tx_id, by_type.global_position LIMIT $3", branches.join(" UNION ALL "))
}

/// ` AND aggregate_type IN (...)` (nothing when empty). Types are the aggregates' own
/// constants, quoted anyway.
fn types_clause(aggregate_types: &[&str]) -> String {
    if aggregate_types.is_empty() {
        return String::new();
    }
    let list: Vec<String> = aggregate_types.iter().map(|t| format!("'{}'", t.replace('\'', "''"))).collect();
    format!(" AND aggregate_type IN ({})", list.join(", "))
}

/// PostgreSQL's doorbell: `LISTEN` on the channel the events table's trigger notifies at
/// every commit that appended events, ringing the appended bell; reconnects after a
/// failure (ringing once, since a notification may have been missed). While it listens,
/// this process's own commits ring by notification only (see `Signals::listening`); while
/// it does not, they ring locally. Ends with the `Db`.
async fn listen_for_appends(pool: PgPool, signals: std::sync::Weak<Signals>) {
    loop {
        let listener = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
            listener.listen_all([APPENDED_CHANNEL, PROGRESS_CHANNEL]).await?;
            Ok::<_, sqlx::Error>(listener)
        }
        .await;
        match listener {
            Ok(mut listener) => {
                let Some(s) = signals.upgrade() else { return };
                s.listening.store(true, std::sync::atomic::Ordering::Release);
                s.appended.send_modify(Appended::ring_all);
                drop(s);
                loop {
                    let received = tokio::time::timeout(Duration::from_secs(5), listener.try_recv()).await;
                    let Some(s) = signals.upgrade() else { return };
                    match received {
                        Ok(Ok(Some(n))) if n.channel() == PROGRESS_CHANNEL => s.remote_progressed.send_modify(|n| *n = n.wrapping_add(1)),
                        // The payload names the types the transaction appended.
                        Ok(Ok(Some(n))) => s.appended.send_modify(|a| match n.payload() {
                            "" => a.ring_all(),
                            types => types.split(',').for_each(|t| a.ring(t)),
                        }),
                        // The connection was lost and is back, listening again: what was
                        // notified meanwhile is lost, so every reader looks.
                        Ok(Ok(None)) => s.appended.send_modify(Appended::ring_all),
                        Ok(Err(e)) => {
                            s.listening.store(false, std::sync::atomic::Ordering::Release);
                            s.appended.send_modify(Appended::ring_all);
                            tracing::warn!(error = %e, "lost the database's event notifications; reconnecting");
                            break;
                        }
                        Err(_) => {}
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for the database's event notifications; retrying"),
        }
        if signals.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// PostgreSQL: a `FROM` item that makes the transaction it runs in commit without waiting
/// for the WAL flush (`synchronous_commit = off` for that transaction only), so that a
/// single statement outside a transaction block, which is its own transaction, can write a
/// consumer's or relay's checkpoint in one round trip (as [`Db::begin_consumer`] does for a
/// transaction). A crash loses at most the last such writes, which are taken again.
pub const ASYNC_COMMIT: &str = "(SELECT set_config('synchronous_commit', 'off', true)) AS async_commit";

/// The channel the events table notifies on commit (see `POSTGRES_SCHEMA`).
const APPENDED_CHANNEL: &str = "atasira_events";
/// The channel consumers' commits notify (see `POSTGRES_PROGRESS`).
const PROGRESS_CHANNEL: &str = "atasira_progress";

/// The table a `CREATE TABLE IF NOT EXISTS <name> (...)` statement creates.
fn created_table(statement: &str) -> Option<&str> {
    let rest = statement.trim_start().strip_prefix("CREATE TABLE IF NOT EXISTS ")?;
    rest.split(|c: char| c.is_whitespace() || c == '(').find(|s| !s.is_empty())
}

/// For a role that may not create objects: every table `statements` would create must
/// exist; their triggers and functions are the owner's business.
async fn expect_tables(conn: &mut sqlx::AnyConnection, statements: &[&str]) -> anyhow::Result<()> {
    let mut missing = Vec::new();
    for table in statements.iter().filter_map(|s| created_table(s)) {
        let exists: bool = sqlx::query("SELECT to_regclass($1) IS NOT NULL").bind(table).fetch_one(&mut *conn).await?.try_get(0)?;
        if !exists {
            missing.push(table);
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let user: String = sqlx::query("SELECT CAST(current_user AS TEXT)").fetch_one(&mut *conn).await?.try_get(0)?;
    anyhow::bail!(
        "table(s) {} do not exist, and database role {user:?} may not create them: run `atasira db prepare --database-url <URL>` with the role \
         that owns the schema first",
        missing.join(", ")
    )
}

/// A row of the store's event statements (the columns of [`Db::read_sql`]).
fn text_event<R: Row>(row: &R) -> anyhow::Result<TextEvent>
where
    usize: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(TextEvent {
        aggregate_type: row.try_get(0)?,
        aggregate_id: row.try_get(1)?,
        sequence: row.try_get(2)?,
        position: row.try_get(3)?,
        event_type: row.try_get(4)?,
        event_version: row.try_get(5)?,
        payload: row.try_get(6)?,
        metadata: row.try_get(7)?,
        recorded_at_ms: row.try_get(8)?,
        tx_id: row.try_get(9)?,
    })
}

/// A row of the store's event statements, through the Any pool.
fn row_to_event(row: &AnyRow) -> anyhow::Result<StoredEvent> {
    text_event(row)?.into_stored()
}

/// Hides a password in a database URL for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let creds = &url[scheme + 3..at];
            match creds.find(':') {
                Some(colon) => format!("{}{}:***{}", &url[..scheme + 3], &creds[..colon], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// What the platform's unit tests share: a store in a directory of its own, and a draft
/// submission to put an event in it.
#[cfg(test)]
pub(crate) mod testing {
    use super::Db;

    /// An embedded store in a fresh temporary directory, removed on drop.
    pub(crate) struct TempDb {
        pub(crate) db: Db,
        dir: std::path::PathBuf,
    }

    impl TempDb {
        pub(crate) async fn new() -> TempDb {
            let dir = std::env::temp_dir().join(format!("atasira-platform-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir_all(&dir).expect("dir");
            let db = Db::connect(&Db::sqlite_url(&dir)).await.expect("db");
            TempDb { db, dir }
        }
    }

    impl Drop for TempDb {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// An agent's submission of draft `id` (its box_type is the id too).
    pub(crate) fn submit(id: &str) -> atasira_domain::aggregates::draft::DraftCommand {
        let plan = atasira_domain::draft_request::BoxDraftCreateRequest::from_value(serde_json::json!({"box_type": id, "purpose": "p"}))
            .and_then(|r| r.plan())
            .expect("plan");
        let agent = atasira_domain::Principal::new("agent-1", atasira_domain::Role::Member, atasira_domain::Kind::Agent);
        atasira_domain::aggregates::draft::DraftCommand::Submit { draft_id: id.into(), plan, requested_by: agent, at: chrono::Utc::now() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use atasira_domain::aggregates::types;

    #[test]
    fn r_arch_6_a_reader_wakes_for_the_types_it_reads_and_sleeps_through_the_others() {
        // given readers of drafts and of Boxes
        let mut appended = Appended::default();
        let (drafts, boxes) = (appended.of(&[types::DRAFT]), appended.of(&[types::BOX, types::ACCESS]));
        // when a draft is appended, then only the drafts reader sees a change
        appended.ring(types::DRAFT);
        assert_ne!(appended.of(&[types::DRAFT]), drafts);
        assert_eq!(appended.of(&[types::BOX, types::ACCESS]), boxes);
        // when something unknown (or everything) was appended, then every reader looks
        let boxes = appended.of(&[types::BOX, types::ACCESS]);
        appended.ring("a type from a newer version");
        assert_ne!(appended.of(&[types::BOX, types::ACCESS]), boxes);
        let (drafts, all) = (appended.of(&[types::DRAFT]), appended.of(&[]));
        appended.ring_all();
        assert_ne!(appended.of(&[types::DRAFT]), drafts);
        assert_ne!(appended.of(&[]), all);
    }

    #[test]
    fn r_box_9_what_a_consumer_committed_is_remembered_within_a_window() {
        // given a consumer that processed more events than the window holds
        let mut consumed = Consumed::default();
        let ids: Vec<String> = (0..Consumed::RECENT + 10).map(|i| format!("draft/d{i}/1")).collect();
        for (i, id) in ids.iter().enumerate() {
            consumed.record(Cursor { tx_id: 0, position: i as i64 + 1 }, [id.as_str()]);
        }
        // then the latest are known, the oldest left the window (the store answers for them)
        assert!(consumed.recent.contains(ids.last().expect("ids")));
        assert!(!consumed.recent.contains(&ids[0]));
        assert_eq!(consumed.recent.len(), Consumed::RECENT);
        // and the cursor never goes back
        consumed.record(Cursor { tx_id: 0, position: 3 }, []);
        assert_eq!(consumed.cursor.position, ids.len() as i64);
    }

    #[tokio::test]
    async fn r_arch_4_an_embedded_command_says_what_it_appended_and_a_taken_sequence_conflicts() {
        use atasira_domain::aggregates::draft::{Draft, DraftCommand};
        use atasira_domain::{Kind, Principal, Role};
        // given the embedded store
        let store = testing::TempDb::new().await;
        let db = &store.db;
        let agent = Principal::new("agent-1", Role::Member, Kind::Agent);
        // when a draft is submitted and withdrawn; then each command names its event and its position, as the store has them
        let cqrs = db.cqrs::<Draft>();
        let submitted = cqrs.execute_new("d1", testing::submit("d1"), HashMap::new()).await.expect("submit");
        let withdrawn = cqrs.execute("d1", DraftCommand::Withdraw { by: agent.clone(), at: chrono::Utc::now() }, HashMap::new()).await.expect("withdraw");
        assert_eq!(submitted.last(), db.first_event(types::DRAFT, "d1").await.expect("read"));
        assert_eq!(withdrawn.last(), db.last_event(types::DRAFT, "d1").await.expect("read"));
        assert_eq!(withdrawn.last().map(|(id, _)| id).as_deref(), Some("draft/d1/2"));
        // and a command on a stream it believes new, which is not, conflicts and appends nothing
        let again = cqrs.execute_new("d1", testing::submit("d1"), HashMap::new()).await;
        assert!(matches!(again, Err(cqrs_es::AggregateError::AggregateConflict)), "{again:?}");
        assert_eq!(db.stream(types::DRAFT, "d1").await.expect("read").len(), 2);
    }

    /// Submits each of `ids` at once while the test holds the writer's turn, then lets
    /// the writer go; each submission's outcome, in the order of `ids`.
    async fn submit_while_the_writer_is_busy(
        db: &Db,
        ids: &[&str],
    ) -> Vec<Result<Committed, cqrs_es::AggregateError<atasira_domain::aggregates::draft::DraftError>>> {
        use atasira_domain::aggregates::draft::Draft;
        let turn = db.write_turn().await;
        let tasks: Vec<_> = ids
            .iter()
            .map(|id| {
                let (db, id) = (db.clone(), (*id).to_owned());
                tokio::spawn(async move { db.cqrs::<Draft>().execute_new(&id, testing::submit(&id), HashMap::new()).await })
            })
            .collect();
        // Every submission reaches the appender while the writer is busy.
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(turn);
        let mut outcomes = Vec::new();
        for task in tasks {
            outcomes.push(task.await.expect("joined"));
        }
        outcomes
    }

    #[tokio::test]
    async fn r_arch_4_embedded_commands_waiting_for_the_writer_are_written_together_and_each_learns_its_own_outcome() {
        // given the embedded store, its writer busy while twenty drafts are submitted
        let store = testing::TempDb::new().await;
        let db = &store.db;
        let ids: Vec<String> = (0..20).map(|i| format!("g{i}")).collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        let outcomes = submit_while_the_writer_is_busy(db, &ids).await;
        // then they are written in one commit, and each is told its own event and position
        assert_eq!(db.appends_per_commit(), (1, 20), "twenty submissions, one commit");
        for (id, outcome) in ids.iter().zip(outcomes) {
            assert_eq!(outcome.expect("submitted").last(), db.first_event(types::DRAFT, id).await.expect("read"), "{id}");
        }
        // when a group holds two submissions of one draft
        let outcomes = submit_while_the_writer_is_busy(db, &["h1", "h2", "h1", "h3"]).await;
        // then exactly one of those conflicts, and the others are stored, each told its own
        let conflicts = outcomes.iter().filter(|o| matches!(o, Err(cqrs_es::AggregateError::AggregateConflict))).count();
        assert_eq!(conflicts, 1, "{outcomes:?}");
        for (id, outcome) in ["h1", "h2", "h1", "h3"].iter().zip(outcomes) {
            if let Ok(committed) = outcome {
                assert_eq!(committed.last(), db.first_event(types::DRAFT, id).await.expect("read"), "{id}");
            }
        }
        assert_eq!(db.count("SELECT COUNT(*) FROM events WHERE aggregate_type = 'draft'").await.expect("count"), 23);
    }

    #[tokio::test]
    async fn r_arch_6_reads_cut_short_leave_the_next_read_whole() {
        use atasira_domain::aggregates::draft::Draft;
        // given a store with a few drafts
        let store = testing::TempDb::new().await;
        let db = &store.db;
        for i in 0..5 {
            let id = format!("r{i}");
            db.cqrs::<Draft>().execute_new(&id, testing::submit(&id), HashMap::new()).await.expect("submit");
        }
        let whole = db.read(Cursor::START, &[types::DRAFT], 10).await.expect("read").events;
        assert_eq!(whole.len(), 5);
        // when reads are cut short at every point they can be
        for micros in [0, 1, 5, 20, 50, 100, 200, 500, 1000] {
            let _ = tokio::time::timeout(Duration::from_micros(micros), db.read(Cursor::START, &[types::DRAFT], 10)).await;
        }
        // then the next read answers as a whole one did, on the connection the reads keep
        assert_eq!(db.read(Cursor::START, &[types::DRAFT], 10).await.expect("read").events, whole);
        assert_eq!(db.read(Cursor::of(&whole[2]), &[types::DRAFT], 10).await.expect("read").events, whole[3..].to_vec());
    }
}
