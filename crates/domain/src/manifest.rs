//! `BoxManifest`: the one schema of every Box (SPEC §8, seed 000 §2), its YAML form,
//! validation that names the key, warnings for deprecated or ignored input, and the
//! effective tools union.
//!
//! Loading goes YAML -> generic JSON object -> key-by-key checks -> typed manifest, so that
//! every problem is reported against the key it concerns and all problems are reported at
//! once, not just the first serde error.

use std::collections::BTreeMap;

use croner::parser::{CronParser, Seconds, Year};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::bounds;
use crate::box_type::BoxType;
use crate::error::FieldError;
use crate::os_operation::OSOperation;

/// SPEC §8: manifests (and request bodies) are at most 1 MiB; larger input is refused
/// before parsing.
pub const MAX_MANIFEST_BYTES: usize = 1024 * 1024;

/// The default `version` of a new manifest.
pub const DEFAULT_VERSION: &str = "1.0.0";

/// Every top-level key of the seed's schema, in the seed's order.
pub const MANIFEST_KEYS: &[&str] = &[
    "box_type",
    "version",
    "name",
    "description",
    "capabilities",
    "agent_kind",
    "resource_limits",
    "tool_policies",
    "config_defaults",
    "tools",
    "os_operations",
    "file_access",
    "network",
    "url_allowlist",
    "allowed_apps",
    "dangerous_tool_overrides",
    "trigger_type",
    "trigger_schedule",
    "trigger_event",
    "purpose",
    "prohibited_actions",
    "loop_control",
    "business_procedure",
    "outputs",
    "llm",
    "required_access",
    "credentials",
    "shell",
    "notify",
    "browser",
];

/// R-MAN-1: how the Box runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AgentKind {
    Dialog,
    #[default]
    Worker,
    Mentor,
    Custom,
}

/// R-MAN-1: how far the Box may reach on the network, from narrowest to widest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Network {
    #[default]
    None,
    Local,
    Filtered,
    Full,
}

/// R-MAN-1: what starts the Box. Drafts always start `manual`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TriggerType {
    #[default]
    Manual,
    Event,
    Schedule,
}

/// R-MAN-3: the loop limits, frozen when the engine starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoopControl {
    #[serde(default = "default_max_iterations", deserialize_with = "whole_number")]
    pub max_iterations: u32,
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    #[serde(default = "default_true")]
    pub escalate_on_failure: bool,
}

fn default_max_iterations() -> u32 {
    30
}
fn default_timeout_s() -> f64 {
    300.0
}
fn default_true() -> bool {
    true
}
fn default_version() -> String {
    DEFAULT_VERSION.to_owned()
}

impl Default for LoopControl {
    fn default() -> Self {
        Self { max_iterations: default_max_iterations(), timeout_s: default_timeout_s(), escalate_on_failure: true }
    }
}

/// One ordered step of `business_procedure`. `description` and string values inside
/// `args_schema` may hold `{key}` / `<key>` placeholders for `config_defaults` (R-MAN-6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcedureStep {
    #[serde(deserialize_with = "whole_number")]
    pub step: i64,
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub tool: String,
    #[serde(default)]
    pub args_schema: Map<String, Value>,
}

/// R-MAN-3: LLM routing. `phase` (deprecated) and `model` (dead) are dropped by the loader
/// with a warning, so they never reach this struct.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Llm {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<bool>,
    /// A tier name or number; kept as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_tier: Option<Value>,
}

/// R-PROV-1: an external resource the provisioner sets up after activation. Secrets are
/// never part of it: only vault and item names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum RequiredAccess {
    GitRemote {
        url: String,
    },
    SshTarget {
        host: String,
        user: String,
        #[serde(default = "default_ssh_port", deserialize_with = "whole_port")]
        port: u16,
    },
    NetrcEntry {
        machine: String,
        login: String,
        vault: String,
        item: String,
    },
}

