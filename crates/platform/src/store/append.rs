//! Commands: the one way a service changes the store. [`Cqrs::execute`] loads the stream,
//! lets the aggregate decide, appends what it decided, retries a conflict (someone else
//! appended to the stream first) on fresh state as the [`Retry`] says, records the
//! metrics, rings the bell of the type it wrote, and always answers a [`Receipt`]: the
//! events appended and the stream's head, even when the command appended nothing. A
//! refusal of the aggregate is answered with its own code; a store failure is ours
//! (`internal`), or `service_unavailable` while the database is away.
//!
//! The store owns its schema (see [`super::schema`]): the rows are written here and
//! streams loaded here, with cqrs-es's `Aggregate` trait as the aggregates' shape.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use atasira_domain::{ErrorCode, Refusing};
use cqrs_es::Aggregate;
use sqlx::{Row, SqlitePool};

use super::recent::{Recent, Recorded};
use super::{ASYNC_COMMIT, Db, DbKind, StoredEvent, Typed};
use crate::refusal::Refusal;

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
    /// A stream several processes may write at once (keys published at start-up, a
    /// binding's expiry beside its claim): a few retries on fresh state, then 409.
    pub const FEW: Retry = Retry { attempts: 4, backoff: Duration::from_millis(5), max_backoff: Duration::from_millis(50), exhausted: ErrorCode::Conflict };
    /// A stream every approval writes (the box_type namespace): patient, then 503 busy.
    pub const CONTENDED: Retry = Retry { attempts: 200, backoff: Duration::from_millis(2), max_backoff: Duration::from_millis(50), exhausted: ErrorCode::Busy };
}

/// Where one stored event stands: its id (`<type>/<id>/<sequence>`) and global position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventAt {
    pub id: String,
    pub position: i64,
}

/// An event's id and position, as a refusal that recorded it names them.
impl From<EventAt> for (String, i64) {
    fn from(event: EventAt) -> (String, i64) {
        (event.id, event.position)
    }
}

/// What a command did: the events it appended, in order, and the stream's head after it
/// (its last appended event; when it appended nothing, the stream's last event as loaded;
/// `None` only for a stream that holds nothing).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Receipt {
    pub events: Vec<EventAt>,
    pub head: Option<EventAt>,
}

impl Receipt {
    /// The stream's head, which a caller's read-your-writes wait names; a stream that holds
    /// nothing after a command is a failure of ours.
    pub fn head(&self) -> Result<EventAt, Refusal> {
        self.head.clone().ok_or_else(|| Refusal::internal("the command's stream holds no event"))
    }

    /// Whether the command appended anything.
    pub fn appended(&self) -> bool {
        !self.events.is_empty()
    }
}

/// A condition the store checks in the statement that appends a new stream's events: a
/// boolean SQL expression over the store's tables, its parameters written `{0}`, `{1}`, ...
/// (bound as text: cast them in the expression). The events are stored, and the request's
/// principal assertion admitted, only if it holds. Saves the command a read before it
/// decides (the drafts service's: is there a Box of this box_type, and is the policy the
/// one it decided by).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Precondition {
    pub condition: String,
    pub params: Vec<String>,
}

impl Precondition {
    /// The condition with its parameters numbered from `$first`.
    fn sql(&self, first: usize) -> String {
        (0..self.params.len()).rev().fold(self.condition.clone(), |sql, i| sql.replace(&format!("{{{i}}}"), &format!("${}", first + i)))
    }
}

/// Why one attempt of a command failed.
enum Failure<E> {
    /// The aggregate refused.
    Refused(E),
    /// Someone else appended to the stream first.
    Conflict,
    /// The request's principal assertion was admitted before (PostgreSQL): nothing stored.
    Replayed,
    /// The append's [`Precondition`] did not hold: nothing stored, nothing admitted.
    Unmet,
    Store(anyhow::Error),
}

/// Commands of aggregate `A` on the shared store (cheap; make one where needed).
pub struct Cqrs<A> {
    db: Db,
    aggregate: PhantomData<fn() -> A>,
}

impl<A: Aggregate> std::fmt::Debug for Cqrs<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cqrs<{}>", A::TYPE)
    }
}

