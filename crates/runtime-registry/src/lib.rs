//! The runtime registry (SPEC §5): reserves box_types for drafts (R-APPROVE-7 (1)),
//! activates Boxes from recorded approvals after verifying the approval token with public
//! keys only (R-BOX-1), keeps the Box view and the manifest YAML files (R-BOX-2, R-BOX-5),
//! and stops, resumes, archives and assigns (R-BOX-6, R-BOX-7).
//!
//! Architecture Invariant: the only path to a Box is `activation::handle` on a recorded
//! `DraftApproved`, through `BoxCommand::Activate`, which needs a `VerifiedApproval`.

mod activation;
mod views;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::{Envelope, Named, Reply, payload, reply_ok, reply_written, subjects, v1};
use atasira_domain::aggregates::boxes::{BoxAggregate, BoxCommand, BoxRole, box_id_for};
use atasira_domain::aggregates::namespace::{BoxTypeNamespace, NAMESPACE_ID, NamespaceCommand, NamespaceError};
use atasira_domain::token::{Keyring, PublicKeyEntry};
use atasira_domain::{ErrorCode, Principal};
use atasira_platform::Runtime;
use atasira_platform::db::Cqrs;
use atasira_platform::projection::{self as proj, Projection};
use atasira_platform::service::{self as platform_service, Refusal};
use prost::Message as _;
use serde_json::Value;

pub use views::{BoxesView, ManifestFiles};

pub const SERVICE: &str = subjects::RUNTIME_REGISTRY;
/// Aggregate types this service appends (and its relay publishes).
pub const AGGREGATE_TYPES: &[&str] = &["box", "box_type_namespace", "registry_security"];

/// Where the registry gets the approval service's public keys.
#[derive(Debug, Clone)]
pub enum KeySource {
    /// Given at start (embedded mode, or configured).
    Fixed(Keyring),
    /// Asked from the approval service over the bus when a key id is unknown.
    FromApproval,
}

#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// `--manifests-dir` (default `<data-dir>/manifests`).
    pub manifests_dir: PathBuf,
    /// `ATASIRA_MAX_BOXES` (R-BOX-3).
    pub max_boxes: usize,
    pub keys: KeySource,
}

/// Public keys, refreshed from the approval service when a token names an unknown key.
struct KeyProvider {
    keyring: tokio::sync::RwLock<Keyring>,
    fetch: bool,
    rt: Runtime,
}

impl KeyProvider {
    async fn keyring_for(&self, key_id: &str) -> Keyring {
        if self.fetch && !self.keyring.read().await.contains(key_id) {
            match self.fetch_keys().await {
                Ok(entries) => {
                    let mut ring = self.keyring.write().await;
                    for e in entries {
                        ring.insert(e);
                    }
                }
                Err(e) => tracing::warn!(error = %e, "cannot fetch the approval service's public keys"),
            }
        }
        self.keyring.read().await.clone()
    }

    async fn fetch_keys(&self) -> anyhow::Result<Vec<PublicKeyEntry>> {
        let env = atasira_contracts::envelope(&v1::GetApprovalKeys {}, &uuid::Uuid::new_v4().to_string(), "", None);
        let bytes = self
            .rt
            .bus
            .request(&subjects::request(SERVICE, subjects::APPROVAL), Default::default(), env.encode_to_vec().into(), Duration::from_secs(5))
            .await?;
        match atasira_contracts::decode_reply::<v1::ApprovalKeysReply>(&bytes)? {
            Ok((reply, _)) => Ok(serde_json::from_slice(&reply.keys_json)?),
            Err(e) => anyhow::bail!("approval refused: {}", e.message),
        }
    }
}

/// The running registry.
pub(crate) struct Registry {
    rt: Runtime,
    config: RegistryConfig,
    keys: KeyProvider,
    boxes: Cqrs<BoxAggregate>,
    namespace: Cqrs<BoxTypeNamespace>,
}

/// The projections read-your-writes waits for, with what they read.
const READ_MODELS: &[(&str, &[&str])] = &[(activation::NAME, &["draft"]), (views::BOXES, views::BOXES_READS), (views::MANIFESTS, views::MANIFESTS_READS)];

/// The registry's projections (for `atasira projections rebuild`).
pub fn projections(config: &RegistryConfig) -> Vec<Arc<dyn Projection>> {
    vec![Arc::new(BoxesView), Arc::new(ManifestFiles { manifests_dir: config.manifests_dir.clone() })]
}

