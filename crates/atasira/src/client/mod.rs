//! Client verbs over the REST API (R-CLI-1): `atasira workers create|show|list`, `drafts
//! pending|mine|show|create|approve|reject|withdraw`, `boxes
//! list|show|history|stop|resume|archive|assign|unassign|edit|config`, `webhooks
//! add|list|remove|deliveries`, `audit list` and
//! `audit verify --url` (`audit verify` on a data dir or database is the operator's check,
//! run by `operator::audit_verify`; [`VerifyArgs::choose`] picks). They speak to a running
//! gateway (`--url`, `ATASIRA_BFF_URL`) with a personal access token (`--token`,
//! `ATASIRA_PAT`), print a table (or the API's JSON with `--json`) and exit 0 when the API
//! answered with success, 1 when it refused, 2 on a usage error, 3 when the gateway could
//! not be reached. A request that takes longer than a second shows progress on stderr when
//! stderr is a terminal.
//!
//! This module holds the verbs: their clap types, what each sends, and the entry points
//! `main` calls. [`transport`] sends a request and reads its answer into the gateway's API
//! type; [`print`] shows each answer; [`exit`] has the exit codes. The dependencies go one
//! way: this module uses the three; `transport` uses `exit` and `print`; `print` and `exit`
//! use none of them.

mod exit;
pub(crate) mod print;
mod transport;

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::process::ExitCode;

use atasira_domain::aggregates::draft::DraftStatus;
use atasira_gateway::api::{DraftDetail, VerifyResult};
use clap::parser::ValueSource;
use clap::{ArgMatches, Args, Subcommand, ValueEnum};
use serde_json::{Value, json};

use exit::{OK, REFUSED, USAGE, usage};
pub use transport::Connection;
use transport::{call, query, refused, segment, send, typed};

