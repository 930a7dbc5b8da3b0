//! Given/when/then tests of the manifest and draft request on the wire (R-ARCH-3).

use super::*;
use atasira_domain::draft_request::DraftRequestError;
use proptest::prelude::*;
use prost::Message;

const SAMPLE: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/sales-report.yaml"));

/// Every key of the schema set, with free-form objects of every JSON kind.
const FULL: &str = r##"
box_type: full-box
version: 2.3.4
name: Full
description: Every key set
capabilities: [reports, mail]
agent_kind: mentor
resource_limits: {cpu: 1.5, memory_mb: 512, gpu: false, tags: [a, b], nested: {deep: {x: -3, y: null}}}
tool_policies: {Bash: {timeout_s: 2.5, allow: [ls, cat]}}
config_defaults:
  threshold: 1000000
  ratio: 0.25
  enabled: true
  nothing: null
  list: [1, two, 3.5, false, null, {k: v}, [nested]]
  empty_map: {}
  empty_list: []
tools: [Read, Write]
os_operations: [file:read, shell:exec, notify:email, notify:line, op:read]
file_access: ["read:/data/*", "write:/out/*"]
network: filtered
url_allowlist: [example.com]
allowed_apps: [Safari]
dangerous_tool_overrides: {Bash: true, rm: false}
trigger_type: event
trigger_event: sales.csv.arrived
purpose: Do everything
prohibited_actions: [Never delete anything]
loop_control: {max_iterations: 7, timeout_s: 12.5, escalate_on_failure: false}
business_procedure:
  - step: 1
    description: "Read rows above {threshold}"
    tool: file:read
    args_schema: {path: /data/x.csv, opts: {limit: 10, strict: true, ratio: 0.5, none: null, items: [1, -2]}}
  - {step: 2, description: no arguments, tool: notify:email}
outputs: [report.pdf]
llm: {provider: anthropic, node: gpu-1, required: true, min_tier: 2}
required_access:
  - {type: git_remote, url: "https://example.com/r.git"}
  - {type: ssh_target, host: build, user: ci, port: 2222}
  - {type: ssh_target, host: other, user: ci}
  - {type: netrc_entry, machine: api.example.com, login: bot, vault: sales, item: api-token}
credentials: {allowed_vaults: [sales, ops], token_env_var: OP_TOKEN}
shell: {allowed_commands: [ls, cat], allowed_cwd: [/tmp], require_approval_outside_allowlist: false}
notify:
  email: {vault: sales, item: smtp, recipients: [a@example.com]}
  line: {vault: ops, item: line-token, broadcast: true}
browser: {approval_required_selectors: ["#buy"], approval_required_text_patterns: [Pay now]}
"##;

fn load(yaml: &str) -> BoxManifest {
    match BoxManifest::from_yaml_str(yaml) {
        Ok(loaded) => loaded.manifest,
        Err(e) => panic!("expected a valid manifest, got {e}"),
    }
}

/// Domain -> proto -> bytes -> proto -> domain.
fn over_the_wire(m: &BoxManifest) -> BoxManifest {
    let bytes = v1::BoxManifest::from(m).encode_to_vec();
    let decoded = v1::BoxManifest::decode(bytes.as_slice()).expect("decodes");
    BoxManifest::try_from(decoded).expect("converts back")
}

fn refused_key(m: v1::BoxManifest) -> String {
    BoxManifest::try_from(m).expect_err("refused").0.key
}

fn minimal_wire() -> v1::BoxManifest {
    v1::BoxManifest { box_type: "a".into(), purpose: "p".into(), ..Default::default() }
}

fn plan_error_keys(r: v1::BoxDraftCreateRequest) -> Vec<String> {
    let err = BoxDraftCreateRequest::from(r).plan().expect_err("refused");
    assert_eq!(err.code(), ErrorCode::BoxManifestValidation, "{err}");
    match err {
        DraftRequestError::Invalid(errors) => errors.into_iter().map(|e| e.key).collect(),
        other => panic!("expected field errors, got {other:?}"),
    }
}

