//! The manifest as the API shows it.

use super::*;

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
