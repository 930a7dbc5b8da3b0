//! Mentor edit (R-EDIT-1, R-EDIT-2; seed 000 §2.2): a human admin may change only the
//! Box's wording — purpose, success criteria, prohibited actions, business procedure.

use serde_json::{Map, Value};

use crate::draft_request::{purpose_with_criteria, split_purpose};
use crate::error::{ErrorCode, FieldError};
use crate::manifest::{BoxManifest, MANIFEST_KEYS};

/// R-EDIT-1: the only keys a mentor edit may carry.
pub const MENTOR_EDITABLE_KEYS: &[&str] = &["purpose", "success_criteria", "prohibited_actions", "business_procedure"];

/// R-EDIT-2: the seed's MENTOR_PROHIBITED_KEYS (15; `permissions` and `docspi` are not
/// manifest fields but are named so that an attempt is reported as prohibited).
pub const MENTOR_PROHIBITED_KEYS: &[&str] = &[
    "loop_control",
    "permissions",
    "llm",
    "tools",
    "os_operations",
    "url_allowlist",
    "trigger_event",
    "trigger_type",
    "outputs",
    "required_access",
    "docspi",
    "box_type",
    "version",
    "capabilities",
    "network",
];

/// The keys of one `business_procedure` step.
const PROCEDURE_STEP_KEYS: &[&str] = &["step", "description", "tool", "args_schema"];

/// Why a mentor edit is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MentorEditError {
    /// 403 and a security violation (R-EDIT-2): names every offending key. `not_editable`
    /// are manifest keys outside both lists (they belong to config edit or a new draft);
    /// `unknown` are keys of no manifest, top-level or nested (`business_procedure[0].x`).
    #[error("mentor edit may change only purpose, success_criteria, prohibited_actions and business_procedure; refused keys: {}", self.refused_keys().join(", "))]
    RefusedKeys { prohibited: Vec<String>, not_editable: Vec<String>, unknown: Vec<String> },
    /// 422: the edited manifest is invalid (wrong types, blank purpose).
    #[error("the edited manifest is invalid: {}", crate::error::joined(&.0))]
    Invalid(Vec<FieldError>),
}

impl MentorEditError {
    pub fn code(&self) -> ErrorCode {
        match self {
            MentorEditError::RefusedKeys { .. } => ErrorCode::MentorEditProhibitedKey,
            MentorEditError::Invalid(_) => ErrorCode::BoxManifestValidation,
        }
    }

    /// The keys at fault, each with why.
    pub fn field_errors(&self) -> Vec<FieldError> {
        match self {
            MentorEditError::RefusedKeys { prohibited, not_editable, unknown } => prohibited
                .iter()
                .map(|k| FieldError::new(k.as_str(), "may never be changed by a mentor edit"))
                .chain(not_editable.iter().map(|k| FieldError::new(k.as_str(), "is not the Box's wording: a mentor edit does not change it")))
                .chain(unknown.iter().map(|k| FieldError::new(k.as_str(), "is not a manifest key")))
                .collect(),
            MentorEditError::Invalid(errors) => errors.clone(),
        }
    }

    /// Every refused key, in the order prohibited, not editable, unknown.
    pub fn refused_keys(&self) -> Vec<String> {
        match self {
            MentorEditError::RefusedKeys { prohibited, not_editable, unknown } => prohibited.iter().chain(not_editable).chain(unknown).cloned().collect(),
            MentorEditError::Invalid(_) => Vec::new(),
        }
    }
}

