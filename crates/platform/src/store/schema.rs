//! The store's schema, owned here alone: the events table of both databases, its
//! append-only triggers, PostgreSQL's policy of who may append what, and the tables every
//! consumer shares (checkpoints, processed sets, dead letters, the replay table).

use sqlx::Row;

use super::{Db, DbKind};

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
    // The database holds it with a row-level security policy on inserts, planned into the
    // append statement itself (an insert trigger ran a PL/pgSQL function per row, which
    // cost each command's commit tens of microseconds, ADR 3). Every role reads every
    // event. The owner (who is not listed) bypasses the policies; no other role may alter,
    // disable or drop them, and a session that turns `row_security` off can append nothing.
    "DO $$ BEGIN
        IF NOT EXISTS (SELECT 1 FROM pg_policy WHERE polname = 'events_readable' AND polrelid = 'events'::regclass) THEN
            CREATE POLICY events_readable ON events FOR SELECT USING (true);
        END IF;
        IF NOT EXISTS (SELECT 1 FROM pg_policy WHERE polname = 'events_appended_by_their_writers' AND polrelid = 'events'::regclass) THEN
            CREATE POLICY events_appended_by_their_writers ON events FOR INSERT WITH CHECK (
                NOT EXISTS (SELECT 1 FROM event_writers w WHERE w.role = current_user::text)
                OR EXISTS (SELECT 1 FROM event_writers w WHERE w.role = current_user::text AND w.aggregate_type = events.aggregate_type
                    AND (w.event_type IS NULL OR w.event_type = events.event_type)));
        END IF;
        IF NOT (SELECT relrowsecurity FROM pg_class WHERE oid = 'events'::regclass) THEN
            ALTER TABLE events ENABLE ROW LEVEL SECURITY;
        END IF;
    END $$",
    // Readers follow commit order (see `Cursor`).
    "CREATE INDEX IF NOT EXISTS events_commit_order ON events (tx_id, global_position)",
    // A reader of some aggregate types finds its events in commit order per type, whatever
    // the planner believes about how the types are spread (see `pg_after`).
    "CREATE INDEX IF NOT EXISTS events_type_commit_order ON events (aggregate_type, tx_id, global_position)",
    // The doorbell is rung by the append statement itself (`store::append`), so no trigger
    // runs on an insert. Stores prepared by an older version had an insert trigger for the
    // writers' check and a statement trigger for the doorbell: dropped once the policies
    // above hold (only the owner may; another role leaves them, which then cost only time).
    "DO $$ BEGIN
        DROP TRIGGER IF EXISTS events_writer_check ON events;
        DROP FUNCTION IF EXISTS atasira_events_writer_check();
        DROP TRIGGER IF EXISTS events_notify_types ON events;
        DROP TRIGGER IF EXISTS events_notify ON events;
        DROP FUNCTION IF EXISTS atasira_events_notify();
    EXCEPTION WHEN insufficient_privilege THEN NULL;
    END $$",
];

