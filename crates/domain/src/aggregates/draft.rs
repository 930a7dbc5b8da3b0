//! The Draft aggregate (SPEC §3, §4): submitted always `pending_approval`; at most one
//! decision; withdraw and expiry only while pending.
//!
//! Architecture Invariant: no command of this aggregate makes a Box; a draft only records
//! the human decision and the approval token that the registry later verifies.

use chrono::{DateTime, TimeDelta, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;
use crate::change::{CapabilityDiff, ChangePlan};
use crate::draft_request::DraftPlan;
use crate::error::ErrorCode;
use crate::manifest::BoxManifest;
use crate::org_policy::Verdict;
use crate::os_operation::OverLimit;
use crate::principal::Principal;
use crate::token::ApprovalToken;

/// R-DRAFT-11: the id of the draft a submit with an Idempotency-Key creates, the same
/// for every run of that request (a retry after the gateway that ran it died), and for
/// nobody else's: UUIDv5 of the submitter's user id and the key.
pub fn draft_id_for(user_id: &str, idempotency_key: &str) -> String {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6174_6173_6972_612d_6472_6166_7469_6431);
    // Length-prefixed, so no two (user, key) pairs share a name.
    let name = format!("{}:{user_id}{idempotency_key}", user_id.len());
    uuid::Uuid::new_v5(&NAMESPACE, name.as_bytes()).to_string()
}

/// Where a draft is in its life: the one status type of the domain, the read models, the
/// wire (`contracts::convert`), the HTTP API and the CLI. `Active` is the readers' word for
/// an approved draft whose Box is active (the drafts view sets it once the Box is); the
/// draft's own stream never holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DraftStatus {
    PendingApproval,
    Approved,
    Active,
    Rejected,
    Withdrawn,
    Expired,
}

impl DraftStatus {
    pub const ALL: [DraftStatus; 6] =
        [DraftStatus::PendingApproval, DraftStatus::Approved, DraftStatus::Active, DraftStatus::Rejected, DraftStatus::Withdrawn, DraftStatus::Expired];

    /// Its name everywhere (JSON, query parameters, the CLI, stored rows).
    pub fn as_str(self) -> &'static str {
        match self {
            DraftStatus::PendingApproval => "pending_approval",
            DraftStatus::Approved => "approved",
            DraftStatus::Active => "active",
            DraftStatus::Rejected => "rejected",
            DraftStatus::Withdrawn => "withdrawn",
            DraftStatus::Expired => "expired",
        }
    }
}

impl std::str::FromStr for DraftStatus {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        DraftStatus::ALL.into_iter().find(|d| d.as_str() == s).ok_or_else(|| {
            let names: Vec<&str> = DraftStatus::ALL.iter().map(|d| d.as_str()).collect();
            format!("unknown draft status {s:?} (one of: {})", names.join(", "))
        })
    }
}

/// What a change request changes (R-CHANGE-1): the Box, the manifest it was planned on
/// and the capability diff against it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeOf {
    pub box_id: String,
    /// The digest of the Box's manifest the change was planned on: it applies only to that.
    pub base_digest: String,
    pub diff: CapabilityDiff,
}

impl ChangeOf {
    /// A change of Box `box_id` planned on its manifest `base`.
    pub fn planned(box_id: &str, base: &BoxManifest, plan: &ChangePlan) -> ChangeOf {
        ChangeOf { box_id: box_id.to_owned(), base_digest: base.digest(), diff: plan.diff.clone() }
    }
}

/// R-CHANGE-2: where a revised draft comes from: the rejected draft it revises, the
/// decision on it, the earlier versions, and what the revision changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RevisionOf {
    /// The rejected draft this revises.
    pub draft_id: String,
    /// This version's number in the thread (the first draft is 1).
    pub version: u32,
    pub rejected_by: String,
    pub reason: String,
    /// Every earlier version's draft id, oldest first.
    pub earlier: Vec<String>,
    /// What this version changes against the one it revises.
    pub diff: CapabilityDiff,
}

