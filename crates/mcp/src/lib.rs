//! The MCP server for agents (R-MCP-1): eight tools, each one REST call, so that an agent
//! may do over MCP exactly what its token lets it do over REST, and no more.
//!
//! - `atasira_create_box_draft`: `POST /boxes/box-drafts` (always `pending_approval`);
//! - `atasira_pending_drafts`: `GET /boxes/box-drafts/pending` (role admin);
//! - `atasira_list_boxes`: `GET /boxes`;
//! - `atasira_feasibility`: `POST /boxes/feasibility`;
//! - `atasira_get_draft`: `GET /boxes/box-drafts/{id}`, or without an id the caller's own
//!   drafts (`GET /boxes/box-drafts?mine=true`);
//! - `atasira_request_change`: `POST /boxes/{box_id}/change-requests` (always pending).
//!
//! There is no approve or reject tool: a human admin decides, in the dashboard or the CLI.
//!
//! The tools do not know HTTP: they call a [`Backend`] with a method, a path under
//! `/api/v1` and a body. `atasira mcp` (stdio) provides one that calls a gateway over
//! HTTP with a PAT; the gateway's `/mcp` (streamable HTTP) one that hands the call to its
//! own API router in-process with the MCP request's `Authorization` header. A success is
//! the API's JSON answer (as text and as structured content); a refusal is a tool error
//! (`isError: true`) whose text starts with the API's error code: `forbidden: ...`.

use std::fmt;
use std::sync::Arc;

use atasira_domain::os_operation::OSOperation;
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Extensions, Implementation, ServerCapabilities, ServerConfig};
use rmcp::schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use rmcp::{ServerHandler, tool, tool_handler, tool_router};
use serde::Deserialize;
use serde_json::{Value, json};

pub use rmcp;

/// The HTTP method of an API call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
        }
    }
}

/// One call of the REST API: `path` is under `/api/v1` and carries its query
/// (`/boxes/box-drafts?mine=true`).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiCall {
    pub method: Method,
    pub path: String,
    pub body: Option<Value>,
}

/// What the API answered: the HTTP status and the JSON body (a body that is not JSON is
/// a JSON string).
#[derive(Debug, Clone, PartialEq)]
pub struct ApiAnswer {
    pub status: u16,
    pub body: Value,
}

/// Where the tools send their API calls.
#[async_trait::async_trait]
pub trait Backend: Send + Sync + 'static {
    /// Makes `call` on behalf of the MCP caller. `extensions` are what the MCP transport
    /// attached to the request (on streamable HTTP, the HTTP request's parts with its
    /// `Authorization` header). `Err` says why the API could not be asked at all.
    async fn call(&self, call: ApiCall, extensions: &Extensions) -> Result<ApiAnswer, String>;
}

/// The MCP server: the eight tools over a [`Backend`].
#[derive(Clone)]
pub struct AtasiraMcp {
    backend: Arc<dyn Backend>,
    tool_router: ToolRouter<AtasiraMcp>,
}

impl fmt::Debug for AtasiraMcp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AtasiraMcp").finish_non_exhaustive()
    }
}

/// Names of the tools (`tools/list` has exactly these).
pub const TOOL_NAMES: &[&str] = &[
    "atasira_create_box_draft",
    "atasira_pending_drafts",
    "atasira_list_boxes",
    "atasira_feasibility",
    "atasira_get_draft",
    "atasira_request_change",
    "atasira_pending_tool_requests",
    "atasira_stop_worker",
];

const INSTRUCTIONS: &str = "atasira governs AI employees called Boxes. A Box has a box_type (its unique id), a purpose and a \
fixed set of capabilities (OS operations, tools, network). Agents may draft new Boxes and read what exists; only a human \
admin can approve a draft, outside MCP, so a new Box is never active right after you draft it. Before drafting, look for \
an existing Box (atasira_list_boxes) and check whether it can already do the task (atasira_feasibility). After drafting, \
follow the decision with atasira_get_draft. A refused call is a tool error whose text starts with the API's error code \
(forbidden, box_manifest_validation, draft_not_found, box_not_found, ...) followed by the reason.";