impl<A> Cqrs<A>
where
    A: Aggregate<Services = ()>,
    A::Error: Refusing,
{
    /// Runs `command` on stream `aggregate_id`, retrying conflicts as `retry` says.
    pub async fn execute(&self, aggregate_id: &str, command: A::Command, metadata: HashMap<String, String>, retry: Retry) -> Result<Receipt, Refusal>
    where
        A::Command: Clone,
    {
        let mut delay = retry.backoff;
        for attempt in 1..=retry.attempts.max(1) {
            match self.attempt(aggregate_id, command.clone(), metadata.clone(), false, None).await {
                Ok(receipt) => return Ok(receipt),
                Err(Failure::Conflict) if attempt < retry.attempts => {
                    if !delay.is_zero() {
                        let jitter = Duration::from_micros(u64::from(uuid::Uuid::new_v4().as_fields().1) % 3000);
                        tokio::time::sleep(delay + jitter).await;
                        delay = (delay * 2).min(retry.max_backoff);
                    }
                }
                Err(Failure::Conflict) => break,
                Err(other) => return Err(Self::refusal(aggregate_id, other)),
            }
        }
        Err(match retry.exhausted {
            ErrorCode::Busy => Refusal::new(ErrorCode::Busy, "too many concurrent changes right now; retry in a moment"),
            code => Refusal::new(code, "a concurrent change to the same thing was recorded first; retry"),
        })
    }

    /// Runs `command` on a stream this process has just named (a fresh UUID, or an id
    /// derived from an idempotency key), which holds no events yet: nothing is loaded. Should
    /// the stream exist after all, the append conflicts: answered `conflict`, not retried.
    pub async fn execute_new(&self, aggregate_id: &str, command: A::Command, metadata: HashMap<String, String>) -> Result<Receipt, Refusal> {
        self.attempt(aggregate_id, command, metadata, true, None).await.map_err(|f| Self::refusal(aggregate_id, f))
    }

    /// [`Cqrs::execute_new`], whose events are stored only if `precondition` holds:
    /// `Ok(None)` when it did not (nothing stored, the request's assertion not admitted).
    /// The store checks it in the statement that appends: PostgreSQL's for this command,
    /// SQLite's for the group it is appended with ([`append_in_groups`]).
    pub async fn execute_new_if(
        &self,
        aggregate_id: &str,
        command: A::Command,
        metadata: HashMap<String, String>,
        precondition: &Precondition,
    ) -> Result<Option<Receipt>, Refusal> {
        match self.attempt(aggregate_id, command, metadata, true, Some(precondition)).await {
            Ok(receipt) => Ok(Some(receipt)),
            Err(Failure::Unmet) => Ok(None),
            Err(f) => Err(Self::refusal(aggregate_id, f)),
        }
    }

    fn refusal(aggregate_id: &str, failure: Failure<A::Error>) -> Refusal {
        match failure {
            Failure::Refused(e) => e.into(),
            Failure::Conflict => Refusal::new(ErrorCode::Conflict, "a concurrent change to the same thing was recorded first; retry"),
            Failure::Replayed => Refusal::replayed(),
            Failure::Unmet => Refusal::internal("an append's precondition was not checked by its caller"),
            Failure::Store(e) => Refusal::store(crate::failure::is_transient(&e), format!("{} {aggregate_id}: {e:#}", A::TYPE)),
        }
    }

    async fn attempt(
        &self,
        aggregate_id: &str,
        command: A::Command,
        metadata: HashMap<String, String>,
        new_stream: bool,
        precondition: Option<&Precondition>,
    ) -> Result<Receipt, Failure<A::Error>> {
        // The command's trace context travels with its events to every consumer (R-OPS-1).
        let mut metadata = metadata;
        crate::trace::inject(|k, v| {
            metadata.insert(k.to_owned(), v);
        });
        let started = std::time::Instant::now();
        let writer = &self.db.writer;
        let result = match (&writer.appends, new_stream) {
            // SQLite, a stream with nothing to load: the appender takes the writer's turn
            // for this append and the others waiting.
            (Some(appends), true) => self.decide_and_append(aggregate_id, command, &metadata, Appender::Grouped { appends, precondition }).await,
            // Otherwise the load and the append hold the turn (SQLite), so commands of this
            // process on one stream never conflict.
            _ => {
                let turn = writer.turn().await;
                let result = self.decide_and_append(aggregate_id, command, &metadata, Appender::Direct { new_stream, precondition }).await;
                drop(turn);
                result
            }
        };
        let metrics = crate::metrics::global();
        metrics.append_seconds.get_or_create(&crate::metrics::AggregateLabel { aggregate_type: A::TYPE.to_owned() }).observe(started.elapsed().as_secs_f64());
        if let Ok(receipt) = &result
            && receipt.appended()
        {
            // Every security violation is a command on a `<service>_security` aggregate.
            if let Some(service) = A::TYPE.strip_suffix("_security") {
                metrics.security_violations.get_or_create(&crate::metrics::ServiceLabel { service: service.replace('_', "-") }).inc();
            }
            self.db.bells.committed(A::TYPE);
        }
        result
    }

    async fn decide_and_append(
        &self,
        aggregate_id: &str,
        command: A::Command,
        metadata: &HashMap<String, String>,
        appender: Appender<'_>,
    ) -> Result<Receipt, Failure<A::Error>> {
        let new_stream = match appender {
            Appender::Direct { new_stream, .. } => new_stream,
            Appender::Grouped { .. } => true,
        };
        let (mut aggregate, sequence, head) =
            if new_stream { (A::default(), 0, None) } else { self.db.load_stream::<A>(aggregate_id).await.map_err(Failure::Store)? };
        let sink = cqrs_es::event_sink::EventSink::default();
        aggregate.handle(command, &(), &sink).await.map_err(Failure::Refused)?;
        let events = sink.collect().await;
        let Some(rows) = AppendRows::of::<A>(aggregate_id, sequence, &events, metadata).map_err(|e| Failure::Store(e.into()))? else {
            return Ok(Receipt { events: Vec::new(), head });
        };
        let stored = match (appender, &self.db.typed) {
            (Appender::Grouped { appends, precondition }, _) => {
                let events = rows.parse().map_err(|e| Failure::Store(e.into()))?;
                let (reply, answer) = tokio::sync::oneshot::channel();
                if appends.send(AppendJob { rows, events, precondition: precondition.cloned(), reply }).is_err() {
                    return Err(Failure::Store(anyhow::anyhow!("the store's appender has stopped")));
                }
                match answer.await.unwrap_or_else(|_| Err(sqlx::Error::PoolClosed)) {
                    // A statement stores a command's rows all or none: none, its condition did not hold.
                    Ok(stored) if stored.is_empty() && precondition.is_some() => return Err(Failure::Unmet),
                    stored => stored,
                }
            }
            // The writer's turn is held (`attempt`): recorded before the next append.
            (Appender::Direct { precondition, .. }, Typed::Sqlite(pool)) => {
                // A condition comes only with a new stream, which goes to the group appender.
                if precondition.is_some() {
                    return Err(Failure::Store(anyhow::anyhow!("SQLite checks an append's condition only for a new stream")));
                }
                let events = rows.parse().map_err(|e| Failure::Store(e.into()))?;
                insert_rows!(pool, Dialect::Sqlite, &[&rows]).map(|stored| {
                    self.db.writer.recent.committed(placed(events, &stored));
                    positions(&stored)
                })
            }
            // The request's principal assertion is admitted for the cluster in the same
            // statement: a replayed command stores nothing (`admission`); so is the
            // precondition checked.
            (Appender::Direct { precondition, .. }, Typed::Postgres(pool)) => {
                let mut conn = self.db.kept_pg.take(pool).await.map_err(|e| Failure::Store(e.into()))?;
                let admitting = crate::admission::pending();
                let notify = self.db.bells.notifies();
                let appended = match (precondition, admitting) {
                    (Some(precondition), _) => guarded_insert(&mut conn, &rows, notify, admitting, precondition).await,
                    (None, Some((tag, expires_at_ms))) => insert_rows!(&mut *conn, &rows, notify, admitting & tag, expires_at_ms)
                        .map(|stored| if stored.is_empty() { Outcome::Replayed } else { Outcome::Stored(stored) }),
                    (None, None) => insert_rows!(&mut *conn, Dialect::Postgres { notify }, &[&rows]).map(Outcome::Stored),
                };
                if appended.is_ok() {
                    conn.keep();
                }
                match appended {
                    Ok(Outcome::Unmet) => return Err(Failure::Unmet),
                    Ok(Outcome::Replayed) => {
                        crate::admission::settle(false);
                        return Err(Failure::Replayed);
                    }
                    Ok(Outcome::Stored(stored)) => {
                        if admitting.is_some() {
                            crate::admission::settle(true);
                        }
                        Ok(positions(&stored))
                    }
                    Err(e) => Err(e),
                }
            }
        };
        let mut committed = stored.map_err(|e| match &e {
            sqlx::Error::Database(d) if d.is_unique_violation() => Failure::Conflict,
            _ => Failure::Store(e.into()),
        })?;
        committed.sort_unstable();
        let events: Vec<EventAt> =
            committed.into_iter().map(|(sequence, position)| EventAt { id: StoredEvent::event_id_of(A::TYPE, aggregate_id, sequence), position }).collect();
        Ok(Receipt { head: events.last().cloned(), events })
    }
}

