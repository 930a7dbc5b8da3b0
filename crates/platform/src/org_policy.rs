//! The organisation's policy as a service reads it (R-POLICY-1): the version in force,
//! loaded from its stream and parsed once per version (the stream's head says whether a
//! new one was published), and a policy refusal: 403 `policy_denied` naming the version
//! and the rule, recorded as a security violation of the refusing service.

use std::sync::{Arc, Mutex, PoisonError};

use atasira_domain::aggregates::org_policy::{OrgPolicy, STREAM_ID};
use atasira_domain::aggregates::security::SecurityCommand;
use atasira_domain::aggregates::types;
use atasira_domain::org_policy::{Input, PolicyDocument, Verdict};
use atasira_domain::{ErrorCode, Principal};

use crate::Runtime;
use crate::guard::Verdict as Record;
use crate::refusal::Refusal;
use crate::store::Db;

/// The version in force, parsed.
#[derive(Debug, Clone)]
pub struct Active {
    pub version: u64,
    pub document: Arc<PolicyDocument>,
}

impl Active {
    pub fn evaluate(&self, input: &Input) -> Verdict {
        self.document.evaluate(self.version, input)
    }

    /// The verdict on `input`, or the refusal (recorded) when it is a denial.
    pub async fn admit(&self, rt: &Runtime, service: &str, target: &str, input: &Input<'_>) -> Result<Verdict, Refusal> {
        let verdict = self.evaluate(input);
        if verdict.denied() {
            return Err(refuse(rt, service, input.principal, target, &verdict).await);
        }
        Ok(verdict)
    }
}

/// A service's view of the policy: the last version it loaded, keyed by the stream's head.
#[derive(Debug, Default)]
pub struct Policies {
    cached: Mutex<Option<(String, Active)>>,
}

impl Policies {
    /// The version in force (`None`: no policy was ever published).
    pub async fn active(&self, db: &Db) -> Result<Option<Active>, Refusal> {
        let head = db.last_event(types::ORG_POLICY, STREAM_ID).await.map_err(Refusal::internal)?;
        self.active_at(db, head.map(|h| h.id)).await
    }

    /// The version in force when the policy stream's last event is `head` (its id, as
    /// [`head_of`] makes it; `None`: no policy was ever published), read by the caller
    /// together with what else it reads.
    pub async fn active_at(&self, db: &Db, head: Option<String>) -> Result<Option<Active>, Refusal> {
        let Some(head) = head else { return Ok(None) };
        if let Some((id, active)) = self.cached.lock().unwrap_or_else(PoisonError::into_inner).as_ref()
            && *id == head
        {
            return Ok(Some(active.clone()));
        }
        let policy: OrgPolicy = db.load(STREAM_ID).await.map_err(Refusal::internal)?;
        let Some(current) = policy.current else { return Ok(None) };
        // It loaded when published; if it no longer does, nothing is decided without it.
        let document = PolicyDocument::parse(&current.text)
            .map_err(|e| Refusal::new(ErrorCode::ServiceUnavailable, format!("the organisation's policy version {} no longer loads: {e}", current.version)))?;
        let active = Active { version: current.version, document: Arc::new(document) };
        *self.cached.lock().unwrap_or_else(PoisonError::into_inner) = Some((head, active.clone()));
        Ok(Some(active))
    }

    /// The verdict of the version in force on `input` (`None`: no policy).
    pub async fn verdict(&self, db: &Db, input: &Input<'_>) -> Result<Option<Verdict>, Refusal> {
        Ok(self.active(db).await?.map(|active| active.evaluate(input)))
    }

    /// The verdict on `input`, or the refusal (recorded) when it is a denial (`None`: no
    /// policy).
    pub async fn admit(&self, rt: &Runtime, service: &str, target: &str, input: &Input<'_>) -> Result<Option<Verdict>, Refusal> {
        let head = rt.db.last_event(types::ORG_POLICY, STREAM_ID).await.map_err(Refusal::internal)?;
        match self.active_at(&rt.db, head.map(|h| h.id)).await? {
            Some(active) => active.admit(rt, service, target, input).await.map(Some),
            None => Ok(None),
        }
    }
}

/// The id of the policy stream's event at `sequence` (its head, for [`Policies::active_at`]).
pub fn head_of(sequence: i64) -> String {
    crate::store::StoredEvent::event_id_of(types::ORG_POLICY, STREAM_ID, sequence)
}

/// A statement's scalar subquery that gives the policy stream's last sequence (NULL when it
/// holds nothing), for [`head_of`]. The stream's type and id are our own constants.
pub fn head_subquery() -> String {
    format!("(SELECT MAX(sequence) FROM events WHERE aggregate_type = '{}' AND aggregate_id = '{STREAM_ID}')", types::ORG_POLICY)
}

/// The refusal of a denial, recorded as a `policy_denied` security violation of `service`
/// naming the version and the rule (at most a few a minute per caller, like every
/// violation record; the refusal itself is always answered).
pub async fn refuse(rt: &Runtime, service: &str, principal: &Principal, target: &str, verdict: &Verdict) -> Refusal {
    let message = verdict.refusal();
    tracing::info!(service, actor = %principal.user_id, target, refusal = %message, "refused by the organisation's policy");
    if let Record::Record { .. } = rt.guards.violation(&principal.user_id, std::time::Instant::now()) {
        let command = SecurityCommand::Record {
            service: service.to_owned(),
            actor: principal.user_id.clone(),
            target: target.to_owned(),
            kind: "policy_denied".to_owned(),
            reason: message.clone(),
            at: chrono::Utc::now(),
        };
        if let Err(e) = crate::service::record_security_violation(rt, service, command).await {
            tracing::error!(service, error = %e, "could not record a policy refusal");
        }
    }
    Refusal::new(ErrorCode::PolicyDenied, message)
}
