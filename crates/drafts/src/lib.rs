//! The drafts service (SPEC §3): accepts draft submissions over the bus, always as
//! `pending_approval` (R-DRAFT-1), and serves the drafts projection (pending list,
//! detail, mine) with read-your-writes waits (R-BOX-9).
//!
//! Architecture Invariant: no request to this service can produce anything but a
//! `DraftSubmitted` event; decisions belong to the approval service.

mod check;
mod projection;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::requests::{DraftsRequest, Incoming};
use atasira_contracts::{Envelope, Reply, reply_ok, reply_written, subjects, v1};
use atasira_domain::aggregates::boxes::{BoxAggregate, BoxRole, BoxState};
use atasira_domain::aggregates::draft::{ChangeOf, Draft, DraftCommand, DraftStatus, change_id_for, draft_id_for, revision_id_for};
use atasira_domain::aggregates::types;
use atasira_domain::change::plan_change;
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::org_policy::{Input, Verdict};
use atasira_domain::os_operation::OverLimit;
use atasira_domain::{ErrorCode, Principal};
use atasira_platform::Runtime;
use atasira_platform::org_policy::{self, Policies, head_of};
use atasira_platform::projection::{self as proj, Projection, ReadModel};
use atasira_platform::refusal::Refusal;
use atasira_platform::service::{self as platform_service, Call};
use atasira_platform::store::Receipt;
use atasira_platform::store::Retry;
use prost::Message as _;

pub use projection::{DraftRow, DraftsView, list_statement};

/// The service name (also its subject token).
pub const SERVICE: &str = subjects::DRAFTS;
/// Aggregate types whose events this service appends and relays.
pub const AGGREGATE_TYPES: &[&str] = &[types::DRAFT, types::DRAFTS_SECURITY];

struct Service {
    rt: Runtime,
    cqrs: atasira_platform::store::Cqrs<Draft>,
    over_limit_approvals: u32,
    /// R-POLICY-1: the organisation's policy, evaluated on every submission.
    policies: Policies,
    /// The policy's head this process read last, which its submissions assume.
    policy_seen: PolicySeen,
}

/// How often a submission is decided at most: what it assumed did not hold, or its verdict
/// is checked against a fresh read, and then something changed again meanwhile.
const SUBMIT_ATTEMPTS: usize = 4;

/// The last sequence of the organisation's policy stream that this process read, which its
/// submissions assume until an append finds it changed (see `Service::submit`): the append
/// checks what was assumed in its own statement.
#[derive(Debug)]
struct PolicySeen {
    /// `UNKNOWN` until the first read; 0 when no policy was published.
    sequence: std::sync::atomic::AtomicI64,
}

impl PolicySeen {
    const UNKNOWN: i64 = -1;

    fn new() -> PolicySeen {
        PolicySeen { sequence: std::sync::atomic::AtomicI64::new(Self::UNKNOWN) }
    }

    /// What a submission may assume of the policy's head (`Some(None)`: no policy), or
    /// `None`: it reads first.
    fn assumed(&self) -> Option<Option<i64>> {
        match self.sequence.load(std::sync::atomic::Ordering::Relaxed) {
            Self::UNKNOWN => None,
            0 => Some(None),
            sequence => Some(Some(sequence)),
        }
    }

    fn saw(&self, head: Option<i64>) {
        self.sequence.store(head.unwrap_or(0), std::sync::atomic::Ordering::Relaxed);
    }
}

/// Settings of the drafts service.
#[derive(Debug, Clone)]
pub struct DraftsConfig {
    /// R-DRAFT-13: pending drafts expire after this (`ATASIRA_DRAFT_TTL`, default 7 days).
    pub ttl: chrono::TimeDelta,
    /// How often the expiry sweep runs.
    pub sweep_every: Duration,
    /// R-CHANGE-3: distinct human admins an over_limit draft or change needs
    /// (`ATASIRA_OVER_LIMIT_APPROVALS`, default 1).
    pub over_limit_approvals: u32,
}

impl Default for DraftsConfig {
    fn default() -> Self {
        Self { ttl: chrono::TimeDelta::days(7), sweep_every: Duration::from_secs(60), over_limit_approvals: 1 }
    }
}