/// Runs the registry until `shutdown` flips.
pub async fn run(rt: Runtime, config: RegistryConfig, shutdown: tokio::sync::watch::Receiver<bool>) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.manifests_dir)?;
    let projections = projections(&config);
    for p in &projections {
        proj::prepare(&rt.db, p.as_ref()).await?;
    }
    let (keyring, fetch) = match &config.keys {
        KeySource::Fixed(k) => (k.clone(), false),
        KeySource::FromApproval => (Keyring::default(), true),
    };
    let registry = Arc::new(Registry {
        keys: KeyProvider { keyring: tokio::sync::RwLock::new(keyring), fetch, rt: rt.clone() },
        boxes: rt.db.cqrs(),
        namespace: rt.db.cqrs(),
        rt: rt.clone(),
        config,
    });
    let endpoint = {
        let registry = registry.clone();
        platform_service::serve(&rt, SERVICE, move |env| {
            let registry = registry.clone();
            async move { registry.dispatch(&env).await }
        })
        .await?
    };
    let mut tasks = Vec::new();
    for p in projections {
        tasks.push(tokio::spawn(proj::run(rt.db.clone(), rt.feeds.clone(), p, shutdown.clone())));
    }
    tasks.push(tokio::spawn(activation::run(registry.clone(), shutdown.clone())));
    platform_service::until_shutdown(shutdown).await;
    endpoint.stop();
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}

