//! Config edit (R-EDIT-3; seed 000 §3 box-fulfill): operating parameters change within the
//! approved capability. Anything that would widen capability needs a new C9 draft.

use serde_json::Value;

use crate::error::{ErrorCode, FieldError};
use crate::manifest::{BoxManifest, MANIFEST_KEYS, NotifyChannel, validate_cron};
use crate::os_operation::{Grants, OSOperation};
use crate::policy::mentor_edit::MENTOR_EDITABLE_KEYS;

/// R-EDIT-3: the top-level keys a config patch may touch.
pub const CONFIG_EDITABLE_KEYS: &[&str] = &["config_defaults", "trigger_schedule", "notify", "credentials", "shell", "browser"];

/// The hint every capability refusal carries.
pub const NEW_DRAFT_HINT: &str = "to change what the Box may do, request a change (POST /api/v1/boxes/{box_id}/change-requests) for a human admin to approve";

/// Why a config edit is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigEditError {
    /// 422: the patch is not a JSON object.
    #[error("a config patch must be a JSON object (RFC 7396 merge patch)")]
    NotAnObject,
    /// 403 `capability_change_requires_new_draft`, naming each key and why.
    #[error("a config edit may not make this change ({}); {NEW_DRAFT_HINT}", crate::error::joined(&.0))]
    CapabilityChange(Vec<FieldError>),
    /// 422: the patched manifest is invalid (bad cron, double gate, wrong types, keys
    /// that are no manifest key).
    #[error("the edited manifest is invalid: {}", crate::error::joined(&.0))]
    Invalid(Vec<FieldError>),
}

impl ConfigEditError {
    pub fn code(&self) -> ErrorCode {
        match self {
            ConfigEditError::NotAnObject => ErrorCode::InvalidRequest,
            ConfigEditError::CapabilityChange(_) => ErrorCode::CapabilityChangeRequiresNewDraft,
            ConfigEditError::Invalid(_) => ErrorCode::BoxManifestValidation,
        }
    }

    /// The keys at fault, each with why.
    pub fn field_errors(&self) -> Vec<FieldError> {
        match self {
            ConfigEditError::NotAnObject => Vec::new(),
            ConfigEditError::CapabilityChange(keys) | ConfigEditError::Invalid(keys) => keys.clone(),
        }
    }

    /// The keys a capability refusal names.
    pub fn keys(&self) -> Vec<&str> {
        match self {
            ConfigEditError::CapabilityChange(keys) => keys.iter().map(|k| k.key.as_str()).collect(),
            _ => Vec::new(),
        }
    }
}

/// `(approved, current, merge patch) -> manifest`: applies the RFC 7396 patch to the
/// editable keys of `current`, then checks that the result is valid and grants nothing
/// beyond what was approved. `approved` is the manifest the human admin's approval token
/// bound (the activation's); `current` the Box's manifest now.
pub fn config_edit(approved: &BoxManifest, current: &BoxManifest, patch: &Value) -> Result<BoxManifest, ConfigEditError> {
    let Value::Object(patch_obj) = patch else { return Err(ConfigEditError::NotAnObject) };
    let (mut refused, mut invalid) = (Vec::new(), Vec::new());
    for key in patch_obj.keys() {
        if CONFIG_EDITABLE_KEYS.contains(&key.as_str()) {
            continue;
        }
        if MENTOR_EDITABLE_KEYS.contains(&key.as_str()) {
            refused
                .push(FieldError::new(key.as_str(), "is the Box's wording: a human admin changes it with a mentor edit (PUT /api/v1/boxes/{box_id}/manifest)"));
        } else if MANIFEST_KEYS.contains(&key.as_str()) {
            refused.push(FieldError::new(key.as_str(), "is not an operating parameter: changing it changes what the Box may do"));
        } else {
            invalid.push(FieldError::new(key.as_str(), "is not a manifest key"));
        }
    }
    let grants = Grants::of(&current.os_operations, &current.tools);
    if patch_obj.contains_key("shell") && !grants.allows(OSOperation::ShellExec) {
        refused.push(FieldError::new("shell", "the Box has no approved shell:exec"));
    }
    if !refused.is_empty() {
        return Err(ConfigEditError::CapabilityChange(refused));
    }
    // R-MAN-5: a schedule given is a schedule checked, whatever the trigger type.
    if let Some(Value::String(cron)) = patch_obj.get("trigger_schedule")
        && !cron.trim().is_empty()
        && let Err(message) = validate_cron(cron)
    {
        invalid.push(FieldError::new("trigger_schedule", message));
    }
    if !invalid.is_empty() {
        return Err(ConfigEditError::Invalid(invalid));
    }

    let mut doc = Value::Object(current.to_object());
    json_patch::merge(&mut doc, patch);
    // What the patch asks for is judged first (403 before 422): a result whose values are
    // well typed, even if not yet valid (a vault outside allowed_vaults, say), is checked
    // for widening before the manifest's rules are.
    if let Ok(asked) = serde_json::from_value::<BoxManifest>(doc.clone()) {
        let wider = widened(approved, current, &asked);
        if !wider.is_empty() {
            return Err(ConfigEditError::CapabilityChange(wider));
        }
    }
    let Value::Object(obj) = doc else { return Err(ConfigEditError::NotAnObject) };
    let edited = BoxManifest::from_object(obj).map_err(|r| ConfigEditError::Invalid(r.errors))?.manifest;

    let wider = widened(approved, current, &edited);
    if wider.is_empty() { Ok(edited) } else { Err(ConfigEditError::CapabilityChange(wider)) }
}

