//! The approval service (SPEC §4): records a human admin's decision on a draft, in the
//! order of R-APPROVE-7: (1) the registry reserves the box_type, (2) the decision is
//! recorded once on the draft with an approval token signed by the only holder of the
//! Ed25519 key, (3) activation follows from the recorded event. A retried approve by the
//! same admin completes an interrupted one.
//!
//! At start it publishes the public keys of its current and retired signing keys as
//! `ApprovalKeyPublished` events (once each), so verifiers read them from the store.
//!
//! Architecture Invariant: this service never creates a Box; it only signs and records.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::requests::{ApprovalRequest, Incoming};
use atasira_contracts::{Named, Refused, Reply, Written, convert, reply_ok, reply_written, signed_envelope, subjects, v1};
use atasira_domain::aggregates::approval_keys::{ApprovalKeys, ApprovalKeysCommand, KEYS_ID};
use atasira_domain::aggregates::boxes::box_id_for;
use atasira_domain::aggregates::draft::{Draft, DraftCommand, DraftError, DraftStatus};
use atasira_domain::aggregates::security::{ApprovalSecurity, SecurityCommand};
use atasira_domain::aggregates::types;
use atasira_domain::token::{ACTIVATION_WINDOW, ApprovalSigner, PublicKeyEntry};
use atasira_domain::{ErrorCode, Principal};
use atasira_platform::Runtime;
use atasira_platform::command::{self, Retry};
use atasira_platform::db::Cqrs;
use atasira_platform::service::{self as platform_service, Call, Refusal};
use prost::Message as _;

pub const SERVICE: &str = subjects::APPROVAL;
/// Aggregate types this service appends on its own (its decisions go on the draft stream,
/// which the drafts relay publishes).
pub const AGGREGATE_TYPES: &[&str] = &[types::APPROVAL_KEYS, types::APPROVAL_SECURITY, types::APPROVAL_ASSERTION_KEYS];

/// Settings of the approval service.
pub struct ApprovalConfig {
    /// The signing key (from a key file or `ATASIRA_APPROVAL_KEY`).
    pub signer: ApprovalSigner,
    /// Public keys of retired signing keys, published too so old tokens verify. (A key
    /// once published stays published, listed here or not.)
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
    publish_keys(&rt, &config).await?;
    let service = Arc::new(Service { drafts: rt.db.cqrs(), rt: rt.clone(), config });
    let endpoint = platform_service::serve(&rt, SERVICE, move |call| {
        let service = service.clone();
        async move { service.dispatch(&call).await }
    })
    .await?;
    platform_service::until_shutdown(shutdown).await;
    endpoint.stop();
    Ok(())
}

/// R-APPROVE-4: publishes the public keys of the current and retired signing keys before
/// the first token is signed, so every recorded approval's key is in the store before the
/// approval is. Idempotent: a restart with the same keys appends nothing.
async fn publish_keys(rt: &Runtime, config: &ApprovalConfig) -> anyhow::Result<()> {
    let keys: Vec<PublicKeyEntry> = std::iter::once(config.signer.public_key()).chain(config.retired.iter().cloned()).collect();
    let command = ApprovalKeysCommand::Publish { keys, at: chrono::Utc::now() };
    let cqrs = rt.db.cqrs::<ApprovalKeys>();
    // Two approval services starting at once: the loser decides again on fresh state and
    // finds its keys published.
    for attempt in 1.. {
        match cqrs.execute(KEYS_ID, command.clone(), HashMap::new()).await {
            Ok(_) => break,
            Err(cqrs_es::AggregateError::AggregateConflict) if attempt < 3 => continue,
            Err(e) => anyhow::bail!("cannot publish the approval public keys: {e}"),
        }
    }
    rt.notify_committed();
    Ok(())
}

impl Service {
    async fn dispatch(&self, call: &Call) -> Result<Reply, Refusal> {
        // Decisions are made through the API only (a human admin, R-AUTH-2).
        call.only_services("the approval service")?;
        let request = match ApprovalRequest::decode(&call.env)? {
            // No projections of its own: always caught up.
            Incoming::Wait(_) => return Ok(reply_ok(&v1::WaitForPositionReply::default())),
            Incoming::Request(request) => request,
        };
        match request {
            ApprovalRequest::Approve(r) => {
                call.only_from(&[subjects::GATEWAY], "deciding on a draft")?;
                let principal = call.principal(&self.rt).await?;
                self.approve(principal, &r.draft_id, r.confirm_over_limit).await
            }
            ApprovalRequest::Reject(r) => {
                call.only_from(&[subjects::GATEWAY], "deciding on a draft")?;
                let principal = call.principal(&self.rt).await?;
                self.reject(principal, &r.draft_id, r.reason).await
            }
        }
    }