impl Registry {
    /// Runs a namespace command, retrying optimistic-concurrency conflicts: every slot
    /// change goes through this one stream, so concurrent approvals serialise here.
    async fn namespace(&self, command: NamespaceCommand) -> Result<(), NamespaceError> {
        let mut delay = Duration::from_millis(2);
        for _ in 0..200 {
            match self.namespace.execute(NAMESPACE_ID, command.clone(), HashMap::new()).await {
                Ok(()) => {
                    self.rt.notify_committed();
                    return Ok(());
                }
                Err(cqrs_es::AggregateError::UserError(e)) => return Err(e),
                Err(cqrs_es::AggregateError::AggregateConflict) => {
                    tokio::time::sleep(delay + Duration::from_micros(u64::from(uuid::Uuid::new_v4().as_fields().1) % 3000)).await;
                    delay = (delay * 2).min(Duration::from_millis(50));
                }
                Err(e) => {
                    tracing::error!(error = %e, "namespace store failure");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        Err(NamespaceError::BoxTypeExists("namespace busy; retry".into()))
    }

    fn principal(&self, env: &Envelope) -> Result<Principal, Refusal> {
        platform_service::verify_principal(&self.rt, env)
    }

    async fn dispatch(&self, env: &Envelope) -> Result<Reply, Refusal> {
        if env.message_type == v1::WaitForPosition::NAME {
            let w: v1::WaitForPosition = payload(env)?;
            let lagging = proj::answer_wait(&self.rt.db, READ_MODELS, &w).await.map_err(Refusal::internal)?;
            return Ok(reply_ok(&v1::WaitForPositionReply { lagging }, 0));
        }
        let principal = self.principal(env)?;
        match env.message_type.as_str() {
            v1::ReserveBoxType::NAME => {
                let r: v1::ReserveBoxType = payload(env)?;
                if !principal.is_human_admin() {
                    return Err(Refusal::new(ErrorCode::Forbidden, "only a human admin's approval reserves a box_type"));
                }
                let foreign = views::foreign_file(&self.rt.db, &self.config.manifests_dir, &r.box_type).await.map_err(Refusal::internal)?;
                let deadline = chrono::DateTime::from_timestamp(r.deadline_unix, 0).ok_or_else(|| Refusal::new(ErrorCode::InvalidRequest, "bad deadline"))?;
                let command = NamespaceCommand::Reserve {
                    box_type: r.box_type,
                    draft_id: r.draft_id,
                    now: chrono::Utc::now(),
                    deadline,
                    max_boxes: self.config.max_boxes,
                    foreign_manifest_file: foreign,
                };
                self.namespace(command).await?;
                Ok(reply_ok(&v1::Ack {}, 0))
            }
            v1::ReleaseReservation::NAME => {
                let r: v1::ReleaseReservation = payload(env)?;
                if !principal.is_human_admin() {
                    return Err(Refusal::new(ErrorCode::Forbidden, "only the approval path releases reservations"));
                }
                self.namespace(NamespaceCommand::Release { box_type: r.box_type, draft_id: r.draft_id, reason: r.reason }).await?;
                Ok(reply_ok(&v1::Ack {}, 0))
            }
            v1::AwaitActivation::NAME => {
                let r: v1::AwaitActivation = payload(env)?;
                let box_id = box_id_for(&r.draft_id);
                let deadline = tokio::time::Instant::now() + Duration::from_millis(u64::from(r.timeout_ms.min(30_000)));
                loop {
                    if let Some(view) = views::get(&self.rt.db, &self.config.manifests_dir, &box_id).await.map_err(Refusal::internal)? {
                        let event = self.rt.db.last_event("box", &box_id).await.map_err(Refusal::internal)?;
                        let (ids, position) = event.map(|(id, p)| (vec![id], p)).unwrap_or_default();
                        return Ok(reply_written(&v1::BoxReply { box_json: view.to_string().into_bytes() }, position, ids));
                    }
                    if tokio::time::Instant::now() >= deadline {
                        return Err(Refusal::new(ErrorCode::ServiceUnavailable, "the Box is not active yet; its activation is still running"));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
            v1::ListBoxes::NAME => {
                let boxes = views::list(&self.rt.db).await.map_err(Refusal::internal)?;
                Ok(reply_ok(&v1::BoxesReply { boxes_json: boxes.iter().map(|b| b.to_string().into_bytes()).collect() }, 0))
            }
            v1::GetBox::NAME => {
                let r: v1::GetBox = payload(env)?;
                let view = self.view(&r.box_id).await?;
                Ok(reply_ok(&v1::BoxReply { box_json: view.to_string().into_bytes() }, 0))
            }
            v1::AssignUser::NAME => {
                let r: v1::AssignUser = payload(env)?;
                let role = match r.role_in_box.as_str() {
                    "primary" => BoxRole::Primary,
                    "member" => BoxRole::Member,
                    other => return Err(Refusal::new(ErrorCode::InvalidRequest, format!("role_in_box {other:?}: use primary or member"))),
                };
                if r.user_id.trim().is_empty() {
                    return Err(Refusal::new(ErrorCode::InvalidRequest, "user_id must not be empty"));
                }
                self.exists(&r.box_id).await?;
                let command = BoxCommand::AssignUser { by: principal, user_id: r.user_id, role_in_box: role, at: chrono::Utc::now() };
                self.box_command(&r.box_id, command).await
            }
            v1::BoxAction::NAME => {
                let r: v1::BoxAction = payload(env)?;
                self.box_action(principal, &r.box_id, &r.action).await
            }
            other => Err(Refusal::new(ErrorCode::InvalidRequest, format!("unknown message type {other:?}"))),
        }
    }

    async fn view(&self, box_id: &str) -> Result<Value, Refusal> {
        views::get(&self.rt.db, &self.config.manifests_dir, box_id)
            .await
            .map_err(Refusal::internal)?
            .ok_or_else(|| Refusal::new(ErrorCode::BoxNotFound, format!("no Box {box_id:?}")))
    }

    async fn exists(&self, box_id: &str) -> Result<BoxAggregate, Refusal> {
        let b: BoxAggregate = self.rt.db.load(box_id).await.map_err(Refusal::internal)?;
        if b.data.is_none() {
            return Err(Refusal::new(ErrorCode::BoxNotFound, format!("no Box {box_id:?}")));
        }
        Ok(b)
    }

    /// Runs a Box command, waits for the Box view to apply it, answers the Box.
    async fn box_command(&self, box_id: &str, command: BoxCommand) -> Result<Reply, Refusal> {
        self.boxes.execute(box_id, command, HashMap::new()).await.map_err(|e| match e {
            cqrs_es::AggregateError::UserError(e) => Refusal::from(e),
            cqrs_es::AggregateError::AggregateConflict => Refusal::new(ErrorCode::BoxNotActive, "the Box changed meanwhile; retry"),
            other => Refusal::internal(other),
        })?;
        self.rt.notify_committed();
        let (event_id, position) = self.rt.db.last_event("box", box_id).await.map_err(Refusal::internal)?.ok_or_else(|| Refusal::internal("no event"))?;
        proj::wait_for_events(&self.rt.db, &[(views::BOXES, views::BOXES_READS)], std::slice::from_ref(&event_id), Duration::from_secs(5))
            .await
            .map_err(Refusal::internal)?;
        let view = self.view(box_id).await?;
        Ok(reply_written(&v1::BoxReply { box_json: view.to_string().into_bytes() }, position, vec![event_id]))
    }

    /// R-BOX-7. Order keeps the limit conservative across crashes: stop releases the slot
    /// after the Box stopped; resume takes a slot before the Box resumes; archive retires
    /// the box_type after the Box is archived. Each step is idempotent, so a retry finishes
    /// an interrupted one.
    async fn box_action(&self, principal: Principal, box_id: &str, action: &str) -> Result<Reply, Refusal> {
        if !principal.is_human_admin() {
            return Err(Refusal::new(ErrorCode::Forbidden, "stop, resume and archive need role admin and kind human"));
        }
        let current = self.exists(box_id).await?;
        let box_type = current.data.as_ref().map(|d| d.manifest.box_type.to_string()).unwrap_or_default();
        let now = chrono::Utc::now();
        match action {
            "stop" => {
                let reply = self.box_command(box_id, BoxCommand::Stop { by: principal, at: now }).await;
                if reply.is_ok() {
                    self.namespace(NamespaceCommand::FreeSlot { box_type, box_id: box_id.to_owned() }).await?;
                }
                reply
            }
            "resume" => {
                if current.data.as_ref().is_some_and(|d| d.state == atasira_domain::aggregates::boxes::BoxState::Archived) {
                    return Err(Refusal::new(ErrorCode::BoxNotActive, "the Box is archived"));
                }
                self.namespace(NamespaceCommand::TakeSlot { box_type, box_id: box_id.to_owned(), now, max_boxes: self.config.max_boxes }).await?;
                self.box_command(box_id, BoxCommand::Resume { by: principal, at: now }).await
            }
            "archive" => {
                let reply = self.box_command(box_id, BoxCommand::Archive { by: principal, at: now }).await;
                if reply.is_ok() {
                    self.namespace(NamespaceCommand::Retire { box_type, box_id: box_id.to_owned() }).await?;
                }
                reply
            }
            other => Err(Refusal::new(ErrorCode::InvalidRequest, format!("unknown action {other:?}"))),
        }
    }
}
