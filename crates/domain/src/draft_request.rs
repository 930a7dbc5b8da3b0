//! `BoxDraftCreateRequest` -> manifest (SPEC §3, seed 000 §1 Step 1): the pure part of
//! `POST /api/v1/boxes/box-drafts`, shared by REST, MCP and `atasira drafts preview`.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::bounds;
use crate::error::{ErrorCode, FieldError};
use crate::manifest::{BoxManifest, DEFAULT_VERSION, MAX_MANIFEST_BYTES};
use crate::os_operation::{OverLimit, over_limit};

/// The heading under which `success_criteria` are appended to `purpose` (R-DRAFT-6).
pub const SUCCESS_CRITERIA_HEADING: &str = "\n\n## Success criteria\n";

/// The body of a draft request. Every field is optional at this level so that a missing
/// `box_type` or `purpose` is a validation error naming the key, not a serde error; null
/// means "not given". Unknown fields are refused (R-DRAFT-14: no mass assignment).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoxDraftCreateRequest {
    #[serde(default)]
    pub box_type: Option<String>,
    #[serde(default)]
    pub purpose: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
    #[serde(default)]
    pub success_criteria: Option<Vec<String>>,
    #[serde(default)]
    pub os_operations: Option<Vec<String>>,
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    #[serde(default)]
    pub allowed_apps: Option<Vec<String>>,
    #[serde(default)]
    pub url_allowlist: Option<Vec<String>>,
    #[serde(default)]
    pub file_access: Option<Vec<String>>,
    #[serde(default)]
    pub prohibited_actions: Option<Vec<String>>,
    #[serde(default)]
    pub allow_network: Option<bool>,
    #[serde(default)]
    pub required_access: Option<Vec<Value>>,
}

/// A refusal of a draft request, with the code and status the spec gives it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DraftRequestError {
    /// 413 `payload_too_large`.
    #[error("request body is {size} bytes; the limit is {MAX_MANIFEST_BYTES} bytes")]
    TooLarge { size: usize },
    /// 400 `invalid_json`.
    #[error("request body is not valid JSON: {0}")]
    InvalidJson(String),
    /// 422 `invalid_request`: unknown fields or wrong types.
    #[error("request body does not match BoxDraftCreateRequest: {0}")]
    InvalidRequest(String),
    /// 403 `self_privilege_forbidden` (R-DRAFT-4).
    #[error("box_type {0:?} may not be drafted: it would grant the drafter admin privileges (INV-5)")]
    SelfPrivilege(String),
    /// 422 `box_manifest_validation` (R-DRAFT-2, -3, -5, -6).
    #[error("the draft does not make a valid manifest: {}", crate::error::joined(&.0))]
    Invalid(Vec<FieldError>),
}

impl DraftRequestError {
    pub fn code(&self) -> ErrorCode {
        match self {
            DraftRequestError::TooLarge { .. } => ErrorCode::PayloadTooLarge,
            DraftRequestError::InvalidJson(_) => ErrorCode::InvalidJson,
            DraftRequestError::InvalidRequest(_) => ErrorCode::InvalidRequest,
            DraftRequestError::SelfPrivilege(_) => ErrorCode::SelfPrivilegeForbidden,
            DraftRequestError::Invalid(_) => ErrorCode::BoxManifestValidation,
        }
    }
}

/// What a valid request becomes: the generated manifest and what the approver must see.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftPlan {
    pub manifest: BoxManifest,
    #[serde(flatten)]
    pub over_limit: OverLimit,
    pub warnings: Vec<String>,
    /// R-CHANGE-3: how many distinct human admins must approve it (0 or 1: one); the
    /// drafts service sets it for an over_limit draft from its setting.
    #[serde(skip)]
    pub approvals_required: u32,
    /// R-POLICY-1: the organisation's policy's verdict, set by the drafts service.
    #[serde(skip)]
    pub policy: Option<crate::org_policy::Verdict>,
}

impl BoxDraftCreateRequest {
    /// Parses a request body: size first, then JSON, then shape (R-DRAFT-14).
    pub fn from_json_bytes(bytes: &[u8]) -> Result<Self, DraftRequestError> {
        if bytes.len() > MAX_MANIFEST_BYTES {
            return Err(DraftRequestError::TooLarge { size: bytes.len() });
        }
        let value: Value = serde_json::from_slice(bytes).map_err(|e| DraftRequestError::InvalidJson(e.to_string()))?;
        Self::from_value(value)
    }