/// The port of an `ssh_target` that names none.
pub const DEFAULT_SSH_PORT: u16 = 22;

pub fn default_ssh_port() -> u16 {
    DEFAULT_SSH_PORT
}

/// A port is a whole number, however written: JSON's `22.0` is the integer 22 (JSON Schema
/// agrees), and some JSON writers only write numbers that way.
/// A whole number as JSON Schema's `integer` has it: `3` or `3.0` (a number whose fraction is
/// zero), within the type's range.
pub fn whole_number<'de, D: serde::Deserializer<'de>, T: TryFrom<i64>>(d: D) -> Result<T, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    let whole = n.as_i64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && (i64::MIN as f64..i64::MAX as f64).contains(f)).map(|f| f as i64));
    whole.and_then(|i| T::try_from(i).ok()).ok_or_else(|| serde::de::Error::custom(format!("{n} is not a whole number in range")))
}

pub fn whole_port<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
    let n = f64::deserialize(d)?;
    if n.fract() == 0.0 && (0.0..=f64::from(u16::MAX)).contains(&n) {
        Ok(n as u16)
    } else {
        Err(serde::de::Error::custom(format!("port {n} is not a whole number from 0 to {}", u16::MAX)))
    }
}

impl RequiredAccess {
    /// The keys each kind of entry may carry; anything else (a `password`, say) is refused.
    fn allowed_keys(kind: &str) -> Option<&'static [&'static str]> {
        match kind {
            "git_remote" => Some(&["type", "url"]),
            "ssh_target" => Some(&["type", "host", "user", "port"]),
            "netrc_entry" => Some(&["type", "machine", "login", "vault", "item"]),
            _ => None,
        }
    }

    /// A one-line description for approvers and warnings (R-DRAFT-15).
    pub fn describe(&self) -> String {
        match self {
            RequiredAccess::GitRemote { url } => format!("git_remote {url}"),
            RequiredAccess::SshTarget { host, user, port } => format!("ssh_target {user}@{host}:{port}"),
            RequiredAccess::NetrcEntry { machine, login, vault, item } => {
                format!("netrc_entry {login}@{machine} (vault {vault}, item {item})")
            }
        }
    }
}

/// Gates `op:read`/`op:create` and `notify.*.vault` (R-MAN-7): names only, never secrets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Credentials {
    #[serde(default)]
    pub allowed_vaults: Vec<String>,
    #[serde(default)]
    pub token_env_var: String,
}

/// `shell:exec` limits; empty `allowed_commands` is fail-closed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shell {
    #[serde(default)]
    pub allowed_commands: Vec<String>,
    #[serde(default, deserialize_with = "one_or_many")]
    pub allowed_cwd: Vec<String>,
    #[serde(default = "default_true")]
    pub require_approval_outside_allowlist: bool,
}

impl Default for Shell {
    fn default() -> Self {
        Self { allowed_commands: Vec::new(), allowed_cwd: Vec::new(), require_approval_outside_allowlist: true }
    }
}

/// One notification channel (`email`, `line`). `item` names a vault item, not a secret.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifyChannel {
    #[serde(default)]
    pub vault: String,
    #[serde(default)]
    pub item: String,
    /// Non-empty: the only allowed recipients. Empty: any recipient given at call time.
    #[serde(default)]
    pub recipients: Vec<String>,
    /// LINE: deliver to every follower of the official account.
    #[serde(default)]
    pub broadcast: bool,
}

/// Code-level approval gates on `BrowserController.click`; empty = no approval needed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Browser {
    #[serde(default)]
    pub approval_required_selectors: Vec<String>,
    #[serde(default)]
    pub approval_required_text_patterns: Vec<String>,
}

fn one_or_many<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(s) => vec![s],
        OneOrMany::Many(v) => v,
    })
}

