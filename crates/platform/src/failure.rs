//! Transient or not: whether a failure of a consumer, relay or writer will pass by itself
//! (the database restarting, a connection lost, a serialization conflict) and is worth
//! retrying soon, or says that an event cannot be applied and will fail the same way
//! again. Pure: it looks only at the error chain.

/// Whether `error` (or anything in its chain) is a failure that passes by itself: the
/// database or the network was away or busy, not the event.
pub fn is_transient(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        if let Some(e) = cause.downcast_ref::<sqlx::Error>() {
            return sqlx_transient(e);
        }
        cause.downcast_ref::<std::io::Error>().is_some()
    })
}

/// The sqlx errors that pass by themselves.
pub fn sqlx_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(e) => e.code().is_some_and(|code| transient_code(&code)),
        _ => false,
    }
}

/// SQLSTATE codes (PostgreSQL) and result codes (SQLite) of a server that is away, busy
/// or restarting, or of a transaction that only has to run again.
pub fn transient_code(code: &str) -> bool {
    // PostgreSQL: class 08 connection exception; 57P01-57P03 shutting down or starting;
    // 53300 too many connections; 40001 serialization failure; 40P01 deadlock.
    // SQLite: 5 busy, 6 locked (and their extended codes, 261, 262, 517, ...), numbers of
    // at most four digits, where every SQLSTATE has five characters.
    let sqlite = code.len() < 5 && code.parse::<u32>().is_ok_and(|n| matches!(n & 0xff, 5 | 6));
    sqlite || code.starts_with("08") || matches!(code, "57P01" | "57P02" | "57P03" | "53300" | "40001" | "40P01")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_connection_or_a_pool_that_gave_up_is_transient_whatever_context_wraps_it() {
        // given errors of a database that is away
        let lost = anyhow::Error::new(sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionRefused)));
        let waited = anyhow::Error::new(sqlx::Error::PoolTimedOut).context("drafts_view cannot handle event draft/x/1");
        // then they pass by themselves
        assert!(is_transient(&lost));
        assert!(is_transient(&waited));
    }

    #[test]
    fn an_event_that_cannot_be_read_is_not_transient() {
        // given a decoding failure and a plain refusal
        let decode = anyhow::Error::new(sqlx::Error::Decode("nonsense".into())).context("drafts_view cannot handle event draft/broken/1");
        let refused = anyhow::anyhow!("unknown event type");
        // then they stall their consumer
        assert!(!is_transient(&decode));
        assert!(!is_transient(&refused));
    }

    #[test]
    fn server_codes_of_a_restart_or_a_conflict_are_transient_others_are_not() {
        for code in ["08006", "08001", "57P01", "57P03", "53300", "40001", "40P01", "5", "6", "517"] {
            assert!(transient_code(code), "{code}");
        }
        // (42501 is a PostgreSQL code, not SQLite's 5 with flags)
        for code in ["23505", "22P02", "42P01", "42501", "42P05", "1", "19", "2067"] {
            assert!(!transient_code(code), "{code}");
        }
    }
}
