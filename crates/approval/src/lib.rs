//! The approval service (SPEC §4): records a human admin's decision on a draft, in the
//! order of R-APPROVE-7: (1) the registry reserves the box_type, (2) the decision is
//! recorded once on the draft with an approval token signed by the only holder of the
//! Ed25519 key, (3) activation follows from the recorded event. A retried approve by the
//! same admin completes an interrupted one.
//!
//! Architecture Invariant: this service never creates a Box; it only signs and records.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::{Envelope, Named, Reply, envelope, payload, reply_ok, reply_written, subjects, v1};
use atasira_domain::aggregates::boxes::box_id_for;
use atasira_domain::aggregates::draft::{Draft, DraftCommand, DraftError, DraftStatus};
use atasira_domain::aggregates::security::{ApprovalSecurity, SecurityCommand};
use atasira_domain::token::{ACTIVATION_WINDOW, ApprovalSigner, PublicKeyEntry};
use atasira_domain::{ErrorCode, Principal};
use atasira_platform::Runtime;
use atasira_platform::db::Cqrs;
use atasira_platform::service::{self as platform_service, Refusal};
use prost::Message as _;
use serde_json::{Value, json};

pub const SERVICE: &str = subjects::APPROVAL;
/// Aggregate types this service appends on its own (its decisions go on the draft stream,
/// which the drafts relay publishes).
pub const AGGREGATE_TYPES: &[&str] = &["approval_security"];

/// Settings of the approval service.
pub struct ApprovalConfig {
    /// The signing key (from a key file or `ATASIRA_APPROVAL_KEY`).
    pub signer: ApprovalSigner,
    /// Public keys of retired signing keys, still published so old tokens verify.
    pub retired: Vec<PublicKeyEntry>,
    /// How long an approve waits for its Box to be active before answering.
    pub activation_wait: Duration,
}

impl std::fmt::Debug for ApprovalConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApprovalConfig").field("key_id", &self.signer.key_id()).finish_non_exhaustive()
    }
}

struct Service {
    rt: Runtime,
    config: ApprovalConfig,
    drafts: Cqrs<Draft>,
}

/// Runs the service until `shutdown` flips.
pub async fn run(rt: Runtime, config: ApprovalConfig, shutdown: tokio::sync::watch::Receiver<bool>) -> anyhow::Result<()> {
    let service = Arc::new(Service { drafts: rt.db.cqrs(), rt: rt.clone(), config });
    let endpoint = platform_service::serve(&rt, SERVICE, move |env| {
        let service = service.clone();
        async move { service.dispatch(&env).await }
    })
    .await?;
    platform_service::until_shutdown(shutdown).await;
    endpoint.stop();
    Ok(())
}

impl Service {
    fn principal(&self, env: &Envelope) -> Result<Principal, Refusal> {
        platform_service::verify_principal(&self.rt, env)
    }

    async fn dispatch(&self, env: &Envelope) -> Result<Reply, Refusal> {
        match env.message_type.as_str() {
            // No projections of its own: always caught up.
            v1::WaitForPosition::NAME => Ok(reply_ok(&v1::WaitForPositionReply { lagging: vec![] }, 0)),
            // Public keys are public (R-APPROVE-4: anyone may verify, nobody else may sign).
            v1::GetApprovalKeys::NAME => {
                let mut keys = vec![self.config.signer.public_key()];
                keys.extend(self.config.retired.iter().cloned());
                Ok(reply_ok(&v1::ApprovalKeysReply { keys_json: serde_json::to_vec(&keys).map_err(Refusal::internal)? }, 0))
            }
            v1::ApproveDraft::NAME => {
                let r: v1::ApproveDraft = payload(env)?;
                let principal = self.principal(env)?;
                self.approve(principal, &r.draft_id, r.confirm_over_limit).await
            }
            v1::RejectDraft::NAME => {
                let r: v1::RejectDraft = payload(env)?;
                let principal = self.principal(env)?;
                self.reject(principal, &r.draft_id, r.reason).await
            }
            other => Err(Refusal::new(ErrorCode::InvalidRequest, format!("unknown message type {other:?}"))),
        }
    }