/// The manifest of one Box. Field names, types and defaults are the seed's (SPEC §8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoxManifest {
    pub box_type: BoxType,
    #[serde(default = "default_version")]
    pub version: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Informational tags; not enforced at runtime.
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub agent_kind: AgentKind,
    #[serde(default)]
    pub resource_limits: Map<String, Value>,
    #[serde(default)]
    pub tool_policies: Map<String, Value>,
    /// Operating parameters. Never dumped into the agent context (R-MAN-6); reach it only
    /// through `business_procedure` placeholders.
    #[serde(default)]
    pub config_defaults: Map<String, Value>,
    /// Declared tools (top-level `tools` plus folded legacy phase lists). The effective
    /// whitelist adds `os_operations`: see [`BoxManifest::effective_tools`].
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default)]
    pub os_operations: Vec<OSOperation>,
    #[serde(default)]
    pub file_access: Vec<String>,
    #[serde(default)]
    pub network: Network,
    #[serde(default)]
    pub url_allowlist: Vec<String>,
    #[serde(default)]
    pub allowed_apps: Vec<String>,
    #[serde(default)]
    pub dangerous_tool_overrides: BTreeMap<String, bool>,
    #[serde(default)]
    pub trigger_type: TriggerType,
    #[serde(default)]
    pub trigger_schedule: String,
    #[serde(default)]
    pub trigger_event: String,
    /// The standing role, the one trusted path into the system prompt.
    pub purpose: String,
    #[serde(default)]
    pub prohibited_actions: Vec<String>,
    #[serde(default)]
    pub loop_control: LoopControl,
    #[serde(default)]
    pub business_procedure: Vec<ProcedureStep>,
    #[serde(default)]
    pub outputs: Vec<String>,
    #[serde(default)]
    pub llm: Llm,
    #[serde(default)]
    pub required_access: Vec<RequiredAccess>,
    #[serde(default)]
    pub credentials: Credentials,
    #[serde(default)]
    pub shell: Shell,
    #[serde(default)]
    pub notify: BTreeMap<String, NotifyChannel>,
    #[serde(default)]
    pub browser: Browser,
}

/// A manifest that passed validation, with what is legal but worth a look.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub manifest: BoxManifest,
    pub warnings: Vec<String>,
}

/// Everything wrong with a manifest, each naming its key, plus the warnings seen so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ValidationReport {
    pub errors: Vec<FieldError>,
    pub warnings: Vec<String>,
}

/// Why a manifest could not be loaded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LoadError {
    /// Refused before parsing (SPEC §8).
    #[error("manifest is {size} bytes; the limit is {MAX_MANIFEST_BYTES} bytes")]
    TooLarge { size: usize },
    #[error("manifest is not UTF-8 text")]
    NotUtf8,
    #[error("manifest is not valid YAML: {0}")]
    Syntax(String),
    #[error("manifest must be a YAML mapping of keys, found {0}")]
    NotAMapping(&'static str),
    /// Parsed, but the content breaks the schema.
    #[error("manifest is invalid: {}", crate::error::joined(&.0.errors))]
    Invalid(ValidationReport),
}

