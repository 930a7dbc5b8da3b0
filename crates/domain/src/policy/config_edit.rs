//! Config edit (R-EDIT-3; seed 000 §3 box-fulfill): operating parameters change within the
//! approved capability. Anything that would widen capability needs a new C9 draft.

use serde_json::Value;

use crate::error::{ErrorCode, FieldError};
use crate::manifest::{BoxManifest, NotifyChannel};
use crate::os_operation::OSOperation;

/// R-EDIT-3: the top-level keys a config patch may touch.
pub const CONFIG_EDITABLE_KEYS: &[&str] = &["config_defaults", "trigger_schedule", "notify", "credentials", "shell", "browser"];

/// The hint every capability refusal carries.
pub const NEW_DRAFT_HINT: &str = "submit a new draft (POST /api/v1/boxes/box-drafts) for a human admin to approve";

/// Why a config edit is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigEditError {
    /// 422: the patch is not a JSON object.
    #[error("a config patch must be a JSON object (RFC 7396 merge patch)")]
    NotAnObject,
    /// 403 `capability_change_requires_new_draft`, naming the key and why.
    #[error("{key}: {reason}; {NEW_DRAFT_HINT}")]
    CapabilityChange { key: String, reason: String },
    /// 422: the patched manifest is invalid (bad cron, double gate, wrong types).
    #[error("the edited manifest is invalid: {}", crate::error::joined(&.0))]
    Invalid(Vec<FieldError>),
}

impl ConfigEditError {
    pub fn code(&self) -> ErrorCode {
        match self {
            ConfigEditError::NotAnObject => ErrorCode::InvalidRequest,
            ConfigEditError::CapabilityChange { .. } => ErrorCode::CapabilityChangeRequiresNewDraft,
            ConfigEditError::Invalid(_) => ErrorCode::BoxManifestValidation,
        }
    }
}

fn refuse(key: impl Into<String>, reason: impl Into<String>) -> ConfigEditError {
    ConfigEditError::CapabilityChange { key: key.into(), reason: reason.into() }
}

/// `(manifest, merge patch) -> manifest`: applies the RFC 7396 patch to the editable keys,
/// then checks that no change widens capability and that the result is valid.
pub fn config_edit(manifest: &BoxManifest, patch: &Value) -> Result<BoxManifest, ConfigEditError> {
    let Value::Object(patch_obj) = patch else { return Err(ConfigEditError::NotAnObject) };
    for key in patch_obj.keys() {
        if !CONFIG_EDITABLE_KEYS.contains(&key.as_str()) {
            return Err(refuse(key.as_str(), "is not an operating parameter: changing it changes what the Box may do"));
        }
    }
    if patch_obj.contains_key("shell") && !manifest.os_operations.contains(&OSOperation::ShellExec) {
        return Err(refuse("shell", "the Box has no approved shell:exec"));
    }

    let mut doc = Value::Object(manifest.to_object());
    json_patch::merge(&mut doc, patch);
    let Value::Object(obj) = doc else { return Err(ConfigEditError::NotAnObject) };
    let edited = BoxManifest::from_object(obj).map_err(|r| ConfigEditError::Invalid(r.errors))?.manifest;

    check_not_wider(manifest, &edited)?;
    Ok(edited)
}

/// The capability checks: only the editable keys may differ, and they only within bounds.
fn check_not_wider(before: &BoxManifest, after: &BoxManifest) -> Result<(), ConfigEditError> {
    // Keys outside the editable set cannot have changed: the patch was refused otherwise,
    // and merging never touches them. This guard keeps that true if the code above changes.
    let mut frozen_before = before.to_object();
    let mut frozen_after = after.to_object();
    for key in CONFIG_EDITABLE_KEYS {
        frozen_before.remove(*key);
        frozen_after.remove(*key);
    }
    if frozen_before != frozen_after {
        return Err(refuse("manifest", "keys outside the operating parameters changed"));
    }

    for (channel, cfg) in &after.notify {
        match before.notify.get(channel) {
            None => {
                let op = format!("notify:{channel}");
                if !before.os_operations.iter().any(|o| o.as_str() == op) {
                    return Err(refuse(format!("notify.{channel}"), format!("the Box has no approved {op}")));
                }
            }
            Some(old) => check_channel(channel, old, cfg)?,
        }
    }
    if before.shell.require_approval_outside_allowlist && !after.shell.require_approval_outside_allowlist {
        return Err(refuse("shell.require_approval_outside_allowlist", "turning off the approval gate widens shell:exec"));
    }
    let tightened = |old: &[String], new: &[String]| old.iter().all(|o| new.contains(o));
    if !tightened(&before.browser.approval_required_selectors, &after.browser.approval_required_selectors) {
        return Err(refuse("browser.approval_required_selectors", "approval gates may only be added (tightening only)"));
    }
    if !tightened(&before.browser.approval_required_text_patterns, &after.browser.approval_required_text_patterns) {
        return Err(refuse("browser.approval_required_text_patterns", "approval gates may only be added (tightening only)"));
    }
    Ok(())
}

