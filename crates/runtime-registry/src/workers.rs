//! Runtime Workers (SPEC §10, R-WORKER-1..7): the registry is the runtime's side of a
//! launch. It syncs ConfigBundles (after every activation and edit, and on the gateway's
//! `SyncBundle`), creates Workers (`CreateWorker`, the only issuer of WorkerIds), and answers
//! the catalog, transcripts and provenance.
//!
//! Architecture Invariant: the runtime never receives or keeps cwd, workspace root or tool
//! scope. Of the execution binding it sees the opaque handle only, which it hands to the
//! provisioner (`ConsumeBinding`) and keeps inside `WorkerCreated`, never in a view or an
//! answer. A Worker is created only after its bundle was shown to be the Box's current
//! manifest (the approved one plus the recorded edits) and the Box's approval token verified
//! again with public keys only.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use atasira_contracts::{Refused, Reply, convert, reply_ok, reply_written, subjects, v1};
use atasira_domain::aggregates::boxes::{BoxAggregate, BoxData, BoxEvent, BoxState, launchable};
use atasira_domain::aggregates::bundle::{BundleCommand, BundleEvent, ConfigBundle};
use atasira_domain::aggregates::draft::DraftEvent;
use atasira_domain::aggregates::types;
use atasira_domain::aggregates::worker::{NewWorker, WorkerCommand, WorkerEvent};
use atasira_domain::org_policy::Input;
use atasira_domain::worker::{LaunchRequest, Segment, WorkerState, bundle_digest, launch_fingerprint, validate_launch, worker_id_for};
use atasira_domain::{ErrorCode, FieldError, Principal, trigger};
use atasira_platform::projection as proj;
use atasira_platform::refusal::Refusal;
use atasira_platform::store::{Db, EventAt, Retry, StoredEvent};

use crate::workers_view::{self, WorkerRow};
use crate::{Registry, views};

/// The refusals of a launch that are recorded on the launch's Worker stream
/// (`WorkerLaunchRefused`, audited as `worker.create_refused`).
const RECORDED: &[ErrorCode] = &[
    ErrorCode::Forbidden,
    ErrorCode::BoxNotActive,
    ErrorCode::BundleNotFound,
    ErrorCode::BundleDigestMismatch,
    ErrorCode::BundleProfileIncompatible,
    ErrorCode::BindingNotFound,
    ErrorCode::BindingExpired,
    ErrorCode::BindingBoxMismatch,
    ErrorCode::BindingUnusable,
    ErrorCode::LaunchIdConflict,
    ErrorCode::InvalidSegment,
    ErrorCode::InvalidApprovalToken,
    ErrorCode::TooManyWorkers,
    ErrorCode::PolicyDenied,
];

/// What a launch's checks give the Worker: its box_type, approval key, chain of custody
/// and the policy's verdict.
type Launchable = (String, String, Vec<String>, Option<atasira_domain::org_policy::Verdict>);

/// Longest box id, binding handle and bundle digest a launch may name.
const ID_CHARS: usize = 128;

/// One stored event by its id (`<type>/<id>/<sequence>`; the id may hold `/`).
async fn event_by_id(db: &Db, event_id: &str) -> anyhow::Result<Option<StoredEvent>> {
    let parsed = event_id.split_once('/').and_then(|(t, rest)| rest.rsplit_once('/').map(|(id, seq)| (t, id, seq.parse::<i64>())));
    match parsed {
        Some((aggregate_type, aggregate_id, Ok(sequence))) => db.event(aggregate_type, aggregate_id, sequence).await,
        _ => Ok(None),
    }
}

/// A Box as its stream leaves it, and the events its current manifest derives from
/// (`BoxActivated`, then each manifest and config edit), in order.
struct BoxChain {
    data: Option<BoxData>,
    derived_from: Vec<String>,
}