/// How a command's events reach the store.
enum Appender<'a> {
    /// Appended by the command itself; `new_stream`: the stream holds nothing yet, so
    /// nothing is loaded; stored only if the `precondition` holds (PostgreSQL).
    Direct { new_stream: bool, precondition: Option<&'a Precondition> },
    /// SQLite, a new stream: handed to the group appender ([`append_in_groups`]), stored
    /// only if the `precondition` holds.
    Grouped { appends: &'a tokio::sync::mpsc::UnboundedSender<AppendJob>, precondition: Option<&'a Precondition> },
}

/// Who writes commands' events in this process: SQLite allows one writer at a time, so
/// writers queue for its turn (instead of retrying on `SQLITE_BUSY`, which backs off in
/// sleeps of up to 100 ms), and commands on new streams hand their appends to the group
/// appender; PostgreSQL needs neither.
pub(super) struct Writer {
    turn: Option<Arc<tokio::sync::Mutex<()>>>,
    appends: Option<tokio::sync::mpsc::UnboundedSender<AppendJob>>,
    /// What the group appender wrote so far.
    grouped: Arc<Grouped>,
    /// SQLite: the events this process appended lately, for its feeds.
    pub(super) recent: Arc<Recent>,
}

impl Writer {
    /// The writer of a store; for SQLite (given its typed pool) the turn, and the task
    /// that appends commands' events in groups.
    pub(super) fn new(sqlite: Option<SqlitePool>) -> Arc<Writer> {
        let turn = sqlite.as_ref().map(|_| Arc::new(tokio::sync::Mutex::new(())));
        let grouped = Arc::new(Grouped::default());
        let recent = Arc::new(Recent::default());
        let appends = sqlite.zip(turn.clone()).map(|(pool, turn)| {
            let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
            tokio::spawn(append_in_groups(pool, turn, rx, grouped.clone(), recent.clone()));
            tx
        });
        Arc::new(Writer { turn, appends, grouped, recent })
    }

    async fn turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        match &self.turn {
            Some(turn) => Some(turn.clone().lock_owned().await),
            None => None,
        }
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

