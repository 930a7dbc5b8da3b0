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

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::requests::{ApprovalRequest, Incoming};
use atasira_contracts::{Refused, Reply, convert, reply_ok, reply_written, subjects, v1};
use atasira_domain::aggregates::approval_keys::{ApprovalKeys, ApprovalKeysCommand, KEYS_ID};
use atasira_domain::aggregates::boxes::{BoxAggregate, BoxError, BoxEvent, BoxState, box_id_for};
use atasira_domain::aggregates::draft::{Draft, DraftCommand, DraftError, DraftEvent, DraftStatus};
use atasira_domain::aggregates::org_policy::{OrgPolicy, OrgPolicyCommand, STREAM_ID as ORG_POLICY_STREAM};
use atasira_domain::aggregates::security::{ApprovalSecurity, SecurityCommand};
use atasira_domain::aggregates::types;
use atasira_domain::token::{ACTIVATION_WINDOW, ApprovalSigner, PublicKeyEntry};
use atasira_domain::worker::bundle_digest;
use atasira_domain::{ErrorCode, Principal};
use atasira_platform::Runtime;
use atasira_platform::client::Client;
use atasira_platform::refusal::Refusal;
use atasira_platform::service::{self as platform_service, Call};
use atasira_platform::store::{Cqrs, EventAt, Receipt, Retry, StoredEvent};

pub const SERVICE: &str = subjects::APPROVAL;
/// Aggregate types this service appends on its own (its decisions go on the draft stream,
/// which the drafts relay publishes).
pub const AGGREGATE_TYPES: &[&str] = &[types::APPROVAL_KEYS, types::APPROVAL_SECURITY, types::APPROVAL_ASSERTION_KEYS, types::ORG_POLICY];

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
    policies: Cqrs<OrgPolicy>,
    client: Client,
}

/// The policy in force on the wire (version 0: none).
fn policy_reply(policy: OrgPolicy) -> v1::PolicyReply {
    let Some(p) = policy.current else { return v1::PolicyReply::default() };
    v1::PolicyReply {
        version: p.version,
        digest: p.digest,
        text: p.text,
        rules: p
            .rules
            .into_iter()
            .map(|r| v1::PolicyRule {
                id: r.id,
                effect: r.effect,
                reason: r.reason.unwrap_or_default(),
                approvals: r.approvals.unwrap_or(0),
                confirm: r.confirm,
            })
            .collect(),
        published_by: p.published_by,
        published_at: Some(convert::timestamp(p.published_at)),
    }
}

