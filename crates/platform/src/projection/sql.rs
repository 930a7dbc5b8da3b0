//! Statements a consumer writes a batch with: multi-row `VALUES` lists, placeholders and
//! the arguments bound to them.

use sqlx::Any;

/// Parameters per statement when a batch's rows are written (or looked up) together: far
/// below the databases' bind limits (SQLite 32,766, PostgreSQL 65,535). On SQLite a
/// statement binds its parameters in order ([`for_connection`]); numbered ones would cost
/// a scan of the statement's parameter list each.
const PARAMS_PER_STATEMENT: usize = 800;

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

/// `sql` as the database behind `conn` binds it fastest. SQLite binds a `$n` parameter by
/// its name, finding the name among all those of the statement (quadratic in the rows of a
/// multi-row statement: a tenth of a rebuild's writing time); a statement whose parameters
/// are `$1, $2, ...` in order, each once, is the same statement with anonymous `?`
/// parameters, which SQLite binds in order. Any other statement is left as it is.
pub fn for_connection(conn: &sqlx::AnyConnection, sql: String) -> String {
    if conn.backend_name() != <sqlx::Sqlite as sqlx::Database>::NAME {
        return sql;
    }
    for_sqlite(sql)
}

/// [`for_connection`] for a statement run on SQLite.
pub fn for_sqlite(sql: String) -> String {
    anonymous(&sql).unwrap_or(sql)
}

/// `sql` with `$1, $2, ...` (in order, each once) as `?`; `None` for any other use of `$`.
fn anonymous(sql: &str) -> Option<String> {
    let mut out = String::with_capacity(sql.len());
    let (mut rest, mut next) = (sql, 1usize);
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..].bytes().take_while(u8::is_ascii_digit).count();
        if rest[at + 1..at + 1 + digits].parse::<usize>().ok()? != next {
            return None;
        }
        out.push('?');
        next += 1;
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    Some(out)
}

/// `$1, $2, ...`: `n` placeholders, for `IN (...)`.
pub fn placeholders(n: usize) -> String {
    (1..=n).map(|i| format!("${i}")).collect::<Vec<_>>().join(", ")
}

/// The statement that moves a consumer's cursor (never back), binding its name, `tx_id`
/// and position from `$first` on (for a consumer that writes its batch in statements of
/// its own).
pub fn advance_statement(first: usize) -> String {
    upsert_cursor(&format!("VALUES (${first}, ${}, ${})", first + 1, first + 2))
}

/// The statement that moves consumer `name`'s cursor (never back) to the row `source`
/// gives (`VALUES ($1, $2, $3)`, or a `SELECT`): name, tx_id, position.
pub(super) fn upsert_cursor(source: &str) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_parameters_in_order_when_made_anonymous_then_each_becomes_a_question_mark() {
        let sql = format!("INSERT INTO t (a, b) VALUES {}; {}", values_list(2, 2), advance_statement(5));
        let out = anonymous(&sql).expect("in order");
        assert!(!out.contains('$'), "{out}");
        assert_eq!(out.matches('?').count(), 7);
        assert_eq!(anonymous("SELECT 1").as_deref(), Some("SELECT 1"));
    }

    #[test]
    fn given_parameters_out_of_order_repeated_or_not_numbered_then_the_statement_stays_as_it_is() {
        for sql in ["SELECT $2, $1", "SELECT $1, $1", "SELECT $1 WHERE x = '$'", "SELECT $0", "SELECT $1, $3"] {
            assert_eq!(anonymous(sql), None, "{sql}");
        }
    }
}
