//! The organisation's policy as code (R-POLICY-1), in both modes, end to end through the
//! API: a version published by a human admin; a forbidden draft and change refused naming
//! the rule (and recorded); a rule asking for two approvers holding a change at one; a dry
//! run listing the pending drafts a new version would decide differently; and past
//! decisions unchanged by a new version, also after the read models are rebuilt.

use std::time::Duration;

use atasira_tests::fixtures::eventually;
use atasira_tests::harness::{Answer, Mode, OutputWithin, SUBPROCESS_LIMIT, System, TempDir, atasira_bin, http, in_both_modes};
use serde_json::{Value, json};

const POLICY: &str = r#"
@id("no-full-network")
@reason("Boxes may not reach the whole network")
forbid(principal, action, resource) when { resource.network == "full" };

@id("no-agent-browser")
@reason("Agents may not ask for a browser")
forbid(principal, action == Action::"draft", resource)
  when { principal.kind == "agent" && resource.os_operations.contains("browser:navigate") };

@id("two-for-shell")
@approvals("2")
permit(principal, action in [Action::"draft", Action::"change"], resource)
  when { resource.os_operations.contains("shell:exec") };

@id("no-prod-launch")
@reason("Workers are not launched against production")
forbid(principal, action == Action::"launch", resource)
  when { context.labels has "env" && context.labels["env"] == "prod" };

@id("frozen-config")
forbid(principal, action == Action::"config_edit", resource)
  when { resource.box_type == "ops-helper" && context.keys.contains("config_defaults") };
"#;

fn publish(sys: &System, token: &str, text: &str, key: &str) -> Answer {
    let body = json!({"text": text}).to_string();
    http("PUT", &sys.url("/api/v1/policies"), Some(token), &[("Idempotency-Key", key)], Some(body.as_bytes()))
}

fn activate(sys: &System, draft: &Value) -> String {
    let id = sys.draft(draft);
    let a = sys.approve(&id, &sys.admin, true);
    assert_eq!(a.status, 200, "{:?}: {}", sys.mode, a.raw);
    a.body["box_id"].as_str().expect("box_id").to_owned()
}

fn change(sys: &System, box_id: &str, patch: &Value) -> Answer {
    sys.post(&format!("/api/v1/boxes/{box_id}/change-requests"), &sys.admin, patch)
}

