//! Change requests (R-CHANGE-1): a new manifest for an active or stopped Box, proposed as
//! a merge patch of its keys, approved by a human admin like a draft. Pure: the plan of a
//! change (the patched manifest with its major version bumped, what it adds and removes,
//! `over_limit` judged on what it adds) and the capability diff.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::manifest::BoxManifest;
use crate::os_operation::{OverLimit, over_limit};
use crate::{ErrorCode, FieldError, Refusing};

/// The manifest keys whose values are what a Box may do: a change request shows how each
/// changes.
pub const CAPABILITY_KEYS: &[&str] = &[
    "os_operations",
    "tools",
    "network",
    "url_allowlist",
    "shell",
    "browser",
    "credentials",
    "trigger_type",
    "trigger_event",
    "trigger_schedule",
    "outputs",
    "required_access",
    "file_access",
    "allowed_apps",
    "dangerous_tool_overrides",
];

/// What a change adds and removes, each entry `key: value` (nested keys dotted:
/// `shell.allowed_commands: git`), in the manifest's key order.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CapabilityDiff {
    pub added: Vec<String>,
    pub removed: Vec<String>,
}

impl CapabilityDiff {
    pub fn is_empty(&self) -> bool {
        self.added.is_empty() && self.removed.is_empty()
    }

    /// `+a +b -c`, or `no capability changes`.
    pub fn summary(&self) -> String {
        if self.is_empty() {
            return "no capability changes".to_owned();
        }
        let plus = self.added.iter().map(|a| format!("+{a}"));
        let minus = self.removed.iter().map(|r| format!("-{r}"));
        plus.chain(minus).collect::<Vec<_>>().join(", ")
    }
}

/// The capability diff of `before` -> `after`.
pub fn capability_diff(before: &BoxManifest, after: &BoxManifest) -> CapabilityDiff {
    let (b, a) = (before.to_object(), after.to_object());
    let mut diff = CapabilityDiff::default();
    for key in CAPABILITY_KEYS {
        let (old, new) = (entries(key, b.get(*key)), entries(key, a.get(*key)));
        let (old_set, new_set): (BTreeSet<&String>, BTreeSet<&String>) = (old.iter().collect(), new.iter().collect());
        diff.added.extend(new.iter().filter(|e| !old_set.contains(e)).cloned());
        diff.removed.extend(old.iter().filter(|e| !new_set.contains(e)).cloned());
    }
    diff
}

/// A value as `path: item` entries: one per list item, one per scalar, nested objects by
/// dotted path; empty values have none.
fn entries(path: &str, value: Option<&Value>) -> Vec<String> {
    match value {
        None | Some(Value::Null) => vec![],
        Some(Value::String(s)) if s.is_empty() => vec![],
        // A list of objects (required_access): one entry per object, as compact JSON.
        Some(Value::Array(items)) => items.iter().flat_map(|i| if i.is_object() { vec![format!("{path}: {i}")] } else { entries(path, Some(i)) }).collect(),
        Some(Value::Object(map)) => map.iter().flat_map(|(k, v)| entries(&format!("{path}.{k}"), Some(v))).collect(),
        Some(Value::String(s)) => vec![format!("{path}: {s}")],
        Some(other) => vec![format!("{path}: {other}")],
    }
}

/// A planned change: the manifest to approve (major version bumped), what it changes and
/// whether what it adds is over the limit.
#[derive(Debug, Clone, PartialEq)]
pub struct ChangePlan {
    pub manifest: BoxManifest,
    pub diff: CapabilityDiff,
    pub over_limit: OverLimit,
    /// R-CHANGE-3: how many distinct human admins must approve it (as for a draft).
    pub approvals_required: u32,
    /// R-POLICY-1: the organisation's policy's verdict, set by the drafts service.
    pub policy: Option<crate::org_policy::Verdict>,
}

