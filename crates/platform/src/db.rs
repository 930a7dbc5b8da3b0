//! The one database: the shared event store (R-ARCH-1) plus each component's own tables.
//!
//! Two pools point at the same database: a typed one for cqrs-es (postgres-es or
//! sqlite-es need `Pool<Postgres>` / `Pool<Sqlite>`) and an `Any` pool for everything this
//! project writes itself, so that projection, checkpoint and token SQL is written once for
//! both backends (`$n` placeholders work on both).

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use cqrs_es::persist::PersistedEventStore;
use cqrs_es::{Aggregate, CqrsFramework};
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
    appended: watch::Sender<u64>,
    progressed: watch::Sender<u64>,
    /// SQLite allows one writer at a time; writers queue here instead of retrying on
    /// `SQLITE_BUSY` (which backs off in sleeps of up to 100 ms).
    writer: Option<Arc<tokio::sync::Mutex<()>>>,
    /// Consumers of this process that cannot get past an event: name -> the error.
    stalled: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
}

impl Signals {
    fn new(kind: DbKind) -> Arc<Signals> {
        Arc::new(Signals {
            appended: watch::channel(0).0,
            progressed: watch::channel(0).0,
            writer: (kind == DbKind::Sqlite).then(|| Arc::new(tokio::sync::Mutex::new(()))),
            stalled: Default::default(),
        })
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

/// cqrs-es over either backend (`EventStore` is not object safe, hence the enum).
enum Framework<A: Aggregate<Services = ()>> {
    Sqlite(CqrsFramework<A, PersistedEventStore<sqlite_es::SqliteEventRepository, A>>),
    Postgres(CqrsFramework<A, PersistedEventStore<postgres_es::PostgresEventRepository, A>>),
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
    ) -> Result<(), cqrs_es::AggregateError<A::Error>> {
        let turn = match &self.signals.writer {
            Some(writer) => Some(writer.clone().lock_owned().await),
            None => None,
        };
        let result = self.cqrs.execute(aggregate_id, command, metadata).await;
        drop(turn);
        if result.is_ok() {
            self.signals.appended.send_modify(|n| *n = n.wrapping_add(1));
        }
        result
    }
}

impl<A: Aggregate<Services = ()>> std::fmt::Debug for Framework<A> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cqrs<{}>", A::TYPE)
    }
}

impl<A: Aggregate<Services = ()>> Framework<A> {
    async fn execute(
        &self,
        aggregate_id: &str,
        command: A::Command,
        metadata: std::collections::HashMap<String, String>,
    ) -> Result<(), cqrs_es::AggregateError<A::Error>> {
        match self {
            Framework::Sqlite(c) => c.execute_with_metadata(aggregate_id, command, metadata).await,
            Framework::Postgres(c) => c.execute_with_metadata(aggregate_id, command, metadata).await,
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
    // Readers follow commit order (see `Cursor`).
    "CREATE INDEX IF NOT EXISTS events_commit_order ON events (tx_id, global_position)",
    // The doorbell: one notification per committing transaction that appended events
    // (PostgreSQL folds repeats within a transaction), delivered at commit.
    "CREATE OR REPLACE FUNCTION atasira_events_notify() RETURNS trigger LANGUAGE plpgsql AS
        $$ BEGIN PERFORM pg_notify('atasira_events', ''); RETURN NULL; END $$",
    "DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_trigger WHERE tgname = 'events_notify') THEN
            CREATE TRIGGER events_notify AFTER INSERT ON events
                FOR EACH STATEMENT EXECUTE FUNCTION atasira_events_notify();
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

/// Checkpoint tables of stores created before checkpoints were cursors.
const CURSOR_COLUMNS: &[&str] = &["projection_checkpoints", "relay_checkpoints"];

impl Db {
    /// Connects to `postgres://...` or `sqlite://...`, creating what the event store needs.
    pub async fn connect(url: &str) -> anyhow::Result<Db> {
        sqlx::any::install_default_drivers();
        let db = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let pool = PgPoolOptions::new()
                .max_connections(8)
                .acquire_timeout(Duration::from_secs(10))
                .connect(url)
                .await
                .with_context(|| format!("failed to connect to {}", redact(url)))?;
            let any = AnyPoolOptions::new().max_connections(8).connect(url).await.context("failed to open the Any pool")?;
            let signals = Signals::new(DbKind::Postgres);
            tokio::spawn(listen_for_appends(pool.clone(), Arc::downgrade(&signals)));
            Db { typed: Typed::Postgres(pool), any, signals }
        } else if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(10))
                .foreign_keys(true);
            let pool = SqlitePoolOptions::new().max_connections(4).connect_with(options).await.with_context(|| format!("failed to open {url}"))?;
            let any = AnyPoolOptions::new()
                .max_connections(4)
                .after_connect(|conn, _| {
                    Box::pin(async move {
                        sqlx::query("PRAGMA busy_timeout = 10000").execute(&mut *conn).await?;
                        Ok(())
                    })
                })
                .connect(url)
                .await
                .context("failed to open the Any pool")?;
            Db { typed: Typed::Sqlite(pool), any, signals: Signals::new(DbKind::Sqlite) }
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
        let all: Vec<&str> = schema.iter().chain(COMMON_SCHEMA).copied().collect();
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
            Typed::Sqlite(pool) => {
                Framework::Sqlite(CqrsFramework::new(PersistedEventStore::new_event_store(sqlite_es::SqliteEventRepository::new(pool.clone())), vec![], ()))
            }
            Typed::Postgres(pool) => Framework::Postgres(CqrsFramework::new(
                PersistedEventStore::new_event_store(postgres_es::PostgresEventRepository::new(pool.clone())),
                vec![],
                (),
            )),
        };
        Cqrs { cqrs, signals: self.signals.clone() }
    }