#[test]
fn r_policy_1_rules_refuse_ask_for_more_dry_run_and_never_rewrite_the_past() {
    in_both_modes(|sys| {
        let mode = sys.mode;
        // given no policy: version 0, and only a human admin may publish a valid one
        let none = sys.get("/api/v1/policies", &sys.admin);
        assert_eq!((none.status, none.body["version"].clone()), (200, json!(0)), "{mode:?}: {}", none.raw);
        let by_agent = publish(sys, &sys.agent, POLICY, "p-agent");
        assert_eq!((by_agent.status, by_agent.body["error"].clone()), (403, json!("forbidden")), "{}", by_agent.raw);
        let bad = publish(sys, &sys.admin, "@approvals(\"2\") forbid(principal, action, resource);", "p-bad");
        assert_eq!((bad.status, bad.body["error"].clone()), (422, json!("invalid_request")), "{}", bad.raw);
        assert!(bad.body["message"].as_str().unwrap_or_default().contains("permit"), "{}", bad.raw);
        let v1 = publish(sys, &sys.admin, POLICY, "p-1");
        assert_eq!((v1.status, v1.body["version"].clone()), (200, json!(1)), "{mode:?}: {}", v1.raw);
        let ids: Vec<&str> = v1.body["rules"].as_array().expect("rules").iter().filter_map(|r| r["id"].as_str()).collect();
        assert_eq!(ids, ["no-full-network", "no-agent-browser", "two-for-shell", "no-prod-launch", "frozen-config"]);
        assert_eq!(v1.body["rules"][2]["approvals"], json!(2), "{}", v1.raw);
        let again = publish(sys, &sys.admin, POLICY, "p-1-again");
        assert_eq!(again.body["version"], json!(1), "the same text again is the same version: {}", again.raw);

        // when an agent drafts a Box with a browser: refused, naming the policy and the rule
        let browsing = sys.post(
            "/api/v1/boxes/box-drafts",
            &sys.agent,
            &json!({"box_type": "web-reader", "purpose": "Read the web.", "os_operations": ["browser:navigate"], "allow_network": true, "url_allowlist": ["https://example.com"]}),
        );
        assert_eq!((browsing.status, browsing.body["error"].clone()), (403, json!("policy_denied")), "{mode:?}: {}", browsing.raw);
        let message = browsing.body["message"].as_str().unwrap_or_default();
        assert!(message.contains("policy version 1") && message.contains("no-agent-browser") && message.contains("Agents may not ask"), "{message}");

        // when a change request asks for the whole network: refused, naming the rule
        let box_id = activate(sys, &json!({"box_type": "ops-helper", "purpose": "Help the ops team.", "tools": ["Read"]}));
        let full = change(sys, &box_id, &json!({"network": "full"}));
        assert_eq!((full.status, full.body["error"].clone()), (403, json!("policy_denied")), "{mode:?}: {}", full.raw);
        assert!(full.body["message"].as_str().unwrap_or_default().contains("rule no-full-network"), "{}", full.raw);
        // when a Worker is launched against production: refused; elsewhere: launched
        let launch = |launch_id: &str, env: &str| {
            let body = json!({"launch_id": launch_id, "labels": {"env": env}, "input": [{"kind": "text", "value": "Check the logs."}]});
            sys.post(&format!("/api/v1/boxes/{box_id}/workers"), &sys.admin, &body)
        };
        let prod = launch("policy-prod-1", "prod");
        assert_eq!((prod.status, prod.body["error"].clone()), (403, json!("policy_denied")), "{mode:?}: {}", prod.raw);
        assert!(prod.body["message"].as_str().unwrap_or_default().contains("rule no-prod-launch"), "{}", prod.raw);
        let dev = launch("policy-dev-1", "dev");
        assert_eq!(dev.status, 201, "{mode:?}: {}", dev.raw);
        // when its config is edited where a rule freezes it: refused
        let patch = json!({"config_defaults": {"threshold": 5}}).to_string();
        let frozen = http(
            "PATCH",
            &sys.url(&format!("/api/v1/boxes/{box_id}/config")),
            Some(&sys.admin),
            &[("Content-Type", "application/merge-patch+json"), ("Idempotency-Key", "policy-config-1")],
            Some(patch.as_bytes()),
        );
        assert_eq!((frozen.status, frozen.body["error"].clone()), (403, json!("policy_denied")), "{mode:?}: {}", frozen.raw);
        assert!(frozen.body["message"].as_str().unwrap_or_default().contains("rule frozen-config"), "{}", frozen.raw);
        // and the refusals are ledger rows naming their rule
        let rows = eventually("the policy refusals in the ledger", Duration::from_secs(20), || {
            let rows = sys.get("/api/v1/audit?action=security_violation&limit=200", &sys.admin).body["rows"].as_array().cloned().unwrap_or_default();
            let details: Vec<String> =
                rows.iter().filter_map(|r| r["detail"].as_str()).filter(|d| d.starts_with("refused (policy_denied)")).map(str::to_owned).collect();
            if details.len() >= 2 { Ok(details) } else { Err(format!("{details:?}")) }
        });
        assert!(rows.iter().any(|d| d.contains("no-agent-browser")) && rows.iter().any(|d| d.contains("no-full-network")), "{rows:?}");

        // when a change request adds shell:exec: two approvers are required, one holds it
        let shell = change(sys, &box_id, &json!({"os_operations": ["shell:exec"], "shell": {"allowed_commands": ["ls"]}}));
        assert_eq!(shell.status, 201, "{mode:?}: {}", shell.raw);
        let shell_id = shell.body["draft_id"].as_str().expect("draft_id").to_owned();
        let bob = sys.token("bob", "admin", "human");
        let one = sys.approve(&shell_id, &bob, true);
        assert_eq!(one.status, 200, "{}", one.raw);
        assert_eq!((one.body["status"].clone(), one.body["approvals_required"].clone()), (json!("pending_approval"), json!(2)), "{mode:?}: {}", one.raw);
        let held = sys.get(&format!("/api/v1/boxes/box-drafts/{shell_id}"), &sys.admin);
        assert_eq!((held.body["status"].clone(), held.body["approvals_required"].clone()), (json!("pending_approval"), json!(2)), "{}", held.raw);
        assert_eq!(held.body["policy"], json!({"version": 1, "rules": ["two-for-shell"], "confirm": false}), "the approver sees why: {}", held.raw);

        // given pending drafts: a plain one, and a shell one decided under version 1
        let plain = sys.draft(&json!({"box_type": "file-reader", "purpose": "Read files.", "os_operations": ["file:read"]}));
        let shell_draft = sys.draft(&json!({"box_type": "shell-runner", "purpose": "Run ls.", "os_operations": ["shell:exec"]}));
        let recorded = sys.get(&format!("/api/v1/boxes/box-drafts/{shell_draft}"), &sys.admin);
        assert_eq!(recorded.body["approvals_required"], json!(2), "{}", recorded.raw);

        // when a stricter version is checked: the affected pending drafts are listed, nothing
        // is recorded, and a proposed draft is put to it too
        let stricter = format!(
            "{POLICY}\n@id(\"no-file-read\") @reason(\"No reading files\") forbid(principal, action, resource) when {{ resource.os_operations.contains(\"file:read\") }};"
        );
        let checked = sys.post(
            "/api/v1/policies/check",
            &sys.admin,
            &json!({"text": stricter, "draft": {"box_type": "reader-two", "purpose": "Read.", "os_operations": ["file:read"]}}),
        );
        assert_eq!(checked.status, 200, "{mode:?}: {}", checked.raw);
        assert_eq!((checked.body["active_version"].clone(), checked.body["draft"]["decision"].clone()), (json!(1), json!("deny")), "{}", checked.raw);
        let changes = checked.body["changes"].as_array().expect("changes");
        let affected: Vec<&str> = changes.iter().filter_map(|c| c["id"].as_str()).collect();
        assert!(affected.contains(&plain.as_str()), "{mode:?}: the plain draft is listed: {}", checked.raw);
        assert!(!affected.contains(&shell_draft.as_str()), "the shell draft is decided alike: {}", checked.raw);
        let listed = changes.iter().find(|c| c["id"] == json!(plain)).expect("listed");
        assert_eq!(
            (listed["kind"].clone(), listed["before"]["decision"].clone(), listed["after"]["decision"].clone()),
            (json!("draft"), json!("allow"), json!("deny"))
        );
        assert_eq!(listed["after"]["rules"], json!(["no-file-read"]), "{}", checked.raw);
        assert_eq!(sys.get("/api/v1/policies", &sys.admin).body["version"], json!(1), "a check publishes nothing");
        let by_agent = sys.post("/api/v1/policies/check", &sys.agent, &json!({"text": stricter}));
        assert_eq!(by_agent.status, 403, "{}", by_agent.raw);
        let nothing = sys.post("/api/v1/policies/check", &sys.admin, &json!({}));
        assert_eq!((nothing.status, nothing.body["error"].clone()), (422, json!("invalid_request")), "nothing to check: {}", nothing.raw);

        // when version 2 drops the two-approver rule: new drafts need one; the past stays
        let v2 = publish(sys, &sys.admin, &POLICY.replace("@approvals(\"2\")", ""), "p-2");
        assert_eq!(v2.body["version"], json!(2), "{}", v2.raw);
        // each version is a ledger row, by whom and which rules
        let published = eventually("both versions in the ledger", Duration::from_secs(20), || {
            let rows = sys.get("/api/v1/audit?action=policy.publish", &sys.admin).body["rows"].as_array().cloned().unwrap_or_default();
            if rows.len() == 2 { Ok(rows) } else { Err(format!("{rows:?}")) }
        });
        assert!(published.iter().all(|r| r["actor"] == json!("admin")), "{published:?}");
        assert!(
            published.iter().any(|r| r["detail"].as_str().is_some_and(|d| d.starts_with("policy version 2") && d.contains("no-full-network"))),
            "{published:?}"
        );
        let after = sys.draft(&json!({"box_type": "shell-runner-two", "purpose": "Run ls.", "os_operations": ["shell:exec"]}));
        assert_eq!(sys.get(&format!("/api/v1/boxes/box-drafts/{after}"), &sys.admin).body["approvals_required"], json!(1));
        assert_eq!(sys.get(&format!("/api/v1/boxes/box-drafts/{shell_draft}"), &sys.admin).body["approvals_required"], json!(2));
        // and after the read models are rebuilt from the store: the same decisions
        sys.stop_gracefully();
        let (code, out, err) = sys.rebuild();
        assert_eq!(code, 0, "{out} {err}");
        sys.start_services(&[]);
        assert_eq!(sys.get(&format!("/api/v1/boxes/box-drafts/{shell_draft}"), &sys.admin).body["approvals_required"], json!(2));
        let first = sys.approve(&shell_draft, &sys.admin, true);
        assert_eq!((first.status, first.body["status"].clone()), (200, json!("pending_approval")), "{mode:?}: still two approvers: {}", first.raw);
        let carol = sys.token("carol", "admin", "human");
        let second = sys.approve(&shell_id, &carol, true);
        assert_eq!(
            (second.status, second.body["status"].clone()),
            (200, json!("active")),
            "{mode:?}: the second approver completes the change: {}",
            second.raw
        );
        assert_eq!(sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.agent).body["manifest"]["os_operations"], json!(["shell:exec"]));
    });
}

