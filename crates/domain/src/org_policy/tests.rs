//! Given a policy, when a request is put to it, then the verdict (R-POLICY-1).

use super::*;
use crate::os_operation::over_limit;

fn manifest(yaml: &str) -> BoxManifest {
    BoxManifest::from_yaml_str(yaml).expect("a valid manifest").manifest
}

fn agent() -> Principal {
    Principal::new("bot-1", Role::Member, Kind::Agent)
}

fn admin() -> Principal {
    Principal::new("alice", Role::Admin, Kind::Human)
}

const NO_FULL_NETWORK: &str = r#"
@id("no-full-network")
@reason("Boxes may not reach the whole network")
forbid(principal, action, resource) when { resource.network == "full" };
"#;

const TWO_FOR_SHELL: &str = r#"
@id("two-for-shell")
@approvals("2")
permit(principal, action in [Action::"draft", Action::"change"], resource)
  when { resource.os_operations.contains("shell:exec") };
"#;

fn verdict(policy: &str, input: &Input) -> Verdict {
    PolicyDocument::parse(policy).expect("the policy loads").evaluate(3, input)
}

#[test]
fn given_a_rule_forbidding_full_network_when_a_draft_asks_for_it_then_it_is_denied_naming_the_rule() {
    let m = manifest("box_type: crawler\npurpose: p\nnetwork: full\n");
    let v = verdict(NO_FULL_NETWORK, &Input::draft(&agent(), &m, &OverLimit::default()));
    assert!(v.denied(), "{v:?}");
    assert_eq!(v.rules, ["no-full-network"]);
    assert_eq!(v.refusal(), "policy version 3, rule no-full-network: Boxes may not reach the whole network");
}

#[test]
fn given_a_rule_forbidding_full_network_when_a_draft_stays_filtered_then_it_is_allowed_as_without_policy() {
    let m = manifest("box_type: crawler\npurpose: p\nnetwork: filtered\nurl_allowlist: [\"https://example.com\"]\n");
    let v = verdict(NO_FULL_NETWORK, &Input::draft(&agent(), &m, &OverLimit::default()));
    assert_eq!(v, Verdict { version: 3, ..Verdict::unpoliced() });
}

#[test]
fn given_a_permit_asking_two_approvals_for_shell_when_a_change_adds_it_then_two_are_required() {
    let m = manifest("box_type: ops\npurpose: p\nos_operations: [\"shell:exec\"]\n");
    let limit = over_limit(&m.os_operations, &m.tools);
    let v = verdict(TWO_FOR_SHELL, &Input::change(&admin(), &m, &limit, "b1", &["shell:exec".to_owned()]));
    assert_eq!((v.decision, v.approvals_required, v.rules.clone()), (PolicyDecision::Allow, 2, vec!["two-for-shell".to_owned()]));
    // when the same Box is launched, the rule does not apply to launches
    let launch = verdict(TWO_FOR_SHELL, &Input::launch(&admin(), &m, "b1", "l1", &Default::default()));
    assert_eq!(launch.approvals_required, 1);
}

#[test]
fn given_a_confirm_rule_when_matched_then_the_second_confirmation_is_required() {
    let policy = r#"@id("confirm-agents") @confirm("true") permit(principal, action == Action::"draft", resource) when { principal.kind == "agent" };"#;
    let m = manifest("box_type: notes\npurpose: p\n");
    assert!(verdict(policy, &Input::draft(&agent(), &m, &OverLimit::default())).confirm);
    assert!(!verdict(policy, &Input::draft(&admin(), &m, &OverLimit::default())).confirm);
}

#[test]
fn given_rules_on_vaults_and_context_when_evaluated_then_sets_and_context_are_readable() {
    let policy = r#"
@id("finance-vaults")
forbid(principal, action, resource)
  when { resource.box_type like "finance-*" && !(["finance"].containsAll(resource.credentials.allowed_vaults)) };
@id("no-agent-browser")
forbid(principal, action == Action::"draft", resource)
  when { principal.kind == "agent" && context.over_limit_ops.contains("browser:navigate") };
"#;
    let vaults = manifest("box_type: finance-report\npurpose: p\ncredentials: {allowed_vaults: [finance, hr]}\n");
    assert_eq!(verdict(policy, &Input::draft(&admin(), &vaults, &OverLimit::default())).rules, ["finance-vaults"]);
    let fine = manifest("box_type: finance-report\npurpose: p\ncredentials: {allowed_vaults: [finance]}\n");
    assert!(!verdict(policy, &Input::draft(&admin(), &fine, &OverLimit::default())).denied());
    let browsing = manifest("box_type: web\npurpose: p\nos_operations: [\"browser:navigate\"]\n");
    let limit = OverLimit { over_limit: true, over_limit_ops: vec!["browser:navigate".into()], over_limit_tools: vec![] };
    assert_eq!(verdict(policy, &Input::draft(&agent(), &browsing, &limit)).rules, ["no-agent-browser"]);
}

