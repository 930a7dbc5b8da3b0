//! Where a reader of the store stands (a value: the store reads after it, consumers and
//! relays keep it as their checkpoint, the metrics report it).

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
}
