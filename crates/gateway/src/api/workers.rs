//! Workers.

use super::*;

/// `POST /api/v1/boxes/{box_id}/workers`: launch one Worker of an active Box. Unknown
/// fields are refused (422 `invalid_request`); a segment of another kind than `text`,
/// `ticket_ref` or `objective_ref` (there is no `system` segment: role prompts come from
/// the Box's configuration) is 422 `invalid_segment` naming `input[i]`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LaunchRequest {
    /// Names the launch: retrying it with the same request gets the same Worker (200), also
    /// after a failure half-way; the same launch_id with another request is 409
    /// `launch_id_conflict`. 1 to 128 letters, digits, `-`, `_`, `.`, `:`.
    #[schema(pattern = "^[A-Za-z0-9._:-]{1,128}$")]
    pub launch_id: String,
    /// The Worker's role, a name of the caller's choosing; empty, null or absent: none. At
    /// most 64 characters, not blank.
    #[serde(default)]
    #[schema(schema_with = role_schema)]
    pub role: Option<String>,
    /// Labels of the Worker, at most 32: keys 1 to 63 characters, not blank; values at most
    /// 256 characters.
    #[serde(default)]
    #[schema(schema_with = labels_schema)]
    pub labels: Option<BTreeMap<String, String>>,
    /// The Worker's initial input, 1 to 64 segments `{"kind", "value"}`: `text` (1 to 16384
    /// characters, not blank), `ticket_ref` or `objective_ref` (1 to 256 characters, not
    /// blank; the Worker may read the ticket or objective again through its tools).
    #[schema(schema_with = input_schema)]
    pub input: Vec<Value>,
}

/// What a segment of a Worker's input is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SegmentKind {
    Text,
    TicketRef,
    ObjectiveRef,
}

/// One piece of a Worker's input.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Segment {
    pub kind: SegmentKind,
    pub value: String,
}

/// One entry of a Worker's transcript; seq 0 is the initial input.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TranscriptEntry {
    pub seq: u32,
    /// The user whose input it is.
    pub author: String,
    pub at: DateTime<Utc>,
    pub segments: Vec<Segment>,
}

/// Where a Worker is in its life: `created` until an execution host claims it, then
/// `starting`, `running` (or `paused`), and at its end `succeeded`, `failed`, `killed`, or
/// `lost` when its host stopped renewing its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WorkerState {
    Created,
    Starting,
    Running,
    Paused,
    Succeeded,
    Failed,
    Killed,
    Lost,
}

/// A stop asked of a Worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StopRequested {
    /// It ends after a grace (its runner gets SIGTERM first).
    Stop,
    /// It ends at once.
    Kill,
}

/// `POST /api/v1/workers/{worker_id}/input`: more input for a Worker that has not ended.
/// Unknown fields are refused.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct InputRequest {
    /// 1 to 64 segments, as in a launch.
    #[schema(schema_with = input_schema)]
    pub input: Vec<Value>,
}

/// A Worker with its transcript, where it is in its life, its last log lines and its
/// result. Nothing about how it runs (configuration bundles, execution bindings,
/// directories or tool scope) is part of it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Worker {
    /// `wkr_` and 32 hex digits, derived from the launch_id.
    pub worker_id: String,
    pub launch_id: String,
    pub box_id: String,
    pub box_type: String,
    /// Empty: none was given.
    pub role: String,
    pub labels: BTreeMap<String, String>,
    /// The user who launched it.
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub state: WorkerState,
    /// The execution host that runs (or ran) it; `null` before one claimed it.
    pub host: Option<String>,
    /// A stop or kill asked of it that has not ended it yet.
    pub stop_requested: Option<StopRequested>,
    pub transcript: Vec<TranscriptEntry>,
    /// Its last log lines (what its runner wrote on stderr), oldest first, at most 200.
    pub log: Vec<String>,
    /// What its runner wrote on standard output (at most 16384 characters), once ended.
    pub result: Option<String>,
    /// Its runner's exit code, when it exited by itself.
    pub exit_code: Option<i32>,
    pub ended_at: Option<DateTime<Utc>>,
}

/// One Worker of `GET /api/v1/boxes/{box_id}/workers` (without its transcript).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkerSummary {
    pub worker_id: String,
    pub launch_id: String,
    pub box_id: String,
    pub box_type: String,
    pub role: String,
    pub labels: BTreeMap<String, String>,
    pub created_by: String,
    pub created_at: DateTime<Utc>,
    pub state: WorkerState,
}