/// Everything `after` may do that `approved` (or, for approval gates, `before`) did not
/// allow, each naming its key: empty means no wider.
fn widened(approved: &BoxManifest, before: &BoxManifest, after: &BoxManifest) -> Vec<FieldError> {
    let mut out = Vec::new();
    let mut refuse = |key: String, reason: String| out.push(FieldError::new(key, reason));

    // Keys outside the editable set cannot have changed: the patch was refused otherwise,
    // and merging never touches them. This guard keeps that true if the code above changes.
    let mut frozen_before = before.to_object();
    let mut frozen_after = after.to_object();
    for key in CONFIG_EDITABLE_KEYS {
        frozen_before.remove(*key);
        frozen_after.remove(*key);
    }
    if frozen_before != frozen_after {
        refuse("manifest".into(), "keys outside the operating parameters changed".into());
    }
    // The one capability rule (also draft-time over_limit): nothing newly granted.
    let granted = Grants::of(&approved.os_operations, &approved.tools);
    for name in granted.widened_by(&Grants::of(&after.os_operations, &after.tools)) {
        refuse("os_operations".into(), format!("{name} was not approved"));
    }

    for (channel, cfg) in &after.notify {
        match before.notify.get(channel) {
            None => {
                let op = format!("notify:{channel}");
                if !OSOperation::parse(&op).is_some_and(|op| granted.allows(op)) {
                    refuse(format!("notify.{channel}"), format!("the Box has no approved {op}"));
                }
            }
            Some(old) => check_channel(channel, old, cfg, &mut refuse),
        }
    }
    for vault in after.credentials.allowed_vaults.iter().filter(|v| !approved.credentials.allowed_vaults.contains(v)) {
        refuse("credentials.allowed_vaults".into(), format!("vault {vault:?} was not approved"));
    }

    if after.shell != before.shell {
        for command in after.shell.allowed_commands.iter().filter(|c| !approved.shell.allowed_commands.contains(c)) {
            refuse("shell.allowed_commands".into(), format!("{command:?} is beyond the approved shell:exec commands"));
        }
        for cwd in after.shell.allowed_cwd.iter().filter(|c| !approved.shell.allowed_cwd.iter().any(|a| within(c, a))) {
            refuse("shell.allowed_cwd".into(), format!("{cwd:?} is outside the approved shell:exec directories"));
        }
        if before.shell.require_approval_outside_allowlist && !after.shell.require_approval_outside_allowlist {
            refuse("shell.require_approval_outside_allowlist".into(), "turning off the approval gate widens shell:exec".into());
        }
    }
    let kept = |old: &[String], new: &[String]| old.iter().all(|o| new.contains(o));
    if !kept(&before.browser.approval_required_selectors, &after.browser.approval_required_selectors) {
        refuse("browser.approval_required_selectors".into(), "approval gates may only be added (tightening only)".into());
    }
    if !kept(&before.browser.approval_required_text_patterns, &after.browser.approval_required_text_patterns) {
        refuse("browser.approval_required_text_patterns".into(), "approval gates may only be added (tightening only)".into());
    }
    out
}

