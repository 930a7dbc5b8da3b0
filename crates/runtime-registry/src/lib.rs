//! The runtime registry (SPEC §5): reserves box_types for drafts (R-APPROVE-7 (1)),
//! activates Boxes from approvals the draft's stream holds, after verifying the approval
//! token with the public keys the approval service published in the store (R-BOX-1), keeps the Box view and the manifest YAML files (R-BOX-2, R-BOX-5),
//! and stops, resumes, archives, assigns and edits (R-BOX-6, R-BOX-7, R-EDIT-1..3).
//!
//! Architecture Invariant: the only path to a Box is `activation::handle` on a recorded
//! `DraftApproved`, through `BoxCommand::Activate`, which needs a `VerifiedApproval`.

mod activation;
mod history;
mod hosts;
mod keys;
mod triggers;
mod views;
mod workers;
mod workers_view;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::requests::{Incoming, RegistryRequest};
use atasira_contracts::{Reply, convert, manifest, reply_ok, reply_written, subjects, v1};
use atasira_domain::aggregates::boxes::{BoxAggregate, BoxCommand, BoxEvent, BoxState};
use atasira_domain::aggregates::bundle::ConfigBundle;
use atasira_domain::aggregates::namespace::{BoxTypeNamespace, NAMESPACE_ID, NamespaceCommand};
use atasira_domain::aggregates::security::SecurityCommand;
use atasira_domain::aggregates::types;
use atasira_domain::aggregates::worker::Worker;
use atasira_domain::token::ACTIVATION_WINDOW;
use atasira_domain::{ErrorCode, Principal};
use atasira_platform::Runtime;
use atasira_platform::client::Client;
use atasira_platform::projection::{self as proj, Projection, ReadModel};
use atasira_platform::refusal::Refusal;
use atasira_platform::service::{self as platform_service, Call};
use atasira_platform::store::{Cqrs, Cursor, EventAt, Retry};

use keys::KeyProvider;
pub use views::{BoxesView, ManifestFiles};
pub use workers_view::WorkersView;

pub const SERVICE: &str = subjects::RUNTIME_REGISTRY;
/// Aggregate types this service appends (and its relay publishes).
pub const AGGREGATE_TYPES: &[&str] =
    &[types::BOX, types::BOX_TYPE_NAMESPACE, types::REGISTRY_SECURITY, types::WORKER, types::CONFIG_BUNDLE, types::REGISTRY_ASSERTION_KEYS];

#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// `--manifests-dir` (default `<data-dir>/manifests`).
    pub manifests_dir: PathBuf,
    /// `ATASIRA_MAX_BOXES` (R-BOX-3).
    pub max_boxes: usize,
    /// How long an execution host's heartbeat holds its Workers (R-HOST-1).
    pub host_lease: Duration,
    /// How long a tool-use request waits for a human admin before it is denied (R-DECIDE-2).
    pub ask_ttl: Duration,
    /// `ATASIRA_TRIGGER_IN_FLIGHT`: unended triggered Workers a Box may have before its
    /// events are refused (R-TRIG-1).
    pub trigger_in_flight: usize,
    /// Where `event` Boxes' topics are heard on NATS (cluster mode); `None`: only through
    /// `PublishTriggerEvent`.
    pub listener: Option<atasira_platform::bus::TopicListener>,
}

/// The running registry.
pub(crate) struct Registry {
    rt: Runtime,
    config: RegistryConfig,
    keys: KeyProvider,
    boxes: Cqrs<BoxAggregate>,
    namespace: Cqrs<BoxTypeNamespace>,
    bundles: Cqrs<ConfigBundle>,
    workers: Cqrs<Worker>,
    /// Calls to the provisioner (claiming an execution binding).
    client: Client,
    /// R-POLICY-1: the organisation's policy, evaluated on config edits, launches and
    /// runtime approvals.
    policies: atasira_platform::org_policy::Policies,
}

/// The projections read-your-writes waits for, with what they read.
const READ_MODELS: &[ReadModel] = &[
    ReadModel::new(activation::NAME, activation::READS).passing_over(activation::passes_over),
    views::BOXES_READ_MODEL,
    ReadModel::new(views::MANIFESTS, views::MANIFESTS_READS),
    workers_view::READ_MODEL,
];

