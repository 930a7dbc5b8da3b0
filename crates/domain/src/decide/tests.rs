//! R-DECIDE-1 given/when/then: a decision table over every manifest rule, fail-closed by
//! default.

use serde_json::json;

use super::*;

const WORKSPACE: &str = "/srv/atasira/workspaces/release-notes";

fn manifest(extra: Value) -> BoxManifest {
    let mut base = json!({"box_type": "release-notes", "purpose": "write release notes"});
    if let (Some(base), Value::Object(extra)) = (base.as_object_mut(), extra) {
        base.extend(extra);
    }
    serde_json::from_value(base).expect("manifest")
}

fn call(tool: &str, input: Value) -> ToolCall {
    ToolCall { tool: tool.into(), input }
}

/// The decision for `tool`/`input` on a Box with `extra` manifest keys, its binding's
/// scope being its effective tools.
fn when(extra: Value, tool: &str, input: Value) -> Decision {
    when_with(extra, tool, input, &Facts::default())
}

fn when_with(extra: Value, tool: &str, input: Value, facts: &Facts) -> Decision {
    let m = manifest(extra);
    let scope = m.effective_tools();
    decide(Grant { manifest: &m, workspace: WORKSPACE, tool_scope: &scope }, &call(tool, input), facts)
}

fn verdict(d: &Decision) -> (Verdict, &str) {
    (d.decision, d.rule.as_str())
}

#[test]
fn given_no_tools_when_anything_is_called_then_denied_by_tools() {
    for tool in ["Read", "file:read", "shell:exec", "anything"] {
        let d = when(json!({}), tool, json!({"path": "notes.md"}));
        assert_eq!(verdict(&d), (Verdict::Deny, "tools"), "{tool}: {d:?}");
        assert!(d.reason.contains("no tool"), "{}", d.reason);
    }
    assert_eq!(verdict(&when(json!({"tools": ["Read"]}), "", json!({}))), (Verdict::Deny, "tools"));
}

#[test]
fn given_a_tool_outside_the_tools_or_the_bindings_scope_then_denied() {
    let d = when(json!({"tools": ["Read"]}), "Write", json!({"file_path": "notes.md"}));
    assert_eq!(verdict(&d), (Verdict::Deny, "tools"));
    // The manifest lists it, the binding does not: still denied.
    let m = manifest(json!({"tools": ["Read", "Write"]}));
    let scope = vec!["Read".to_owned()];
    let d = decide(Grant { manifest: &m, workspace: WORKSPACE, tool_scope: &scope }, &call("Write", json!({"file_path": "a"})), &Facts::default());
    assert_eq!(verdict(&d), (Verdict::Deny, "tools"));
}

#[test]
fn given_a_tool_of_the_box_that_touches_nothing_then_allowed_by_tools() {
    let d = when(json!({"tools": ["TodoWrite"]}), "TodoWrite", json!({"todos": []}));
    assert_eq!(verdict(&d), (Verdict::Allow, "tools"));
    // os_operations count as tools (R-MAN-2).
    let d = when(json!({"os_operations": ["screenshot:capture"]}), "screenshot:capture", json!({}));
    assert_eq!(verdict(&d), (Verdict::Allow, "tools"));
}

