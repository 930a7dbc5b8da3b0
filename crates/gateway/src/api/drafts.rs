//! Drafts.

use super::*;

/// Where a draft is in its life: the HTTP form of the domain's one draft status
/// (`atasira_domain::aggregates::draft::DraftStatus`), converted both ways below, so the
/// document lists exactly the domain's statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DraftStatus {
    PendingApproval,
    Approved,
    Active,
    Rejected,
    Withdrawn,
    Expired,
}

impl From<atasira_domain::aggregates::draft::DraftStatus> for DraftStatus {
    fn from(status: atasira_domain::aggregates::draft::DraftStatus) -> DraftStatus {
        use atasira_domain::aggregates::draft::DraftStatus as D;
        match status {
            D::PendingApproval => DraftStatus::PendingApproval,
            D::Approved => DraftStatus::Approved,
            D::Active => DraftStatus::Active,
            D::Rejected => DraftStatus::Rejected,
            D::Withdrawn => DraftStatus::Withdrawn,
            D::Expired => DraftStatus::Expired,
        }
    }
}

impl From<DraftStatus> for atasira_domain::aggregates::draft::DraftStatus {
    fn from(status: DraftStatus) -> atasira_domain::aggregates::draft::DraftStatus {
        use atasira_domain::aggregates::draft::DraftStatus as D;
        match status {
            DraftStatus::PendingApproval => D::PendingApproval,
            DraftStatus::Approved => D::Approved,
            DraftStatus::Active => D::Active,
            DraftStatus::Rejected => D::Rejected,
            DraftStatus::Withdrawn => D::Withdrawn,
            DraftStatus::Expired => D::Expired,
        }
    }
}

/// 201 of `POST /api/v1/boxes/box-drafts`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DraftCreated {
    pub draft_id: String,
    pub box_type: String,
    /// Always `pending_approval`.
    pub status: DraftStatus,
    /// The approval needs `confirm_over_limit: true`.
    pub over_limit: bool,
    /// What is legal but likely wrong, and every external access asked for.
    pub warnings: Vec<String>,
}

/// The decision on a draft, once there is one. Which keys are present depends on the
/// outcome: approved `{by, at, approved: true}`, rejected `{by, at, approved: false,
/// reason}`, withdrawn `{withdrawn_by, at}`, expired `{at}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Decision {
    /// The admin who approved or rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    pub at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved: Option<bool>,
    /// Why it was rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The requester (or an admin) who withdrew it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub withdrawn_by: Option<String>,
}

/// One draft as an approver sees it: every capability it asks for.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DraftSummary {
    pub draft_id: String,
    pub box_type: String,
    pub name: String,
    pub purpose: String,
    #[schema(schema_with = os_operations_schema)]
    pub os_operations: Vec<String>,
    pub tools: Vec<String>,
    pub url_allowlist: Vec<String>,
    /// The manifest's `prohibited_actions`.
    pub prohibited: Vec<String>,
    pub over_limit: bool,
    /// The os_operations that make it over_limit.
    pub over_limit_ops: Vec<String>,
    /// The tools that make it over_limit: over-limit tools (`Bash`, `shell`, ...) and OS
    /// operations named in `tools` that are over the limit (`shell:exec`, `file:write`, ...).
    pub over_limit_tools: Vec<String>,
    pub warnings: Vec<String>,
    /// The user id of the requester.
    pub requested_by: String,
    pub status: DraftStatus,
    pub created_at: DateTime<Utc>,
    pub network: Network,
    pub file_access: Vec<String>,
    pub allowed_apps: Vec<String>,
    pub required_access: Vec<RequiredAccess>,
    /// `null` while pending.
    pub decision: Option<Decision>,
    /// The Box, once active; a change request's Box from the start.
    pub box_id: Option<String>,
    /// `new`: a draft of a new Box; `change`: a change request of the Box `box_id`.
    pub kind: DraftKind,
    /// The manifest's version (a change request's is its Box's next major version).
    pub version: String,
    /// A change request: what it adds, each `key: value` (`tools: Bash`,
    /// `shell.allowed_commands: git`); empty for a new Box.
    pub added: Vec<String>,
    /// A change request: what it removes.
    pub removed: Vec<String>,
    /// The human admins who approved so far, while more are required.
    pub approvals: Vec<String>,
    /// How many distinct human admins must approve it.
    pub approvals_required: u32,
    /// A revised draft's thread; `null` for a first version.
    pub revision: Option<Revision>,
    /// The organisation's policy version it was submitted under and the rules that asked
    /// for more; `null` when no policy was published then.
    pub policy: Option<DraftPolicy>,
}

/// The organisation's policy as it judged a draft at submission (kept, whatever version
/// is published since).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DraftPolicy {
    pub version: u64,
    /// Its rules that asked for more approvers or the second confirmation.
    pub rules: Vec<String>,
    /// Whether its rules ask for the second confirmation (`confirm_over_limit: true`).
    pub confirm: bool,
}

/// The thread of a revised draft (`POST .../revise`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Revision {
    /// The rejected draft this version revises.
    pub of: String,
    /// This version's number (the first draft is 1).
    pub version: u32,
    /// Who rejected the version it revises, and why.
    pub rejected_by: String,
    pub reason: String,
    /// Every earlier version's draft id, oldest first.
    pub earlier: Vec<String>,
    /// What this version adds and removes against the one it revises, each `key: value`.
    pub added: Vec<String>,
    pub removed: Vec<String>,
}

/// Whether a draft makes a new Box or changes one (R-CHANGE-1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DraftKind {
    New,
    Change,
}

/// 201 of `POST /api/v1/boxes/{box_id}/change-requests`: the change request, pending a
/// human admin's approval, with what it changes.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ChangeRequested {
    pub draft_id: String,
    pub box_id: String,
    pub box_type: String,
    /// Always `pending_approval`.
    pub status: DraftStatus,
    /// What the change adds is over the limit: the approval needs `confirm_over_limit: true`.
    pub over_limit: bool,
    pub over_limit_ops: Vec<String>,
    pub over_limit_tools: Vec<String>,
    /// What the change adds, each `key: value`.
    pub added: Vec<String>,
    /// What the change removes.
    pub removed: Vec<String>,
    /// The version the approved change makes (the next major version).
    pub version: String,
}

/// 200 of `GET /api/v1/boxes/box-drafts/{draft_id}`: the summary and the full manifest.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DraftDetail {
    #[serde(flatten)]
    pub summary: DraftSummary,
    /// The manifest the approval would activate.
    pub manifest: Manifest,
}

/// A page of drafts, in submission order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DraftPage {
    pub drafts: Vec<DraftSummary>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    #[schema(pattern = "^[0-9]{1,18}$")]
    pub next_cursor: Option<String>,
}

/// 200 of approve: the draft's Box. `status` is `active` once the Box is (normally
/// before the answer); `approved` when activation is still running.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Approved {
    pub draft_id: String,
    /// `active`, `approved`, or `pending_approval` while more human admins must approve.
    pub status: DraftStatus,
    pub box_id: String,
    pub box_type: String,
    pub approved_by: String,
    pub approved_at: DateTime<Utc>,
    /// The human admins whose approvals were recorded before the one that completed them
    /// (or, while pending, so far); empty when one approval is required.
    pub approvals: Vec<String>,
    /// How many distinct human admins must approve: 1, or `ATASIRA_OVER_LIMIT_APPROVALS`
    /// for a draft over the limit.
    pub approvals_required: u32,
}

/// 200 of reject (`rejected`) and withdraw (`withdrawn`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DraftStatusChanged {
    pub draft_id: String,
    pub status: DraftStatus,
}