    /// Loads the draft and applies the checks that precede any effect, in the spec's
    /// order: 403 (role), 404, 403 (self-approval, recorded as a security violation).
    async fn checked_draft(&self, principal: &Principal, draft_id: &str) -> Result<Draft, Refusal> {
        if !principal.is_human_admin() {
            return Err(DraftError::NotHumanAdmin.into());
        }
        let draft: Draft = self.rt.db.load(draft_id).await.map_err(Refusal::internal)?;
        let Some(data) = &draft.data else { return Err(DraftError::NotFound.into()) };
        if data.requested_by.user_id == principal.user_id {
            self.record_self_approval(principal, draft_id).await?;
            return Err(DraftError::SelfApproval.into());
        }
        Ok(draft)
    }

    async fn record_self_approval(&self, principal: &Principal, draft_id: &str) -> Result<(), Refusal> {
        let command = SecurityCommand::Record {
            service: SERVICE.into(),
            actor: principal.user_id.clone(),
            target: draft_id.to_owned(),
            kind: "self_approval".into(),
            reason: "a principal tried to decide on a draft they submitted (R-AUTH-3)".into(),
            at: chrono::Utc::now(),
        };
        self.rt.db.cqrs::<ApprovalSecurity>().execute(&uuid::Uuid::new_v4().to_string(), command, HashMap::new()).await.map_err(Refusal::internal)?;
        self.rt.notify_committed();
        Ok(())
    }

    /// A request to another service on behalf of `principal`.
    async fn call<Req: Named, Resp: prost::Message + Default>(
        &self,
        to: &str,
        principal: &Principal,
        request: &Req,
    ) -> Result<Result<(Resp, i64, Vec<String>), v1::ErrorReply>, Refusal> {
        let correlation = uuid::Uuid::new_v4().to_string();
        let assertion = self.rt.assertion_keys.sign(principal, &correlation, chrono::Utc::now());
        let env = envelope(request, &correlation, "", Some(&assertion));
        let bytes = self
            .rt
            .bus
            .request(&subjects::request(SERVICE, to), BTreeMap::new(), env.encode_to_vec().into(), Duration::from_secs(30))
            .await
            .map_err(|e| Refusal::new(ErrorCode::ServiceUnavailable, format!("the {to} service did not answer: {e}")))?;
        atasira_contracts::decode_written::<Resp>(&bytes).map_err(Refusal::internal)
    }

    async fn release(&self, principal: &Principal, box_type: &str, draft_id: &str, reason: &str) {
        let request = v1::ReleaseReservation { box_type: box_type.into(), draft_id: draft_id.into(), reason: reason.into() };
        if let Err(Refusal { message: m, .. }) | Ok(Err(v1::ErrorReply { message: m, .. })) =
            self.call::<_, v1::Ack>(subjects::RUNTIME_REGISTRY, principal, &request).await.map(|r| r.map(|_| ()))
        {
            tracing::warn!(draft_id, error = m, "could not release the reservation; it lapses at its deadline");
        }
    }