    /// The events as a feed reads them back: payload and metadata parsed from the very text
    /// stored; positions and times are the store's, filled in by [`placed`].
    fn parse(&self) -> serde_json::Result<Vec<Recorded>> {
        let metadata: Arc<serde_json::Value> = Arc::new(serde_json::from_str(&self.metadata)?);
        let mut events = Vec::with_capacity(self.rows.len());
        for (sequence, event_type, event_version, payload) in &self.rows {
            let event = StoredEvent {
                event_id: StoredEvent::event_id_of(self.aggregate_type, &self.aggregate_id, *sequence),
                aggregate_type: self.aggregate_type.to_owned(),
                aggregate_id: self.aggregate_id.clone(),
                sequence: *sequence,
                position: 0,
                tx_id: 0,
                event_type: event_type.clone(),
                event_version: event_version.clone(),
                payload: Arc::new(serde_json::from_str(payload)?),
                metadata: metadata.clone(),
                recorded_at_ms: 0,
            };
            events.push(Recorded { event, bytes: payload.len() + self.metadata.len() });
        }
        Ok(events)
    }
}

/// `events` (of one stream, from [`AppendRows::parse`]) with the position and time the
/// store gave each (`stored`: the rows stored for that stream). An event without its row
/// is left out: the record then has a hole there, and feeds read the store past it.
fn placed<R: Borrow<StoredRow>>(events: Vec<Recorded>, stored: &[R]) -> Vec<Recorded> {
    events
        .into_iter()
        .filter_map(|mut recorded| {
            let row = stored.iter().map(Borrow::borrow).find(|r| r.sequence == recorded.event.sequence)?;
            recorded.event.position = row.position;
            recorded.event.recorded_at_ms = row.recorded_at_ms;
            Some(recorded)
        })
        .collect()
}

/// The statement that appends `rows` rows in one go (a statement outside a transaction
/// block is its own atomic transaction: all rows or none), returning each row's stream,
/// sequence and position (PostgreSQL's `global_position`, SQLite's rowid). PostgreSQL's
/// casts the payload and metadata for its `json` columns and may notify ([`notification`]).
/// A sequence another writer took first fails the statement: the optimistic-concurrency
/// conflict, as in postgres-es and sqlite-es.
fn insert_statement(rows: usize, dialect: Dialect) -> String {
    let (position, json, notify) = match dialect {
        Dialect::Sqlite => ("rowid", false, false),
        Dialect::Postgres { notify } => ("global_position", true, notify),
    };
    format!(
        "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata) VALUES {}
         RETURNING aggregate_type, aggregate_id, sequence, {position}, recorded_at_ms{}",
        insert_values(rows, json),
        notification(notify)
    )
}

/// How an append statement is written: for SQLite, or for PostgreSQL, whose statement
/// notifies at commit unless the process rings a doorbell of its own (`Db::ring_over_nats`).
#[derive(Clone, Copy)]
enum Dialect {
    Sqlite,
    Postgres { notify: bool },
}

/// PostgreSQL's notification by the statement that appends (`notify`: for a process
/// without a doorbell of its own, such as the command line): on the channel every process
/// listens to (`bells`), naming the aggregate type of each row. It is delivered at commit,
/// once per type (PostgreSQL folds a transaction's repeats), and not at all for a
/// statement that stored nothing. An extra column of the returned rows.
fn notification(notify: bool) -> String {
    if notify { format!(", pg_notify('{}', aggregate_type)", super::bells::APPENDED_CHANNEL) } else { String::new() }
}

/// The VALUES of [`insert_statement`]: seven parameters per row, from `$1`.
fn insert_values(rows: usize, json: bool) -> String {
    values_from(1, rows, json)
}

/// The VALUES of `rows` rows, seven parameters each, from `$first`.
fn values_from(first: usize, rows: usize, json: bool) -> String {
    let (open, close) = if json { ("CAST(", " AS json)") } else { ("", "") };
    let values: Vec<String> = (0..rows)
        .map(|i| first + 7 * i)
        .map(|k| format!("(${k}, ${}, ${}, ${}, ${}, {open}${}{close}, {open}${}{close})", k + 1, k + 2, k + 3, k + 4, k + 5, k + 6))
        .collect();
    values.join(", ")
}

/// [`insert_statement`] for PostgreSQL that also admits a principal assertion for the
/// cluster (its tag and expiry are the last two parameters): the rows are stored only if
/// the tag is new, so a replayed command stores nothing and returns no rows.
fn admitted_insert_statement(rows: usize, notify: bool) -> String {
    let tag = 7 * rows + 1;
    format!(
        "WITH admitted AS (INSERT INTO assertion_replay (tag, expires_at_ms) VALUES (${tag}, ${}) ON CONFLICT (tag) DO NOTHING RETURNING tag)
         INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata)
         SELECT v.* FROM (VALUES {}) AS v (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata)
         WHERE EXISTS (SELECT 1 FROM admitted)
         RETURNING aggregate_type, aggregate_id, sequence, global_position, recorded_at_ms{}",
        tag + 1,
        insert_values(rows, true),
        notification(notify)
    )
}

/// What an append statement on PostgreSQL did.
enum Outcome {
    Stored(Vec<StoredRow>),
    /// Its precondition did not hold ([`guarded_insert`]): nothing stored, nothing admitted.
    Unmet,
    /// The assertion it carried was admitted before: nothing stored.
    Replayed,
}

