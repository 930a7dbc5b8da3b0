//! The drafts service (SPEC §3): accepts draft submissions over the bus, always as
//! `pending_approval` (R-DRAFT-1), and serves the drafts projection (pending list,
//! detail, mine) with read-your-writes waits (R-BOX-9).
//!
//! Architecture Invariant: no request to this service can produce anything but a
//! `DraftSubmitted` event; decisions belong to the approval service.

mod projection;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::subjects;
use atasira_contracts::v1;
use atasira_contracts::{Envelope, Named, Reply, payload, reply_ok, reply_written};
use atasira_domain::aggregates::draft::{Draft, DraftCommand};
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::{ErrorCode, Principal};
use atasira_platform::Runtime;
use atasira_platform::projection::{self as proj, Projection};
use atasira_platform::service::{self as platform_service, Refusal};

pub use projection::DraftsView;

/// The service name (also its subject token).
pub const SERVICE: &str = subjects::DRAFTS;
/// Aggregate types whose events this service appends and relays.
pub const AGGREGATE_TYPES: &[&str] = &["draft"];

struct Service {
    rt: Runtime,
    cqrs: atasira_platform::db::Cqrs<Draft>,
}

/// Settings of the drafts service.
#[derive(Debug, Clone)]
pub struct DraftsConfig {
    /// R-DRAFT-13: pending drafts expire after this (`ATASIRA_DRAFT_TTL`, default 7 days).
    pub ttl: chrono::TimeDelta,
    /// How often the expiry sweep runs.
    pub sweep_every: Duration,
}

impl Default for DraftsConfig {
    fn default() -> Self {
        Self { ttl: chrono::TimeDelta::days(7), sweep_every: Duration::from_secs(60) }
    }
}

/// The projections this service answers read-your-writes waits for, with what they read.
const READ_MODELS: &[(&str, &[&str])] = &[(projection::NAME, projection::READS)];

