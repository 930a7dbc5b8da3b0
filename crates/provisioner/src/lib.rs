//! The provisioner service (R-PROV-1): when a Box is activated with `required_access`
//! entries, sets each one up best-effort (git workspace, ssh Host entry, netrc entry),
//! retrying with backoff, and records each outcome as an `Access` event
//! (`AccessProvisioned` / `AccessProvisionFailed`).
//!
//! Architecture Invariant: a provisioning failure never touches the Box; this service
//! appends only `access`, `execution_binding` and its own security events. Managed files live under the data dir, never `~/.ssh`,
//! and no secret is ever written (only vault and item names).
//!
//! Delivery is at-least-once: the feed's checkpoint is stored only after every entry's
//! outcome is committed, so a crash re-runs the (idempotent) setups of that activation
//! and the `Access` aggregate drops the duplicate outcomes.
//!
//! It is also the execution host's side of a Worker launch (R-WORKER-3, `bindings`):
//! it prepares execution bindings for the gateway, hands each to one Worker when the
//! runtime registry claims it, and expires the ones nobody claimed within their lease.

mod bindings;
mod setup;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::requests::{Incoming, ProvisionerRequest};
use atasira_contracts::{Reply, subjects};
use atasira_domain::BoxType;
use atasira_domain::aggregates::access::{Access, AccessCommand};
use atasira_domain::aggregates::boxes::BoxEvent;
use atasira_domain::manifest::RequiredAccess;
use atasira_platform::Runtime;
use atasira_platform::projection::{self as proj, ReadModel};
use atasira_platform::refusal::Refusal;
use atasira_platform::service::{self as platform_service, Call};
use atasira_platform::store::{Cqrs, Retry, StoredEvent};
use tokio::sync::watch;

use crate::bindings::Bindings;
use crate::setup::{SetupError, Setups, describe};

/// The service name (also its subject token).
pub const SERVICE: &str = subjects::PROVISIONER;
/// Aggregate types whose events this service appends and relays.
pub const AGGREGATE_TYPES: &[&str] =
    &[atasira_domain::aggregates::types::ACCESS, atasira_domain::aggregates::types::PROVISIONER_SECURITY, atasira_domain::aggregates::types::EXECUTION_BINDING];

/// Durable feed name and checkpoint key (in `projection_checkpoints`, so read-your-writes
/// waits treat the provisioner like any projection).
const CHECKPOINT: &str = "provisioner";
/// What the feed reads.
const READS: &[&str] = &["box"];
/// The checkpoints `WaitForPosition` waits for, with the aggregate types they read.
const READ_MODELS: &[ReadModel] = &[ReadModel::new(CHECKPOINT, READS)];

/// Retry policy of one `required_access` entry (R-PROV-1: 5 attempts, 1 s doubling to
/// 30 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Tries in total, the first included (at least one is always made).
    pub attempts: u32,
    /// Pause after the first failed try; each later pause doubles.
    pub initial: Duration,
    /// No pause is longer than this.
    pub max: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { attempts: 5, initial: Duration::from_secs(1), max: Duration::from_secs(30) }
    }
}

impl Backoff {
    /// The default policy with another first delay (tests use 10 ms so failures are
    /// recorded quickly); the cap grows to it when it is longer.
    pub fn with_initial(initial: Duration) -> Self {
        let default = Self::default();
        Self { initial, max: default.max.max(initial), ..default }
    }

    /// The pause after failed try number `attempt` (1-based): `initial * 2^(attempt-1)`,
    /// capped at `max`.
    pub fn delay(&self, attempt: u32) -> Duration {
        let factor = 2u32.checked_pow(attempt.saturating_sub(1)).unwrap_or(u32::MAX);
        self.initial.checked_mul(factor).unwrap_or(self.max).min(self.max)
    }
}

/// Settings of the provisioner.
#[derive(Debug, Clone)]
pub struct ProvisionerConfig {
    /// Root of every managed file: `workspaces/<box_type>/` (git clones), `ssh/config`,
    /// `netrc`. Never the home directory (R-PROV-1).
    pub data_dir: PathBuf,
    /// Retry policy per entry.
    pub backoff: Backoff,
    /// The lease of an execution binding: unclaimed for this long, it expires.
    pub binding_ttl: Duration,
}

/// The final outcome of one entry after its retries.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Outcome {
    /// `Ok(detail)` or `Err(reason)`.
    result: Result<String, String>,
    /// Tries made.
    attempts: u32,
}

struct Service {
    rt: Runtime,
    setups: Setups,
    backoff: Backoff,
    access: Cqrs<Access>,
}

/// Starts the service: the bus endpoint (execution bindings, read-your-writes waits), the
/// feed of Box events and the binding sweeper. Returns when `shutdown` flips.
pub async fn run(rt: Runtime, config: ProvisionerConfig, shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
    tokio::fs::create_dir_all(&config.data_dir).await.map_err(|e| anyhow::anyhow!("cannot create the data dir {}: {e}", config.data_dir.display()))?;
    // A binding names its workspace as an absolute path: the Worker's tools run elsewhere.
    let data_dir = std::path::absolute(&config.data_dir).map_err(|e| anyhow::anyhow!("cannot resolve the data dir {}: {e}", config.data_dir.display()))?;
    let bindings = Arc::new(Bindings::new(rt.clone(), data_dir.join("workspaces"), config.binding_ttl));
    let service = Arc::new(Service { access: rt.db.cqrs::<Access>(), setups: Setups::new(data_dir), backoff: config.backoff, rt: rt.clone() });
    let endpoint = {
        let rt = rt.clone();
        platform_service::serve(&rt.clone(), SERVICE, move |call| {
            let (rt, bindings) = (rt.clone(), bindings.clone());
            async move { answer(&rt, &bindings, &call).await }
        })
        .await?
    };
    let worker = tokio::spawn(consume(service, shutdown.clone()));
    let sweeper = tokio::spawn(bindings::sweep(rt.clone(), config.binding_ttl, shutdown.clone()));
    platform_service::until_shutdown(shutdown).await;
    endpoint.stop();
    let _ = worker.await;
    let _ = sweeper.await;
    Ok(())
}