/// PostgreSQL: appends `rows` in one statement only if `precondition` holds (and, when
/// `admitting`, the assertion's tag is new, admitted in the same statement). The statement
/// always returns a row, which says whether the precondition held, so a failed condition is
/// told from a replay.
async fn guarded_insert(
    conn: &mut sqlx::PgConnection,
    rows: &AppendRows,
    notify: bool,
    admitting: Option<([u8; 32], i64)>,
    precondition: &Precondition,
) -> Result<Outcome, sqlx::Error> {
    let mut next = 7 * rows.rows.len() + 1;
    let admission = admitting.map(|_| {
        let (tag, expires) = (next, next + 1);
        next += 2;
        format!(
            "admitted AS (INSERT INTO assertion_replay (tag, expires_at_ms) SELECT ${tag}, ${expires} WHERE (SELECT ok FROM guard)
               ON CONFLICT (tag) DO NOTHING RETURNING tag),"
        )
    });
    let allowed = if admission.is_some() { "EXISTS (SELECT 1 FROM admitted)" } else { "(SELECT ok FROM guard)" };
    let sql = format!(
        "WITH guard AS (SELECT COALESCE(({}), false) AS ok), {}
         stored AS (INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata)
           SELECT v.* FROM (VALUES {}) AS v (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata)
           WHERE {allowed}
           RETURNING aggregate_type, aggregate_id, sequence, global_position, recorded_at_ms{})
         SELECT s.*, g.ok AS guard_ok FROM guard g LEFT JOIN stored s ON true",
        precondition.sql(next),
        admission.unwrap_or_default(),
        insert_values(rows.rows.len(), true),
        notification(notify)
    );
    let mut query = bind_rows(sqlx::query(&sql), &[rows]);
    if let Some((tag, expires_at_ms)) = admitting {
        query = query.bind(hex::encode(tag)).bind(expires_at_ms);
    }
    for param in &precondition.params {
        query = query.bind(param.as_str());
    }
    let returned = query.fetch_all(&mut *conn).await?;
    let Some(first) = returned.first() else { return Err(sqlx::Error::RowNotFound) };
    if first.try_get::<Option<i64>, _>(2)?.is_none() {
        return Ok(if first.try_get::<bool, _>("guard_ok")? { Outcome::Replayed } else { Outcome::Unmet });
    }
    Ok(Outcome::Stored(returned.iter().map(StoredRow::read).collect::<Result<_, _>>()?))
}

/// Binds the seven parameters of each row of `appends`, in order.
fn bind_rows<'q, DB>(
    mut query: sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>,
    appends: &[&'q AppendRows],
) -> sqlx::query::Query<'q, DB, <DB as sqlx::Database>::Arguments<'q>>
where
    DB: sqlx::Database,
    &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
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
    query
}

/// Runs [`insert_statement`] for `appends` on `$pool` (in `$dialect`): the stream,
/// sequence and position of every row stored.
macro_rules! insert_rows {
    ($pool:expr, $dialect:expr, $appends:expr) => {{
        let appends: &[&AppendRows] = $appends;
        let sql = insert_statement(appends.iter().map(|a| a.rows.len()).sum(), $dialect);
        insert_rows!(@run $pool, &sql, appends)
    }};
    // PostgreSQL: one append that also admits an assertion ([`admitted_insert_statement`]).
    ($pool:expr, $append:expr, $notify:expr, admitting $tag:expr, $expires_at_ms:expr) => {{
        let appends: &[&AppendRows] = &[$append];
        let sql = admitted_insert_statement(appends[0].rows.len(), $notify);
        insert_rows!(@run $pool, &sql, appends, hex::encode($tag), $expires_at_ms)
    }};
    (@run $pool:expr, $sql:expr, $appends:expr $(, $extra:expr)*) => {{
        let appends: &[&AppendRows] = $appends;
        let query = bind_rows(sqlx::query($sql), appends);
        $(let query = query.bind($extra);)*
        query.fetch_all($pool).await.and_then(|stored| stored.iter().map(StoredRow::read).collect::<Result<Vec<_>, sqlx::Error>>())
    }};
}
use insert_rows;

/// One row [`insert_rows`] stored.
struct StoredRow {
    aggregate_type: String,
    aggregate_id: String,
    sequence: i64,
    position: i64,
    recorded_at_ms: i64,
}

impl StoredRow {
    /// The row as an append statement returns it: stream, sequence, position, time.
    fn read<'r, R: Row>(r: &'r R) -> Result<StoredRow, sqlx::Error>
    where
        usize: sqlx::ColumnIndex<R>,
        String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
        i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    {
        Ok(StoredRow {
            aggregate_type: r.try_get(0)?,
            aggregate_id: r.try_get(1)?,
            sequence: r.try_get(2)?,
            position: r.try_get(3)?,
            recorded_at_ms: r.try_get(4)?,
        })
    }

    fn of(&self, rows: &AppendRows) -> bool {
        self.aggregate_type == rows.aggregate_type && self.aggregate_id == rows.aggregate_id
    }
}

/// The sequence and position of each row [`insert_rows`] stored for one stream.
fn positions<R: Borrow<StoredRow>>(stored: &[R]) -> Vec<(i64, i64)> {
    stored.iter().map(Borrow::borrow).map(|r| (r.sequence, r.position)).collect()
}

/// A command's append handed to the group appender, and where its outcome goes: the
/// sequence and position of each row (none: its precondition did not hold).
struct AppendJob {
    rows: AppendRows,
    /// The same events, parsed ([`AppendRows::parse`]), recorded once stored.
    events: Vec<Recorded>,
    /// Its rows are stored only if this holds.
    precondition: Option<Precondition>,
    reply: tokio::sync::oneshot::Sender<Result<Vec<(i64, i64)>, sqlx::Error>>,
}