#[test]
fn given_a_forbid_rule_that_errs_when_evaluated_then_it_refuses() {
    // `resource.no_such_key` errs on every Box: the rule cannot be evaluated
    let policy = r#"@id("broken") forbid(principal, action, resource) when { resource.no_such_key == 1 };"#;
    let m = manifest("box_type: notes\npurpose: p\n");
    let v = verdict(policy, &Input::draft(&admin(), &m, &OverLimit::default()));
    assert!(v.denied());
    assert_eq!(v.rules, ["broken"]);
    assert!(v.refusal().contains("could not be evaluated"), "{}", v.refusal());
}

/// Calls `f` with less than `left` bytes of this thread's stack remaining.
fn with_stack_under(left: usize, f: &mut dyn FnMut()) {
    let mut room = [0u8; 4096];
    std::hint::black_box(&mut room);
    if stacker::remaining_stack().is_some_and(|r| r < left) {
        f();
    } else {
        with_stack_under(left, f);
    }
}

#[test]
fn given_a_caller_deep_in_its_stack_when_a_rule_is_evaluated_then_the_rule_decides_not_the_stack() {
    // given a rule that forbids full network, and a caller with under Cedar's 100 KiB left
    let m = manifest("box_type: crawler\npurpose: p\nnetwork: full\n");
    let document = PolicyDocument::parse(NO_FULL_NETWORK).expect("the policy loads");
    let mut got = None;
    let deep = std::thread::Builder::new().stack_size(1 << 20).spawn(move || {
        with_stack_under(96 * 1024, &mut || got = Some(document.evaluate(3, &Input::draft(&agent(), &m, &OverLimit::default()))));
        got
    });
    // when it is evaluated there, then the verdict is the rule's, with its reason
    let v = deep.expect("thread").join().expect("evaluated").expect("a verdict");
    assert_eq!(v.refusal(), "policy version 3, rule no-full-network: Boxes may not reach the whole network");
}

#[test]
fn given_the_same_request_when_evaluated_twice_then_the_verdict_is_the_same() {
    let policy = format!("{NO_FULL_NETWORK}\n{TWO_FOR_SHELL}");
    let m = manifest("box_type: ops\npurpose: p\nnetwork: full\nos_operations: [\"shell:exec\"]\nloop_control: {timeout_s: 12.5}\n");
    let doc = PolicyDocument::parse(&policy).expect("loads");
    let bot = agent();
    let input = Input::draft(&bot, &m, &OverLimit::default());
    assert_eq!(doc.evaluate(1, &input), doc.evaluate(1, &input));
}

#[test]
fn given_bad_texts_when_parsed_then_each_is_refused_naming_the_problem() {
    let cases = [
        ("", "empty"),
        ("permit(principal, action, resource", "does not parse"),
        ("@approvals(\"2\") forbid(principal, action, resource);", "belong on permit"),
        ("@approvals(\"11\") permit(principal, action, resource);", "@approvals must be"),
        ("@confirm(\"maybe\") permit(principal, action, resource);", "@confirm must be"),
        ("@id(\"a\") permit(principal, action, resource); @id(\"a\") forbid(principal, action, resource);", "another rule has this @id"),
        ("@id(\"a b\") permit(principal, action, resource);", "@id must be"),
        ("@owner(\"x\") permit(principal, action, resource);", "unknown annotation @owner"),
        ("permit(principal == ?principal, action, resource);", "templates"),
    ];
    for (text, expected) in cases {
        let err = PolicyDocument::parse(text).expect_err(text).to_string();
        assert!(err.contains(expected), "{text:?}: {err}");
    }
    let long = "// x\n".repeat(MAX_TEXT_BYTES / 5 + 1);
    assert!(matches!(PolicyDocument::parse(&long), Err(PolicyError::TooLong(_))));
}

#[test]
fn given_rules_without_ids_when_parsed_then_they_are_named_by_their_place() {
    let doc = PolicyDocument::parse("forbid(principal, action, resource) when { resource.network == \"full\" };\n@id(\"x\") permit(principal, action, resource);\nforbid(principal, action == Action::\"launch\", resource);").expect("loads");
    let ids: Vec<&str> = doc.rules().iter().map(|r| r.id.as_str()).collect();
    assert_eq!(ids, ["policy0", "x", "policy2"]);
    assert_eq!(
        doc.digest(),
        digest_of(
            "forbid(principal, action, resource) when { resource.network == \"full\" };\n@id(\"x\") permit(principal, action, resource);\nforbid(principal, action == Action::\"launch\", resource);"
        )
    );
}

#[test]
fn given_a_verdict_when_recorded_and_read_back_then_it_is_the_same() {
    let v = Verdict { version: 2, decision: PolicyDecision::Allow, rules: vec!["two-for-shell".into()], reason: None, approvals_required: 2, confirm: true };
    let json = serde_json::to_value(&v).expect("serializes");
    assert_eq!(json, json!({"version": 2, "decision": "allow", "rules": ["two-for-shell"], "approvals_required": 2, "confirm": true}));
    assert_eq!(serde_json::from_value::<Verdict>(json).expect("reads"), v);
}
