//! The HTTP shapes of the API: every request and response body, owned by the gateway and
//! described in the OpenAPI document by these types (`ToSchema`).
//!
//! The services answer over the bus with typed protobuf replies; `from_wire.rs` turns each
//! into its HTTP type, one `TryFrom` per (reply, HTTP type), and nowhere else.

use std::collections::BTreeMap;

use atasira_domain::assertion::{Binding, PayloadDigest, PrincipalAssertion};
use atasira_domain::box_type::{BOX_TYPE_PATTERN, RESERVED_BOX_TYPES};
use atasira_domain::{FieldError, OSOperation};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use utoipa::ToSchema;
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{AdditionalProperties, ArrayBuilder, Object, ObjectBuilder, OneOfBuilder, Schema, SchemaType, Type};

/// Text that requests may carry: anything but NUL (which PostgreSQL cannot store, so the
/// gateway refuses it in every request; see `extract.rs`).
pub const NUL_FREE: &str = r"^[^\u0000]*$";

// --- request bodies ---------------------------------------------------------------------

/// `POST /api/v1/boxes/box-drafts`: what an agent or a person asks for. The drafts service
/// turns it into a manifest, always pending approval. Unknown fields are refused (422
/// `invalid_request`); `null` means "not given". The domain's parser checks the body's
/// shape (so every entry point reports the same errors); this type documents it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BoxDraftCreateRequest {
    /// The Box's unique id: lowercase letters, digits, `_` and `-`, at most 64 characters,
    /// not a reserved word (a NATS subject token). `admin-pm` and `admin-ops` are refused
    /// with 403 `self_privilege_forbidden`.
    #[schema(schema_with = box_type_schema)]
    pub box_type: String,
    /// The standing role of the Box; must not be blank (the pattern: a character that is
    /// neither NUL nor Unicode white space).
    #[schema(pattern = r"^[^\u0000]*[^\u0000\t\n\u000b\u000c\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$")]
    pub purpose: String,
    pub name: Option<String>,
    /// Appended to `purpose` under "## Success criteria", one line per item.
    pub success_criteria: Option<Vec<String>>,
    /// OS operations the Box may perform.
    #[schema(schema_with = os_operations_schema_nullable)]
    pub os_operations: Option<Vec<String>>,
    /// Tools the Box may call. An OS operation named here (`shell:exec`) grants that
    /// operation exactly as if it were in `os_operations`, and counts for `over_limit`.
    pub tools: Option<Vec<String>>,
    pub allowed_apps: Option<Vec<String>>,
    pub url_allowlist: Option<Vec<String>>,
    pub file_access: Option<Vec<String>>,
    pub prohibited_actions: Option<Vec<String>>,
    /// `true`: the manifest's network is `filtered`; `false` or absent: `none`.
    pub allow_network: Option<bool>,
    /// External resources the provisioner sets up after activation (never secrets: only
    /// vault and item names).
    pub required_access: Option<Vec<RequiredAccess>>,
}

/// `POST .../approve`. An empty body is `{}`. Unknown fields are refused.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApproveRequest {
    /// Must be `true` to approve an over_limit draft (the second confirmation).
    #[serde(default)]
    pub confirm_over_limit: bool,
}

/// `POST .../reject`. An empty body is `{}`. Unknown fields are refused.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectRequest {
    /// Shown to the requester with the decision.
    #[serde(default)]
    pub reason: String,
}

/// The body of actions that take no input (withdraw, stop, resume, archive): empty or `{}`.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EmptyRequest {}

/// A user's role in one Box.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum RoleInBox {
    Primary,
    Member,
}

/// `POST /api/v1/boxes/{box_id}/user-assignments`. Unknown fields are refused.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AssignRequest {
    /// Must not be blank.
    #[schema(pattern = r"^[^\u0000]*[^\u0000\t\n\u000b\u000c\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$")]
    pub user_id: String,
    pub role_in_box: RoleInBox,
}

/// `POST /api/v1/auth/nats-assertion`: the one NATS request the assertion is for. Unknown
/// fields are refused; a missing or malformed field is 422 `invalid_request` with one
/// entry per field in `details`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AssertionRequest {
    /// The subject the request is sent on: `atasira.box.<sender>.<service>`, the sender
    /// being `gateway` or a service, e.g. `atasira.box.gateway.drafts`.
    #[serde(default)]
    #[schema(
        required = true,
        pattern = r"^atasira\.box\.(gateway|drafts|approval|provisioner|runtime-registry|audit)\.(drafts|approval|provisioner|runtime-registry|audit)$"
    )]
    pub subject: String,
    /// The envelope's `message_type`, e.g. `atasira.v1.ListPendingDrafts`.
    #[serde(default)]
    #[schema(required = true, pattern = r"^atasira\.v1\.[A-Z][A-Za-z0-9]{0,99}$")]
    pub message_type: String,
    /// The SHA-256 of the envelope's `payload` bytes: 64 lowercase hex digits.
    #[serde(default)]
    #[schema(required = true, pattern = "^[0-9a-f]{64}$")]
    pub payload_sha256: String,
    /// The correlation id the request carries; one is generated when absent or empty.
    #[serde(default)]
    pub correlation_id: Option<String>,
    /// The idempotency key the envelope carries (absent or empty: none), at most 255
    /// visible ASCII characters. The drafts service derives a submitted draft's id from it.
    #[serde(default)]
    #[schema(pattern = "^[!-~]{0,255}$")]
    pub idempotency_key: Option<String>,
}