/// Starts the service: projection runner, expiry sweep and bus endpoint. Returns when
/// `shutdown` flips.
pub async fn run(rt: Runtime, config: DraftsConfig, shutdown: tokio::sync::watch::Receiver<bool>) -> anyhow::Result<()> {
    let view: Arc<dyn Projection> = Arc::new(DraftsView);
    proj::prepare(&rt.db, view.as_ref()).await?;
    let service = Arc::new(Service { cqrs: rt.db.cqrs::<Draft>(), rt: rt.clone() });
    let endpoint = {
        let service = service.clone();
        platform_service::serve(&rt, SERVICE, move |env| {
            let service = service.clone();
            async move { service.dispatch(&env).await }
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
                    if let Err(e) = service.cqrs.execute(&id, command, HashMap::new()).await {
                        tracing::warn!(draft_id = %id, error = %e, "expiry failed; next sweep retries");
                    }
                }
                service.rt.notify_committed();
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
            v1::SubmitDraft::NAME => {
                let req: v1::SubmitDraft = payload(env)?;
                self.submit(principal, &req.request_json, env).await
            }
            v1::ListPendingDrafts::NAME => {
                if !principal.is_admin() {
                    return Err(Refusal::new(ErrorCode::Forbidden, "listing pending drafts needs role admin"));
                }
                let req: v1::ListPendingDrafts = payload(env)?;
                let (drafts, next) = projection::list(&self.rt.db, Some("pending_approval"), None, req.limit, &req.cursor).await.map_err(Refusal::internal)?;
                Ok(reply_ok(&v1::PendingDraftsReply { drafts_json: drafts, next_cursor: next }, 0))
            }
            v1::ListMyDrafts::NAME => {
                let req: v1::ListMyDrafts = payload(env)?;
                let (drafts, next) = projection::list(&self.rt.db, None, Some(&principal.user_id), req.limit, &req.cursor).await.map_err(Refusal::internal)?;
                Ok(reply_ok(&v1::PendingDraftsReply { drafts_json: drafts, next_cursor: next }, 0))
            }
            v1::WithdrawDraft::NAME => {
                let req: v1::WithdrawDraft = payload(env)?;
                self.withdraw(principal, &req.draft_id).await
            }
            v1::GetDraft::NAME => {
                let req: v1::GetDraft = payload(env)?;
                let found = projection::get(&self.rt.db, &req.draft_id).await.map_err(Refusal::internal)?;
                match found {
                    Some((requested_by, json)) if principal.is_admin() || requested_by == principal.user_id => {
                        Ok(reply_ok(&v1::DraftReply { draft_json: json }, 0))
                    }
                    // Not the requester: indistinguishable from absent, so ids do not leak.
                    _ => Err(Refusal::new(ErrorCode::DraftNotFound, format!("no draft {:?} visible to you", req.draft_id))),
                }
            }
            other => Err(Refusal::new(ErrorCode::InvalidRequest, format!("unknown message type {other:?}"))),
        }
    }

    async fn submit(&self, principal: Principal, body: &[u8], env: &Envelope) -> Result<Reply, Refusal> {
        let request = BoxDraftCreateRequest::from_json_bytes(body)?;
        let plan = request.plan()?;
        let draft_id = uuid::Uuid::new_v4().to_string();
        let reply = v1::SubmitDraftReply {
            draft_id: draft_id.clone(),
            box_type: plan.manifest.box_type.to_string(),
            status: "pending_approval".into(),
            over_limit: plan.over_limit.over_limit,
            warnings: plan.warnings.clone(),
        };
        let metadata = HashMap::from([("correlation_id".to_owned(), env.correlation_id.clone()), ("principal".to_owned(), principal.user_id.clone())]);
        let command = DraftCommand::Submit { draft_id: draft_id.clone(), plan, requested_by: principal, at: chrono::Utc::now() };
        self.cqrs.execute(&draft_id, command, metadata).await.map_err(|e| match e {
            cqrs_es::AggregateError::UserError(e) => Refusal::from(e),
            other => {
                tracing::error!(error = %other, "failed to commit a draft");
                Refusal::new(ErrorCode::Internal, "the draft could not be stored; retry")
            }
        })?;
        atasira_platform::failpoint("drafts-after-commit");
        let (event_id, position) = self
            .rt
            .db
            .last_event("draft", &draft_id)
            .await
            .ok()
            .flatten()
            .ok_or_else(|| Refusal::new(ErrorCode::Internal, "the committed draft is not readable"))?;
        self.rt.notify_committed();
        Ok(reply_written(&reply, position, vec![event_id]))
    }

    /// R-DRAFT-13: the requester withdraws a pending draft.
    async fn withdraw(&self, principal: Principal, draft_id: &str) -> Result<Reply, Refusal> {
        let draft: Draft = self.rt.db.load(draft_id).await.map_err(Refusal::internal)?;
        // Someone else's draft is indistinguishable from no draft.
        if draft.data.as_ref().is_none_or(|d| d.requested_by.user_id != principal.user_id && !principal.is_admin()) {
            return Err(Refusal::new(ErrorCode::DraftNotFound, format!("no draft {draft_id:?} visible to you")));
        }
        let command = DraftCommand::Withdraw { by: principal, at: chrono::Utc::now() };
        self.cqrs.execute(draft_id, command, HashMap::new()).await.map_err(|e| match e {
            cqrs_es::AggregateError::UserError(e) => Refusal::from(e),
            cqrs_es::AggregateError::AggregateConflict => Refusal::new(ErrorCode::DraftNotPending, "the draft changed meanwhile"),
            other => Refusal::internal(other),
        })?;
        let (event_id, position) =
            self.rt.db.last_event("draft", draft_id).await.ok().flatten().ok_or_else(|| Refusal::new(ErrorCode::Internal, "the draft is not readable"))?;
        self.rt.notify_committed();
        let body = serde_json::json!({"draft_id": draft_id, "status": "withdrawn"});
        Ok(reply_written(&v1::DraftReply { draft_json: body.to_string().into_bytes() }, position, vec![event_id]))
    }
}

/// The projections this service owns (for `atasira projections rebuild`).
pub fn projections() -> Vec<Arc<dyn Projection>> {
    vec![Arc::new(DraftsView)]
}
