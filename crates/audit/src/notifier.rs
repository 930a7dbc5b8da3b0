//! Approvers hear about decisions waiting for them (R-NOTIFY-1): the notifier reads drafts,
//! Workers, provisioning and webhooks from the store in commit order (a durable consumer,
//! like the ledger writer) and queues one delivery per announcement and webhook; a sender
//! posts them, signed, tries failed ones again with doubling waits, and gives up after the
//! attempts the operator allows: the delivery is dead-lettered, and the loss is a ledger
//! row (`webhook.dead_letter`). With NATS, every announcement is also published on
//! [`subjects::APPROVERS`] for subscribers.
//!
//! What is announced and how a delivery is signed and retried is decided in
//! `atasira_domain::notify`; this is the IO around it. A webhook's secret is derived from
//! the audit key named in its registration ([`AuditKeys::derive`]): never stored, the same
//! on every replica.
//!
//! Architecture Invariant: the queue (`webhook_deliveries`) is operational state, not a
//! projection: it is never rebuilt (a rebuild would announce the past again). Each
//! delivery's id derives from its webhook and its event, so an event read twice queues
//! nothing twice.

use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::{convert, reply_ok, reply_written, subjects, v1};
use atasira_domain::aggregates::access::AccessEvent;
use atasira_domain::aggregates::boxes::{BoxAggregate, BoxEvent, BoxRole};
use atasira_domain::aggregates::bundle::BundleEvent;
use atasira_domain::aggregates::draft::DraftEvent;
use atasira_domain::aggregates::notification::{Notification, NotificationCommand};
use atasira_domain::aggregates::types;
use atasira_domain::aggregates::webhook::{WEBHOOK_ID_PREFIX, Webhook, WebhookCommand, WebhookEvent};
use atasira_domain::aggregates::worker::{Notification as WorkerNotification, WorkerEvent};
use atasira_domain::audit::AuditKeys;
use atasira_domain::decide::{Facts, ToolCall, Verdict};
use atasira_domain::manifest::BoxManifest;
use atasira_domain::notify::{self, Announcement, Attempt, Format, Next, RetryPolicy};
use atasira_domain::worker::WorkerState;
use atasira_domain::{ErrorCode, FieldError, Principal};
use atasira_platform::Runtime;
use atasira_platform::projection as proj;
use atasira_platform::refusal::Refusal;
use atasira_platform::store::{Db, Retry, StoredEvent};
use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use sqlx::{Any, Row, Transaction};
use tokio::sync::watch;

/// The consumer's name (checkpoint, feed, waits).
pub const NAME: &str = "notifier";

/// What it reads.
pub const READS: &[&str] = &[types::DRAFT, types::WORKER, types::ACCESS, types::WEBHOOK];

/// The deliveries' target for the NATS subject (no webhook).
const BUS: &str = "";

/// The deliveries' target for a Box's own notifications (`notify.<channel>`).
const BOX: &str = "box";

/// Announcements older than this are not published on NATS when the notifier first reads
/// them (a new notifier on an old store does not announce the past).
const BUS_WINDOW: chrono::TimeDelta = chrono::TimeDelta::hours(1);

/// Deliveries a sender pass takes at most.
const PASS: i64 = 32;

/// How long a receiver has to answer.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The notifier's tables: webhooks as their events leave them, and the delivery queue.
pub const SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS webhooks (
        webhook_id TEXT PRIMARY KEY,
        url TEXT NOT NULL,
        format TEXT NOT NULL,
        kinds_json TEXT NOT NULL,
        key_id TEXT NOT NULL,
        registered_by TEXT NOT NULL,
        registered_at_ms BIGINT NOT NULL,
        removed INTEGER NOT NULL DEFAULT 0
    )",
    "CREATE TABLE IF NOT EXISTS webhook_deliveries (
        delivery_id TEXT PRIMARY KEY,
        webhook_id TEXT NOT NULL,
        event_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        body TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL,
        next_at_ms BIGINT NOT NULL,
        last_status INTEGER NOT NULL,
        last_error TEXT NOT NULL,
        created_at_ms BIGINT NOT NULL,
        updated_at_ms BIGINT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS webhook_deliveries_due ON webhook_deliveries (state, next_at_ms)",
    "CREATE INDEX IF NOT EXISTS webhook_deliveries_of ON webhook_deliveries (webhook_id, created_at_ms)",
];

/// How the notifier runs.
#[derive(Debug, Clone)]
pub struct NotifierConfig {
    /// The dashboard's address, links start there (`ATASIRA_PUBLIC_URL`).
    pub public_url: String,
    /// Attempts and backoff (`ATASIRA_WEBHOOK_ATTEMPTS`, `ATASIRA_WEBHOOK_BACKOFF`).
    pub retry: RetryPolicy,
    /// Whether announcements also go out on NATS (cluster mode).
    pub on_bus: bool,
    /// Where the secrets of Boxes' notify channels are (`ATASIRA_SECRETS_DIR`):
    /// `<dir>/<vault>/<item>.json`, named by the manifest's `notify.<channel>.vault` and
    /// `item`, never in the manifest itself.
    pub secrets_dir: std::path::PathBuf,
}