/// R-CHANGE-2: the id of the revision of rejected draft `draft_id`: one per rejection, so
/// two racing revisions make one.
pub fn revision_id_for(draft_id: &str) -> String {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6174_6173_6972_612d_7265_7669_7365_3031);
    uuid::Uuid::new_v5(&NAMESPACE, draft_id.as_bytes()).to_string()
}

/// R-CHANGE-1: the id of the `ordinal`-th change request of a Box (0 for the first): the
/// same for two requests that raced, so only one of them is recorded.
pub fn change_id_for(box_id: &str, ordinal: u64) -> String {
    const NAMESPACE: uuid::Uuid = uuid::Uuid::from_u128(0x6174_6173_6972_612d_6368_616e_6765_3031);
    uuid::Uuid::new_v5(&NAMESPACE, format!("{}:{box_id}{ordinal}", box_id.len()).as_bytes()).to_string()
}

/// A human decision on a draft.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub by: String,
    pub at: DateTime<Utc>,
    pub approved: bool,
    pub reason: Option<String>,
    /// An approval's token, as recorded (R-APPROVE-4).
    #[serde(default)]
    pub token: Option<ApprovalToken>,
}

/// The state of one draft, rebuilt from its events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftData {
    pub draft_id: String,
    pub manifest: BoxManifest,
    pub over_limit: OverLimit,
    pub warnings: Vec<String>,
    pub requested_by: Principal,
    pub submitted_at: DateTime<Utc>,
    pub status: DraftStatus,
    pub decision: Option<Decision>,
    /// A change request's Box and diff; `None` for a draft of a new Box.
    #[serde(default)]
    pub change: Option<ChangeOf>,
    /// R-CHANGE-3: how many distinct human admins must approve (at least one).
    #[serde(default = "one")]
    pub approvals_required: u32,
    /// R-CHANGE-2: the thread of a revised draft.
    #[serde(default)]
    pub revision: Option<RevisionOf>,
    /// The human admins who approved so far, while more are required.
    #[serde(default)]
    pub approvals: Vec<String>,
    /// R-POLICY-1: the organisation's policy's verdict at submission, as recorded.
    #[serde(default)]
    pub policy: Option<Verdict>,
}

impl DraftData {
    /// Whether an approval needs the second confirmation: over_limit, or a policy rule
    /// asked for it.
    pub fn needs_confirmation(&self) -> bool {
        self.over_limit.over_limit || self.policy.as_ref().is_some_and(|v| v.confirm)
    }
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n <= 1
}

/// The aggregate: `None` until submitted.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Draft {
    pub data: Option<DraftData>,
}