/// Runs the service until `shutdown` flips.
pub async fn run(rt: Runtime, config: ApprovalConfig, shutdown: tokio::sync::watch::Receiver<bool>) -> anyhow::Result<()> {
    publish_keys(&rt, &config).await?;
    let client = Client::new(SERVICE, rt.bus.clone(), rt.assertion_keys.clone(), Duration::from_secs(30));
    let service = Arc::new(Service { drafts: rt.db.cqrs(), policies: rt.db.cqrs(), rt: rt.clone(), config, client });
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
    // Two approval services starting at once: the loser decides again on fresh state and
    // finds its keys published.
    rt.db
        .cqrs::<ApprovalKeys>()
        .execute(KEYS_ID, command, HashMap::new(), Retry::FEW)
        .await
        .map_err(|e| anyhow::anyhow!("cannot publish the approval public keys: {e}"))?;
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
            ApprovalRequest::GetPolicy(_) => {
                call.only_from(&[subjects::GATEWAY], "reading the organisation's policy")?;
                let principal = call.principal(&self.rt).await?;
                if !principal.is_admin() {
                    return Err(Refusal::new(ErrorCode::Forbidden, "reading the organisation's policy needs role admin"));
                }
                let policy: OrgPolicy = self.rt.db.load(ORG_POLICY_STREAM).await.map_err(Refusal::internal)?;
                Ok(reply_ok(&policy_reply(policy)))
            }
            ApprovalRequest::PublishPolicy(r) => {
                call.only_from(&[subjects::GATEWAY], "publishing the organisation's policy")?;
                let principal = call.principal(&self.rt).await?;
                self.publish_policy(principal, r.text).await
            }
        }
    }

    /// R-POLICY-1: a new version of the organisation's policy, in force from its event on
    /// (the same text again: the version in force, nothing appended).
    async fn publish_policy(&self, principal: Principal, text: String) -> Result<Reply, Refusal> {
        let metadata = HashMap::from([("principal".to_owned(), principal.user_id.clone())]);
        let command = OrgPolicyCommand::Publish { text, by: principal, at: chrono::Utc::now() };
        let receipt = self.policies.execute(ORG_POLICY_STREAM, command, metadata, Retry::FEW).await?;
        let head = receipt.head()?;
        let policy: OrgPolicy = self.rt.db.load(ORG_POLICY_STREAM).await.map_err(Refusal::internal)?;
        Ok(reply_written(&policy_reply(policy), head.position, vec![head.id]))
    }

    /// Records the attempt; the id and position of the `SecurityViolation`, which the
    /// refusal carries so that the caller's next audit read sees it.
    async fn record_self_approval(&self, principal: &Principal, draft_id: &str) -> Result<EventAt, Refusal> {
        let command = SecurityCommand::Record {
            service: SERVICE.into(),
            actor: principal.user_id.clone(),
            target: draft_id.to_owned(),
            kind: "self_approval".into(),
            reason: "a principal tried to decide on a draft they submitted".into(),
            at: chrono::Utc::now(),
        };
        let id = uuid::Uuid::new_v4().to_string();
        self.rt.db.cqrs::<ApprovalSecurity>().execute_new(&id, command, HashMap::new()).await?.head()
    }

    /// Runs a decision on the draft; a self-approval attempt is recorded as a security
    /// violation before it is refused (R-AUTH-3).
    async fn decide(&self, principal: &Principal, draft_id: &str, command: DraftCommand) -> Result<Receipt, Refusal> {
        let metadata = HashMap::from([("principal".to_owned(), principal.user_id.clone())]);
        let outcome = self.drafts.execute(draft_id, command, metadata, Retry::ONCE).await;
        match outcome {
            Err(refusal) if refusal.code == ErrorCode::SelfApprovalForbidden => {
                let recorded = self.record_self_approval(principal, draft_id).await?;
                Err(refusal.recorded(recorded.into()))
            }
            other => other,
        }
    }

    /// Waits (at most the activation wait) until the registry's read models hold the
    /// events `event_ids` after `position`: the generic read-your-writes wait, rung by the
    /// registry's consumers, not polled.
    async fn wait_for_registry(&self, position: i64, event_ids: &[String]) -> Result<(), String> {
        match self.client.wait(subjects::RUNTIME_REGISTRY, position, event_ids, self.config.activation_wait).await {
            Ok(lagging) if lagging.is_empty() => Ok(()),
            Ok(lagging) => Err(format!("still behind: {}", lagging.join(", "))),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn release(&self, principal: &Principal, box_type: &str, draft_id: &str, reason: &str) {
        let request = v1::ReleaseReservation { box_type: box_type.into(), draft_id: draft_id.into(), reason: reason.into() };
        match self.client.call(subjects::RUNTIME_REGISTRY, principal, &request, "").await {
            Ok(Ok(_)) => {}
            Ok(Err(Refused { message, .. })) => tracing::warn!(draft_id, error = message, "could not release the reservation; it lapses at its deadline"),
            Err(e) => tracing::warn!(draft_id, error = %e, "could not release the reservation; it lapses at its deadline"),
        }
    }

    /// R-APPROVE-2..4, R-APPROVE-6, R-APPROVE-7.
    async fn approve(&self, principal: Principal, draft_id: &str, confirm_over_limit: bool) -> Result<Reply, Refusal> {
        let (draft, head) = self.rt.db.load_with_head::<Draft>(draft_id).await.map_err(Refusal::internal)?;
        let now = chrono::Utc::now();
        let (box_type, digest) = draft.data.as_ref().map(|d| (d.manifest.box_type.to_string(), d.manifest.digest())).unwrap_or_default();
        // R-CHANGE-1: a change request's Box exists; a new draft's Box id is derived.
        let change = draft.data.as_ref().and_then(|d| d.change.clone());
        let box_id = change.as_ref().map_or_else(|| box_id_for(draft_id), |c| c.box_id.clone());
        let bundle = draft.data.as_ref().map(|d| bundle_digest(&box_id, &d.manifest)).unwrap_or_default();
        let token = self.config.signer.issue(draft_id, &box_type, &digest, &principal.user_id, now);
        let command = DraftCommand::Approve { by: principal.clone(), confirm_over_limit, token, at: now, reserved: true };
        // The aggregate's own rules decide, before any effect, whether this approval is new
        // (who may decide, pending, over_limit confirmation); a repeat by the same admin
        // decides nothing and goes on to wait for the Box.
        let events = match draft.decide(command.clone()) {
            Ok(events) => events,
            Err(DraftError::SelfApproval) => {
                let recorded = self.record_self_approval(&principal, draft_id).await?;
                return Err(Refusal::from(DraftError::SelfApproval).recorded(recorded.into()));
            }
            Err(e) => return Err(e.into()),
        };
        // R-CHANGE-3: an approval while more are required is recorded alone: no token, no
        // reservation; the one that completes them goes on below.
        let given_before = draft.data.as_ref().is_some_and(|d| d.status == DraftStatus::PendingApproval && d.approvals.contains(&principal.user_id));
        if matches!(events.first(), Some(DraftEvent::DraftApprovalGiven { .. })) || (events.is_empty() && given_before) {
            let head = if events.is_empty() {
                head.ok_or_else(|| Refusal::internal("the draft holds no event"))?
            } else {
                let mut partial = command.clone();
                if let DraftCommand::Approve { reserved, .. } = &mut partial {
                    *reserved = false;
                }
                self.decide(&principal, draft_id, partial).await?.head()?
            };
            let now_draft: Draft = self.rt.db.load(draft_id).await.map_err(Refusal::internal)?;
            let (approvals, required) = now_draft.data.map(|d| (d.approvals, d.approvals_required)).unwrap_or_default();
            let reply = v1::DecisionReply {
                draft_id: draft_id.to_owned(),
                status: v1::DraftStatus::PendingApproval as i32,
                box_id,
                box_type,
                approved_by: principal.user_id.clone(),
                approved_at: Some(convert::timestamp(now)),
                approvals,
                approvals_required: required,
            };
            return Ok(reply_written(&reply, head.position, vec![head.id]));
        }
        let first = !events.is_empty();
        let (decided, head) = if first {
            // (1) Reserve: limit, uniqueness and foreign manifest files are checked here. A
            // change keeps its Box's box_type and slot, and applies only to the manifest it
            // was made on.
            if let Some(change) = &change {
                let boxed: BoxAggregate = self.rt.db.load(&change.box_id).await.map_err(Refusal::internal)?;
                match boxed.data {
                    Some(d) if d.state == BoxState::Archived => {
                        return Err(Refusal::new(ErrorCode::BoxNotActive, "the Box of this change request is archived"));
                    }
                    Some(d) if d.manifest.digest() == change.base_digest => {}
                    _ => return Err(BoxError::ChangeOutdated.into()),
                }
            } else {
                let reserve =
                    v1::ReserveBoxType { box_type: box_type.clone(), draft_id: draft_id.to_owned(), deadline_unix: (now + ACTIVATION_WINDOW).timestamp() };
                if let Err(refused) = self.client.call(subjects::RUNTIME_REGISTRY, &principal, &reserve, "").await? {
                    return Err(refused.into());
                }
            }
            atasira_platform::failpoint("approval-after-reservation");
            // (2) Record the decision once, with the token.
            let receipt = match self.decide(&principal, draft_id, command).await {
                Ok(receipt) => receipt,
                Err(refusal) => {
                    // A losing decision gives its reservation back, unless the winner was an
                    // approval: the reservation (same draft) is then the winner's.
                    let now_decided: Draft = self.rt.db.load(draft_id).await.map_err(Refusal::internal)?;
                    if change.is_none() && now_decided.data.as_ref().is_none_or(|d| d.status != DraftStatus::Approved) {
                        self.release(&principal, &box_type, draft_id, "decision lost").await;
                    }
                    return Err(refusal);
                }
            };
            atasira_platform::failpoint("approval-after-decision");
            let decided = match receipt.appended() {
                true => (principal.user_id.clone(), now),
                // The same admin's approval, recorded a moment before (a retry on fresh state).
                false => decision_of(&self.rt.db.load::<Draft>(draft_id).await.map_err(Refusal::internal)?)?,
            };
            (decided, receipt.head()?)
        } else {
            (decision_of(&draft)?, head.ok_or_else(|| Refusal::internal("the decided draft holds no event"))?)
        };
        let (mut event_ids, position) = (vec![head.id.clone()], head.position);
        let mut reply = v1::DecisionReply {
            draft_id: draft_id.to_owned(),
            status: v1::DraftStatus::Approved as i32,
            box_id: box_id.clone(),
            box_type,
            approved_by: decided.0,
            approved_at: Some(convert::timestamp(decided.1)),
            approvals: draft.data.as_ref().map(|d| d.approvals.clone()).unwrap_or_default(),
            approvals_required: draft.data.as_ref().map_or(1, |d| d.approvals_required.max(1)),
        };
        // (3) Activation is the registry's, driven by the recorded event (its consumer has
        // processed the decision once the Box is active and its bundle synced). The Box's
        // id is derived and `BoxActivated` is the first event of its stream, the bundle's
        // sync the first of the bundle's: the answer names them, and the registry's
        // read-your-writes wait says when its read models hold them.
        // A change's event on the Box stream has no known sequence: the registry has
        // applied it once it processed the decision; then the stream names it.
        let bundle_event = StoredEvent::event_id_of(types::CONFIG_BUNDLE, &bundle, 1);
        let activated = match &change {
            None => vec![head.id.clone(), StoredEvent::event_id_of(types::BOX, &reply.box_id, 1), bundle_event],
            Some(_) => vec![head.id.clone(), bundle_event],
        };
        match self.wait_for_applied(position, activated, change.is_some().then_some((box_id.as_str(), draft_id))).await {
            Ok(ids) => {
                reply.status = v1::DraftStatus::Active as i32;
                event_ids = ids;
            }
            Err(why) => tracing::warn!(draft_id, why, "the Box is not active yet"),
        }
        Ok(reply_written(&reply, position, event_ids))
    }

    /// Waits for the registry to hold `activated`, and, for change request `(box_id,
    /// draft_id)`, the change it then applied; every event id waited for.
    async fn wait_for_applied(&self, position: i64, mut activated: Vec<String>, change: Option<(&str, &str)>) -> Result<Vec<String>, String> {
        self.wait_for_registry(position, &activated).await?;
        let Some((box_id, draft_id)) = change else { return Ok(activated) };
        activated.push(self.change_event(box_id, draft_id).await?);
        self.wait_for_registry(position, &activated).await?;
        Ok(activated)
    }

    /// The id of the event that applied change request `draft_id` to Box `box_id`.
    async fn change_event(&self, box_id: &str, draft_id: &str) -> Result<String, String> {
        let stream = self.rt.db.stream(types::BOX, box_id).await.map_err(|e| e.to_string())?;
        for link in stream.iter().rev() {
            if let Ok(BoxEvent::BoxManifestChanged { draft_id: applied, .. }) = link.decode::<BoxEvent>()
                && applied == draft_id
            {
                return Ok(link.event_id.clone());
            }
        }
        Err("the Box holds no change of this request (its manifest changed since it was made?)".to_owned())
    }

    /// R-APPROVE-5.
    async fn reject(&self, principal: Principal, draft_id: &str, reason: String) -> Result<Reply, Refusal> {
        let command = DraftCommand::Reject { by: principal.clone(), reason, at: chrono::Utc::now() };
        let head = self.decide(&principal, draft_id, command).await?.head()?;
        let reply = v1::DecisionReply { draft_id: draft_id.to_owned(), status: v1::DraftStatus::Rejected as i32, ..Default::default() };
        Ok(reply_written(&reply, head.position, vec![head.id]))
    }
}

/// Who decided on a decided draft, and when.
fn decision_of(draft: &Draft) -> Result<(String, chrono::DateTime<chrono::Utc>), Refusal> {
    let decided = draft.data.as_ref().and_then(|d| d.decision.as_ref()).ok_or_else(|| Refusal::internal("decision not readable"))?;
    Ok((decided.by.clone(), decided.at))
}