/// Whether directory `path` is `base` or below it (by whole path components).
fn within(path: &str, base: &str) -> bool {
    let base = base.trim_end_matches('/');
    let path = path.trim_end_matches('/');
    path == base || (path.starts_with(base) && path[base.len()..].starts_with('/')) || (base.is_empty() && path.starts_with('/'))
}

fn check_channel(channel: &str, old: &NotifyChannel, new: &NotifyChannel, refuse: &mut impl FnMut(String, String)) {
    if !old.recipients.is_empty() && new.recipients.is_empty() {
        refuse(format!("notify.{channel}.recipients"), "emptying the recipient allowlist lets the Box send to anyone".into());
    }
    if !old.broadcast && new.broadcast {
        refuse(format!("notify.{channel}.broadcast"), "broadcast sends to every follower".into());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn manifest() -> BoxManifest {
        BoxManifest::from_yaml_str(
            r##"
box_type: market-watch
purpose: Watch prices.
os_operations: [browser:navigate, browser:click, notify:email, shell:exec]
network: filtered
url_allowlist: [example.com]
trigger_type: schedule
trigger_schedule: "0 9 * * *"
config_defaults: {watch_items: [A1]}
credentials: {allowed_vaults: [ops]}
notify: {email: {vault: ops, item: smtp, recipients: [a@example.com]}}
shell: {allowed_commands: [ls], allowed_cwd: [/srv/reports]}
browser: {approval_required_selectors: ["#buy"]}
"##,
        )
        .expect("valid")
        .manifest
    }

    fn edit(patch: &Value) -> Result<BoxManifest, ConfigEditError> {
        config_edit(&manifest(), &manifest(), patch)
    }

    fn refused_key(patch: Value) -> String {
        match edit(&patch) {
            Err(e @ ConfigEditError::CapabilityChange(_)) => e.keys().join(","),
            other => panic!("expected a capability refusal, got {other:?}"),
        }
    }

    #[test]
    fn given_operating_parameters_when_patched_then_they_change() {
        // R-EDIT-3
        let edited = edit(&json!({
                "config_defaults": {"watch_items": ["A1", "B2"], "purchase_enabled": false},
                "trigger_schedule": "*/15 * * * *",
                "notify": {"email": {"recipients": ["a@example.com", "b@example.com"], "item": "smtp2"}},
                "credentials": {"allowed_vaults": ["ops"], "token_env_var": "OP_TOKEN"},
                "shell": {"allowed_commands": ["ls"], "allowed_cwd": ["/srv/reports/weekly"]},
                "browser": {"approval_required_selectors": ["#buy", "#pay"]}
        }))
        .expect("allowed");
        assert_eq!(edited.config_defaults["watch_items"], json!(["A1", "B2"]));
        assert_eq!(edited.trigger_schedule, "*/15 * * * *");
        assert_eq!(edited.notify["email"].recipients.len(), 2);
        assert_eq!(edited.notify["email"].vault, "ops", "merge keeps untouched fields");
        assert_eq!(edited.shell.allowed_cwd, vec!["/srv/reports/weekly"], "a directory below an approved one");
    }

    #[test]
    fn given_a_null_in_the_patch_then_the_key_is_removed() {
        // R-EDIT-3: RFC 7396 semantics
        let edited = edit(&json!({"config_defaults": {"watch_items": null}})).expect("allowed");
        assert!(edited.config_defaults.is_empty());
    }

    #[test]
    fn given_capability_keys_then_a_new_draft_is_required() {
        // R-EDIT-3
        assert_eq!(refused_key(json!({"os_operations": ["shell:exec", "file:write"]})), "os_operations");
        assert_eq!(refused_key(json!({"tools": ["Bash"]})), "tools");
        assert_eq!(refused_key(json!({"network": "full"})), "network");
        assert_eq!(refused_key(json!({"url_allowlist": ["evil.example"]})), "url_allowlist");
        assert_eq!(refused_key(json!({"trigger_type": "event"})), "trigger_type");
        assert_eq!(refused_key(json!({"purpose": "x", "name": "y"})), "purpose,name", "every key is named");
        let err = edit(&json!({"network": "full"})).expect_err("refused");
        assert_eq!(err.code(), ErrorCode::CapabilityChangeRequiresNewDraft);
        assert_eq!(err.code().http_status(), 403);
        assert!(err.to_string().contains("/change-requests"), "the refusal names the route of a change request");
    }

    #[test]
    fn given_widening_within_editable_keys_then_refused() {
        // R-EDIT-3: tightening only for browser gates; no new channels without the op
        assert_eq!(refused_key(json!({"browser": {"approval_required_selectors": []}})), "browser.approval_required_selectors");
        assert_eq!(refused_key(json!({"notify": {"line": {"item": "x"}}})), "notify.line");
        assert_eq!(refused_key(json!({"notify": {"email": {"recipients": []}}})), "notify.email.recipients");
        assert_eq!(refused_key(json!({"notify": {"email": {"broadcast": true}}})), "notify.email.broadcast");
        assert_eq!(refused_key(json!({"shell": {"require_approval_outside_allowlist": false}})), "shell.require_approval_outside_allowlist");
        assert_eq!(refused_key(json!({"shell": {"allowed_commands": ["ls", "rm"]}})), "shell.allowed_commands");
        assert_eq!(refused_key(json!({"shell": {"allowed_cwd": ["/"]}})), "shell.allowed_cwd");
        assert_eq!(refused_key(json!({"shell": {"allowed_cwd": ["/srv/reportsX"]}})), "shell.allowed_cwd");
        assert_eq!(refused_key(json!({"credentials": {"allowed_vaults": ["ops", "team"]}})), "credentials.allowed_vaults");
    }

    #[test]
    fn given_shell_without_shell_exec_then_refused() {
        // R-EDIT-3: shell only within an approved shell:exec
        let m = BoxManifest::from_yaml_str("box_type: a\npurpose: p\n").expect("valid").manifest;
        assert!(matches!(config_edit(&m, &m, &json!({"shell": {"allowed_commands": ["rm"]}})), Err(ConfigEditError::CapabilityChange(_))));
        // shell:exec named in tools is an approved shell:exec (one capability rule)
        let t = BoxManifest::from_yaml_str("box_type: a\npurpose: p\ntools: [shell:exec]\nshell: {allowed_commands: [ls, cat]}\n").expect("valid").manifest;
        assert!(config_edit(&t, &t, &json!({"shell": {"allowed_commands": ["ls"]}})).is_ok());
    }

    #[test]
    fn given_an_invalid_result_then_422_naming_the_key() {
        // R-EDIT-3 with R-MAN-5 and R-MAN-7
        let bad_cron = edit(&json!({"trigger_schedule": "soon"})).expect_err("invalid");
        assert_eq!(bad_cron.code(), ErrorCode::BoxManifestValidation);
        assert_eq!(bad_cron.field_errors()[0].key, "trigger_schedule");
        match edit(&json!({"notify": {"email": {"vault": "personal"}}})) {
            Err(ConfigEditError::Invalid(errors)) => assert_eq!(errors[0].key, "notify.email.vault"),
            other => panic!("expected the double gate, got {other:?}"),
        }
        assert_eq!(edit(&json!([1])).expect_err("array").code(), ErrorCode::InvalidRequest);
        // keys that are no manifest key, top-level or nested, are named
        assert_eq!(edit(&json!({"quality_gate": 1})).expect_err("unknown").field_errors()[0].key, "quality_gate");
        // a widening is named before the values are judged (403 before 422)
        assert_eq!(refused_key(json!({"notify": {"line": {"vault": "not-allowed"}}})), "notify.line");
        let nested = edit(&json!({"shell": {"sudo": true}})).expect_err("nested unknown");
        assert_eq!((nested.code(), nested.field_errors()[0].key.as_str()), (ErrorCode::BoxManifestValidation, "shell"));
    }

    #[test]
    fn given_an_edit_that_narrowed_then_the_approved_scope_may_be_taken_again() {
        // R-EDIT-3: the bound is what the admin approved, not the last edit
        let approved = manifest();
        let narrowed =
            config_edit(&approved, &approved, &json!({"shell": {"allowed_commands": []}, "credentials": {"allowed_vaults": ["ops"]}})).expect("narrowing");
        assert!(narrowed.shell.allowed_commands.is_empty());
        let again = config_edit(&approved, &narrowed, &json!({"shell": {"allowed_commands": ["ls"]}})).expect("within the approval");
        assert_eq!(again.shell.allowed_commands, vec!["ls"]);
    }
}