impl AssertionRequest {
    /// The request the assertion is for (the correlation id as given, possibly empty), or
    /// every field that is missing or malformed.
    pub fn binding(&self) -> Result<Binding, Vec<FieldError>> {
        let mut errors = Vec::new();
        let to = self.subject.rsplit('.').next().unwrap_or_default();
        let known = atasira_contracts::subjects::SERVICES.contains(&to)
            && matches!(atasira_contracts::subjects::origin(&self.subject, to), Some(atasira_contracts::subjects::Origin::Service(_)));
        if !known {
            errors.push(FieldError::new(
                "subject",
                "must be atasira.box.<sender>.<service>, the sender being gateway or a service, e.g. atasira.box.gateway.drafts",
            ));
        }
        let name = self.message_type.strip_prefix("atasira.v1.").unwrap_or_default();
        let well_formed = name.len() <= 100 && name.bytes().next().is_some_and(|b| b.is_ascii_uppercase()) && name.bytes().all(|b| b.is_ascii_alphanumeric());
        if !well_formed {
            errors.push(FieldError::new("message_type", "must be a message name such as atasira.v1.ListPendingDrafts"));
        }
        let digest = PayloadDigest::from_hex(&self.payload_sha256);
        if digest.is_none() {
            errors.push(FieldError::new("payload_sha256", "must be the SHA-256 of the payload bytes as 64 lowercase hex digits"));
        }
        let idempotency_key = self.idempotency_key.clone().unwrap_or_default();
        if idempotency_key.len() > 255 || !idempotency_key.bytes().all(|b| (b'!'..=b'~').contains(&b)) {
            errors.push(FieldError::new("idempotency_key", "must be at most 255 visible ASCII characters without spaces"));
        }
        match digest {
            Some(payload_sha256) if errors.is_empty() => Ok(Binding {
                subject: self.subject.clone(),
                message_type: self.message_type.clone(),
                payload_sha256,
                correlation_id: self.correlation_id.clone().unwrap_or_default(),
                idempotency_key,
            }),
            _ => Err(errors),
        }
    }
}

// --- edits after activation -------------------------------------------------------------

/// `PUT /api/v1/boxes/{box_id}/manifest`: a mentor edit of the Box's wording (a human
/// admin). Only these four keys; any other key, top-level or nested (a step holds only
/// `step`, `description`, `tool`, `args_schema`), is 403 `mentor_edit_prohibited_key` and
/// a security violation on the audit ledger naming the keys. Keys not given keep their
/// value; `success_criteria` replaces the purpose's success-criteria section (`[]` removes
/// it). A change bumps the minor version; an edit that changes nothing is answered
/// without a new version.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MentorEditRequest {
    /// The standing role; must not be blank. Its success-criteria section is kept unless
    /// `success_criteria` is given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false, pattern = r"^[^\u0000]*[^\u0000\t\n\u000b\u000c\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$")]
    pub purpose: Option<String>,
    /// Replaces the "## Success criteria" section of the purpose, one line per item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub success_criteria: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub prohibited_actions: Option<Vec<String>>,
    /// Replaces the whole procedure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub business_procedure: Option<Vec<ProcedureStepEdit>>,
}

/// The simple cron expressions the OpenAPI document promises `trigger_schedule` takes:
/// per field `*`, `*/n` or one value in range (minute, hour, day of month, month, day of
/// week), or the empty text.
pub const CRON_PATTERN: &str = r"^$|^(\*|\*/([1-9]|[1-5][0-9])|[0-9]|[1-5][0-9]) (\*|\*/([1-9]|1[0-9]|2[0-3])|[0-9]|1[0-9]|2[0-3]) (\*|[1-9]|[12][0-9]|3[01]) (\*|[1-9]|1[0-2]) (\*|[0-6])$";

/// One step of `business_procedure` in a mentor edit.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcedureStepEdit {
    #[schema(minimum = -9007199254740991_i64, maximum = 9007199254740991_i64)]
    pub step: i64,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub tool: String,
    /// A JSON object (at most 4 KiB as JSON); its strings may hold `{key}` placeholders of
    /// `config_defaults`.
    #[serde(default)]
    #[schema(schema_with = small_json_object)]
    pub args_schema: Map<String, Value>,
}

/// `PATCH /api/v1/boxes/{box_id}/config` (`application/merge-patch+json`): a JSON merge
/// patch (RFC 7396) of the Box's operating parameters, by a human admin or the Box's
/// primary (an agent primary too, within the same limits). Objects merge key by key,
/// `null` deletes a key, anything else replaces. Any other top-level manifest key, and
/// anything that would widen what the Box may do (see the 403), is refused; a key of no
/// manifest, top-level or nested, is 422 naming it.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfigPatch {
    /// Operating parameters (any JSON object, at most 32 KiB as JSON), reaching the agent
    /// through `business_procedure` placeholders.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = small_json_object_nullable)]
    pub config_defaults: Option<Map<String, Value>>,
    /// A 5-field cron expression (croniter syntax, e.g. `*/15 * * * *`), or empty; an
    /// invalid one is 422 naming the key. The pattern states a simple form (`*`, `*/n` or
    /// one value per field); lists and ranges are taken too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = cron_schema)]
    pub trigger_schedule: Option<String>,
    /// Channels (`email`, `line`); a channel the Box has no `notify:<channel>` operation
    /// for is a capability change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = notify_patch_schema)]
    pub notify: Option<BTreeMap<String, NotifyChannelPatch>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<CredentialsPatch>,
    /// Only for a Box with an approved `shell:exec`, within the commands and directories
    /// approved with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shell: Option<ShellPatch>,
    /// Approval gates may only be added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub browser: Option<BrowserPatch>,
}