#[test]
fn given_the_sample_manifest_when_it_crosses_the_wire_then_it_and_its_digest_are_unchanged() {
    // R-ARCH-3
    let manifest = load(SAMPLE);
    let back = over_the_wire(&manifest);
    assert_eq!(back, manifest);
    assert_eq!(back.digest(), manifest.digest());
}

#[test]
fn given_a_manifest_with_every_key_set_when_it_crosses_the_wire_then_it_is_unchanged() {
    // R-ARCH-3
    let manifest = load(FULL);
    assert_eq!(manifest.required_access.len(), 4, "the fixture sets every kind");
    let back = over_the_wire(&manifest);
    assert_eq!(back, manifest);
    assert_eq!(back.digest(), manifest.digest());
    assert!(back.config_defaults["threshold"].is_i64(), "integers stay integers");
}

#[test]
fn given_a_minimal_wire_manifest_then_absent_values_are_the_seeds_defaults() {
    // R-MAN-3
    assert_eq!(BoxManifest::try_from(minimal_wire()).expect("valid"), load("box_type: a\npurpose: p\n"));
}

#[test]
fn given_values_the_domain_refuses_then_the_error_names_the_field() {
    // R-MAN-1, R-DRAFT-2, R-DRAFT-5
    assert_eq!(refused_key(v1::BoxManifest { box_type: "Bad Type".into(), ..minimal_wire() }), "box_type");
    assert_eq!(refused_key(v1::BoxManifest { box_type: "audit".into(), ..minimal_wire() }), "box_type");
    assert_eq!(refused_key(v1::BoxManifest { os_operations: vec!["file:read".into(), "file:delete".into()], ..minimal_wire() }), "os_operations[1]");
    assert_eq!(refused_key(v1::BoxManifest { agent_kind: 9, ..minimal_wire() }), "agent_kind");
    assert_eq!(refused_key(v1::BoxManifest { network: 9, ..minimal_wire() }), "network");
    assert_eq!(refused_key(v1::BoxManifest { trigger_type: -1, ..minimal_wire() }), "trigger_type");
    let no_kind = v1::BoxManifest { required_access: vec![v1::RequiredAccess { kind: None }], ..minimal_wire() };
    assert_eq!(refused_key(no_kind), "required_access[0].type");
    let big_port =
        v1::RequiredAccess { kind: Some(AccessKind::SshTarget(v1::required_access::SshTarget { host: "h".into(), user: "u".into(), port: 70_000 })) };
    assert_eq!(refused_key(v1::BoxManifest { required_access: vec![big_port], ..minimal_wire() }), "required_access[0].port");
}

#[test]
fn given_each_kind_of_required_access_then_it_round_trips_and_port_0_means_22() {
    // R-PROV-1
    for access in load(FULL).required_access {
        assert_eq!(RequiredAccess::try_from(v1::RequiredAccess::from(&access)), Ok(access));
    }
    let default_port = v1::RequiredAccess { kind: Some(AccessKind::SshTarget(v1::required_access::SshTarget { host: "h".into(), user: "u".into(), port: 0 })) };
    assert_eq!(RequiredAccess::try_from(default_port), Ok(RequiredAccess::SshTarget { host: "h".into(), user: "u".into(), port: 22 }));
    assert_eq!(RequiredAccess::try_from(v1::RequiredAccess { kind: None }).expect_err("no kind").0.key, "type");
}