/// The registry's projections (for `atasira projections rebuild`).
pub fn projections(config: &RegistryConfig) -> Vec<Arc<dyn Projection>> {
    vec![Arc::new(BoxesView), Arc::new(ManifestFiles { manifests_dir: config.manifests_dir.clone() }), Arc::new(WorkersView)]
}

/// Runs the registry until `shutdown` flips.
pub async fn run(rt: Runtime, config: RegistryConfig, shutdown: tokio::sync::watch::Receiver<bool>) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.manifests_dir)?;
    let projections = projections(&config);
    for p in &projections {
        proj::prepare(&rt.db, p.as_ref()).await?;
    }
    let db = rt.db.clone();
    atasira_platform::metrics::gauge_source(
        "active_boxes",
        Arc::new(move || {
            let db = db.clone();
            // What the Box limit counts: Boxes that hold a slot (not stopped or archived).
            Box::pin(async move { db.count("SELECT COUNT(*) FROM box_rows WHERE state NOT IN ('stopped', 'archived')").await })
        }),
    );
    let limit = i64::try_from(config.max_boxes).unwrap_or(i64::MAX);
    atasira_platform::metrics::gauge_source("box_limit", Arc::new(move || Box::pin(async move { Ok(limit) })));
    let registry = Arc::new(Registry {
        keys: KeyProvider::load(rt.db.clone()).await?,
        boxes: rt.db.cqrs(),
        namespace: rt.db.cqrs(),
        bundles: rt.db.cqrs(),
        workers: rt.db.cqrs(),
        client: Client::new(SERVICE, rt.bus.clone(), rt.assertion_keys.clone(), Duration::from_secs(30)),
        policies: Default::default(),
        rt: rt.clone(),
        config,
    });
    let endpoint = {
        let registry = registry.clone();
        platform_service::serve(&rt, SERVICE, move |call| {
            let registry = registry.clone();
            async move { registry.dispatch(&call).await }
        })
        .await?
    };
    let mut tasks = Vec::new();
    for p in projections {
        tasks.push(tokio::spawn(proj::run(rt.db.clone(), rt.feeds.clone(), p, shutdown.clone())));
    }
    tasks.push(tokio::spawn(activation::run(registry.clone(), shutdown.clone())));
    tasks.push(tokio::spawn(hosts::sweep_lost(registry.clone(), shutdown.clone())));
    tasks.push(tokio::spawn(triggers::run_schedules(registry.clone(), shutdown.clone())));
    if let Some(listener) = registry.config.listener.clone() {
        tasks.push(tokio::spawn(triggers::run_events(registry.clone(), listener, shutdown.clone())));
    }
    platform_service::until_shutdown(shutdown).await;
    endpoint.stop();
    for t in tasks {
        let _ = t.await;
    }
    Ok(())
}

impl Registry {
    /// Runs a namespace command: every slot change goes through this one stream, so
    /// concurrent approvals serialise here, patiently; past that, 503 busy.
    async fn namespace(&self, command: NamespaceCommand) -> Result<(), Refusal> {
        self.namespace.execute(NAMESPACE_ID, command, HashMap::new(), Retry::CONTENDED).await?;
        Ok(())
    }