/// A merge patch of one notification channel: vault and item names (never secrets),
/// recipients (emptying a non-empty list is a capability change), broadcast (turning it on
/// is a capability change). The vault must be among `credentials.allowed_vaults` (422).
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NotifyChannelPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vault: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recipients: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broadcast: Option<bool>,
}

/// A merge patch of `credentials` (names only): a vault that was not approved is a
/// capability change.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CredentialsPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_vaults: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_env_var: Option<String>,
}

/// A merge patch of `shell`: commands and directories within those approved with
/// `shell:exec` (a directory below an approved one is within); turning the approval gate
/// off is a capability change.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_commands: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_cwd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_approval_outside_allowlist: Option<bool>,
}

/// A merge patch of `browser`: gates may be added, never removed.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BrowserPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_required_selectors: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_required_text_patterns: Option<Vec<String>>,
}

// --- errors -----------------------------------------------------------------------------

/// Every error answer: `{"error": code, "message": text, "details": optional}`. The code
/// always maps to the same status.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// The error code, e.g. `draft_not_pending`, `invalid_cursor`.
    pub error: String,
    /// What went wrong, for people.
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = details_schema)]
    pub details: Option<Value>,
}

// --- drafts -----------------------------------------------------------------------------

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
    /// The Box, once active.
    pub box_id: Option<String>,
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
    pub status: DraftStatus,
    pub box_id: String,
    pub box_type: String,
    pub approved_by: String,
    pub approved_at: DateTime<Utc>,
}

/// 200 of reject (`rejected`) and withdraw (`withdrawn`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DraftStatusChanged {
    pub draft_id: String,
    pub status: DraftStatus,
}

// --- the manifest -----------------------------------------------------------------------

/// How the Box runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AgentKind {
    Dialog,
    Worker,
    Mentor,
    Custom,
}

/// How far the Box may reach on the network, from narrowest to widest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    None,
    Local,
    Filtered,
    Full,
}

/// What starts the Box.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TriggerType {
    Manual,
    Event,
    Schedule,
}

/// An external resource the provisioner sets up after activation. Never a secret: only
/// vault and item names. Other keys are refused. (Its schema is written out below: the
/// derive cannot say "no other keys" for the variants of a tagged enum.)
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum RequiredAccess {
    GitRemote {
        url: String,
    },
    SshTarget {
        host: String,
        user: String,
        /// A whole number; `22.0` is 22, as JSON Schema reads it.
        #[serde(default = "atasira_domain::manifest::default_ssh_port", deserialize_with = "atasira_domain::manifest::whole_port")]
        port: u16,
    },
    NetrcEntry {
        machine: String,
        login: String,
        vault: String,
        item: String,
    },
}

/// The loop limits, frozen when the engine starts.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LoopControl {
    pub max_iterations: u32,
    pub timeout_s: f64,
    pub escalate_on_failure: bool,
}

/// One ordered step of `business_procedure`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ProcedureStep {
    pub step: i64,
    pub description: String,
    pub tool: String,
    #[schema(value_type = Object)]
    pub args_schema: Map<String, Value>,
}

/// LLM routing; absent keys are not set.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Llm {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = min_tier_schema)]
    pub min_tier: Option<Value>,
}

/// Vaults the Box may read from (names only).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Credentials {
    pub allowed_vaults: Vec<String>,
    pub token_env_var: String,
}

/// `shell:exec` limits; empty `allowed_commands` refuses every command.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Shell {
    pub allowed_commands: Vec<String>,
    pub allowed_cwd: Vec<String>,
    pub require_approval_outside_allowlist: bool,
}

/// One notification channel; `item` names a vault item, not a secret.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NotifyChannel {
    pub vault: String,
    pub item: String,
    pub recipients: Vec<String>,
    pub broadcast: bool,
}

/// Approval gates on browser clicks.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Browser {
    pub approval_required_selectors: Vec<String>,
    pub approval_required_text_patterns: Vec<String>,
}

