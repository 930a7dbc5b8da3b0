//! The audit service (SPEC §7): writes one hash-chained HMAC row per auditable event
//! (R-AUDIT-1), records a signed checkpoint of the ledger's head, linked to the previous
//! checkpoint, as an event every `checkpoint_every` and on shutdown (R-AUDIT-2), and serves
//! ledger pages (R-AUDIT-3) and verification against every checkpoint (R-AUDIT-2) to admins
//! over the bus.
//!
//! Architecture Invariant: the ledger is append-only and never rebuilt (R-ARCH-5); the only
//! events this service appends are `AuditCheckpoint`s of the `audit_ledger` aggregate.

mod ledger;
pub mod notifier;

use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::requests::{AuditRequest, Incoming};
use atasira_contracts::{Reply, convert, reply_ok, subjects, v1};
use atasira_domain::audit::AuditKeys;
use atasira_domain::{ErrorCode, Principal};
use atasira_platform::Runtime;
use atasira_platform::projection::{self as proj, ReadModel};
use atasira_platform::refusal::Refusal;
use atasira_platform::service::{self as platform_service, Call};
use tokio::sync::watch;

pub use ledger::{
    AUDITABLE_TYPES, Filter, KnownHead, LEDGER_SCHEMA, NAME, PAGE_DEFAULT, PAGE_MAX, POSTGRES_LEDGER_TRIGGERS, SQLITE_LEDGER_TRIGGERS, append, append_batch,
    append_batch_after, apply_pending, check_complete, checkpoint, checkpoints, head, latest_checkpoint, page, verify,
};
pub use notifier::NotifierConfig;

/// The service name (also its subject token).
/// Most rows an export page holds.
const EXPORT_PAGE: u32 = 1000;

pub const SERVICE: &str = subjects::AUDIT;
/// Aggregate types whose events this service appends and relays.
/// The aggregate types whose events this service publishes: its own, and the personal
/// access tokens' (appended by the gateway and `atasira tokens`, which have no JetStream).
pub const AGGREGATE_TYPES: &[&str] = &[
    atasira_domain::aggregates::types::AUDIT_LEDGER,
    atasira_domain::aggregates::types::AUDIT_SECURITY,
    atasira_domain::aggregates::types::PAT,
    atasira_domain::aggregates::types::GATEWAY_ASSERTION_KEYS,
    atasira_domain::aggregates::types::WEBHOOK,
    atasira_domain::aggregates::types::NOTIFICATION,
];
/// R-AUDIT-2: "every minute".
pub const CHECKPOINT_EVERY: Duration = Duration::from_secs(60);

/// The read models a `WaitForPosition` waits for, with the aggregate types a write waits
/// for them on. The notifier is a read model only for webhook events (the webhook list is
/// its table); what it queues for other events is sent after the write returns anyway, so
/// a draft's submission or decision does not wait for its announcement to be queued.
const READ_MODELS: &[ReadModel] = &[ReadModel::new(NAME, AUDITABLE_TYPES), ReadModel::new(notifier::NAME, &[atasira_domain::aggregates::types::WEBHOOK])];

/// Settings of the audit service.
#[derive(Debug, Clone)]
pub struct AuditConfig {
    /// MACs new rows and checkpoints with the current key; verifies with every key
    /// (R-AUDIT-4). Not the internal assertion key: a leaked assertion key must not let
    /// anyone re-MAC the ledger.
    pub keys: Arc<AuditKeys>,
    /// How often the head is checkpointed (R-AUDIT-2: a minute); tests shorten it.
    pub checkpoint_every: Duration,
    /// Announcements to approvers (R-NOTIFY-1).
    pub notifier: NotifierConfig,
}

impl AuditConfig {
    /// The configuration of the spec: checkpoints every minute.
    pub fn new(keys: Arc<AuditKeys>) -> Self {
        Self { keys, checkpoint_every: CHECKPOINT_EVERY, notifier: NotifierConfig::default() }
    }
}

struct Service {
    rt: Runtime,
    keys: Arc<AuditKeys>,
}

/// The audit service's tables: the ledger and the notifier's.
pub async fn prepare(db: &atasira_platform::store::Db) -> anyhow::Result<()> {
    ledger::prepare(db).await?;
    db.ensure_tables(notifier::SCHEMA).await
}