    async fn dispatch(&self, call: &Call) -> Result<Reply, Refusal> {
        let request = match RegistryRequest::decode(&call.env)? {
            Incoming::Wait(w) => return platform_service::wait_reply(&self.rt, READ_MODELS, &w).await,
            Incoming::Request(request) => request,
        };
        // An execution host asks for nobody: it is known by its subject (R-HOST-1).
        if let subjects::Origin::Host { name } = &call.origin {
            return match request {
                RegistryRequest::Heartbeat(r) => self.heartbeat(name, r).await,
                RegistryRequest::GetBundle(r) => self.get_bundle(name, r).await,
                RegistryRequest::Report(r) => self.report(name, r).await,
                RegistryRequest::AskTool(r) => self.ask_tool(name, r).await,
                _ => Err(Refusal::new(ErrorCode::Forbidden, "an execution host asks only for its Workers")),
            };
        }
        // Over NATS, publishers read (Boxes, a Box, its history, feasibility, Workers); every
        // change is the API's.
        let read = matches!(
            request,
            RegistryRequest::List(_)
                | RegistryRequest::Get(_)
                | RegistryRequest::Page(_)
                | RegistryRequest::History(_)
                | RegistryRequest::Feasibility(_)
                | RegistryRequest::GetWorker(_)
                | RegistryRequest::ListWorkers(_)
                | RegistryRequest::Provenance(_)
                | RegistryRequest::ListToolRequests(_)
                | RegistryRequest::GetToolRequest(_)
        );
        if !read {
            call.only_services("changing a Box")?;
        }
        let principal = call.principal(&self.rt).await?;
        match request {
            RegistryRequest::Reserve(r) => {
                call.only_from(&[subjects::APPROVAL], "reserving a box_type")?;
                if !principal.is_human_admin() {
                    return Err(Refusal::new(ErrorCode::Forbidden, "only a human admin's approval reserves a box_type"));
                }
                let foreign = views::foreign_file(&self.rt.db, &self.config.manifests_dir, &r.box_type).await.map_err(Refusal::internal)?;
                let now = chrono::Utc::now();
                let deadline = reservation_deadline(r.deadline_unix, now)?;
                let command = NamespaceCommand::Reserve {
                    box_type: r.box_type,
                    draft_id: r.draft_id,
                    now,
                    deadline,
                    max_boxes: self.config.max_boxes,
                    foreign_manifest_file: foreign,
                };
                self.namespace(command).await?;
                Ok(reply_ok(&v1::Ack {}))
            }
            RegistryRequest::Release(r) => {
                call.only_from(&[subjects::APPROVAL], "releasing a reservation")?;
                if !principal.is_human_admin() {
                    return Err(Refusal::new(ErrorCode::Forbidden, "only the approval path releases reservations"));
                }
                self.namespace(NamespaceCommand::Release { box_type: r.box_type, draft_id: r.draft_id, reason: r.reason }).await?;
                Ok(reply_ok(&v1::Ack {}))
            }
            RegistryRequest::List(_) => {
                let boxes = views::list(&self.rt.db).await.map_err(Refusal::internal)?;
                Ok(reply_ok(&v1::BoxList { boxes: boxes.iter().map(views::BoxRow::summary).collect() }))
            }
            RegistryRequest::Get(r) => {
                let Some(as_of) = atasira_platform::store::AsOf::from_request(r.at, r.at_time.as_ref())? else {
                    return Ok(reply_ok(&v1::BoxReply { r#box: Some(self.view(&r.box_id).await?) }));
                };
                let view = views::at(&self.rt.db, &r.box_id, as_of).await.map_err(Refusal::internal)?;
                let view = view.ok_or_else(|| Refusal::new(ErrorCode::BoxNotFound, format!("no Box {:?} then", r.box_id)))?;
                Ok(reply_ok(&v1::BoxReply { r#box: Some(view) }))
            }
            RegistryRequest::Assign(r) => {
                let role_in_box = convert::box_role_from_wire(r.role_in_box)?;
                let command = BoxCommand::AssignUser { by: principal, user_id: r.user_id, role_in_box, at: chrono::Utc::now() };
                self.box_command(&r.box_id, command).await
            }
            RegistryRequest::Action(r) => {
                let action = v1::box_action::Action::try_from(r.action).unwrap_or(v1::box_action::Action::Unspecified);
                self.box_action(principal, &r.box_id, action).await
            }
            RegistryRequest::Page(r) => {
                let filter = views::StateFilter::from_wire(v1::BoxStateFilter::try_from(r.state).unwrap_or_default());
                let (rows, next_cursor) = views::page(&self.rt.db, filter, r.limit, r.after).await.map_err(Refusal::internal)?;
                Ok(reply_ok(&v1::BoxPage { boxes: rows.iter().map(views::BoxRow::summary).collect(), next_cursor }))
            }
            RegistryRequest::History(r) => {
                // The store says whether the Box exists, as it says everything else here.
                if self.rt.db.last_event(types::BOX, &r.box_id).await.map_err(Refusal::internal)?.is_none() {
                    return Err(Refusal::new(ErrorCode::BoxNotFound, format!("no Box {:?}", r.box_id)));
                }
                let after = Cursor { tx_id: i64::try_from(r.after_tx).unwrap_or(i64::MAX), position: i64::try_from(r.after).unwrap_or(i64::MAX) };
                let (entries, next) = history::page(&self.rt.db, &r.box_id, r.limit, after).await.map_err(Refusal::internal)?;
                let (next_cursor_tx, next_cursor) = next.map_or((0, 0), |c| (u64::try_from(c.tx_id).unwrap_or(0), u64::try_from(c.position).unwrap_or(0)));
                Ok(reply_ok(&v1::BoxHistoryPage { entries, next_cursor, next_cursor_tx }))
            }
            RegistryRequest::Unassign(r) => self.unassign(principal, r, &call.env.idempotency_key).await,
            RegistryRequest::Feasibility(r) => self.feasibility(r).await,
            RegistryRequest::EditManifest(r) => {
                let edit = r.edit.map(manifest::struct_from_proto).unwrap_or_default();
                let by = principal.user_id.clone();
                let reply = self.mentor_edit(principal, &r.box_id, edit).await?;
                // R-WORKER-2: every edit syncs the bundle of the manifest it made.
                Ok(with_event(reply, self.sync_after_change(&r.box_id, &by).await))
            }
            RegistryRequest::EditConfig(r) => {
                let patch = serde_json::Value::Object(r.patch.map(manifest::struct_from_proto).unwrap_or_default());
                let by = principal.user_id.clone();
                let command = self.config_edit_policed(principal, &r.box_id, patch).await?;
                let reply = self.box_command(&r.box_id, command).await?;
                Ok(with_event(reply, self.sync_after_change(&r.box_id, &by).await))
            }
            RegistryRequest::SyncBundle(r) => {
                call.only_from(&[subjects::GATEWAY], "syncing a bundle")?;
                self.sync_bundle(&principal, r).await
            }
            RegistryRequest::CreateWorker(r) => {
                call.only_from(&[subjects::GATEWAY], "creating a Worker")?;
                self.create_worker(principal, r).await
            }
            RegistryRequest::GetWorker(r) => self.get_worker(&principal, r).await,
            RegistryRequest::ListWorkers(r) => self.list_workers(&principal, r).await,
            RegistryRequest::Provenance(r) => self.provenance(&principal, r).await,
            RegistryRequest::StopWorker(r) => {
                call.only_from(&[subjects::GATEWAY], "stopping a Worker")?;
                self.stop_worker(principal, r).await
            }
            RegistryRequest::PauseWorker(r) => {
                call.only_from(&[subjects::GATEWAY], "pausing a Worker")?;
                self.pause_worker(principal, r).await
            }
            RegistryRequest::AddInput(r) => {
                call.only_from(&[subjects::GATEWAY], "sending input to a Worker")?;
                self.add_input(principal, r).await
            }
            RegistryRequest::ListToolRequests(r) => self.list_tool_requests(&principal, r).await,
            RegistryRequest::GetToolRequest(r) => Ok(reply_ok(&self.get_tool_request(&principal, &r.request_id).await?)),
            RegistryRequest::DecideTool(r) => {
                call.only_from(&[subjects::GATEWAY], "deciding a tool-use request")?;
                self.decide_tool_request(principal, r).await
            }
            RegistryRequest::PublishEvent(r) => {
                call.only_from(&[subjects::GATEWAY], "publishing an event")?;
                self.publish_event(principal, r).await
            }
            RegistryRequest::TriggerTopics(_) => {
                call.only_from(&[subjects::GATEWAY], "listing trigger topics")?;
                self.trigger_topics(&principal).await
            }
            RegistryRequest::Heartbeat(_) | RegistryRequest::GetBundle(_) | RegistryRequest::Report(_) | RegistryRequest::AskTool(_) => {
                Err(Refusal::new(ErrorCode::Forbidden, "only execution hosts heartbeat and report on Workers"))
            }
        }
    }

    /// R-EDIT-1, R-EDIT-2: a mentor edit. A prohibited or unknown key refuses the whole edit
    /// and is recorded as a security violation naming the keys, in this request, so the
    /// refusal's answer can say where the record is (R-AUDIT-5).
    async fn mentor_edit(&self, principal: Principal, box_id: &str, edit: serde_json::Map<String, serde_json::Value>) -> Result<Reply, Refusal> {
        let at = chrono::Utc::now();
        match self.box_command(box_id, BoxCommand::MentorEdit { by: principal.clone(), patch: edit, at }).await {
            Err(refusal) if refusal.code == ErrorCode::MentorEditProhibitedKey => {
                let keys: Vec<&str> = refusal.field_errors.iter().map(|f| f.key.as_str()).collect();
                let record = SecurityCommand::Record {
                    service: SERVICE.into(),
                    actor: principal.user_id.clone(),
                    target: box_id.to_owned(),
                    kind: "mentor_edit_prohibited_key".into(),
                    reason: format!("a mentor edit tried to change {}", named_keys(&keys)),
                    at,
                };
                let recorded = platform_service::record_security_violation(&self.rt, SERVICE, record).await?;
                Err(refusal.recorded(recorded.into()))
            }
            other => other,
        }
    }

    /// R-FEAS-1: the deterministic keyword check of a task against the manifest of the
    /// box_type's Box (the one that is not archived; a stopped Box is assessed too, with a
    /// note). No such Box: 404 `box_not_found`. Read-only.
    async fn feasibility(&self, r: v1::AssessFeasibility) -> Result<Reply, Refusal> {
        let row = views::current_of_type(&self.rt.db, &r.box_type).await.map_err(Refusal::internal)?.ok_or_else(|| {
            Refusal::new(ErrorCode::BoxNotFound, format!("no active or stopped Box of box_type {:?}; a task for a new kind of Box needs a draft", r.box_type))
        })?;
        // 404 before 422, as everywhere.
        let chars = r.task_description.chars().count();
        if r.task_description.trim().is_empty() || chars > atasira_domain::bounds::TASK_DESCRIPTION_CHARS {
            return Err(Refusal::new(
                ErrorCode::InvalidRequest,
                format!("task_description: describe the task in 1 to {} characters", atasira_domain::bounds::TASK_DESCRIPTION_CHARS),
            ));
        }
        let answer = atasira_domain::feasibility::assess(&row.manifest, &r.task_description);
        let mut notes = answer.notes;
        if row.state == BoxState::Stopped {
            notes.push(format!("the Box of box_type {:?} is stopped: an admin must resume it before it can take the task", r.box_type));
        }
        Ok(reply_ok(&v1::FeasibilityReply {
            feasible: answer.feasible,
            available_operations: answer.available_operations,
            available_tools: answer.available_tools,
            missing_capabilities: answer.missing_capabilities,
            required_approvals: answer.required_approvals,
            summary: answer.summary,
            notes,
            box_id: row.box_id,
        }))
    }

    async fn view(&self, box_id: &str) -> Result<v1::BoxView, Refusal> {
        views::get(&self.rt.db, &self.config.manifests_dir, box_id)
            .await
            .map_err(Refusal::internal)?
            .ok_or_else(|| Refusal::new(ErrorCode::BoxNotFound, format!("no Box {box_id:?}")))
    }

    /// Runs a Box command, waits for the Box view to apply it, answers the Box.
    /// R-POLICY-1: a config edit with the organisation's policy's verdict on the manifest it
    /// would make (a denial refused and recorded). The Box is read for it only when a policy
    /// is in force; an edit the aggregate refuses or that changes nothing is left to it.
    async fn config_edit_policed(&self, principal: Principal, box_id: &str, patch: serde_json::Value) -> Result<BoxCommand, Refusal> {
        let mut command = BoxCommand::ConfigEdit { by: principal.clone(), patch, at: chrono::Utc::now(), policy: None };
        let Some(active) = self.policies.active(&self.rt.db).await? else { return Ok(command) };
        let boxed: BoxAggregate = self.rt.db.load(box_id).await.map_err(Refusal::internal)?;
        if let Ok(events) = boxed.decide(command.clone())
            && let Some(BoxEvent::BoxConfigEdited { manifest, changed_keys, .. }) = events.first()
        {
            let input = atasira_domain::org_policy::Input::config_edit(&principal, manifest, box_id, changed_keys);
            let verdict = active.admit(&self.rt, SERVICE, box_id, &input).await?;
            if let BoxCommand::ConfigEdit { policy, .. } = &mut command {
                *policy = Some(verdict);
            }
        }
        Ok(command)
    }

    async fn box_command(&self, box_id: &str, command: BoxCommand) -> Result<Reply, Refusal> {
        self.box_command_with(box_id, command, HashMap::new()).await
    }

    /// R-DRAFT-11: an unassign with an Idempotency-Key records the key in its event's
    /// metadata; run again (the gateway that ran it died before answering), it finds the
    /// user unassigned by the same caller with the same key and answers the Box as the
    /// first run did, instead of `assignment_not_found`.
    async fn unassign(&self, principal: Principal, r: v1::UnassignUser, idempotency_key: &str) -> Result<Reply, Refusal> {
        let caller = principal.user_id.clone();
        let metadata = if idempotency_key.is_empty() { HashMap::new() } else { HashMap::from([("idempotency_key".to_owned(), idempotency_key.to_owned())]) };
        let command = BoxCommand::UnassignUser { by: principal, user_id: r.user_id.clone(), at: chrono::Utc::now() };
        match self.box_command_with(&r.box_id, command, metadata).await {
            Err(refusal) if refusal.code == ErrorCode::AssignmentNotFound && !idempotency_key.is_empty() => {
                let stream = self.rt.db.stream(types::BOX, &r.box_id).await.map_err(Refusal::internal)?;
                let done = stream.iter().rev().find(|e| {
                    e.metadata.get("idempotency_key").and_then(|k| k.as_str()) == Some(idempotency_key)
                        && matches!(e.decode(),
                            Ok(BoxEvent::BoxUserUnassigned { user_id, unassigned_by, .. }) if user_id == r.user_id && unassigned_by == caller)
                });
                let Some(done) = done else { return Err(refusal) };
                let view = self.view(&r.box_id).await?;
                Ok(reply_written(&v1::BoxReply { r#box: Some(view) }, done.position, vec![done.event_id.clone()]))
            }
            other => other,
        }
    }

    async fn box_command_with(&self, box_id: &str, command: BoxCommand, metadata: HashMap<String, String>) -> Result<Reply, Refusal> {
        let EventAt { id: event_id, position } = self.boxes.execute(box_id, command, metadata, Retry::ONCE).await?.head()?;
        proj::wait_for_events(&self.rt.db, &[views::BOXES_READ_MODEL], std::slice::from_ref(&event_id), 0, Duration::from_secs(5))
            .await
            .map_err(Refusal::internal)?;
        let view = self.view(box_id).await?;
        Ok(reply_written(&v1::BoxReply { r#box: Some(view) }, position, vec![event_id]))
    }

    /// R-BOX-7. Order keeps the limit conservative across crashes: stop releases the slot
    /// after the Box stopped; resume takes a slot before the Box resumes; archive retires
    /// the box_type after the Box is archived. Each step is idempotent, so a retry finishes
    /// an interrupted one.
    async fn box_action(&self, principal: Principal, box_id: &str, action: v1::box_action::Action) -> Result<Reply, Refusal> {
        use v1::box_action::Action;
        let current: BoxAggregate = self.rt.db.load(box_id).await.map_err(Refusal::internal)?;
        let box_type = current.data.as_ref().map(|d| d.manifest.box_type.to_string()).unwrap_or_default();
        let now = chrono::Utc::now();
        match action {
            Action::Stop => {
                let by = principal.user_id.clone();
                let reply = self.box_command(box_id, BoxCommand::Stop { by: principal, at: now }).await?;
                self.namespace(NamespaceCommand::FreeSlot { box_type, box_id: box_id.to_owned() }).await?;
                self.stop_box_workers(box_id, &by).await;
                Ok(reply)
            }
            Action::Resume => {
                let command = BoxCommand::Resume { by: principal, at: now };
                // The Box's own rules first (who may, not archived), before a slot is taken.
                current.decide(command.clone())?;
                self.namespace(NamespaceCommand::TakeSlot { box_type, box_id: box_id.to_owned(), now, max_boxes: self.config.max_boxes }).await?;
                self.box_command(box_id, command).await
            }
            Action::Archive => {
                let by = principal.user_id.clone();
                let reply = self.box_command(box_id, BoxCommand::Archive { by: principal, at: now }).await?;
                self.namespace(NamespaceCommand::Retire { box_type, box_id: box_id.to_owned() }).await?;
                self.stop_box_workers(box_id, &by).await;
                Ok(reply)
            }
            Action::Unspecified => Err(Refusal::new(ErrorCode::InvalidRequest, "action: use stop, resume or archive")),
        }
    }
}

/// A written reply that also names `event` (its answer waits for that event to be read).
fn with_event(mut reply: Reply, event: Option<EventAt>) -> Reply {
    if let Some(event) = event {
        reply.position = reply.position.max(event.position);
        if !reply.event_ids.contains(&event.id) {
            reply.event_ids.push(event.id);
        }
    }
    reply
}

/// Keys for a record: at most 20, each at most 64 characters (control characters
/// escaped), and how many more there were.
fn named_keys(keys: &[&str]) -> String {
    const SHOWN: usize = 20;
    let mut out: Vec<String> = keys.iter().take(SHOWN).map(|k| k.chars().take(64).collect::<String>().escape_debug().to_string()).collect();
    if keys.len() > SHOWN {
        out.push(format!("and {} more", keys.len() - SHOWN));
    }
    out.join(", ")
}

/// The deadline of a reservation, decided here and not by the caller (R-APPROVE-7): at
/// most the activation window from now (a later one is clamped, so a caller cannot hold a
/// box_type longer), and not past (refused: such a reservation would lapse at once).
fn reservation_deadline(requested_unix: i64, now: chrono::DateTime<chrono::Utc>) -> Result<chrono::DateTime<chrono::Utc>, Refusal> {
    let requested =
        chrono::DateTime::from_timestamp(requested_unix, 0).ok_or_else(|| Refusal::new(ErrorCode::InvalidRequest, "deadline_unix is out of range"))?;
    // Whole seconds, like the requested deadline: a deadline a moment ago is "now".
    let now_secs = chrono::DateTime::from_timestamp(now.timestamp(), 0).unwrap_or(now);
    if requested < now_secs {
        return Err(Refusal::new(ErrorCode::InvalidRequest, format!("the reservation deadline {requested} has passed")));
    }
    Ok(requested.min(now + ACTIVATION_WINDOW))
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, TimeDelta};

    use super::*;

    fn now0() -> DateTime<chrono::Utc> {
        DateTime::from_timestamp(1_750_000_000, 250_000_000).expect("valid")
    }

    #[test]
    fn r_edit_2_a_record_names_the_refused_keys_within_bounds() {
        assert_eq!(named_keys(&["tools", "business_procedure[0].x"]), "tools, business_procedure[0].x");
        let many: Vec<String> = (0..25).map(|i| format!("k{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(named_keys(&refs).ends_with("k19, and 5 more"));
        assert_eq!(named_keys(&[&"x".repeat(100)]).len(), 64);
        assert_eq!(named_keys(&["a\nb"]), "a\\nb");
    }

    #[test]
    fn r_approve_7_the_registry_clamps_reservation_deadlines_to_the_activation_window() {
        // given the deadline the approval service asks for (now + the window, whole seconds); then kept
        let asked = (now0() + ACTIVATION_WINDOW).timestamp();
        assert_eq!(reservation_deadline(asked, now0()).expect("kept").timestamp(), asked);
        // given a deadline further away (a skewed or hostile caller); then clamped to the window
        let far = (now0() + TimeDelta::days(365)).timestamp();
        assert_eq!(reservation_deadline(far, now0()).expect("clamped"), now0() + ACTIVATION_WINDOW);
        // given the current second; then kept
        assert!(reservation_deadline(now0().timestamp(), now0()).is_ok());
        // given a past deadline or one out of range; then refused as invalid
        for bad in [now0().timestamp() - 1, 0, i64::MIN, i64::MAX] {
            let refused = reservation_deadline(bad, now0()).expect_err("refused");
            assert_eq!(refused.code, ErrorCode::InvalidRequest, "{bad}");
        }
    }
}