impl Default for NotifierConfig {
    fn default() -> Self {
        NotifierConfig { public_url: "http://127.0.0.1:8080".to_owned(), retry: RetryPolicy::default(), on_bus: false, secrets_dir: "secrets".into() }
    }
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn now_ms() -> i64 {
    ms(Utc::now())
}

fn delivery_id(webhook_id: &str, event_id: &str) -> String {
    let h = Sha256::digest(format!("{webhook_id}\n{event_id}").as_bytes());
    format!("dlv_{}", hex::encode(&h[..12]))
}

/// The secret that signs webhook `webhook_id`'s deliveries, from audit key `key_id`.
pub fn secret_of(keys: &AuditKeys, key_id: &str, webhook_id: &str) -> Option<String> {
    keys.derive(key_id, &format!("webhook/{webhook_id}")).map(|hex| format!("whsec_{hex}"))
}

/// The consumer: queues the deliveries of each batch of events, with its checkpoint.
pub async fn consume(rt: Runtime, config: Arc<NotifierConfig>, wake: Arc<tokio::sync::Notify>, shutdown: watch::Receiver<bool>) {
    let db = rt.db.clone();
    proj::consume_batches(rt.db.clone(), rt.feeds.lingering_unless_waited_for(&[types::WEBHOOK]), NAME, READS, shutdown, move |events| {
        let (db, config, wake) = (db.clone(), config.clone(), wake.clone());
        async move {
            atasira_platform::failpoint_delay("notifier.batch").await;
            let queued = queue_batch(&db, &config, &events).await?;
            if queued > 0 {
                wake.notify_one();
            }
            Ok(())
        }
    })
    .await
}

async fn queue_batch(db: &Db, config: &NotifierConfig, events: &[StoredEvent]) -> anyhow::Result<usize> {
    let Some(last) = events.last() else { return Ok(0) };
    // Most batches announce nothing anyone listens to (a draft submitted while no webhook
    // is registered): they only move the checkpoint, in one statement, instead of a
    // transaction that holds the writer while it looks for targets event by event.
    if queues_nothing(db, config, events).await? {
        proj::mark_batch_processed(db, NAME, events).await?;
        return Ok(0);
    }
    let mut tx = db.begin_consumer().await?;
    let fresh = proj::mark_and_advance(&mut tx, NAME, events).await?;
    let mut queued = 0;
    for event in events.iter().filter(|e| fresh.contains(&e.event_id)) {
        if event.aggregate_type == types::WEBHOOK {
            apply_webhook(&mut tx, &event.decode::<WebhookEvent>()?).await?;
            continue;
        }
        if let Some(box_notice) = box_notification(event)? {
            queued += queue_box_notification(&mut tx, &event.event_id, &box_notice).await?;
            continue;
        }
        let Some(announcement) = announcement_of(&mut tx, event).await? else { continue };
        queued += queue(&mut tx, config, &announcement).await?;
    }
    tx.commit().await?;
    db.progressed_to(NAME, last.cursor(), events.iter().map(|e| e.event_id.as_str()));
    Ok(queued)
}

/// Whether `events` queue no delivery and change no webhook: they hold only draft and
/// provisioning events (what those announce follows from the event alone), and no live
/// webhook wants what they announce, nor the NATS subject. The webhooks are read outside
/// the batch's transaction: only this consumer writes them, from webhook events, and a
/// batch that holds one is never judged here.
async fn queues_nothing(db: &Db, config: &NotifierConfig, events: &[StoredEvent]) -> anyhow::Result<bool> {
    let mut kinds = Vec::new();
    for event in events {
        let Some(announcement) = announcement_from(event)? else { return Ok(false) };
        if let Some(a) = announcement {
            if config.on_bus && Utc::now() - a.at < BUS_WINDOW {
                return Ok(false);
            }
            kinds.push(a.kind);
        }
    }
    if kinds.is_empty() {
        return Ok(true);
    }
    let webhooks = live_webhooks(db.any()).await?;
    Ok(!kinds.iter().any(|kind| webhooks.iter().any(|(_, _, wanted)| wants(wanted, kind))))
}

/// The live webhooks: id, format and the kinds each wants (none: every kind).
async fn live_webhooks<'e>(on: impl sqlx::Executor<'e, Database = Any>) -> anyhow::Result<Vec<(String, Format, Vec<String>)>> {
    let rows = sqlx::query("SELECT webhook_id, format, kinds_json FROM webhooks WHERE removed = 0").fetch_all(on).await?;
    rows.iter()
        .map(|row| {
            let kinds: Vec<String> = serde_json::from_str(&row.try_get::<String, _>(2)?)?;
            Ok((row.try_get(0)?, Format::parse(&row.try_get::<String, _>(1)?).unwrap_or(Format::Json), kinds))
        })
        .collect()
}

/// Whether a webhook that wants `wanted` (none: every kind) is sent `kind`.
fn wants(wanted: &[String], kind: &str) -> bool {
    wanted.is_empty() || wanted.iter().any(|k| k == kind)
}

/// What approvers are told of a draft or provisioning event, which follows from the event
/// alone; `None` for an event of another type.
fn announcement_from(event: &StoredEvent) -> anyhow::Result<Option<Option<Announcement>>> {
    Ok(match event.aggregate_type.as_str() {
        types::DRAFT => Some(notify::of_draft(&event.decode::<DraftEvent>()?, &event.event_id)),
        types::ACCESS => Some(notify::of_access(&event.decode::<AccessEvent>()?, &event.event_id)),
        _ => None,
    })
}

