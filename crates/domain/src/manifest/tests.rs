//! Given/when/then tests of the manifest schema (SPEC §8).

use serde_json::json;

use super::*;

fn load(yaml: &str) -> Loaded {
    match BoxManifest::from_yaml_str(yaml) {
        Ok(l) => l,
        Err(e) => panic!("expected a valid manifest, got {e}"),
    }
}

fn errors(yaml: &str) -> Vec<FieldError> {
    match BoxManifest::from_yaml_str(yaml) {
        Err(LoadError::Invalid(report)) => report.errors,
        other => panic!("expected validation errors, got {other:?}"),
    }
}

fn keys(errs: &[FieldError]) -> Vec<&str> {
    errs.iter().map(|e| e.key.as_str()).collect()
}

const MINIMAL: &str = "box_type: sales-report\npurpose: weekly sales report\n";

#[test]
fn given_only_the_required_keys_when_loaded_then_defaults_apply() {
    // R-MAN-3
    let m = load(MINIMAL).manifest;
    assert_eq!(m.version, "1.0.0");
    assert_eq!(m.agent_kind, AgentKind::Worker);
    assert_eq!(m.network, Network::None);
    assert_eq!(m.trigger_type, TriggerType::Manual);
    assert_eq!(m.loop_control, LoopControl { max_iterations: 30, timeout_s: 300.0, escalate_on_failure: true });
    assert!(m.tools.is_empty() && m.os_operations.is_empty() && m.config_defaults.is_empty());
    assert!(m.shell.require_approval_outside_allowlist);
}

#[test]
fn given_a_partial_loop_control_when_loaded_then_missing_limits_default() {
    // R-MAN-3
    let m = load(&format!("{MINIMAL}loop_control:\n  max_iterations: 5\n")).manifest;
    assert_eq!(m.loop_control.max_iterations, 5);
    assert_eq!(m.loop_control.timeout_s, 300.0);
    assert!(m.loop_control.escalate_on_failure);
}

#[test]
fn given_no_box_type_or_purpose_when_loaded_then_both_are_named() {
    // SPEC §8: box_type and purpose are required
    assert_eq!(keys(&errors("name: x\n")), vec!["box_type", "purpose"]);
    assert_eq!(keys(&errors("")), vec!["box_type", "purpose"]);
    assert_eq!(keys(&errors("box_type: a\npurpose: '   '\n")), vec!["purpose"]);
}

#[test]
fn given_bad_enum_values_when_loaded_then_each_error_names_its_key() {
    // R-MAN-1
    let errs = errors(&format!("{MINIMAL}agent_kind: boss\nnetwork: internet\ntrigger_type: cron\nos_operations: [file:read, shell:run, 3]\n"));
    assert_eq!(keys(&errs), vec!["agent_kind", "os_operations[1]", "os_operations[2]", "network", "trigger_type"]);
    assert!(errs[0].message.contains("\"boss\""));
    assert!(errs[1].message.contains("shell:run"));
}

#[test]
fn given_a_reserved_or_malformed_box_type_when_loaded_then_box_type_is_named() {
    // R-DRAFT-2, R-DRAFT-3
    assert_eq!(keys(&errors("box_type: heartbeat\npurpose: p\n")), vec!["box_type"]);
    assert_eq!(keys(&errors("box_type: Sales\npurpose: p\n")), vec!["box_type"]);
}

#[test]
fn given_wrong_types_when_loaded_then_nested_keys_are_named() {
    // R-MAN-1: errors name the key
    let errs = errors(&format!(
        "{MINIMAL}tools: [Read, 5]\nconfig_defaults: [1]\nloop_control: {{max_iterations: many}}\nbusiness_procedure: [{{step: 1}}, {{description: x}}]\nnotify: {{email: {{vault: 3}}}}\n"
    ));
    assert_eq!(keys(&errs), vec!["config_defaults", "tools[1]", "loop_control", "business_procedure[1]", "notify.email"]);
}

