//! Statements a consumer writes a batch with: multi-row `VALUES` lists, placeholders and
//! the arguments bound to them.

use sqlx::Any;

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