/// What approvers are told of `event`, if anything.
async fn announcement_of(tx: &mut Transaction<'static, Any>, event: &StoredEvent) -> anyhow::Result<Option<Announcement>> {
    if let Some(announcement) = announcement_from(event)? {
        return Ok(announcement);
    }
    Ok(match event.aggregate_type.as_str() {
        types::WORKER => match event.decode::<WorkerEvent>()? {
            asked @ WorkerEvent::WorkerToolUseRequested { .. } => {
                let box_type = match first_event::<WorkerEvent>(&mut **tx, types::WORKER, &event.aggregate_id).await? {
                    Some(WorkerEvent::WorkerCreated { box_type, .. }) => box_type,
                    _ => String::new(),
                };
                notify::of_worker(&asked, &event.event_id, &box_type)
            }
            WorkerEvent::WorkerFinished { worker_id, box_id, state: WorkerState::Failed, exit_code, result, at, .. } => {
                let Some(WorkerEvent::WorkerCreated { box_type, bundle_digest, created_by, .. }) =
                    first_event::<WorkerEvent>(&mut **tx, types::WORKER, &worker_id).await?
                else {
                    return Ok(None);
                };
                let escalates = match first_event::<BundleEvent>(&mut **tx, types::CONFIG_BUNDLE, &bundle_digest).await? {
                    Some(BundleEvent::ConfigBundleSynced { manifest, .. }) => manifest.loop_control.escalate_on_failure,
                    _ => false,
                };
                if !escalates {
                    return Ok(None);
                }
                let primaries = primaries_of(tx, &box_id).await?;
                let failure = notify::Failure {
                    worker_id: &worker_id,
                    box_id: &box_id,
                    box_type: &box_type,
                    exit_code,
                    result: &result,
                    launched_by: &created_by,
                    primaries,
                    at,
                };
                Some(notify::of_failure(&failure, &event.event_id))
            }
            _ => None,
        },
        _ => None,
    })
}

/// The first event of a stream, decoded (a Worker's creation, a bundle's sync).
async fn first_event<'e, E: serde::de::DeserializeOwned>(
    on: impl sqlx::Executor<'e, Database = Any>,
    aggregate_type: &str,
    id: &str,
) -> anyhow::Result<Option<E>> {
    let row = sqlx::query("SELECT CAST(payload AS TEXT) FROM events WHERE aggregate_type = $1 AND aggregate_id = $2 AND sequence = 1")
        .bind(aggregate_type)
        .bind(id)
        .fetch_optional(on)
        .await?;
    Ok(match row {
        Some(row) => serde_json::from_str::<E>(&row.try_get::<String, _>(0)?).ok(),
        None => None,
    })
}

/// The Box's primary users now, from its stream.
async fn primaries_of(tx: &mut Transaction<'static, Any>, box_id: &str) -> anyhow::Result<Vec<String>> {
    let rows = sqlx::query("SELECT CAST(payload AS TEXT) FROM events WHERE aggregate_type = $1 AND aggregate_id = $2 ORDER BY sequence")
        .bind(types::BOX)
        .bind(box_id)
        .fetch_all(&mut **tx)
        .await?;
    let mut the_box = BoxAggregate::default();
    for row in rows {
        the_box.evolve(serde_json::from_str::<BoxEvent>(&row.try_get::<String, _>(0)?)?);
    }
    Ok(the_box.data.map(|d| d.assignments.into_iter().filter(|(_, role)| *role == BoxRole::Primary).map(|(user, _)| user).collect()).unwrap_or_default())
}

async fn apply_webhook(tx: &mut Transaction<'static, Any>, event: &WebhookEvent) -> anyhow::Result<()> {
    match event {
        WebhookEvent::WebhookRegistered { webhook_id, url, format, kinds, key_id, registered_by, at } => {
            sqlx::query(
                "INSERT INTO webhooks (webhook_id, url, format, kinds_json, key_id, registered_by, registered_at_ms, removed)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 0) ON CONFLICT (webhook_id) DO NOTHING",
            )
            .bind(webhook_id)
            .bind(url)
            .bind(format.as_str())
            .bind(serde_json::to_string(kinds)?)
            .bind(key_id)
            .bind(registered_by)
            .bind(ms(*at))
            .execute(&mut **tx)
            .await?;
        }
        WebhookEvent::WebhookRemoved { webhook_id, at, .. } => {
            sqlx::query("UPDATE webhooks SET removed = 1 WHERE webhook_id = $1").bind(webhook_id).execute(&mut **tx).await?;
            // What was still being tried for it is given up (no one to deliver to).
            sqlx::query("UPDATE webhook_deliveries SET state = 'dead', last_error = 'the webhook was removed', updated_at_ms = $2 WHERE webhook_id = $1 AND state = 'pending'")
                .bind(webhook_id)
                .bind(ms(*at))
                .execute(&mut **tx)
                .await?;
        }
        WebhookEvent::WebhookDeliveryDeadLettered { .. } => {}
    }
    Ok(())
}

/// A Box's notification the Worker's host allowed, as the sender delivers it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct BoxNotice {
    worker_id: String,
    notification: WorkerNotification,
}

fn box_notification(event: &StoredEvent) -> anyhow::Result<Option<BoxNotice>> {
    if event.aggregate_type != types::WORKER || event.event_type != "WorkerNotificationRequested" {
        return Ok(None);
    }
    Ok(match event.decode::<WorkerEvent>()? {
        WorkerEvent::WorkerNotificationRequested { worker_id, notification, .. } => Some(BoxNotice { worker_id, notification }),
        _ => None,
    })
}

