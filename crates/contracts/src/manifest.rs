//! The Box manifest and the draft request on the wire (`proto/atasira/v1/manifest.proto`):
//! conversions between the domain types and their protobuf messages, and between JSON
//! values and `google.protobuf.Struct`/`Value`, the protobuf form of the manifest's
//! free-form objects (R-ARCH-3).
//!
//! What a wire round trip does not keep, none of it a problem for manifests written by hand:
//! - `Struct` numbers are `f64`. On the way back a finite integral number within `i64`
//!   range becomes a JSON integer, so `{"n": 3}` comes back as `3`, not `3.0`; but a float
//!   with no fractional part (`2.0`) also comes back as the integer `2`, integers beyond
//!   2^53 lose precision, and non-finite numbers (which JSON cannot hold) become null.
//!   Where that happens the manifest's digest changes.
//! - `Struct` is a map: the key order of free-form objects is not kept (the digest sorts
//!   keys, so it does not depend on it).
//! - `llm.min_tier: null` reads as absent, as the YAML loader already does.
//!
//! From the wire, absent values mean the seed's defaults, as absent keys do in YAML:
//! unspecified enums (0) are `worker`, `none` and `manual`, an empty `version` is
//! [`DEFAULT_VERSION`], absent messages (`loop_control`, `llm`, `credentials`, `shell`,
//! `browser`) are their defaults, and an ssh_target port of 0 is 22.

use atasira_domain::box_type::BoxType;
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::manifest::{
    AgentKind, BoxManifest, Browser, Credentials, DEFAULT_VERSION, Llm, LoopControl, Network, NotifyChannel, ProcedureStep, RequiredAccess, Shell, TriggerType,
};
use atasira_domain::{ErrorCode, FieldError, OSOperation};
use prost_types::value::Kind;
use serde_json::{Map, Value, json};

use crate::v1;
use crate::v1::required_access::Kind as AccessKind;

/// The ssh port a `RequiredAccess.SshTarget` with port 0 (not given) stands for.
pub use atasira_domain::manifest::DEFAULT_SSH_PORT;

/// A wire value the domain cannot take, named by its key as the domain names keys
/// (`box_type`, `os_operations[1]`, `required_access[0].port`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidField(pub FieldError);

impl InvalidField {
    fn new(key: impl Into<String>, message: impl Into<String>) -> Self {
        Self(FieldError::new(key, message))
    }

    /// The same error, its key nested under `prefix` (`port` -> `required_access[0].port`).
    fn within(self, prefix: &str) -> Self {
        Self(FieldError::new(format!("{prefix}.{}", self.0.key), self.0.message))
    }

    pub fn code(&self) -> ErrorCode {
        ErrorCode::InvalidRequest
    }
}

impl atasira_domain::Refusing for InvalidField {
    fn error_code(&self) -> ErrorCode {
        self.code()
    }
    fn field_errors(&self) -> Vec<FieldError> {
        vec![self.0.clone()]
    }
}

// ---- JSON <-> google.protobuf.Value / Struct ----

/// A JSON value as a `google.protobuf.Value`. Numbers become `f64`.
pub fn value_to_proto(value: &Value) -> prost_types::Value {
    let kind = match value {
        Value::Null => Kind::NullValue(prost_types::NullValue::NullValue.into()),
        Value::Bool(b) => Kind::BoolValue(*b),
        // Without serde_json's arbitrary_precision every number has an f64 form.
        Value::Number(n) => n.as_f64().map_or(Kind::NullValue(prost_types::NullValue::NullValue.into()), Kind::NumberValue),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue { values: items.iter().map(value_to_proto).collect() }),
        Value::Object(map) => Kind::StructValue(struct_to_proto(map)),
    };
    prost_types::Value { kind: Some(kind) }
}

/// A `google.protobuf.Value` as JSON. A finite integral number within `i64` range becomes
/// a JSON integer (so `3` survives a round trip as `3`, not `3.0`); other finite numbers
/// stay floats; non-finite numbers and a value with no kind become null.
pub fn value_from_proto(value: prost_types::Value) -> Value {
    match value.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(b),
        Some(Kind::NumberValue(f)) => number_from_f64(f),
        Some(Kind::StringValue(s)) => Value::String(s),
        Some(Kind::ListValue(list)) => Value::Array(list.values.into_iter().map(value_from_proto).collect()),
        Some(Kind::StructValue(s)) => Value::Object(struct_from_proto(s)),
    }
}