/// Starts the service: ledger writer, checkpointer, notifier and bus endpoint. Returns when
/// `shutdown` flips, after a final checkpoint.
pub async fn run(rt: Runtime, config: AuditConfig, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    prepare(&rt.db).await?;
    let service = Arc::new(Service { rt: rt.clone(), keys: config.keys.clone() });
    let endpoint = {
        let service = service.clone();
        platform_service::serve(&rt, SERVICE, move |call| {
            let service = service.clone();
            async move { service.dispatch(&call).await }
        })
        .await?
    };
    let writer = tokio::spawn(write_ledger(rt.clone(), config.keys.clone(), shutdown.clone()));
    let checkpointer = tokio::spawn(checkpoint_periodically(rt.clone(), config.keys.clone(), config.checkpoint_every, shutdown.clone()));
    let notify = Arc::new(config.notifier.clone());
    let wake = Arc::new(tokio::sync::Notify::new());
    let announcer = tokio::spawn(notifier::consume(rt.clone(), notify.clone(), wake.clone(), shutdown.clone()));
    let sender = tokio::spawn(notifier::send(rt.clone(), config.keys.clone(), notify, wake, shutdown.clone()));
    platform_service::until_shutdown(shutdown).await;
    endpoint.stop();
    let _ = writer.await;
    let _ = checkpointer.await;
    let _ = announcer.await;
    let _ = sender.await;
    // R-AUDIT-2 "and on shutdown": the writer has stopped, so this covers every row.
    record_checkpoint(&rt, &config.keys).await;
    Ok(())
}

/// The ledger writer: a durable feed of auditable events; each batch is appended (or
/// skipped) in one transaction with the checkpoint (R-ARCH-6). A read model: its feed
/// lingers while no read-your-writes wait needs it.
async fn write_ledger(rt: Runtime, keys: Arc<AuditKeys>, shutdown: watch::Receiver<bool>) {
    let db = rt.db.clone();
    // The head this writer left: its next batch needs no read first.
    let known = Arc::new(ledger::KnownHead::default());
    proj::consume_batches(rt.db.clone(), rt.feeds.lingering(), NAME, AUDITABLE_TYPES, shutdown, move |events| {
        let (db, keys, known) = (db.clone(), keys.clone(), known.clone());
        async move { ledger::append_batch_after(&db, &keys, &events, &known).await.map(|_| ()) }
    })
    .await
}

async fn checkpoint_periodically(rt: Runtime, keys: Arc<AuditKeys>, every: Duration, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.changed() => return,
        }
        if *shutdown.borrow() {
            return;
        }
        record_checkpoint(&rt, &keys).await;
    }
}

/// Records a checkpoint if the ledger grew; failures are logged and retried next time
/// (a missed checkpoint only widens the window in which a removed tail goes unnoticed).
async fn record_checkpoint(rt: &Runtime, keys: &AuditKeys) {
    match ledger::checkpoint(&rt.db, keys).await {
        Ok(Some(seq)) => {
            tracing::debug!(seq, "audit checkpoint recorded");
        }
        Ok(None) => {}
        Err(e) => tracing::warn!(error = %e, "audit checkpoint failed; the next one retries"),
    }
}

impl Service {
    /// R-AUDIT-2, R-AUDIT-3: the ledger is for admins only.
    async fn admin(&self, call: &Call, what: &str) -> Result<Principal, Refusal> {
        let principal = call.principal(&self.rt).await?;
        if !principal.is_admin() {
            return Err(Refusal::new(ErrorCode::Forbidden, format!("{what} needs role admin")));
        }
        Ok(principal)
    }

    /// R-AUDIT-3: pages of the ledger are for admins. The row of one event (`event_id`) is
    /// also answered to the gateway for any caller: it asks for it only for the events of a
    /// Worker's provenance the caller may read (`GET /api/v1/workers/{id}/provenance`), and
    /// shows only the row's seq.
    async fn reader(&self, call: &Call, q: &v1::QueryAudit) -> Result<Principal, Refusal> {
        if !q.event_id.is_empty() && call.only_from(&[subjects::GATEWAY], "reading one event's audit row").is_ok() {
            return call.principal(&self.rt).await;
        }
        self.admin(call, "reading the audit ledger").await
    }

