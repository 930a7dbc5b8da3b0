//! One active reader per name across replicas (issue 13 item 5): when two processes of a
//! service run side by side, only one runs each relay and each consumer (the audit writer's
//! hash chain above all); the other waits and takes over when the holder dies.
//!
//! PostgreSQL: a session advisory lock on a connection of its own, keyed by the name. The
//! database releases it when the holder's connection ends (the process died, or the
//! network dropped it), so a standby that retries every [`RETRY`] takes over without any
//! timeout of ours. The holder checks its connection every [`CHECK`]: a lock it can no
//! longer prove it holds is given up (the reader stops and competes again). SQLite has
//! one process per data directory: the lease is always granted and never lost.

use std::time::Duration;

use sha2::{Digest, Sha256};
use sqlx::Connection;

use crate::store::{Db, DbKind};

/// How often a standby asks for the lock.
pub const RETRY: Duration = Duration::from_secs(1);

/// How often the holder checks that its lock's connection is alive.
pub const CHECK: Duration = Duration::from_secs(2);

/// The lock's key: the first 8 bytes of SHA-256 of the name (names are atasira's own).
pub fn key(name: &str) -> i64 {
    let h = Sha256::digest(format!("atasira.exclusive/{name}").as_bytes());
    i64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]])
}

/// The right to run reader `name`, until [`Lease::lost`] says otherwise.
#[derive(Debug)]
pub struct Lease {
    conn: Option<sqlx::PgConnection>,
}

impl Lease {
    /// Resolves when the lease can no longer be proven held (never for SQLite).
    pub async fn lost(&mut self) {
        let Some(conn) = self.conn.as_mut() else { return std::future::pending().await };
        loop {
            tokio::time::sleep(CHECK).await;
            let alive = tokio::time::timeout(CHECK, conn.ping()).await;
            if !matches!(alive, Ok(Ok(()))) {
                return;
            }
        }
    }
}

/// Waits until this process holds reader `name`'s lock (or `shutdown` is set: `None`).
pub async fn acquire(db: &Db, name: &str, shutdown: &mut tokio::sync::watch::Receiver<bool>) -> Option<Lease> {
    if db.kind() == DbKind::Sqlite {
        return Some(Lease { conn: None });
    }
    let key = key(name);
    let mut waiting_said = false;
    loop {
        if *shutdown.borrow() {
            return None;
        }
        match try_once(db, key).await {
            Ok(Some(conn)) => {
                if waiting_said {
                    tracing::info!(reader = name, "took over: this process now runs it");
                }
                return Some(Lease { conn: Some(conn) });
            }
            Ok(None) => {
                if !waiting_said {
                    tracing::info!(reader = name, "another process runs it; standing by");
                    waiting_said = true;
                }
            }
            Err(e) => tracing::warn!(reader = name, error = %e, "cannot ask for the reader's lock; trying again"),
        }
        tokio::select! {
            _ = tokio::time::sleep(RETRY) => {}
            _ = shutdown.changed() => {}
        }
    }
}

async fn try_once(db: &Db, key: i64) -> anyhow::Result<Option<sqlx::PgConnection>> {
    let mut conn = db.pg_connection().await?;
    let held: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)").bind(key).fetch_one(&mut conn).await?;
    Ok(held.then_some(conn))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_differ_per_name_and_are_stable() {
        assert_eq!(key("relay-drafts"), key("relay-drafts"));
        assert_ne!(key("relay-drafts"), key("relay-audit"));
    }
}
