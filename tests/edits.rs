//! Edits after activation (SPEC §9) end to end, in embedded mode and as a cluster of
//! processes: the mentor edit `PUT /api/v1/boxes/{box_id}/manifest` (R-EDIT-1, R-EDIT-2),
//! the config edit `PATCH /api/v1/boxes/{box_id}/config` (R-EDIT-3), the one capability rule
//! drafts and edits share, the Box view and the manifest file following the edits
//! (R-BOX-2, R-BOX-9), security violations on the audit ledger (R-AUDIT-5), idempotent
//! retries and concurrent edits.
//!
//! One system per mode serves every row of the table.

use std::collections::BTreeSet;

use atasira_domain::BoxManifest;
use atasira_domain::policy::MENTOR_PROHIBITED_KEYS;
use atasira_tests::harness::{Answer, System, http, in_both_modes};
use serde_json::{Value, json};

const MERGE_PATCH: &str = "application/merge-patch+json";

/// A Box with browser clicks, e-mail notices and shell:exec approved.
fn main_box(box_type: &str) -> Value {
    json!({
        "box_type": box_type,
        "name": box_type,
        "purpose": "Watch prices and report.",
        "success_criteria": ["a report every Monday"],
        "os_operations": ["browser:navigate", "browser:click", "notify:email", "shell:exec"],
        "tools": ["Read"],
        "url_allowlist": ["example.com"],
        "allow_network": true,
        "prohibited_actions": ["never buy anything"]
    })
}

/// Activates a Box from `draft` (confirming over_limit); its id.
fn activate(sys: &System, draft: &Value) -> String {
    let id = sys.draft(draft);
    let a = sys.approve(&id, &sys.admin, true);
    assert_eq!(a.status, 200, "{:?}: {}", sys.mode, a.raw);
    a.body["box_id"].as_str().expect("box_id").to_owned()
}

fn mentor(sys: &System, token: &str, box_id: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
    http("PUT", &sys.url(&format!("/api/v1/boxes/{box_id}/manifest")), Some(token), headers, Some(body.to_string().as_bytes()))
}

fn config(sys: &System, token: &str, box_id: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
    let mut all = vec![("Content-Type", MERGE_PATCH)];
    all.extend_from_slice(headers);
    http("PATCH", &sys.url(&format!("/api/v1/boxes/{box_id}/config")), Some(token), &all, Some(body.to_string().as_bytes()))
}

/// The Box's manifest as `GET /boxes/{id}` shows it, and as its YAML file on disk holds it.
fn manifests(sys: &System, box_id: &str) -> (Value, Value) {
    let a = sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.agent);
    assert_eq!(a.status, 200, "{}", a.raw);
    let box_type = a.body["box_type"].as_str().expect("box_type");
    let yaml = std::fs::read_to_string(sys.data_dir().join(format!("manifests/{box_type}.yaml"))).expect("the manifest file");
    let on_disk = BoxManifest::from_yaml_str(&yaml).expect("the file is a manifest").manifest;
    (a.body["manifest"].clone(), Value::Object(on_disk.to_object()))
}

fn security_violations(sys: &System, box_id: &str) -> Vec<Value> {
    let a = sys.get(&format!("/api/v1/audit?action=security_violation&target={box_id}&limit=500"), &sys.admin);
    assert_eq!(a.status, 200, "{}", a.raw);
    a.body["rows"].as_array().cloned().unwrap_or_default()
}

fn ledger_rows(sys: &System, action: &str, box_id: &str) -> usize {
    let a = sys.get(&format!("/api/v1/audit?action={action}&target={box_id}&limit=500"), &sys.admin);
    assert_eq!(a.status, 200, "{}", a.raw);
    a.body["rows"].as_array().map_or(0, Vec::len)
}

/// The stored payload of the event a ledger row names.
fn payload_of(sys: &System, row: &Value) -> Value {
    let event_id = row["event_id"].as_str().expect("event_id");
    let mut parts = event_id.splitn(3, '/');
    let (kind, id) = (parts.next().expect("type"), parts.next().expect("id"));
    let text = sys.sql_text(&format!("SELECT CAST(payload AS TEXT) FROM events WHERE aggregate_type = '{kind}' AND aggregate_id = '{id}'"));
    serde_json::from_str(&text).expect("a JSON payload")
}