async fn box_chain(db: &Db, box_id: &str) -> anyhow::Result<BoxChain> {
    let mut aggregate = BoxAggregate::default();
    let mut derived_from = Vec::new();
    for link in db.stream(types::BOX, box_id).await? {
        let event: BoxEvent = link.decode()?;
        if matches!(
            event,
            BoxEvent::BoxActivated { .. } | BoxEvent::BoxManifestEdited { .. } | BoxEvent::BoxConfigEdited { .. } | BoxEvent::BoxManifestChanged { .. }
        ) {
            derived_from.push(link.event_id);
        }
        aggregate.evolve(event);
    }
    Ok(BoxChain { data: aggregate.data, derived_from })
}

/// A Worker's creation as its stream holds it.
pub(crate) struct Created {
    pub(crate) event: WorkerEvent,
    event_id: String,
    position: i64,
}

impl Created {
    fn fingerprint(&self) -> &str {
        match &self.event {
            WorkerEvent::WorkerCreated { fingerprint, .. } => fingerprint,
            _ => "",
        }
    }
}

/// The Box's approval, verified again from its recorded `DraftApproved`.
struct ApprovalCheck {
    /// The `DraftApproved` event, if the draft's stream holds one.
    event_id: Option<String>,
    key_id: String,
    /// Why it does not verify (or bind the Box's approved manifest), if it does not.
    refused: Option<String>,
}

fn text_ok(s: &str, max: usize) -> bool {
    !s.trim().is_empty() && s.chars().count() <= max && !s.chars().any(char::is_control)
}

/// The launch_id's own rule (as [`validate_launch`] applies it).
fn launch_id_errors(launch_id: &str) -> Vec<FieldError> {
    let probe = LaunchRequest {
        launch_id: launch_id.to_owned(),
        box_id: String::new(),
        role: String::new(),
        labels: BTreeMap::new(),
        input: vec![Segment::Text("-".into())],
    };
    validate_launch(&probe).into_iter().filter(|e| e.key == "launch_id").collect()
}

fn box_id_errors(box_id: &str) -> Vec<FieldError> {
    if text_ok(box_id, ID_CHARS) { vec![] } else { vec![FieldError::new("box_id", format!("1 to {ID_CHARS} characters"))] }
}

fn invalid(errors: Vec<FieldError>) -> Refusal {
    Refusal { field_errors: errors, ..Refusal::new(ErrorCode::InvalidRequest, "the launch is invalid") }
}