    /// `ExportAudit`: a page of an export (R-AUDIT-3); see the message's documentation.
    async fn export(&self, r: v1::ExportAudit) -> Result<Reply, Refusal> {
        use atasira_domain::audit::export;
        let db = &self.rt.db;
        let out_of_range = |name: &str| Refusal::new(ErrorCode::InvalidQuery, format!("{name} is out of range"));
        let since = match r.since.as_ref() {
            None => None,
            Some(t) => Some(convert::time_from_wire(Some(t)).ok_or_else(|| out_of_range("since"))?),
        };
        let until = match r.until.as_ref() {
            None => None,
            Some(t) => Some(convert::time_from_wire(Some(t)).ok_or_else(|| out_of_range("until"))?),
        };
        let limit = i64::from(if r.limit == 0 { EXPORT_PAGE } else { r.limit.min(EXPORT_PAGE) });
        let after = i64::try_from(r.after).map_err(|_| Refusal::new(ErrorCode::InvalidCursor, "the cursor is out of range"))?;
        if after == 0
            && let Err(e) = ledger::checkpoint(db, &self.keys).await
        {
            // Everything up to now should be covered by a signed checkpoint.
            tracing::warn!(error = %e, "could not record a checkpoint before the export; the newest rows may be uncovered");
        }
        let signed = ledger::signed_checkpoints(db).await.map_err(Refusal::internal)?;
        let (from_seq, to_seq, after) = if after == 0 {
            match ledger::seqs_between(db, since, until).await.map_err(Refusal::internal)? {
                Some((lo, hi)) => {
                    let segments: Vec<(i64, i64)> = signed.iter().map(|p| (p.signed.covers_after, p.checkpoint.seq)).collect();
                    let (from, to) = export::export_range(lo, hi, &segments);
                    (from, to, from - 1)
                }
                None => (0, 0, 0),
            }
        } else {
            (0, r.to_seq, after)
        };
        let upto = (after + limit).min(to_seq);
        let rows = if upto > after { ledger::rows_between(db, after, upto).await.map_err(Refusal::internal)? } else { Vec::new() };
        let checkpoints = signed.iter().filter(|p| p.checkpoint.seq > after && p.checkpoint.seq <= upto).map(convert::checkpoint_proof_to_wire).collect();
        Ok(reply_ok(&v1::AuditExportPage {
            rows: rows.iter().map(convert::ledger_row_to_wire).collect(),
            checkpoints,
            next_cursor: if upto < to_seq { u64::try_from(upto).unwrap_or(0) } else { 0 },
            from_seq,
            to_seq,
            public_key: export::checkpoint_public_key(&self.keys),
        }))
    }

    async fn dispatch(&self, call: &Call) -> Result<Reply, Refusal> {
        let request = match AuditRequest::decode(&call.env)? {
            Incoming::Wait(w) => return platform_service::wait_reply(&self.rt, READ_MODELS, &w).await,
            Incoming::Request(request) => request,
        };
        match request {
            AuditRequest::Query(q) => {
                self.reader(call, &q).await?;
                if q.action.contains('\0') || q.target.contains('\0') || q.event_id.contains('\0') {
                    return Err(Refusal::new(ErrorCode::InvalidQuery, "action, target and event_id must not contain NUL characters"));
                }
                let since = match &q.since {
                    None => None,
                    Some(t) => Some(convert::time_from_wire(Some(t)).ok_or_else(|| Refusal::new(ErrorCode::InvalidQuery, "since is out of range"))?),
                };
                let after_seq = i64::try_from(q.after).map_err(|_| Refusal::new(ErrorCode::InvalidCursor, "the cursor is out of range"))?;
                let filter = Filter { action: &q.action, target: &q.target, since, event_id: &q.event_id };
                let (rows, next_cursor) = ledger::page(&self.rt.db, filter, q.limit, after_seq).await.map_err(Refusal::internal)?;
                let next_cursor = if next_cursor.is_empty() { 0 } else { next_cursor.parse().map_err(Refusal::internal)? };
                Ok(reply_ok(&v1::AuditPage { rows: rows.iter().map(convert::ledger_row_to_wire).collect(), next_cursor }))
            }
            AuditRequest::Export(r) => {
                self.admin(call, "exporting the audit ledger").await?;
                self.export(r).await
            }
            AuditRequest::Verify(_) => {
                self.admin(call, "verifying the audit ledger").await?;
                let verification = ledger::verify(&self.rt.db, &self.keys).await.map_err(Refusal::internal)?;
                Ok(reply_ok(&convert::verification_to_wire(&verification)))
            }
            AuditRequest::RegisterWebhook(r) => {
                call.only_from(&[subjects::GATEWAY], "registering a webhook")?;
                let principal = self.admin(call, "registering a webhook").await?;
                notifier::register(&self.rt, &self.keys, &principal, r).await
            }
            AuditRequest::RemoveWebhook(r) => {
                call.only_from(&[subjects::GATEWAY], "removing a webhook")?;
                let principal = self.admin(call, "removing a webhook").await?;
                notifier::remove(&self.rt, &principal, r).await
            }
            AuditRequest::ListWebhooks(_) => {
                self.admin(call, "listing webhooks").await?;
                notifier::list(&self.rt.db).await
            }
            AuditRequest::ListWebhookDeliveries(r) => {
                self.admin(call, "reading webhook deliveries").await?;
                notifier::deliveries(&self.rt.db, r).await
            }
        }
    }
}

#[cfg(test)]
mod tests;