fn refused_keys(a: &Answer) -> Vec<String> {
    a.body["details"].as_array().map(|d| d.iter().filter_map(|e| e["key"].as_str().map(str::to_owned)).collect()).unwrap_or_default()
}

fn minor(version: &Value) -> u64 {
    version.as_str().and_then(|v| v.split('.').nth(1)).and_then(|m| m.parse().ok()).expect("MAJOR.MINOR.PATCH")
}

/// What a row expects.
#[derive(Debug)]
enum Outcome {
    /// 200, and the manifest (view and file) holds `value` at `pointer`.
    Changed(&'static str, Value),
    /// 403 with this code, naming these keys.
    Refused(&'static str, &'static [&'static str]),
    /// 422 naming this key.
    Invalid(&'static str),
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Edit {
    Mentor,
    Config,
}

/// One sample value of each manifest key that a draft does not already hold.
fn sample(key: &str) -> Value {
    match key {
        "box_type" => json!("other-type"),
        "version" => json!("9.0.0"),
        "name" | "description" | "trigger_event" => json!("changed"),
        "capabilities" | "file_access" | "allowed_apps" | "outputs" => json!(["x"]),
        "agent_kind" => json!("mentor"),
        "resource_limits" | "tool_policies" => json!({"cpu": 2}),
        "config_defaults" => json!({"watch_items": ["A1"]}),
        "tools" => json!(["Bash"]),
        "os_operations" => json!(["file:write"]),
        "network" => json!("full"),
        "url_allowlist" => json!(["evil.example"]),
        "dangerous_tool_overrides" => json!({"hotkey_quit": true}),
        "trigger_type" => json!("event"),
        "trigger_schedule" => json!("*/15 * * * *"),
        "purpose" => json!("Watch prices, report, and escalate."),
        "prohibited_actions" => json!(["never delete files"]),
        "loop_control" => json!({"max_iterations": 99}),
        "business_procedure" => json!([{"step": 1, "description": "collect {watch_items}", "tool": "Read"}]),
        "llm" => json!({"provider": "other"}),
        "required_access" => json!([{"type": "git_remote", "url": "https://example.com/x.git"}]),
        "credentials" => json!({"token_env_var": "OP_TOKEN"}),
        "shell" => json!({"require_approval_outside_allowlist": true}),
        "notify" => json!({"email": {"item": "smtp", "recipients": ["ops@example.com"]}}),
        "browser" => json!({"approval_required_selectors": ["#buy"]}),
        other => panic!("no sample for {other}"),
    }
}

/// The table: every manifest key under both edits, then nested unknown keys, each
/// capability widening and invalid values.
fn table() -> Vec<(Edit, Value, Outcome)> {
    use Outcome::*;
    let mut rows = Vec::new();
    for key in atasira_domain::manifest::MANIFEST_KEYS.iter().copied().chain(["permissions", "docspi"]) {
        let body = json!({ key: if key == "permissions" || key == "docspi" { json!({"x": 1}) } else { sample(key) } });
        // R-EDIT-1, R-EDIT-2
        let mentor = match key {
            "purpose" => Changed("/purpose", json!("Watch prices, report, and escalate.\n\n## Success criteria\n- a report every Monday")),
            "prohibited_actions" => Changed("/prohibited_actions", sample(key)),
            "business_procedure" => Changed("/business_procedure/0/description", json!("collect {watch_items}")),
            _ => Refused("mentor_edit_prohibited_key", &[]),
        };
        rows.push((Edit::Mentor, body.clone(), mentor));
        // R-EDIT-3
        let config = match key {
            "config_defaults" => Changed("/config_defaults/watch_items", json!(["A1"])),
            "trigger_schedule" => Changed("/trigger_schedule", json!("*/15 * * * *")),
            "credentials" => Changed("/credentials/token_env_var", json!("OP_TOKEN")),
            "shell" => Changed("/shell/require_approval_outside_allowlist", json!(true)),
            "notify" => Changed("/notify/email/recipients", json!(["ops@example.com"])),
            "browser" => Changed("/browser/approval_required_selectors", json!(["#buy"])),
            // not manifest keys at all
            "permissions" | "docspi" => Invalid(key),
            _ => Refused("capability_change_requires_new_draft", &[]),
        };
        rows.push((Edit::Config, body, config));
    }
    // success_criteria replaces the criteria section (R-EDIT-1)
    rows.push((
        Edit::Mentor,
        json!({"success_criteria": ["daily", "errors escalate"]}),
        Changed("/purpose", json!("Watch prices, report, and escalate.\n\n## Success criteria\n- daily\n- errors escalate")),
    ));
    rows.push((
        Edit::Mentor,
        json!({"success_criteria": ["daily", "errors escalate"]}),
        Changed("/purpose", json!("Watch prices, report, and escalate.\n\n## Success criteria\n- daily\n- errors escalate")),
    ));
    rows.push((Edit::Config, json!({"success_criteria": ["x"]}), Refused("capability_change_requires_new_draft", &["success_criteria"])));
    // unknown keys, top-level and nested
    rows.push((Edit::Mentor, json!({"quality_gate": true}), Refused("mentor_edit_prohibited_key", &["quality_gate"])));
    rows.push((
        Edit::Mentor,
        json!({"business_procedure": [{"step": 1, "tool": "Read", "os_operations": ["shell:exec"]}]}),
        Refused("mentor_edit_prohibited_key", &["business_procedure[0].os_operations"]),
    ));
    rows.push((Edit::Config, json!({"quality_gate": true}), Invalid("quality_gate")));
    rows.push((Edit::Config, json!({"shell": {"sudo": true}}), Invalid("shell")));
    rows.push((Edit::Config, json!({"notify": {"email": {"password": "x"}}}), Invalid("notify.email")));
    // each capability widening (R-EDIT-3)
    let widening: &[(Value, &'static [&'static str])] = &[
        (json!({"os_operations": ["browser:navigate", "browser:click", "notify:email", "shell:exec", "file:write"]}), &["os_operations"]),
        (json!({"tools": ["Read", "shell:exec"]}), &["tools"]),
        (json!({"network": "full"}), &["network"]),
        (json!({"shell": {"allowed_commands": ["rm"]}}), &["shell.allowed_commands"]),
        (json!({"shell": {"allowed_cwd": ["/"]}}), &["shell.allowed_cwd"]),
        (json!({"shell": {"require_approval_outside_allowlist": false}}), &["shell.require_approval_outside_allowlist"]),
        (json!({"credentials": {"allowed_vaults": ["ops"]}}), &["credentials.allowed_vaults"]),
        (json!({"browser": {"approval_required_selectors": []}}), &["browser.approval_required_selectors"]),
        (json!({"notify": {"line": {"item": "bot"}}}), &["notify.line"]),
        (json!({"notify": {"email": {"recipients": []}}}), &["notify.email.recipients"]),
        (json!({"notify": {"email": {"broadcast": true}}}), &["notify.email.broadcast"]),
    ];
    for (body, keys) in widening {
        rows.push((Edit::Config, body.clone(), Refused("capability_change_requires_new_draft", keys)));
    }
    // invalid values name the field (R-MAN-5, R-MAN-7)
    rows.push((Edit::Config, json!({"trigger_schedule": "soon"}), Invalid("trigger_schedule")));
    rows.push((Edit::Config, json!({"notify": {"email": {"vault": "personal"}}}), Invalid("notify.email.vault")));
    rows.push((Edit::Mentor, json!({"purpose": "  "}), Invalid("purpose")));
    rows.push((Edit::Mentor, json!({"prohibited_actions": "never"}), Invalid("prohibited_actions")));
    // and null deletes in a merge patch
    rows.push((Edit::Config, json!({"config_defaults": {"watch_items": null}}), Changed("/config_defaults", json!({}))));
    rows
}

#[test]
fn r_edit_1_2_3_every_manifest_key_under_both_edits_and_each_widening() {
    in_both_modes(|sys| {
        let box_id = activate(sys, &main_box("ed-table"));
        for (edit, body, outcome) in table() {
            let row = format!("{:?} {edit:?} {body}", sys.mode);
            let (before, _) = manifests(sys, &box_id);
            let violations_before = security_violations(sys, &box_id).len();
            let a = match edit {
                Edit::Mentor => mentor(sys, &sys.admin, &box_id, &body, &[]),
                Edit::Config => config(sys, &sys.admin, &box_id, &body, &[]),
            };
            match &outcome {
                Outcome::Changed(pointer, value) => {
                    assert_eq!(a.status, 200, "{row}: {}", a.raw);
                    assert!(a.header("x-atasira-position").is_some(), "{row}");
                    let (view, file) = manifests(sys, &box_id);
                    assert_eq!(view.pointer(pointer), Some(value), "{row}: the view");
                    assert_eq!(file.pointer(pointer), Some(value), "{row}: the file on disk");
                    assert_eq!(a.body["manifest"], view, "{row}: the answer is the Box as it is now");
                    let bumped = if edit == Edit::Mentor && before != view { 1 } else { 0 };
                    assert_eq!(minor(&view["version"]), minor(&before["version"]) + bumped, "{row}: only a mentor edit bumps, once");
                    assert_eq!(file["version"], view["version"], "{row}");
                }
                Outcome::Refused(code, keys) => {
                    assert_eq!((a.status, a.body["error"].as_str()), (403, Some(*code)), "{row}: {}", a.raw);
                    let named = refused_keys(&a);
                    let top = body.as_object().and_then(|o| o.keys().next().cloned()).unwrap_or_default();
                    let expected: Vec<String> = if keys.is_empty() { vec![top] } else { keys.iter().map(|k| k.to_string()).collect() };
                    assert_eq!(named, expected, "{row}: the body names the keys: {}", a.raw);
                    assert_eq!(manifests(sys, &box_id).0, before, "{row}: nothing changes");
                    let violations = security_violations(sys, &box_id);
                    if *code == "mentor_edit_prohibited_key" {
                        // R-EDIT-2, R-AUDIT-5: a signed row naming the keys, readable at once
                        assert!(a.header("x-atasira-position").is_some(), "{row}: the refusal says where its record is");
                        assert_eq!(violations.len(), violations_before + 1, "{row}: one security_violation row");
                        let last = violations.last().expect("a row");
                        assert_eq!((last["actor"].as_str(), last["action"].as_str()), (Some("admin"), Some("security_violation")), "{row}");
                        assert!(last["mac"].as_str().is_some_and(|m| m.len() == 64), "{row}: signed");
                        let reason = payload_of(sys, last)["SecurityViolation"]["reason"].as_str().unwrap_or_default().to_owned();
                        let detail = last["detail"].as_str().unwrap_or_default();
                        assert!(detail.starts_with("refused (mentor_edit_prohibited_key)"), "{row}: the row says what was refused: {detail}");
                        for key in &expected {
                            assert!(reason.contains(key.as_str()), "{row}: the record names {key}: {reason}");
                            // R-AUDIT-6: the ledger row itself names the keys, for an auditor without the store
                            assert!(detail.contains(key.as_str()), "{row}: the row names {key}: {detail}");
                        }
                        if MENTOR_PROHIBITED_KEYS.contains(&expected[0].as_str()) {
                            assert!(a.body["message"].as_str().is_some_and(|m| m.contains(expected[0].as_str())), "{row}");
                        }
                    } else {
                        // capability widening is not a security violation; the answer says how to go on
                        assert_eq!(violations.len(), violations_before, "{row}");
                        assert!(
                            a.body["message"].as_str().is_some_and(|m| m.contains("request a change") && m.contains("/change-requests")),
                            "{row}: {}",
                            a.raw
                        );
                    }
                }
                Outcome::Invalid(key) => {
                    assert_eq!(a.status, 422, "{row}: {}", a.raw);
                    assert_eq!(a.body["error"], "box_manifest_validation", "{row}: {}", a.raw);
                    assert!(refused_keys(&a).contains(&key.to_string()), "{row}: names {key}: {}", a.raw);
                    assert_eq!(manifests(sys, &box_id).0, before, "{row}: nothing changes");
                    assert_eq!(security_violations(sys, &box_id).len(), violations_before, "{row}");
                }
            }
        }
        // Each accepted edit is one signed ledger row of its own action.
        assert!(ledger_rows(sys, "box.manifest_edit", &box_id) >= 4, "{:?}", sys.mode);
        assert!(ledger_rows(sys, "box.config_edit", &box_id) >= 6, "{:?}", sys.mode);
        assert_eq!(sys.audit_verify().0, 0, "{:?}: the ledger verifies", sys.mode);
    });
}

#[test]
fn r_edit_3_who_may_edit_and_the_one_capability_rule_of_drafts() {
    in_both_modes(|sys| {
        let box_id = activate(sys, &main_box("ed-who"));
        let plain = activate(sys, &json!({"box_type": "ed-plain", "purpose": "Read reports.", "tools": ["Read"]}));
        let member = sys.token("mia", "member", "human");
        let agent_admin = sys.token("ops-bot", "admin", "agent");
        // R-AUTH-2: mentor edit is a human admin's
        for token in [&sys.agent, &member, &agent_admin] {
            let a = mentor(sys, token, &box_id, &json!({"purpose": "x"}), &[]);
            assert_eq!((a.status, a.body["error"].as_str()), (403, Some("forbidden")), "{:?}: {}", sys.mode, a.raw);
            let a = config(sys, token, &box_id, &json!({"config_defaults": {"k": 1}}), &[]);
            assert_eq!((a.status, a.body["error"].as_str()), (403, Some("forbidden")), "{:?}: not the primary: {}", sys.mode, a.raw);
        }
        // 404 for a Box that does not exist; 403 first for whoever could not edit it anyway
        assert_eq!(mentor(sys, &sys.admin, "no-such-box", &json!({"purpose": "x"}), &[]).status, 404);
        assert_eq!(config(sys, &sys.admin, "no-such-box", &json!({}), &[]).status, 404);
        assert_eq!(config(sys, &member, "no-such-box", &json!({}), &[]).status, 403);
        // an agent primary edits within the same limits as a human one
        let a = sys.post(&format!("/api/v1/boxes/{box_id}/user-assignments"), &sys.admin, &json!({"user_id": "agent", "role_in_box": "primary"}));
        assert_eq!(a.status, 200, "{}", a.raw);
        let a = config(sys, &sys.agent, &box_id, &json!({"config_defaults": {"threshold": 5}, "trigger_schedule": "0 9 * * 1"}), &[]);
        assert_eq!(a.status, 200, "{:?}: {}", sys.mode, a.raw);
        assert_eq!(manifests(sys, &box_id).1["config_defaults"]["threshold"], 5);
        let a = config(sys, &sys.agent, &box_id, &json!({"network": "full"}), &[]);
        assert_eq!((a.status, a.body["error"].as_str()), (403, Some("capability_change_requires_new_draft")), "{}", a.raw);
        let a = mentor(sys, &sys.agent, &box_id, &json!({"purpose": "x"}), &[]);
        assert_eq!(a.status, 403, "a primary is no mentor: {}", a.raw);
        // shell only with an approved shell:exec
        let a = config(sys, &sys.admin, &plain, &json!({"shell": {"allowed_commands": []}}), &[]);
        assert_eq!((a.status, refused_keys(&a)), (403, vec!["shell".to_owned()]), "{}", a.raw);
        // application/json is read the same way
        let a = http(
            "PATCH",
            &sys.url(&format!("/api/v1/boxes/{plain}/config")),
            Some(&sys.admin),
            &[],
            Some(json!({"config_defaults": {"a": 1}}).to_string().as_bytes()),
        );
        assert_eq!(a.status, 200, "{}", a.raw);
        // a body that is no JSON object; the check order holds: 401, 403, 404, then 400/422
        assert_eq!(config(sys, &sys.admin, &plain, &json!([1]), &[]).status, 422);
        assert_eq!(mentor(sys, &sys.admin, &plain, &json!("purpose"), &[]).status, 422);
        let garbage = |token: Option<&str>, method: &str, id: &str, what: &str| {
            http(method, &sys.url(&format!("/api/v1/boxes/{id}/{what}")), token, &[], Some(b"{not json")).status
        };
        for (method, what) in [("PUT", "manifest"), ("PATCH", "config")] {
            assert_eq!(garbage(None, method, &plain, what), 401, "{method} {what}");
            assert_eq!(garbage(Some(&member), method, &plain, what), 403, "{method} {what}");
            assert_eq!(garbage(Some(&sys.admin), method, "no-such-box", what), 404, "{method} {what}");
            assert_eq!(garbage(Some(&sys.admin), method, &plain, what), 400, "{method} {what}");
        }

        // Issue 10 item 7: an OS operation named in tools is that operation; the draft is
        // over_limit and its approval needs the second confirmation
        let d =
            sys.post("/api/v1/boxes/box-drafts", &sys.agent, &json!({"box_type": "ed-tools", "purpose": "p", "tools": ["shell:exec", "file:write", "Read"]}));
        assert_eq!(d.status, 201, "{}", d.raw);
        assert_eq!(d.body["over_limit"], true, "{}", d.raw);
        let draft_id = d.body["draft_id"].as_str().expect("draft_id");
        let detail = sys.get(&format!("/api/v1/boxes/box-drafts/{draft_id}"), &sys.admin);
        assert_eq!(detail.body["over_limit_tools"], json!(["shell:exec", "file:write"]), "{}", detail.raw);
        let a = sys.approve(draft_id, &sys.admin, false);
        assert_eq!((a.status, a.body["error"].as_str()), (409, Some("over_limit_confirmation_required")), "{}", a.raw);
    });
}

#[test]
fn edits_are_idempotent_consistent_under_concurrency_and_never_overwrite_a_hand_edited_file() {
    in_both_modes(|sys| {
        let box_id = activate(sys, &main_box("ed-race"));
        let version = |sys: &System| minor(&manifests(sys, &box_id).0["version"]);

        // R-DRAFT-11: a retry with the same Idempotency-Key gets the first answer; the edit
        // happens once
        let start = version(sys);
        let body = json!({"prohibited_actions": ["never resell"]});
        let first = mentor(sys, &sys.admin, &box_id, &body, &[("Idempotency-Key", "edit-1")]);
        let again = mentor(sys, &sys.admin, &box_id, &body, &[("Idempotency-Key", "edit-1")]);
        assert_eq!((first.status, again.status), (200, 200), "{}", again.raw);
        assert_eq!(again.header("idempotent-replayed"), Some("true"));
        assert_eq!(again.body, first.body);
        assert_eq!(version(sys), start + 1, "one bump");
        let other = mentor(sys, &sys.admin, &box_id, &json!({"prohibited_actions": ["other"]}), &[("Idempotency-Key", "edit-1")]);
        assert_eq!((other.status, other.body["error"].as_str()), (422, Some("idempotency_key_reuse")));
        // a refusal that recorded a violation is replayed, not recorded twice
        let violations = security_violations(sys, &box_id).len();
        let bad = json!({"tools": ["Bash"]});
        let r1 = mentor(sys, &sys.admin, &box_id, &bad, &[("Idempotency-Key", "bad-1")]);
        let r2 = mentor(sys, &sys.admin, &box_id, &bad, &[("Idempotency-Key", "bad-1")]);
        assert_eq!((r1.status, r2.status), (403, 403));
        assert_eq!(r2.header("x-atasira-position"), r1.header("x-atasira-position"));
        assert_eq!(security_violations(sys, &box_id).len(), violations + 1);
        // the same config patch twice: applied once, the second changes nothing
        let patch = json!({"config_defaults": {"limit": 3}});
        let c1 = config(sys, &sys.admin, &box_id, &patch, &[("Idempotency-Key", "cfg-1")]);
        let c2 = config(sys, &sys.admin, &box_id, &patch, &[("Idempotency-Key", "cfg-1")]);
        assert_eq!((c1.status, c2.status, c2.header("idempotent-replayed")), (200, 200, Some("true")));
        let c3 = config(sys, &sys.admin, &box_id, &patch, &[]);
        assert_eq!(c3.status, 200);
        assert_eq!(c3.body["manifest"], c1.body["manifest"], "a repeated patch changes nothing");

        // R-BOX-5, R-EDIT-1, R-EDIT-3: the Box's history shows each edit: who, when, which keys,
        // the version after it
        let history = sys.get(&format!("/api/v1/boxes/{box_id}/history?limit=200"), &sys.agent);
        assert_eq!(history.status, 200, "{}", history.raw);
        let entries = history.body["entries"].as_array().cloned().unwrap_or_default();
        let edited = |kind: &str| entries.iter().filter(|e| e["kind"] == kind).cloned().collect::<Vec<Value>>();
        let (mentor_edits, config_edits) = (edited("manifest_edited"), edited("config_edited"));
        assert_eq!(mentor_edits.len(), 1, "one mentor edit happened: {entries:?}");
        assert_eq!(config_edits.len(), 1, "one config edit changed something: {entries:?}");
        let m = &mentor_edits[0];
        assert_eq!((m["actor"].as_str(), m["changed_keys"].clone()), (Some("admin"), json!(["prohibited_actions"])), "{m}");
        assert!(m["at"].is_string() && m["manifest_version"].is_string(), "{m}");
        let c = &config_edits[0];
        assert_eq!(c["actor"].as_str(), Some("admin"), "{c}");
        assert!(c["changed_keys"].as_array().is_some_and(|k| k.iter().all(|k| k.as_str().is_some_and(|k| k.starts_with("config_defaults")))), "{c}");

        // Concurrent edits: real parallel requests; every accepted edit is kept (no lost
        // update), each refused one is a 409 to retry.
        const N: usize = 8;
        let edits_before = sys.sql_i64(&format!("SELECT COUNT(*) FROM events WHERE aggregate_id = '{box_id}' AND event_type = 'BoxConfigEdited'"));
        let answers: Vec<(usize, Answer)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..N)
                .map(|i| {
                    let sys = &*sys;
                    let box_id = &box_id;
                    s.spawn(move || (i, config(sys, &sys.admin, box_id, &json!({"config_defaults": {format!("k{i}"): i}}), &[])))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a thread")).collect()
        });
        let won: BTreeSet<String> = answers.iter().filter(|(_, a)| a.status == 200).map(|(i, _)| format!("k{i}")).collect();
        for (_, a) in &answers {
            assert!(a.status == 200 || (a.status == 409 && a.body["error"] == "conflict"), "{:?}: {}", sys.mode, a.raw);
        }
        assert!(!won.is_empty(), "{:?}: at least one edit wins", sys.mode);
        let (view, file) = manifests(sys, &box_id);
        let keys: BTreeSet<String> = view["config_defaults"].as_object().expect("object").keys().filter(|k| k.starts_with('k')).cloned().collect();
        assert_eq!(keys, won, "{:?}: exactly the accepted edits are in the manifest", sys.mode);
        assert_eq!(file["config_defaults"], view["config_defaults"], "{:?}: and in the file", sys.mode);
        let edits_after = sys.sql_i64(&format!("SELECT COUNT(*) FROM events WHERE aggregate_id = '{box_id}' AND event_type = 'BoxConfigEdited'"));
        assert_eq!(usize::try_from(edits_after - edits_before).expect("count"), won.len(), "one event per accepted edit");
        // concurrent mentor edits: the version counts every accepted one
        let start = version(sys);
        let answers: Vec<Answer> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..N)
                .map(|i| {
                    let sys = &*sys;
                    let box_id = &box_id;
                    s.spawn(move || mentor(sys, &sys.admin, box_id, &json!({"prohibited_actions": [format!("rule {i}")]}), &[]))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a thread")).collect()
        });
        let accepted: Vec<&Answer> = answers.iter().filter(|a| a.status == 200).collect();
        assert!(answers.iter().all(|a| a.status == 200 || a.status == 409), "{:?}", answers.iter().map(|a| &a.raw).collect::<Vec<_>>());
        assert_eq!(version(sys), start + accepted.len() as u64, "{:?}: one minor bump per accepted edit", sys.mode);
        let last = manifests(sys, &box_id).0;
        assert!(accepted.iter().any(|a| a.body["manifest"] == last), "{:?}: the Box is what the last accepted edit answered", sys.mode);

        // R-BOX-2: a hand-edited file is drift and is never overwritten; the view follows
        let path = sys.data_dir().join("manifests/ed-race.yaml");
        let hand = format!("{}\n# edited by hand\n", std::fs::read_to_string(&path).expect("file"));
        std::fs::write(&path, &hand).expect("write");
        let a = mentor(sys, &sys.admin, &box_id, &json!({"purpose": "After the hand edit."}), &[]);
        assert_eq!(a.status, 200, "{}", a.raw);
        assert_eq!(a.body["manifest_drift"], true, "{}", a.raw);
        assert!(a.body["manifest"]["purpose"].as_str().is_some_and(|p| p.starts_with("After the hand edit.")));
        let a = config(sys, &sys.admin, &box_id, &json!({"trigger_schedule": "5 4 * * *"}), &[]);
        assert_eq!(a.status, 200, "{}", a.raw);
        assert_eq!(std::fs::read_to_string(&path).expect("file"), hand, "{:?}: the hand-edited file is left alone", sys.mode);
    });
}

#[test]
fn r_hist_a_box_as_it_was_shows_the_manifest_and_the_approver_that_held_then() {
    in_both_modes(|sys| {
        // given a Box approved by the admin, then assigned
        let box_id = activate(sys, &json!({"box_type": "then-and-now", "name": "then-and-now", "purpose": "Read reports.", "tools": ["Read"]}));
        let assigned = sys.post(&format!("/api/v1/boxes/{box_id}/user-assignments"), &sys.admin, &json!({"user_id": "agent", "role_in_box": "member"}));
        assert_eq!(assigned.status, 200, "{}", assigned.raw);
        let before: i64 = assigned.header("x-atasira-position").expect("a position").parse().expect("a number");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let before_time = chrono::Utc::now();
        std::thread::sleep(std::time::Duration::from_millis(20));
        // when a change request widens its tools and bob approves it
        let asked = sys.post(&format!("/api/v1/boxes/{box_id}/change-requests"), &sys.admin, &json!({"tools": ["Read", "Grep"]}));
        assert_eq!(asked.status, 201, "{}", asked.raw);
        let bob = sys.token("bob", "admin", "human");
        let approved = sys.approve(asked.body["draft_id"].as_str().expect("draft_id"), &bob, true);
        assert_eq!(approved.status, 200, "{}", approved.raw);

        // then now: the new manifest and its approver
        let now = sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.agent);
        assert_eq!((now.body["manifest"]["tools"].clone(), now.body["approved_by"].clone()), (json!(["Read", "Grep"]), json!("bob")), "{}", now.raw);
        // and as it was before the change, by position or by time: the old ones
        for at in [before.to_string(), before_time.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)] {
            let then = sys.get(&format!("/api/v1/boxes/{box_id}?at={at}"), &sys.agent);
            assert_eq!(then.status, 200, "{:?} at {at}: {}", sys.mode, then.raw);
            assert_eq!((then.body["manifest"]["tools"].clone(), then.body["approved_by"].clone()), (json!(["Read"]), json!("admin")), "{}", then.raw);
            assert_eq!(then.body["assignments"][0]["user_id"], json!("agent"), "{}", then.raw);
        }
        // and the change request as it was: pending then, approved by bob now
        let change = asked.body["draft_id"].as_str().expect("draft_id");
        let now = sys.get(&format!("/api/v1/boxes/box-drafts/{change}"), &sys.admin);
        assert_eq!((now.body["status"].clone(), now.body["decision"]["by"].clone()), (json!("active"), json!("bob")), "{}", now.raw);
        let asked_at = asked.header("x-atasira-position").expect("a position");
        let then = sys.get(&format!("/api/v1/boxes/box-drafts/{change}?at={asked_at}"), &sys.admin);
        assert_eq!((then.status, then.body["status"].clone(), then.body["decision"].clone()), (200, json!("pending_approval"), Value::Null), "{}", then.raw);
        let never = sys.get(&format!("/api/v1/boxes/box-drafts/{change}?at={before}"), &sys.admin);
        assert_eq!((never.status, never.body["error"].clone()), (404, json!("draft_not_found")), "{}", never.raw);
        // and before it existed: no Box
        let first = sys.get(&format!("/api/v1/boxes/{box_id}?at=1"), &sys.agent);
        assert_eq!((first.status, first.body["error"].clone()), (404, json!("box_not_found")), "{}", first.raw);
        let bad = sys.get(&format!("/api/v1/boxes/{box_id}?at=yesterday"), &sys.agent);
        assert_eq!((bad.status, bad.body["error"].clone()), (400, json!("invalid_query")), "{}", bad.raw);
        // the same after the read models are rebuilt from the store
        sys.stop_gracefully();
        let (code, out, err) = sys.rebuild();
        assert_eq!(code, 0, "{out} {err}");
        sys.start_services(&[]);
        let rebuilt = sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.agent);
        assert_eq!(rebuilt.body["approved_by"], json!("bob"), "{}", rebuilt.raw);
        let then = sys.get(&format!("/api/v1/boxes/{box_id}?at={before}"), &sys.agent);
        assert_eq!(then.body["approved_by"], json!("admin"), "{}", then.raw);
    });
}