/// Queues a Box's notification (one delivery, to its channel); how many (1).
async fn queue_box_notification(tx: &mut Transaction<'static, Any>, event_id: &str, notice: &BoxNotice) -> anyhow::Result<usize> {
    let kind = format!("box.{}", notice.notification.channel);
    enqueue(tx, BOX, event_id, &kind, serde_json::to_string(notice)?).await?;
    Ok(1)
}

/// Queues one delivery of event `event_id` to `target`, due now (once: its id derives from
/// the target and the event).
async fn enqueue(tx: &mut Transaction<'static, Any>, target: &str, event_id: &str, kind: &str, body: String) -> anyhow::Result<()> {
    sqlx::query(
        "INSERT INTO webhook_deliveries (delivery_id, webhook_id, event_id, kind, body, state, attempts, next_at_ms, last_status, last_error, created_at_ms, updated_at_ms)
         VALUES ($1, $2, $3, $4, $5, 'pending', 0, $6, 0, '', $6, $6) ON CONFLICT (delivery_id) DO NOTHING",
    )
    .bind(delivery_id(target, event_id))
    .bind(target)
    .bind(event_id)
    .bind(kind)
    .bind(body)
    .bind(now_ms())
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Queues `a` for every live webhook that wants its kind (and the NATS subject); how many.
async fn queue(tx: &mut Transaction<'static, Any>, config: &NotifierConfig, a: &Announcement) -> anyhow::Result<usize> {
    let mut targets: Vec<(String, Format)> =
        live_webhooks(&mut **tx).await?.into_iter().filter(|(_, _, wanted)| wants(wanted, &a.kind)).map(|(id, format, _)| (id, format)).collect();
    if config.on_bus && Utc::now() - a.at < BUS_WINDOW {
        targets.push((BUS.to_owned(), Format::Json));
    }
    for (webhook_id, format) in &targets {
        enqueue(tx, webhook_id, &a.event_id, &a.kind, serde_json::to_string(&notify::body(a, *format, &config.public_url))?).await?;
    }
    Ok(targets.len())
}

/// A delivery due now.
struct Due {
    delivery_id: String,
    webhook_id: String,
    event_id: String,
    kind: String,
    body: String,
    attempts: u32,
    url: String,
    key_id: String,
}

/// The sender: while this replica holds it, sends due deliveries, then waits for the next
/// due one or a wake-up from the consumer.
pub async fn send(rt: Runtime, keys: Arc<AuditKeys>, config: Arc<NotifierConfig>, wake: Arc<tokio::sync::Notify>, mut shutdown: watch::Receiver<bool>) {
    loop {
        let Some(mut lease) = atasira_platform::exclusive::acquire(&rt.db, "notifier-sender", &mut shutdown).await else { return };
        tokio::select! {
            () = send_loop(&rt, &keys, &config, &wake) => {}
            () = lease.lost() => tracing::warn!("the notifier's sender lock was lost; competing for it again"),
            () = atasira_platform::service::until_shutdown(shutdown.clone()) => return,
        }
    }
}

async fn send_loop(rt: &Runtime, keys: &AuditKeys, config: &NotifierConfig, wake: &tokio::sync::Notify) {
    let mut warned = false;
    loop {
        match due(&rt.db).await {
            Ok(batch) => {
                warned = false;
                let full = batch.len() as i64 >= PASS;
                let sends = batch.into_iter().map(|d| deliver(rt, keys, config, d));
                futures::future::join_all(sends).await;
                if full {
                    continue;
                }
            }
            Err(e) => {
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!(error = %e, "could not read the webhook deliveries; trying again");
                }
            }
        }
        let wait = next_due_in(&rt.db).await.unwrap_or(Duration::from_secs(1)).min(Duration::from_secs(1));
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            () = wake.notified() => {}
        }
    }
}

async fn due(db: &Db) -> anyhow::Result<Vec<Due>> {
    let rows = sqlx::query(
        "SELECT d.delivery_id, d.webhook_id, d.event_id, d.kind, d.body, d.attempts, COALESCE(w.url, ''), COALESCE(w.key_id, '')
           FROM webhook_deliveries d LEFT JOIN webhooks w ON w.webhook_id = d.webhook_id
          WHERE d.state = 'pending' AND d.next_at_ms <= $1 ORDER BY d.next_at_ms LIMIT $2",
    )
    .bind(now_ms())
    .bind(PASS)
    .fetch_all(db.any())
    .await?;
    rows.iter()
        .map(|r| {
            Ok(Due {
                delivery_id: r.try_get(0)?,
                webhook_id: r.try_get(1)?,
                event_id: r.try_get(2)?,
                kind: r.try_get(3)?,
                body: r.try_get(4)?,
                attempts: u32::try_from(r.try_get::<i64, _>(5)?).unwrap_or(0),
                url: r.try_get(6)?,
                key_id: r.try_get(7)?,
            })
        })
        .collect()
}

async fn next_due_in(db: &Db) -> Option<Duration> {
    let next: Option<i64> = sqlx::query_scalar("SELECT MIN(next_at_ms) FROM webhook_deliveries WHERE state = 'pending'").fetch_one(db.any()).await.ok()?;
    next.map(|at| Duration::from_millis(u64::try_from(at - now_ms()).unwrap_or(0)))
}