const CREATE_DESCRIPTION: &str = "Submit a draft for a new Box (an AI employee with a fixed set of capabilities). The draft \
never becomes active by itself: it is stored with status pending_approval and a human admin must review and approve it \
outside MCP (there is no tool for that; do not ask for one). Ask only for the capabilities the task needs: the OS \
operations shell:exec, applescript:execute, applescript:open_app, applescript:menu_click, file:write, file:move, \
file:copy, process:kill, op:create, op:read, cron:schedule and the tools Bash, shell, op:create, op:read, process:kill make \
the draft over_limit, and its approval then needs the admin's explicit second confirmation. Returns the API's answer \
{draft_id, box_type, status: \"pending_approval\", over_limit, warnings}; read the warnings, they point out what is legal \
but likely wrong (no tools at all, a url_allowlist without network, ...). Refusals: box_manifest_validation (a bad \
box_type, an unknown OS operation, a blank purpose; the details name the field), self_privilege_forbidden (box_type \
admin-pm or admin-ops). Follow the decision with atasira_get_draft and the draft_id.";

const PENDING_TOOL_REQUESTS_DESCRIPTION: &str = "List the tool calls Workers wait to make until a human admin decides, \
newest first: for each its request_id, worker_id, box_type, tool, input, the manifest rule that asks (rule) and why \
(reason), who launched the Worker (launched_by), when it was asked and when it expires (denied unless decided). Needs a \
token with role admin: any other token gets the error forbidden. Read only: approving and rejecting are done by a human \
admin outside MCP (never the Worker's launcher). When next_cursor is not null, pass it as cursor for the next page.";

const PENDING_DESCRIPTION: &str = "List the drafts waiting for a human admin's decision, oldest first: for each its draft_id, \
box_type, purpose, every capability it asks for (os_operations, tools, url_allowlist, network, file_access, allowed_apps, \
required_access), over_limit with the operations and tools that make it so (over_limit_ops, over_limit_tools), warnings, \
requested_by and created_at. Needs a token with role admin: any other token gets the error forbidden. Read only: \
approving and rejecting are done by a human admin outside MCP. When next_cursor is not null, pass it as cursor for the \
next page.";

const LIST_BOXES_DESCRIPTION: &str = "List the Boxes (approved, activated AI employees) in activation order: box_id, \
box_type, name, state and manifest_version of the active ones (idle or running; stopped and archived Boxes are left \
out). Any token may use it. Look here before drafting a new Box: a box_type can exist only once, and an existing Box may \
already do the task (check with atasira_feasibility, which also knows stopped Boxes). When next_cursor is not null, pass it as cursor for the next page.";

const REQUEST_CHANGE_DESCRIPTION: &str = "Ask for a change of what an existing Box may do: new tools, OS operations, \
network, shell commands, a trigger (trigger_type schedule with trigger_schedule, or event with trigger_event), outputs. \
Pass the box_id and a merge patch of the manifest keys to change. An admin or the Box's primary may ask. Nothing changes \
until a human admin approves it outside MCP; the answer is the pending change request (draft_id) with what it adds and \
removes and whether what it adds is over the limit. A Box has one pending change request at a time \
(change_request_pending). Follow it with atasira_get_draft.";

const FEASIBILITY_DESCRIPTION: &str = "Check, without changing anything, whether an existing Box can do a task with the \
capabilities it was approved for: a deterministic keyword match (English and Japanese) of task_description against the \
Box's declared os_operations, tools, shell and file access. Returns {feasible, available_operations, available_tools, \
missing_capabilities, required_approvals, summary, notes, box_id}; a non-empty missing_capabilities means the task needs \
a new draft (atasira_create_box_draft) that a human admin approves. Refusals: box_not_found when no Box of that box_type \
exists (or only archived ones).";

const GET_DRAFT_DESCRIPTION: &str = "Follow up on drafts you submitted. With draft_id: that draft's status (pending_approval, \
approved, active, rejected, withdrawn or expired), the decision once there is one (by whom, when, and the reason of a \
rejection), the box_id once its Box is active, and the manifest it would activate. Without draft_id: your own drafts in \
submission order, decided ones included (pass next_cursor as cursor for the next page). You see only your own drafts \
(admins see every draft): any other id answers draft_not_found.";