/// A Box manifest: every key of the manifest schema, as written to the Box's YAML file.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Manifest {
    pub box_type: String,
    /// `MAJOR.MINOR.PATCH`.
    pub version: String,
    pub name: String,
    pub description: String,
    pub capabilities: Vec<String>,
    pub agent_kind: AgentKind,
    #[schema(value_type = Object)]
    pub resource_limits: Map<String, Value>,
    #[schema(value_type = Object)]
    pub tool_policies: Map<String, Value>,
    #[schema(value_type = Object)]
    pub config_defaults: Map<String, Value>,
    pub tools: Vec<String>,
    #[schema(schema_with = os_operations_schema)]
    pub os_operations: Vec<String>,
    pub file_access: Vec<String>,
    pub network: Network,
    pub url_allowlist: Vec<String>,
    pub allowed_apps: Vec<String>,
    pub dangerous_tool_overrides: BTreeMap<String, bool>,
    pub trigger_type: TriggerType,
    pub trigger_schedule: String,
    pub trigger_event: String,
    pub purpose: String,
    pub prohibited_actions: Vec<String>,
    pub loop_control: LoopControl,
    pub business_procedure: Vec<ProcedureStep>,
    pub outputs: Vec<String>,
    pub llm: Llm,
    pub required_access: Vec<RequiredAccess>,
    pub credentials: Credentials,
    pub shell: Shell,
    pub notify: BTreeMap<String, NotifyChannel>,
    pub browser: Browser,
}

// --- Boxes ------------------------------------------------------------------------------

/// `idle` is active; `stopped` frees its slot; `archived` is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum BoxState {
    Idle,
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
    Idle,
    /// Boxes with running Workers: a state no Box has yet, so nothing matches today.
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
/// after the edit); `stopped`, `resumed`, `archived` {state} (the state after it);
/// `access_provisioned` {index, access, detail, attempts}; `access_provision_failed`
/// {index, access, reason, attempts}.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HistoryEntry {
    /// `<aggregate_type>/<id>/<sequence>` of the stored event.
    pub event_id: String,
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

// --- audit ------------------------------------------------------------------------------

/// One ledger row: hash-chained and MACed.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditRow {
    pub seq: i64,
    /// RFC 3339 in UTC with exactly three fractional digits (the MACed text).
    #[schema(format = DateTime)]
    pub time: String,
    /// e.g. `box_draft.create`, `box.activate`, `security_violation`.
    pub action: String,
    pub actor: String,
    pub target: String,
    pub event_id: String,
    /// `sha256:<hex>` of the event payload.
    pub payload_digest: String,
    /// The id of the key that made `mac`.
    pub key_id: String,
    /// Lowercase hex HMAC-SHA256 over the row and the previous row's MAC.
    pub mac: String,
}

/// A page of ledger rows in seq order.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AuditRows {
    pub rows: Vec<AuditRow>,
    /// Pass as `cursor` for the next page; `null` on the last page.
    #[schema(pattern = "^[0-9]{1,18}$")]
    pub next_cursor: Option<String>,
}

/// What changed, as `GET /api/v1/events/stream` announces it: the read models have applied
/// the store up to `position` (0: unknown, re-read everything the topics name).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StreamChange {
    pub position: i64,
    /// The views that may have changed.
    pub topics: Vec<StreamTopic>,
}

/// A kind of view a change concerns: `drafts` (pending and own drafts), `boxes` (Boxes,
/// their manifests, assignments and history), `workers`, `audit` (the ledger).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StreamTopic {
    Drafts,
    Boxes,
    Workers,
    Audit,
}

/// `{"ok": true, "rows": N}` or `{"ok": false, "first_bad_seq": S, "reason": "..."}`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct VerifyResult {
    pub ok: bool,
    /// How many rows verified (`ok: true`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows: Option<u64>,
    /// The first row that does not verify (`ok: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_bad_seq: Option<i64>,
    /// What is wrong with it (`ok: false`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

// --- Workers ----------------------------------------------------------------------------

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

/// A Worker with its transcript. Nothing about how it runs (configuration bundles,
/// execution bindings, directories or tool scope) is part of it.
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
    pub transcript: Vec<TranscriptEntry>,
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

// --- auth -------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    Admin,
    Member,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Human,
    Agent,
}

/// Who holds the token.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PrincipalView {
    pub user_id: String,
    pub role: Role,
    pub kind: Kind,
}

/// The gateway's signed statement "this call comes from this principal", for one request.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Assertion {
    pub key_id: String,
    pub principal: PrincipalView,
    pub subject: String,
    pub message_type: String,
    /// 64 lowercase hex digits.
    pub payload_sha256: String,
    pub correlation_id: String,
    /// Empty: the request carries none.
    pub idempotency_key: String,
    pub expires_at: DateTime<Utc>,
    /// Lowercase hex of the gateway's Ed25519 signature (64 bytes).
    pub signature: String,
}

/// 200 of `POST /api/v1/auth/nats-assertion`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct AssertionIssued {
    pub correlation_id: String,
    pub expires_at: DateTime<Utc>,
    pub assertion: Assertion,
    /// The assertion as an `atasira.v1.PrincipalAssertion` protobuf, hex: put it in the
    /// envelope of the one request it is for. Services accept it once.
    pub assertion_protobuf_hex: String,
}

impl AssertionIssued {
    pub fn new(assertion: &PrincipalAssertion, protobuf: &[u8]) -> Self {
        let principal = PrincipalView::from(&assertion.principal);
        let binding = &assertion.binding;
        Self {
            correlation_id: binding.correlation_id.clone(),
            expires_at: assertion.expires_at,
            assertion: Assertion {
                key_id: assertion.key_id.clone(),
                principal,
                subject: binding.subject.clone(),
                message_type: binding.message_type.clone(),
                payload_sha256: binding.payload_sha256.to_hex(),
                correlation_id: binding.correlation_id.clone(),
                idempotency_key: binding.idempotency_key.clone(),
                expires_at: assertion.expires_at,
                signature: assertion.signature.clone(),
            },
            assertion_protobuf_hex: hex::encode(protobuf),
        }
    }
}