/// `sha256:` and 64 lowercase hex digits.
fn digest_shaped(digest: &str) -> bool {
    digest.strip_prefix("sha256:").is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// A message from elsewhere in a record: at most 512 characters.
fn clip(text: &str) -> String {
    text.chars().take(512).collect()
}

impl Registry {
    /// The Box's bundle of its current manifest, synced if new: its digest, the event that
    /// synced it and that event's position.
    async fn ensure_bundle(&self, box_id: &str, data: &BoxData, derived_from: Vec<String>, by: &str) -> Result<(String, String, i64), Refusal> {
        // Synced before: the aggregate decides nothing and the receipt names its event.
        let digest = bundle_digest(box_id, &data.manifest);
        let command = BundleCommand::Sync {
            digest: digest.clone(),
            box_id: box_id.to_owned(),
            manifest: data.manifest.clone(),
            derived_from,
            by: by.to_owned(),
            at: chrono::Utc::now(),
        };
        let synced = self.bundles.execute(&digest, command, HashMap::new(), Retry::ONCE).await?.head()?;
        Ok((digest, synced.id, synced.position))
    }

    /// R-WORKER-2: after an activation or an edit, the bundle of the Box's manifest now
    /// (idempotent; a failure is mended by the next launch's `SyncBundle`). The bundle's
    /// event (id, position), so the change's answer can wait for it to be read (and audited).
    pub(crate) async fn sync_after_change(&self, box_id: &str, by: &str) -> Option<EventAt> {
        let result = async {
            let chain = box_chain(&self.rt.db, box_id).await.map_err(Refusal::internal)?;
            match chain.data {
                Some(data) if data.state != BoxState::Archived => self.ensure_bundle(box_id, &data, chain.derived_from, by).await.map(Some),
                _ => Ok(None),
            }
        }
        .await;
        match result {
            Ok(Some((digest, id, position))) => {
                tracing::debug!(box_id, digest, "bundle synced");
                Some(EventAt { id, position })
            }
            Ok(None) => None,
            Err(e) => {
                tracing::warn!(box_id, error = %e, "could not sync the Box's bundle; the next launch syncs it");
                None
            }
        }
    }

    /// Records a refusal of the launch on its Worker stream, when it is one of
    /// [`RECORDED`] and names a well-formed launch and Box; the refusal then says where.
    pub(crate) async fn refused(&self, principal: &Principal, launch_id: &str, box_id: &str, refusal: Refusal) -> Refusal {
        if !RECORDED.contains(&refusal.code) || !launch_id_errors(launch_id).is_empty() || !box_id_errors(box_id).is_empty() {
            return refusal;
        }
        let worker_id = worker_id_for(launch_id);
        let command = WorkerCommand::RecordRefusal {
            worker_id: worker_id.clone(),
            launch_id: launch_id.to_owned(),
            box_id: box_id.to_owned(),
            by: principal.user_id.clone(),
            code: refusal.code,
            reason: clip(&refusal.message),
            at: chrono::Utc::now(),
        };
        let recorded = self.workers.execute(&worker_id, command, HashMap::new(), Retry::CONTENDED).await.and_then(|receipt| receipt.head());
        match recorded {
            Ok(at) => refusal.recorded(at.into()),
            Err(e) => {
                tracing::warn!(worker_id, error = %e, "could not record a refused launch");
                refusal
            }
        }
    }

    /// The bundle of Box `box_id`'s current manifest, synced if new, when `principal` may
    /// launch the Box: its digest, the event that synced it and that event's position.
    async fn launchable_bundle(&self, principal: &Principal, box_id: &str) -> Result<(String, String, i64), Refusal> {
        let chain = box_chain(&self.rt.db, box_id).await.map_err(Refusal::internal)?;
        let data = launchable(chain.data.as_ref(), principal, box_id)?;
        self.ensure_bundle(box_id, data, chain.derived_from.clone(), &principal.user_id).await
    }

    /// The digest of [`Registry::launchable_bundle`].
    pub(crate) async fn current_bundle(&self, principal: &Principal, box_id: &str) -> Result<String, Refusal> {
        Ok(self.launchable_bundle(principal, box_id).await?.0)
    }

    /// `SyncBundle` (from the gateway): the bundle of the Box's current manifest, synced
    /// if new. Never creates a Worker.
    pub(crate) async fn sync_bundle(&self, principal: &Principal, r: v1::SyncBundle) -> Result<Reply, Refusal> {
        let mut errors: Vec<FieldError> = launch_id_errors(&r.launch_id).into_iter().chain(box_id_errors(&r.box_id)).collect();
        if let Some(reason) = trigger::foreign_launch_id(&r.launch_id, &r.box_id, principal) {
            errors.push(FieldError::new("launch_id", reason));
        }
        if !errors.is_empty() {
            return Err(invalid(errors));
        }
        let result = self.launchable_bundle(principal, &r.box_id).await;
        match result {
            Ok((digest, event_id, position)) => Ok(reply_written(&v1::BundleSynced { digest, event_id: event_id.clone() }, position, vec![event_id])),
            Err(refusal) => Err(self.refused(principal, &r.launch_id, &r.box_id, refusal).await),
        }
    }

    /// The creation on the Worker's stream, if any.
    pub(crate) async fn created(&self, worker_id: &str) -> Result<Option<Created>, Refusal> {
        for link in self.rt.db.stream(types::WORKER, worker_id).await.map_err(Refusal::internal)? {
            let event: WorkerEvent = link.decode().map_err(Refusal::internal)?;
            if matches!(event, WorkerEvent::WorkerCreated { .. }) {
                return Ok(Some(Created { event, event_id: link.event_id, position: link.position }));
            }
        }
        Ok(None)
    }

    /// Verifies the Box's approval again: the `DraftApproved` on the draft's stream, its
    /// token checked with the published public keys at the time it was recorded, and bound
    /// to the draft, the box_type and the approved manifest's digest.
    async fn check_approval(&self, draft_id: &str, box_type: &str, approved_digest: &str) -> Result<ApprovalCheck, Refusal> {
        let links = self.rt.db.stream(types::DRAFT, draft_id).await.map_err(Refusal::internal)?;
        let approved = links.into_iter().find_map(|l| match l.decode::<DraftEvent>() {
            Ok(DraftEvent::DraftApproved { token, approved_at, .. }) => Some((l, token, approved_at)),
            _ => None,
        });
        let Some((link, token, approved_at)) = approved else {
            return Ok(ApprovalCheck { event_id: None, key_id: String::new(), refused: Some("the Box's draft holds no approval".into()) });
        };
        let keyring = self.keys.keyring_for(&token.claims.key_id).await.map_err(Refusal::internal)?;
        let refused = match keyring.verify(&token, approved_at).and_then(|v| v.check_binding(draft_id, box_type, approved_digest)) {
            Ok(()) => None,
            Err(e) => Some(format!("the Box's approval token does not verify: {}", e.reason())),
        };
        Ok(ApprovalCheck { event_id: Some(link.event_id), key_id: token.claims.key_id, refused })
    }

    /// Claims the binding for the Worker, on behalf of the caller: the provisioner's Ack,
    /// or its typed refusal.
    async fn consume_binding(&self, principal: &Principal, request: &v1::ConsumeBinding) -> Result<Result<(), Refused>, Refusal> {
        Ok(self.client.call(subjects::PROVISIONER, principal, request, "").await?.map(|_| ()))
    }

    /// `CreateWorker` (from the gateway, R-WORKER-4): checks in this order, then claims the
    /// binding and appends `WorkerCreated`; every refusal about the launch is recorded.
    pub(crate) async fn create_worker(&self, principal: Principal, r: v1::CreateWorker) -> Result<Reply, Refusal> {
        // 1. The launch's own rules: a segment without a kind is invalid_segment, the rest
        //    of the bounds invalid_request.
        let mut input = Vec::with_capacity(r.initial_input.len());
        let mut kindless = Vec::new();
        for (i, segment) in r.initial_input.iter().enumerate() {
            match workers_view::segment_from_wire(segment) {
                Some(s) => input.push(s),
                None => kindless.push(FieldError::new(format!("input[{i}]"), "a segment is text, ticket_ref or objective_ref; role prompts come from the Box")),
            }
        }
        if !kindless.is_empty() {
            let refusal = Refusal { field_errors: kindless, ..Refusal::new(ErrorCode::InvalidSegment, "the input holds a segment of no known kind") };
            return Err(self.refused(&principal, &r.launch_id, &r.box_id, refusal).await);
        }
        let request = LaunchRequest { launch_id: r.launch_id.clone(), box_id: r.box_id.clone(), role: r.role.clone(), labels: r.labels.clone(), input };
        let mut errors = validate_launch(&request);
        errors.extend(box_id_errors(&r.box_id));
        if !text_ok(&r.binding_handle, ID_CHARS) {
            errors.push(FieldError::new("binding_handle", format!("1 to {ID_CHARS} characters")));
        }
        if let Some(reason) = trigger::foreign_launch_id(&r.launch_id, &r.box_id, &principal) {
            errors.push(FieldError::new("launch_id", reason));
        }
        if !errors.is_empty() {
            return Err(invalid(errors));
        }
        let worker_id = worker_id_for(&r.launch_id);
        let fingerprint = launch_fingerprint(&request, &principal.user_id);
        // 2. A Worker of this launch: the same request is answered with it (nothing is
        //    consumed), another is a conflict.
        if let Some(existing) = self.created(&worker_id).await? {
            if existing.fingerprint() == fingerprint {
                return self.answer(existing, false).await;
            }
            let refusal = Refusal::new(ErrorCode::LaunchIdConflict, format!("launch_id {:?} was used for another request", r.launch_id));
            return Err(self.refused(&principal, &r.launch_id, &r.box_id, refusal).await);
        }
        // 3..5. The Box, the bundle, the approval.
        let (box_type, approval_key_id, chain, policy) = match self.check_launch(&principal, &r, &request).await {
            Ok(checked) => checked,
            Err(refusal) => return Err(self.refused(&principal, &r.launch_id, &r.box_id, refusal).await),
        };
        atasira_platform::failpoint("registry.create_worker");
        // 6. The binding, claimed for this Worker (its refusal passes through).
        let consume = v1::ConsumeBinding { handle: r.binding_handle.clone(), box_id: r.box_id.clone(), worker_id: worker_id.clone() };
        if let Err(refused) = self.consume_binding(&principal, &consume).await? {
            return Err(self.refused(&principal, &r.launch_id, &r.box_id, Refusal::passed_on(refused)).await);
        }
        // 7. The Worker.
        let new = NewWorker {
            worker_id,
            launch_id: r.launch_id.clone(),
            box_id: r.box_id.clone(),
            box_type,
            role: request.role,
            labels: request.labels,
            initial_input: request.input,
            fingerprint,
            bundle_digest: r.bundle_digest.clone(),
            binding_handle: r.binding_handle.clone(),
            created_by: principal.user_id.clone(),
            approval_key_id,
            chain,
            at: chrono::Utc::now(),
            policy,
        };
        match self.append_worker(new).await {
            Ok((created, by_us)) => self.answer(created, by_us).await,
            Err(refusal) => Err(self.refused(&principal, &r.launch_id, &r.box_id, refusal).await),
        }
    }

    /// Steps 3 to 5 of `CreateWorker`: the Box (active, the caller may launch), the bundle
    /// (this Box's, of its current manifest, synced) and the approval (verifies, binds the
    /// approved manifest), then the organisation's policy (R-POLICY-1). The Worker's
    /// box_type, approval key, chain of custody and the policy's verdict.
    async fn check_launch(&self, principal: &Principal, r: &v1::CreateWorker, request: &LaunchRequest) -> Result<Launchable, Refusal> {
        let chain = box_chain(&self.rt.db, &r.box_id).await.map_err(Refusal::internal)?;
        let data = launchable(chain.data.as_ref(), principal, &r.box_id)?;
        let requested =
            if digest_shaped(&r.bundle_digest) { self.rt.db.load::<ConfigBundle>(&r.bundle_digest).await.map_err(Refusal::internal)?.data } else { None };
        if requested.as_ref().is_some_and(|b| b.box_id != r.box_id) {
            return Err(Refusal::new(ErrorCode::BundleProfileIncompatible, "the bundle belongs to another Box"));
        }
        let current = bundle_digest(&r.box_id, &data.manifest);
        if r.bundle_digest != current {
            return Err(Refusal::new(
                ErrorCode::BundleDigestMismatch,
                "the bundle digest is not the digest of the Box's current manifest; sync the bundle again",
            ));
        }
        if requested.is_none() {
            return Err(Refusal::new(ErrorCode::BundleNotFound, "the bundle of the Box's current manifest was never synced"));
        }
        let approved = &data.approved_manifest;
        let approval = self.check_approval(&data.draft_id, approved.box_type.as_str(), &approved.digest()).await?;
        let approval_event = match (approval.event_id, approval.refused) {
            (Some(event_id), None) => event_id,
            (_, refused) => {
                let reason = refused.unwrap_or_else(|| "the Box's approval does not verify".into());
                return Err(Refusal::new(ErrorCode::InvalidApprovalToken, reason));
            }
        };
        let mut links = vec![approval_event];
        links.extend(chain.derived_from);
        links.push(StoredEvent::event_id_of(types::CONFIG_BUNDLE, &current, 1));
        let input = Input::launch(principal, &data.manifest, &r.box_id, &r.launch_id, &request.labels);
        let policy = self.policies.verdict(&self.rt.db, &input).await?;
        if let Some(denied) = policy.as_ref().filter(|v| v.denied()) {
            return Err(Refusal::new(ErrorCode::PolicyDenied, denied.refusal()));
        }
        Ok((data.manifest.box_type.to_string(), approval.key_id, links, policy))
    }

    /// Appends `WorkerCreated`; the creation and whether this request made it. What this
    /// request appended is answered from its receipt; a creation of the same launch that
    /// came first is read back and compared: the same request is answered with it, another
    /// is a conflict.
    async fn append_worker(&self, new: NewWorker) -> Result<(Created, bool), Refusal> {
        let worker_id = new.worker_id.clone();
        for _ in 0..3 {
            match self.workers.execute(&worker_id, WorkerCommand::Create(Box::new(new.clone())), HashMap::new(), Retry::ONCE).await {
                Ok(receipt) if receipt.appended() => {
                    let at = receipt.head()?;
                    return Ok((Created { event: new.created(), event_id: at.id, position: at.position }, true));
                }
                Err(refusal) if refusal.code != ErrorCode::Conflict => return Err(refusal),
                // Another creation of the launch came first: read what is there.
                _ => {}
            }
            if let Some(created) = self.created(&worker_id).await? {
                let ours =
                    matches!(&created.event, WorkerEvent::WorkerCreated { binding_handle, at, .. } if *binding_handle == new.binding_handle && *at == new.at);
                if ours || created.fingerprint() == new.fingerprint {
                    return Ok((created, ours));
                }
                return Err(Refusal::new(ErrorCode::LaunchIdConflict, format!("launch_id {:?} was used for another request", new.launch_id)));
            }
            // A refused attempt of the same launch was recorded first: again.
        }
        Err(Refusal::new(ErrorCode::Conflict, "a concurrent change to the same launch was recorded first; retry"))
    }

    /// The Worker with its transcript, once the catalog shows it.
    async fn answer(&self, created: Created, by_us: bool) -> Result<Reply, Refusal> {
        let (row, entry) = WorkerRow::created(&created.event, created.position).ok_or_else(|| Refusal::internal("not a creation"))?;
        proj::wait_for_events(&self.rt.db, &[workers_view::READ_MODEL], std::slice::from_ref(&created.event_id), created.position, Duration::from_secs(5))
            .await
            .map_err(Refusal::internal)?;
        let reply = v1::WorkerReply { worker: Some(with_life(row.to_wire(&[entry]), None)), created: by_us };
        Ok(reply_written(&reply, created.position, vec![created.event_id]))
    }

    /// Reads of a Box's Workers: admins, and the users assigned to the Box.
    async fn may_read(&self, principal: &Principal, box_id: &str) -> Result<(), Refusal> {
        if principal.is_admin() {
            return Ok(());
        }
        let row = views::row(&self.rt.db, box_id).await.map_err(Refusal::internal)?;
        if row.is_some_and(|b| b.assignments.iter().any(|a| a.user_id == principal.user_id)) {
            return Ok(());
        }
        Err(Refusal::new(ErrorCode::Forbidden, "only admins and the Box's assigned users see its Workers"))
    }

    async fn catalog_entry(&self, principal: &Principal, worker_id: &str) -> Result<(WorkerRow, Vec<workers_view::TranscriptRow>), Refusal> {
        let found = workers_view::get(&self.rt.db, worker_id).await.map_err(Refusal::internal)?;
        let (row, transcript) = found.ok_or_else(|| Refusal::new(ErrorCode::WorkerNotFound, format!("no Worker {worker_id:?}")))?;
        self.may_read(principal, &row.box_id).await?;
        Ok((row, transcript))
    }

    /// `GetWorker`: the Worker with its transcript.
    pub(crate) async fn get_worker(&self, principal: &Principal, r: v1::GetWorker) -> Result<Reply, Refusal> {
        let view = match atasira_platform::store::AsOf::from_request(r.at, r.at_time.as_ref())? {
            None => self.worker_view(principal, &r.worker_id).await?,
            Some(as_of) => {
                // R-HIST: replayed from the Worker's stream up to then.
                let then = workers_view::at(&self.rt.db, &r.worker_id, as_of).await.map_err(Refusal::internal)?;
                let then = then.ok_or_else(|| Refusal::new(ErrorCode::WorkerNotFound, format!("no Worker {:?} then", r.worker_id)))?;
                self.may_read(principal, &then.row.box_id).await?;
                let mut view = with_life(then.row.to_wire(&then.transcript), Some(&then.life));
                let shown = usize::try_from(crate::hosts::LOG_SHOWN).unwrap_or(usize::MAX);
                view.log = then.log[then.log.len().saturating_sub(shown)..].to_vec();
                view
            }
        };
        Ok(reply_ok(&v1::WorkerReply { worker: Some(view), created: false }))
    }

    /// The Worker as those who may read it see it: catalog entry, transcript, where it is
    /// in its life, its last log lines and its result.
    pub(crate) async fn worker_view(&self, principal: &Principal, worker_id: &str) -> Result<v1::WorkerView, Refusal> {
        let (row, transcript) = self.catalog_entry(principal, worker_id).await?;
        let life = workers_view::life(&self.rt.db, worker_id).await.map_err(Refusal::internal)?;
        let mut view = with_life(row.to_wire(&transcript), life.as_ref());
        view.log = workers_view::log(&self.rt.db, worker_id, crate::hosts::LOG_SHOWN).await.map_err(Refusal::internal)?;
        Ok(view)
    }

    /// `ListBoxWorkers`: a page of the Box's Workers, oldest first, without transcripts.
    pub(crate) async fn list_workers(&self, principal: &Principal, r: v1::ListBoxWorkers) -> Result<Reply, Refusal> {
        if views::row(&self.rt.db, &r.box_id).await.map_err(Refusal::internal)?.is_none() {
            return Err(Refusal::new(ErrorCode::BoxNotFound, format!("no Box {:?}", r.box_id)));
        }
        self.may_read(principal, &r.box_id).await?;
        let (rows, next_cursor) = workers_view::page(&self.rt.db, &r.box_id, r.limit, r.after).await.map_err(Refusal::internal)?;
        let ids: Vec<String> = rows.iter().map(|w| w.worker_id.clone()).collect();
        let lives = workers_view::lives_of(&self.rt.db, &ids).await.map_err(Refusal::internal)?;
        let workers = rows.iter().map(|row| with_life(row.to_wire(&[]), lives.get(&row.worker_id))).collect();
        Ok(reply_ok(&v1::WorkerPage { workers, next_cursor }))
    }

    /// `GetWorkerProvenance`: approval, activation, edits, bundle and Worker, each with its
    /// event; the approval verified again now.
    pub(crate) async fn provenance(&self, principal: &Principal, r: v1::GetWorkerProvenance) -> Result<Reply, Refusal> {
        let (row, _) = self.catalog_entry(principal, &r.worker_id).await?;
        let created = self.created(&row.worker_id).await?.ok_or_else(|| Refusal::new(ErrorCode::WorkerNotFound, format!("no Worker {:?}", r.worker_id)))?;
        let WorkerEvent::WorkerCreated { chain, bundle_digest, approval_key_id, box_id, created_by, at, .. } = &created.event else {
            return Err(Refusal::internal("not a creation"));
        };
        let mut steps = Vec::with_capacity(chain.len() + 1);
        let mut approved: Option<(String, String, String)> = None;
        for event_id in chain {
            let event =
                event_by_id(&self.rt.db, event_id).await.map_err(Refusal::internal)?.ok_or_else(|| Refusal::internal(format!("no event {event_id}")))?;
            if let Some(step) = step_of(&event, &mut approved).map_err(Refusal::internal)? {
                steps.push(step);
            }
        }
        // The approval's step shows the version of the manifest it approved.
        if let [first, second, ..] = &mut steps[..]
            && first.kind == v1::provenance_step::Kind::Approval as i32
            && second.kind == v1::provenance_step::Kind::Activation as i32
        {
            first.manifest_version = second.manifest_version.clone();
        }
        let manifest_version =
            steps.iter().rev().find(|s| s.kind == v1::provenance_step::Kind::Bundle as i32).map(|s| s.manifest_version.clone()).unwrap_or_default();
        steps.push(v1::ProvenanceStep {
            kind: v1::provenance_step::Kind::Worker as i32,
            event_id: created.event_id.clone(),
            position: u64::try_from(created.position).unwrap_or(0),
            at: Some(convert::timestamp(*at)),
            actor: created_by.clone(),
            digest: bundle_digest.clone(),
            manifest_version,
        });
        let approval_verified = match &approved {
            Some((draft_id, box_type, digest)) => {
                let check = self.check_approval(draft_id, box_type, digest).await?;
                check.refused.is_none() && check.event_id.as_deref() == chain.first().map(String::as_str) && check.key_id == *approval_key_id
            }
            None => false,
        };
        Ok(reply_ok(&v1::WorkerProvenance {
            worker_id: row.worker_id,
            box_id: box_id.clone(),
            bundle_digest: bundle_digest.clone(),
            approval_key_id: approval_key_id.clone(),
            approval_verified,
            steps,
        }))
    }
}

/// A Worker's answer with where it is in its life (`created` when the view holds none: a
/// Worker created before Workers ran on hosts).
fn with_life(mut view: v1::WorkerView, life: Option<&workers_view::Life>) -> v1::WorkerView {
    match life {
        Some(life) => life.fill(&mut view),
        None => view.state = WorkerState::Created.as_str().to_owned(),
    }
    view
}

/// One link of a chain as a provenance step; `activated` learns the activation's draft,
/// box_type and approved manifest digest (what the approval must bind).
fn step_of(event: &StoredEvent, activated: &mut Option<(String, String, String)>) -> anyhow::Result<Option<v1::ProvenanceStep>> {
    use v1::provenance_step::Kind;
    let step = |kind: Kind, at, actor: &str, digest: &str, version: &str| v1::ProvenanceStep {
        kind: kind as i32,
        event_id: event.event_id.clone(),
        position: u64::try_from(event.position).unwrap_or(0),
        at: Some(convert::timestamp(at)),
        actor: actor.to_owned(),
        digest: digest.to_owned(),
        manifest_version: version.to_owned(),
    };
    Ok(match event.aggregate_type.as_str() {
        t if t == types::DRAFT => match event.decode::<DraftEvent>()? {
            DraftEvent::DraftApproved { approved_by, approved_at, token, .. } => {
                Some(step(Kind::Approval, approved_at, &approved_by, &token.claims.manifest_digest, ""))
            }
            _ => None,
        },
        t if t == types::BOX => match event.decode::<BoxEvent>()? {
            BoxEvent::BoxActivated { draft_id, box_type, manifest, manifest_digest, approved_by, activated_at, .. } => {
                *activated = Some((draft_id, box_type, manifest_digest.clone()));
                Some(step(Kind::Activation, activated_at, &approved_by, &manifest_digest, &manifest.version))
            }
            BoxEvent::BoxManifestEdited { manifest, edited_by, at, .. } => {
                Some(step(Kind::ManifestEdit, at, &edited_by, &manifest.digest(), &manifest.version))
            }
            BoxEvent::BoxConfigEdited { manifest, edited_by, at, .. } => Some(step(Kind::ConfigEdit, at, &edited_by, &manifest.digest(), &manifest.version)),
            // The change's approval is the one the Box's bundle now rests on.
            BoxEvent::BoxManifestChanged { draft_id, box_type, manifest, manifest_digest, approved_by, at, .. } => {
                *activated = Some((draft_id, box_type, manifest_digest.clone()));
                Some(step(Kind::Change, at, &approved_by, &manifest_digest, &manifest.version))
            }
            _ => None,
        },
        t if t == types::CONFIG_BUNDLE => {
            let BundleEvent::ConfigBundleSynced { digest, manifest_version, by, at, .. } = event.decode::<BundleEvent>()?;
            Some(step(Kind::Bundle, at, &by, &digest, &manifest_version))
        }
        _ => None,
    })
}

#[cfg(test)]
mod tests;
