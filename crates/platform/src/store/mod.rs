//! The one database: the shared event store (R-ARCH-1) plus each component's own tables.
//! This module owns the events schema and every statement on it:
//!
//! - [`schema`]: the tables, triggers and policies of both databases;
//! - [`append`]: commands (load a stream, decide, append, retry) and what they did;
//! - [`read`]: events in commit order, streams, histories, heads;
//! - [`bells`]: what a process learns without asking (appended, progressed);
//! - [`consumers`]: what this process's consumers did (progress, stalls).
//!
//! Two pools point at the same database: a typed one for commands (SQLite's single
//! writer connection, whose page cache survives only while no other connection writes;
//! the group appender; PostgreSQL's `LISTEN`), and an `Any` pool for everything else, so
//! that projection, checkpoint and token SQL is written once for both backends (`$n`
//! placeholders work on both).

pub mod append;
pub mod bells;
pub mod consumers;
mod kept;
pub mod read;
mod recent;
pub mod schema;

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use sqlx::any::AnyPoolOptions;
use sqlx::postgres::PgPoolOptions;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{AnyPool, PgPool, Row as _, SqlitePool};

pub use crate::cursor::Cursor;
pub use append::{Cqrs, EventAt, Precondition, Receipt, Retry};
pub use bells::{Appended, Wanted};
pub use consumers::ASYNC_COMMIT;
pub use kept::Held;
pub use read::{AsOf, Batch, EventRef, StoredEvent, TextBatch, TextEvent, pg_read_statement};

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
    bells: Arc<bells::Bells>,
    writer: Arc<append::Writer>,
    consumers: Arc<consumers::Consumers>,
    /// The connection [`Db::read`] keeps between reads (see there), in both backends.
    reads: Arc<kept::Kept<sqlx::Any>>,
    /// PostgreSQL: connections kept between hot statements ([`kept`]): of the typed pool
    /// for commands' appends and loads, of the `Any` pool for [`Db::held`].
    kept_pg: Arc<kept::Kept<sqlx::Postgres>>,
    kept_any: Arc<kept::Kept<sqlx::Any>>,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Db({:?})", self.kind())
    }
}

/// How long a PostgreSQL statement waits for a connection of its pool (one in use by
/// others, or a new one while the database is away) before it fails.
const PG_ACQUIRE: Duration = Duration::from_secs(5);

/// Connections of each PostgreSQL pool (of [`PG_POOL`]) kept between hot statements
/// ([`kept`]): half, so the pool's own users always find the other half circulating.
const PG_POOL: u32 = 8;
const PG_KEPT: usize = PG_POOL as usize / 2;

impl Db {
    fn new(typed: Typed, any: AnyPool, bells: Arc<bells::Bells>) -> Db {
        let writer = append::Writer::new(match &typed {
            Typed::Sqlite(pool) => Some(pool.clone()),
            Typed::Postgres(_) => None,
        });
        // SQLite keeps none: its typed pool is the one writer connection, and its
        // connections answer the pool's test in this process.
        let kept = match &typed {
            Typed::Sqlite(_) => 0,
            Typed::Postgres(_) => PG_KEPT,
        };
        Db {
            typed,
            any,
            bells,
            writer,
            consumers: Arc::default(),
            reads: Arc::new(kept::Kept::new(1)),
            kept_pg: Arc::new(kept::Kept::new(kept)),
            kept_any: Arc::new(kept::Kept::new(kept)),
        }
    }