/// `atasira workers ...`.
#[derive(Debug, Subcommand)]
pub enum WorkersCommand {
    /// Launch a Worker of an active Box in one request. Give the input as segments, in
    /// order: --text, --ticket and --objective, each as often as needed (at least one).
    /// Running it again with the same --launch-id and the same input answers the same
    /// Worker; the same --launch-id with other input is refused.
    Create {
        /// The Box to launch the Worker of (its box_id).
        #[arg(long = "box", value_name = "BOX_ID")]
        box_id: String,
        /// Names this launch, so that retrying it never makes a second Worker: 1 to 128
        /// letters, digits, '-', '_', '.', ':'.
        #[arg(long, value_name = "ID")]
        launch_id: String,
        /// The Worker's role, a name of your choosing (optional; none by default).
        #[arg(long, value_name = "ROLE")]
        role: Option<String>,
        /// A label KEY=VALUE of the Worker (repeatable).
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        #[command(flatten)]
        input: InputArgs,
        #[command(flatten)]
        connection: Connection,
    },
    /// Show a Worker with its transcript, or with --provenance the chain from the human
    /// approval of its Box to the configuration it runs.
    Show {
        /// The Worker's id (wkr_...).
        worker_id: String,
        /// Show where the Worker's configuration comes from: the approval, the activation,
        /// each recorded edit, the bundle and the Worker, with their events and audit rows.
        #[arg(long)]
        provenance: bool,
        #[command(flatten)]
        connection: Connection,
    },
    /// List a Box's Workers, oldest first.
    List {
        /// The Box whose Workers to list (its box_id).
        #[arg(long = "box", value_name = "BOX_ID")]
        box_id: String,
        #[command(flatten)]
        paging: Paging,
        #[command(flatten)]
        connection: Connection,
    },
    /// Stop a running Worker (a human admin or the Box's primary): its runner gets SIGTERM,
    /// then SIGKILL after the host's grace.
    Stop {
        /// The Worker's id (wkr_...).
        worker_id: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Kill a running Worker at once (a human admin or the Box's primary).
    Kill {
        /// The Worker's id (wkr_...).
        worker_id: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Pause a running Worker (its runner is stopped until resumed; a human admin or the
    /// Box's primary).
    Pause {
        /// The Worker's id (wkr_...).
        worker_id: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Resume a paused Worker (a human admin or the Box's primary).
    Resume {
        /// The Worker's id (wkr_...).
        worker_id: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Send more input to a running Worker: --text, --ticket and --objective segments, in
    /// order (at least one).
    Input {
        /// The Worker's id (wkr_...).
        worker_id: String,
        #[command(flatten)]
        input: InputArgs,
        #[command(flatten)]
        connection: Connection,
    },
}

/// A Worker's input as segments, in the order given.
#[derive(Debug, Clone, Args)]
pub struct InputArgs {
    /// A text segment of the Worker's input (repeatable).
    #[arg(long, value_name = "TEXT")]
    text: Vec<String>,
    /// A ticket the Worker is to work on, by reference (repeatable).
    #[arg(long, value_name = "TICKET")]
    ticket: Vec<String>,
    /// An objective the Worker is to work towards, by reference (repeatable).
    #[arg(long, value_name = "OBJECTIVE")]
    objective: Vec<String>,
}

/// `atasira tool-requests ...`: the tool calls Workers wait to make until a human admin
/// decides.
#[derive(Debug, Subcommand)]
pub enum ToolRequestsCommand {
    /// List tool-use requests, newest first (admins); pending ones unless --state says.
    List {
        /// pending (default), approved, rejected, expired or all.
        #[arg(long, value_name = "STATE")]
        state: Option<String>,
        #[command(flatten)]
        paging: Paging,
        #[command(flatten)]
        connection: Connection,
    },
    /// Show one tool-use request (admins).
    Show {
        /// The request's id (tur_...).
        request_id: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Let the Worker make the call (a human admin who did not launch the Worker).
    Approve {
        /// The request's id (tur_...).
        request_id: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Refuse the Worker the call (a human admin who did not launch the Worker).
    Reject {
        /// The request's id (tur_...).
        request_id: String,
        /// Why: the Worker learns it.
        #[arg(long, value_name = "TEXT")]
        reason: Option<String>,
        #[command(flatten)]
        connection: Connection,
    },
}

/// A finished tool-requests verb: its exit code.
pub fn tool_requests(command: ToolRequestsCommand) -> ExitCode {
    let code = match command {
        ToolRequestsCommand::List { state, paging, connection } => {
            let [limit, cursor] = page_pairs(&paging);
            let pairs = [("state", state), limit, cursor];
            call(&connection, "GET", &format!("/api/v1/tool-requests{}", query(&pairs)), None, |_, page| print::tool_requests(page))
        }
        ToolRequestsCommand::Show { request_id, connection } => {
            call(&connection, "GET", &format!("/api/v1/tool-requests/{}", segment(&request_id)), None, |_, r| print::tool_request(r))
        }
        ToolRequestsCommand::Approve { request_id, connection } => {
            call(&connection, "POST", &format!("/api/v1/tool-requests/{}/approve", segment(&request_id)), Some(&json!({})), |_, r| print::tool_request(r))
        }
        ToolRequestsCommand::Reject { request_id, reason, connection } => {
            let body = reason.map_or_else(|| json!({}), |r| json!({"reason": r}));
            call(&connection, "POST", &format!("/api/v1/tool-requests/{}/reject", segment(&request_id)), Some(&body), |_, r| print::tool_request(r))
        }
    };
    ExitCode::from(code)
}

/// How a webhook's deliveries are written.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum WebhookFormatArg {
    /// The announcement as JSON, with a link to the dashboard.
    Json,
    /// `{"text": ...}`, for Slack's incoming webhooks and Slack-compatible ones.
    Slack,
}

/// Where a webhook delivery is.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DeliveryStateArg {
    /// Still being tried.
    Pending,
    /// The receiver accepted it.
    Delivered,
    /// Given up on.
    Dead,
}

/// `atasira webhooks ...`: tell approvers, in chat or any HTTP endpoint, of every decision
/// waiting for them.
#[derive(Debug, Subcommand)]
pub enum WebhooksCommand {
    /// Register a webhook (a human admin): every announcement of the chosen kinds is POSTed
    /// to URL, signed with a secret that is printed this once.
    Add {
        /// Where to POST deliveries: an http or https URL, without a user name or password.
        #[arg(value_name = "URL")]
        webhook_url: String,
        /// How the body is written: json (default) or slack (Slack-compatible `{"text"}`).
        #[arg(long, value_enum, value_name = "FORMAT")]
        format: Option<WebhookFormatArg>,
        /// Only this kind of announcement (repeatable; default every kind): draft.pending,
        /// change.pending, tool_request.pending, provisioning.failed, worker.escalated.
        #[arg(long = "kind", value_name = "KIND")]
        kinds: Vec<String>,
        #[command(flatten)]
        connection: Connection,
    },
    /// List the webhooks with how their deliveries went (admins). Never their secrets.
    List {
        #[command(flatten)]
        connection: Connection,
    },
    /// Remove a webhook (a human admin): nothing more is sent to it.
    Remove {
        /// The webhook's id.
        webhook_id: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// List a webhook's deliveries (admins): what was sent, how often it was tried, what the
    /// receiver answered; `--state dead` lists those given up on.
    Deliveries {
        /// The webhook's id.
        webhook_id: String,
        /// Only deliveries in this state.
        #[arg(long, value_enum, value_name = "STATE")]
        state: Option<DeliveryStateArg>,
        /// At most this many deliveries (default 50, at most 200).
        #[arg(long, value_name = "N")]
        limit: Option<u32>,
        #[command(flatten)]
        connection: Connection,
    },
}

/// The organisation's policy: Cedar rules every draft, change request, config edit, Worker
/// launch and runtime approval meets.
#[derive(Debug, Subcommand)]
pub enum PoliciesCommand {
    /// Show the policy in force (admins): its version, who published it, its rules.
    Show {
        #[command(flatten)]
        connection: Connection,
    },
    /// Publish a new version from a Cedar file (a human admin): in force at once, recorded
    /// on the audit ledger; the same text again changes nothing.
    Publish {
        /// The Cedar policies ("-" reads stdin).
        #[arg(value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        connection: Connection,
    },
    /// A dry run (admins; nothing is recorded): which pending drafts, change requests and
    /// Boxes the proposed version in FILE decides differently from the one in force; with
    /// --draft, what it (or, without FILE, the version in force) decides on a draft.
    Check {
        /// A proposed version's Cedar policies ("-" reads stdin).
        #[arg(value_name = "FILE")]
        file: Option<PathBuf>,
        /// A draft request as JSON, as `POST /api/v1/boxes/box-drafts` takes it.
        #[arg(long, value_name = "DRAFT_JSON")]
        draft: Option<PathBuf>,
        #[command(flatten)]
        connection: Connection,
    },
}

/// A finished policies verb: its exit code.
pub fn policies(command: PoliciesCommand) -> ExitCode {
    ExitCode::from(run_policies(command))
}

/// The text of `path` ("-": stdin).
fn read_text(path: &std::path::Path) -> Result<String, String> {
    if path.as_os_str() == "-" {
        let mut text = String::new();
        return std::io::stdin().read_to_string(&mut text).map(|_| text).map_err(|e| format!("cannot read stdin: {e}"));
    }
    std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

fn run_policies(command: PoliciesCommand) -> u8 {
    match command {
        PoliciesCommand::Show { connection } => call(&connection, "GET", "/api/v1/policies", None, |_, p| print::policy(p)),
        PoliciesCommand::Publish { file, connection } => match read_text(&file) {
            Ok(text) => call(&connection, "PUT", "/api/v1/policies", Some(&json!({"text": text})), |_, p| print::policy(p)),
            Err(message) => usage(&message),
        },
        PoliciesCommand::Check { file, draft, connection } => {
            let mut body = json!({});
            if let Some(file) = file {
                match read_text(&file) {
                    Ok(text) => body["text"] = json!(text),
                    Err(message) => return usage(&message),
                }
            }
            if let Some(draft) = draft {
                match read_text(&draft).and_then(|t| serde_json::from_str::<Value>(&t).map_err(|e| format!("{} is not JSON: {e}", draft.display()))) {
                    Ok(value) => body["draft"] = value,
                    Err(message) => return usage(&message),
                }
            }
            call(&connection, "POST", "/api/v1/policies/check", Some(&body), |_, c| print::policy_check(c))
        }
    }
}

/// A finished webhooks verb: its exit code.
pub fn webhooks(command: WebhooksCommand) -> ExitCode {
    ExitCode::from(run_webhooks(command))
}

fn run_webhooks(command: WebhooksCommand) -> u8 {
    match command {
        WebhooksCommand::Add { webhook_url, format, kinds, connection } => {
            let mut body = json!({"url": webhook_url});
            if let Some(format) = format {
                body["format"] = json!(wire_name(format));
            }
            if !kinds.is_empty() {
                body["kinds"] = json!(kinds);
            }
            call(&connection, "POST", "/api/v1/webhooks", Some(&body), |_, w| print::webhook_registered(w))
        }
        WebhooksCommand::List { connection } => call(&connection, "GET", "/api/v1/webhooks", None, |_, list| print::webhooks(list)),
        WebhooksCommand::Remove { webhook_id, connection } => {
            call(&connection, "DELETE", &format!("/api/v1/webhooks/{}", segment(&webhook_id)), None, |_, w| print::webhook_removed(w))
        }
        WebhooksCommand::Deliveries { webhook_id, state, limit, connection } => {
            let pairs = [("state", state.map(wire_name)), ("limit", limit.map(|l| l.to_string()))];
            let path = format!("/api/v1/webhooks/{}/deliveries{}", segment(&webhook_id), query(&pairs));
            call(&connection, "GET", &path, None, |_, page| print::webhook_deliveries(page))
        }
    }
}

/// A finished client verb: its exit code (see the module documentation).
pub fn workers(command: WorkersCommand, matches: Option<&ArgMatches>) -> ExitCode {
    ExitCode::from(run(command, matches))
}

fn run(command: WorkersCommand, matches: Option<&ArgMatches>) -> u8 {
    match command {
        WorkersCommand::Create { box_id, launch_id, role, labels, input, connection } => {
            let input = match ordered_input(matches, &input.text, &input.ticket, &input.objective) {
                Ok(input) => input,
                Err(message) => return usage(&message),
            };
            let labels = match parse_labels(&labels) {
                Ok(labels) => labels,
                Err(message) => return usage(&message),
            };
            let mut body = json!({"launch_id": launch_id, "input": input});
            if let Some(role) = role {
                body["role"] = json!(role);
            }
            if !labels.is_empty() {
                body["labels"] = json!(labels);
            }
            let path = format!("/api/v1/boxes/{}/workers", segment(&box_id));
            call(&connection, "POST", &path, Some(&body), print::launched)
        }
        WorkersCommand::Show { worker_id, provenance, connection } => {
            if provenance {
                call(&connection, "GET", &format!("/api/v1/workers/{}/provenance", segment(&worker_id)), None, |_, p| print::provenance(p))
            } else {
                call(&connection, "GET", &format!("/api/v1/workers/{}", segment(&worker_id)), None, |_, w| print::worker(w))
            }
        }
        WorkersCommand::List { box_id, paging, connection } => {
            let path = format!("/api/v1/boxes/{}/workers{}", segment(&box_id), query(&page_pairs(&paging)));
            call(&connection, "GET", &path, None, |_, page| print::workers(page))
        }
        WorkersCommand::Stop { worker_id, connection } => {
            call(&connection, "POST", &format!("/api/v1/workers/{}/stop", segment(&worker_id)), Some(&json!({})), |_, w| print::worker(w))
        }
        WorkersCommand::Kill { worker_id, connection } => {
            call(&connection, "POST", &format!("/api/v1/workers/{}/kill", segment(&worker_id)), Some(&json!({})), |_, w| print::worker(w))
        }
        WorkersCommand::Pause { worker_id, connection } => {
            call(&connection, "POST", &format!("/api/v1/workers/{}/pause", segment(&worker_id)), Some(&json!({})), |_, w| print::worker(w))
        }
        WorkersCommand::Resume { worker_id, connection } => {
            call(&connection, "POST", &format!("/api/v1/workers/{}/resume", segment(&worker_id)), Some(&json!({})), |_, w| print::worker(w))
        }
        WorkersCommand::Input { worker_id, input, connection } => {
            let input = match ordered_input(matches, &input.text, &input.ticket, &input.objective) {
                Ok(input) => input,
                Err(message) => return usage(&message),
            };
            call(&connection, "POST", &format!("/api/v1/workers/{}/input", segment(&worker_id)), Some(&json!({"input": input})), |_, w| print::worker(w))
        }
    }
}

/// Where a page starts and how long it is, shared by the list verbs.
#[derive(Debug, Clone, Args)]
pub struct Paging {
    /// At most this many items (the API's default page size when absent).
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,
    /// Continue after this cursor (the "next page" a previous list printed).
    #[arg(long, value_name = "CURSOR")]
    pub cursor: Option<String>,
}

/// `atasira drafts ...` over the REST API (`drafts preview` works offline and is not here).
#[derive(Debug, Subcommand)]
pub enum DraftsCommand {
    /// List the drafts waiting for approval, oldest first (admins). Drafts over the limit
    /// are marked with the dangerous operations and tools they ask for.
    Pending {
        #[command(flatten)]
        paging: Paging,
        #[command(flatten)]
        connection: Connection,
    },
    /// List your own drafts in submission order, decided ones included.
    Mine {
        /// Only drafts in this status.
        #[arg(long, value_name = "STATUS", value_parser = DraftStatusParser)]
        status: Option<DraftStatus>,
        #[command(flatten)]
        paging: Paging,
        #[command(flatten)]
        connection: Connection,
    },
    /// Show one draft with its capabilities, status and manifest (its requester or an admin).
    Show {
        /// The draft's id.
        draft_id: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Submit a draft; it always waits for a human admin's approval.
    Create {
        /// The draft request as JSON (box_type, purpose, os_operations, tools, ...); `-`
        /// reads standard input.
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        connection: Connection,
    },
    /// Approve a draft (a human admin other than its requester): its Box becomes active.
    /// A draft over the limit needs confirmation: on a terminal you are asked, naming the
    /// dangerous operations; otherwise pass --confirm-over-limit. Unconfirmed, it exits 2
    /// and approves nothing.
    Approve {
        /// The draft's id.
        draft_id: String,
        /// Confirm the approval of a draft that asks for operations or tools over the limit,
        /// without being asked.
        #[arg(long)]
        confirm_over_limit: bool,
        #[command(flatten)]
        connection: Connection,
    },
    /// Reject a draft (a human admin other than its requester), with a reason.
    Reject {
        /// The draft's id.
        draft_id: String,
        /// Why the draft is rejected (the requester reads it).
        #[arg(long, value_name = "TEXT")]
        reason: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Revise a draft or change request of yours that was rejected: a JSON merge patch of its
    /// manifest's keys makes a new version, pending approval, that keeps the rejection and
    /// the earlier versions.
    Revise {
        /// The rejected draft's id.
        draft_id: String,
        /// The merge patch as a JSON object; `-` reads standard input.
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        connection: Connection,
    },
    /// Withdraw a draft of yours that is still waiting for approval.
    Withdraw {
        /// The draft's id.
        draft_id: String,
        #[command(flatten)]
        connection: Connection,
    },
}

/// Reads `--status`: a draft status by its name (`pending_approval`; `pending-approval`
/// too), the domain's one status type, so the CLI offers exactly the statuses there are.
#[derive(Debug, Clone, Copy)]
struct DraftStatusParser;

impl clap::builder::TypedValueParser for DraftStatusParser {
    type Value = DraftStatus;

    fn parse_ref(&self, cmd: &clap::Command, arg: Option<&clap::Arg>, value: &std::ffi::OsStr) -> Result<DraftStatus, clap::Error> {
        let names = clap::builder::PossibleValuesParser::new(DraftStatus::ALL.map(|s| s.as_str()));
        let name = names.parse_ref(cmd, arg, std::ffi::OsStr::new(&value.to_string_lossy().replace('-', "_")))?;
        name.parse().map_err(|_| clap::Error::new(clap::error::ErrorKind::InvalidValue).with_cmd(cmd))
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        Some(Box::new(DraftStatus::ALL.into_iter().map(|s| clap::builder::PossibleValue::new(s.as_str()))))
    }
}

/// A Box's state, to filter on.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum BoxStateArg {
    Idle,
    Running,
    Stopped,
    Archived,
    All,
}

/// A user's role in a Box.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum RoleInBoxArg {
    Primary,
    Member,
}

/// `atasira boxes ...`.
#[derive(Debug, Subcommand)]
pub enum BoxesCommand {
    /// List Boxes in activation order; by default the active ones (idle or running), not
    /// stopped or archived ones.
    List {
        /// Only Boxes in this state (`all` includes archived ones).
        #[arg(long, value_enum, value_name = "STATE")]
        state: Option<BoxStateArg>,
        #[command(flatten)]
        paging: Paging,
        #[command(flatten)]
        connection: Connection,
    },
    /// Show a Box with its manifest, user assignments, access setup and drift.
    Show {
        /// The Box's id.
        box_id: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Show a Box's whole life, oldest first: activation, assignments, edits, stops,
    /// resumes, archiving and access setup.
    History {
        /// The Box's id.
        box_id: String,
        #[command(flatten)]
        paging: Paging,
        #[command(flatten)]
        connection: Connection,
    },
    /// Stop a Box (a human admin): frees its slot, keeps its manifest.
    Stop {
        /// The Box's id.
        box_id: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Resume a stopped Box (a human admin): it takes a slot again.
    Resume {
        /// The Box's id.
        box_id: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Archive a Box (a human admin). This is final; its box_type may be drafted again.
    Archive {
        /// The Box's id.
        box_id: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Mentor edit of a Box's wording (a human admin): a JSON object of purpose,
    /// success_criteria, prohibited_actions and business_procedure only; any other key is
    /// refused and recorded. The manifest's minor version goes up.
    Edit {
        /// The Box's id.
        box_id: String,
        /// The edit as a JSON object; `-` reads standard input.
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        connection: Connection,
    },
    /// Config edit of a Box's operating parameters (a human admin or the Box's primary): a
    /// JSON merge patch (a null value deletes its key) that must stay within what the
    /// approval allowed; widening a capability needs a change request (`boxes change`).
    Config {
        /// The Box's id.
        box_id: String,
        /// The merge patch as a JSON object; `-` reads standard input.
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        connection: Connection,
    },
    /// Request a change of what a Box may do (an admin or the Box's primary): a JSON merge
    /// patch of its manifest's keys (tools, os_operations, network, trigger_type, ...), for a
    /// human admin to approve like a draft; prints what it adds and removes.
    Change {
        /// The Box's id.
        box_id: String,
        /// The merge patch as a JSON object; `-` reads standard input.
        #[arg(long, value_name = "FILE")]
        file: PathBuf,
        #[command(flatten)]
        connection: Connection,
    },
    /// Remove a user's assignment from a Box (a human admin or the Box's primary).
    Unassign {
        /// The Box's id.
        box_id: String,
        /// The user to remove.
        #[arg(long, value_name = "USER")]
        user: String,
        #[command(flatten)]
        connection: Connection,
    },
    /// Assign a user to a Box (a human admin or the Box's primary).
    Assign {
        /// The Box's id.
        box_id: String,
        /// The user to assign.
        #[arg(long, value_name = "USER")]
        user: String,
        /// The user's role in the Box.
        #[arg(long, value_enum, value_name = "ROLE")]
        role: RoleInBoxArg,
        #[command(flatten)]
        connection: Connection,
    },
}

/// `atasira audit list|verify`.
#[derive(Debug, Subcommand)]
pub enum AuditCommand {
    /// List rows of the audit ledger in order (admins), over the REST API of a running
    /// gateway.
    List {
        /// Only rows of this action (such as box_draft.approve or box.activate).
        #[arg(long, value_name = "ACTION")]
        action: Option<String>,
        /// Only rows about this target (a draft or Box id).
        #[arg(long, value_name = "TARGET")]
        target: Option<String>,
        /// Only rows recorded at or after this time (RFC 3339, such as
        /// 2026-12-01T09:00:00Z or 2026-12-01T18:00:00+09:00).
        #[arg(long, value_name = "TIME", value_parser = parse_time)]
        since: Option<String>,
        #[command(flatten)]
        paging: Paging,
        #[command(flatten)]
        connection: Connection,
    },
    /// Export the ledger rows of a period with the signed checkpoints that cover them
    /// (admins), for a SIEM or an auditor: `atasira audit verify --file` checks it
    /// offline. Rows before and after the period are included up to whole checkpoints.
    Export {
        /// Rows recorded at or after this time (RFC 3339); absent: from the start.
        #[arg(long, value_name = "TIME", value_parser = parse_time)]
        since: Option<String>,
        /// Rows recorded before this time (RFC 3339); absent: up to now.
        #[arg(long, value_name = "TIME", value_parser = parse_time)]
        until: Option<String>,
        /// jsonl (one JSON object a line) or csv.
        #[arg(long, value_enum, default_value = "jsonl")]
        format: ExportFormat,
        /// Write the export to this file (mode 0600) instead of standard output.
        #[arg(long, short, value_name = "FILE")]
        out: Option<PathBuf>,
        #[command(flatten)]
        connection: Connection,
    },
    /// Check the audit ledger's hash chain and every signed checkpoint, in one of three ways.
    ///
    /// An export (auditors): with --file, offline, with nothing but the file (and the
    /// checkpoint key the operator published, --public-key). It prints {"ok": true,
    /// "rows": N, "covered": N, "public_keys": [...]} and exits 0, or names the first row
    /// or checkpoint that does not verify and exits 1; an unreadable file exits 2.
    ///
    /// On the store itself (operators): with --data-dir (the data dir of `atasira dev`) or
    /// --database-url (the PostgreSQL database of a cluster), and the ledger's MAC key. It
    /// prints {"ok": true, "rows": N} and exits 0, or {"ok": false, "first_bad_seq": S,
    /// "reason": ...} and exits 1.
    ///
    /// Through a running gateway (admins): with --url (or ATASIRA_BFF_URL) and a token. It
    /// prints "verified" and the number of rows, or the first row that does not verify and
    /// why (the API's JSON with --json); it exits 0 when the ledger verifies, 1 when it
    /// does not or the API refused, 2 on a usage error, 3 when the gateway could not be
    /// reached.
    ///
    /// A flag on the command line picks the way over the environment; with neither (or
    /// both ways only from the environment) it exits 2 and says so.
    Verify(VerifyArgs),
}

/// How `audit export` writes the ledger.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ExportFormat {
    Jsonl,
    Csv,
}

/// Where `audit verify` looks: an export, the store (operator) or a gateway (client).
#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Check this export (from `atasira audit export`) offline: no store, gateway or MAC
    /// key needed.
    #[arg(long, value_name = "EXPORT")]
    pub file: Option<PathBuf>,
    /// With --file: the checkpoint key (hex) the operator published, as an export's first
    /// line names it; checkpoints signed by any other key fail.
    #[arg(long, value_name = "HEX", requires = "file")]
    pub public_key: Option<String>,
    /// Check the store of `atasira dev` in this data directory (operator).
    #[arg(long, env = "ATASIRA_DATA_DIR", value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Check the store in this PostgreSQL database (operator, cluster).
    #[arg(long, env = "ATASIRA_DATABASE_URL", hide_env_values = true, value_name = "URL")]
    pub database_url: Option<String>,
    /// File holding that PostgreSQL URL (as `atasira db roles` writes them).
    #[arg(long, env = "ATASIRA_DATABASE_URL_FILE", value_name = "FILE")]
    pub database_url_file: Option<PathBuf>,
    /// MAC key setting of the audit ledger, as the audit service has it
    /// (ID:HEX[,ID:HEX...]; keep the retired keys, or the rows they MACed do not
    /// verify). With --data-dir it defaults to that data dir's key. Not used with --url.
    #[arg(long, env = "ATASIRA_AUDIT_KEY", hide_env_values = true, value_name = "KEYS")]
    pub audit_key: Option<String>,
    /// Ask the gateway at this URL to check the ledger (the REST API of `atasira dev` or
    /// `atasira serve gateway`), with --token.
    #[arg(long, env = "ATASIRA_BFF_URL", value_name = "URL")]
    pub url: Option<String>,
    /// Personal access token of an admin, to ask the gateway with.
    #[arg(long, env = "ATASIRA_PAT", hide_env_values = true, value_name = "PAT")]
    pub token: Option<String>,
    /// Print the answer as JSON (the store check always does).
    #[arg(long)]
    pub json: bool,
}

/// Where `audit verify` was told to look.
#[derive(Debug)]
pub enum VerifyWhere {
    /// The store itself: a data dir or a database URL, with the ledger's MAC key setting.
    Store(StoreCheck),
    /// A running gateway.
    Gateway(Connection),
    /// Neither, or both: the message to print (exit 2).
    Usage(String),
}

/// The operator's check of the ledger on the store itself.
#[derive(Debug)]
pub struct StoreCheck {
    pub data_dir: Option<PathBuf>,
    pub database_url: Option<String>,
    pub audit_key: Option<String>,
}

impl VerifyArgs {
    /// The way to check the ledger: a flag given on the command line wins over the
    /// environment. `matches` are the `audit verify` matches (without them, every value
    /// counts as given on the command line).
    pub fn choose(mut self, matches: Option<&ArgMatches>) -> VerifyWhere {
        match crate::services::database_url(self.database_url.take(), self.database_url_file.as_deref()) {
            Ok(url) => self.database_url = url,
            Err(e) => return VerifyWhere::Usage(format!("{e:#}")),
        }
        let on_command_line = |id: &str| matches.is_none_or(|m| m.value_source(id) == Some(ValueSource::CommandLine));
        let store_flag = (self.data_dir.is_some() && on_command_line("data_dir")) || (self.database_url.is_some() && on_command_line("database_url"));
        let gateway_flag = self.url.is_some() && on_command_line("url");
        let store_env = self.data_dir.is_some() || self.database_url.is_some();
        let gateway_env = self.url.is_some();
        let store = match (store_flag, gateway_flag) {
            (true, true) => {
                return VerifyWhere::Usage("give either --data-dir/--database-url (check the store) or --url (ask the gateway), not both".to_owned());
            }
            (true, false) => true,
            (false, true) => false,
            (false, false) => match (store_env, gateway_env) {
                (true, true) => {
                    return VerifyWhere::Usage(
                        "both ATASIRA_DATA_DIR/ATASIRA_DATABASE_URL and ATASIRA_BFF_URL are set: pass --data-dir or --database-url to check the store, or --url to ask the gateway"
                            .to_owned(),
                    );
                }
                (true, false) => true,
                (false, true) => false,
                (false, false) => {
                    return VerifyWhere::Usage(
                        "say where the ledger is: --data-dir DIR or --database-url URL to check the store, or --url URL with --token to ask a running gateway"
                            .to_owned(),
                    );
                }
            },
        };
        if store {
            // Of a data dir and a database URL, the one on the command line wins; two on
            // the same footing are ambiguous.
            let (data_dir, database_url) = match (self.data_dir, self.database_url) {
                (Some(dir), Some(url)) => match (on_command_line("data_dir"), on_command_line("database_url")) {
                    (true, false) => (Some(dir), None),
                    (false, true) => (None, Some(url)),
                    _ => return VerifyWhere::Usage("give either --data-dir or --database-url, not both".to_owned()),
                },
                other => other,
            };
            VerifyWhere::Store(StoreCheck { data_dir, database_url, audit_key: self.audit_key })
        } else {
            VerifyWhere::Gateway(Connection { url: self.url.unwrap_or_default(), token: self.token, json: self.json, ca_file: None })
        }
    }
}

/// An RFC 3339 time, as given (the API reads it).
fn parse_time(text: &str) -> Result<String, String> {
    chrono::DateTime::parse_from_rfc3339(text).map(|_| text.to_owned()).map_err(|e| format!("not an RFC 3339 time such as 2026-12-01T09:00:00Z ({e})"))
}

/// The name clap gives a value (its kebab-case spelling), in the API's snake_case.
fn wire_name(value: impl ValueEnum) -> String {
    value.to_possible_value().map(|v| v.get_name().replace('-', "_")).unwrap_or_default()
}

fn page_pairs(paging: &Paging) -> [(&'static str, Option<String>); 2] {
    [("limit", paging.limit.map(|l| l.to_string())), ("cursor", paging.cursor.clone())]
}

pub fn drafts(command: DraftsCommand) -> ExitCode {
    ExitCode::from(run_drafts(command))
}

fn run_drafts(command: DraftsCommand) -> u8 {
    match command {
        DraftsCommand::Pending { paging, connection } => {
            let path = format!("/api/v1/boxes/box-drafts/pending{}", query(&page_pairs(&paging)));
            call(&connection, "GET", &path, None, |_, page| print::drafts(page))
        }
        DraftsCommand::Mine { status, paging, connection } => {
            let mut pairs = vec![("mine", Some("true".to_owned())), ("status", status.map(|s| s.as_str().to_owned()))];
            pairs.extend(page_pairs(&paging));
            call(&connection, "GET", &format!("/api/v1/boxes/box-drafts{}", query(&pairs)), None, |_, page| print::drafts(page))
        }
        DraftsCommand::Show { draft_id, connection } => {
            call(&connection, "GET", &format!("/api/v1/boxes/box-drafts/{}", segment(&draft_id)), None, |_, d| print::draft(d))
        }
        DraftsCommand::Create { file, connection } => {
            let body = match read_json(&file) {
                Ok(body) => body,
                Err(message) => return usage(&message),
            };
            call(&connection, "POST", "/api/v1/boxes/box-drafts", Some(&body), |_, d| print::draft_created(d))
        }
        DraftsCommand::Approve { draft_id, confirm_over_limit, connection } => approve(&draft_id, confirm_over_limit, &connection),
        DraftsCommand::Reject { draft_id, reason, connection } => {
            let path = format!("/api/v1/boxes/box-drafts/{}/reject", segment(&draft_id));
            call(&connection, "POST", &path, Some(&json!({"reason": reason})), |_, d| print::draft_status(d))
        }
        DraftsCommand::Revise { draft_id, file, connection } => match read_json(&file) {
            Ok(patch) => call(&connection, "POST", &format!("/api/v1/boxes/box-drafts/{}/revise", segment(&draft_id)), Some(&patch), |_, d| print::draft(d)),
            Err(message) => usage(&message),
        },
        DraftsCommand::Withdraw { draft_id, connection } => {
            let path = format!("/api/v1/boxes/box-drafts/{}/withdraw", segment(&draft_id));
            call(&connection, "POST", &path, Some(&json!({})), |_, d| print::draft_status(d))
        }
    }
}

/// Reads a JSON file (or standard input): a draft request, an edit, a merge patch.
fn read_json(file: &std::path::Path) -> Result<Value, String> {
    let bytes = if file == std::path::Path::new("-") {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf).map_err(|e| format!("cannot read standard input: {e}"))?;
        buf
    } else {
        std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?
    };
    serde_json::from_slice(&bytes).map_err(|e| format!("{} is not JSON: {e}", file.display()))
}

/// Looks at the draft first: one over the limit is approved only once confirmed.
fn approve(draft_id: &str, confirm_over_limit: bool, connection: &Connection) -> u8 {
    let path = format!("/api/v1/boxes/box-drafts/{}", segment(draft_id));
    let draft = match send(connection, "GET", &path, None) {
        Ok((status, draft)) if (200..300).contains(&status) => draft,
        Ok((status, error)) => {
            if connection.json {
                print::json(&error);
            }
            return refused(status, &error);
        }
        Err(code) => return code,
    };
    let draft: DraftDetail = match typed(draft) {
        Ok(draft) => draft,
        Err(code) => return code,
    };
    let draft = draft.summary;
    let over_limit = draft.over_limit;
    if over_limit && !confirm_over_limit {
        let dangerous = print::dangerous_text(&draft.over_limit_ops, &draft.over_limit_tools);
        let terminal = std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
        if !terminal {
            return usage(&format!(
                "draft {draft_id} ({}) is over the limit: it asks for {dangerous}; pass --confirm-over-limit to approve it",
                draft.box_type
            ));
        }
        eprint!("draft {draft_id} ({}) is over the limit: it asks for {dangerous}.\nApprove it anyway? Type yes to confirm: ", draft.box_type);
        let mut answer = String::new();
        if std::io::stdin().read_line(&mut answer).is_err() || answer.trim() != "yes" {
            eprintln!("atasira: not approved");
            return USAGE;
        }
    }
    let body = json!({"confirm_over_limit": over_limit});
    call(connection, "POST", &format!("{path}/approve"), Some(&body), |_, a| print::approved(a))
}

pub fn boxes(command: BoxesCommand) -> ExitCode {
    ExitCode::from(run_boxes(command))
}

fn run_boxes(command: BoxesCommand) -> u8 {
    let action = |verb: &str, box_id: &str, connection: &Connection| {
        let path = format!("/api/v1/boxes/{}/{verb}", segment(box_id));
        call(connection, "POST", &path, Some(&json!({})), |_, b| print::box_state(b))
    };
    match command {
        BoxesCommand::List { state, paging, connection } => {
            let mut pairs = vec![("state", state.map(wire_name))];
            pairs.extend(page_pairs(&paging));
            call(&connection, "GET", &format!("/api/v1/boxes{}", query(&pairs)), None, |_, page| print::boxes(page))
        }
        BoxesCommand::Show { box_id, connection } => {
            call(&connection, "GET", &format!("/api/v1/boxes/{}", segment(&box_id)), None, |_, b| print::box_detail(b))
        }
        BoxesCommand::History { box_id, paging, connection } => {
            let path = format!("/api/v1/boxes/{}/history{}", segment(&box_id), query(&page_pairs(&paging)));
            call(&connection, "GET", &path, None, |_, h| print::history(h))
        }
        BoxesCommand::Stop { box_id, connection } => action("stop", &box_id, &connection),
        BoxesCommand::Resume { box_id, connection } => action("resume", &box_id, &connection),
        BoxesCommand::Archive { box_id, connection } => action("archive", &box_id, &connection),
        BoxesCommand::Edit { box_id, file, connection } => match read_json(&file) {
            Ok(edit) => call(&connection, "PUT", &format!("/api/v1/boxes/{}/manifest", segment(&box_id)), Some(&edit), |_, b| print::box_detail(b)),
            Err(message) => usage(&message),
        },
        BoxesCommand::Config { box_id, file, connection } => match read_json(&file) {
            Ok(patch) => call(&connection, "PATCH", &format!("/api/v1/boxes/{}/config", segment(&box_id)), Some(&patch), |_, b| print::box_detail(b)),
            Err(message) => usage(&message),
        },
        BoxesCommand::Change { box_id, file, connection } => match read_json(&file) {
            Ok(patch) => {
                call(&connection, "POST", &format!("/api/v1/boxes/{}/change-requests", segment(&box_id)), Some(&patch), |_, c| print::change_requested(c))
            }
            Err(message) => usage(&message),
        },
        BoxesCommand::Unassign { box_id, user, connection } => {
            let path = format!("/api/v1/boxes/{}/user-assignments/{}", segment(&box_id), segment(&user));
            call(&connection, "DELETE", &path, None, |_, b| print::box_detail(b))
        }
        BoxesCommand::Assign { box_id, user, role, connection } => {
            let body = json!({"user_id": user, "role_in_box": wire_name(role)});
            call(&connection, "POST", &format!("/api/v1/boxes/{}/user-assignments", segment(&box_id)), Some(&body), |_, b| print::box_detail(b))
        }
    }
}

/// `audit list`, or `audit verify` through a gateway: the exit code. `audit verify` on the
/// store is the operator's check: its settings are handed back to run it.
pub fn audit(command: AuditCommand, matches: Option<&ArgMatches>) -> Result<ExitCode, StoreCheck> {
    match command {
        AuditCommand::List { action, target, since, paging, connection } => {
            let mut pairs = vec![("action", action), ("target", target), ("since", since)];
            pairs.extend(page_pairs(&paging));
            Ok(ExitCode::from(call(&connection, "GET", &format!("/api/v1/audit{}", query(&pairs)), None, |_, page| print::audit_rows(page))))
        }
        AuditCommand::Export { since, until, format, out, connection } => Ok(ExitCode::from(export(&connection, since, until, format, out))),
        AuditCommand::Verify(VerifyArgs { file: Some(file), public_key, .. }) => Ok(ExitCode::from(verify_file(&file, public_key.as_deref()))),
        AuditCommand::Verify(args) => match args.choose(matches) {
            VerifyWhere::Gateway(connection) => Ok(ExitCode::from(verify(&connection))),
            VerifyWhere::Store(check) => Err(check),
            VerifyWhere::Usage(message) => Ok(ExitCode::from(usage(&message))),
        },
    }
}

/// `audit export`: the export written to `out` (or standard output).
fn export(connection: &Connection, since: Option<String>, until: Option<String>, format: ExportFormat, out: Option<PathBuf>) -> u8 {
    let path = format!("/api/v1/audit/export{}", query(&[("since", since), ("until", until), ("format", Some(wire_name(format)))]));
    let written = match &out {
        None => transport::download(connection, &path, &mut std::io::stdout().lock()),
        Some(file) => {
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
            let mut f = match options.open(file) {
                Ok(f) => f,
                Err(e) => return usage(&format!("cannot write {}: {e}", file.display())),
            };
            transport::download(connection, &path, &mut f)
        }
    };
    match (written, &out) {
        (Ok(bytes), Some(file)) => {
            eprintln!("atasira: wrote the export to {} ({bytes} bytes); check it with `atasira audit verify --file {}`", file.display(), file.display());
            OK
        }
        (Ok(_), None) => OK,
        (Err(code), _) => code,
    }
}

/// `audit verify --file`: 0 when the export verifies, 1 when it does not, 2 when the file
/// cannot be read as an export.
fn verify_file(file: &std::path::Path, public_key: Option<&str>) -> u8 {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => return usage(&format!("cannot read {}: {e}", file.display())),
    };
    match atasira_domain::audit::export::verify_export_text(&text, public_key) {
        Ok(v) => {
            print::json(&serde_json::to_value(&v).unwrap_or_default());
            if v.ok { OK } else { REFUSED }
        }
        Err(e) => usage(&format!("{} is not an export: {e}", file.display())),
    }
}

/// `audit verify` through a gateway: 0 when the ledger verifies, 1 when it does not (or
/// the API refused).
fn verify(connection: &Connection) -> u8 {
    let (status, value) = match send(connection, "GET", "/api/v1/audit/verify", None) {
        Ok(answer) => answer,
        Err(code) => return code,
    };
    if connection.json {
        print::json(&value);
    }
    if !(200..300).contains(&status) {
        return refused(status, &value);
    }
    let result: VerifyResult = match typed(value) {
        Ok(result) => result,
        Err(code) => return code,
    };
    if !connection.json {
        print::verify_result(&result);
    }
    if result.ok { OK } else { REFUSED }
}

/// The input segments in the order they were given on the command line (clap keeps each
/// flag's values apart; their indices tell the order).
fn ordered_input(matches: Option<&ArgMatches>, text: &[String], ticket: &[String], objective: &[String]) -> Result<Vec<Value>, String> {
    let mut segments: Vec<(usize, &str, &str)> = Vec::new();
    for (id, kind, values) in [("text", "text", text), ("ticket", "ticket_ref", ticket), ("objective", "objective_ref", objective)] {
        let indices: Vec<usize> = matches.and_then(|m| m.indices_of(id)).map(Iterator::collect).unwrap_or_default();
        for (i, value) in values.iter().enumerate() {
            // Without indices (a caller that built the command itself), the kinds follow
            // one another in this order.
            let at = indices.get(i).copied().unwrap_or(usize::MAX / 2 + segments.len());
            segments.push((at, kind, value));
        }
    }
    if segments.is_empty() {
        return Err("give the Worker some input: --text, --ticket or --objective (at least one)".to_owned());
    }
    segments.sort_by_key(|(at, _, _)| *at);
    Ok(segments.into_iter().map(|(_, kind, value)| json!({"kind": kind, "value": value})).collect())
}

fn parse_labels(labels: &[String]) -> Result<std::collections::BTreeMap<String, String>, String> {
    let mut out = std::collections::BTreeMap::new();
    for label in labels {
        let (key, value) = label.split_once('=').ok_or_else(|| format!("--label {label:?} is not KEY=VALUE"))?;
        if out.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(format!("--label {key} is given more than once"));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, FromArgMatches, Parser};

    use super::exit::UNREACHABLE;
    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        command: WorkersCommand,
    }

    fn parsed(args: &[&str]) -> (WorkersCommand, ArgMatches) {
        let matches = Cli::command().try_get_matches_from(args).expect("parses");
        let cli = Cli::from_arg_matches(&matches).expect("typed");
        let sub = matches.subcommand().map(|(_, m)| m.clone()).expect("subcommand");
        (cli.command, sub)
    }

    #[test]
    fn r_cli_segments_keep_the_order_they_were_given_in() {
        let (command, matches) =
            parsed(&["w", "create", "--box", "b", "--launch-id", "l", "--ticket", "T-1", "--text", "a", "--objective", "O", "--text", "b"]);
        let WorkersCommand::Create { input, .. } = command else { panic!("create") };
        let input = ordered_input(Some(&matches), &input.text, &input.ticket, &input.objective).expect("input");
        let kinds: Vec<(&str, &str)> = input.iter().map(|s| (s["kind"].as_str().unwrap_or(""), s["value"].as_str().unwrap_or(""))).collect();
        assert_eq!(kinds, [("ticket_ref", "T-1"), ("text", "a"), ("objective_ref", "O"), ("text", "b")]);
        assert!(ordered_input(Some(&matches), &[], &[], &[]).is_err(), "no input is a usage error");
    }

    #[test]
    fn r_cli_labels_are_key_value_pairs() {
        assert_eq!(parse_labels(&["a=1".into(), "b=x=y".into(), "c=".into()]).expect("labels").get("b").map(String::as_str), Some("x=y"));
        assert!(parse_labels(&["nokey".into()]).is_err());
        assert!(parse_labels(&["a=1".into(), "a=2".into()]).is_err());
    }

    #[test]
    fn r_cli_exit_codes_no_token_is_usage_and_no_gateway_is_unreachable() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("port").port();
        let url = format!("http://127.0.0.1:{port}");
        let (no_token, m) = parsed(&["w", "show", "wkr_1", "--url", &url, "--token", ""]);
        assert_eq!(run(no_token, Some(&m)), USAGE);
        let (nobody, m) = parsed(&["w", "list", "--box", "b", "--url", &url, "--token", "pat"]);
        assert_eq!(run(nobody, Some(&m)), UNREACHABLE);
        let (bad_label, m) = parsed(&["w", "create", "--box", "b", "--launch-id", "l", "--text", "t", "--label", "x", "--url", &url, "--token", "pat"]);
        assert_eq!(run(bad_label, Some(&m)), USAGE);
    }

    #[derive(Debug, Parser)]
    enum Others {
        #[command(subcommand)]
        Drafts(DraftsCommand),
        #[command(subcommand)]
        Boxes(BoxesCommand),
        #[command(subcommand)]
        Audit(AuditCommand),
        #[command(subcommand)]
        Webhooks(WebhooksCommand),
    }

    #[test]
    fn r_cli_wire_names_are_the_apis() {
        for status in DraftStatus::ALL {
            for name in [status.as_str().to_owned(), status.as_str().replace('_', "-")] {
                let parsed = Others::try_parse_from(["o", "drafts", "mine", "--status", &name]).expect("a status");
                assert!(matches!(parsed, Others::Drafts(DraftsCommand::Mine { status: Some(s), .. }) if s == status), "{name}");
            }
        }
        assert!(Others::try_parse_from(["o", "drafts", "mine", "--status", "sleeping"]).is_err());
        assert_eq!(wire_name(BoxStateArg::All), "all");
        assert_eq!(wire_name(RoleInBoxArg::Primary), "primary");
        assert_eq!(query(&[("a", None), ("action", Some("box.activate".into())), ("target", Some("d 1".into()))]), "?action=box.activate&target=d%201");
        assert_eq!(query(&[("a", None)]), "");
        assert_eq!(wire_name(WebhookFormatArg::Slack), "slack");
        assert_eq!(wire_name(DeliveryStateArg::Dead), "dead");
        let parsed = Others::try_parse_from(["o", "webhooks", "add", "https://chat.example/hook", "--kind", "draft.pending", "--kind", "worker.escalated"]);
        assert!(
            matches!(parsed, Ok(Others::Webhooks(WebhooksCommand::Add { ref kinds, format: None, .. })) if kinds == &["draft.pending", "worker.escalated"]),
            "{parsed:?}"
        );
        assert!(Others::try_parse_from(["o", "webhooks", "deliveries", "wh_1", "--state", "failed"]).is_err());
    }

    fn verify_args() -> VerifyArgs {
        VerifyArgs {
            file: None,
            public_key: None,
            data_dir: None,
            database_url: None,
            database_url_file: None,
            audit_key: None,
            url: None,
            token: Some("pat".into()),
            json: false,
        }
    }

    #[test]
    fn r_cli_audit_verify_checks_the_store_or_asks_the_gateway() {
        let store = VerifyArgs { data_dir: Some("d".into()), audit_key: Some("k".into()), ..verify_args() };
        assert!(matches!(store.choose(None), VerifyWhere::Store(StoreCheck { data_dir: Some(_), database_url: None, audit_key: Some(_) })));
        let gateway = VerifyArgs { url: Some("http://gw".into()), json: true, ..verify_args() };
        assert!(matches!(gateway.choose(None), VerifyWhere::Gateway(Connection { json: true, .. })));
        assert!(matches!(verify_args().choose(None), VerifyWhere::Usage(_)), "neither is a usage error");
        let both = VerifyArgs { database_url: Some("postgres://x".into()), url: Some("http://gw".into()), ..verify_args() };
        assert!(matches!(both.choose(None), VerifyWhere::Usage(_)), "both is a usage error");
        let two_stores = VerifyArgs { data_dir: Some("d".into()), database_url: Some("postgres://x".into()), ..verify_args() };
        assert!(matches!(two_stores.choose(None), VerifyWhere::Usage(_)));
    }

    #[test]
    fn r_cli_audit_since_is_an_rfc3339_time() {
        assert_eq!(parse_time("2026-12-01T18:00:00+09:00").as_deref(), Ok("2026-12-01T18:00:00+09:00"));
        assert!(parse_time("yesterday").is_err());
        assert_eq!(query(&[("since", Some("2026-12-01T18:00:00+09:00".into()))]), "?since=2026-12-01T18%3A00%3A00%2B09%3A00");
    }

    #[test]
    fn r_cli_every_flag_has_help() {
        let others = Others::command();
        let groups = others.get_subcommands().flat_map(|g| g.get_subcommands().cloned().collect::<Vec<_>>());
        let command = Cli::command();
        for sub in command.get_subcommands().cloned().chain(groups) {
            let sub = &sub;
            assert!(sub.get_about().is_some(), "{}", sub.get_name());
            for arg in sub.get_arguments() {
                assert!(arg.get_help().is_some(), "{} --{}", sub.get_name(), arg.get_id());
            }
        }
    }
}