#[derive(Debug, Clone)]
pub enum DraftCommand {
    /// R-DRAFT-1, R-DRAFT-10: the plan was made by [`crate::draft_request`].
    Submit { draft_id: String, plan: DraftPlan, requested_by: Principal, at: DateTime<Utc> },
    /// R-CHANGE-1: a change request of an existing Box, planned on its manifest.
    SubmitChange { draft_id: String, plan: ChangePlan, change: ChangeOf, requested_by: Principal, at: DateTime<Utc> },
    /// R-CHANGE-2: a new pending version of a rejected draft (this one, given to the new
    /// draft's stream): `manifest` and `over_limit` planned by the caller, `change` kept.
    Revise {
        draft_id: String,
        revised: DraftData,
        manifest: BoxManifest,
        over_limit: OverLimit,
        change: Option<ChangeOf>,
        /// R-CHANGE-3: as for a new submission, judged on this version.
        approvals_required: u32,
        /// R-POLICY-1: the policy's verdict on this version.
        policy: Option<Verdict>,
        requested_by: Principal,
        at: DateTime<Utc>,
    },
    /// R-DRAFT-13: the requester, while pending.
    Withdraw { by: Principal, at: DateTime<Utc> },
    /// R-DRAFT-13: a sweeper; a no-op unless pending and older than `ttl`.
    Expire { now: DateTime<Utc>, ttl: TimeDelta },
    /// R-APPROVE-2..4, R-APPROVE-6: `token` was minted by the approval service for this draft.
    /// R-CHANGE-3: while more approvals are required, an approval is recorded without it;
    /// the one that completes them needs `reserved` (the approval service reserved the
    /// box_type for it), else it is refused as a conflict to be retried.
    Approve { by: Principal, confirm_over_limit: bool, token: ApprovalToken, at: DateTime<Utc>, reserved: bool },
    /// R-APPROVE-5.
    Reject { by: Principal, reason: String, at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum DraftEvent {
    DraftSubmitted {
        draft_id: String,
        box_type: String,
        manifest: BoxManifest,
        over_limit: OverLimit,
        warnings: Vec<String>,
        requested_by: Principal,
        submitted_at: DateTime<Utc>,
        /// A change request's Box and diff (R-CHANGE-1); absent for a new Box.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        change: Option<ChangeOf>,
        /// R-CHANGE-3: distinct human admins required; absent for one.
        #[serde(default = "one", skip_serializing_if = "is_one")]
        approvals_required: u32,
        /// R-CHANGE-2: the thread of a revision; absent for a first version.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        revision: Option<RevisionOf>,
        /// R-POLICY-1: the organisation's policy's verdict (its version, the rules that
        /// asked for more); absent when no policy was loaded. Replays read it, never
        /// evaluate again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        policy: Option<Verdict>,
    },
    /// R-CHANGE-3: one human admin's approval, while more are required; no token yet.
    DraftApprovalGiven {
        draft_id: String,
        box_type: String,
        approved_by: String,
        at: DateTime<Utc>,
        /// How many approvals there are now, and how many are required.
        approvals: u32,
        approvals_required: u32,
    },
    DraftWithdrawn {
        draft_id: String,
        withdrawn_by: String,
        at: DateTime<Utc>,
    },
    DraftExpired {
        draft_id: String,
        at: DateTime<Utc>,
    },
    DraftApproved {
        draft_id: String,
        box_type: String,
        approved_by: String,
        approved_at: DateTime<Utc>,
        confirm_over_limit: bool,
        token: ApprovalToken,
    },
    DraftRejected {
        draft_id: String,
        box_type: String,
        rejected_by: String,
        reason: String,
        at: DateTime<Utc>,
    },
}

impl DraftEvent {
    /// The name of a submission: a reader that acts only on decisions skips these, the
    /// largest draft events, by name, without decoding them.
    pub const SUBMITTED: &'static str = "DraftSubmitted";

    /// The R-ARCH-9 name.
    pub fn name(&self) -> &'static str {
        match self {
            DraftEvent::DraftSubmitted { .. } => Self::SUBMITTED,
            DraftEvent::DraftWithdrawn { .. } => "DraftWithdrawn",
            DraftEvent::DraftExpired { .. } => "DraftExpired",
            DraftEvent::DraftApproved { .. } => "DraftApproved",
            DraftEvent::DraftRejected { .. } => "DraftRejected",
            DraftEvent::DraftApprovalGiven { .. } => "DraftApprovalGiven",
        }
    }
}

/// Refusals, each with its code (and so its HTTP status).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DraftError {
    /// 403: approve/reject need role admin AND kind human (R-AUTH-2).
    #[error("only a human admin may approve or reject drafts")]
    NotHumanAdmin,
    /// 403: only the requester may withdraw (R-DRAFT-13).
    #[error("only the requester may withdraw this draft")]
    NotRequester,
    /// 403 and a security violation (R-AUTH-3).
    #[error("nobody may approve or reject a draft they submitted")]
    SelfApproval,
    /// 404.
    #[error("no such draft")]
    NotFound,
    /// 409 (R-APPROVE-2, R-APPROVE-6).
    #[error("the draft is no longer pending (it is {0:?})")]
    NotPending(DraftStatus),
    /// 409 (R-APPROVE-3).
    #[error("the draft is over_limit; approve again with confirm_over_limit: true")]
    OverLimitConfirmationRequired,
    /// 409 (R-POLICY-1): a rule of the organisation's policy asks for the confirmation.
    #[error("the organisation's policy (rule {0}) asks for the second confirmation; approve again with confirm_over_limit: true")]
    ConfirmationRequiredByPolicy(String),
    /// 422: a rejection reason with a NUL character, or longer than its bound.
    #[error("reason must be text of at most {} characters without NUL characters", crate::bounds::REASON_CHARS)]
    InvalidReason,
    /// 409: only a rejected draft is revised.
    #[error("only a rejected draft can be revised (this one is {0:?})")]
    NotRejected(DraftStatus),
    /// 409: this approval would complete the required ones, which another admin's approval
    /// made it do meanwhile; retrying decides it as the completing one.
    #[error("another admin approved this draft meanwhile; approve again")]
    ApprovalsMoved,
    /// 409: the token does not belong to this draft (a wiring bug, never a user mistake).
    #[error("the approval token does not bind this draft")]
    TokenMismatch,
}