/// SQLite: appends the jobs' rows in one statement (one transaction), each job's only if its
/// precondition holds (checked on the store as it was before the statement), and returns
/// the stream, sequence and position of every row stored. Rows of jobs without a condition
/// are one `VALUES` list; each job with one is a `SELECT` of its own rows `WHERE` it holds,
/// joined by `UNION ALL`, so a job whose condition fails gets no rows back.
async fn append_jobs(pool: &SqlitePool, jobs: &[&AppendJob]) -> Result<Vec<StoredRow>, sqlx::Error> {
    let rows: Vec<&AppendRows> = jobs.iter().map(|j| &j.rows).collect();
    if jobs.iter().all(|j| j.precondition.is_none()) {
        return insert_rows!(pool, Dialect::Sqlite, &rows);
    }
    let sql = guarded_group_statement(jobs);
    let mut query = bind_rows(sqlx::query(&sql), &rows);
    for param in jobs.iter().filter_map(|j| j.precondition.as_ref()).flat_map(|p| &p.params) {
        query = query.bind(param.as_str());
    }
    query.fetch_all(pool).await?.iter().map(StoredRow::read).collect()
}

/// The statement of [`append_jobs`] when a job has a precondition: every job's rows take
/// their parameters in job order ([`bind_rows`]), the conditions' parameters come after.
fn guarded_group_statement(jobs: &[&AppendJob]) -> String {
    let mut next_row = 1;
    let mut next_param = 1 + 7 * jobs.iter().map(|j| j.rows.rows.len()).sum::<usize>();
    let (mut plain, mut selects) = (Vec::new(), Vec::new());
    for job in jobs {
        let values = values_from(next_row, job.rows.rows.len(), false);
        next_row += 7 * job.rows.rows.len();
        match &job.precondition {
            None => plain.push(values),
            Some(p) => {
                selects.push(format!("SELECT * FROM (VALUES {values}) WHERE COALESCE(({}), 0)", p.sql(next_param)));
                next_param += p.params.len();
            }
        }
    }
    // After the guarded ones: a command decided on an assumption gets a position before
    // what it could not have seen.
    if !plain.is_empty() {
        selects.push(format!("SELECT * FROM (VALUES {})", plain.join(", ")));
    }
    format!(
        "INSERT INTO events (aggregate_type, aggregate_id, sequence, event_type, event_version, payload, metadata) {}
         RETURNING aggregate_type, aggregate_id, sequence, rowid, recorded_at_ms",
        selects.join(" UNION ALL ")
    )
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
/// turn and a trip each; an append with a precondition is stored only if it holds
/// ([`append_jobs`]). Should that statement fail (a stream another command took first,
/// or anything else), every append of the group is written alone, so each learns its own
/// outcome. Runs until the store's handles are gone.
async fn append_in_groups(
    pool: SqlitePool,
    turn: Arc<tokio::sync::Mutex<()>>,
    mut jobs: tokio::sync::mpsc::UnboundedReceiver<AppendJob>,
    grouped: Arc<Grouped>,
    recent: Arc<Recent>,
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
            _ => append_jobs(&pool, &group.iter().collect::<Vec<_>>()).await.ok(),
        };
        match together {
            Some(stored) => {
                // Recorded in position order while the turn is held: no append between.
                let mut events: Vec<Recorded> = Vec::new();
                let mut replies = Vec::with_capacity(group.len());
                for job in group {
                    let own: Vec<&StoredRow> = stored.iter().filter(|r| r.of(&job.rows)).collect();
                    events.extend(placed(job.events, &own));
                    replies.push((job.reply, positions(&own)));
                }
                events.sort_unstable_by_key(|r| r.event.position);
                recent.committed(events);
                drop(held);
                grouped.wrote(1, replies.len());
                for (reply, own) in replies {
                    let _ = reply.send(Ok(own));
                }
            }
            None => {
                grouped.wrote(group.len(), group.len());
                for job in group {
                    let stored = append_jobs(&pool, &[&job]).await.map(|stored| {
                        recent.committed(placed(job.events, &stored));
                        positions(&stored)
                    });
                    let _ = job.reply.send(stored);
                }
                drop(held);
            }
        }
    }
}

impl Db {
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

    /// Commands of aggregate `A` on this store.
    pub fn cqrs<A: Aggregate>(&self) -> Cqrs<A> {
        Cqrs { db: self.clone(), aggregate: PhantomData }
    }

