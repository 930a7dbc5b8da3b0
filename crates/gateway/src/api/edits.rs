//! Bodies of the edits after activation (mentor and config edits).

use super::*;

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
