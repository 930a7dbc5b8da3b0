//! Projections: read models built from events. Each applies an event and stores its
//! checkpoint in the same transaction as its rows, and skips an event id it has already
//! applied (R-ARCH-5), so at-least-once delivery is exactly-once in effect.

mod checkpoint;
mod consume;
mod rebuild;
mod sql;
mod wait;

use std::sync::Arc;

use sqlx::{Any, Transaction};

use crate::feed::FeedSource;
use crate::store::{Db, StoredEvent, TextEvent};

use checkpoint::record;

pub use checkpoint::{BlindWrite, advance_and_mark, apply_one, checkpoint, cursor, mark_and_advance, mark_batch_processed, mark_processed, processed};
pub use consume::{consume_batches, consume_selected};
pub use rebuild::{REBUILD_PAGE, rebuild, rebuild_all, rebuild_in_pages};
pub use sql::{Arg, advance_statement, bind_all, for_connection, for_sqlite, placeholders, rows_per_statement, values_list, values_list_from};
pub use wait::{ReadModel, answer_wait, wait_for, wait_for_events};

#[async_trait::async_trait]
pub trait Projection: Send + Sync + 'static {
    /// Unique name: checkpoint key and durable consumer name.
    fn name(&self) -> &'static str;
    /// The aggregate types whose events it reads.
    fn aggregate_types(&self) -> &'static [&'static str];
    /// Event types of its aggregate types that never change its rows: a rebuild does not
    /// read them (the live feed still delivers them, to no effect).
    fn ignored_event_types(&self) -> &'static [&'static str] {
        &[]
    }
    /// Idempotent DDL for its tables.
    fn tables(&self) -> &'static [&'static str];
    /// The tables to empty on rebuild.
    fn table_names(&self) -> &'static [&'static str];
    /// Columns added after its tables were first made, as `(table, column, definition)`:
    /// added to tables made before them.
    fn added_columns(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        &[]
    }
    /// Applies one event inside the runner's transaction.
    async fn apply(&self, tx: &mut Transaction<'static, Any>, event: &StoredEvent) -> anyhow::Result<()>;
    /// Applies a batch of new events, in order, inside the runner's transaction: the same
    /// effect as [`Projection::apply`] on each in turn. A projection whose events meet the
    /// same rows overrides it to read and write each row once per batch (a rebuild applies
    /// 1000 events a batch).
    async fn apply_batch(&self, tx: &mut Transaction<'static, Any>, events: &[StoredEvent]) -> anyhow::Result<()> {
        for event in events {
            self.apply(tx, event).await?;
        }
        Ok(())
    }
    /// How a rebuild decodes a page before applying it: a function of the events alone, so
    /// that the rebuild decodes the next page while the database writes this one. By
    /// default nothing is decoded ahead ([`DecodedPage::none`]).
    fn page_decoder(&self) -> PageDecoder {
        |_| Ok(DecodedPage::none())
    }
    /// Applies a page of a rebuild, the events as stored text ([`TextEvent`]) and what
    /// [`Projection::page_decoder`] made of them, in order, inside the rebuild's
    /// transaction: the same effect as [`Projection::apply_batch`] on the same events (by
    /// default it parses them and calls it). A projection overrides it to decode the
    /// payloads straight into its own event types.
    async fn apply_page(&self, tx: &mut Transaction<'static, Any>, events: &[TextEvent], decoded: DecodedPage) -> anyhow::Result<()> {
        let _ = decoded;
        let events = events.iter().cloned().map(TextEvent::into_stored).collect::<anyhow::Result<Vec<_>>>()?;
        self.apply_batch(tx, &events).await
    }
    /// The one statement that applies a batch of new events without reading the view, its
    /// parameters numbered from `$first`, when the batch allows it and applying it twice
    /// changes nothing (the drafts view's batch of submissions: rows inserted unless
    /// there). The runner sends it with the cursor (and in PostgreSQL the processed set) in
    /// one round trip; `None` (the default): [`Projection::apply_batch`] in a transaction.
    fn blind_write(&self, events: &[StoredEvent], first: usize) -> anyhow::Result<Option<BlindWrite>> {
        let _ = (events, first);
        Ok(None)
    }
}

/// Decodes a rebuild's page ahead of applying it ([`Projection::page_decoder`]).
pub type PageDecoder = fn(&[TextEvent]) -> anyhow::Result<DecodedPage>;

/// A rebuild's page as a projection's [`PageDecoder`] decoded it, for its
/// [`Projection::apply_page`].
#[derive(Debug)]
pub struct DecodedPage(Box<dyn std::any::Any + Send>);

impl DecodedPage {
    pub fn new<T: std::any::Any + Send>(decoded: T) -> DecodedPage {
        DecodedPage(Box::new(decoded))
    }

    /// Nothing decoded ahead.
    pub fn none() -> DecodedPage {
        DecodedPage::new(())
    }

    /// What the decoder made, as the type it made.
    pub fn take<T: std::any::Any>(self) -> anyhow::Result<T> {
        self.0.downcast::<T>().map(|t| *t).map_err(|_| anyhow::anyhow!("a rebuild's page was decoded as another type than its projection applies"))
    }
}

/// Creates the projection's tables.
pub async fn prepare(db: &Db, projection: &dyn Projection) -> anyhow::Result<()> {
    db.ensure_tables(projection.tables()).await?;
    for (table, column, definition) in projection.added_columns() {
        db.ensure_column(table, column, definition).await?;
    }
    Ok(())
}

/// Runs a projection until `shutdown` resolves, a batch per transaction; its feed lingers
/// while no read-your-writes wait needs it ([`FeedSource::lingering`]).
pub async fn run(db: Db, feeds: FeedSource, projection: Arc<dyn Projection>, shutdown: tokio::sync::watch::Receiver<bool>) {
    let (name, types) = (projection.name(), projection.aggregate_types());
    let apply_db = db.clone();
    consume_batches(db, feeds.lingering(), name, types, shutdown, move |events| {
        let (db, projection) = (apply_db.clone(), projection.clone());
        async move { record(&db, name, &events, Some(projection.as_ref())).await.map(|_| ()) }
    })
    .await
}