/// Why a change cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChangeError {
    #[error("a change request is a JSON object of manifest keys")]
    NotAnObject,
    #[error("the change does not validate")]
    Invalid(Vec<FieldError>),
    #[error("the change changes nothing")]
    NoChange,
}

impl Refusing for ChangeError {
    fn error_code(&self) -> ErrorCode {
        match self {
            ChangeError::NotAnObject | ChangeError::NoChange => ErrorCode::InvalidRequest,
            ChangeError::Invalid(_) => ErrorCode::BoxManifestValidation,
        }
    }

    fn field_errors(&self) -> Vec<FieldError> {
        match self {
            ChangeError::Invalid(errors) => errors.clone(),
            _ => vec![],
        }
    }
}

/// `(current, merge patch) -> plan`: applies the RFC 7396 patch to the Box's current
/// manifest (any manifest key but `box_type` and `version`; `trigger_type` included), bumps
/// the major version and validates the result as a manifest.
pub fn plan_change(current: &BoxManifest, patch: &Value) -> Result<ChangePlan, ChangeError> {
    let Value::Object(patch_obj) = patch else { return Err(ChangeError::NotAnObject) };
    let mut invalid = Vec::new();
    // A whole manifest is a patch of every key: its box_type and version may stay as they are.
    let same = |key: &str, now: &str| patch_obj.get(key).is_some_and(|v| v.as_str() == Some(now));
    for key in patch_obj.keys() {
        match key.as_str() {
            "box_type" if !same("box_type", current.box_type.as_str()) => invalid.push(FieldError::new("box_type", "a change keeps the Box's box_type")),
            "version" if !same("version", &current.version) => {
                invalid.push(FieldError::new("version", "a change's version is the next major version, set by atasira"))
            }
            "box_type" | "version" => {}
            k if !crate::manifest::MANIFEST_KEYS.contains(&k) => invalid.push(FieldError::new(k, "is not a manifest key")),
            _ => {}
        }
    }
    // R-MAN-5: a schedule given is a schedule checked, whatever the trigger type.
    if let Some(Value::String(cron)) = patch_obj.get("trigger_schedule")
        && !cron.trim().is_empty()
        && let Err(message) = crate::manifest::validate_cron(cron)
    {
        invalid.push(FieldError::new("trigger_schedule", message));
    }
    if !invalid.is_empty() {
        return Err(ChangeError::Invalid(invalid));
    }
    let mut doc = Value::Object(current.to_object());
    json_patch::merge(&mut doc, patch);
    let Value::Object(mut obj) = doc else { return Err(ChangeError::NotAnObject) };
    obj.insert("version".into(), Value::from(next_major(&current.version)));
    let manifest = BoxManifest::from_object(obj).map_err(|r| ChangeError::Invalid(r.errors))?.manifest;
    let unchanged = |m: &BoxManifest| -> Map<String, Value> {
        let mut o = m.to_object();
        o.remove("version");
        o
    };
    if unchanged(&manifest) == unchanged(current) {
        return Err(ChangeError::NoChange);
    }
    let diff = capability_diff(current, &manifest);
    // Over the limit is judged on what the change adds: what was approved before stays.
    let verdict = over_limit(&manifest.os_operations, &manifest.tools);
    let had_ops: BTreeSet<String> = current.os_operations.iter().map(ToString::to_string).collect();
    let ops: Vec<String> = verdict.over_limit_ops.into_iter().filter(|o| !had_ops.contains(o)).collect();
    let tools: Vec<String> = verdict.over_limit_tools.into_iter().filter(|t| !current.tools.contains(t)).collect();
    let over_limit = OverLimit { over_limit: !ops.is_empty() || !tools.is_empty(), over_limit_ops: ops, over_limit_tools: tools };
    Ok(ChangePlan { manifest, diff, over_limit, approvals_required: 1, policy: None })
}