/// The bus endpoint: execution bindings (`PrepareBinding` from the gateway,
/// `ConsumeBinding` from the runtime registry), and `WaitForPosition`, so the gateway can
/// wait for provisioning to have seen an activation. A wait reveals nothing but
/// checkpoints, hence no principal check (like every service's wait).
async fn answer(rt: &Runtime, bindings: &Bindings, call: &Call) -> Result<Reply, Refusal> {
    match ProvisionerRequest::decode(&call.env)? {
        Incoming::Wait(w) => platform_service::wait_reply(rt, READ_MODELS, &w).await,
        Incoming::Request(ProvisionerRequest::PrepareBinding(r)) => bindings.prepare(call, r).await,
        Incoming::Request(ProvisionerRequest::ConsumeBinding(r)) => bindings.consume(call, r).await,
        Incoming::Request(ProvisionerRequest::ResolveBinding(r)) => bindings.resolve(call, r).await,
    }
}

/// The durable feed of Box events: each activation's entries are set up, then the event
/// is marked processed (checkpoint) and acked. Shutdown may cut an activation short:
/// nothing is checkpointed then, so it is delivered again and the finished entries dedupe.
async fn consume(service: Arc<Service>, shutdown: watch::Receiver<bool>) {
    let (db, feeds) = (service.rt.db.clone(), service.rt.feeds.clone());
    let acts_on = |event: &StoredEvent| matches!(event.decode::<BoxEvent>(), Ok(BoxEvent::BoxActivated { .. }));
    proj::consume_selected(db, feeds, CHECKPOINT, READS, shutdown, acts_on, move |event| {
        let service = service.clone();
        async move {
            service.handle(&event).await?;
            proj::mark_processed(&service.rt.db, CHECKPOINT, &event).await?;
            Ok(())
        }
    })
    .await
}

impl Service {
    /// Provisions an activation's entries in order and records each outcome; every other
    /// Box event is none of this service's business.
    async fn handle(&self, event: &StoredEvent) -> anyhow::Result<()> {
        let (box_id, manifest) = match event.decode::<BoxEvent>() {
            Ok(BoxEvent::BoxActivated { box_id, manifest, .. }) => (box_id, manifest),
            Ok(_) => return Ok(()),
            Err(e) => {
                // Retrying cannot make it readable; holding the feed would stall every
                // later activation.
                tracing::error!(event_id = %event.event_id, error = %e, "unreadable Box event; skipped");
                return Ok(());
            }
        };
        for (i, access) in manifest.required_access.iter().enumerate() {
            let index = u32::try_from(i)?;
            let outcome = provision(&self.setups, &self.backoff, &manifest.box_type, access).await;
            match &outcome.result {
                Ok(detail) => tracing::info!(box_id, index, attempts = outcome.attempts, "provisioned {}: {detail}", describe(access)),
                Err(reason) => tracing::warn!(box_id, index, attempts = outcome.attempts, "could not provision {}: {reason}", describe(access)),
            }
            self.record(event, &box_id, &manifest.box_type, index, access, outcome).await?;
        }
        Ok(())
    }

    /// Appends the outcome to `access` `<box_id>/<index>`; the aggregate makes repeats
    /// no-ops, and a concurrent writer (another provisioner on a redelivery) is resolved
    /// by running the command again on the fresh state.
    async fn record(&self, cause: &StoredEvent, box_id: &str, box_type: &BoxType, index: u32, access: &RequiredAccess, outcome: Outcome) -> anyhow::Result<()> {
        let (box_id, box_type, access, at) = (box_id.to_owned(), box_type.to_string(), describe(access), chrono::Utc::now());
        let attempts = outcome.attempts;
        let command = match outcome.result {
            Ok(detail) => AccessCommand::Provisioned { box_id: box_id.clone(), box_type, index, access, detail, attempts, at },
            Err(reason) => AccessCommand::Failed { box_id: box_id.clone(), box_type, index, access, reason, attempts, at },
        };
        let mut metadata = HashMap::from([("causation_id".to_owned(), cause.event_id.clone())]);
        if let Some(correlation) = cause.metadata.get("correlation_id").and_then(|v| v.as_str()) {
            metadata.insert("correlation_id".to_owned(), correlation.to_owned());
        }
        let id = format!("{box_id}/{index}");
        self.access.execute(&id, command, metadata, Retry::FEW).await.map_err(|e| anyhow::anyhow!("cannot record the outcome of access {id}: {e}"))?;
        Ok(())
    }
}

/// Tries one entry until it works, fails permanently, or the attempts run out.
async fn provision(setups: &Setups, backoff: &Backoff, box_type: &BoxType, access: &RequiredAccess) -> Outcome {
    let attempts = backoff.attempts.max(1);
    let mut attempt = 1;
    loop {
        match setups.perform(box_type, access).await {
            Ok(detail) => return Outcome { result: Ok(detail), attempts: attempt },
            Err(SetupError::Transient(reason)) if attempt < attempts => {
                tracing::debug!(attempt, "{}: {reason}; retrying", describe(access));
                tokio::time::sleep(backoff.delay(attempt)).await;
                attempt += 1;
            }
            Err(e) => return Outcome { result: Err(e.reason().to_owned()), attempts: attempt },
        }
    }
}

#[cfg(test)]
mod tests;