/// The projections this service answers read-your-writes waits for, with what they read.
const READ_MODELS: &[ReadModel] = &[ReadModel::new(projection::NAME, projection::READS)];

/// Starts the service: projection runner, expiry sweep and bus endpoint. Returns when
/// `shutdown` flips.
pub async fn run(rt: Runtime, config: DraftsConfig, shutdown: tokio::sync::watch::Receiver<bool>) -> anyhow::Result<()> {
    let view: Arc<dyn Projection> = Arc::new(DraftsView);
    proj::prepare(&rt.db, view.as_ref()).await?;
    let db = rt.db.clone();
    atasira_platform::metrics::gauge_source(
        "pending_drafts",
        Arc::new(move || {
            let db = db.clone();
            Box::pin(async move { db.count("SELECT COUNT(*) FROM draft_rows WHERE status = 'pending_approval'").await })
        }),
    );
    let service = Arc::new(Service {
        cqrs: rt.db.cqrs::<Draft>(),
        rt: rt.clone(),
        over_limit_approvals: config.over_limit_approvals.max(1),
        policies: Policies::default(),
        policy_seen: PolicySeen::new(),
    });
    let endpoint = {
        let service = service.clone();
        platform_service::serve(&rt, SERVICE, move |call| {
            let service = service.clone();
            async move { service.dispatch(&call).await }
        })
        .await?
    };
    let runner = tokio::spawn(proj::run(rt.db.clone(), rt.feeds.clone(), view, shutdown.clone()));
    let sweeper = tokio::spawn(sweep_expired(service.clone(), config, shutdown.clone()));
    platform_service::until_shutdown(shutdown).await;
    endpoint.stop();
    let _ = runner.await;
    let _ = sweeper.await;
    Ok(())
}