    /// Records the attempt; the id and position of the `SecurityViolation`, which the
    /// refusal carries so that the caller's next audit read sees it.
    async fn record_self_approval(&self, principal: &Principal, draft_id: &str) -> Result<(String, i64), Refusal> {
        let command = SecurityCommand::Record {
            service: SERVICE.into(),
            actor: principal.user_id.clone(),
            target: draft_id.to_owned(),
            kind: "self_approval".into(),
            reason: "a principal tried to decide on a draft they submitted".into(),
            at: chrono::Utc::now(),
        };
        let id = uuid::Uuid::new_v4().to_string();
        command::execute(&self.rt.db.cqrs::<ApprovalSecurity>(), &id, command, HashMap::new(), Retry::ONCE).await?;
        self.rt.notify_committed();
        self.rt.db.last_event(types::APPROVAL_SECURITY, &id).await.map_err(Refusal::internal)?.ok_or_else(|| Refusal::internal("the violation is not readable"))
    }

    /// Runs a decision on the draft; a self-approval attempt is recorded as a security
    /// violation before it is refused (R-AUTH-3).
    async fn decide(&self, principal: &Principal, draft_id: &str, command: DraftCommand) -> Result<(), Refusal> {
        let metadata = HashMap::from([("principal".to_owned(), principal.user_id.clone())]);
        let outcome = command::execute(&self.drafts, draft_id, command, metadata, Retry::ONCE).await;
        match outcome {
            Err(refusal) if refusal.code == ErrorCode::SelfApprovalForbidden => {
                let recorded = self.record_self_approval(principal, draft_id).await?;
                Err(refusal.recorded(recorded))
            }
            other => other.map(|_| ()),
        }
    }

    /// A request to another service on behalf of `principal`.
    async fn call<Req: Named, Resp: prost::Message + Default>(
        &self,
        to: &str,
        principal: &Principal,
        request: &Req,
    ) -> Result<Result<Written<Resp>, Refused>, Refusal> {
        let correlation = uuid::Uuid::new_v4().to_string();
        let subject = subjects::request(SERVICE, to);
        let signer = self.rt.assertion_keys.signer().map_err(Refusal::internal)?;
        let env = signed_envelope(&signer, principal, &subject, request, &correlation, "", chrono::Utc::now());
        let bytes = self
            .rt
            .bus
            .request(&subject, BTreeMap::new(), env.encode_to_vec().into(), Duration::from_secs(30))
            .await
            .map_err(|e| Refusal::new(ErrorCode::ServiceUnavailable, format!("the {to} service did not answer: {e}")))?;
        atasira_contracts::decode_written::<Resp>(&bytes).map_err(Refusal::internal)
    }

    async fn release(&self, principal: &Principal, box_type: &str, draft_id: &str, reason: &str) {
        let request = v1::ReleaseReservation { box_type: box_type.into(), draft_id: draft_id.into(), reason: reason.into() };
        match self.call::<_, v1::Ack>(subjects::RUNTIME_REGISTRY, principal, &request).await {
            Ok(Ok(_)) => {}
            Ok(Err(Refused { message, .. })) | Err(Refusal { message, .. }) => {
                tracing::warn!(draft_id, error = message, "could not release the reservation; it lapses at its deadline")
            }
        }
    }