/// One attempt at `d`, and what follows it.
async fn deliver(rt: &Runtime, keys: &AuditKeys, config: &NotifierConfig, d: Due) {
    if d.webhook_id == BOX {
        return deliver_box(rt, config, d).await;
    }
    let attempt = if d.webhook_id == BUS {
        match rt.bus.publish(subjects::APPROVERS, d.body.clone().into()).await {
            Ok(()) => Attempt::Status(200),
            Err(e) => Attempt::Failed(e.to_string()),
        }
    } else {
        match secret_of(keys, &d.key_id, &d.webhook_id) {
            Some(secret) => post(&d, &secret).await,
            None => Attempt::Failed(format!("the audit key {:?} its secret derives from is no longer configured", d.key_id)),
        }
    };
    let n = d.attempts + 1;
    let next = notify::after(n, &attempt, config.retry);
    let (status, error) = described(&attempt);
    if !record_attempt(rt, &d, n, &next, status, &error).await {
        return;
    }
    match next {
        Next::Delivered => tracing::debug!(delivery_id = d.delivery_id, kind = d.kind, "announcement delivered"),
        Next::RetryIn(wait) => {
            tracing::info!(delivery_id = d.delivery_id, attempt = n, error, wait_ms = wait.as_millis() as u64, "delivery failed; trying again")
        }
        Next::DeadLetter if d.webhook_id == BUS => tracing::warn!(delivery_id = d.delivery_id, error, "could not publish an announcement; given up"),
        Next::DeadLetter => {
            tracing::warn!(delivery_id = d.delivery_id, webhook_id = d.webhook_id, error, "delivery given up after {n} attempts");
            let command = WebhookCommand::DeadLetter {
                delivery_id: d.delivery_id.clone(),
                event_id: d.event_id.clone(),
                kind: d.kind.clone(),
                attempts: n,
                last_error: error,
                at: Utc::now(),
            };
            if let Err(e) = rt.db.cqrs::<Webhook>().execute(&d.webhook_id, command, Default::default(), Retry::CONTENDED).await {
                tracing::warn!(delivery_id = d.delivery_id, error = e.message, "could not record the dead letter on the ledger");
            }
        }
    }
}

/// What a Box's notification attempt came to.
enum Sent {
    Tried(Attempt),
    /// Not allowed by the Box's grant: given up at once.
    Refused(String),
}

/// One attempt at a Box's notification: checked again against the Worker's bundle (the
/// host decided it; this process does not take that on trust), then sent with the secret
/// the operator configured for the channel's vault and item. Its outcome is an event on the
/// notification's stream (a ledger row) once it is final.
async fn deliver_box(rt: &Runtime, config: &NotifierConfig, d: Due) {
    let notice: Option<BoxNotice> = serde_json::from_str(&d.body).ok();
    let sent = match &notice {
        Some(notice) => send_box(rt, config, notice).await,
        None => Sent::Refused("the queued notification does not read".to_owned()),
    };
    let n = d.attempts + 1;
    let (next, status, error) = match &sent {
        Sent::Refused(why) => (Next::DeadLetter, 0, why.clone()),
        Sent::Tried(attempt) => {
            let (status, error) = described(attempt);
            (notify::after(n, attempt, config.retry), status, error)
        }
    };
    if !record_attempt(rt, &d, n, &next, status, &error).await {
        return;
    }
    let Some(notice) = notice else { return };
    let (id, worker_id, channel) = (notice.notification.notification_id.clone(), notice.worker_id.clone(), notice.notification.channel.clone());
    let at = Utc::now();
    let command = match (next, sent) {
        (Next::RetryIn(wait), _) => {
            tracing::info!(notification_id = id, attempt = n, error, wait_ms = wait.as_millis() as u64, "a Box's notification failed; trying again");
            return;
        }
        (Next::Delivered, _) => NotificationCommand::Sent { notification_id: id.clone(), worker_id, channel, to: notice.notification.to, attempts: n, at },
        (Next::DeadLetter, Sent::Refused(reason)) => NotificationCommand::Refused { notification_id: id.clone(), worker_id, channel, reason, at },
        (Next::DeadLetter, Sent::Tried(_)) => {
            NotificationCommand::Failed { notification_id: id.clone(), worker_id, channel, attempts: n, last_error: error, at }
        }
    };
    if let Err(e) = rt.db.cqrs::<Notification>().execute(&id, command, Default::default(), Retry::CONTENDED).await {
        tracing::warn!(notification_id = id, error = e.message, "could not record the notification's outcome on the ledger");
    }
}

/// An attempt as the delivery list shows it: the status (0 without an answer) and what
/// went wrong ("" when it went through).
fn described(attempt: &Attempt) -> (i64, String) {
    match attempt {
        Attempt::Status(s) if (200..300).contains(s) => (i64::from(*s), String::new()),
        Attempt::Status(s) => (i64::from(*s), format!("the receiver answered {s}")),
        Attempt::Failed(why) => (0, why.chars().take(512).collect()),
    }
}

/// Records attempt `n` at `d` and what follows it; whether it was recorded.
async fn record_attempt(rt: &Runtime, d: &Due, n: u32, next: &Next, status: i64, error: &str) -> bool {
    let (state, next_at) = match next {
        Next::Delivered => ("delivered", now_ms()),
        Next::RetryIn(wait) => ("pending", now_ms() + i64::try_from(wait.as_millis()).unwrap_or(i64::MAX / 2)),
        Next::DeadLetter => ("dead", now_ms()),
    };
    let updated = sqlx::query(
        "UPDATE webhook_deliveries SET state = $2, attempts = $3, next_at_ms = $4, last_status = $5, last_error = $6, updated_at_ms = $7 WHERE delivery_id = $1 AND state = 'pending'",
    )
    .bind(&d.delivery_id)
    .bind(state)
    .bind(i64::from(n))
    .bind(next_at)
    .bind(status)
    .bind(error)
    .bind(now_ms())
    .execute(rt.db.any())
    .await;
    match updated {
        Ok(done) => done.rows_affected() == 1,
        Err(e) => {
            tracing::warn!(delivery_id = d.delivery_id, error = %e, "could not record a delivery attempt; it is tried again");
            false
        }
    }
}