#[test]
fn given_a_schedule_trigger_when_the_cron_is_bad_then_trigger_schedule_is_named() {
    // R-MAN-5
    let base = format!("{MINIMAL}trigger_type: schedule\n");
    load(&format!("{base}trigger_schedule: '*/15 * * * *'\n"));
    load(&format!("{base}trigger_schedule: '0 9 * * MON-FRI'\n"));
    for bad in ["''", "'* * * *'", "'0 0 * * * *'", "'61 * * * *'", "'every monday'"] {
        let errs = errors(&format!("{base}trigger_schedule: {bad}\n"));
        assert_eq!(keys(&errs), vec!["trigger_schedule"], "{bad}");
    }
}

#[test]
fn given_an_event_trigger_when_the_topic_is_not_a_plain_subject_outside_atasira_then_trigger_event_is_named() {
    // R-TRIG-1: a topic a publisher can be granted, never one of atasira's or NATS's own
    let base = format!("{MINIMAL}trigger_type: event\n");
    load(&format!("{base}trigger_event: sales.csv.arrived\n"));
    load(&format!("{base}trigger_event: Orders_v2.new-item\n"));
    let deep = vec!["a"; TOPIC_TOKENS + 1].join(".");
    for bad in ["'sales.*'", "'sales.>'", "'a..b'", "'.a'", "'a b'", "atasira.box.gateway.approval", "_INBOX.x", "'$SYS.REQ.USER.AUTH'", deep.as_str()] {
        let errs = errors(&format!("{base}trigger_event: {bad}\n"));
        assert_eq!(keys(&errs), vec!["trigger_event"], "{bad}");
    }
    // Empty is legal but warned about: nothing starts the Box.
    let loaded = load(&format!("{base}trigger_event: ''\n"));
    assert!(loaded.warnings.iter().any(|w| w.contains("trigger_event")));
}

#[test]
fn given_a_bad_cron_without_schedule_trigger_then_it_is_only_a_warning() {
    // R-MAN-5: validated when trigger_type is schedule
    let loaded = load(&format!("{MINIMAL}trigger_schedule: 'nonsense'\n"));
    assert!(loaded.warnings.iter().any(|w| w.contains("trigger_schedule")));
}

#[test]
fn given_a_notify_vault_missing_from_credentials_then_the_double_gate_refuses() {
    // R-MAN-7
    let yaml = format!("{MINIMAL}notify:\n  email: {{vault: ops, item: smtp}}\n");
    let errs = errors(&yaml);
    assert_eq!(keys(&errs), vec!["notify.email.vault"]);
    assert!(errs[0].message.contains("credentials.allowed_vaults"));
    load(&format!("{yaml}credentials: {{allowed_vaults: [ops]}}\n"));
}

#[test]
fn given_legacy_phase_lists_when_loaded_then_tools_are_the_ordered_union_with_a_warning() {
    // R-MAN-2
    let loaded = load(&format!(
        "{MINIMAL}tools: [Read, Write]\npermissions:\n  tools:\n    phase1_allowed: [Write, Grep]\n    phase2_allowed: [Bash]\nos_operations: [browser:navigate, file:read]\n"
    ));
    assert_eq!(loaded.manifest.tools, vec!["Read", "Write", "Grep", "Bash"]);
    assert_eq!(loaded.manifest.effective_tools(), vec!["Read", "Write", "Grep", "Bash", "browser:navigate", "file:read"]);
    assert_eq!(loaded.warnings.iter().filter(|w| w.contains("deprecated")).count(), 2);
}

#[test]
fn given_os_operations_duplicating_tools_then_effective_tools_are_deduplicated() {
    // R-MAN-2
    let m = load(&format!("{MINIMAL}tools: [file:read, Read]\nos_operations: [file:read, file:read]\n")).manifest;
    assert_eq!(m.effective_tools(), vec!["file:read", "Read"]);
    assert_eq!(m.effective().tools, m.effective_tools());
}