fn number_from_f64(f: f64) -> Value {
    // i64::MIN as f64 is exactly -2^63 and i64::MAX as f64 rounds up to 2^63, so the range
    // is half-open; every integral f64 inside it converts to i64 exactly.
    if f.is_finite() && f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64 {
        return Value::from(f as i64);
    }
    serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)
}

/// A JSON object as a `google.protobuf.Struct`.
pub fn struct_to_proto(map: &Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct { fields: map.iter().map(|(k, v)| (k.clone(), value_to_proto(v))).collect() }
}

/// A `google.protobuf.Struct` as a JSON object, keys in sorted order; numbers as in
/// [`value_from_proto`].
pub fn struct_from_proto(s: prost_types::Struct) -> Map<String, Value> {
    s.fields.into_iter().map(|(k, v)| (k, value_from_proto(v))).collect()
}

fn object_from_proto(s: Option<prost_types::Struct>) -> Map<String, Value> {
    s.map(struct_from_proto).unwrap_or_default()
}

// ---- enums ----

fn agent_kind_to_proto(k: AgentKind) -> v1::AgentKind {
    match k {
        AgentKind::Dialog => v1::AgentKind::Dialog,
        AgentKind::Worker => v1::AgentKind::Worker,
        AgentKind::Mentor => v1::AgentKind::Mentor,
        AgentKind::Custom => v1::AgentKind::Custom,
    }
}

fn agent_kind_from_proto(v: i32) -> Result<AgentKind, InvalidField> {
    match v1::AgentKind::try_from(v) {
        Ok(v1::AgentKind::Unspecified) => Ok(AgentKind::default()),
        Ok(v1::AgentKind::Dialog) => Ok(AgentKind::Dialog),
        Ok(v1::AgentKind::Worker) => Ok(AgentKind::Worker),
        Ok(v1::AgentKind::Mentor) => Ok(AgentKind::Mentor),
        Ok(v1::AgentKind::Custom) => Ok(AgentKind::Custom),
        Err(_) => Err(unknown_enum("agent_kind", v, "dialog, worker, mentor, custom")),
    }
}

pub fn network_to_proto(n: Network) -> v1::Network {
    match n {
        Network::None => v1::Network::None,
        Network::Local => v1::Network::Local,
        Network::Filtered => v1::Network::Filtered,
        Network::Full => v1::Network::Full,
    }
}

fn network_from_proto(v: i32) -> Result<Network, InvalidField> {
    match v1::Network::try_from(v) {
        Ok(v1::Network::Unspecified) => Ok(Network::default()),
        Ok(v1::Network::None) => Ok(Network::None),
        Ok(v1::Network::Local) => Ok(Network::Local),
        Ok(v1::Network::Filtered) => Ok(Network::Filtered),
        Ok(v1::Network::Full) => Ok(Network::Full),
        Err(_) => Err(unknown_enum("network", v, "none, local, filtered, full")),
    }
}

fn trigger_type_to_proto(t: TriggerType) -> v1::TriggerType {
    match t {
        TriggerType::Manual => v1::TriggerType::Manual,
        TriggerType::Event => v1::TriggerType::Event,
        TriggerType::Schedule => v1::TriggerType::Schedule,
    }
}

fn trigger_type_from_proto(v: i32) -> Result<TriggerType, InvalidField> {
    match v1::TriggerType::try_from(v) {
        Ok(v1::TriggerType::Unspecified) => Ok(TriggerType::default()),
        Ok(v1::TriggerType::Manual) => Ok(TriggerType::Manual),
        Ok(v1::TriggerType::Event) => Ok(TriggerType::Event),
        Ok(v1::TriggerType::Schedule) => Ok(TriggerType::Schedule),
        Err(_) => Err(unknown_enum("trigger_type", v, "manual, event, schedule")),
    }
}