impl BoxManifest {
    /// Loads a manifest from raw bytes: size limit first, then UTF-8, then YAML.
    pub fn from_yaml_bytes(bytes: &[u8]) -> Result<Loaded, LoadError> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(LoadError::TooLarge { size: bytes.len() });
        }
        let text = std::str::from_utf8(bytes).map_err(|_| LoadError::NotUtf8)?;
        Self::from_yaml_str(text)
    }

    /// Loads a manifest from YAML text. An empty document is an empty mapping (and so
    /// misses `box_type` and `purpose`).
    pub fn from_yaml_str(text: &str) -> Result<Loaded, LoadError> {
        if text.len() > MAX_MANIFEST_BYTES {
            return Err(LoadError::TooLarge { size: text.len() });
        }
        let yaml: yaml_serde::Value = yaml_serde::from_str(text).map_err(|e| LoadError::Syntax(e.to_string()))?;
        let json = match yaml {
            yaml_serde::Value::Null => Value::Object(Map::new()),
            yaml_serde::Value::Mapping(_) => serde_json::to_value(&yaml).map_err(|e| LoadError::Syntax(format!("unsupported YAML content: {e}")))?,
            yaml_serde::Value::Sequence(_) => return Err(LoadError::NotAMapping("a sequence")),
            yaml_serde::Value::Tagged(_) => return Err(LoadError::NotAMapping("a tagged value")),
            _ => return Err(LoadError::NotAMapping("a scalar")),
        };
        match json {
            Value::Object(map) => Self::from_object(map).map_err(LoadError::Invalid),
            _ => Err(LoadError::NotAMapping("a scalar")),
        }
    }

    /// Validates a generic object (from YAML, JSON or a merge-patched manifest) key by key.
    /// Unknown top-level keys are ignored with a warning (R-MAN-4); legacy
    /// `permissions.tools.phase{1,2}_allowed` are folded into `tools` (R-MAN-2).
    pub fn from_object(mut obj: Map<String, Value>) -> Result<Loaded, ValidationReport> {
        let mut errors = Vec::new();
        let mut warnings = Vec::new();

        // Null means "not given": the default applies, as for an absent key.
        obj.retain(|_, v| !v.is_null());

        let legacy_tools = take_legacy_permissions(&mut obj, &mut errors, &mut warnings);
        take_llm_legacy(&mut obj, &mut warnings);

        let unknown: Vec<String> = obj.keys().filter(|k| !MANIFEST_KEYS.contains(&k.as_str())).cloned().collect();
        for key in unknown {
            obj.remove(&key);
            warnings.push(format!("unknown top-level key `{key}` is ignored"));
        }

        for required in ["box_type", "purpose"] {
            if !obj.contains_key(required) {
                errors.push(FieldError::new(required, "is required"));
            }
        }
        // Schema order, so that reports read like the manifest. A key over its bounds is
        // reported for that alone: its entries may be many and large.
        for key in MANIFEST_KEYS {
            if let Some(value) = obj.get(*key) {
                let over = bounds::check_key(bounds::MANIFEST, key, value);
                if over.is_empty() {
                    check_key(key, value, &mut errors);
                } else {
                    errors.extend(over);
                }
            }
        }
        if !errors.is_empty() {
            errors.extend(cross_key_errors_despite(&obj, &errors));
            return Err(ValidationReport { errors, warnings });
        }

        if !legacy_tools.is_empty() {
            let mut tools: Vec<String> = match obj.get("tools") {
                Some(v) => from_json(v).unwrap_or_default(),
                None => Vec::new(),
            };
            tools.extend(legacy_tools);
            obj.insert("tools".into(), Value::from(dedup(tools)));
        }

        let manifest: BoxManifest = match serde_json::from_value(Value::Object(obj)) {
            Ok(m) => m,
            Err(e) => {
                errors.push(FieldError::new("", e.to_string()));
                return Err(ValidationReport { errors, warnings });
            }
        };
        let mut errors = manifest.validate();
        let size = serde_json::to_vec(&manifest).map_or(usize::MAX, |json| json.len());
        if size > bounds::MAX_MANIFEST_JSON_BYTES {
            errors.push(FieldError::new("manifest", format!("is {size} bytes as JSON; at most {} are allowed", bounds::MAX_MANIFEST_JSON_BYTES)));
        }
        warnings.extend(manifest.warnings());
        if errors.is_empty() { Ok(Loaded { manifest, warnings }) } else { Err(ValidationReport { errors, warnings }) }
    }

    /// The manifest as YAML, every key written out.
    pub fn to_yaml(&self) -> String {
        // Serializing plain data with string keys into YAML cannot fail.
        yaml_serde::to_string(self).unwrap_or_default()
    }

    /// R-MAN-2: order-preserving, de-duplicated union of the declared tools and the
    /// os_operations. Empty means fail-closed: nothing is callable.
    pub fn effective_tools(&self) -> Vec<String> {
        dedup(self.tools.iter().cloned().chain(self.os_operations.iter().map(|op| op.as_str().to_owned())).collect())
    }

    /// The manifest as the runtime sees it: `tools` replaced by the effective union.
    pub fn effective(&self) -> BoxManifest {
        BoxManifest { tools: self.effective_tools(), ..self.clone() }
    }

    /// Cross-key rules of a typed manifest; each error names its key.
    pub fn validate(&self) -> Vec<FieldError> {
        let mut errors = Vec::new();
        if self.purpose.trim().is_empty() {
            errors.push(FieldError::new("purpose", "must not be blank"));
        }
        if parse_version(&self.version).is_none() {
            errors.push(FieldError::new("version", format!("{:?} is not a MAJOR.MINOR.PATCH version", self.version)));
        }
        if self.loop_control.max_iterations == 0 {
            errors.push(FieldError::new("loop_control.max_iterations", "must be at least 1"));
        }
        if !(self.loop_control.timeout_s.is_finite() && self.loop_control.timeout_s > 0.0) {
            errors.push(FieldError::new("loop_control.timeout_s", "must be a positive number of seconds"));
        }
        // R-MAN-5
        if self.trigger_type == TriggerType::Schedule
            && let Err(message) = validate_cron(&self.trigger_schedule)
        {
            errors.push(FieldError::new("trigger_schedule", message));
        }
        // R-TRIG-1: an event Box listens on one NATS subject of its own kind.
        if self.trigger_type == TriggerType::Event
            && !self.trigger_event.is_empty()
            && let Err(message) = validate_topic(&self.trigger_event)
        {
            errors.push(FieldError::new("trigger_event", message));
        }
        // R-MAN-7: the double gate.
        for (channel, cfg) in &self.notify {
            if !cfg.vault.is_empty() && !self.credentials.allowed_vaults.contains(&cfg.vault) {
                errors.push(FieldError::new(
                    format!("notify.{channel}.vault"),
                    format!("vault {:?} must also be listed in credentials.allowed_vaults", cfg.vault),
                ));
            }
        }
        errors
    }

    /// What is legal but likely wrong.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.effective_tools().is_empty() {
            warnings.push("effective tools are empty: the Box is fail-closed and can call nothing".to_owned());
        }
        if self.trigger_type == TriggerType::Event && self.trigger_event.trim().is_empty() {
            warnings.push("trigger_type is event but trigger_event is empty: nothing will start the Box".to_owned());
        }
        if self.trigger_type != TriggerType::Schedule && !self.trigger_schedule.is_empty() {
            warnings.push("trigger_schedule is set but trigger_type is not schedule: it is not used".to_owned());
        }
        if self.os_operations.contains(&OSOperation::ShellExec) && self.shell.allowed_commands.is_empty() {
            warnings.push("shell:exec is declared but shell.allowed_commands is empty: every command is refused".to_owned());
        }
        warnings
    }

    /// The version with its minor part bumped (`1.2.3` -> `1.3.0`), for mentor edits.
    pub fn bumped_minor_version(&self) -> Option<String> {
        let (major, minor, _) = parse_version(&self.version)?;
        Some(format!("{major}.{}.0", minor.checked_add(1)?))
    }

    /// `sha256:<hex>` over the canonical JSON of the manifest (object keys sorted), the
    /// digest an approval token binds (R-APPROVE-4).
    pub fn digest(&self) -> String {
        let value = serde_json::to_value(self).unwrap_or(Value::Null);
        let bytes = serde_json::to_vec(&canonical(value)).unwrap_or_default();
        crate::token::manifest_digest(&bytes)
    }

    /// The manifest as a JSON object (for merge patches and wire payloads).
    pub fn to_object(&self) -> Map<String, Value> {
        match serde_json::to_value(self) {
            Ok(Value::Object(map)) => map,
            _ => Map::new(),
        }
    }
}