/// The Worker's Box manifest as its bundle pins it.
async fn manifest_of_worker(db: &Db, worker_id: &str) -> anyhow::Result<Option<BoxManifest>> {
    let Some(WorkerEvent::WorkerCreated { bundle_digest, .. }) = first_event::<WorkerEvent>(db.any(), types::WORKER, worker_id).await? else {
        return Ok(None);
    };
    Ok(match first_event::<BundleEvent>(db.any(), types::CONFIG_BUNDLE, &bundle_digest).await? {
        Some(BundleEvent::ConfigBundleSynced { manifest, .. }) => Some(manifest.effective()),
        _ => None,
    })
}

/// A vault or item name as a path component: letters, digits, `.`, `_`, `-`, not leading `.`.
fn safe_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 128 && !name.starts_with('.') && name.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

async fn send_box(rt: &Runtime, config: &NotifierConfig, notice: &BoxNotice) -> Sent {
    let n = &notice.notification;
    let manifest = match manifest_of_worker(&rt.db, &notice.worker_id).await {
        Ok(Some(m)) => m,
        Ok(None) => return Sent::Refused("the Worker's bundle is unknown".to_owned()),
        Err(e) => return Sent::Tried(Attempt::Failed(format!("cannot read the Worker's bundle: {e}"))),
    };
    let tool_scope = manifest.effective_tools();
    let grant = atasira_domain::decide::Grant { manifest: &manifest, workspace: "", tool_scope: &tool_scope };
    let call = ToolCall { tool: format!("notify:{}", n.channel), input: serde_json::json!({"to": n.to, "broadcast": n.broadcast}) };
    let decision = atasira_domain::decide::decide(grant, &call, &Facts::default());
    if decision.decision != Verdict::Allow {
        return Sent::Refused(format!("{}: {}", decision.rule, decision.reason));
    }
    let Some(declared) = manifest.notify.get(&n.channel) else { return Sent::Refused(format!("notify.{}: not declared", n.channel)) };
    if !safe_name(&declared.vault) || !safe_name(&declared.item) {
        return Sent::Refused(format!("notify.{}: vault and item must be plain names", n.channel));
    }
    let path = config.secrets_dir.join(&declared.vault).join(format!("{}.json", declared.item));
    let secret: serde_json::Value = match tokio::fs::read(&path).await.ok().and_then(|bytes| serde_json::from_slice(&bytes).ok()) {
        Some(v) => v,
        None => {
            return Sent::Tried(Attempt::Failed(format!(
                "no readable secret for vault {:?} item {:?} (the operator provides {}/<vault>/<item>.json)",
                declared.vault,
                declared.item,
                config.secrets_dir.display()
            )));
        }
    };
    match n.channel.as_str() {
        "email" => Sent::Tried(send_email(&secret, n).await),
        _ => Sent::Tried(post_notification(&secret, n).await),
    }
}

/// Sends `n` by email through the SMTP server the secret names: `{"smtp_url":
/// "smtp://host:port" | "smtps://host" (with `?tls=required` for STARTTLS), "from",
/// "username"?, "password"?}`.
async fn send_email(secret: &serde_json::Value, n: &WorkerNotification) -> Attempt {
    use lettre::AsyncTransport as _;
    let text = |k: &str| secret.get(k).and_then(serde_json::Value::as_str).unwrap_or_default().to_owned();
    let (url, from) = (text("smtp_url"), text("from"));
    let built = (|| -> Result<(lettre::AsyncSmtpTransport<lettre::Tokio1Executor>, lettre::Message), String> {
        let mut transport = lettre::AsyncSmtpTransport::<lettre::Tokio1Executor>::from_url(&url).map_err(|e| format!("smtp_url: {e}"))?.timeout(Some(TIMEOUT));
        if !text("username").is_empty() {
            transport = transport.credentials(lettre::transport::smtp::authentication::Credentials::new(text("username"), text("password")));
        }
        let mut message = lettre::Message::builder().from(from.parse().map_err(|e| format!("from: {e}"))?).subject(n.subject.clone());
        for to in &n.to {
            message = message.to(to.parse().map_err(|e| format!("recipient {to:?}: {e}"))?);
        }
        let message = message.header(lettre::message::header::ContentType::TEXT_PLAIN).body(n.body.clone()).map_err(|e| e.to_string())?;
        Ok((transport.build(), message))
    })();
    match built {
        Ok((transport, message)) => match transport.send(message).await {
            Ok(response) => Attempt::Status(if response.is_positive() { 200 } else { 500 }),
            Err(e) => Attempt::Failed(e.to_string()),
        },
        Err(e) => Attempt::Failed(e),
    }
}