fn unknown_enum(key: &str, v: i32, allowed: &str) -> InvalidField {
    InvalidField::new(key, format!("{v} is not a known value: must be one of {allowed}"))
}

// ---- nested messages ----

impl From<&LoopControl> for v1::LoopControl {
    fn from(l: &LoopControl) -> Self {
        Self { max_iterations: l.max_iterations, timeout_s: l.timeout_s, escalate_on_failure: l.escalate_on_failure }
    }
}

impl From<v1::LoopControl> for LoopControl {
    fn from(l: v1::LoopControl) -> Self {
        Self { max_iterations: l.max_iterations, timeout_s: l.timeout_s, escalate_on_failure: l.escalate_on_failure }
    }
}

impl From<&ProcedureStep> for v1::ProcedureStep {
    fn from(s: &ProcedureStep) -> Self {
        Self { step: s.step, description: s.description.clone(), tool: s.tool.clone(), args_schema: Some(struct_to_proto(&s.args_schema)) }
    }
}

impl From<v1::ProcedureStep> for ProcedureStep {
    fn from(s: v1::ProcedureStep) -> Self {
        Self { step: s.step, description: s.description, tool: s.tool, args_schema: object_from_proto(s.args_schema) }
    }
}

impl From<&Llm> for v1::Llm {
    fn from(l: &Llm) -> Self {
        Self { provider: l.provider.clone(), node: l.node.clone(), required: l.required, min_tier: l.min_tier.as_ref().map(value_to_proto) }
    }
}

impl From<v1::Llm> for Llm {
    fn from(l: v1::Llm) -> Self {
        let min_tier = l.min_tier.map(value_from_proto).filter(|v| !v.is_null());
        Self { provider: l.provider, node: l.node, required: l.required, min_tier }
    }
}

impl From<&RequiredAccess> for v1::RequiredAccess {
    fn from(a: &RequiredAccess) -> Self {
        let kind = match a {
            RequiredAccess::GitRemote { url } => AccessKind::GitRemote(v1::required_access::GitRemote { url: url.clone() }),
            RequiredAccess::SshTarget { host, user, port } => {
                AccessKind::SshTarget(v1::required_access::SshTarget { host: host.clone(), user: user.clone(), port: u32::from(*port) })
            }
            RequiredAccess::NetrcEntry { machine, login, vault, item } => AccessKind::NetrcEntry(v1::required_access::NetrcEntry {
                machine: machine.clone(),
                login: login.clone(),
                vault: vault.clone(),
                item: item.clone(),
            }),
        };
        Self { kind: Some(kind) }
    }
}

/// Refuses an entry with no kind (key `type`, the seed's name for it) and a port above
/// 65535 (key `port`); port 0 is [`DEFAULT_SSH_PORT`].
impl TryFrom<v1::RequiredAccess> for RequiredAccess {
    type Error = InvalidField;

    fn try_from(a: v1::RequiredAccess) -> Result<Self, InvalidField> {
        match a.kind {
            None => Err(InvalidField::new("type", "is missing: must be one of git_remote, ssh_target, netrc_entry")),
            Some(AccessKind::GitRemote(g)) => Ok(RequiredAccess::GitRemote { url: g.url }),
            Some(AccessKind::SshTarget(s)) => {
                let port = match s.port {
                    0 => DEFAULT_SSH_PORT,
                    p => u16::try_from(p).map_err(|_| InvalidField::new("port", format!("{p} is not a TCP port (1-65535)")))?,
                };
                Ok(RequiredAccess::SshTarget { host: s.host, user: s.user, port })
            }
            Some(AccessKind::NetrcEntry(n)) => Ok(RequiredAccess::NetrcEntry { machine: n.machine, login: n.login, vault: n.vault, item: n.item }),
        }
    }
}

impl From<&Credentials> for v1::Credentials {
    fn from(c: &Credentials) -> Self {
        Self { allowed_vaults: c.allowed_vaults.clone(), token_env_var: c.token_env_var.clone() }
    }
}

impl From<v1::Credentials> for Credentials {
    fn from(c: v1::Credentials) -> Self {
        Self { allowed_vaults: c.allowed_vaults, token_env_var: c.token_env_var }
    }
}