/// The cross-key rules, checked on what remains once the keys that already failed fall
/// back to their defaults, so that one run reports every problem. Errors on keys that
/// already failed are not repeated.
fn cross_key_errors_despite(obj: &Map<String, Value>, known: &[FieldError]) -> Vec<FieldError> {
    let failed = |key: &str| known.iter().any(|e| top_key(&e.key) == key);
    let mut rest: Map<String, Value> = obj.iter().filter(|(k, _)| !failed(k)).map(|(k, v)| (k.clone(), v.clone())).collect();
    rest.entry("box_type").or_insert_with(|| Value::from("placeholder"));
    rest.entry("purpose").or_insert_with(|| Value::from("placeholder"));
    match serde_json::from_value::<BoxManifest>(Value::Object(rest)) {
        Ok(m) => m.validate().into_iter().filter(|e| !failed(top_key(&e.key))).collect(),
        Err(_) => Vec::new(),
    }
}

/// `notify.email.vault` -> `notify`, `os_operations[2]` -> `os_operations`.
fn top_key(key: &str) -> &str {
    key.split(['.', '[']).next().unwrap_or(key)
}

/// Sorts object keys recursively so that equal manifests give equal bytes whatever map
/// implementation serde_json is built with.
pub(crate) fn canonical(value: Value) -> Value {
    match value {
        Value::Object(map) => {
            let sorted: BTreeMap<String, Value> = map.into_iter().map(|(k, v)| (k, canonical(v))).collect();
            Value::Object(sorted.into_iter().collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(canonical).collect()),
        other => other,
    }
}

/// `MAJOR.MINOR.PATCH` with numeric parts.
fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let mut parts = v.split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    let patch = parts.next()?.parse().ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some((major, minor, patch))
}