/// Posts `n` as JSON (`{"to", "broadcast", "messages": [{"type": "text", "text"}]}`, the
/// shape of LINE's push and broadcast messages) to the webhook the secret names: `{"url",
/// "token"?}` (a bearer token, such as a LINE channel access token).
async fn post_notification(secret: &serde_json::Value, n: &WorkerNotification) -> Attempt {
    let url = secret.get("url").and_then(serde_json::Value::as_str).unwrap_or_default().to_owned();
    let token = secret.get("token").and_then(serde_json::Value::as_str).unwrap_or_default().to_owned();
    if notify::webhook_url_problem(&url).is_some() {
        return Attempt::Failed("the secret's url is not an http(s) URL".to_owned());
    }
    let text = if n.subject.is_empty() { n.body.clone() } else { format!("{}\n{}", n.subject, n.body) };
    let body = serde_json::json!({"to": n.to, "broadcast": n.broadcast, "messages": [{"type": "text", "text": text}]});
    let sent = tokio::task::spawn_blocking(move || {
        let agent = ureq::AgentBuilder::new().timeout(TIMEOUT).redirects(0).build();
        let mut request = agent.post(&url).set("Content-Type", "application/json");
        if !token.is_empty() {
            request = request.set("Authorization", &format!("Bearer {token}"));
        }
        match request.send_string(&body.to_string()) {
            Ok(response) => Attempt::Status(response.status()),
            Err(ureq::Error::Status(status, _)) => Attempt::Status(status),
            Err(ureq::Error::Transport(t)) => Attempt::Failed(t.to_string()),
        }
    })
    .await;
    sent.unwrap_or_else(|e| Attempt::Failed(e.to_string()))
}

/// POSTs the delivery, signed; how it went.
async fn post(d: &Due, secret: &str) -> Attempt {
    let timestamp = Utc::now().timestamp();
    let signature = notify::signature(secret, timestamp, d.body.as_bytes());
    let (url, body, kind, id) = (d.url.clone(), d.body.clone(), d.kind.clone(), d.delivery_id.clone());
    let sent = tokio::task::spawn_blocking(move || {
        let agent = ureq::AgentBuilder::new().timeout(TIMEOUT).redirects(0).build();
        let answer = agent
            .post(&url)
            .set("Content-Type", "application/json")
            .set("User-Agent", concat!("atasira/", env!("CARGO_PKG_VERSION")))
            .set(notify::SIGNATURE_HEADER, &signature)
            .set("X-Atasira-Event", &kind)
            .set("X-Atasira-Delivery", &id)
            .send_string(&body);
        match answer {
            Ok(response) => Attempt::Status(response.status()),
            Err(ureq::Error::Status(status, _)) => Attempt::Status(status),
            Err(ureq::Error::Transport(t)) => Attempt::Failed(t.to_string()),
        }
    })
    .await;
    sent.unwrap_or_else(|e| Attempt::Failed(e.to_string()))
}

// --- requests ------------------------------------------------------------------------------

/// `RegisterWebhook` (human admins): its events appended; the webhook and its secret.
pub async fn register(rt: &Runtime, keys: &AuditKeys, principal: &Principal, r: v1::RegisterWebhook) -> Result<atasira_contracts::Reply, Refusal> {
    if !principal.is_human_admin() {
        return Err(Refusal::new(ErrorCode::Forbidden, "registering a webhook needs a human admin"));
    }
    let mut errors = Vec::new();
    if let Some(problem) = notify::webhook_url_problem(&r.url) {
        errors.push(FieldError::new("url", problem));
    }
    let format = if r.format.is_empty() { Some(Format::Json) } else { Format::parse(&r.format) };
    if format.is_none() {
        errors.push(FieldError::new("format", "json or slack"));
    }
    for (i, kind) in r.kinds.iter().enumerate() {
        if !notify::KINDS.contains(&kind.as_str()) {
            errors.push(FieldError::new(format!("kinds[{i}]"), format!("one of {}", notify::KINDS.join(", "))));
        }
    }
    if r.kinds.len() > notify::KINDS.len() {
        errors.push(FieldError::new("kinds", format!("at most {}", notify::KINDS.len())));
    }
    if !errors.is_empty() {
        let message = atasira_domain::error::joined(&errors);
        return Err(Refusal { field_errors: errors, ..Refusal::new(ErrorCode::InvalidRequest, message) });
    }
    let webhook_id = format!("{WEBHOOK_ID_PREFIX}{}", uuid::Uuid::new_v4().simple());
    let key_id = keys.current_key_id().to_owned();
    let at = Utc::now();
    let mut kinds = r.kinds.clone();
    kinds.dedup();
    let command = WebhookCommand::Register {
        webhook_id: webhook_id.clone(),
        url: r.url.clone(),
        format: format.unwrap_or(Format::Json),
        kinds: kinds.clone(),
        key_id: key_id.clone(),
        by: principal.user_id.clone(),
        at,
    };
    let head = rt.db.cqrs::<Webhook>().execute(&webhook_id, command, Default::default(), Retry::ONCE).await?.head()?;
    let secret = secret_of(keys, &key_id, &webhook_id).ok_or_else(|| Refusal::internal("the current audit key derives no secret"))?;
    let webhook = v1::Webhook {
        webhook_id,
        url: r.url,
        format: format.unwrap_or(Format::Json).as_str().to_owned(),
        kinds,
        registered_by: principal.user_id.clone(),
        registered_at: Some(convert::timestamp(at)),
        delivered: 0,
        pending: 0,
        dead: 0,
    };
    Ok(reply_written(&v1::WebhookRegistered { webhook: Some(webhook), secret }, head.position, vec![head.id]))
}