    /// SQLite: how many commits the commands on new streams took so far, and how many
    /// commands they held (more commands than commits: commands written together).
    pub fn appends_per_commit(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.writer.grouped.commits.load(Relaxed), self.writer.grouped.appends.load(Relaxed))
    }

    /// The writer's turn (SQLite: one writer at a time, queued here; PostgreSQL: none
    /// needed). Hold it from `begin` to `commit` of a write transaction.
    pub async fn write_turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        self.writer.turn().await
    }

    /// An aggregate's current state (for look-ups before a command).
    pub async fn load<A: Aggregate>(&self, aggregate_id: &str) -> anyhow::Result<A> {
        Ok(self.load_stream::<A>(aggregate_id).await?.0)
    }

    /// An aggregate's current state with its stream's head (`None`: the stream holds
    /// nothing).
    pub async fn load_with_head<A: Aggregate>(&self, aggregate_id: &str) -> anyhow::Result<(A, Option<EventAt>)> {
        let (aggregate, _, head) = self.load_stream::<A>(aggregate_id).await?;
        Ok((aggregate, head))
    }

    /// Replays stream `aggregate_id` of `A`: the state, the last sequence, and the last
    /// event. Read through the writers' pool (SQLite: the one writer connection, whose page
    /// cache holds what commands touch).
    async fn load_stream<A: Aggregate>(&self, aggregate_id: &str) -> anyhow::Result<(A, usize, Option<EventAt>)> {
        let position = match self.kind() {
            DbKind::Sqlite => "rowid",
            DbKind::Postgres => "global_position",
        };
        let sql = format!("SELECT sequence, {position}, CAST(payload AS TEXT) FROM events WHERE aggregate_type = $1 AND aggregate_id = $2 ORDER BY sequence");
        let rows: Vec<(i64, i64, String)> = match &self.typed {
            Typed::Sqlite(pool) => sqlx::query_as(&sql).bind(A::TYPE).bind(aggregate_id).fetch_all(pool).await?,
            Typed::Postgres(pool) => {
                let mut conn = self.kept_pg.take(pool).await?;
                let rows = sqlx::query_as(&sql).bind(A::TYPE).bind(aggregate_id).fetch_all(&mut *conn).await?;
                conn.keep();
                rows
            }
        };
        let mut aggregate = A::default();
        for (sequence, _, payload) in &rows {
            let event: A::Event =
                serde_json::from_str(payload).map_err(|e| anyhow::anyhow!("{} {aggregate_id} event {sequence} does not decode: {e}", A::TYPE))?;
            aggregate.apply(event);
        }
        let head = rows.last().map(|(sequence, position, _)| EventAt { id: StoredEvent::event_id_of(A::TYPE, aggregate_id, *sequence), position: *position });
        let sequence = rows.last().map_or(0, |(sequence, _, _)| usize::try_from(*sequence).unwrap_or(0));
        Ok((aggregate, sequence, head))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing;
    use atasira_domain::aggregates::types;

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
        let withdrawn =
            cqrs.execute("d1", DraftCommand::Withdraw { by: agent.clone(), at: chrono::Utc::now() }, HashMap::new(), Retry::ONCE).await.expect("withdraw");
        assert_eq!(submitted.head, db.first_event(types::DRAFT, "d1").await.expect("read"));
        assert_eq!(submitted.events, Vec::from_iter(submitted.head.clone()));
        assert_eq!(withdrawn.head, db.last_event(types::DRAFT, "d1").await.expect("read"));
        assert_eq!(withdrawn.head.as_ref().map(|e| e.id.as_str()), Some("draft/d1/2"));
        // and a command on a stream it believes new, which is not, conflicts and appends nothing
        let again = cqrs.execute_new("d1", testing::submit("d1"), HashMap::new()).await;
        assert!(matches!(&again, Err(r) if r.code == ErrorCode::Conflict), "{again:?}");
        assert_eq!(db.stream(types::DRAFT, "d1").await.expect("read").len(), 2);
    }

    #[tokio::test]
    async fn r_arch_4_a_command_that_appends_nothing_still_names_the_head_of_its_stream() {
        use atasira_domain::aggregates::draft::{Draft, DraftCommand};
        // given a pending draft
        let store = testing::TempDb::new().await;
        let db = &store.db;
        let cqrs = db.cqrs::<Draft>();
        let submitted = cqrs.execute_new("d2", testing::submit("d2"), HashMap::new()).await.expect("submit");
        // when the expiry sweep looks at it long before it is due (the aggregate decides nothing)
        let expire = DraftCommand::Expire { now: chrono::Utc::now(), ttl: chrono::TimeDelta::days(7) };
        let receipt = cqrs.execute("d2", expire, HashMap::new(), Retry::ONCE).await.expect("nothing to do");
        // then the receipt appends nothing and names the stream's last event, as loaded
        assert!(receipt.events.is_empty());
        assert_eq!(receipt.head, submitted.head);
        // and the state loaded with it is the draft's
        let (draft, head) = db.load_with_head::<Draft>("d2").await.expect("load");
        assert!(draft.data.is_some());
        assert_eq!(head, submitted.head);
        // and a stream that holds nothing has no head
        assert_eq!(db.load_with_head::<Draft>("none").await.expect("load").1, None);
    }

    #[tokio::test]
    async fn a_command_appended_if_a_condition_holds_stores_nothing_when_it_does_not() {
        use atasira_domain::aggregates::draft::Draft;
        // given the embedded store, and a condition that no draft stream of a given id exists
        let store = testing::TempDb::new().await;
        let db = &store.db;
        let cqrs = db.cqrs::<Draft>();
        let absent = |id: &str| Precondition {
            condition: "NOT EXISTS (SELECT 1 FROM events WHERE aggregate_type = 'draft' AND aggregate_id = {0}) AND CAST({1} AS bigint) = 7".into(),
            params: vec![id.to_owned(), "7".into()],
        };
        cqrs.execute_new("other", testing::submit("other"), HashMap::new()).await.expect("submit");
        // when a draft is submitted on condition that "other" is absent: nothing is stored
        let unmet = cqrs.execute_new_if("c1", testing::submit("c1"), HashMap::new(), &absent("other")).await;
        assert!(matches!(unmet, Ok(None)), "{unmet:?}");
        assert!(db.stream(types::DRAFT, "c1").await.expect("read").is_empty());
        // when on condition that "none" is absent: stored, and the receipt names it
        let met = cqrs.execute_new_if("c1", testing::submit("c1"), HashMap::new(), &absent("none")).await.expect("met");
        assert_eq!(met.map(|r| r.head), Some(db.first_event(types::DRAFT, "c1").await.expect("read")));
        // and the condition's placeholders are numbered after each other, not confused
        assert_eq!(absent("x").sql(3), "NOT EXISTS (SELECT 1 FROM events WHERE aggregate_type = 'draft' AND aggregate_id = $3) AND CAST($4 AS bigint) = 7");
    }

    /// Submits each of `ids` at once while the test holds the writer's turn, then lets
    /// the writer go; each submission's outcome, in the order of `ids`.
    async fn submit_while_the_writer_is_busy(db: &Db, ids: &[&str]) -> Vec<Result<Receipt, Refusal>> {
        let submissions = ids.iter().map(|id| (*id, None)).collect::<Vec<_>>();
        let outcomes = submit_if_while_the_writer_is_busy(db, &submissions).await;
        outcomes.into_iter().map(|o| o.map(|r| r.expect("an append without a condition is stored or refused"))).collect()
    }

    /// [`submit_while_the_writer_is_busy`], each submission appended only if its condition
    /// (if any) holds.
    async fn submit_if_while_the_writer_is_busy(db: &Db, submissions: &[(&str, Option<Precondition>)]) -> Vec<Result<Option<Receipt>, Refusal>> {
        use atasira_domain::aggregates::draft::Draft;
        let turn = db.write_turn().await;
        let tasks: Vec<_> = submissions
            .iter()
            .map(|(id, condition)| {
                let (db, id, condition) = (db.clone(), (*id).to_owned(), condition.clone());
                tokio::spawn(async move {
                    let cqrs = db.cqrs::<Draft>();
                    match condition {
                        Some(condition) => cqrs.execute_new_if(&id, testing::submit(&id), HashMap::new(), &condition).await,
                        None => cqrs.execute_new(&id, testing::submit(&id), HashMap::new()).await.map(Some),
                    }
                })
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
            assert_eq!(outcome.expect("submitted").head, db.first_event(types::DRAFT, id).await.expect("read"), "{id}");
        }
        // when a group holds two submissions of one draft
        let outcomes = submit_while_the_writer_is_busy(db, &["h1", "h2", "h1", "h3"]).await;
        // then exactly one of those conflicts, and the others are stored, each told its own
        let conflicts = outcomes.iter().filter(|o| matches!(o, Err(r) if r.code == ErrorCode::Conflict)).count();
        assert_eq!(conflicts, 1, "{outcomes:?}");
        for (id, outcome) in ["h1", "h2", "h1", "h3"].iter().zip(outcomes) {
            if let Ok(committed) = outcome {
                assert_eq!(committed.head, db.first_event(types::DRAFT, id).await.expect("read"), "{id}");
            }
        }
        assert_eq!(db.count("SELECT COUNT(*) FROM events WHERE aggregate_type = 'draft'").await.expect("count"), 23);
    }

    #[tokio::test]
    async fn r_arch_4_embedded_commands_appended_together_are_each_stored_only_if_their_condition_holds() {
        // given the embedded store holding the draft "taken", and a condition that a draft
        // stream of some id is absent
        let store = testing::TempDb::new().await;
        let db = &store.db;
        db.cqrs::<atasira_domain::aggregates::draft::Draft>().execute_new("taken", testing::submit("taken"), HashMap::new()).await.expect("submit");
        let absent = |id: &str| {
            Some(Precondition {
                condition: "NOT EXISTS (SELECT 1 FROM events WHERE aggregate_type = 'draft' AND aggregate_id = {0})".into(),
                params: vec![id.to_owned()],
            })
        };
        let (commits, appends) = db.appends_per_commit();
        // when submissions with and without conditions wait for the writer together
        let submissions = [("u1", None), ("c1", absent("taken")), ("c2", absent("none")), ("c3", absent("u1")), ("u2", None), ("c4", absent("taken"))];
        let outcomes = submit_if_while_the_writer_is_busy(db, &submissions).await;
        // then they are written in one commit: those whose condition held, and those with none
        assert_eq!(db.appends_per_commit(), (commits + 1, appends + 6), "one group");
        let stored: Vec<bool> = outcomes.iter().map(|o| o.as_ref().expect("no refusal").is_some()).collect();
        // (a condition sees the store as it was before the group: "u1" was not there yet)
        assert_eq!(stored, [true, false, true, true, true, false]);
        for ((id, _), outcome) in submissions.iter().zip(&outcomes) {
            let head = db.first_event(types::DRAFT, id).await.expect("read");
            assert_eq!(outcome.as_ref().ok().and_then(Option::as_ref).map(|r| r.head.clone()), head.map(Some), "{id}: told what the store holds");
        }
        // when a group fails as a whole (a stream taken twice in it), each append is written alone,
        // its condition still checked
        let submissions = [("d1", absent("taken")), ("d2", None), ("d2", None), ("d3", absent("none"))];
        let outcomes = submit_if_while_the_writer_is_busy(db, &submissions).await;
        assert!(matches!(outcomes[0], Ok(None)), "{:?}", outcomes[0]);
        assert_eq!(outcomes[1..3].iter().filter(|o| matches!(o, Err(r) if r.code == ErrorCode::Conflict)).count(), 1, "{outcomes:?}");
        assert!(matches!(outcomes[3], Ok(Some(_))), "{:?}", outcomes[3]);
        assert_eq!(db.count("SELECT COUNT(*) FROM events WHERE aggregate_type = 'draft'").await.expect("count"), 7);
    }
}