/// R-MAN-5: a 5-field cron expression (croniter syntax: minute hour dom month dow).
pub fn validate_cron(expr: &str) -> Result<(), String> {
    let trimmed = expr.trim();
    if trimmed.is_empty() {
        return Err("is required when trigger_type is schedule (a 5-field cron expression such as \"*/15 * * * *\")".into());
    }
    if !trimmed.starts_with('@') && trimmed.split_whitespace().count() != 5 {
        return Err(format!("{expr:?} must have exactly 5 fields: minute hour day-of-month month day-of-week"));
    }
    CronParser::builder()
        .seconds(Seconds::Disallowed)
        .year(Year::Disallowed)
        .build()
        .parse(trimmed)
        .map(|_| ())
        .map_err(|e| format!("{expr:?} is not a valid cron expression: {e}"))
}

/// Most tokens a `trigger_event` topic may have.
pub const TOPIC_TOKENS: usize = 16;

/// R-TRIG-1: a `trigger_event` topic is a NATS subject a publisher may be granted: 1 to
/// [`TOPIC_TOKENS`] dot-separated tokens of letters, digits, `_` and `-` (no wildcard), not
/// in atasira's own namespace (`atasira.`), nor in NATS's (`$...`, `_INBOX.`).
pub fn validate_topic(topic: &str) -> Result<(), String> {
    let tokens: Vec<&str> = topic.split('.').collect();
    if topic.is_empty() || tokens.len() > TOPIC_TOKENS {
        return Err(format!("{topic:?} must be a NATS subject of 1 to {TOPIC_TOKENS} dot-separated tokens, such as \"sales.csv.arrived\""));
    }
    if let Some(bad) = tokens.iter().find(|t| t.is_empty() || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')) {
        return Err(format!("{topic:?}: the token {bad:?} must be letters, digits, '_' or '-' (no wildcards, no spaces)"));
    }
    if tokens[0] == "atasira" || tokens[0] == "_INBOX" {
        return Err(format!("{topic:?} is in a namespace atasira keeps for itself ({}.)", tokens[0]));
    }
    Ok(())
}