/// 200 of `GET /api/v1/boxes/{box_id}/workers`: a page of the Box's Workers, oldest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkerList {
    pub workers: Vec<WorkerSummary>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    #[schema(pattern = "^[0-9]{1,18}$")]
    pub next_cursor: Option<String>,
}

/// What one step of a Worker's provenance recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ProvenanceKind {
    /// A human admin approved the draft; `digest` is the approved manifest's.
    Approval,
    /// The Box was activated.
    Activation,
    /// A mentor edit; `digest` is the manifest's after it.
    ManifestEdit,
    /// A config edit; `digest` is the manifest's after it.
    ConfigEdit,
    /// The configuration bundle was synced; `digest` is the bundle's.
    Bundle,
    /// The Worker was created; `digest` is the bundle it runs.
    Worker,
    /// An approved change request replaced the Box's manifest; `digest` is the new one's.
    Change,
}

/// One step from the human approval to the Worker, with the event that recorded it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProvenanceStep {
    pub kind: ProvenanceKind,
    /// `<aggregate_type>/<id>/<sequence>` of the stored event.
    pub event_id: String,
    /// The event's position in the store.
    pub position: u64,
    pub at: DateTime<Utc>,
    /// Who did it; `system` when nobody did.
    pub actor: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub manifest_version: Option<String>,
    /// The seq of the event's row on the audit ledger; `null` while the ledger has not
    /// written it yet.
    pub audit_seq: Option<i64>,
}

/// 200 of `GET /api/v1/workers/{worker_id}/provenance`: the chain from the human approval,
/// through the recorded edits, to the configuration bundle the Worker runs.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct WorkerProvenance {
    pub worker_id: String,
    pub box_id: String,
    /// `sha256:<hex>` of the bundle's canonical bytes.
    pub bundle_digest: String,
    /// The key that signed the approval.
    pub approval_key_id: String,
    /// The approval verified again, now, with public keys only.
    pub approval_verified: bool,
    /// Approval first, the Worker last.
    pub steps: Vec<ProvenanceStep>,
}

/// Where a Worker's tool-use request is: `pending` until a human admin decides, then
/// `approved` or `rejected`, or `expired` (denied: nobody decided before `expires_at`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolRequestState {
    Pending,
    Approved,
    Rejected,
    Expired,
}

/// Which tool-use requests `GET /api/v1/tool-requests` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ToolRequestStateFilter {
    Pending,
    Approved,
    Rejected,
    Expired,
    All,
}

impl ToolRequestStateFilter {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolRequestStateFilter::Pending => "pending",
            ToolRequestStateFilter::Approved => "approved",
            ToolRequestStateFilter::Rejected => "rejected",
            ToolRequestStateFilter::Expired => "expired",
            ToolRequestStateFilter::All => "all",
        }
    }
}

/// A tool call a Worker waits to make: its execution host found that the Box's manifest
/// asks a human admin first (`rule`). One human admin who did not launch the Worker
/// decides it, before `expires_at`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ToolRequest {
    /// `tur_` and 32 hex digits.
    pub request_id: String,
    pub worker_id: String,
    pub box_id: String,
    pub box_type: String,
    /// The tool, e.g. `shell:exec`.
    pub tool: String,
    /// The manifest rule that asks, e.g. `shell.allowed_commands`.
    pub rule: String,
    /// Why it asks.
    pub reason: String,
    /// The call's input as the Worker sent it.
    pub input: Value,
    pub state: ToolRequestState,
    pub requested_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// The user who launched the Worker (who may not decide).
    pub launched_by: String,
    /// Who approved or rejected it.
    pub decided_by: Option<String>,
    pub decided_at: Option<DateTime<Utc>>,
    /// A rejection's reason.
    pub decision_reason: Option<String>,
}

/// 200 of `GET /api/v1/tool-requests`: newest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ToolRequestList {
    pub requests: Vec<ToolRequest>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    #[schema(pattern = "^[0-9]{1,18}$")]
    pub next_cursor: Option<String>,
}

/// `POST /api/v1/tool-requests/{request_id}/approve|reject`. Unknown fields are refused.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolDecisionRequest {
    /// Why (kept with a rejection; at most 500 characters).
    #[serde(default)]
    #[schema(max_length = 500)]
    pub reason: Option<String>,
}