#[test]
fn files_inside_the_workspace_or_file_access_are_allowed_and_everything_else_denied() {
    let files = json!({"os_operations": ["file:read", "file:write", "file:copy", "file:move"], "tools": ["Write"], "file_access": ["read:/data/*", "write:/tmp/out/*", "/shared"]});
    let table = [
        ("file:write", json!({"path": "notes.md"}), Verdict::Allow, "tools"),
        ("file:write", json!({"path": format!("{WORKSPACE}/sub/notes.md")}), Verdict::Allow, "tools"),
        ("Write", json!({"file_path": "./draft.md"}), Verdict::Allow, "tools"),
        ("file:read", json!({"path": "/data/2026/sales.csv"}), Verdict::Allow, "tools"),
        ("file:write", json!({"path": "/data/2026/sales.csv"}), Verdict::Deny, "file_access"),
        ("file:write", json!({"path": "/tmp/out/report.md"}), Verdict::Allow, "tools"),
        ("file:read", json!({"path": "/tmp/out/report.md"}), Verdict::Deny, "file_access"),
        ("file:read", json!({"path": "/shared/a/b"}), Verdict::Allow, "tools"),
        ("file:write", json!({"path": "/shared"}), Verdict::Allow, "tools"),
        ("file:read", json!({"path": "/sharedother"}), Verdict::Deny, "file_access"),
        ("file:write", json!({"path": "/etc/passwd"}), Verdict::Deny, "file_access"),
        ("file:write", json!({"path": "../other-box/notes.md"}), Verdict::Deny, "file_access"),
        ("file:read", json!({"path": "/data/../etc/shadow"}), Verdict::Deny, "file_access"),
        ("file:write", json!({"path": "/srv/atasira/workspaces/release-notes-2/x"}), Verdict::Deny, "file_access"),
        ("file:write", json!({}), Verdict::Deny, "file_access"),
        ("file:copy", json!({"source": "/data/a.csv", "destination": "a.csv"}), Verdict::Allow, "tools"),
        ("file:copy", json!({"source": "/etc/shadow", "destination": "a"}), Verdict::Deny, "file_access"),
        ("file:copy", json!({"source": "a", "destination": "/etc/cron.d/x"}), Verdict::Deny, "file_access"),
        ("file:move", json!({"source": "/data/a.csv", "destination": "a.csv"}), Verdict::Deny, "file_access"),
    ];
    for (tool, input, expected, rule) in table {
        let d = when(files.clone(), tool, input.clone());
        assert_eq!(verdict(&d), (expected, rule), "{tool} {input}: {d:?}");
    }
}

#[test]
fn given_a_link_out_of_the_workspace_when_written_through_then_denied() {
    let facts = Facts { real_paths: [("out/link".to_owned(), "/etc/cron.d/evil".to_owned())].into() };
    let d = when_with(json!({"os_operations": ["file:write"]}), "file:write", json!({"path": "out/link"}), &facts);
    assert_eq!(verdict(&d), (Verdict::Deny, "file_access"));
    assert!(d.reason.contains("a link to"), "{}", d.reason);
    // A link that stays inside is fine.
    let facts = Facts { real_paths: [("out/link".to_owned(), format!("{WORKSPACE}/real"))].into() };
    let d = when_with(json!({"os_operations": ["file:write"]}), "file:write", json!({"path": "out/link"}), &facts);
    assert_eq!(verdict(&d), (Verdict::Allow, "tools"));
}

#[test]
fn urls_follow_the_network_level_and_the_allowlist() {
    let nav = |network: &str, url: &str| {
        when(
            json!({"os_operations": ["browser:navigate"], "network": network, "url_allowlist": ["example.com", "*.corp.test", "https://api.vendor.test/v1"]}),
            "browser:navigate",
            json!({"url": url}),
        )
    };
    assert_eq!(verdict(&nav("none", "https://example.com")), (Verdict::Deny, "network"));
    assert_eq!(verdict(&nav("filtered", "https://example.com/a")), (Verdict::Allow, "tools"));
    assert_eq!(verdict(&nav("filtered", "https://docs.example.com/a")), (Verdict::Allow, "tools"));
    assert_eq!(verdict(&nav("filtered", "https://wiki.corp.test")), (Verdict::Allow, "tools"));
    assert_eq!(verdict(&nav("filtered", "https://api.vendor.test/other")), (Verdict::Allow, "tools"));
    assert_eq!(verdict(&nav("filtered", "https://evil-example.com")), (Verdict::Deny, "url_allowlist"));
    assert_eq!(verdict(&nav("filtered", "https://example.com.evil.test")), (Verdict::Deny, "url_allowlist"));
    assert_eq!(verdict(&nav("filtered", "https://user@evil.test/?example.com")), (Verdict::Deny, "url_allowlist"));
    assert_eq!(verdict(&nav("filtered", "file:///etc/passwd")), (Verdict::Deny, "network"));
    assert_eq!(verdict(&nav("local", "http://127.0.0.1:8080/")), (Verdict::Allow, "tools"));
    assert_eq!(verdict(&nav("local", "http://[::1]/")), (Verdict::Allow, "tools"));
    assert_eq!(verdict(&nav("local", "https://example.com")), (Verdict::Deny, "network"));
    assert_eq!(verdict(&nav("full", "https://anything.test")), (Verdict::Allow, "tools"));
    let d = when(
        json!({"tools": ["WebFetch"], "network": "filtered", "url_allowlist": ["example.com"]}),
        "WebFetch",
        json!({"url": "https://other.test", "prompt": "x"}),
    );
    assert_eq!(verdict(&d), (Verdict::Deny, "url_allowlist"));
}