impl From<&Shell> for v1::Shell {
    fn from(s: &Shell) -> Self {
        Self {
            allowed_commands: s.allowed_commands.clone(),
            allowed_cwd: s.allowed_cwd.clone(),
            require_approval_outside_allowlist: s.require_approval_outside_allowlist,
        }
    }
}

impl From<v1::Shell> for Shell {
    fn from(s: v1::Shell) -> Self {
        Self { allowed_commands: s.allowed_commands, allowed_cwd: s.allowed_cwd, require_approval_outside_allowlist: s.require_approval_outside_allowlist }
    }
}

impl From<&NotifyChannel> for v1::NotifyChannel {
    fn from(n: &NotifyChannel) -> Self {
        Self { vault: n.vault.clone(), item: n.item.clone(), recipients: n.recipients.clone(), broadcast: n.broadcast }
    }
}

impl From<v1::NotifyChannel> for NotifyChannel {
    fn from(n: v1::NotifyChannel) -> Self {
        Self { vault: n.vault, item: n.item, recipients: n.recipients, broadcast: n.broadcast }
    }
}

impl From<&Browser> for v1::Browser {
    fn from(b: &Browser) -> Self {
        Self { approval_required_selectors: b.approval_required_selectors.clone(), approval_required_text_patterns: b.approval_required_text_patterns.clone() }
    }
}

impl From<v1::Browser> for Browser {
    fn from(b: v1::Browser) -> Self {
        Self { approval_required_selectors: b.approval_required_selectors, approval_required_text_patterns: b.approval_required_text_patterns }
    }
}

// ---- the manifest ----

impl From<&BoxManifest> for v1::BoxManifest {
    fn from(m: &BoxManifest) -> Self {
        Self {
            box_type: m.box_type.as_str().to_owned(),
            version: m.version.clone(),
            name: m.name.clone(),
            description: m.description.clone(),
            capabilities: m.capabilities.clone(),
            agent_kind: agent_kind_to_proto(m.agent_kind).into(),
            resource_limits: Some(struct_to_proto(&m.resource_limits)),
            tool_policies: Some(struct_to_proto(&m.tool_policies)),
            config_defaults: Some(struct_to_proto(&m.config_defaults)),
            tools: m.tools.clone(),
            os_operations: m.os_operations.iter().map(|op| op.as_str().to_owned()).collect(),
            file_access: m.file_access.clone(),
            network: network_to_proto(m.network).into(),
            url_allowlist: m.url_allowlist.clone(),
            allowed_apps: m.allowed_apps.clone(),
            dangerous_tool_overrides: m.dangerous_tool_overrides.clone(),
            trigger_type: trigger_type_to_proto(m.trigger_type).into(),
            trigger_schedule: m.trigger_schedule.clone(),
            trigger_event: m.trigger_event.clone(),
            purpose: m.purpose.clone(),
            prohibited_actions: m.prohibited_actions.clone(),
            loop_control: Some((&m.loop_control).into()),
            business_procedure: m.business_procedure.iter().map(Into::into).collect(),
            outputs: m.outputs.clone(),
            llm: Some((&m.llm).into()),
            required_access: m.required_access.iter().map(Into::into).collect(),
            credentials: Some((&m.credentials).into()),
            shell: Some((&m.shell).into()),
            notify: m.notify.iter().map(|(k, v)| (k.clone(), v.into())).collect(),
            browser: Some((&m.browser).into()),
        }
    }
}

/// Checks what the types check (box_type, OS operations, enum values, ports) and fills in
/// the seed's defaults for what is absent; the cross-key rules stay with
/// [`BoxManifest::validate`].
impl TryFrom<v1::BoxManifest> for BoxManifest {
    type Error = InvalidField;