impl From<&atasira_domain::Principal> for PrincipalView {
    fn from(p: &atasira_domain::Principal) -> Self {
        PrincipalView {
            user_id: p.user_id.clone(),
            role: match p.role {
                atasira_domain::Role::Admin => Role::Admin,
                atasira_domain::Role::Member => Role::Member,
            },
            kind: match p.kind {
                atasira_domain::Kind::Human => Kind::Human,
                atasira_domain::Kind::Agent => Kind::Agent,
            },
        }
    }
}

// --- tokens -------------------------------------------------------------------------------

/// Whether a token works now, or why not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TokenState {
    Active,
    Expired,
    Revoked,
}

/// A personal access token as admins see it: never the token or its hash.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenView {
    /// The token's public id (`tok_...`).
    pub token_id: String,
    pub user_id: String,
    pub role: Role,
    pub kind: Kind,
    pub state: TokenState,
    pub created_at: DateTime<Utc>,
    /// `null`: never expires.
    pub expires_at: Option<DateTime<Utc>>,
    /// To the minute; `null`: never used.
    pub last_used_at: Option<DateTime<Utc>>,
    pub revoked_at: Option<DateTime<Utc>>,
}

impl From<&atasira_platform::auth::TokenInfo> for TokenView {
    fn from(t: &atasira_platform::auth::TokenInfo) -> Self {
        let p = PrincipalView::from(&t.principal);
        TokenView {
            token_id: t.token_id.clone(),
            user_id: p.user_id,
            role: p.role,
            kind: p.kind,
            state: match t.state {
                atasira_platform::auth::TokenState::Active => TokenState::Active,
                atasira_platform::auth::TokenState::Expired => TokenState::Expired,
                atasira_platform::auth::TokenState::Revoked => TokenState::Revoked,
            },
            created_at: t.created_at,
            expires_at: t.expires_at,
            last_used_at: t.last_used_at,
            revoked_at: t.revoked_at,
        }
    }
}

/// 200 of `GET /api/v1/auth/tokens`: oldest first.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
}

/// 200 of a revocation: the ids of the tokens it revoked (empty when they were revoked
/// already).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TokensRevoked {
    pub revoked: Vec<String>,
}

// --- schemas the derive cannot express ----------------------------------------------------

fn any_value(description: &str) -> Object {
    ObjectBuilder::new().schema_type(SchemaType::AnyValue).description(Some(description)).build()
}

fn details_schema() -> Object {
    any_value(
        "More about the error when there is more: the field errors of a `box_manifest_validation` (a list of `{key, message}`), the `parameter` of an `invalid_query`.",
    )
}

fn min_tier_schema() -> Object {
    any_value("A tier name or number, kept as given.")
}

fn string() -> ObjectBuilder {
    ObjectBuilder::new().schema_type(SchemaType::Type(Type::String))
}

/// One kind of `required_access` entry: `type` and exactly these keys.
fn access_kind(kind: &str, required: &[&str], optional: &[(&str, Object)]) -> Object {
    let mut object = ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::Object))
        .property("type", string().enum_values(Some([kind])))
        .required("type")
        .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)));
    for key in required {
        // R-ARCH-6: as long as the domain's bound allows.
        let max_length = match atasira_domain::bounds::of(atasira_domain::bounds::DRAFT_REQUEST, &format!("required_access[].{key}")) {
            Some(atasira_domain::bounds::Bound::Text(chars)) => Some(chars),
            _ => None,
        };
        object = object.property(*key, string().max_length(max_length)).required(*key);
    }
    for (key, schema) in optional {
        object = object.property(*key, schema.clone());
    }
    object.build()
}

impl utoipa::PartialSchema for RequiredAccess {
    fn schema() -> RefOr<Schema> {
        let port =
            ObjectBuilder::new().schema_type(SchemaType::Type(Type::Integer)).minimum(Some(0)).maximum(Some(65535)).description(Some("Default 22.")).build();
        OneOfBuilder::new()
            .item(access_kind("git_remote", &["url"], &[]))
            .item(access_kind("ssh_target", &["host", "user"], &[("port", port)]))
            .item(access_kind("netrc_entry", &["machine", "login", "vault", "item"], &[]))
            .description(Some(
                "An external resource the provisioner sets up after activation. Never a secret: only vault and item names. Other keys are refused.",
            ))
            .into()
    }
}

impl ToSchema for RequiredAccess {}

/// A JSON object this document can promise the API takes: a few keys of NUL-free text
/// holding NUL-free text, numbers (whole ones within ±2^53, which a double carries
/// exactly; beyond is 422) or booleans. The API takes any JSON object within the
/// key's bound (nested values too); the document states a part of it so that every
/// example it describes is one the API takes.
fn small_json_object_builder() -> ObjectBuilder {
    let nul_free = || string().pattern(Some(NUL_FREE));
    let scalar = ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Number, Type::Boolean]))
        .pattern(Some(NUL_FREE))
        .max_length(Some(16))
        .minimum(Some(-9007199254740991_i64))
        .maximum(Some(9007199254740991_i64));
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::Object))
        .property_names(Some(nul_free().max_length(Some(8))))
        .additional_properties(Some(scalar))
        .max_properties(Some(1))
}