#[test]
fn shell_commands_run_only_from_the_allowlist_and_elsewhere_ask_or_deny() {
    let shell = |require: bool| json!({"os_operations": ["shell:exec"], "tools": ["Bash"], "shell": {"allowed_commands": ["git", "ls"], "allowed_cwd": ["/repos/*"], "require_approval_outside_allowlist": require}});
    let table = [
        (json!({"command": "git status"}), true, Verdict::Allow, "tools"),
        (json!({"command": "/usr/bin/git log --oneline"}), true, Verdict::Allow, "tools"),
        (json!({"command": "GIT_PAGER=cat git log && ls -la"}), true, Verdict::Allow, "tools"),
        (json!({"command": "git status", "cwd": "/repos/app"}), true, Verdict::Allow, "tools"),
        (json!({"command": "rm -rf /"}), false, Verdict::Deny, "shell.allowed_commands"),
        (json!({"command": "rm -rf /"}), true, Verdict::Ask, "shell.allowed_commands"),
        (json!({"command": "git status; rm -rf /"}), false, Verdict::Deny, "shell.allowed_commands"),
        (json!({"command": "git log | sh"}), false, Verdict::Deny, "shell.allowed_commands"),
        (json!({"command": "git $(rm -rf /)"}), false, Verdict::Deny, "shell.allowed_commands"),
        (json!({"command": "ls > /etc/passwd"}), true, Verdict::Ask, "shell.allowed_commands"),
        (json!({"command": "git status", "cwd": "/etc"}), false, Verdict::Deny, "shell.allowed_cwd"),
        (json!({"command": "git status", "cwd": "/etc"}), true, Verdict::Ask, "shell.allowed_cwd"),
        (json!({"command": "git status", "cwd": "../../x"}), false, Verdict::Deny, "shell.allowed_cwd"),
        (json!({"command": "  "}), true, Verdict::Deny, "shell.allowed_commands"),
    ];
    for (input, require, expected, rule) in table {
        for tool in ["shell:exec", "Bash"] {
            let d = when(shell(require), tool, input.clone());
            assert_eq!(verdict(&d), (expected, rule), "{tool} {input} require={require}: {d:?}");
        }
    }
    // Empty allowed_commands is fail-closed, whatever require_approval says.
    let d = when(json!({"os_operations": ["shell:exec"]}), "shell:exec", json!({"command": "ls"}));
    assert_eq!(verdict(&d), (Verdict::Deny, "shell.allowed_commands"));
}

#[test]
fn browser_gates_make_a_human_decide() {
    let m = json!({"os_operations": ["browser:click", "browser:type"], "browser": {"approval_required_selectors": ["#buy"], "approval_required_text_patterns": ["(?i)purchase|delete"]}});
    assert_eq!(verdict(&when(m.clone(), "browser:click", json!({"selector": "button#buy-now"}))), (Verdict::Ask, "browser.approval_required_selectors"));
    assert_eq!(
        verdict(&when(m.clone(), "browser:click", json!({"selector": "#next", "text": "Confirm purchase"}))),
        (Verdict::Ask, "browser.approval_required_text_patterns")
    );
    assert_eq!(
        verdict(&when(m.clone(), "browser:type", json!({"selector": "#q", "text": "DELETE account"}))),
        (Verdict::Ask, "browser.approval_required_text_patterns")
    );
    assert_eq!(verdict(&when(m, "browser:click", json!({"selector": "#next", "text": "Next page"}))), (Verdict::Allow, "tools"));
    // No gates: no approval needed.
    assert_eq!(verdict(&when(json!({"os_operations": ["browser:click"]}), "browser:click", json!({"selector": "#buy"}))), (Verdict::Allow, "tools"));
}