#[test]
fn given_no_tools_at_all_then_a_fail_closed_warning() {
    // R-MAN-2
    assert!(load(MINIMAL).warnings.iter().any(|w| w.contains("fail-closed")));
}

#[test]
fn given_llm_phase_and_model_then_they_are_dropped_with_warnings() {
    // R-MAN-3
    let loaded = load(&format!("{MINIMAL}llm: {{provider: anthropic, phase: 2, model: gpt, min_tier: 2}}\n"));
    assert_eq!(loaded.manifest.llm.provider.as_deref(), Some("anthropic"));
    assert!(loaded.warnings.iter().any(|w| w.contains("llm.phase")));
    assert!(loaded.warnings.iter().any(|w| w.contains("llm.model")));
}

#[test]
fn given_unknown_top_level_keys_then_the_loader_ignores_them_with_a_warning() {
    // R-MAN-4
    let loaded = load(&format!("{MINIMAL}quality_gate: strict\ndocspi: {{a: 1}}\n"));
    assert!(loaded.warnings.iter().any(|w| w.contains("`quality_gate`")));
    assert!(loaded.warnings.iter().any(|w| w.contains("`docspi`")));
    assert!(!loaded.manifest.to_yaml().contains("quality_gate"));
}

#[test]
fn given_a_secret_in_required_access_then_it_is_refused_by_name() {
    // R-PROV-1: secrets are never stored
    let errs = errors(&format!(
        "{MINIMAL}required_access:\n  - {{type: netrc_entry, machine: m, login: l, vault: v, item: i, password: hunter2}}\n  - {{type: ftp}}\n"
    ));
    assert_eq!(keys(&errs), vec!["required_access[0].password", "required_access[1].type"]);
    let ok = load(&format!("{MINIMAL}required_access:\n  - {{type: ssh_target, host: h, user: u}}\n")).manifest;
    assert_eq!(ok.required_access, vec![RequiredAccess::SshTarget { host: "h".into(), user: "u".into(), port: 22 }]);
}

#[test]
fn given_a_port_with_a_zero_fraction_then_it_is_that_whole_number() {
    let ok = load(&format!("{MINIMAL}required_access:\n  - {{type: ssh_target, host: h, user: u, port: 2222.0}}\n")).manifest;
    assert_eq!(ok.required_access, vec![RequiredAccess::SshTarget { host: "h".into(), user: "u".into(), port: 2222 }]);
    for bad in ["22.5", "-1", "65536", "\"22\""] {
        let errs = errors(&format!("{MINIMAL}required_access:\n  - {{type: ssh_target, host: h, user: u, port: {bad}}}\n"));
        assert_eq!(keys(&errs), vec!["required_access[0]"], "{bad}");
    }
}

#[test]
fn given_null_values_then_defaults_apply() {
    // R-MAN-3
    let m = load(&format!("{MINIMAL}name:\ntools:\nloop_control:\n")).manifest;
    assert_eq!(m.name, "");
    assert_eq!(m.loop_control, LoopControl::default());
}

#[test]
fn given_hostile_input_then_loading_fails_cleanly() {
    // SPEC §8: at most 1 MiB, refused before parsing
    let big = vec![b'a'; MAX_MANIFEST_BYTES + 1];
    assert_eq!(BoxManifest::from_yaml_bytes(&big), Err(LoadError::TooLarge { size: MAX_MANIFEST_BYTES + 1 }));
    assert_eq!(BoxManifest::from_yaml_bytes(&[0xff, 0xfe, 0x00]), Err(LoadError::NotUtf8));
    assert!(matches!(BoxManifest::from_yaml_str("- a\n- b\n"), Err(LoadError::NotAMapping(_))));
    assert!(matches!(BoxManifest::from_yaml_str("just text"), Err(LoadError::NotAMapping(_))));
    assert!(matches!(BoxManifest::from_yaml_str("a: [b\n"), Err(LoadError::Syntax(_))));
    let deep = format!("box_type: a\npurpose: p\nconfig_defaults: {}{}\n", "[".repeat(10_000), "]".repeat(10_000));
    assert!(matches!(BoxManifest::from_yaml_str(&deep), Err(LoadError::Syntax(_))));
}