impl DraftError {
    pub fn code(&self) -> ErrorCode {
        match self {
            DraftError::NotHumanAdmin | DraftError::NotRequester => ErrorCode::Forbidden,
            DraftError::SelfApproval => ErrorCode::SelfApprovalForbidden,
            DraftError::NotFound => ErrorCode::DraftNotFound,
            DraftError::NotPending(_) => ErrorCode::DraftNotPending,
            DraftError::OverLimitConfirmationRequired | DraftError::ConfirmationRequiredByPolicy(_) => ErrorCode::OverLimitConfirmationRequired,
            DraftError::TokenMismatch => ErrorCode::InvalidApprovalToken,
            DraftError::InvalidReason => ErrorCode::InvalidRequest,
            DraftError::ApprovalsMoved => ErrorCode::Conflict,
            DraftError::NotRejected(_) => ErrorCode::DraftNotPending,
        }
    }
}

impl Draft {
    /// The pure decision. Checks run in the spec's order: 403 (role), 404, 403
    /// (self-approval), 409 (R-DRAFT-14).
    pub fn decide(&self, command: DraftCommand) -> Result<Vec<DraftEvent>, DraftError> {
        match command {
            DraftCommand::Submit { draft_id, plan, requested_by, at } => {
                let DraftPlan { manifest, over_limit, warnings, approvals_required, policy } = plan;
                Ok(self.submission(DraftEvent::DraftSubmitted {
                    draft_id,
                    box_type: manifest.box_type.to_string(),
                    manifest,
                    over_limit,
                    warnings,
                    requested_by,
                    submitted_at: at,
                    change: None,
                    approvals_required: approvals_required.max(1),
                    revision: None,
                    policy,
                }))
            }
            DraftCommand::SubmitChange { draft_id, plan, change, requested_by, at } => {
                let ChangePlan { manifest, over_limit, approvals_required, policy, .. } = plan;
                Ok(self.submission(DraftEvent::DraftSubmitted {
                    draft_id,
                    box_type: manifest.box_type.to_string(),
                    manifest,
                    over_limit,
                    warnings: vec![],
                    requested_by,
                    submitted_at: at,
                    change: Some(change),
                    approvals_required: approvals_required.max(1),
                    revision: None,
                    policy,
                }))
            }
            DraftCommand::Revise { draft_id, revised, manifest, over_limit, change, approvals_required, policy, requested_by, at } => {
                // Only the requester revises, and only a rejected draft.
                if revised.requested_by.user_id != requested_by.user_id {
                    return Err(if requested_by.is_admin() { DraftError::NotRequester } else { DraftError::NotFound });
                }
                if revised.status != DraftStatus::Rejected {
                    return Err(DraftError::NotRejected(revised.status));
                }
                let (rejected_by, reason) = revised.decision.as_ref().map(|d| (d.by.clone(), d.reason.clone().unwrap_or_default())).unwrap_or_default();
                let (version, mut earlier) = match &revised.revision {
                    Some(r) => (r.version + 1, r.earlier.clone()),
                    None => (2, vec![]),
                };
                earlier.push(revised.draft_id.clone());
                let revision = RevisionOf {
                    draft_id: revised.draft_id.clone(),
                    version,
                    rejected_by,
                    reason,
                    earlier,
                    diff: crate::change::capability_diff(&revised.manifest, &manifest),
                };
                Ok(self.submission(DraftEvent::DraftSubmitted {
                    draft_id,
                    box_type: manifest.box_type.to_string(),
                    manifest,
                    over_limit,
                    warnings: vec![],
                    requested_by,
                    submitted_at: at,
                    change,
                    approvals_required: approvals_required.max(1),
                    revision: Some(revision),
                    policy,
                }))
            }
            DraftCommand::Withdraw { by, at } => {
                let d = self.data.as_ref().ok_or(DraftError::NotFound)?;
                if d.requested_by.user_id != by.user_id {
                    // To those who may not read it, someone else's draft does not exist.
                    return Err(if by.is_admin() { DraftError::NotRequester } else { DraftError::NotFound });
                }
                match d.status {
                    DraftStatus::PendingApproval => Ok(vec![DraftEvent::DraftWithdrawn { draft_id: d.draft_id.clone(), withdrawn_by: by.user_id, at }]),
                    DraftStatus::Withdrawn => Ok(vec![]),
                    other => Err(DraftError::NotPending(other)),
                }
            }
            DraftCommand::Expire { now, ttl } => match &self.data {
                Some(d) if d.status == DraftStatus::PendingApproval && now >= d.submitted_at + ttl => {
                    Ok(vec![DraftEvent::DraftExpired { draft_id: d.draft_id.clone(), at: now }])
                }
                _ => Ok(vec![]),
            },
            DraftCommand::Approve { by, confirm_over_limit, token, at, reserved } => {
                let d = self.decidable(&by)?;
                if let Some(done) = self.repeat_of(&by, true) {
                    return done;
                }
                if d.status != DraftStatus::PendingApproval {
                    return Err(DraftError::NotPending(d.status));
                }
                if d.over_limit.over_limit && !confirm_over_limit {
                    return Err(DraftError::OverLimitConfirmationRequired);
                }
                if let Some(rules) = d.policy.as_ref().filter(|v| v.confirm && !confirm_over_limit).map(|v| v.rules.join(", ")) {
                    return Err(DraftError::ConfirmationRequiredByPolicy(rules));
                }
                // R-CHANGE-3: distinct human admins, each once.
                if d.approvals.contains(&by.user_id) {
                    return Ok(vec![]);
                }
                let given = u32::try_from(d.approvals.len()).unwrap_or(u32::MAX).saturating_add(1);
                if given < d.approvals_required {
                    return Ok(vec![DraftEvent::DraftApprovalGiven {
                        draft_id: d.draft_id.clone(),
                        box_type: d.manifest.box_type.to_string(),
                        approved_by: by.user_id,
                        at,
                        approvals: given,
                        approvals_required: d.approvals_required,
                    }]);
                }
                if !reserved {
                    return Err(DraftError::ApprovalsMoved);
                }
                let c = &token.claims;
                if c.draft_id != d.draft_id
                    || c.box_type != d.manifest.box_type.as_str()
                    || c.manifest_digest != d.manifest.digest()
                    || c.approver != by.user_id
                {
                    return Err(DraftError::TokenMismatch);
                }
                Ok(vec![DraftEvent::DraftApproved {
                    draft_id: d.draft_id.clone(),
                    box_type: d.manifest.box_type.to_string(),
                    approved_by: by.user_id,
                    approved_at: at,
                    confirm_over_limit,
                    token,
                }])
            }
            DraftCommand::Reject { by, reason, at } => {
                let d = self.decidable(&by)?;
                if reason.contains('\0') || reason.chars().count() > crate::bounds::REASON_CHARS {
                    return Err(DraftError::InvalidReason);
                }
                if let Some(done) = self.repeat_of(&by, false) {
                    return done;
                }
                if d.status != DraftStatus::PendingApproval {
                    return Err(DraftError::NotPending(d.status));
                }
                Ok(vec![DraftEvent::DraftRejected {
                    draft_id: d.draft_id.clone(),
                    box_type: d.manifest.box_type.to_string(),
                    rejected_by: by.user_id,
                    reason,
                    at,
                }])
            }
        }
    }

