//! Boxes.

use super::*;

/// `idle` and `running` (a Worker of it runs on an execution host) are active; `stopped`
/// frees its slot; `archived` is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BoxState {
    Idle,
    Running,
    Stopped,
    Archived,
}

/// One row of `GET /api/v1/boxes`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BoxSummary {
    pub box_id: String,
    pub box_type: String,
    pub name: String,
    pub state: BoxState,
    pub manifest_version: String,
    pub created_at: DateTime<Utc>,
}

/// 200 of `GET /api/v1/boxes`: a page of Boxes in activation order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BoxList {
    pub boxes: Vec<BoxSummary>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    #[schema(pattern = "^[0-9]{1,18}$")]
    pub next_cursor: Option<String>,
}

/// Which Boxes `GET /api/v1/boxes` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BoxStateFilter {
    /// Active Boxes no Worker of which runs.
    Idle,
    /// Active Boxes a Worker of which runs on an execution host.
    Running,
    Stopped,
    Archived,
    All,
}

/// What happened in one entry of a Box's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum HistoryKind {
    Activated,
    UserAssigned,
    UserUnassigned,
    ManifestEdited,
    ConfigEdited,
    ManifestChanged,
    Stopped,
    Resumed,
    Archived,
    AccessProvisioned,
    AccessProvisionFailed,
}

/// One event of a Box's life. `event_id`, `at`, `actor` and `kind` are always present;
/// the other keys depend on `kind`: `activated` {draft_id, box_type, approved_by,
/// manifest_version, manifest_digest, approval_key_id}; `user_assigned` and
/// `user_unassigned` {user_id, role_in_box} (the role the user had, when unassigned);
/// `manifest_edited` and `config_edited` {changed_keys, manifest_version} (the version
/// after the edit); `manifest_changed` {draft_id, approved_by, manifest_version,
/// manifest_digest, approval_key_id, added, removed} (an approved change request);
/// `stopped`, `resumed`, `archived` {state} (the state after it);
/// `access_provisioned` {index, access, detail, attempts}; `access_provision_failed`
/// {index, access, reason, attempts}.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HistoryEntry {
    /// `<aggregate_type>/<id>/<sequence>` of the stored event.
    pub event_id: String,
    /// Its position in the store: `GET /api/v1/boxes/{box_id}?at=<position>` answers the
    /// Box as it was right after it.
    pub position: u64,
    pub at: DateTime<Utc>,
    /// Who did it; `system` when nobody did (provisioning).
    pub actor: String,
    pub kind: HistoryKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draft_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub box_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_key_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_in_box: Option<RoleInBox>,
    /// The manifest keys the edit changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub changed_keys: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<BoxState>,
    /// The entry's index in `manifest.required_access`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// What an approved change added, each `key: value`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub added: Option<Vec<String>>,
    /// What an approved change removed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<Vec<String>>,
}

/// 200 of `GET /api/v1/boxes/{box_id}/history`: a page of the Box's events, oldest
/// first (commit order).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BoxHistory {
    pub box_id: String,
    pub entries: Vec<HistoryEntry>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    #[schema(pattern = r"^[0-9]{1,18}\.[0-9]{1,18}$")]
    pub next_cursor: Option<String>,
}

/// `POST /api/v1/boxes/feasibility`. Unknown fields are refused.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FeasibilityRequest {
    /// The task, in English or Japanese; must not be blank.
    #[schema(pattern = r"^[^\u0000]*[^\u0000\t\n\u000b\u000c\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$")]
    pub task_description: String,
    /// The Box to assess: the one of this box_type that is not archived.
    pub box_type: String,
}

/// 200 of `POST /api/v1/boxes/feasibility`: a deterministic keyword check (English and
/// Japanese) of the task against what the Box declares. A non-empty
/// `missing_capabilities` means "submit a new draft".
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct FeasibilityAnswer {
    /// `missing_capabilities` is empty.
    pub feasible: bool,
    /// The declared `os_operations`.
    pub available_operations: Vec<String>,
    /// The effective tools.
    pub available_tools: Vec<String>,
    /// Capabilities the task needs that the Box does not declare.
    pub missing_capabilities: Vec<String>,
    /// One line per missing capability: what approval adding it takes.
    pub required_approvals: Vec<String>,
    pub summary: String,
    /// Which keywords matched, and limits of the Box worth knowing.
    pub notes: Vec<String>,
    /// The Box assessed.
    pub box_id: String,
}

/// A user assigned to a Box.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Assignment {
    pub user_id: String,
    pub role_in_box: RoleInBox,
}

/// The outcome of one provisioning attempt series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProvisioningStatus {
    Provisioned,
    Failed,
}

/// How one `required_access` entry of the manifest was set up.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Provisioning {
    /// The entry's index in `manifest.required_access`.
    pub index: u32,
    /// The entry, described.
    pub access: String,
    pub status: ProvisioningStatus,
    /// What was set up (`provisioned`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// Why it failed (`failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub attempts: u32,
    pub at: DateTime<Utc>,
}

/// One Box with its manifest, assignments and provisioning outcomes.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BoxDetail {
    pub box_id: String,
    pub box_type: String,
    pub name: String,
    pub state: BoxState,
    pub manifest_version: String,
    pub created_at: DateTime<Utc>,
    pub draft_id: String,
    /// The admin whose approval activated it.
    pub approved_by: String,
    pub manifest: Manifest,
    pub assignments: Vec<Assignment>,
    pub provisioning: Vec<Provisioning>,
    /// The manifest file on disk differs from (or is missing versus) what atasira wrote.
    pub manifest_drift: bool,
}