/// PostgreSQL: stores prepared by an older version notified a progress channel at every
/// commit of a consumer (for the waits of replicas standing by, which now look in the
/// store while they wait): those triggers go, since every notification wakes every
/// listening session of the database. Only the tables' owner may drop them; another role
/// leaves them (they then cost only time) for the owner's `atasira db prepare`.
const POSTGRES_NO_PROGRESS: &[&str] = &["DO $$ BEGIN
        DROP TRIGGER IF EXISTS processed_notify ON projection_processed;
        DROP TRIGGER IF EXISTS checkpoint_notify ON projection_checkpoints;
        DROP FUNCTION IF EXISTS atasira_progress_notify();
    EXCEPTION WHEN insufficient_privilege THEN NULL;
    END $$"];

/// Tables every component shares the shape of: projection checkpoints and processed sets.
/// A checkpoint is a [`Cursor`]: `(tx_id, position)`.
const COMMON_SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS projection_checkpoints (name TEXT PRIMARY KEY, position BIGINT NOT NULL, tx_id BIGINT NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS projection_processed (name TEXT NOT NULL, event_id TEXT NOT NULL, PRIMARY KEY (name, event_id))",
    "CREATE TABLE IF NOT EXISTS relay_checkpoints (name TEXT PRIMARY KEY, position BIGINT NOT NULL, tx_id BIGINT NOT NULL DEFAULT 0)",
    "CREATE TABLE IF NOT EXISTS relay_dead_letters (name TEXT NOT NULL, event_id TEXT NOT NULL, position BIGINT NOT NULL, reason TEXT NOT NULL,
        recorded_at_ms BIGINT NOT NULL, PRIMARY KEY (name, event_id))",
    // The execution hosts the registry heard from, each with the end of its lease: not an
    // event (a heartbeat every few seconds is no history), shared by the registry's replicas.
    "CREATE TABLE IF NOT EXISTS host_leases (name TEXT PRIMARY KEY, capacity BIGINT NOT NULL, lease_until_ms BIGINT NOT NULL, seen_at_ms BIGINT NOT NULL)",
    // The slots of an event Box's Workers in flight (R-TRIG-1): one row per admitted
    // launch, at most `ATASIRA_TRIGGER_IN_FLIGHT` slot numbers per Box, so replicas that
    // launch at once admit no more than the bound between them. Not an event: the Workers'
    // streams say what ran; a slot is freed when its Worker ends or its launch is refused.
    "CREATE TABLE IF NOT EXISTS trigger_slots (box_id TEXT NOT NULL, slot BIGINT NOT NULL, launch_id TEXT NOT NULL UNIQUE, taken_at_ms BIGINT NOT NULL,
        PRIMARY KEY (box_id, slot))",
];

/// PostgreSQL: the principal assertions some process of the cluster admitted, until they
/// expire, so that replicas of a service admit each assertion once between them.
const POSTGRES_REPLAY: &[&str] = &["CREATE TABLE IF NOT EXISTS assertion_replay (tag TEXT PRIMARY KEY, expires_at_ms BIGINT NOT NULL)"];

/// Checkpoint tables of stores created before checkpoints were cursors.
const CURSOR_COLUMNS: &[&str] = &["projection_checkpoints", "relay_checkpoints"];

impl Db {
    /// Creates the shared event store tables (idempotent; every component may call it).
    pub(super) async fn migrate(&self) -> anyhow::Result<()> {
        let schema = match self.kind() {
            DbKind::Sqlite => SQLITE_SCHEMA,
            DbKind::Postgres => POSTGRES_SCHEMA,
        };
        let (progress, replay): (&[&str], &[&str]) = if self.kind() == DbKind::Postgres { (POSTGRES_NO_PROGRESS, POSTGRES_REPLAY) } else { (&[], &[]) };
        let all: Vec<&str> = schema.iter().chain(COMMON_SCHEMA).chain(progress).chain(replay).copied().collect();
        self.ensure_tables(&all).await?;
        for table in CURSOR_COLUMNS {
            self.ensure_column(table, "tx_id", "BIGINT NOT NULL DEFAULT 0").await?;
        }
        Ok(())
    }

    /// Adds `column` (of `definition`) to `table` when a table made before the column
    /// lacks it (idempotent; as DDL, under [`Db::ensure_tables`]' rules).
    pub async fn ensure_column(&self, table: &str, column: &str, definition: &str) -> anyhow::Result<()> {
        let add = format!("ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {definition}");
        match self.kind() {
            DbKind::Postgres => {
                let has = "SELECT COUNT(*) FROM information_schema.columns WHERE table_schema = current_schema() AND table_name = $1 AND column_name = $2";
                let count = || async { sqlx::query(has).bind(table).bind(column).fetch_one(&self.any).await?.try_get::<i64, _>(0) };
                if count().await? > 0 {
                    return Ok(());
                }
                // A role that may not create objects runs no DDL: the column is then missing.
                self.ensure_tables(&[&add]).await?;
                anyhow::ensure!(
                    count().await? > 0,
                    "table {table} has no column {column}, and this database role may not add it: run `atasira db prepare --database-url <URL>` with the role that owns the schema first"
                );
                Ok(())
            }
            DbKind::Sqlite => {
                let has = format!("SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = '{column}'");
                if sqlx::query(&has).fetch_one(&self.any).await?.try_get::<i64, _>(0)? == 0 {
                    self.ensure_tables(&[&add.replace(" IF NOT EXISTS", "")]).await?;
                }
                Ok(())
            }
        }
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
}

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