    fn try_from(m: v1::BoxManifest) -> Result<Self, InvalidField> {
        let box_type = BoxType::parse(&m.box_type).map_err(|e| InvalidField::new("box_type", e.to_string()))?;
        let os_operations = m
            .os_operations
            .iter()
            .enumerate()
            .map(|(i, s)| OSOperation::parse(s).ok_or_else(|| InvalidField::new(format!("os_operations[{i}]"), format!("{s:?} is not an OSOperation"))))
            .collect::<Result<Vec<_>, _>>()?;
        let required_access = m
            .required_access
            .into_iter()
            .enumerate()
            .map(|(i, a)| RequiredAccess::try_from(a).map_err(|e| e.within(&format!("required_access[{i}]"))))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(BoxManifest {
            box_type,
            version: if m.version.is_empty() { DEFAULT_VERSION.to_owned() } else { m.version },
            name: m.name,
            description: m.description,
            capabilities: m.capabilities,
            agent_kind: agent_kind_from_proto(m.agent_kind)?,
            resource_limits: object_from_proto(m.resource_limits),
            tool_policies: object_from_proto(m.tool_policies),
            config_defaults: object_from_proto(m.config_defaults),
            tools: m.tools,
            os_operations,
            file_access: m.file_access,
            network: network_from_proto(m.network)?,
            url_allowlist: m.url_allowlist,
            allowed_apps: m.allowed_apps,
            dangerous_tool_overrides: m.dangerous_tool_overrides,
            trigger_type: trigger_type_from_proto(m.trigger_type)?,
            trigger_schedule: m.trigger_schedule,
            trigger_event: m.trigger_event,
            purpose: m.purpose,
            prohibited_actions: m.prohibited_actions,
            loop_control: m.loop_control.map(Into::into).unwrap_or_default(),
            business_procedure: m.business_procedure.into_iter().map(Into::into).collect(),
            outputs: m.outputs,
            llm: m.llm.map(Into::into).unwrap_or_default(),
            required_access,
            credentials: m.credentials.map(Into::into).unwrap_or_default(),
            shell: m.shell.map(Into::into).unwrap_or_default(),
            notify: m.notify.into_iter().map(|(k, v)| (k, v.into())).collect(),
            browser: m.browser.map(Into::into).unwrap_or_default(),
        })
    }
}

// ---- the draft request ----

/// Empty strings and lists become absent, so that [`BoxDraftCreateRequest::plan`] names a
/// missing `box_type` or `purpose`; `allow_network: false` is absent (the domain's default
/// is false). Each `required_access` entry becomes the JSON object the domain validates;
/// one with no kind becomes `{}`, which the domain refuses as `required_access[i].type`.
impl From<v1::BoxDraftCreateRequest> for BoxDraftCreateRequest {
    fn from(r: v1::BoxDraftCreateRequest) -> Self {
        fn given(s: String) -> Option<String> {
            (!s.is_empty()).then_some(s)
        }
        fn listed(l: Vec<String>) -> Option<Vec<String>> {
            (!l.is_empty()).then_some(l)
        }
        Self {
            box_type: given(r.box_type),
            purpose: given(r.purpose),
            name: given(r.name),
            success_criteria: listed(r.success_criteria),
            os_operations: listed(r.os_operations),
            tools: listed(r.tools),
            allowed_apps: listed(r.allowed_apps),
            url_allowlist: listed(r.url_allowlist),
            file_access: listed(r.file_access),
            prohibited_actions: listed(r.prohibited_actions),
            allow_network: r.allow_network.then_some(true),
            required_access: (!r.required_access.is_empty()).then(|| r.required_access.iter().map(access_object).collect()),
        }
    }
}

/// A wire entry as the JSON object of the seed's schema; port 0 is left out so that the
/// domain's default applies.
fn access_object(a: &v1::RequiredAccess) -> Value {
    match &a.kind {
        None => json!({}),
        Some(AccessKind::GitRemote(g)) => json!({"type": "git_remote", "url": g.url}),
        Some(AccessKind::SshTarget(s)) => {
            let mut obj = json!({"type": "ssh_target", "host": s.host, "user": s.user});
            if s.port != 0 {
                obj["port"] = Value::from(s.port);
            }
            obj
        }
        Some(AccessKind::NetrcEntry(n)) => json!({"type": "netrc_entry", "machine": n.machine, "login": n.login, "vault": n.vault, "item": n.item}),
    }
}

#[cfg(test)]
mod tests;