    /// R-APPROVE-2..4, R-APPROVE-6, R-APPROVE-7.
    async fn approve(&self, principal: Principal, draft_id: &str, confirm_over_limit: bool) -> Result<Reply, Refusal> {
        let draft: Draft = self.rt.db.load(draft_id).await.map_err(Refusal::internal)?;
        let now = chrono::Utc::now();
        let (box_type, digest) = draft.data.as_ref().map(|d| (d.manifest.box_type.to_string(), d.manifest.digest())).unwrap_or_default();
        let token = self.config.signer.issue(draft_id, &box_type, &digest, &principal.user_id, now);
        let command = DraftCommand::Approve { by: principal.clone(), confirm_over_limit, token, at: now };
        // The aggregate's own rules decide, before any effect, whether this approval is new
        // (who may decide, pending, over_limit confirmation); a repeat by the same admin
        // decides nothing and goes on to wait for the Box.
        let first = match draft.decide(command.clone()) {
            Ok(events) => !events.is_empty(),
            Err(DraftError::SelfApproval) => {
                let recorded = self.record_self_approval(&principal, draft_id).await?;
                return Err(Refusal::from(DraftError::SelfApproval).recorded(recorded));
            }
            Err(e) => return Err(e.into()),
        };
        if first {
            // (1) Reserve: limit, uniqueness and foreign manifest files are checked here.
            let reserve =
                v1::ReserveBoxType { box_type: box_type.clone(), draft_id: draft_id.to_owned(), deadline_unix: (now + ACTIVATION_WINDOW).timestamp() };
            if let Err(refused) = self.call::<_, v1::Ack>(subjects::RUNTIME_REGISTRY, &principal, &reserve).await? {
                return Err(refused.into());
            }
            atasira_platform::failpoint("approval-after-reservation");
            // (2) Record the decision once, with the token.
            if let Err(refusal) = self.decide(&principal, draft_id, command).await {
                // A losing decision gives its reservation back, unless the winner was an
                // approval: the reservation (same draft) is then the winner's.
                let now_decided: Draft = self.rt.db.load(draft_id).await.map_err(Refusal::internal)?;
                if now_decided.data.as_ref().is_none_or(|d| d.status != DraftStatus::Approved) {
                    self.release(&principal, &box_type, draft_id, "decision lost").await;
                }
                return Err(refusal);
            }
            self.rt.notify_committed();
            atasira_platform::failpoint("approval-after-decision");
        }
        let (mut event_ids, mut position) = match self.rt.db.last_event(types::DRAFT, draft_id).await.map_err(Refusal::internal)? {
            Some((id, p)) => (vec![id], p),
            None => (vec![], 0),
        };
        let reloaded: Draft = self.rt.db.load(draft_id).await.map_err(Refusal::internal)?;
        let decided = reloaded.data.and_then(|d| d.decision).ok_or_else(|| Refusal::internal("decision not readable"))?;
        let mut reply = v1::DecisionReply {
            draft_id: draft_id.to_owned(),
            status: v1::DraftStatus::Approved as i32,
            box_id: box_id_for(draft_id),
            box_type,
            approved_by: decided.by,
            approved_at: Some(convert::timestamp(decided.at)),
        };
        // (3) Activation is the registry's, driven by the recorded event; wait for it.
        let wait =
            v1::AwaitActivation { draft_id: draft_id.to_owned(), timeout_ms: u32::try_from(self.config.activation_wait.as_millis()).unwrap_or(u32::MAX) };
        match self.call::<_, v1::BoxReply>(subjects::RUNTIME_REGISTRY, &principal, &wait).await? {
            Ok((b, p, ids)) => {
                reply.status = v1::DraftStatus::Active as i32;
                if let Some(summary) = b.r#box.and_then(|b| b.summary) {
                    reply.box_id = summary.box_id;
                }
                event_ids.extend(ids);
                position = position.max(p);
            }
            Err(e) => tracing::warn!(draft_id, error = e.message, "the Box is not active yet"),
        }
        Ok(reply_written(&reply, position, event_ids))
    }

    /// R-APPROVE-5.
    async fn reject(&self, principal: Principal, draft_id: &str, reason: String) -> Result<Reply, Refusal> {
        let command = DraftCommand::Reject { by: principal.clone(), reason, at: chrono::Utc::now() };
        self.decide(&principal, draft_id, command).await?;
        self.rt.notify_committed();
        let (event_id, position) =
            self.rt.db.last_event(types::DRAFT, draft_id).await.map_err(Refusal::internal)?.ok_or_else(|| Refusal::internal("no event"))?;
        let reply = v1::DecisionReply { draft_id: draft_id.to_owned(), status: v1::DraftStatus::Rejected as i32, ..Default::default() };
        Ok(reply_written(&reply, position, vec![event_id]))
    }
}