    /// Shape check of an already parsed JSON value.
    pub fn from_value(value: Value) -> Result<Self, DraftRequestError> {
        if !value.is_object() {
            return Err(DraftRequestError::InvalidRequest("expected a JSON object".into()));
        }
        serde_json::from_value(value).map_err(|e| DraftRequestError::InvalidRequest(e.to_string()))
    }

    /// The request's lists that become manifest keys of the same name.
    fn manifest_lists(&self) -> [(&'static str, &Option<Vec<String>>); 6] {
        [
            ("os_operations", &self.os_operations),
            ("tools", &self.tools),
            ("allowed_apps", &self.allowed_apps),
            ("url_allowlist", &self.url_allowlist),
            ("file_access", &self.file_access),
            ("prohibited_actions", &self.prohibited_actions),
        ]
    }

    /// The first key whose text holds a NUL character, if any.
    fn key_with_nul(&self) -> Option<String> {
        let texts = [("box_type", &self.box_type), ("purpose", &self.purpose), ("name", &self.name)];
        let lists = std::iter::once(("success_criteria", &self.success_criteria)).chain(self.manifest_lists());
        texts
            .into_iter()
            .find_map(|(key, text)| text.as_deref().is_some_and(|t| t.contains('\0')).then(|| key.to_owned()))
            .or_else(|| lists.into_iter().find_map(|(key, list)| list.as_deref()?.iter().position(|t| t.contains('\0')).map(|i| format!("{key}[{i}]"))))
            .or_else(|| {
                let entries = self.required_access.as_deref()?;
                entries.iter().enumerate().find_map(|(i, entry)| crate::error::nul_key(entry).map(|key| format!("required_access[{i}]{key}")))
            })
    }

    /// What a request must pass before anything is built from it, in the spec's order
    /// (403 before 422, R-DRAFT-14): no NUL character, not a self-privilege box_type, and
    /// every list and text within its bound (R-ARCH-6), so that no draft makes an event
    /// the bus cannot carry. The gateway asks it before forwarding; [`Self::plan`] starts
    /// with it, so a NATS publisher's request meets the same checks.
    pub fn check(&self) -> Result<(), DraftRequestError> {
        // Text holds no NUL character: no store keeps one, and no person types one.
        if let Some(key) = self.key_with_nul() {
            return Err(DraftRequestError::InvalidRequest(format!("{key}: text must not contain NUL characters")));
        }
        // R-DRAFT-4
        if let Some(bt) = self.box_type.as_deref()
            && crate::box_type::SELF_PRIVILEGE_BOX_TYPES.contains(&bt)
        {
            return Err(DraftRequestError::SelfPrivilege(bt.to_owned()));
        }
        let over = match serde_json::to_value(self) {
            Ok(Value::Object(obj)) => bounds::check(bounds::DRAFT_REQUEST, &obj),
            _ => Vec::new(),
        };
        if over.is_empty() { Ok(()) } else { Err(DraftRequestError::Invalid(over)) }
    }

    /// Builds the draft's manifest and verdicts. 403 before 422 (R-DRAFT-14).
    pub fn plan(&self) -> Result<DraftPlan, DraftRequestError> {
        self.check()?;
        let allow_network = self.allow_network.unwrap_or(false);
        let mut obj = Map::new();
        if let Some(bt) = &self.box_type {
            obj.insert("box_type".into(), Value::from(bt.clone()));
        }
        if let Some(purpose) = &self.purpose {
            obj.insert("purpose".into(), Value::from(purpose_with_criteria(purpose, self.success_criteria.as_deref().unwrap_or(&[]))));
        }
        obj.insert("version".into(), Value::from(DEFAULT_VERSION));
        obj.insert("name".into(), Value::from(self.name.clone().unwrap_or_default()));
        // R-DRAFT-7
        obj.insert("network".into(), Value::from(if allow_network { "filtered" } else { "none" }));
        obj.insert("trigger_type".into(), Value::from("manual"));
        for (key, list) in self.manifest_lists() {
            obj.insert(key.into(), Value::from(list.clone().unwrap_or_default()));
        }
        obj.insert("required_access".into(), Value::Array(self.required_access.clone().unwrap_or_default()));

        let loaded = BoxManifest::from_object(obj).map_err(|report| DraftRequestError::Invalid(report.errors))?;
        let manifest = loaded.manifest;
        let verdict = over_limit(&manifest.os_operations, &manifest.tools);
        let mut warnings = loaded.warnings;
        warnings.extend(draft_warnings(&manifest, allow_network, &verdict));
        Ok(DraftPlan { manifest, over_limit: verdict, warnings, approvals_required: 1, policy: None })
    }
}

/// R-DRAFT-6: `success_criteria` are not a manifest field; they are appended to `purpose`,
/// one line per (non-blank) item. A blank purpose stays blank so that validation names it.
pub fn purpose_with_criteria(purpose: &str, criteria: &[String]) -> String {
    let items: Vec<&str> = criteria.iter().map(|c| c.trim()).filter(|c| !c.is_empty()).collect();
    if purpose.trim().is_empty() || items.is_empty() {
        return purpose.to_owned();
    }
    let mut out = String::from(purpose);
    out.push_str(SUCCESS_CRITERIA_HEADING);
    out.push_str(&items.iter().map(|c| format!("- {c}")).collect::<Vec<_>>().join("\n"));
    out
}

/// Splits a purpose into its body and its success-criteria section (if any).
pub fn split_purpose(purpose: &str) -> (&str, Option<&str>) {
    match purpose.find(SUCCESS_CRITERIA_HEADING) {
        Some(at) => (&purpose[..at], Some(&purpose[at..])),
        None => (purpose, None),
    }
}

/// R-DRAFT-9, R-DRAFT-15: what is legal but likely wrong, and what the approver must know.
fn draft_warnings(manifest: &BoxManifest, allow_network: bool, verdict: &OverLimit) -> Vec<String> {
    let mut warnings = Vec::new();
    if !allow_network && !manifest.url_allowlist.is_empty() {
        warnings.push("url_allowlist is set but allow_network is false: network is none, so no listed host is reachable".into());
    }
    if allow_network && manifest.url_allowlist.is_empty() {
        warnings.push("allow_network is true but url_allowlist is empty: network is filtered and no host is reachable".into());
    }
    let uses_browser = manifest.os_operations.iter().any(|op| op.as_str().starts_with("browser:"));
    if uses_browser && !allow_network {
        warnings.push("browser operations are declared but allow_network is false: pages outside this machine cannot be reached".into());
    }
    if verdict.over_limit {
        let hits: Vec<&str> = verdict.over_limit_ops.iter().chain(&verdict.over_limit_tools).map(String::as_str).collect();
        warnings.push(format!("over_limit ({}): approval needs a second explicit confirmation (confirm_over_limit: true)", hits.join(", ")));
    }
    for access in &manifest.required_access {
        warnings.push(format!("required_access: once approved the Box gets external access: {}", access.describe()));
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(v: Value) -> BoxDraftCreateRequest {
        BoxDraftCreateRequest::from_value(v).expect("valid request shape")
    }

    fn invalid_keys(v: Value) -> Vec<String> {
        match request(v).plan() {
            Err(DraftRequestError::Invalid(errors)) => errors.into_iter().map(|e| e.key).collect(),
            other => panic!("expected a validation error, got {other:?}"),
        }
    }

    #[test]
    fn given_text_with_a_nul_character_when_planned_then_refused_naming_the_key() {
        // Whichever entry point it came through (NATS skips the gateway's own check).
        for (body, key) in [
            (json!({"box_type": "a", "purpose": "p\u{0}"}), "purpose"),
            (json!({"box_type": "a", "purpose": "p", "tools": ["Read", "B\u{0}"]}), "tools[1]"),
            (json!({"box_type": "a", "purpose": "p", "required_access": [{"type": "git_remote", "url": "u\u{0}"}]}), "required_access[0].url"),
        ] {
            match request(body).plan() {
                Err(e @ DraftRequestError::InvalidRequest(_)) => assert!(e.to_string().contains(key), "{e}"),
                other => panic!("{key}: {other:?}"),
            }
        }
    }

    #[test]
    fn given_the_seed_example_when_planned_then_a_manual_pending_manifest_results() {
        // R-DRAFT-1, R-DRAFT-6, R-DRAFT-7
        let plan = request(json!({
            "box_type": "sales-report", "name": "sales-report", "purpose": "週次売上レポートの自動作成",
            "success_criteria": ["毎週月曜にレポート生成", "エラー時は人間へ通知"],
            "os_operations": [], "tools": [], "url_allowlist": [], "allow_network": false, "prohibited_actions": []
        }))
        .plan()
        .expect("valid");
        let m = &plan.manifest;
        assert_eq!(m.purpose, "週次売上レポートの自動作成\n\n## Success criteria\n- 毎週月曜にレポート生成\n- エラー時は人間へ通知");
        assert_eq!(m.version, "1.0.0");
        assert_eq!(m.trigger_type, crate::manifest::TriggerType::Manual);
        assert_eq!(m.network, crate::manifest::Network::None);
        assert!(!plan.over_limit.over_limit);
        assert!(plan.warnings.iter().any(|w| w.contains("fail-closed")), "R-DRAFT-9: empty tools");
    }

    #[test]
    fn given_allow_network_true_then_network_is_filtered() {
        // R-DRAFT-7
        let plan = request(json!({"box_type": "a", "purpose": "p", "allow_network": true, "url_allowlist": ["example.com"]})).plan().expect("valid");
        assert_eq!(plan.manifest.network, crate::manifest::Network::Filtered);
    }

    #[test]
    fn given_admin_pm_then_403_before_any_validation() {
        // R-DRAFT-4, R-DRAFT-14 (403 before 422)
        let err = request(json!({"box_type": "admin-ops", "os_operations": ["bogus"]})).plan().expect_err("refused");
        assert_eq!(err.code(), ErrorCode::SelfPrivilegeForbidden);
        assert_eq!(err.code().http_status(), 403);
    }

    #[test]
    fn given_bad_box_types_then_422_naming_box_type() {
        // R-DRAFT-2, R-DRAFT-3
        assert_eq!(invalid_keys(json!({"box_type": "Bad Type", "purpose": "p"})), vec!["box_type"]);
        assert_eq!(invalid_keys(json!({"box_type": "heartbeat", "purpose": "p"})), vec!["box_type"]);
        assert_eq!(invalid_keys(json!({"box_type": "runtime-registry", "purpose": "p"})), vec!["box_type"]);
    }

    #[test]
    fn given_an_unknown_os_operation_then_422_naming_its_index() {
        // R-DRAFT-5
        assert_eq!(invalid_keys(json!({"box_type": "a", "purpose": "p", "os_operations": ["file:read", "file:delete"]})), vec!["os_operations[1]"]);
    }

    #[test]
    fn given_missing_or_blank_purpose_then_422_naming_purpose() {
        // R-DRAFT-6
        assert_eq!(invalid_keys(json!({"box_type": "a"})), vec!["purpose"]);
        assert_eq!(invalid_keys(json!({"box_type": "a", "purpose": "  ", "success_criteria": ["x"]})), vec!["purpose"]);
        assert_eq!(invalid_keys(json!({"purpose": "p"})), vec!["box_type"]);
    }

    #[test]
    fn given_over_limit_capabilities_then_the_hits_are_listed_and_warned() {
        // R-DRAFT-8
        let plan =
            request(json!({"box_type": "a", "purpose": "p", "os_operations": ["shell:exec", "file:read"], "tools": ["Bash", "Read"]})).plan().expect("valid");
        assert!(plan.over_limit.over_limit);
        assert_eq!(plan.over_limit.over_limit_ops, vec!["shell:exec"]);
        assert_eq!(plan.over_limit.over_limit_tools, vec!["Bash"]);
        assert!(plan.warnings.iter().any(|w| w.contains("confirm_over_limit")));
    }

    #[test]
    fn given_network_mismatches_then_warnings_explain() {
        // R-DRAFT-9
        let unreachable = request(json!({"box_type": "a", "purpose": "p", "tools": ["Read"], "url_allowlist": ["example.com"]})).plan().expect("valid");
        assert!(unreachable.warnings.iter().any(|w| w.contains("allow_network is false")));
        let empty = request(json!({"box_type": "a", "purpose": "p", "tools": ["Read"], "allow_network": true})).plan().expect("valid");
        assert!(empty.warnings.iter().any(|w| w.contains("url_allowlist is empty")));
    }

    #[test]
    fn given_required_access_then_each_is_named_in_a_warning_without_changing_over_limit() {
        // R-DRAFT-15
        let plan = request(json!({"box_type": "a", "purpose": "p", "tools": ["Read"], "required_access": [
            {"type": "git_remote", "url": "https://example.com/r.git"},
            {"type": "ssh_target", "host": "build", "user": "ci", "port": 2222}
        ]}))
        .plan()
        .expect("valid");
        assert!(!plan.over_limit.over_limit);
        assert!(plan.warnings.iter().any(|w| w.contains("git_remote https://example.com/r.git")));
        assert!(plan.warnings.iter().any(|w| w.contains("ssh_target ci@build:2222")));
    }

    #[test]
    fn given_every_key_at_its_bound_then_the_draft_is_planned() {
        // R-ARCH-6: the bounds leave room for real drafts; the event sizes are proven on a
        // real store in crates/drafts.
        for fill in ['a', 'あ', '😀', '\u{1}'] {
            let plan = request(bounds::draft_at_bounds(fill, None)).plan().unwrap_or_else(|e| panic!("{fill:?}: {e}"));
            assert_eq!(plan.manifest.required_access.len(), 16);
        }
    }

    #[test]
    fn given_one_key_over_its_bound_then_422_names_the_key_and_the_limit() {
        // R-ARCH-6: refused up front, whichever entry point (the gateway asks `check`, the
        // drafts service `plan`)
        let mut paths: Vec<&str> = bounds::DRAFT_REQUEST.iter().map(|(p, _)| *p).collect();
        paths.extend(["tools[]", "success_criteria[]", "url_allowlist[]"]);
        for path in paths {
            let body = bounds::draft_at_bounds('a', Some(path));
            let err = request(body).check().expect_err(path);
            assert_eq!(err.code(), ErrorCode::BoxManifestValidation, "{path}");
            let DraftRequestError::Invalid(errors) = &err else { panic!("{path}: {err:?}") };
            let key = path.split(['.', '[']).next().unwrap_or_default();
            assert!(!errors.is_empty() && errors.iter().all(|e| e.key.starts_with(key)), "{path}: {errors:?}");
            assert!(errors.iter().all(|e| e.message.contains("at most")), "{path}: {errors:?}");
        }
    }

    #[test]
    fn ten_thousand_required_access_entries_are_one_error_naming_the_key_and_its_limit() {
        // The issue's case: a ~340 KB draft whose event would be over 1 MiB
        let entries: Vec<Value> = (0..10_000).map(|i| json!({"type": "git_remote", "url": format!("https://git.example.com/team/repo-{i}.git")})).collect();
        let body = serde_json::to_vec(&json!({"box_type": "big", "purpose": "p", "required_access": entries})).expect("json");
        let err = BoxDraftCreateRequest::from_json_bytes(&body).expect("shape").plan().expect_err("refused");
        assert_eq!(err.code().http_status(), 422);
        let DraftRequestError::Invalid(errors) = &err else { panic!("{err:?}") };
        assert_eq!(errors.as_slice(), [FieldError::new("required_access", "has 10000 entries; at most 16 are allowed")]);
        // 403 still comes first (R-DRAFT-14)
        let admin = json!({"box_type": "admin-ops", "purpose": "p", "tools": vec!["t"; 1000]});
        assert_eq!(request(admin).check().map_err(|e| e.code()), Err(ErrorCode::SelfPrivilegeForbidden));
    }

    #[test]
    fn body_errors_have_their_own_codes() {
        // R-DRAFT-14
        assert_eq!(BoxDraftCreateRequest::from_json_bytes(b"{not json").expect_err("bad").code(), ErrorCode::InvalidJson);
        assert_eq!(BoxDraftCreateRequest::from_json_bytes(br#"{"box_type":"a","state":"active"}"#).expect_err("unknown").code(), ErrorCode::InvalidRequest);
        assert_eq!(BoxDraftCreateRequest::from_json_bytes(br#"{"box_type":5}"#).expect_err("type").code(), ErrorCode::InvalidRequest);
        assert_eq!(BoxDraftCreateRequest::from_json_bytes(b"[1]").expect_err("array").code(), ErrorCode::InvalidRequest);
        let big = vec![b' '; MAX_MANIFEST_BYTES + 1];
        assert_eq!(BoxDraftCreateRequest::from_json_bytes(&big).expect_err("big").code(), ErrorCode::PayloadTooLarge);
    }

    #[test]
    fn no_input_sets_anything_but_manual_pending_defaults() {
        // R-DRAFT-1: no field of the request can make the Box start on its own or change version
        assert!(BoxDraftCreateRequest::from_json_bytes(br#"{"box_type":"a","purpose":"p","trigger_type":"schedule"}"#).is_err());
        assert!(BoxDraftCreateRequest::from_json_bytes(br#"{"box_type":"a","purpose":"p","status":"active"}"#).is_err());
    }

    #[test]
    fn split_purpose_finds_the_criteria_section() {
        // R-DRAFT-6
        let full = purpose_with_criteria("do it", &["a".into(), " ".into()]);
        assert_eq!(full, "do it\n\n## Success criteria\n- a");
        assert_eq!(split_purpose(&full), ("do it", Some("\n\n## Success criteria\n- a")));
        assert_eq!(split_purpose("plain"), ("plain", None));
    }
}