    /// Connects to `postgres://...` or `sqlite://...`, creating what the event store needs.
    pub async fn connect(url: &str) -> anyhow::Result<Db> {
        sqlx::any::install_default_drivers();
        let db = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            // No ping before each use (a round trip per statement): a connection that died
            // fails its statement, and every writer retries from its checkpoint. While the
            // database is away, a request waits at most PG_ACQUIRE for a connection, then
            // fails (503 to its caller) instead of hanging.
            let pool = PgPoolOptions::new()
                .max_connections(PG_POOL)
                .test_before_acquire(false)
                .acquire_timeout(PG_ACQUIRE)
                .connect(url)
                .await
                .with_context(|| format!("failed to connect to {}", redact(url)))?;
            let any = AnyPoolOptions::new()
                .max_connections(PG_POOL)
                .test_before_acquire(false)
                .acquire_timeout(PG_ACQUIRE)
                .connect(url)
                .await
                .context("failed to open the Any pool")?;
            let bells = Arc::new(bells::Bells::default());
            bells.listen_later(pool.clone());
            Db::new(Typed::Postgres(pool), any, bells)
        } else if url.starts_with("sqlite:") {
            let options = SqliteConnectOptions::from_str(url)?
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal)
                .synchronous(SqliteSynchronous::Normal)
                .busy_timeout(Duration::from_secs(10))
                .foreign_keys(true)
                // No checkpoint in a commit: see `checkpoint_in_background`.
                .pragma("wal_autocheckpoint", "0");
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
                        sqlx::query("PRAGMA wal_autocheckpoint = 0").execute(&mut *conn).await?;
                        Ok(())
                    })
                })
                .connect(url)
                .await
                .context("failed to open the Any pool")?;
            let bells = Arc::new(bells::Bells::default());
            tokio::spawn(checkpoint_in_background(any.clone(), bells.appended.subscribe()));
            Db::new(Typed::Sqlite(pool), any, bells)
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

    /// A connection of the `Any` pool for a hot statement (one each request makes): give it
    /// back with [`Held::keep`] once the statement ran to its end, and the next statement
    /// takes it without the pool's test of a returned connection (a round trip, see
    /// [`kept`]); dropped instead, it goes back to the pool.
    pub async fn held(&self) -> Result<Held<'_, sqlx::Any>, sqlx::Error> {
        self.kept_any.take(&self.any).await
    }

    /// How many connections wait kept for the next hot statement ([`kept`]).
    pub fn kept_connections(&self) -> usize {
        self.kept_pg.len() + self.kept_any.len()
    }

    /// Asks the database a trivial question (readiness, `/readyz`).
    pub async fn ping(&self) -> anyhow::Result<()> {
        sqlx::query("SELECT 1").execute(&self.any).await.context("the database did not answer")?;
        Ok(())
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

/// How long SQLite's checkpointer lets commits gather after one before it moves them into
/// the database file.
const CHECKPOINT_AFTER: Duration = Duration::from_millis(100);

/// SQLite: moves the write-ahead log's pages into the database file (a passive checkpoint:
/// it waits for no reader or writer) on a connection of the `Any` pool, `CHECKPOINT_AFTER`
/// a commit of this process, and not while nothing is committed. SQLite's own automatic
/// checkpoint (off on every connection of this store) runs inside the commit that crosses
/// its threshold, on the writer's connection, with two disk syncs: every command and
/// consumer queued behind the only writer waited for them. Ends when the store's handles
/// are gone (the bell's sender with them); the last connection to close checkpoints the
/// rest, as SQLite does.
async fn checkpoint_in_background(pool: AnyPool, mut appended: tokio::sync::watch::Receiver<bells::Appended>) {
    while appended.changed().await.is_ok() {
        tokio::time::sleep(CHECKPOINT_AFTER).await;
        appended.borrow_and_update();
        if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)").execute(&pool).await {
            tracing::warn!(error = %e, "could not checkpoint the store's write-ahead log; retrying after the next commit");
        }
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
        pub(crate) dir: std::path::PathBuf,
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

    #[tokio::test]
    async fn r_arch_7_sqlite_moves_committed_pages_into_the_database_file_in_the_background() {
        use atasira_domain::aggregates::draft::Draft;
        // given the embedded store, just opened (what it wrote so far is in its log)
        let store = testing::TempDb::new().await;
        let file = store.dir.join("atasira.db");
        let opened = std::fs::metadata(&file).expect("the database file").len();
        // when commands commit
        for i in 0..20 {
            let id = format!("c{i}");
            store.db.cqrs::<Draft>().execute_new(&id, testing::submit(&id), std::collections::HashMap::new()).await.expect("submit");
        }
        // then soon the database file holds their pages, while every connection stays open
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::fs::metadata(&file).expect("the database file").len() <= opened {
            assert!(std::time::Instant::now() < deadline, "nothing was checkpointed into the database file");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}