/// `atasira policies ...` against a running gateway: (exit code, stdout, stderr).
fn cli(sys: &System, token: &str, args: &[&str]) -> (i32, String, String) {
    let mut cmd = std::process::Command::new(atasira_bin());
    cmd.args(args).args(["--url", &sys.base_url, "--token", token]);
    for name in ["ATASIRA_PAT", "ATASIRA_BFF_URL"] {
        cmd.env_remove(name);
    }
    let out = cmd.output_within(SUBPROCESS_LIMIT).expect("atasira runs");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn r_policy_1_the_command_line_checks_publishes_and_shows_a_policy_file() {
    let sys = System::start(Mode::Embedded);
    let dir = TempDir::new("policy-cli");
    let policy = dir.0.join("policy.cedar");
    std::fs::write(&policy, POLICY).expect("write");
    let draft = dir.0.join("draft.json");
    std::fs::write(&draft, json!({"box_type": "cli-shell", "purpose": "Run ls.", "os_operations": ["shell:exec"]}).to_string()).expect("write");
    let (policy, draft) = (policy.to_string_lossy().into_owned(), draft.to_string_lossy().into_owned());
    // a dry run of the file and a draft: nothing in force yet, the draft needs two approvers
    let (code, out, err) = cli(&sys, &sys.admin, &["policies", "check", &policy, "--draft", &draft]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("active_version 0") && out.contains("draft allow (two-for-shell), 2 approvers"), "{out}");
    // published by a human admin, refused to an agent, and shown
    let (code, out, err) = cli(&sys, &sys.agent, &["policies", "publish", &policy]);
    assert_eq!(code, 1, "the API refuses an agent: {out}{err}");
    let (code, out, err) = cli(&sys, &sys.admin, &["policies", "publish", &policy]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("version 1") && out.contains("two-for-shell") && out.contains("no-full-network"), "{out}");
    let (code, out, _) = cli(&sys, &sys.admin, &["policies", "show", "--json"]);
    assert_eq!(code, 0);
    let shown: Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!((shown["version"].clone(), shown["published_by"].clone()), (json!(1), json!("admin")), "{shown}");
    // a file that is not there is a usage error
    let (code, _, err) = cli(&sys, &sys.admin, &["policies", "publish", "/nonexistent/policy.cedar"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot read"), "{err}");
    // and every flag says what it takes
    let (code, out, _) = cli(&sys, &sys.admin, &["policies", "check", "--help"]);
    assert_eq!(code, 0);
    assert!(out.contains("--draft") && out.contains("dry run"), "{out}");
}