fn small_json_object() -> Object {
    small_json_object_builder().build()
}

fn small_json_object_nullable() -> Object {
    small_json_object_builder().schema_type(SchemaType::from_iter([Type::Object, Type::Null])).build()
}

/// `trigger_schedule` in a config patch: the documented cron form, or null (which
/// deletes it).
fn cron_schema() -> Object {
    ObjectBuilder::new().schema_type(SchemaType::from_iter([Type::String, Type::Null])).pattern(Some(CRON_PATTERN)).build()
}

/// `notify` in a config patch: channel names to channel patches (or null, which deletes a
/// channel).
fn notify_patch_schema() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .property_names(Some(string().pattern(Some(NUL_FREE)).max_length(Some(64))))
        .additional_properties(Some(utoipa::openapi::Ref::from_schema_name("NotifyChannelPatch")))
        .max_properties(Some(8))
        .build()
}

/// Text that is not blank: a character that is neither NUL nor Unicode white space (what
/// the domain's checks call blank), and no NUL anywhere.
const NOT_BLANK: &str = r"^[^\u0000]*[^\u0000\t\n\u000b\u000c\r \u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000][^\u0000]*$";

/// `role` of a launch: empty (none), or text within its bound; or null.
fn role_schema() -> Object {
    use atasira_domain::worker::ROLE_CHARS;
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
        .pattern(Some(format!("^$|{NOT_BLANK}")))
        .max_length(Some(ROLE_CHARS))
        .build()
}

/// `labels` of a launch: a few keys of text, each holding text; or null.
fn labels_schema() -> Object {
    use atasira_domain::worker::{LABEL_KEY_CHARS, LABEL_VALUE_CHARS, LABELS};
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .property_names(Some(string().pattern(Some(NOT_BLANK)).max_length(Some(LABEL_KEY_CHARS))))
        .additional_properties(Some(string().pattern(Some(NUL_FREE)).max_length(Some(LABEL_VALUE_CHARS))))
        .max_properties(Some(LABELS))
        .build()
}

/// One kind of segment: `kind` one of `kinds`, `value` text within `chars`, nothing else.
fn segment_schema(kinds: &[&str], chars: usize) -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::Type(Type::Object))
        .property("kind", string().enum_values(Some(kinds.to_vec())))
        .required("kind")
        .property("value", string().pattern(Some(NOT_BLANK)).max_length(Some(chars)))
        .required("value")
        .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
        .build()
}

/// `input` of a launch: 1 to 64 segments.
fn input_schema() -> impl Into<RefOr<Schema>> {
    use atasira_domain::worker::{INPUT_SEGMENTS, SEGMENT_REF_CHARS, SEGMENT_TEXT_CHARS};
    let segment = OneOfBuilder::new()
        .item(segment_schema(&["text"], SEGMENT_TEXT_CHARS))
        .item(segment_schema(&["ticket_ref", "objective_ref"], SEGMENT_REF_CHARS))
        .description(Some("A segment: `text`, or a reference to a ticket or an objective. There is no `system` segment."));
    ArrayBuilder::new().items(segment).min_items(Some(1)).max_items(Some(INPUT_SEGMENTS))
}

/// The box_type pattern, reserved words excluded.
fn box_type_schema() -> impl Into<RefOr<Schema>> {
    let reserved = RESERVED_BOX_TYPES.iter().map(|w| w.replace('-', "\\-")).collect::<Vec<_>>().join("|");
    let shape = BOX_TYPE_PATTERN.trim_start_matches('^');
    ObjectBuilder::new().schema_type(SchemaType::Type(Type::String)).pattern(Some(format!("^(?!(?:{reserved})$){shape}"))).max_length(Some(64))
}

fn os_operation_schema() -> ObjectBuilder {
    string().enum_values(Some(OSOperation::ALL.iter().map(|op| op.as_str())))
}

/// A list of OS operation names.
fn os_operations_schema() -> impl Into<RefOr<Schema>> {
    ArrayBuilder::new().items(os_operation_schema())
}

/// A list of OS operation names, or null.
fn os_operations_schema_nullable() -> impl Into<RefOr<Schema>> {
    ArrayBuilder::new().schema_type(SchemaType::from_iter([Type::Array, Type::Null])).items(os_operation_schema())
}

#[cfg(test)]
mod edit_tests {
    use super::CRON_PATTERN;