    /// Rings the appended bell: events were committed (by this process; the store's own
    /// commands ring it themselves).
    pub fn appended(&self) {
        self.signals.appended.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// The appended bell: changes after events were committed.
    pub fn on_append(&self) -> watch::Receiver<u64> {
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

    /// Reports consumer `name` stuck at an event it cannot handle (health, `/healthz`).
    pub fn stalled(&self, name: &str, error: &str) {
        if let Ok(mut stalled) = self.signals.stalled.lock() {
            stalled.insert(name.to_owned(), error.to_owned());
        }
    }

    /// Clears a stall report; whether there was one.
    pub fn recovered(&self, name: &str) -> bool {
        self.signals.stalled.lock().map(|mut s| s.remove(name).is_some()).unwrap_or(false)
    }

    /// The consumers of this process that are stuck, with their errors.
    pub fn stalled_consumers(&self) -> Vec<(String, String)> {
        self.signals.stalled.lock().map(|s| s.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default()
    }

    /// The writer's turn (SQLite: one writer at a time, queued here; PostgreSQL: none
    /// needed). Hold it from `begin` to `commit` of a write transaction.
    pub async fn write_turn(&self) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        match &self.signals.writer {
            Some(writer) => Some(writer.clone().lock_owned().await),
            None => None,
        }
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
        let sql =
            format!("SELECT sequence, {} FROM events WHERE aggregate_type = $1 AND aggregate_id = $2 ORDER BY sequence DESC LIMIT 1", self.position_expr());
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
        let (tx_id, events) = match self.kind() {
            DbKind::Sqlite => ("0", SQLITE_IN_ORDER),
            DbKind::Postgres => ("CAST(CAST(tx_id AS TEXT) AS BIGINT)", "events"),
        };
        let sql = format!(
            "SELECT aggregate_type, aggregate_id, sequence, {pos}, event_type, event_version, CAST(payload AS TEXT), CAST(metadata AS TEXT), recorded_at_ms, {tx_id}
               FROM {events} WHERE {pos} > $1{visible}{types} ORDER BY {pos} LIMIT $2"
        );
        let rows = sqlx::query(&sql).bind(position).bind(limit).fetch_all(&self.any).await?;
        rows.iter().map(row_to_event).collect()
    }

    /// Events after `after` in commit order (see [`Cursor`]), of the given aggregate types
    /// (all when empty), at most `limit`: the gap-safe read every consumer and the relay
    /// use. PostgreSQL returns only events of transactions older than every transaction
    /// still in flight, so nothing can later appear behind the cursor; `held_back` says
    /// that committed events wait for such an older transaction (read again soon).
    ///
    /// Both reads walk an index from the cursor (PostgreSQL: `events_commit_order` from
    /// the row `(tx_id, global_position)`, ordered by the columns, not by the selected
    /// `tx_id` cast, which shares their name; SQLite: the rowid), so a read costs what it
    /// returns, not the size of the store.
    pub async fn read(&self, after: Cursor, aggregate_types: &[&str], limit: i64) -> anyhow::Result<Batch> {
        let types = types_clause(aggregate_types);
        let rows = match self.kind() {
            DbKind::Sqlite => {
                let sql = format!(
                    "SELECT aggregate_type, aggregate_id, sequence, rowid, event_type, event_version, payload, metadata, recorded_at_ms, 0
                       FROM {SQLITE_IN_ORDER} WHERE rowid > $1{types} ORDER BY rowid LIMIT $2"
                );
                sqlx::query(&sql).bind(after.position).bind(limit).fetch_all(&self.any).await?
            }
            DbKind::Postgres => {
                let sql = format!(
                    "SELECT aggregate_type, aggregate_id, sequence, global_position, event_type, event_version, CAST(payload AS TEXT),
                            CAST(metadata AS TEXT), recorded_at_ms, CAST(CAST(tx_id AS TEXT) AS BIGINT)
                       FROM events
                      WHERE (tx_id, global_position) > (CAST(CAST(CAST($1 AS BIGINT) AS TEXT) AS xid8), CAST($2 AS BIGINT))
                        AND tx_id < pg_snapshot_xmin(pg_current_snapshot()){types}
                      ORDER BY events.tx_id, events.global_position LIMIT $3"
                );
                sqlx::query(&sql).bind(after.tx_id).bind(after.position).bind(limit).fetch_all(&self.any).await?
            }
        };
        let events = rows.iter().map(row_to_event).collect::<anyhow::Result<Vec<_>>>()?;
        let held_back = if self.kind() == DbKind::Postgres && (events.len() as i64) < limit {
            let sql = format!("SELECT EXISTS (SELECT 1 FROM events WHERE tx_id >= pg_snapshot_xmin(pg_current_snapshot()){types})");
            sqlx::query(&sql).fetch_one(&self.any).await?.try_get::<bool, _>(0)?
        } else {
            false
        };
        Ok(Batch { events, held_back })
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

    /// One stored event by its stream and sequence.
    pub async fn event(&self, aggregate_type: &str, aggregate_id: &str, sequence: i64) -> anyhow::Result<Option<StoredEvent>> {
        let (pos, tx_id) = match self.kind() {
            DbKind::Sqlite => ("rowid", "0"),
            DbKind::Postgres => ("global_position", "CAST(CAST(tx_id AS TEXT) AS BIGINT)"),
        };
        let sql = format!(
            "SELECT aggregate_type, aggregate_id, sequence, {pos}, event_type, event_version, CAST(payload AS TEXT), CAST(metadata AS TEXT), recorded_at_ms, {tx_id}
               FROM events WHERE aggregate_type = $1 AND aggregate_id = $2 AND sequence = $3"
        );
        let row = sqlx::query(&sql).bind(aggregate_type).bind(aggregate_id).bind(sequence).fetch_optional(&self.any).await?;
        row.as_ref().map(row_to_event).transpose()
    }

    /// The highest committed position (0 when empty).
    pub async fn head_position(&self) -> anyhow::Result<i64> {
        let sql = format!("SELECT COALESCE(MAX({}), 0) FROM events", self.position_expr());
        Ok(sqlx::query(&sql).fetch_one(&self.any).await?.try_get::<i64, _>(0)?)
    }
}

/// The events table for reads in position order in SQLite: walked by rowid from the
/// cursor. Without `NOT INDEXED`, SQLite answers a type filter from the primary key index
/// (type, id, sequence) and sorts every event of those types by rowid on each read, so a
/// consumer's read costs as much as the store is large.
const SQLITE_IN_ORDER: &str = "events NOT INDEXED";

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
/// failure (ringing once, since a notification may have been missed). Ends with the `Db`.
async fn listen_for_appends(pool: PgPool, signals: std::sync::Weak<Signals>) {
    loop {
        let listener = async {
            let mut listener = sqlx::postgres::PgListener::connect_with(&pool).await?;
            listener.listen(APPENDED_CHANNEL).await?;
            Ok::<_, sqlx::Error>(listener)
        }
        .await;
        match listener {
            Ok(mut listener) => {
                let Some(s) = signals.upgrade() else { return };
                s.appended.send_modify(|n| *n = n.wrapping_add(1));
                drop(s);
                loop {
                    let received = tokio::time::timeout(Duration::from_secs(5), listener.recv()).await;
                    let Some(s) = signals.upgrade() else { return };
                    match received {
                        Ok(Ok(_)) => s.appended.send_modify(|n| *n = n.wrapping_add(1)),
                        Ok(Err(e)) => {
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

/// The channel the events table notifies on commit (see `POSTGRES_SCHEMA`).
const APPENDED_CHANNEL: &str = "atasira_events";

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

fn row_to_event(row: &AnyRow) -> anyhow::Result<StoredEvent> {
    let aggregate_type: String = row.try_get(0)?;
    let aggregate_id: String = row.try_get(1)?;
    let sequence: i64 = row.try_get(2)?;
    let payload: String = row.try_get(6)?;
    let metadata: String = row.try_get(7)?;
    Ok(StoredEvent {
        event_id: StoredEvent::event_id_of(&aggregate_type, &aggregate_id, sequence),
        aggregate_type,
        aggregate_id,
        sequence,
        position: row.try_get(3)?,
        tx_id: row.try_get(9)?,
        event_type: row.try_get(4)?,
        event_version: row.try_get(5)?,
        payload: serde_json::from_str(&payload)?,
        metadata: serde_json::from_str(&metadata)?,
        recorded_at_ms: row.try_get(8)?,
    })
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