/// `2.3.1` -> `3.0.0`; a version that is not `major[.minor[.patch]]` becomes `2.0.0`.
pub fn next_major(version: &str) -> String {
    let major = version.split('.').next().and_then(|m| m.trim().parse::<u64>().ok()).unwrap_or(1);
    format!("{}.0.0", major.saturating_add(1))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::draft_request::BoxDraftCreateRequest;

    fn manifest() -> BoxManifest {
        let request = BoxDraftCreateRequest {
            box_type: Some("ops".into()),
            purpose: Some("p".into()),
            tools: Some(vec!["Read".into()]),
            os_operations: Some(vec!["file:read".into()]),
            ..Default::default()
        };
        request.plan().expect("plan").manifest
    }

    #[test]
    fn r_change_1_adding_shell_exec_is_a_major_change_over_the_limit_with_its_diff() {
        // given an approved Box that reads files
        let current = manifest();
        // when a change adds shell:exec and Bash, with the commands it may run
        let patch = json!({"os_operations": ["file:read", "shell:exec"], "tools": ["Read", "Bash"], "shell": {"allowed_commands": ["git"]}});
        let plan = plan_change(&current, &patch).expect("plan");
        // then the version's major is bumped, the diff says what is added, and only what is
        // added is over the limit
        assert_eq!(plan.manifest.version, next_major(&current.version));
        assert!(plan.diff.added.contains(&"os_operations: shell:exec".to_owned()), "{:?}", plan.diff);
        assert!(plan.diff.added.contains(&"tools: Bash".to_owned()), "{:?}", plan.diff);
        assert!(plan.diff.added.contains(&"shell.allowed_commands: git".to_owned()), "{:?}", plan.diff);
        assert!(plan.diff.removed.is_empty(), "{:?}", plan.diff);
        assert!(plan.over_limit.over_limit);
        assert_eq!(plan.over_limit.over_limit_ops, ["shell:exec"]);
    }

    #[test]
    fn r_change_1_a_narrowing_change_removes_and_a_trigger_change_is_a_change() {
        let current = manifest();
        let plan = plan_change(&current, &json!({"trigger_type": "schedule", "trigger_schedule": "0 9 * * 1"})).expect("plan");
        assert_eq!(plan.diff.added, ["trigger_type: schedule", "trigger_schedule: 0 9 * * 1"]);
        assert_eq!(plan.diff.removed, ["trigger_type: manual"]);
        assert!(!plan.over_limit.over_limit);
        let narrower = plan_change(&current, &json!({"tools": []})).expect("plan");
        assert_eq!(narrower.diff.removed, ["tools: Read"]);
        assert!(narrower.diff.added.is_empty());
    }

    #[test]
    fn r_change_1_a_change_keeps_the_box_type_and_must_change_something() {
        let current = manifest();
        let refused = plan_change(&current, &json!({"box_type": "other", "version": "9.0.0", "nope": 1})).expect_err("refused");
        let keys: Vec<String> = refused.field_errors().into_iter().map(|e| e.key).collect();
        assert_eq!(keys, ["box_type", "version", "nope"]);
        assert_eq!(plan_change(&current, &json!({})), Err(ChangeError::NoChange));
        // a whole manifest, as GET /boxes/{id} shows it, is a patch of every key
        let mut whole = current.to_object();
        whole.insert("tools".into(), json!(["Read", "Grep"]));
        let plan = plan_change(&current, &Value::Object(whole)).expect("a whole manifest");
        assert_eq!((plan.manifest.version.as_str(), plan.diff.added.clone()), ("2.0.0", vec!["tools: Grep".to_owned()]));
        assert_eq!(plan_change(&current, &json!([])), Err(ChangeError::NotAnObject));
        let invalid = plan_change(&current, &json!({"trigger_schedule": "every day"})).expect_err("invalid cron");
        assert_eq!(invalid.error_code(), ErrorCode::BoxManifestValidation);
    }

    #[test]
    fn versions_bump_their_major() {
        assert_eq!(next_major("1.0.0"), "2.0.0");
        assert_eq!(next_major("2.3.1"), "3.0.0");
        assert_eq!(next_major("x"), "2.0.0");
    }
}