fn dedup(items: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(items.len());
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

fn from_json<T: DeserializeOwned>(v: &Value) -> Result<T, String> {
    T::deserialize(v).map_err(|e| e.to_string())
}

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// R-MAN-2: removes the legacy `permissions` block, returning `phase1_allowed` then
/// `phase2_allowed`; anything else in it is ignored with a warning.
fn take_legacy_permissions(obj: &mut Map<String, Value>, errors: &mut Vec<FieldError>, warnings: &mut Vec<String>) -> Vec<String> {
    let Some(permissions) = obj.remove("permissions") else { return Vec::new() };
    let mut out = Vec::new();
    let Value::Object(mut permissions) = permissions else {
        warnings.push("legacy `permissions` is not a mapping and is ignored".into());
        return out;
    };
    if let Some(Value::Object(mut tools)) = permissions.remove("tools") {
        for phase in ["phase1_allowed", "phase2_allowed"] {
            if let Some(v) = tools.remove(phase) {
                match from_json::<Vec<String>>(&v) {
                    Ok(list) => {
                        warnings.push(format!("permissions.tools.{phase} is deprecated: its tools are merged into `tools`; declare them there"));
                        out.extend(list);
                    }
                    Err(_) => errors.push(FieldError::new(format!("permissions.tools.{phase}"), format!("must be a list of strings, found {}", kind_of(&v)))),
                }
            }
        }
        for key in tools.keys() {
            warnings.push(format!("permissions.tools.{key} is ignored"));
        }
    }
    for key in permissions.keys() {
        warnings.push(format!("permissions.{key} is ignored"));
    }
    out
}

/// R-MAN-3: `llm.phase` is deprecated and `llm.model` is a dead field; both are dropped.
fn take_llm_legacy(obj: &mut Map<String, Value>, warnings: &mut Vec<String>) {
    if let Some(Value::Object(llm)) = obj.get_mut("llm") {
        if llm.remove("phase").is_some() {
            warnings.push("llm.phase is deprecated and ignored".into());
        }
        if llm.remove("model").is_some() {
            warnings.push("llm.model is ignored (dead field): choose provider and node instead".into());
        }
    }
}

/// Checks one known top-level key's type, pushing errors that name it.
fn check_key(key: &str, value: &Value, errors: &mut Vec<FieldError>) {
    let result: Result<(), String> = match key {
        "box_type" => match value {
            Value::String(s) => BoxType::parse(s).map(|_| ()).map_err(|e| e.to_string()),
            other => Err(format!("must be a string, found {}", kind_of(other))),
        },
        "version" | "name" | "description" | "trigger_schedule" | "trigger_event" | "purpose" => match value {
            Value::String(_) => Ok(()),
            other => Err(format!("must be a string, found {}", kind_of(other))),
        },
        "capabilities" | "tools" | "file_access" | "url_allowlist" | "allowed_apps" | "prohibited_actions" | "outputs" => {
            check_string_list(key, value, errors);
            Ok(())
        }
        "resource_limits" | "tool_policies" | "config_defaults" => match value {
            Value::Object(_) => Ok(()),
            other => Err(format!("must be a mapping, found {}", kind_of(other))),
        },
        "agent_kind" => from_json::<AgentKind>(value).map(|_| ()).map_err(|_| enum_message(value, "dialog, worker, mentor, custom")),
        "network" => from_json::<Network>(value).map(|_| ()).map_err(|_| enum_message(value, "none, local, filtered, full")),
        "trigger_type" => from_json::<TriggerType>(value).map(|_| ()).map_err(|_| enum_message(value, "manual, event, schedule")),
        "os_operations" => {
            check_os_operations(value, errors);
            Ok(())
        }
        "dangerous_tool_overrides" => from_json::<BTreeMap<String, bool>>(value).map(|_| ()),
        "loop_control" => from_json::<LoopControl>(value).map(|_| ()),
        "business_procedure" => {
            if let Value::Array(steps) = value {
                for (i, step) in steps.iter().enumerate() {
                    if let Err(e) = from_json::<ProcedureStep>(step) {
                        errors.push(FieldError::new(format!("business_procedure[{i}]"), e));
                    }
                }
                Ok(())
            } else {
                Err(format!("must be a list of steps, found {}", kind_of(value)))
            }
        }
        "llm" => from_json::<Llm>(value).map(|_| ()),
        "required_access" => {
            check_required_access(value, errors);
            Ok(())
        }
        "credentials" => from_json::<Credentials>(value).map(|_| ()),
        "shell" => from_json::<Shell>(value).map(|_| ()),
        "notify" => match value {
            Value::Object(channels) => {
                for (channel, cfg) in channels {
                    if let Err(e) = from_json::<NotifyChannel>(cfg) {
                        errors.push(FieldError::new(format!("notify.{channel}"), e));
                    }
                }
                Ok(())
            }
            other => Err(format!("must be a mapping of channels, found {}", kind_of(other))),
        },
        "browser" => from_json::<Browser>(value).map(|_| ()),
        _ => Ok(()),
    };
    if let Err(message) = result {
        errors.push(FieldError::new(key, message));
    }
}

fn enum_message(value: &Value, allowed: &str) -> String {
    match value {
        Value::String(s) => format!("{s:?} is not one of {allowed}"),
        other => format!("must be one of {allowed}, found {}", kind_of(other)),
    }
}

fn check_string_list(key: &str, value: &Value, errors: &mut Vec<FieldError>) {
    match value {
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                if !item.is_string() {
                    errors.push(FieldError::new(format!("{key}[{i}]"), format!("must be a string, found {}", kind_of(item))));
                }
            }
        }
        other => errors.push(FieldError::new(key, format!("must be a list of strings, found {}", kind_of(other)))),
    }
}