/// The arguments of `atasira_create_box_draft`: the REST draft request, less the
/// capabilities an agent does not draft here (file_access, allowed_apps, required_access).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct CreateBoxDraft {
    /// The Box's standing role in plain words: what it does, for whom, and how. Must not be
    /// blank.
    pub purpose: String,
    /// The Box's unique id, e.g. "invoice-checker": 1 to 64 characters, lowercase letters,
    /// digits, '_' and '-', starting with a letter or a digit. Not a reserved word
    /// (heartbeat, task, log, result, pause, resume, kill, escalation, events, drafts,
    /// approval, provisioner, runtime-registry, audit, gateway); admin-pm and admin-ops
    /// are refused. Only one Box may have a given box_type.
    #[schemars(regex(pattern = r"^[a-z0-9][a-z0-9_-]{0,63}$"))]
    pub box_type: String,
    /// A display name (optional; empty for none).
    #[serde(default)]
    pub name: String,
    /// How to tell that the Box does its job, one criterion per item. They are appended to
    /// the purpose under "Success criteria".
    #[serde(default)]
    pub success_criteria: Option<Vec<String>>,
    /// OS operations the Box may perform, each one of a fixed list (anything else is
    /// refused). shell:exec, applescript:execute, applescript:open_app,
    /// applescript:menu_click, file:write, file:move, file:copy, process:kill, op:create,
    /// op:read and cron:schedule make the draft over_limit.
    #[serde(default)]
    #[schemars(schema_with = "os_operations_schema")]
    pub os_operations: Option<Vec<String>>,
    /// Names of the tools the Box may call. None or an empty list: the Box may call no tool
    /// at all. Bash, shell, op:create, op:read and process:kill make the draft over_limit;
    /// an OS operation named here (shell:exec) is granted as if it were in os_operations.
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    /// URLs or hosts the Box may reach; they matter only with allow_network true.
    #[serde(default)]
    pub url_allowlist: Option<Vec<String>>,
    /// What the Box must never do, in plain words, one action per item.
    #[serde(default)]
    pub prohibited_actions: Option<Vec<String>>,
    /// true: the Box gets filtered network access (to url_allowlist); false (the default):
    /// no network at all.
    #[serde(default)]
    pub allow_network: bool,
}

impl CreateBoxDraft {
    /// The REST request body (`BoxDraftCreateRequest`): absent lists stay absent, an empty
    /// name is no name.
    pub fn request_body(&self) -> Value {
        let mut body = json!({"box_type": self.box_type, "purpose": self.purpose, "allow_network": self.allow_network});
        if !self.name.is_empty() {
            body["name"] = json!(self.name);
        }
        for (key, list) in [
            ("success_criteria", &self.success_criteria),
            ("os_operations", &self.os_operations),
            ("tools", &self.tools),
            ("url_allowlist", &self.url_allowlist),
            ("prohibited_actions", &self.prohibited_actions),
        ] {
            if let Some(list) = list {
                body[key] = json!(list);
            }
        }
        body
    }
}

/// The OS operations a draft may name: every one of the fixed list, as an enum.
fn os_operations_schema(_: &mut SchemaGenerator) -> Schema {
    let names: Vec<&str> = OSOperation::ALL.iter().map(|op| op.as_str()).collect();
    json_schema!({
        "type": ["array", "null"],
        "items": {"type": "string", "enum": names},
        "description": "OS operations the Box may perform, each one of the listed values (anything else is refused). \
    shell:exec, applescript:execute, applescript:open_app, applescript:menu_click, file:write, file:move, file:copy, \
    process:kill, op:create, op:read and cron:schedule make the draft over_limit.",
    })
}

/// The arguments of `atasira_pending_drafts` and `atasira_list_boxes`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct Page {
    /// The next_cursor of the previous page; absent for the first page.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// The arguments of `atasira_feasibility` (the REST body).
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct Feasibility {
    /// The task in plain words, English or Japanese; must not be blank.
    pub task_description: String,
    /// The box_type of the Box to assess (atasira_list_boxes shows them).
    pub box_type: String,
}