#[test]
fn publishing_is_allowed_on_the_declared_outputs_only() {
    let m = json!({"outputs": ["atasira.box.release-notes.result"]});
    assert_eq!(verdict(&when(m.clone(), PUBLISH, json!({"topic": "atasira.box.release-notes.result"}))), (Verdict::Allow, "outputs"));
    assert_eq!(verdict(&when(m.clone(), PUBLISH, json!({"topic": "atasira.box.gateway.approval"}))), (Verdict::Deny, "outputs"));
    assert_eq!(verdict(&when(m, PUBLISH, json!({}))), (Verdict::Deny, "outputs"));
    assert_eq!(verdict(&when(json!({}), PUBLISH, json!({"topic": "x"}))), (Verdict::Deny, "outputs"));
}

#[test]
fn notifications_go_to_the_declared_recipients_only() {
    let m = json!({
        "os_operations": ["notify:email", "notify:line"],
        "credentials": {"allowed_vaults": ["ops"]},
        "notify": {"email": {"vault": "ops", "item": "smtp", "recipients": ["ops@example.com"]}, "line": {"vault": "ops", "item": "line"}}
    });
    assert_eq!(verdict(&when(m.clone(), "notify:email", json!({"to": "ops@example.com"}))), (Verdict::Allow, "tools"));
    assert_eq!(verdict(&when(m.clone(), "notify:email", json!({"to": ["ops@example.com", "x@evil.test"]}))), (Verdict::Deny, "notify.email.recipients"));
    assert_eq!(verdict(&when(m.clone(), "notify:email", json!({}))), (Verdict::Deny, "notify.email.recipients"));
    // No recipients declared: any recipient; broadcast only when declared.
    assert_eq!(verdict(&when(m.clone(), "notify:line", json!({"to": "U123"}))), (Verdict::Allow, "tools"));
    assert_eq!(verdict(&when(m, "notify:line", json!({"broadcast": true}))), (Verdict::Deny, "notify.line.broadcast"));
    let undeclared = json!({"os_operations": ["notify:email"]});
    assert_eq!(verdict(&when(undeclared, "notify:email", json!({"to": "a@b.test"}))), (Verdict::Deny, "notify.email"));
}

#[test]
fn dangerous_tools_ask_unless_overridden_and_an_override_can_switch_a_tool_off() {
    let m = json!({"os_operations": ["process:kill", "file:read"]});
    assert_eq!(verdict(&when(m, "process:kill", json!({"pid": 1}))), (Verdict::Ask, "dangerous_tool_overrides.process:kill"));
    let allowed = json!({"os_operations": ["process:kill"], "dangerous_tool_overrides": {"process:kill": true}});
    assert_eq!(verdict(&when(allowed, "process:kill", json!({"pid": 1}))), (Verdict::Allow, "tools"));
    let off = json!({"os_operations": ["file:read"], "dangerous_tool_overrides": {"file:read": false}});
    assert_eq!(verdict(&when(off, "file:read", json!({"path": "a"}))), (Verdict::Deny, "dangerous_tool_overrides.file:read"));
}

#[test]
fn an_oversized_input_is_denied_unread_and_hooks_spelling_is_read() {
    let d = when(json!({"tools": ["Write"]}), "Write", json!({"file_path": "a", "content": "x".repeat(INPUT_BYTES)}));
    assert_eq!(verdict(&d), (Verdict::Deny, "tools"));
    let hook: ToolCall = serde_json::from_value(json!({"tool_name": "Bash", "tool_input": {"command": "ls"}, "session_id": "s"})).expect("hook input");
    assert_eq!(hook.tool, "Bash");
    assert_eq!(paths_of(&call("file:copy", json!({"source": "a", "destination": "b"}))), ["a", "b"]);
    assert_eq!(paths_of(&call("Bash", json!({"command": "ls", "cwd": "/x"}))), ["/x"]);
}