#[test]
fn given_numbers_in_a_struct_then_integers_come_back_as_integers_and_non_finite_as_null() {
    // R-ARCH-3
    let map = json!({"n": 3, "neg": -4, "f": 2.5}).as_object().cloned().expect("object");
    assert_eq!(Value::Object(struct_from_proto(struct_to_proto(&map))), json!({"n": 3, "neg": -4, "f": 2.5}));
    let number = |f: f64| value_from_proto(prost_types::Value { kind: Some(Kind::NumberValue(f)) });
    assert_eq!(number(2.0), json!(2), "documented: an integral float reads as an integer");
    assert_eq!(number(f64::NAN), Value::Null);
    assert_eq!(number(f64::INFINITY), Value::Null);
    assert_eq!(number(1e300), json!(1e300), "beyond i64 stays a float");
    assert_eq!(value_from_proto(prost_types::Value { kind: None }), Value::Null);
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        // Integers an f64 holds exactly.
        (-(1i64 << 53)..(1i64 << 53)).prop_map(Value::from),
        // Floats with a fractional part (integral ones read back as integers).
        (-1e12f64..1e12).prop_filter("has a fractional part", |f| f.fract() != 0.0).prop_map(Value::from),
        "\\PC{0,8}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 32, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,6}", inner, 0..4).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    /// R-ARCH-3: a JSON object survives Struct and its encoding unchanged.
    #[test]
    fn json_objects_survive_struct(entries in prop::collection::btree_map("\\PC{0,8}", json_value(), 0..6)) {
        let map: Map<String, Value> = entries.into_iter().collect();
        let bytes = struct_to_proto(&map).encode_to_vec();
        let back = struct_from_proto(prost_types::Struct::decode(bytes.as_slice()).expect("decodes"));
        prop_assert_eq!(back, map);
    }
}

#[test]
fn given_an_empty_draft_request_then_the_plan_names_box_type_and_purpose() {
    // R-DRAFT-6, R-DRAFT-14
    let keys = plan_error_keys(v1::BoxDraftCreateRequest::default());
    assert!(keys.contains(&"box_type".to_owned()) && keys.contains(&"purpose".to_owned()), "{keys:?}");
}

#[test]
fn given_a_required_access_with_no_kind_then_the_plan_names_its_index() {
    // R-DRAFT-15
    let request =
        v1::BoxDraftCreateRequest { box_type: "a".into(), purpose: "p".into(), required_access: vec![v1::RequiredAccess { kind: None }], ..Default::default() };
    assert_eq!(plan_error_keys(request), vec!["required_access[0].type"]);
}

#[test]
fn given_a_full_draft_request_then_the_domain_request_carries_every_field() {
    // R-DRAFT-1, R-DRAFT-6, R-DRAFT-7, R-DRAFT-15
    let mut access: Vec<v1::RequiredAccess> = load(FULL).required_access.iter().map(Into::into).collect();
    access.push(v1::RequiredAccess { kind: Some(AccessKind::SshTarget(v1::required_access::SshTarget { host: "h".into(), user: "u".into(), port: 0 })) });
    let wire = v1::BoxDraftCreateRequest {
        box_type: "sales-report".into(),
        purpose: "Weekly report".into(),
        name: "Sales".into(),
        success_criteria: vec!["Every Monday".into()],
        os_operations: vec!["file:read".into()],
        tools: vec!["Read".into()],
        allowed_apps: vec!["Numbers".into()],
        url_allowlist: vec!["example.com".into()],
        file_access: vec!["read:/data/*".into()],
        prohibited_actions: vec!["Never mail outside".into()],
        allow_network: true,
        required_access: access,
    };
    let plan = BoxDraftCreateRequest::from(wire).plan().expect("valid");
    let m = plan.manifest;
    assert_eq!(m.purpose, "Weekly report\n\n## Success criteria\n- Every Monday");
    assert_eq!((m.name.as_str(), m.network), ("Sales", Network::Filtered));
    assert_eq!(m.os_operations, vec![OSOperation::FileRead]);
    assert_eq!((m.allowed_apps.len(), m.url_allowlist.len(), m.file_access.len(), m.prohibited_actions.len()), (1, 1, 1, 1));
    let mut expected = load(FULL).required_access;
    expected.push(RequiredAccess::SshTarget { host: "h".into(), user: "u".into(), port: 22 });
    assert_eq!(m.required_access, expected);
}