#[test]
fn given_a_list_far_over_its_bound_then_one_error_names_the_key_and_the_limit() {
    // R-ARCH-6: ten thousand bad entries are one error, not ten thousand
    let urls: Vec<String> = (0..10_000).map(|i| format!("  - {}\n", "x".repeat(50 + i % 3))).collect();
    let yaml = format!("{MINIMAL}url_allowlist:\n{}required_access: [{{type: git_remote, password: p}}]\n", urls.concat());
    let errs = errors(&yaml);
    assert_eq!(keys(&errs), ["url_allowlist", "required_access[0].password"]);
    assert_eq!(errs[0].message, "has 10000 entries; at most 64 are allowed");
}

#[test]
fn given_keys_each_within_bounds_but_a_manifest_over_the_cap_then_manifest_is_named() {
    // R-ARCH-6: whatever the path in, an event carrying a manifest fits the bus
    let step = |i: usize| json!({"step": i, "description": "\u{1}".repeat(2_000), "args_schema": {"a": "x".repeat(4_000)}});
    let mut obj = Map::new();
    obj.insert("box_type".into(), json!("big"));
    obj.insert("purpose".into(), json!("p"));
    obj.insert("business_procedure".into(), Value::Array((1..=50).map(step).collect()));
    let report = BoxManifest::from_object(obj).expect_err("over the cap");
    assert_eq!(keys(&report.errors), ["manifest"]);
    assert!(report.errors[0].message.contains(&bounds::MAX_MANIFEST_JSON_BYTES.to_string()), "{:?}", report.errors);
}

#[test]
fn version_bumps_minor_and_resets_patch() {
    // R-EDIT-1
    let mut m = load(MINIMAL).manifest;
    assert_eq!(m.bumped_minor_version().as_deref(), Some("1.1.0"));
    m.version = "2.9.4".into();
    assert_eq!(m.bumped_minor_version().as_deref(), Some("2.10.0"));
    assert_eq!(keys(&errors(&format!("{MINIMAL}version: one\n"))), vec!["version"]);
}

#[test]
fn digest_is_stable_and_content_bound() {
    // R-APPROVE-4: the token binds the manifest digest
    let a = load(MINIMAL).manifest;
    let b = load(&format!("{MINIMAL}name: ''\n")).manifest;
    assert_eq!(a.digest(), b.digest());
    assert!(a.digest().starts_with("sha256:"));
    let c = load(&format!("{MINIMAL}name: other\n")).manifest;
    assert_ne!(a.digest(), c.digest());
}

#[test]
fn a_full_manifest_survives_yaml_round_trip() {
    // SPEC §8
    let yaml = r##"
box_type: market-watch
version: 1.2.0
name: Market watch
description: ''
capabilities: [monitoring]
agent_kind: worker
resource_limits: {cpu: 1}
tool_policies: {Bash: {confirm: true}}
config_defaults: {watch_items: [{sku: A1, price: 1200}], purchase_enabled: false}
tools: [Read, Bash]
os_operations: [browser:navigate, shell:exec, notify:email]
file_access: ["read:/data/*"]
network: filtered
url_allowlist: [example.com]
allowed_apps: [Safari]
dangerous_tool_overrides: {hotkey_quit: true}
trigger_type: schedule
trigger_schedule: "*/15 * * * *"
trigger_event: ''
purpose: Watch prices and report.
prohibited_actions: [never buy]
loop_control: {max_iterations: 10, timeout_s: 60.5, escalate_on_failure: false}
business_procedure:
  - {step: 1, description: "check {watch_items}", tool: "browser:navigate", args_schema: {url: "https://<host>/"}}
outputs: [atasira.box.market-watch.result]
llm: {provider: anthropic, node: local, required: true, min_tier: 2}
required_access:
  - {type: git_remote, url: "https://example.com/repo.git"}
credentials: {allowed_vaults: [ops], token_env_var: OP_TOKEN}
shell: {allowed_commands: [ls], allowed_cwd: /tmp, require_approval_outside_allowlist: true}
notify: {email: {vault: ops, item: smtp, recipients: [a@example.com]}}
browser: {approval_required_selectors: ["#buy"], approval_required_text_patterns: []}
"##;
    let loaded = load(yaml);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let again = load(&loaded.manifest.to_yaml());
    assert_eq!(again.manifest, loaded.manifest);
    assert_eq!(loaded.manifest.shell.allowed_cwd, vec!["/tmp"]);
}