    /// A submission, unless the draft was submitted already (a redelivery: recorded).
    fn submission(&self, submitted: DraftEvent) -> Vec<DraftEvent> {
        if self.data.is_some() { vec![] } else { vec![submitted] }
    }

    /// R-AUTH-2, R-AUTH-3: who may decide at all on this draft.
    fn decidable(&self, by: &Principal) -> Result<&DraftData, DraftError> {
        if !by.is_human_admin() {
            return Err(DraftError::NotHumanAdmin);
        }
        let d = self.data.as_ref().ok_or(DraftError::NotFound)?;
        if d.requested_by.user_id == by.user_id {
            return Err(DraftError::SelfApproval);
        }
        Ok(d)
    }

    /// R-APPROVE-6: the admin who made this same decision gets success again (so a retried
    /// approve can complete an interrupted activation); anyone else falls through to 409.
    fn repeat_of(&self, by: &Principal, approved: bool) -> Option<Result<Vec<DraftEvent>, DraftError>> {
        let decision = self.data.as_ref()?.decision.as_ref()?;
        (decision.approved == approved && decision.by == by.user_id).then(|| Ok(vec![]))
    }

    /// R-APPROVE-7 (3), R-BOX-1: whether this draft's stream holds `claimed` as its
    /// decision: the draft is approved, by the same admin at the same time with the same
    /// token, and that token binds this draft, its manifest's digest and that admin.
    /// Activation acts only on an approval the store holds, whatever a notification says.
    pub fn holds_approval(&self, claimed: &DraftEvent) -> bool {
        let DraftEvent::DraftApproved { draft_id, box_type, approved_by, approved_at, token, .. } = claimed else {
            return false;
        };
        let Some(d) = &self.data else {
            return false;
        };
        let Some(decision) = d.decision.as_ref().filter(|x| x.approved && d.status == DraftStatus::Approved) else {
            return false;
        };
        let claims = &token.claims;
        d.draft_id == *draft_id
            && d.manifest.box_type.as_str() == box_type
            && decision.by == *approved_by
            && decision.at == *approved_at
            && decision.token.as_ref() == Some(token)
            && claims.draft_id == d.draft_id
            && claims.approver == decision.by
            && claims.manifest_digest == d.manifest.digest()
    }