    #[test]
    fn the_documented_cron_form_is_always_a_valid_schedule() {
        // R-MAN-5: every expression of the form the OpenAPI document promises is taken:
        // per field `*`, `*/n` (minute, hour) or one value in the field's range. The fields
        // are independent, so each field's every alternative is tried with `*` elsewhere.
        let star = || std::iter::once("*".to_owned());
        let steps = |max: u32| (1..=max).map(|n| format!("*/{n}"));
        let values = |lo: u32, hi: u32| (lo..=hi).map(|n| n.to_string());
        let fields: [(Vec<String>, &str); 5] = [
            (star().chain(steps(59)).chain(values(0, 59)).collect(), r"(\*|\*/([1-9]|[1-5][0-9])|[0-9]|[1-5][0-9])"),
            (star().chain(steps(23)).chain(values(0, 23)).collect(), r"(\*|\*/([1-9]|1[0-9]|2[0-3])|[0-9]|1[0-9]|2[0-3])"),
            (star().chain(values(1, 31)).collect(), r"(\*|[1-9]|[12][0-9]|3[01])"),
            (star().chain(values(1, 12)).collect(), r"(\*|[1-9]|1[0-2])"),
            (star().chain(values(0, 6)).collect(), r"(\*|[0-6])"),
        ];
        let documented = fields.iter().map(|(_, p)| *p).collect::<Vec<_>>().join(" ");
        assert_eq!(CRON_PATTERN, format!("^$|^{documented}$"), "the pattern states exactly these fields");
        for (i, (alternatives, _)) in fields.iter().enumerate() {
            for value in alternatives {
                let mut parts = ["*"; 5];
                parts[i] = value;
                let expr = parts.join(" ");
                assert_eq!(atasira_domain::manifest::validate_cron(&expr), Ok(()), "{expr}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde::de::DeserializeOwned;
    use serde_json::json;

    use super::*;

    #[test]
    fn an_assertion_request_names_one_request_or_every_field_at_fault() {
        // R-AUTH-5: subject, message type and payload digest are required and checked
        let digest = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
        let ok = AssertionRequest {
            subject: "atasira.box.gateway.drafts".into(),
            message_type: "atasira.v1.ListPendingDrafts".into(),
            payload_sha256: digest.into(),
            correlation_id: Some("c1".into()),
            idempotency_key: None,
        };
        let binding = ok.binding().expect("valid");
        assert_eq!(
            (binding.subject.as_str(), binding.payload_sha256.to_hex().as_str(), binding.correlation_id.as_str()),
            ("atasira.box.gateway.drafts", digest, "c1")
        );
        for sender in std::iter::once(atasira_contracts::subjects::GATEWAY).chain(atasira_contracts::subjects::SERVICES.iter().copied()) {
            for to in atasira_contracts::subjects::SERVICES {
                let r = AssertionRequest { subject: format!("atasira.box.{sender}.{to}"), correlation_id: None, ..ok.clone() };
                assert!(r.binding().is_ok(), "{}", r.subject);
            }
        }
        let keys = |r: &AssertionRequest| r.binding().expect_err("refused").into_iter().map(|e| e.key).collect::<Vec<_>>();
        assert_eq!(keys(&AssertionRequest::default()), ["subject", "message_type", "payload_sha256"]);
        for subject in [
            "atasira.box.gateway.gateway",
            "atasira.box.client.drafts",
            "atasira.box.someone.drafts",
            "atasira.box.*.drafts",
            "atasira.box.gateway.drafts.x",
            "x",
        ] {
            assert_eq!(keys(&AssertionRequest { subject: subject.into(), ..ok.clone() }), ["subject"], "{subject}");
        }
        for message_type in
            ["ListPendingDrafts", "atasira.v1.", "atasira.v1.listPending", "atasira.v1.List.Pending", &format!("atasira.v1.A{}", "a".repeat(100))]
        {
            assert_eq!(keys(&AssertionRequest { message_type: message_type.into(), ..ok.clone() }), ["message_type"], "{message_type}");
        }
        for payload_sha256 in ["", "e3b0", &digest.to_uppercase(), &format!("{digest}00"), &"z".repeat(64)] {
            assert_eq!(keys(&AssertionRequest { payload_sha256: payload_sha256.into(), ..ok.clone() }), ["payload_sha256"], "{payload_sha256}");
        }
        // the envelope's idempotency key is bound too: visible ASCII, at most 255
        let keyed = AssertionRequest { idempotency_key: Some("retry-1".into()), ..ok.clone() };
        assert_eq!(keyed.binding().expect("valid").idempotency_key, "retry-1");
        assert_eq!(ok.binding().expect("valid").idempotency_key, "");
        for key in ["a b", "é", &"k".repeat(256)] {
            assert_eq!(keys(&AssertionRequest { idempotency_key: Some(key.into()), ..ok.clone() }), ["idempotency_key"], "{key}");
        }
    }

    /// Reading the API's JSON into the HTTP type and writing it again changes nothing.
    fn same<T: DeserializeOwned + Serialize>(value: Value) {
        let typed: T = serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{e}: {value}"));
        assert_eq!(serde_json::to_value(typed).expect("serializes"), value);
    }

    fn manifest() -> Value {
        json!({"box_type": "sales", "version": "1.0.0", "name": "", "description": "", "capabilities": [], "agent_kind": "worker",
            "resource_limits": {"cpu": 2}, "tool_policies": {}, "config_defaults": {"k": [1, "x"]}, "tools": ["Bash"], "os_operations": ["shell:exec"],
            "file_access": [], "network": "filtered", "url_allowlist": ["https://a"], "allowed_apps": [], "dangerous_tool_overrides": {"Bash": true},
            "trigger_type": "manual", "trigger_schedule": "", "trigger_event": "", "purpose": "p", "prohibited_actions": [],
            "loop_control": {"max_iterations": 30, "timeout_s": 300.0, "escalate_on_failure": true},
            "business_procedure": [{"step": 1, "description": "d", "tool": "t", "args_schema": {"a": "{k}"}}], "outputs": [],
            "llm": {"provider": "x", "min_tier": 2},
            "required_access": [{"type": "git_remote", "url": "u"}, {"type": "ssh_target", "host": "h", "user": "u", "port": 22},
                {"type": "netrc_entry", "machine": "m", "login": "l", "vault": "v", "item": "i"}],
            "credentials": {"allowed_vaults": ["v"], "token_env_var": ""},
            "shell": {"allowed_commands": [], "allowed_cwd": [], "require_approval_outside_allowlist": true},
            "notify": {"email": {"vault": "v", "item": "i", "recipients": [], "broadcast": false}},
            "browser": {"approval_required_selectors": [], "approval_required_text_patterns": []}})
    }

    fn draft(decision: Value, status: &str) -> Value {
        json!({"draft_id": "d", "box_type": "sales", "name": "", "purpose": "p", "os_operations": ["shell:exec"], "tools": [], "url_allowlist": [],
            "prohibited": [], "over_limit": true, "over_limit_ops": ["shell:exec"], "over_limit_tools": [], "warnings": ["w"], "requested_by": "agent",
            "status": status, "created_at": "2026-12-01T11:27:26.695062222Z", "network": "none", "file_access": [], "allowed_apps": [],
            "required_access": [], "decision": decision, "box_id": null})
    }

    #[test]
    fn drafts_read_and_write_unchanged() {
        let at = "2026-12-01T11:27:27.333043491Z";
        for (decision, status) in [
            (Value::Null, "pending_approval"),
            (json!({"by": "admin", "at": at, "approved": true}), "approved"),
            (json!({"by": "admin", "at": at, "approved": false, "reason": "no"}), "rejected"),
            (json!({"withdrawn_by": "agent", "at": at}), "withdrawn"),
            (json!({"at": at}), "expired"),
        ] {
            same::<DraftSummary>(draft(decision.clone(), status));
            let mut detail = draft(decision, status);
            detail["manifest"] = manifest();
            same::<DraftDetail>(detail);
        }
        same::<Approved>(json!({"draft_id": "d", "status": "active", "box_id": "b", "box_type": "sales", "approved_by": "admin", "approved_at": at}));
        same::<DraftStatusChanged>(json!({"draft_id": "d", "status": "rejected"}));
    }

    #[test]
    fn boxes_audit_rows_and_verification_read_and_write_unchanged() {
        let at = "2026-12-01T11:27:27.333043491Z";
        same::<BoxDetail>(json!({"box_id": "b", "box_type": "sales", "name": "", "state": "idle", "manifest_version": "1.0.0", "created_at": at,
            "draft_id": "d", "approved_by": "admin", "manifest": manifest(), "assignments": [{"user_id": "u", "role_in_box": "primary"}],
            "provisioning": [{"index": 0, "access": "git_remote u", "status": "provisioned", "detail": "ok", "attempts": 1, "at": at},
                {"index": 1, "access": "ssh_target u@h:22", "status": "failed", "reason": "down", "attempts": 5, "at": at}],
            "manifest_drift": false}));
        same::<BoxList>(
            json!({"boxes": [{"box_id": "b", "box_type": "sales", "name": "", "state": "idle", "manifest_version": "1.0.0", "created_at": at}], "next_cursor": "7"}),
        );
        same::<BoxList>(json!({"boxes": [], "next_cursor": null}));
        same::<BoxHistory>(json!({"box_id": "b", "entries": [
            {"event_id": "box/b/1", "at": at, "actor": "admin", "kind": "activated", "draft_id": "d", "box_type": "sales", "approved_by": "admin",
                "manifest_version": "1.0.0", "manifest_digest": "sha256:00", "approval_key_id": "approval-1"},
            {"event_id": "box/b/2", "at": at, "actor": "admin", "kind": "user_unassigned", "user_id": "u", "role_in_box": "member"},
            {"event_id": "box/b/3", "at": at, "actor": "admin", "kind": "config_edited", "changed_keys": ["trigger_schedule"], "manifest_version": "1.0.1"},
            {"event_id": "box/b/4", "at": at, "actor": "admin", "kind": "stopped", "state": "stopped"},
            {"event_id": "access/b/0/1", "at": at, "actor": "system", "kind": "access_provision_failed", "index": 0, "access": "git_remote u", "reason": "down", "attempts": 5}],
            "next_cursor": "0.12"}));
        same::<FeasibilityAnswer>(json!({"feasible": false, "available_operations": ["file:read"], "available_tools": ["Read"],
            "missing_capabilities": ["notify:email"], "required_approvals": ["x"], "summary": "s", "notes": [], "box_id": "b"}));
        same::<AuditRows>(json!({"rows": [{"seq": 1, "time": "2026-12-01T11:27:26.700Z", "action": "box_draft.create", "actor": "agent", "target": "d",
            "event_id": "draft/d/1", "payload_digest": "sha256:00", "key_id": "audit-1", "mac": "ab"}], "next_cursor": "1"}));
        same::<VerifyResult>(json!({"ok": true, "rows": 4}));
        same::<VerifyResult>(json!({"ok": false, "first_bad_seq": 3, "reason": "modified"}));
        same::<ErrorBody>(json!({"error": "invalid_query", "message": "m", "details": {"parameter": "since"}}));
        same::<ErrorBody>(json!({"error": "box_manifest_validation", "message": "m", "details": [{"key": "purpose", "message": "blank"}]}));
    }
}