fn check_channel(channel: &str, old: &NotifyChannel, new: &NotifyChannel) -> Result<(), ConfigEditError> {
    if !old.recipients.is_empty() && new.recipients.is_empty() {
        return Err(refuse(format!("notify.{channel}.recipients"), "emptying the recipient allowlist lets the Box send to anyone"));
    }
    if !old.broadcast && new.broadcast {
        return Err(refuse(format!("notify.{channel}.broadcast"), "broadcast sends to every follower"));
    }
    Ok(())
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
shell: {allowed_commands: [ls]}
browser: {approval_required_selectors: ["#buy"]}
"##,
        )
        .expect("valid")
        .manifest
    }

    fn refused_key(patch: Value) -> String {
        match config_edit(&manifest(), &patch) {
            Err(ConfigEditError::CapabilityChange { key, .. }) => key,
            other => panic!("expected a capability refusal, got {other:?}"),
        }
    }

    #[test]
    fn given_operating_parameters_when_patched_then_they_change() {
        // R-EDIT-3
        let edited = config_edit(
            &manifest(),
            &json!({
                "config_defaults": {"watch_items": ["A1", "B2"], "purchase_enabled": false},
                "trigger_schedule": "*/15 * * * *",
                "notify": {"email": {"recipients": ["a@example.com", "b@example.com"], "item": "smtp2"}},
                "credentials": {"allowed_vaults": ["ops", "team"], "token_env_var": "OP_TOKEN"},
                "shell": {"allowed_commands": ["ls", "cat"]},
                "browser": {"approval_required_selectors": ["#buy", "#pay"]}
            }),
        )
        .expect("allowed");
        assert_eq!(edited.config_defaults["watch_items"], json!(["A1", "B2"]));
        assert_eq!(edited.trigger_schedule, "*/15 * * * *");
        assert_eq!(edited.notify["email"].recipients.len(), 2);
        assert_eq!(edited.notify["email"].vault, "ops", "merge keeps untouched fields");
        assert_eq!(edited.shell.allowed_commands, vec!["ls", "cat"]);
    }

    #[test]
    fn given_a_null_in_the_patch_then_the_key_is_removed() {
        // R-EDIT-3: RFC 7396 semantics
        let edited = config_edit(&manifest(), &json!({"config_defaults": {"watch_items": null}})).expect("allowed");
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
        let err = config_edit(&manifest(), &json!({"network": "full"})).expect_err("refused");
        assert_eq!(err.code(), ErrorCode::CapabilityChangeRequiresNewDraft);
        assert_eq!(err.code().http_status(), 403);
        assert!(err.to_string().contains("submit a new draft"));
    }

    #[test]
    fn given_widening_within_editable_keys_then_refused() {
        // R-EDIT-3: tightening only for browser gates; no new channels without the op
        assert_eq!(refused_key(json!({"browser": {"approval_required_selectors": []}})), "browser.approval_required_selectors");
        assert_eq!(refused_key(json!({"notify": {"line": {"item": "x"}}})), "notify.line");
        assert_eq!(refused_key(json!({"notify": {"email": {"recipients": []}}})), "notify.email.recipients");
        assert_eq!(refused_key(json!({"notify": {"email": {"broadcast": true}}})), "notify.email.broadcast");
        assert_eq!(refused_key(json!({"shell": {"require_approval_outside_allowlist": false}})), "shell.require_approval_outside_allowlist");
    }

    #[test]
    fn given_shell_without_shell_exec_then_refused() {
        // R-EDIT-3: shell only within an approved shell:exec
        let m = BoxManifest::from_yaml_str("box_type: a\npurpose: p\n").expect("valid").manifest;
        assert!(matches!(config_edit(&m, &json!({"shell": {"allowed_commands": ["rm"]}})), Err(ConfigEditError::CapabilityChange { .. })));
    }

    #[test]
    fn given_an_invalid_result_then_422_naming_the_key() {
        // R-EDIT-3 with R-MAN-5 and R-MAN-7
        let bad_cron = config_edit(&manifest(), &json!({"trigger_schedule": "soon"})).expect_err("invalid");
        assert_eq!(bad_cron.code(), ErrorCode::BoxManifestValidation);
        match config_edit(&manifest(), &json!({"notify": {"email": {"vault": "personal"}}})) {
            Err(ConfigEditError::Invalid(errors)) => assert_eq!(errors[0].key, "notify.email.vault"),
            other => panic!("expected the double gate, got {other:?}"),
        }
        assert_eq!(config_edit(&manifest(), &json!([1])).expect_err("array").code(), ErrorCode::InvalidRequest);
    }
}