mod round_trip {
    //! SPEC §8: valid manifests survive a YAML round trip unchanged (property test).

    use proptest::collection::{btree_map, vec};
    use proptest::prelude::*;
    use serde_json::json;

    use super::super::*;
    use crate::box_type::RESERVED_BOX_TYPES;

    fn text() -> impl Strategy<Value = String> {
        // Any printable text, plus strings YAML would otherwise read as other types.
        prop_oneof![
            "\\PC{0,24}",
            Just("null".to_owned()),
            Just("~".to_owned()),
            Just("true".to_owned()),
            Just("1.5".to_owned()),
            Just("0x1F".to_owned()),
            Just("- a".to_owned()),
            Just("a: b".to_owned()),
            Just("line\nbreak".to_owned()),
        ]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(Value::from),
            text().prop_map(Value::from),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                vec(inner.clone(), 0..4).prop_map(Value::from),
                btree_map("[a-z_]{1,8}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect()))
            ]
        })
    }

    fn object() -> impl Strategy<Value = Map<String, Value>> {
        btree_map("[a-z_]{1,10}", json_value(), 0..4).prop_map(|m| m.into_iter().collect())
    }

    fn manifest() -> impl Strategy<Value = BoxManifest> {
        let box_type = "[a-z0-9][a-z0-9_-]{0,20}".prop_filter("not reserved", |s| !RESERVED_BOX_TYPES.contains(&s.as_str()));
        let ops = proptest::sample::subsequence(OSOperation::ALL.to_vec(), 0..6);
        let words = || vec(text(), 0..4);
        let step =
            (any::<i64>(), text(), text(), object()).prop_map(|(step, description, tool, args_schema)| ProcedureStep { step, description, tool, args_schema });
        let access = prop_oneof![
            text().prop_map(|url| RequiredAccess::GitRemote { url }),
            (text(), text(), any::<u16>()).prop_map(|(host, user, port)| RequiredAccess::SshTarget { host, user, port }),
            (text(), text(), text(), text()).prop_map(|(machine, login, vault, item)| RequiredAccess::NetrcEntry { machine, login, vault, item }),
        ];
        let part1 = (box_type, (0u32..50, 0u32..50, 0u32..50), text(), text(), words(), object(), object(), ops, words());
        let part2 = (
            prop_oneof![Just(Network::None), Just(Network::Local), Just(Network::Filtered), Just(Network::Full)],
            prop_oneof![Just(AgentKind::Dialog), Just(AgentKind::Worker), Just(AgentKind::Mentor), Just(AgentKind::Custom)],
            prop_oneof![
                Just((TriggerType::Manual, String::new())),
                Just((TriggerType::Schedule, "*/15 * * * *".to_owned())),
                Just((TriggerType::Event, "atasira.box.x.result".to_owned()))
            ],
            "\\PC{1,40}".prop_filter("not blank", |s| !s.trim().is_empty()),
            (1u32..10_000, 0.001f64..1e9, any::<bool>()),
            vec(step, 0..3),
            vec(access, 0..3),
            btree_map("[a-z]{1,6}", any::<bool>(), 0..3),
            (vec("[a-z]{1,6}", 0..3), any::<bool>()),
        );
        (part1, part2).prop_map(
            |(
                (box_type, (ma, mi, pa), name, description, tools, config_defaults, resource_limits, os_operations, prohibited_actions),
                (
                    network,
                    agent_kind,
                    (trigger_type, trigger_schedule),
                    purpose,
                    (max_iterations, timeout_s, escalate_on_failure),
                    business_procedure,
                    required_access,
                    dangerous_tool_overrides,
                    (vaults, broadcast),
                ),
            )| {
                let notify: BTreeMap<String, NotifyChannel> = vaults
                    .first()
                    .map(|v| {
                        [("line".to_owned(), NotifyChannel { vault: v.clone(), item: "bot".into(), recipients: vec!["u1".into()], broadcast })]
                            .into_iter()
                            .collect()
                    })
                    .unwrap_or_default();
                BoxManifest {
                    box_type: BoxType::parse(&box_type).expect("strategy yields valid box types"),
                    version: format!("{ma}.{mi}.{pa}"),
                    name,
                    description,
                    capabilities: prohibited_actions.clone(),
                    agent_kind,
                    resource_limits,
                    tool_policies: Map::new(),
                    config_defaults,
                    tools,
                    os_operations,
                    file_access: vec!["read:/data/*".into()],
                    network,
                    url_allowlist: vec![],
                    allowed_apps: vec![],
                    dangerous_tool_overrides,
                    trigger_type,
                    trigger_schedule,
                    trigger_event: String::new(),
                    purpose,
                    prohibited_actions,
                    loop_control: LoopControl { max_iterations, timeout_s, escalate_on_failure },
                    business_procedure,
                    outputs: vec![],
                    llm: Llm { provider: Some("anthropic".into()), node: None, required: Some(true), min_tier: Some(json!(2)) },
                    required_access,
                    credentials: Credentials { allowed_vaults: vaults, token_env_var: String::new() },
                    shell: Shell::default(),
                    notify,
                    browser: Browser::default(),
                }
            },
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// SPEC §8: save then load gives the same manifest, and the same digest.
        #[test]
        fn valid_manifests_survive_a_yaml_round_trip(m in manifest()) {
            prop_assert_eq!(m.validate(), vec![]);
            let yaml = m.to_yaml();
            let loaded = BoxManifest::from_yaml_str(&yaml).map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
            prop_assert_eq!(&loaded.manifest, &m, "YAML was:\n{}", yaml);
            prop_assert_eq!(loaded.manifest.digest(), m.digest());
        }
    }
}