    pub fn evolve(&mut self, event: DraftEvent) {
        match event {
            DraftEvent::DraftSubmitted {
                draft_id,
                manifest,
                over_limit,
                warnings,
                requested_by,
                submitted_at,
                change,
                approvals_required,
                revision,
                policy,
                ..
            } => {
                self.data = Some(DraftData {
                    draft_id,
                    manifest,
                    over_limit,
                    warnings,
                    requested_by,
                    submitted_at,
                    status: DraftStatus::PendingApproval,
                    decision: None,
                    change,
                    approvals_required,
                    approvals: vec![],
                    revision,
                    policy,
                });
            }
            DraftEvent::DraftApprovalGiven { approved_by, .. } => {
                if let Some(d) = self.data.as_mut() {
                    d.approvals.push(approved_by);
                }
            }
            DraftEvent::DraftWithdrawn { .. } => self.set_status(DraftStatus::Withdrawn, None),
            DraftEvent::DraftExpired { .. } => self.set_status(DraftStatus::Expired, None),
            DraftEvent::DraftApproved { approved_by, approved_at, token, .. } => {
                self.set_status(DraftStatus::Approved, Some(Decision { by: approved_by, at: approved_at, approved: true, reason: None, token: Some(token) }))
            }
            DraftEvent::DraftRejected { rejected_by, reason, at, .. } => {
                self.set_status(DraftStatus::Rejected, Some(Decision { by: rejected_by, at, approved: false, reason: Some(reason), token: None }))
            }
        }
    }

    fn set_status(&mut self, status: DraftStatus, decision: Option<Decision>) {
        if let Some(d) = self.data.as_mut() {
            d.status = status;
            if decision.is_some() {
                d.decision = decision;
            }
        }
    }
}

aggregate_via_decide!(Draft, super::types::DRAFT, DraftCommand, DraftEvent, DraftError);

#[cfg(test)]
mod tests;