/// R-MAN-1, R-DRAFT-5: every entry must be an OSOperation.
fn check_os_operations(value: &Value, errors: &mut Vec<FieldError>) {
    let Value::Array(items) = value else {
        errors.push(FieldError::new("os_operations", format!("must be a list of OS operations, found {}", kind_of(value))));
        return;
    };
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::String(s) if OSOperation::parse(s).is_some() => {}
            Value::String(s) => errors.push(FieldError::new(format!("os_operations[{i}]"), format!("{s:?} is not an OSOperation"))),
            other => errors.push(FieldError::new(format!("os_operations[{i}]"), format!("must be a string, found {}", kind_of(other)))),
        }
    }
}

fn check_required_access(value: &Value, errors: &mut Vec<FieldError>) {
    let Value::Array(items) = value else {
        errors.push(FieldError::new("required_access", format!("must be a list, found {}", kind_of(value))));
        return;
    };
    for (i, item) in items.iter().enumerate() {
        let key = format!("required_access[{i}]");
        let Value::Object(entry) = item else {
            errors.push(FieldError::new(key, format!("must be a mapping, found {}", kind_of(item))));
            continue;
        };
        let kind = entry.get("type").and_then(Value::as_str).unwrap_or_default();
        let Some(allowed) = RequiredAccess::allowed_keys(kind) else {
            errors.push(FieldError::new(format!("{key}.type"), "must be one of git_remote, ssh_target, netrc_entry"));
            continue;
        };
        let mut ok = true;
        for field in entry.keys().filter(|k| !allowed.contains(&k.as_str())) {
            ok = false;
            errors.push(FieldError::new(
                format!("{key}.{field}"),
                format!("is not a key of {kind} (secrets are never stored in a manifest: name a vault and item instead)"),
            ));
        }
        if ok && let Err(e) = from_json::<RequiredAccess>(item) {
            errors.push(FieldError::new(key, e));
        }
    }
}

#[cfg(test)]
mod tests;
