use super::*;
use atasira_domain::os_operation::{OVER_LIMIT_OPS, OVER_LIMIT_TOOLS};

/// A backend that answers every call with one answer and remembers the calls.
struct Recorder {
    answer: ApiAnswer,
    calls: std::sync::Mutex<Vec<ApiCall>>,
}

#[async_trait::async_trait]
impl Backend for Recorder {
    async fn call(&self, call: ApiCall, _: &Extensions) -> Result<ApiAnswer, String> {
        self.calls.lock().map_err(|e| e.to_string())?.push(call);
        Ok(self.answer.clone())
    }
}

fn recorder(status: u16, body: Value) -> Arc<Recorder> {
    Arc::new(Recorder { answer: ApiAnswer { status, body }, calls: Default::default() })
}

#[test]
fn exactly_the_eight_tools_each_with_a_description_and_an_object_schema() {
    let server = AtasiraMcp::new(recorder(200, json!({})));
    let tools = server.tool_router.list_all();
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    let mut expected = TOOL_NAMES.to_vec();
    expected.sort_unstable();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, expected);
    for tool in &tools {
        assert!(tool.description.as_deref().is_some_and(|d| d.len() > 200), "{} needs a description an LLM can use", tool.name);
        assert_eq!(tool.input_schema.get("type"), Some(&json!("object")), "{}", tool.name);
    }
    assert!(!names.iter().any(|n| n.contains("approve") || n.contains("reject")));
}

#[test]
fn the_draft_schema_lists_every_os_operation_and_requires_purpose_and_box_type() {
    let server = AtasiraMcp::new(recorder(200, json!({})));
    let tool = server.tool_router.get("atasira_create_box_draft").cloned().expect("the draft tool");
    let schema = Value::Object(tool.input_schema.as_ref().clone());
    let mut required: Vec<&str> = schema["required"].as_array().expect("required").iter().filter_map(Value::as_str).collect();
    required.sort_unstable();
    assert_eq!(required, ["box_type", "purpose"]);
    let listed: Vec<&str> = schema["properties"]["os_operations"]["items"]["enum"].as_array().expect("enum").iter().filter_map(Value::as_str).collect();
    let all: Vec<&str> = OSOperation::ALL.iter().map(|op| op.as_str()).collect();
    assert_eq!(listed, all);
    assert_eq!(schema["additionalProperties"], json!(false));
}

#[test]
fn the_descriptions_name_every_over_limit_operation_and_tool() {
    let schema_text = os_operations_schema(&mut SchemaGenerator::default()).as_value().to_string();
    for op in OVER_LIMIT_OPS {
        assert!(CREATE_DESCRIPTION.contains(op.as_str()), "{}", op.as_str());
        assert!(schema_text.contains(op.as_str()), "{}", op.as_str());
    }
    for tool in OVER_LIMIT_TOOLS {
        assert!(CREATE_DESCRIPTION.contains(tool), "{tool}");
    }
    for reserved in atasira_domain::box_type::RESERVED_BOX_TYPES {
        let field = CreateBoxDraft::json_schema(&mut SchemaGenerator::default()).as_value().to_string();
        assert!(field.contains(reserved), "{reserved}");
    }
}

#[test]
fn a_draft_maps_onto_the_rest_request() {
    let args: CreateBoxDraft = serde_json::from_value(json!({"purpose": "p", "box_type": "b", "tools": ["Read"], "name": ""})).expect("args");
    assert_eq!(args.request_body(), json!({"box_type": "b", "purpose": "p", "allow_network": false, "tools": ["Read"]}));
    let args: CreateBoxDraft = serde_json::from_value(json!({
        "purpose": "p", "box_type": "b", "name": "B", "success_criteria": ["c"], "os_operations": ["file:read"],
        "url_allowlist": ["https://example.com"], "prohibited_actions": ["x"], "allow_network": true
    }))
    .expect("args");
    assert_eq!(
        args.request_body(),
        json!({"box_type": "b", "purpose": "p", "allow_network": true, "name": "B", "success_criteria": ["c"], "os_operations": ["file:read"],
            "url_allowlist": ["https://example.com"], "prohibited_actions": ["x"]})
    );
    assert!(serde_json::from_value::<CreateBoxDraft>(json!({"purpose": "p", "box_type": "b", "file_access": []})).is_err());
}

#[tokio::test]
async fn get_draft_without_an_id_lists_the_callers_drafts() {
    let backend = recorder(200, json!({"drafts": [], "next_cursor": null}));
    let server = AtasiraMcp::new(backend.clone());
    let ext = Extensions::default();
    server.get_draft(Parameters(GetDraft { draft_id: None, cursor: Some("12".into()) }), ext.clone()).await;
    server.get_draft(Parameters(GetDraft { draft_id: Some("d/1".into()), cursor: None }), ext.clone()).await;
    server.pending_drafts(Parameters(Page { cursor: None }), ext).await;
    let paths: Vec<String> = backend.calls.lock().expect("calls").iter().map(|c| c.path.clone()).collect();
    assert_eq!(paths, ["/boxes/box-drafts?mine=true&cursor=12", "/boxes/box-drafts/d%2F1", "/boxes/box-drafts/pending"]);
}

#[test]
fn a_refusal_is_a_tool_error_with_the_code_first() {
    let result = tool_result(ApiAnswer {
        status: 422,
        body: json!({"error": "box_manifest_validation", "message": "invalid", "details": [{"key": "box_type", "message": "reserved"}]}),
    });
    assert_eq!(result.is_error, Some(true));
    let text = result.content[0].as_text().map(|t| t.text.clone()).unwrap_or_default();
    assert_eq!(text, "box_manifest_validation: invalid (HTTP 422)\n- box_type: reserved");
    assert_eq!(result.structured_content.as_ref().map(|s| s["status"].clone()), Some(json!(422)));
    let ok = tool_result(ApiAnswer { status: 201, body: json!({"draft_id": "d"}) });
    assert_eq!(ok.is_error, Some(false));
    assert_eq!(ok.structured_content, Some(json!({"draft_id": "d"})));
}