    /// R-APPROVE-2..4, R-APPROVE-6, R-APPROVE-7.
    async fn approve(&self, principal: Principal, draft_id: &str, confirm_over_limit: bool) -> Result<Reply, Refusal> {
        let draft = self.checked_draft(&principal, draft_id).await?;
        let Some(data) = draft.data else { return Err(DraftError::NotFound.into()) };
        let box_type = data.manifest.box_type.to_string();
        let repeat = matches!(&data.decision, Some(d) if d.approved && d.by == principal.user_id);
        let mut event_ids = Vec::new();
        let mut position = 0;
        if !repeat {
            if data.status != DraftStatus::PendingApproval {
                return Err(DraftError::NotPending(data.status).into());
            }
            if data.over_limit.over_limit && !confirm_over_limit {
                return Err(DraftError::OverLimitConfirmationRequired.into());
            }
            // (1) Reserve: limit, uniqueness and foreign manifest files are checked here.
            let now = chrono::Utc::now();
            let reserve =
                v1::ReserveBoxType { box_type: box_type.clone(), draft_id: draft_id.to_owned(), deadline_unix: (now + ACTIVATION_WINDOW).timestamp() };
            if let Err(e) = self.call::<_, v1::Ack>(subjects::RUNTIME_REGISTRY, &principal, &reserve).await? {
                return Err(Refusal::new(ErrorCode::parse(&e.code).unwrap_or(ErrorCode::Internal), e.message));
            }
            atasira_platform::failpoint("approval-after-reservation");
            // (2) Record the decision once, with the token.
            let token = self.config.signer.issue(draft_id, &box_type, &data.manifest.digest(), &principal.user_id, now);
            let command = DraftCommand::Approve { by: principal.clone(), confirm_over_limit, token, at: now };
            let metadata = HashMap::from([("principal".to_owned(), principal.user_id.clone())]);
            match self.drafts.execute(draft_id, command, metadata).await {
                Ok(()) => {}
                Err(e) => {
                    // A losing decision gives its reservation back, unless the winner was an
                    // approval: the reservation (same draft) is then the winner's.
                    let now_decided: Draft = self.rt.db.load(draft_id).await.map_err(Refusal::internal)?;
                    if now_decided.data.as_ref().is_none_or(|d| d.status != DraftStatus::Approved) {
                        self.release(&principal, &box_type, draft_id, "decision lost").await;
                    }
                    return Err(match e {
                        cqrs_es::AggregateError::UserError(e) => e.into(),
                        cqrs_es::AggregateError::AggregateConflict => {
                            Refusal::new(ErrorCode::DraftNotPending, "another decision on this draft was recorded first")
                        }
                        other => Refusal::internal(other),
                    });
                }
            }
            self.rt.notify_committed();
            atasira_platform::failpoint("approval-after-decision");
        }
        if let Some((id, p)) = self.rt.db.last_event("draft", draft_id).await.map_err(Refusal::internal)? {
            event_ids.push(id);
            position = p;
        }
        // (3) Activation is the registry's, driven by the recorded event; wait for it.
        let wait =
            v1::AwaitActivation { draft_id: draft_id.to_owned(), timeout_ms: u32::try_from(self.config.activation_wait.as_millis()).unwrap_or(u32::MAX) };
        let reloaded: Draft = self.rt.db.load(draft_id).await.map_err(Refusal::internal)?;
        let decided = reloaded.data.and_then(|d| d.decision).ok_or_else(|| Refusal::internal("decision not readable"))?;
        let mut body = json!({
            "draft_id": draft_id,
            "status": "approved",
            "box_id": box_id_for(draft_id),
            "box_type": box_type,
            "approved_by": decided.by,
            "approved_at": decided.at,
        });
        match self.call::<_, v1::BoxReply>(subjects::RUNTIME_REGISTRY, &principal, &wait).await? {
            Ok((b, p, ids)) => {
                let view: Value = serde_json::from_slice(&b.box_json).map_err(Refusal::internal)?;
                body["status"] = Value::from("active");
                body["box_id"] = view["box_id"].clone();
                event_ids.extend(ids);
                position = position.max(p);
            }
            Err(e) => tracing::warn!(draft_id, error = e.message, "the Box is not active yet"),
        }
        Ok(reply_written(&v1::DecisionReply { body_json: body.to_string().into_bytes() }, position, event_ids))
    }

    /// R-APPROVE-5.
    async fn reject(&self, principal: Principal, draft_id: &str, reason: String) -> Result<Reply, Refusal> {
        self.checked_draft(&principal, draft_id).await?;
        let command = DraftCommand::Reject { by: principal.clone(), reason, at: chrono::Utc::now() };
        self.drafts.execute(draft_id, command, HashMap::new()).await.map_err(|e| match e {
            cqrs_es::AggregateError::UserError(e) => e.into(),
            cqrs_es::AggregateError::AggregateConflict => Refusal::new(ErrorCode::DraftNotPending, "another decision on this draft was recorded first"),
            other => Refusal::internal(other),
        })?;
        self.rt.notify_committed();
        let (event_id, position) = self.rt.db.last_event("draft", draft_id).await.map_err(Refusal::internal)?.ok_or_else(|| Refusal::internal("no event"))?;
        let body = json!({"draft_id": draft_id, "status": "rejected"});
        Ok(reply_written(&v1::DecisionReply { body_json: body.to_string().into_bytes() }, position, vec![event_id]))
    }
}