/// The arguments of `atasira_request_change`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct RequestChange {
    /// The Box to change (its box_id, as atasira_list_boxes shows it).
    pub box_id: String,
    /// The manifest keys to change and their new values, as a JSON merge patch: for
    /// example {"os_operations": ["file:read", "shell:exec"], "tools": ["Read", "Bash"]}; a
    /// null value removes a key.
    pub patch: serde_json::Map<String, serde_json::Value>,
}

/// The arguments of `atasira_get_draft`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct GetDraft {
    /// The draft_id atasira_create_box_draft answered. Absent: list your own drafts.
    #[serde(default)]
    pub draft_id: Option<String>,
    /// Without draft_id: the next_cursor of the previous page of your drafts.
    #[serde(default)]
    pub cursor: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(crate = "rmcp::schemars")]
pub struct StopWorker {
    /// The Worker's id (wkr_...).
    pub worker_id: String,
    /// true: kill it at once; false (default): stop it (its runner gets a grace to end).
    #[serde(default)]
    pub kill: bool,
}

const STOP_WORKER_DESCRIPTION: &str = "Stop a running Worker (or kill it at once with kill: true). Allowed for a human admin \
and for the primary user of the Worker's Box; anyone else gets the error forbidden; a Worker that has ended gets \
worker_ended. Answers the Worker with its state and the stop asked.";

#[tool_router]
impl AtasiraMcp {
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        Self { backend, tool_router: Self::tool_router() }
    }

    #[tool(name = "atasira_create_box_draft", description = CREATE_DESCRIPTION,
        annotations(title = "Draft a new Box (needs a human admin's approval)", read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false))]
    async fn create_box_draft(&self, Parameters(args): Parameters<CreateBoxDraft>, extensions: Extensions) -> CallToolResult {
        self.ask(ApiCall { method: Method::Post, path: "/boxes/box-drafts".into(), body: Some(args.request_body()) }, &extensions).await
    }

    #[tool(name = "atasira_pending_drafts", description = PENDING_DESCRIPTION,
        annotations(title = "Drafts waiting for approval (admins)", read_only_hint = true, open_world_hint = false))]
    async fn pending_drafts(&self, Parameters(args): Parameters<Page>, extensions: Extensions) -> CallToolResult {
        self.get(&with_cursor("/boxes/box-drafts/pending", args.cursor.as_deref()), &extensions).await
    }

    #[tool(name = "atasira_pending_tool_requests", description = PENDING_TOOL_REQUESTS_DESCRIPTION,
        annotations(title = "Tool calls waiting for a human admin (admins)", read_only_hint = true, open_world_hint = false))]
    async fn pending_tool_requests(&self, Parameters(args): Parameters<Page>, extensions: Extensions) -> CallToolResult {
        self.get(&with_cursor("/tool-requests", args.cursor.as_deref()), &extensions).await
    }

    #[tool(name = "atasira_stop_worker", description = STOP_WORKER_DESCRIPTION,
        annotations(title = "Stop or kill a Worker", read_only_hint = false, destructive_hint = true, idempotent_hint = true, open_world_hint = false))]
    async fn stop_worker(&self, Parameters(args): Parameters<StopWorker>, extensions: Extensions) -> CallToolResult {
        let path = format!("/workers/{}/{}", path_segment(&args.worker_id), if args.kill { "kill" } else { "stop" });
        self.ask(ApiCall { method: Method::Post, path, body: Some(json!({})) }, &extensions).await
    }

    #[tool(name = "atasira_list_boxes", description = LIST_BOXES_DESCRIPTION,
        annotations(title = "List the Boxes", read_only_hint = true, open_world_hint = false))]
    async fn list_boxes(&self, Parameters(args): Parameters<Page>, extensions: Extensions) -> CallToolResult {
        self.get(&with_cursor("/boxes", args.cursor.as_deref()), &extensions).await
    }

    #[tool(name = "atasira_request_change", description = REQUEST_CHANGE_DESCRIPTION,
        annotations(title = "Ask for a change of what a Box may do", read_only_hint = false, destructive_hint = false, idempotent_hint = false, open_world_hint = false))]
    async fn request_change(&self, Parameters(args): Parameters<RequestChange>, extensions: Extensions) -> CallToolResult {
        let path = format!("/boxes/{}/change-requests", path_segment(&args.box_id));
        self.ask(ApiCall { method: Method::Post, path, body: Some(serde_json::Value::Object(args.patch)) }, &extensions).await
    }

    #[tool(name = "atasira_feasibility", description = FEASIBILITY_DESCRIPTION,
        annotations(title = "Can a Box do this task?", read_only_hint = true, open_world_hint = false))]
    async fn feasibility(&self, Parameters(args): Parameters<Feasibility>, extensions: Extensions) -> CallToolResult {
        let body = json!({"task_description": args.task_description, "box_type": args.box_type});
        self.ask(ApiCall { method: Method::Post, path: "/boxes/feasibility".into(), body: Some(body) }, &extensions).await
    }

    #[tool(name = "atasira_get_draft", description = GET_DRAFT_DESCRIPTION,
        annotations(title = "Your drafts and their decisions", read_only_hint = true, open_world_hint = false))]
    async fn get_draft(&self, Parameters(args): Parameters<GetDraft>, extensions: Extensions) -> CallToolResult {
        match args.draft_id.as_deref() {
            Some(id) => self.get(&format!("/boxes/box-drafts/{}", path_segment(id)), &extensions).await,
            None => self.get(&with_cursor("/boxes/box-drafts?mine=true", args.cursor.as_deref()), &extensions).await,
        }
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for AtasiraMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("atasira", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS.to_owned())
    }
}

