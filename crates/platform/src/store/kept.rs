//! Connections kept out of a pool between statements. sqlx tests every connection that
//! goes back to its pool with a round trip of its own (PostgreSQL: a `Sync` and its
//! answer), in a task of its own, right after the statement: per command, a second wake of
//! the database's backend and of this process for each statement, which on a small host
//! competes with the command's next step for the cores. A statement that ran to its end
//! leaves its connection ready for the next one, so the hot statements (a command's append
//! and load, a submission's read) give theirs back here instead ([`Held::keep`]), newest
//! first, so the same few backends stay warm; so do the reads of a process's feeds and
//! relays (`Db::read`, one connection, in SQLite too).
//!
//! A connection whose statement failed or was cut short (its caller stopped) is not kept:
//! dropped, it goes back to the pool, whose test brings it back to a known state or closes
//! it. At most `most` connections are kept, fewer than the pool holds, so statements that
//! use the pool itself always find connections circulating there.

use std::sync::{Mutex, PoisonError};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

/// The connections of one pool kept for the next statement.
pub(super) struct Kept<DB: Database> {
    idle: Mutex<Vec<PoolConnection<DB>>>,
    most: usize,
}

impl<DB: Database> Kept<DB> {
    /// Keeps at most `most` connections (0: none, every connection goes back to the pool).
    pub(super) fn new(most: usize) -> Kept<DB> {
        Kept { idle: Mutex::new(Vec::with_capacity(most)), most }
    }

    /// The connection kept last, or one of `pool`.
    pub(super) async fn take<'a>(&'a self, pool: &Pool<DB>) -> Result<Held<'a, DB>, sqlx::Error> {
        let kept = self.idle.lock().unwrap_or_else(PoisonError::into_inner).pop();
        let conn = match kept {
            Some(conn) => conn,
            None => pool.acquire().await?,
        };
        Ok(Held { kept: self, conn: Some(conn) })
    }

    /// How many are kept now.
    pub(super) fn len(&self) -> usize {
        self.idle.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// A connection taken for a statement or more; [`Held::keep`] it once they ran to their end.
/// Dropped otherwise, it goes back to its pool.
pub struct Held<'a, DB: Database> {
    kept: &'a Kept<DB>,
    conn: Option<PoolConnection<DB>>,
}

impl<DB: Database> std::fmt::Debug for Held<'_, DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Held")
    }
}

impl<DB: Database> Held<'_, DB> {
    /// The statements ran to their end (no transaction left open): the connection is kept
    /// for the next statement, or goes back to the pool when enough are kept.
    pub fn keep(mut self) {
        if let Some(conn) = self.conn.take() {
            let mut idle = self.kept.idle.lock().unwrap_or_else(PoisonError::into_inner);
            if idle.len() < self.kept.most {
                idle.push(conn);
            }
        }
    }
}

impl<DB: Database> std::ops::Deref for Held<'_, DB> {
    type Target = DB::Connection;

    fn deref(&self) -> &DB::Connection {
        self.conn.as_deref().expect("a held connection is there until kept")
    }
}

impl<DB: Database> std::ops::DerefMut for Held<'_, DB> {
    fn deref_mut(&mut self) -> &mut DB::Connection {
        self.conn.as_deref_mut().expect("a held connection is there until kept")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::testing::TempDb;

    #[tokio::test]
    async fn r_arch_1_a_connection_is_kept_only_after_its_statement_ran_and_never_more_than_allowed() {
        let store = TempDb::new().await;
        let pool = store.db.any().clone();
        let kept: Kept<sqlx::Any> = Kept::new(1);
        // Given a statement that ran to its end, when its connection is kept, then the
        // next statement takes that one.
        let mut first = kept.take(&pool).await.expect("take");
        sqlx::query("SELECT 1").execute(&mut *first).await.expect("select");
        first.keep();
        assert_eq!(kept.len(), 1);
        let second = kept.take(&pool).await.expect("take");
        assert_eq!(kept.len(), 0, "taken out while in use");
        // Given a statement that failed, when its holder lets go, then nothing is kept.
        let mut failed = kept.take(&pool).await.expect("take");
        assert!(sqlx::query("SELECT * FROM no_such_table").execute(&mut *failed).await.is_err());
        drop(failed);
        assert_eq!(kept.len(), 0);
        // Given one kept already, when another is kept, then it goes back to the pool.
        let third = kept.take(&pool).await.expect("take");
        second.keep();
        third.keep();
        assert_eq!(kept.len(), 1, "at most `most` kept");
    }
}