/// R-DRAFT-13: expires pending drafts older than the TTL (the aggregate decides; a draft
/// decided meanwhile is left alone).
async fn sweep_expired(service: Arc<Service>, config: DraftsConfig, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        let cutoff = chrono::Utc::now() - config.ttl;
        match projection::pending_older_than(&service.rt.db, cutoff).await {
            Ok(ids) => {
                for id in ids {
                    let command = DraftCommand::Expire { now: chrono::Utc::now(), ttl: config.ttl };
                    if let Err(e) = service.cqrs.execute(&id, command, HashMap::new(), Retry::ONCE).await {
                        tracing::warn!(draft_id = %id, error = %e, "expiry failed; next sweep retries");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "expiry sweep failed"),
        }
        tokio::select! {
            _ = tokio::time::sleep(config.sweep_every) => {}
            _ = shutdown.changed() => return,
        }
    }
}

impl Service {
    async fn dispatch(&self, call: &Call) -> Result<Reply, Refusal> {
        let env = &call.env;
        let request = match DraftsRequest::decode(env)? {
            Incoming::Wait(w) => return platform_service::wait_reply(&self.rt, READ_MODELS, &w).await,
            Incoming::Request(request) => request,
        };
        // Checked when an arm needs it; a submission reads the store meanwhile (`submit`).
        let principal = call.principal(&self.rt);
        match request {
            DraftsRequest::Submit(req) => self.submit(principal, req, env).await,
            DraftsRequest::SubmitChange(req) => self.submit_change(principal.await?, req).await,
            DraftsRequest::Revise(req) => self.revise(principal.await?, req).await,
            DraftsRequest::ListPending(req) => {
                let principal = principal.await?;
                if !principal.is_admin() {
                    return Err(Refusal::new(ErrorCode::Forbidden, "listing pending drafts needs role admin"));
                }
                let (rows, next_cursor) =
                    projection::list(&self.rt.db, Some(DraftStatus::PendingApproval), None, req.limit, req.after).await.map_err(Refusal::internal)?;
                Ok(reply_ok(&page(&rows, next_cursor)))
            }
            DraftsRequest::ListMine(req) => {
                let principal = principal.await?;
                let (rows, next_cursor) =
                    projection::list(&self.rt.db, None, Some(&principal.user_id), req.limit, req.after).await.map_err(Refusal::internal)?;
                Ok(reply_ok(&page(&rows, next_cursor)))
            }
            DraftsRequest::List(req) => {
                let principal = principal.await?;
                // R-DRAFT-12, R-AUTH-2: the caller's own drafts, or (admins) everyone's.
                if !req.mine && !principal.is_admin() {
                    return Err(Refusal::new(ErrorCode::Forbidden, "listing every requester's drafts needs role admin; use mine=true for your own"));
                }
                let statuses = projection::statuses_of(v1::DraftStatus::try_from(req.status).unwrap_or_default());
                let requested_by = req.mine.then_some(principal.user_id.as_str());
                let (rows, next_cursor) = projection::list_in(&self.rt.db, statuses, requested_by, req.limit, req.after).await.map_err(Refusal::internal)?;
                Ok(reply_ok(&page(&rows, next_cursor)))
            }
            DraftsRequest::Withdraw(req) => {
                let principal = principal.await?;
                // Over NATS, publishers submit and read; withdrawing is the API's.
                call.only_services("withdrawing a draft")?;
                self.withdraw(principal, &req.draft_id).await
            }
            DraftsRequest::CheckPolicy(req) => {
                let principal = principal.await?;
                call.only_services("checking policies")?;
                let active = self.policies.active(&self.rt.db).await?;
                check::check(&self.rt.db, active, &principal, req).await
            }
            DraftsRequest::Get(req) => {
                let principal = principal.await?;
                match self.draft_as_of(&req).await? {
                    Some(row) if principal.is_admin() || row.requested_by == principal.user_id => {
                        Ok(reply_ok(&v1::DraftReply { draft: Some(row.to_wire(true)) }))
                    }
                    // Not the requester: indistinguishable from absent, so ids do not leak.
                    _ => Err(Refusal::new(ErrorCode::DraftNotFound, format!("no draft {:?} visible to you", req.draft_id))),
                }
            }
        }
    }

    /// The draft now (the view), or as it was (R-HIST: `at`, `at_time`).
    async fn draft_as_of(&self, req: &v1::GetDraft) -> Result<Option<projection::DraftRow>, Refusal> {
        match atasira_platform::store::AsOf::from_request(req.at, req.at_time.as_ref())? {
            None => projection::get(&self.rt.db, &req.draft_id).await.map_err(Refusal::internal),
            Some(as_of) => projection::at(&self.rt.db, &req.draft_id, as_of).await.map_err(Refusal::internal),
        }
    }

    async fn submit(&self, principal: impl Future<Output = Result<Principal, Refusal>>, req: v1::SubmitDraft, env: &Envelope) -> Result<Reply, Refusal> {
        let request = BoxDraftCreateRequest::from(req.request.unwrap_or_default());
        // A submission is decided by the policy this process last read, no Box of its
        // box_type assumed, and its append holds only if both are still so (in the statement
        // that appends, no read before it). It reads the Box of this box_type and the head
        // of the organisation's policy (R-CHANGE-1, R-POLICY-1) the first time (sent first,
        // running in the database while this process checks the caller's assertion and
        // plans the draft), when what was assumed no longer holds, and before a denial by an
        // assumed policy is answered. Nothing read is answered to a caller who is refused.
        let asked = request.box_type.clone().unwrap_or_default();
        let assumed = self.policy_seen.assumed();
        let (looked, checked) = tokio::join!(
            biased;
            async {
                match assumed {
                    Some(_) => Ok(None),
                    None => self.look(&asked).await.map(Some),
                }
            },
            async { Ok::<_, Refusal>((principal.await?, request.plan()?)) },
        );
        let (principal, plan) = checked?;
        // A plan keeps the box_type as asked (parsing checks it, rewrites nothing), so the
        // read was of the draft's own box_type.
        debug_assert_eq!(plan.manifest.box_type.as_str(), asked);
        let mut looked = looked?;
        // R-DRAFT-11: with an Idempotency-Key, every run of the request names the same draft.
        let keyed = !env.idempotency_key.is_empty();
        let draft_id = if keyed { draft_id_for(&principal.user_id, &env.idempotency_key) } else { uuid::Uuid::new_v4().to_string() };
        // A re-run of a keyed request is recognised by its manifest's digest; an unkeyed one
        // never needs it.
        let digest = keyed.then(|| plan.manifest.digest());
        let reply = v1::SubmitDraftReply {
            draft_id: draft_id.clone(),
            box_type: plan.manifest.box_type.to_string(),
            status: v1::DraftStatus::PendingApproval as i32,
            over_limit: plan.over_limit.over_limit,
            warnings: plan.warnings.clone(),
        };
        let metadata = HashMap::from([("correlation_id".to_owned(), env.correlation_id.clone()), ("principal".to_owned(), principal.user_id.clone())]);
        for _ in 0..SUBMIT_ATTEMPTS {
            let (existing, policy) = looked.clone().unwrap_or((None, assumed.flatten()));
            // R-CHANGE-1: a box_type with a Box changes through a change request of that Box.
            if let Some(box_id) = existing {
                return Err(Refusal::new(
                    ErrorCode::BoxTypeExists,
                    format!("box_type {asked:?} has a Box ({box_id}); to change what it may do, request a change: POST /api/v1/boxes/{box_id}/change-requests"),
                ));
            }
            // R-POLICY-1: the organisation's rules, after the built-in ones.
            let input = Input::draft(&principal, &plan.manifest, &plan.over_limit);
            let verdict = self.policies.active_at(&self.rt.db, policy.map(head_of)).await?.map(|active| active.evaluate(&input));
            if let Some(denial) = verdict.as_ref().filter(|v| v.denied()) {
                // A refusal is made by the policy the store holds, never by an assumed one.
                if looked.is_none() {
                    looked = Some(self.look(&asked).await?);
                    continue;
                }
                return Err(org_policy::refuse(&self.rt, SERVICE, &principal, &asked, denial).await);
            }
            let mut plan = plan.clone();
            plan.approvals_required = self.approvals_for(&plan.over_limit, verdict.as_ref());
            plan.policy = verdict;
            let command = DraftCommand::Submit { draft_id: draft_id.clone(), plan, requested_by: principal.clone(), at: chrono::Utc::now() };
            atasira_platform::failpoint_delay("drafts.submit.before_append").await;
            match self.cqrs.execute_new_if(&draft_id, command, metadata.clone(), &projection::as_assumed(&asked, policy)).await {
                Ok(Some(committed)) => {
                    atasira_platform::failpoint("drafts-after-commit");
                    return Self::written(committed, &reply);
                }
                // A Box of this box_type, or a new version of the policy, came meanwhile:
                // decided again by what the store holds now.
                Ok(None) => looked = Some(self.look(&asked).await?),
                // The stream exists: an earlier run of this request made it.
                Err(refusal) => {
                    return match &digest {
                        Some(digest) if refusal.code == ErrorCode::Conflict => self.submitted_before(&principal, &draft_id, digest).await,
                        _ => Err(refusal),
                    };
                }
            }
        }
        Err(Refusal::new(ErrorCode::Busy, "the organisation's policy or the Boxes changed while this draft was decided; retry"))
    }

    /// What a submission reads before it is decided (see `submit`): the Box of `box_type`,
    /// and the last sequence of the organisation's policy stream, which later submissions
    /// of this process assume.
    async fn look(&self, box_type: &str) -> Result<(Option<String>, Option<i64>), Refusal> {
        let looked = projection::box_of_type_and_policy_head(&self.rt.db, box_type).await.map_err(Refusal::internal)?;
        self.policy_seen.saw(looked.1);
        Ok(looked)
    }

    /// R-CHANGE-1: a change request of an active or stopped Box, by an admin or the Box's
    /// primary: a draft in the pending list with the Box and its capability diff. One
    /// pending change per Box; the same request again answers the pending one.
    async fn submit_change(&self, principal: Principal, req: v1::SubmitChange) -> Result<Reply, Refusal> {
        let boxed: BoxAggregate = self.rt.db.load(&req.box_id).await.map_err(Refusal::internal)?;
        let Some(current) = boxed.data.filter(|d| d.state != BoxState::Archived) else {
            return Err(Refusal::new(ErrorCode::BoxNotFound, format!("no active or stopped Box {:?}", req.box_id)));
        };
        let primary = current.assignments.iter().any(|(user, role)| *user == principal.user_id && *role == BoxRole::Primary);
        if !(principal.is_admin() || primary) {
            return Err(Refusal::new(ErrorCode::Forbidden, "a change request needs role admin or the Box's primary"));
        }
        let patch = serde_json::Value::Object(req.patch.map(atasira_contracts::manifest::struct_from_proto).unwrap_or_default());
        let mut plan = plan_change(&current.manifest, &patch)?;
        let digest = plan.manifest.digest();
        let (count, pending) = projection::changes_of(&self.rt.db, &req.box_id).await.map_err(Refusal::internal)?;
        if let Some(pending) = pending {
            return self.pending_change(&principal, &pending.draft_id, &digest).await;
        }
        let input = Input::change(&principal, &plan.manifest, &plan.over_limit, &req.box_id, &plan.diff.added);
        let verdict = self.policies.admit(&self.rt, SERVICE, &req.box_id, &input).await?;
        plan.approvals_required = self.approvals_for(&plan.over_limit, verdict.as_ref());
        plan.policy = verdict;
        let change = ChangeOf::planned(&req.box_id, &current.manifest, &plan);
        let draft_id = change_id_for(&req.box_id, count);
        let reply = change_reply(&draft_id, &req.box_id, &plan.manifest, &plan.over_limit, &change);
        let metadata = HashMap::from([("principal".to_owned(), principal.user_id.clone())]);
        let command = DraftCommand::SubmitChange { draft_id: draft_id.clone(), plan, change, requested_by: principal.clone(), at: chrono::Utc::now() };
        match self.cqrs.execute_new(&draft_id, command, metadata).await {
            Ok(receipt) => Self::written(receipt, &reply),
            // Another change of this Box was recorded under this id first.
            Err(refusal) if refusal.code == ErrorCode::Conflict => self.pending_change(&principal, &draft_id, &digest).await,
            Err(refusal) => Err(refusal),
        }
    }

    /// R-CHANGE-2: the requester of a rejected draft or change request makes a new pending
    /// version of it, a merge patch of its manifest's keys; the new draft keeps the thread
    /// (the rejection, who rejected, the earlier versions, what this version changes).
    async fn revise(&self, principal: Principal, req: v1::ReviseDraft) -> Result<Reply, Refusal> {
        let rejected: Draft = self.rt.db.load(&req.draft_id).await.map_err(Refusal::internal)?;
        let Some(revised) = rejected.data.filter(|d| principal.is_admin() || d.requested_by.user_id == principal.user_id) else {
            return Err(Refusal::new(ErrorCode::DraftNotFound, format!("no draft {:?} visible to you", req.draft_id)));
        };
        let patch = serde_json::Value::Object(req.patch.map(atasira_contracts::manifest::struct_from_proto).unwrap_or_default());
        // The new version is the rejected one's manifest with the patch; a change request
        // is planned again on its Box's manifest as the store holds it now.
        let proposed = plan_change(&revised.manifest, &patch)?.manifest;
        let (mut manifest, over_limit, change) = match &revised.change {
            Some(change) => {
                let boxed: BoxAggregate = self.rt.db.load(&change.box_id).await.map_err(Refusal::internal)?;
                let current = boxed
                    .data
                    .filter(|d| d.state != BoxState::Archived)
                    .ok_or_else(|| Refusal::new(ErrorCode::BoxNotActive, "the Box of this change request is archived"))?;
                let mut whole = proposed.to_object();
                whole.remove("box_type");
                whole.remove("version");
                let plan = plan_change(&current.manifest, &serde_json::Value::Object(whole))?;
                let change = ChangeOf::planned(&change.box_id, &current.manifest, &plan);
                (plan.manifest, plan.over_limit, Some(change))
            }
            None => {
                let verdict = atasira_domain::os_operation::over_limit(&proposed.os_operations, &proposed.tools);
                (proposed, verdict, None)
            }
        };
        if change.is_none() {
            // A new Box's version stays its first.
            manifest.version = revised.manifest.version.clone();
        }
        let draft_id = revision_id_for(&req.draft_id);
        let input = match &change {
            Some(c) => Input::change(&principal, &manifest, &over_limit, &c.box_id, &c.diff.added),
            None => Input::draft(&principal, &manifest, &over_limit),
        };
        let policy = self.policies.admit(&self.rt, SERVICE, &req.draft_id, &input).await?;
        let approvals_required = self.approvals_for(&over_limit, policy.as_ref());
        let command = DraftCommand::Revise {
            draft_id: draft_id.clone(),
            revised,
            manifest,
            over_limit,
            change,
            approvals_required,
            policy,
            requested_by: principal,
            at: chrono::Utc::now(),
        };
        let decided = Draft::default().decide(command.clone())?;
        let Some(event) = decided.first() else { return Err(Refusal::internal("a revision decided nothing")) };
        let metadata = HashMap::new();
        match self.cqrs.execute_new(&draft_id, command, metadata).await {
            Ok(receipt) => {
                let head = receipt.head()?;
                let row = DraftRow::submitted(event, head.position).ok_or_else(|| Refusal::internal("a revision is a submission"))?;
                Ok(reply_written(&v1::DraftReply { draft: Some(row.to_wire(true)) }, head.position, vec![head.id]))
            }
            Err(refusal) if refusal.code == ErrorCode::Conflict => {
                Err(Refusal::new(ErrorCode::DraftNotPending, format!("draft {:?} was revised already: its revision is {draft_id}", req.draft_id)))
            }
            Err(refusal) => Err(refusal),
        }
    }

    /// The pending change `draft_id` of a Box: answered again to its requester asking for
    /// the same manifest (a retry), `change_request_pending` to anyone else.
    async fn pending_change(&self, principal: &Principal, draft_id: &str, digest: &str) -> Result<Reply, Refusal> {
        let draft: Draft = self.rt.db.load(draft_id).await.map_err(Refusal::internal)?;
        let Some(d) = draft.data else { return Err(Refusal::new(ErrorCode::Conflict, "a concurrent change request was recorded first; retry")) };
        match &d.change {
            Some(change) if d.status == DraftStatus::PendingApproval && d.requested_by.user_id == principal.user_id && d.manifest.digest() == digest => {
                self.as_submitted(draft_id, &change_reply(draft_id, &change.box_id, &d.manifest, &d.over_limit, change)).await
            }
            Some(_) if d.status == DraftStatus::PendingApproval => Err(Refusal::new(
                ErrorCode::ChangeRequestPending,
                format!("the Box has a change request pending ({draft_id}); it must be approved, rejected or withdrawn before another"),
            )),
            _ => Err(Refusal::new(ErrorCode::Conflict, "the Box's change requests moved on meanwhile; retry")),
        }
    }

    /// R-DRAFT-11: a keyed submit run again (its gateway died before storing the answer)
    /// answers what the first run did: the same draft, as submitted, with its first event
    /// for read-your-writes. The draft must be the caller's and hold the same manifest.
    async fn submitted_before(&self, principal: &Principal, draft_id: &str, digest: &str) -> Result<Reply, Refusal> {
        let draft: Draft = self.rt.db.load(draft_id).await.map_err(Refusal::internal)?;
        let Some(d) = draft.data else {
            return Err(Refusal::new(ErrorCode::Conflict, "a concurrent submit with this Idempotency-Key was recorded first; retry"));
        };
        if d.requested_by.user_id != principal.user_id {
            return Err(Refusal::new(ErrorCode::Conflict, "this Idempotency-Key names a draft that is not yours; use another key"));
        }
        if d.manifest.digest() != digest {
            return Err(Refusal::new(ErrorCode::IdempotencyKeyReuse, "this Idempotency-Key was used with a different draft"));
        }
        let reply = v1::SubmitDraftReply {
            draft_id: draft_id.to_owned(),
            box_type: d.manifest.box_type.to_string(),
            status: v1::DraftStatus::PendingApproval as i32,
            over_limit: d.over_limit.over_limit,
            warnings: d.warnings,
        };
        self.as_submitted(draft_id, &reply).await
    }

    /// `reply` to a request answered again, with the draft's first event (its submission)
    /// for read-your-writes.
    async fn as_submitted<M: prost::Message>(&self, draft_id: &str, reply: &M) -> Result<Reply, Refusal> {
        let first = self
            .rt
            .db
            .first_event(types::DRAFT, draft_id)
            .await
            .map_err(Refusal::internal)?
            .ok_or_else(|| Refusal::internal("the submitted draft is not readable"))?;
        Ok(reply_written(reply, first.position, vec![first.id]))
    }

    /// R-CHANGE-3: how many human admins a submission over the limit (or not) needs.
    /// R-CHANGE-3, R-POLICY-1: distinct human admins required: the setting's for an
    /// over_limit draft, or more where a policy rule asks for more.
    fn approvals_for(&self, over_limit: &OverLimit, verdict: Option<&Verdict>) -> u32 {
        let setting = if over_limit.over_limit { self.over_limit_approvals } else { 1 };
        setting.max(verdict.map_or(1, |v| v.approvals_required))
    }

    /// R-DRAFT-13: the requester withdraws a pending draft (the aggregate decides who may).
    async fn withdraw(&self, principal: Principal, draft_id: &str) -> Result<Reply, Refusal> {
        let command = DraftCommand::Withdraw { by: principal, at: chrono::Utc::now() };
        let receipt = self.cqrs.execute(draft_id, command, HashMap::new(), Retry::ONCE).await?;
        Self::written(receipt, &v1::WithdrawReply { draft_id: draft_id.to_owned(), status: v1::DraftStatus::Withdrawn as i32 })
    }

    /// The reply to a command, with the head of its stream for read-your-writes.
    fn written<M: prost::Message>(receipt: Receipt, reply: &M) -> Result<Reply, Refusal> {
        let head = receipt.head()?;
        Ok(reply_written(reply, head.position, vec![head.id]))
    }
}

/// The answer to a change request.
fn change_reply(draft_id: &str, box_id: &str, manifest: &atasira_domain::BoxManifest, over_limit: &OverLimit, change: &ChangeOf) -> v1::SubmitChangeReply {
    v1::SubmitChangeReply {
        draft_id: draft_id.to_owned(),
        box_id: box_id.to_owned(),
        box_type: manifest.box_type.to_string(),
        status: v1::DraftStatus::PendingApproval as i32,
        over_limit: over_limit.over_limit,
        over_limit_ops: over_limit.over_limit_ops.clone(),
        over_limit_tools: over_limit.over_limit_tools.clone(),
        added: change.diff.added.clone(),
        removed: change.diff.removed.clone(),
        version: manifest.version.clone(),
    }
}

/// What one page of drafts may take as protobuf: large drafts (each within the bounds of
/// `atasira_domain::bounds`) make shorter pages, never a reply the bus cannot carry
/// (R-ARCH-6). One draft always fits.
const PAGE_BYTES: usize = 512 * 1024;

/// `rows` as a reply page, cut before the draft that would take it past [`PAGE_BYTES`];
/// the cursor then continues after the last draft kept.
fn page(rows: &[DraftRow], next_cursor: u64) -> v1::DraftPage {
    let mut drafts: Vec<v1::DraftView> = Vec::with_capacity(rows.len());
    let mut size = 0;
    for (i, row) in rows.iter().enumerate() {
        let draft = row.to_wire(false);
        // The field's tag and length prefix take a few bytes more.
        let len = draft.encoded_len() + 8;
        if i > 0 && size + len > PAGE_BYTES {
            return v1::DraftPage { drafts, next_cursor: u64::try_from(rows[i - 1].position).unwrap_or(0) };
        }
        size += len;
        drafts.push(draft);
    }
    v1::DraftPage { drafts, next_cursor }
}

/// The projections this service owns (for `atasira projections rebuild`).
pub fn projections() -> Vec<Arc<dyn Projection>> {
    vec![Arc::new(DraftsView)]
}

#[cfg(test)]
mod tests;