/// Applies a mentor edit: the four keys replace their values (`success_criteria` replaces
/// the purpose's success-criteria section; an empty list removes it) and the version is
/// minor-bumped. Any other key refuses the whole edit, so nothing changes. An edit that
/// changes nothing returns the manifest as it is (no bump).
pub fn mentor_edit(manifest: &BoxManifest, patch: &Map<String, Value>) -> Result<BoxManifest, MentorEditError> {
    let (mut prohibited, mut not_editable, mut unknown) = (Vec::new(), Vec::new(), Vec::new());
    for key in patch.keys() {
        if MENTOR_EDITABLE_KEYS.contains(&key.as_str()) {
            continue;
        }
        if MENTOR_PROHIBITED_KEYS.contains(&key.as_str()) {
            prohibited.push(key.clone());
        } else if MANIFEST_KEYS.contains(&key.as_str()) {
            not_editable.push(key.clone());
        } else {
            unknown.push(key.clone());
        }
    }
    // Nested keys of no manifest: a step holds only its four keys (`args_schema` is free).
    if let Some(Value::Array(steps)) = patch.get("business_procedure") {
        for (i, step) in steps.iter().enumerate() {
            if let Value::Object(step) = step {
                unknown.extend(step.keys().filter(|k| !PROCEDURE_STEP_KEYS.contains(&k.as_str())).map(|k| format!("business_procedure[{i}].{k}")));
            }
        }
    }
    if !(prohibited.is_empty() && not_editable.is_empty() && unknown.is_empty()) {
        return Err(MentorEditError::RefusedKeys { prohibited, not_editable, unknown });
    }

    // A mentor edit's purpose and criteria have a draft's bounds (together they fit the
    // manifest's purpose).
    let wording: Map<String, Value> =
        patch.iter().filter(|(k, _)| matches!(k.as_str(), "purpose" | "success_criteria")).map(|(k, v)| (k.clone(), v.clone())).collect();
    let over = crate::bounds::check(crate::bounds::DRAFT_REQUEST, &wording);
    if !over.is_empty() {
        return Err(MentorEditError::Invalid(over));
    }
    let mut errors = Vec::new();
    for (key, value) in patch {
        if value.is_null() {
            errors.push(FieldError::new(key.as_str(), "must not be null (an empty list clears a list)"));
        }
    }
    if !errors.is_empty() {
        return Err(MentorEditError::Invalid(errors));
    }
    let current = split_purpose(&manifest.purpose);
    let body: String = match patch.get("purpose") {
        Some(Value::String(p)) => p.clone(),
        Some(other) => {
            errors.push(FieldError::new("purpose", format!("must be a string, found {other}")));
            String::new()
        }
        None => current.0.to_owned(),
    };
    if body.trim().is_empty() {
        errors.push(FieldError::new("purpose", "must not be blank"));
    }
    let purpose = match patch.get("success_criteria") {
        Some(v) => match serde_json::from_value::<Vec<String>>(v.clone()) {
            Ok(criteria) => purpose_with_criteria(&body, &criteria),
            Err(e) => {
                errors.push(FieldError::new("success_criteria", format!("must be a list of strings: {e}")));
                body
            }
        },
        None => format!("{body}{}", current.1.unwrap_or_default()),
    };
    if !errors.is_empty() {
        return Err(MentorEditError::Invalid(errors));
    }

    let mut obj = manifest.to_object();
    obj.insert("purpose".into(), Value::from(purpose));
    for key in ["prohibited_actions", "business_procedure"] {
        if let Some(v) = patch.get(key) {
            obj.insert(key.into(), v.clone());
        }
    }
    let unchanged = BoxManifest::from_object(obj.clone()).map(|l| l.manifest).map_err(|r| MentorEditError::Invalid(r.errors))?;
    if unchanged == *manifest {
        // Nothing to change: the same manifest, the same version (a repeated PUT is a no-op).
        return Ok(unchanged);
    }
    let version = manifest.bumped_minor_version().unwrap_or_else(|| manifest.version.clone());
    obj.insert("version".into(), Value::from(version));
    BoxManifest::from_object(obj).map(|l| l.manifest).map_err(|r| MentorEditError::Invalid(r.errors))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn manifest() -> BoxManifest {
        BoxManifest::from_yaml_str(
            "box_type: sales\nversion: 1.4.2\npurpose: \"Report sales.\\n\\n## Success criteria\\n- weekly\"\ntools: [Read]\nprohibited_actions: [never email customers]\n",
        )
        .expect("valid")
        .manifest
    }

    fn patch(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => panic!("patch must be an object"),
        }
    }

    #[test]
    fn given_the_four_keys_when_edited_then_they_merge_and_the_minor_version_bumps() {
        // R-EDIT-1
        let edited = mentor_edit(
            &manifest(),
            &patch(json!({
                "purpose": "Report sales and returns.",
                "success_criteria": ["every Monday", "errors escalate"],
                "prohibited_actions": ["never delete files"],
                "business_procedure": [{"step": 1, "description": "collect", "tool": "Read"}]
            })),
        )
        .expect("allowed");
        assert_eq!(edited.purpose, "Report sales and returns.\n\n## Success criteria\n- every Monday\n- errors escalate");
        assert_eq!(edited.prohibited_actions, vec!["never delete files"]);
        assert_eq!(edited.business_procedure.len(), 1);
        assert_eq!(edited.version, "1.5.0");
        assert_eq!(edited.tools, vec!["Read"], "nothing else changes");
    }

    #[test]
    fn given_only_purpose_then_the_existing_success_criteria_section_is_kept() {
        // R-EDIT-1
        let edited = mentor_edit(&manifest(), &patch(json!({"purpose": "New role."}))).expect("allowed");
        assert_eq!(edited.purpose, "New role.\n\n## Success criteria\n- weekly");
    }

    #[test]
    fn given_only_success_criteria_then_the_section_is_replaced() {
        // R-EDIT-1: success_criteria replaces the purpose's success-criteria section
        let edited = mentor_edit(&manifest(), &patch(json!({"success_criteria": ["daily"]}))).expect("allowed");
        assert_eq!(edited.purpose, "Report sales.\n\n## Success criteria\n- daily");
        let cleared = mentor_edit(&manifest(), &patch(json!({"success_criteria": []}))).expect("allowed");
        assert_eq!(cleared.purpose, "Report sales.");
    }

    #[test]
    fn given_any_prohibited_key_then_refused_naming_it() {
        // R-EDIT-2: each of the 15 keys
        assert_eq!(MENTOR_PROHIBITED_KEYS.len(), 15);
        for key in MENTOR_PROHIBITED_KEYS {
            let err = mentor_edit(&manifest(), &patch(json!({"purpose": "x", *key: "y"}))).expect_err("refused");
            assert_eq!(err.refused_keys(), vec![key.to_string()]);
            assert_eq!(err.code(), ErrorCode::MentorEditProhibitedKey);
            assert_eq!(err.code().http_status(), 403);
            assert!(err.code().is_security_violation());
        }
    }

    #[test]
    fn given_unknown_or_other_keys_then_refused_by_name() {
        // R-EDIT-2, R-MAN-4: the mentor path rejects unknown keys
        let err = mentor_edit(&manifest(), &patch(json!({"quality_gate": 1, "config_defaults": {}, "tools": []}))).expect_err("refused");
        assert_eq!(
            err,
            MentorEditError::RefusedKeys {
                prohibited: vec!["tools".into()],
                not_editable: vec!["config_defaults".into()],
                unknown: vec!["quality_gate".into()]
            }
        );
    }

    #[test]
    fn given_an_unknown_key_inside_a_step_then_refused_by_its_path() {
        // R-EDIT-2: unknown keys, nested ones too
        let err = mentor_edit(&manifest(), &patch(json!({"business_procedure": [{"step": 1, "tool": "Read", "os_operations": ["shell:exec"]}]})))
            .expect_err("refused");
        assert_eq!(err.refused_keys(), vec!["business_procedure[0].os_operations"]);
        assert_eq!(err.code(), ErrorCode::MentorEditProhibitedKey);
        // args_schema is free-form
        assert!(mentor_edit(&manifest(), &patch(json!({"business_procedure": [{"step": 1, "args_schema": {"anything": {"deep": 1}}}]}))).is_ok());
    }

    #[test]
    fn given_wording_over_a_drafts_bounds_then_invalid_naming_the_key() {
        // R-ARCH-6: the same bounds as a draft's purpose and success criteria
        let long = "x".repeat(crate::bounds::DRAFT_PURPOSE_CHARS + 1);
        let err = mentor_edit(&manifest(), &patch(json!({"purpose": long}))).expect_err("too long");
        assert_eq!(err.field_errors()[0].key, "purpose");
        let many: Vec<String> = (0..21).map(|i| format!("c{i}")).collect();
        let err = mentor_edit(&manifest(), &patch(json!({"success_criteria": many}))).expect_err("too many");
        assert_eq!(err.field_errors()[0].key, "success_criteria");
    }

    #[test]
    fn given_the_same_wording_again_then_nothing_changes() {
        // R-EDIT-1: a repeated PUT is a no-op (no second bump, success criteria not doubled)
        let once = mentor_edit(&manifest(), &patch(json!({"success_criteria": ["daily"]}))).expect("allowed");
        let twice = mentor_edit(&once, &patch(json!({"success_criteria": ["daily"]}))).expect("allowed");
        assert_eq!(twice, once);
        assert_eq!(twice.purpose.matches("## Success criteria").count(), 1);
    }

    #[test]
    fn given_a_blank_purpose_or_bad_types_then_invalid() {
        assert!(matches!(mentor_edit(&manifest(), &patch(json!({"prohibited_actions": null}))), Err(MentorEditError::Invalid(_))));
        // R-EDIT-1
        assert_eq!(mentor_edit(&manifest(), &patch(json!({"purpose": " "}))).expect_err("blank").code(), ErrorCode::BoxManifestValidation);
        assert!(matches!(mentor_edit(&manifest(), &patch(json!({"prohibited_actions": "x"}))), Err(MentorEditError::Invalid(_))));
        assert!(matches!(mentor_edit(&manifest(), &patch(json!({"success_criteria": [1]}))), Err(MentorEditError::Invalid(_))));
    }
}