#[test]
fn whole_numbers_may_be_written_with_a_zero_fraction_as_json_schema_integers_are() {
    // given a step and a loop limit written as 3.0 and 7.0; then they read as 3 and 7
    let m: BoxManifest = serde_json::from_value(serde_json::json!({
        "box_type": "wn", "purpose": "p",
        "business_procedure": [{"step": 3.0}, {"step": -4067315270067174.0}],
        "loop_control": {"max_iterations": 7.0},
    }))
    .expect("whole numbers");
    assert_eq!((m.business_procedure[0].step, m.business_procedure[1].step, m.loop_control.max_iterations), (3, -4_067_315_270_067_174, 7));
    // given a large whole number read from JSON text, as a request body is; then it is exact
    // (the fuzzer found -2111190071909749.0 read one unit in the last place off, as ...748.75)
    let step: ProcedureStep = serde_json::from_str(r#"{"step": -2111190071909749.0}"#).expect("exact whole number");
    assert_eq!(step.step, -2_111_190_071_909_749);
    // given a fraction or a value out of the type's range; then refused
    for bad in [serde_json::json!({"step": 3.5}), serde_json::json!({"step": 1e300})] {
        assert!(serde_json::from_value::<ProcedureStep>(bad.clone()).is_err(), "{bad}");
    }
    assert!(serde_json::from_value::<LoopControl>(serde_json::json!({"max_iterations": -1})).is_err());
}