/// `RemoveWebhook` (human admins).
pub async fn remove(rt: &Runtime, principal: &Principal, r: v1::RemoveWebhook) -> Result<atasira_contracts::Reply, Refusal> {
    if !principal.is_human_admin() {
        return Err(Refusal::new(ErrorCode::Forbidden, "removing a webhook needs a human admin"));
    }
    let mut webhook = find(&rt.db, &r.webhook_id).await?;
    let command = WebhookCommand::Remove { by: principal.user_id.clone(), at: Utc::now() };
    let receipt = rt.db.cqrs::<Webhook>().execute(&r.webhook_id, command, Default::default(), Retry::ONCE).await?;
    webhook.pending = 0;
    match receipt.events.last() {
        Some(at) => Ok(reply_written(&webhook, at.position, vec![at.id.clone()])),
        None => Ok(reply_ok(&webhook)),
    }
}

/// The webhook `webhook_id` with its delivery counts, if registered and not removed.
async fn find(db: &Db, webhook_id: &str) -> Result<v1::Webhook, Refusal> {
    list_where(db, Some(webhook_id))
        .await
        .map_err(Refusal::internal)?
        .pop()
        .ok_or_else(|| Refusal::new(ErrorCode::NotFound, format!("no webhook {:?}", webhook_id.chars().take(64).collect::<String>())))
}

/// `ListWebhooks` (admins).
pub async fn list(db: &Db) -> Result<atasira_contracts::Reply, Refusal> {
    let webhooks = list_where(db, None).await.map_err(Refusal::internal)?;
    Ok(reply_ok(&v1::WebhookList { webhooks }))
}

async fn list_where(db: &Db, webhook_id: Option<&str>) -> anyhow::Result<Vec<v1::Webhook>> {
    let filter = if webhook_id.is_some() { "AND w.webhook_id = $1" } else { "AND $1 = $1" };
    let sql = format!(
        "SELECT w.webhook_id, w.url, w.format, w.kinds_json, w.registered_by, w.registered_at_ms,
                (SELECT COUNT(*) FROM webhook_deliveries d WHERE d.webhook_id = w.webhook_id AND d.state = 'delivered'),
                (SELECT COUNT(*) FROM webhook_deliveries d WHERE d.webhook_id = w.webhook_id AND d.state = 'pending'),
                (SELECT COUNT(*) FROM webhook_deliveries d WHERE d.webhook_id = w.webhook_id AND d.state = 'dead')
           FROM webhooks w WHERE w.removed = 0 {filter} ORDER BY w.registered_at_ms, w.webhook_id"
    );
    let rows = sqlx::query(&sql).bind(webhook_id.unwrap_or_default()).fetch_all(db.any()).await?;
    let count = |r: &sqlx::any::AnyRow, i: usize| -> anyhow::Result<u32> { Ok(u32::try_from(r.try_get::<i64, _>(i)?).unwrap_or(u32::MAX)) };
    rows.iter()
        .map(|r| {
            Ok(v1::Webhook {
                webhook_id: r.try_get(0)?,
                url: r.try_get(1)?,
                format: r.try_get(2)?,
                kinds: serde_json::from_str(&r.try_get::<String, _>(3)?)?,
                registered_by: r.try_get(4)?,
                registered_at: DateTime::from_timestamp_millis(r.try_get(5)?).map(convert::timestamp),
                delivered: count(r, 6)?,
                pending: count(r, 7)?,
                dead: count(r, 8)?,
            })
        })
        .collect()
}

/// Most deliveries a page shows, and by default.
pub const DELIVERIES_MAX: u32 = 200;
pub const DELIVERIES_DEFAULT: u32 = 50;

/// `ListWebhookDeliveries` (admins): newest first.
pub async fn deliveries(db: &Db, r: v1::ListWebhookDeliveries) -> Result<atasira_contracts::Reply, Refusal> {
    if !["", "pending", "delivered", "dead"].contains(&r.state.as_str()) {
        return Err(Refusal::new(ErrorCode::InvalidQuery, "state is pending, delivered or dead"));
    }
    find(db, &r.webhook_id).await?;
    let limit = if r.limit == 0 { DELIVERIES_DEFAULT } else { r.limit.min(DELIVERIES_MAX) };
    let rows = sqlx::query(
        "SELECT delivery_id, webhook_id, event_id, kind, state, attempts, last_status, last_error, created_at_ms, updated_at_ms, next_at_ms
           FROM webhook_deliveries WHERE webhook_id = $1 AND ($2 = '' OR state = $2) ORDER BY created_at_ms DESC, delivery_id LIMIT $3",
    )
    .bind(&r.webhook_id)
    .bind(&r.state)
    .bind(i64::from(limit))
    .fetch_all(db.any())
    .await
    .map_err(Refusal::internal)?;
    let time = |v: i64| DateTime::from_timestamp_millis(v).map(convert::timestamp);
    let deliveries = rows
        .iter()
        .map(|r| -> anyhow::Result<v1::WebhookDelivery> {
            let state: String = r.try_get(4)?;
            Ok(v1::WebhookDelivery {
                delivery_id: r.try_get(0)?,
                webhook_id: r.try_get(1)?,
                event_id: r.try_get(2)?,
                kind: r.try_get(3)?,
                attempts: u32::try_from(r.try_get::<i64, _>(5)?).unwrap_or(0),
                last_status: i32::try_from(r.try_get::<i64, _>(6)?).unwrap_or(0),
                last_error: r.try_get(7)?,
                created_at: time(r.try_get(8)?),
                updated_at: time(r.try_get(9)?),
                next_attempt_at: if state == "pending" { time(r.try_get(10)?) } else { None },
                state,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()
        .map_err(Refusal::internal)?;
    Ok(reply_ok(&v1::WebhookDeliveryPage { deliveries }))
}