impl AtasiraMcp {
    async fn get(&self, path: &str, extensions: &Extensions) -> CallToolResult {
        self.ask(ApiCall { method: Method::Get, path: path.to_owned(), body: None }, extensions).await
    }

    /// One API call as a tool result.
    async fn ask(&self, call: ApiCall, extensions: &Extensions) -> CallToolResult {
        match self.backend.call(call, extensions).await {
            Ok(answer) => tool_result(answer),
            Err(reason) => CallToolResult::error(vec![ContentBlock::text(format!("unreachable: {reason}"))]),
        }
    }
}

/// A 2xx answer is the tool's result (its JSON as text and as structured content); any
/// other is a tool error that starts with the API's error code and message, then the
/// details (the fields a validation refused), and carries the whole error body.
pub fn tool_result(answer: ApiAnswer) -> CallToolResult {
    if (200..300).contains(&answer.status) {
        return match answer.body {
            body @ Value::Object(_) => CallToolResult::structured(body),
            other => CallToolResult::success(vec![ContentBlock::text(other.to_string())]),
        };
    }
    let body = &answer.body;
    let code = body["error"].as_str().unwrap_or("error");
    let message = body["message"].as_str().map(str::to_owned).unwrap_or_else(|| body.to_string());
    let mut text = format!("{code}: {message} (HTTP {})", answer.status);
    if let Some(details) = body.get("details").and_then(Value::as_array) {
        for d in details {
            match (d["key"].as_str(), d["message"].as_str()) {
                (Some(key), Some(why)) => text.push_str(&format!("\n- {key}: {why}")),
                _ => text.push_str(&format!("\n- {d}")),
            }
        }
    }
    let mut result = CallToolResult::error(vec![ContentBlock::text(text)]);
    if let Value::Object(mut error) = answer.body {
        error.insert("status".into(), json!(answer.status));
        result.structured_content = Some(Value::Object(error));
    }
    result
}

fn with_cursor(path: &str, cursor: Option<&str>) -> String {
    match cursor {
        Some(cursor) if !cursor.is_empty() => format!("{path}{}cursor={}", if path.contains('?') { '&' } else { '?' }, path_segment(cursor)),
        _ => path.to_owned(),
    }
}

/// Percent-encodes everything but unreserved characters, so an id stays one path segment
/// (or one query value).
fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests;
