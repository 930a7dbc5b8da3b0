//! The Worker aggregate (SPEC §10, R-WORKER-4, R-WORKER-7): one stream per launch, its id
//! [`worker_id_for`] the launch_id, so every retry of a launch names the same stream. The
//! stream holds the Worker's creation (catalog entry and initial transcript, with the
//! chain of custody that led to its bundle) and every refused attempt at the launch.
//!
//! Then its life (R-HOST-1, R-HOST-2): one execution host claims it (`WorkerClaimed`, state
//! `starting`), reports it `running` or `paused`, its log lines and how it ended
//! (`succeeded`, `failed`, `killed`); the registry records it `lost` when its host's lease
//! ran out; users ask it to stop or be killed and send it more input. Its host records the
//! tool calls it denied, and those that need a human admin (R-DECIDE-2): a tool-use request
//! one human admin (never the Worker's launcher) approves or rejects before its deadline,
//! after which it is expired (a denial).
//!
//! Architecture Invariant: only `Create` issues a Worker, once per launch_id; a second
//! `Create` of the same request adds nothing, of another request is `launch_id_conflict`.
//! The binding handle is kept here as an opaque string and nowhere else in the runtime.
//! A Worker is claimed once, by one host, and only from `created`: an ended or lost Worker
//! never runs again, so no Worker runs twice at once. Only its host reports on it.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;
use crate::error::{ErrorCode, FieldError, Refusing};
use crate::principal::Principal;
use crate::worker::{LOG_BYTES, LOG_LINE_CHARS, LOG_LINES, LaunchRequest, RESULT_CHARS, Segment, WorkerState, segment_errors, validate_launch, worker_id_for};

/// What `Create` asks for: every look-up (fingerprint, bundle, approval key, chain) was
/// made before the command was built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewWorker {
    pub worker_id: String,
    pub launch_id: String,
    pub box_id: String,
    pub box_type: String,
    pub role: String,
    pub labels: BTreeMap<String, String>,
    pub initial_input: Vec<Segment>,
    /// [`crate::worker::launch_fingerprint`] of the request and its caller.
    pub fingerprint: String,
    pub bundle_digest: String,
    /// The execution binding's opaque handle, as the caller passed it.
    pub binding_handle: String,
    pub created_by: String,
    pub approval_key_id: String,
    /// Event ids from the approval to the bundle: `DraftApproved`, `BoxActivated`, each
    /// manifest or config edit, `ConfigBundleSynced`.
    pub chain: Vec<String>,
    pub at: DateTime<Utc>,
    /// R-POLICY-1: the organisation's policy's verdict on the launch (`None`: no policy).
    pub policy: Option<crate::org_policy::Verdict>,
}

/// The Worker as its stream knows it (what a later `Create` is compared with).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerData {
    pub worker_id: String,
    pub launch_id: String,
    pub box_id: String,
    pub box_type: String,
    pub fingerprint: String,
    pub bundle_digest: String,
    pub binding_handle: String,
    pub created_by: String,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Worker {
    /// `None` until created.
    pub data: Option<WorkerData>,
    /// Refused attempts recorded on the stream.
    pub refusals: u32,
    /// Where it is in its life (`created` until a host claims it).
    pub state: WorkerState,
    /// The host that claimed it.
    pub host: Option<String>,
    /// A stop (`false`) or kill (`true`) was asked for.
    pub stop_requested: Option<bool>,
    /// A pause was asked for (and no resume since).
    pub pause_requested: bool,
    /// Bytes of log recorded so far (at most [`LOG_BYTES`]).
    pub log_bytes: usize,
    /// Later inputs recorded (transcript entries after the first).
    pub inputs: u32,
    /// Its tool-use requests, by id.
    pub tool_requests: BTreeMap<String, ToolRequest>,
    /// The tool each request asks about.
    pub tool_names: BTreeMap<String, String>,
    /// Its notifications, by id.
    pub notifications: std::collections::BTreeSet<String>,
}

/// A tool-use request as the Worker's stream knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolRequest {
    pub state: ToolRequestState,
    pub expires_at: DateTime<Utc>,
    /// Who approved or rejected it, and a rejection's reason.
    pub decided_by: String,
    pub reason: String,
}

/// Where a tool-use request is: waiting for a human admin, or decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolRequestState {
    Pending,
    Approved,
    Rejected,
    Expired,
}

impl ToolRequestState {
    pub fn as_str(self) -> &'static str {
        match self {
            ToolRequestState::Pending => "pending",
            ToolRequestState::Approved => "approved",
            ToolRequestState::Rejected => "rejected",
            ToolRequestState::Expired => "expired",
        }
    }
}

/// What a host asks a human admin about (R-DECIDE-2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolAsk {
    /// `tur_` and 32 hex digits, chosen by the host (a retry names the same request).
    pub request_id: String,
    pub tool: String,
    pub rule: String,
    pub reason: String,
    /// The call's input as JSON (clipped to [`DECISION_INPUT_CHARS`]).
    pub input: String,
    pub expires_at: DateTime<Utc>,
}

/// A notification a Worker asked for and its host allowed (`notify.<channel>`, within its
/// recipients; R-NOTIFY-1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Notification {
    /// `ntf_` and 32 hex digits, chosen by the host: a retried report adds nothing.
    pub notification_id: String,
    /// `email` or `line`.
    pub channel: String,
    pub to: Vec<String>,
    pub broadcast: bool,
    pub subject: String,
    pub body: String,
}

/// Longest notification subject and body, in characters.
pub const NOTIFICATION_SUBJECT_CHARS: usize = 200;
pub const NOTIFICATION_BODY_CHARS: usize = 20_000;

/// What the host running a Worker reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Report {
    /// Started, or resumed after a pause.
    Running,
    Paused,
    /// Lines the Worker wrote (clipped to the bounds; beyond [`LOG_BYTES`] dropped).
    Log(Vec<String>),
    /// It ended: `succeeded`, `failed` or `killed`, with its exit code and result.
    Finished {
        state: WorkerState,
        exit_code: Option<i32>,
        result: String,
    },
}

#[derive(Debug, Clone)]
pub enum WorkerCommand {
    /// R-WORKER-4.
    Create(Box<NewWorker>),
    /// A refused attempt at this launch (audited as `worker.create_refused`).
    RecordRefusal { worker_id: String, launch_id: String, box_id: String, by: String, code: ErrorCode, reason: String, at: DateTime<Utc> },
    /// An execution host takes the Worker on (R-HOST-1).
    Claim { host: String, at: DateTime<Utc> },
    /// The Worker's host reports on it (R-HOST-2).
    Report { host: String, report: Report, at: DateTime<Utc> },
    /// The host's lease ran out while the Worker was its: it is lost.
    Lose { host: String, at: DateTime<Utc> },
    /// A user asks the Worker to stop (`kill: false`: it may finish its step) or be killed.
    Stop { by: String, kill: bool, at: DateTime<Utc> },
    /// A user asks the Worker to pause (`true`) or resume (`false`).
    Pause { by: String, pause: bool, at: DateTime<Utc> },
    /// More input for a Worker that has not ended.
    AddInput { by: String, input: Vec<Segment>, at: DateTime<Utc> },
    /// Its host denied a tool call (R-DECIDE-1): recorded for the ledger.
    RecordDenial { host: String, tool: String, rule: String, reason: String, input: String, at: DateTime<Utc> },
    /// Its host allowed a notification (R-NOTIFY-1): the audit service delivers it.
    Notify { host: String, notification: Notification, at: DateTime<Utc> },
    /// Its host asks a human admin about a tool call (R-DECIDE-2).
    Ask { host: String, ask: ToolAsk, at: DateTime<Utc> },
    /// A human admin decides a tool-use request.
    /// `policy`: the organisation's policy's verdict on the decision (R-POLICY-1).
    DecideTool { request_id: String, by: Principal, approve: bool, reason: String, now: DateTime<Utc>, policy: Option<crate::org_policy::Verdict> },
    /// Nobody decided before its deadline: it is denied.
    ExpireTool { request_id: String, now: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WorkerEvent {
    WorkerCreated {
        worker_id: String,
        launch_id: String,
        box_id: String,
        box_type: String,
        role: String,
        labels: BTreeMap<String, String>,
        initial_input: Vec<Segment>,
        fingerprint: String,
        bundle_digest: String,
        binding_handle: String,
        created_by: String,
        approval_key_id: String,
        chain: Vec<String>,
        at: DateTime<Utc>,
        /// R-POLICY-1: the policy version that allowed the launch and its asking rules;
        /// absent when no policy was loaded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        policy: Option<crate::org_policy::Verdict>,
    },
    WorkerLaunchRefused {
        worker_id: String,
        launch_id: String,
        box_id: String,
        by: String,
        /// The refusal's error code (`box_not_active`, `binding_expired`, ...).
        code: String,
        reason: String,
        at: DateTime<Utc>,
    },
    WorkerClaimed {
        worker_id: String,
        box_id: String,
        host: String,
        at: DateTime<Utc>,
    },
    /// Started, or resumed.
    WorkerRunning {
        worker_id: String,
        box_id: String,
        host: String,
        at: DateTime<Utc>,
    },
    WorkerPaused {
        worker_id: String,
        box_id: String,
        host: String,
        at: DateTime<Utc>,
    },
    WorkerLogged {
        worker_id: String,
        host: String,
        lines: Vec<String>,
        at: DateTime<Utc>,
    },
    WorkerFinished {
        worker_id: String,
        box_id: String,
        host: String,
        /// `succeeded`, `failed` or `killed`.
        state: WorkerState,
        exit_code: Option<i32>,
        result: String,
        at: DateTime<Utc>,
    },
    WorkerLost {
        worker_id: String,
        box_id: String,
        host: String,
        at: DateTime<Utc>,
    },
    WorkerStopRequested {
        worker_id: String,
        box_id: String,
        by: String,
        kill: bool,
        at: DateTime<Utc>,
    },
    WorkerInputAdded {
        worker_id: String,
        by: String,
        input: Vec<Segment>,
        at: DateTime<Utc>,
    },
    /// A pause (`pause: true`) or resume was asked for.
    WorkerPauseRequested {
        worker_id: String,
        box_id: String,
        by: String,
        pause: bool,
        at: DateTime<Utc>,
    },
    /// A tool call its host denied, with the manifest rule that decided.
    WorkerNotificationRequested {
        worker_id: String,
        box_id: String,
        host: String,
        notification: Notification,
        at: DateTime<Utc>,
    },
    WorkerToolDenied {
        worker_id: String,
        box_id: String,
        host: String,
        tool: String,
        rule: String,
        reason: String,
        /// The call's input as JSON, at most [`DECISION_INPUT_CHARS`] characters.
        input: String,
        at: DateTime<Utc>,
    },
    /// A tool call waits for a human admin (R-DECIDE-2).
    WorkerToolUseRequested {
        request_id: String,
        worker_id: String,
        box_id: String,
        host: String,
        tool: String,
        rule: String,
        reason: String,
        input: String,
        expires_at: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    WorkerToolUseApproved {
        request_id: String,
        worker_id: String,
        box_id: String,
        tool: String,
        by: String,
        at: DateTime<Utc>,
        /// R-POLICY-1: the policy version that allowed the decision; absent without one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        policy: Option<crate::org_policy::Verdict>,
    },
    WorkerToolUseRejected {
        request_id: String,
        worker_id: String,
        box_id: String,
        tool: String,
        by: String,
        reason: String,
        at: DateTime<Utc>,
        /// R-POLICY-1: the policy version that allowed the decision; absent without one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        policy: Option<crate::org_policy::Verdict>,
    },
    WorkerToolUseExpired {
        request_id: String,
        worker_id: String,
        box_id: String,
        tool: String,
        at: DateTime<Utc>,
    },
}

/// How much of a tool call's input a recorded decision keeps.
pub const DECISION_INPUT_CHARS: usize = 1_000;

impl WorkerEvent {
    pub fn name(&self) -> &'static str {
        match self {
            WorkerEvent::WorkerCreated { .. } => "WorkerCreated",
            WorkerEvent::WorkerLaunchRefused { .. } => "WorkerLaunchRefused",
            WorkerEvent::WorkerClaimed { .. } => "WorkerClaimed",
            WorkerEvent::WorkerRunning { .. } => "WorkerRunning",
            WorkerEvent::WorkerPaused { .. } => "WorkerPaused",
            WorkerEvent::WorkerLogged { .. } => "WorkerLogged",
            WorkerEvent::WorkerFinished { .. } => "WorkerFinished",
            WorkerEvent::WorkerLost { .. } => "WorkerLost",
            WorkerEvent::WorkerStopRequested { .. } => "WorkerStopRequested",
            WorkerEvent::WorkerInputAdded { .. } => "WorkerInputAdded",
            WorkerEvent::WorkerPauseRequested { .. } => "WorkerPauseRequested",
            WorkerEvent::WorkerToolDenied { .. } => "WorkerToolDenied",
            WorkerEvent::WorkerNotificationRequested { .. } => "WorkerNotificationRequested",
            WorkerEvent::WorkerToolUseRequested { .. } => "WorkerToolUseRequested",
            WorkerEvent::WorkerToolUseApproved { .. } => "WorkerToolUseApproved",
            WorkerEvent::WorkerToolUseRejected { .. } => "WorkerToolUseRejected",
            WorkerEvent::WorkerToolUseExpired { .. } => "WorkerToolUseExpired",
        }
    }

    /// The state this event puts its Worker in, if it changes it.
    pub fn state(&self) -> Option<WorkerState> {
        Some(match self {
            WorkerEvent::WorkerCreated { .. } => WorkerState::Created,
            WorkerEvent::WorkerClaimed { .. } => WorkerState::Starting,
            WorkerEvent::WorkerRunning { .. } => WorkerState::Running,
            WorkerEvent::WorkerPaused { .. } => WorkerState::Paused,
            WorkerEvent::WorkerFinished { state, .. } => *state,
            WorkerEvent::WorkerLost { .. } => WorkerState::Lost,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WorkerError {
    /// 409: the launch_id made a Worker for another request.
    #[error("launch_id {0:?} was used for another request; choose a new launch_id")]
    LaunchIdConflict(String),
    /// 422: the launch breaks its bounds (each error names its field).
    #[error("the launch is invalid: {}", crate::error::joined(.0))]
    Invalid(Vec<FieldError>),
    /// 422: the command names another stream than its launch_id's (a bug of the caller).
    #[error("worker_id is not the launch_id's")]
    WrongWorkerId,
    /// 404: no Worker was created on this stream.
    #[error("no such Worker")]
    NotFound,
    /// 409: the Worker has ended (or was lost); nothing more happens to it.
    #[error("the Worker has ended ({0})")]
    Ended(WorkerState),
    /// 409: another host claimed it, or it ran already.
    #[error("the Worker is not waiting for a host: it is {0}")]
    NotClaimable(WorkerState),
    /// 403: a host reporting on a Worker it does not run.
    #[error("this host does not run the Worker")]
    NotItsHost,
    /// 422: a report that makes no sense here (an unknown end state, a pause before start).
    #[error("{0}")]
    BadReport(&'static str),
    /// 404: the Worker has no tool-use request with this id.
    #[error("no such tool-use request")]
    NoToolRequest,
    /// 409: decided or expired already.
    #[error("the tool-use request was {} already", .0.as_str())]
    ToolRequestDone(ToolRequestState),
    /// 403: only a human admin who did not launch the Worker decides its tool calls.
    #[error("{0}")]
    NotTheirDecision(&'static str),
}

impl WorkerError {
    pub fn code(&self) -> ErrorCode {
        match self {
            WorkerError::LaunchIdConflict(_) => ErrorCode::LaunchIdConflict,
            WorkerError::Invalid(_) | WorkerError::WrongWorkerId | WorkerError::BadReport(_) => ErrorCode::InvalidRequest,
            WorkerError::NotFound => ErrorCode::WorkerNotFound,
            WorkerError::Ended(_) => ErrorCode::WorkerEnded,
            WorkerError::NotClaimable(_) => ErrorCode::Conflict,
            WorkerError::NotItsHost | WorkerError::NotTheirDecision(_) => ErrorCode::Forbidden,
            WorkerError::NoToolRequest => ErrorCode::ToolRequestNotFound,
            WorkerError::ToolRequestDone(_) => ErrorCode::ToolRequestNotPending,
        }
    }
}

impl Refusing for WorkerError {
    fn error_code(&self) -> ErrorCode {
        self.code()
    }
    fn field_errors(&self) -> Vec<FieldError> {
        match self {
            WorkerError::Invalid(errors) => errors.clone(),
            _ => Vec::new(),
        }
    }
}

impl NewWorker {
    /// The event that issues this Worker (what `Create` appends on a new stream).
    pub fn created(self) -> WorkerEvent {
        WorkerEvent::WorkerCreated {
            worker_id: self.worker_id,
            launch_id: self.launch_id,
            box_id: self.box_id,
            box_type: self.box_type,
            role: self.role,
            labels: self.labels,
            initial_input: self.initial_input,
            fingerprint: self.fingerprint,
            bundle_digest: self.bundle_digest,
            binding_handle: self.binding_handle,
            created_by: self.created_by,
            approval_key_id: self.approval_key_id,
            chain: self.chain,
            at: self.at,
            policy: self.policy,
        }
    }
}

impl Worker {
    pub fn decide(&self, command: WorkerCommand) -> Result<Vec<WorkerEvent>, WorkerError> {
        match command {
            WorkerCommand::Create(new) => {
                let n = *new;
                if let Some(d) = &self.data {
                    return if d.fingerprint == n.fingerprint { Ok(vec![]) } else { Err(WorkerError::LaunchIdConflict(n.launch_id)) };
                }
                if n.worker_id != worker_id_for(&n.launch_id) {
                    return Err(WorkerError::WrongWorkerId);
                }
                let request = LaunchRequest {
                    launch_id: n.launch_id.clone(),
                    box_id: n.box_id.clone(),
                    role: n.role.clone(),
                    labels: n.labels.clone(),
                    input: n.initial_input.clone(),
                };
                let errors = validate_launch(&request);
                if !errors.is_empty() {
                    return Err(WorkerError::Invalid(errors));
                }
                Ok(vec![n.created()])
            }
            WorkerCommand::RecordRefusal { worker_id, launch_id, box_id, by, code, reason, at } => {
                if worker_id != worker_id_for(&launch_id) {
                    return Err(WorkerError::WrongWorkerId);
                }
                Ok(vec![WorkerEvent::WorkerLaunchRefused { worker_id, launch_id, box_id, by, code: code.as_str().to_owned(), reason, at }])
            }
            WorkerCommand::Claim { host, at } => {
                let d = self.data.as_ref().ok_or(WorkerError::NotFound)?;
                match (&self.state, &self.host) {
                    (WorkerState::Created, _) => {}
                    // A retried claim of the same host.
                    (WorkerState::Starting, Some(h)) if *h == host => return Ok(vec![]),
                    (state, _) => return Err(WorkerError::NotClaimable(*state)),
                }
                Ok(vec![WorkerEvent::WorkerClaimed { worker_id: d.worker_id.clone(), box_id: d.box_id.clone(), host, at }])
            }
            WorkerCommand::Report { host, report, at } => {
                let d = self.ours(&host)?;
                let (worker_id, box_id) = (d.worker_id.clone(), d.box_id.clone());
                Ok(match report {
                    Report::Running if self.state == WorkerState::Running => vec![],
                    Report::Running => vec![WorkerEvent::WorkerRunning { worker_id, box_id, host, at }],
                    Report::Paused if self.state == WorkerState::Paused => vec![],
                    Report::Paused if self.state == WorkerState::Starting => return Err(WorkerError::BadReport("a Worker pauses only once it runs")),
                    Report::Paused => vec![WorkerEvent::WorkerPaused { worker_id, box_id, host, at }],
                    Report::Log(lines) => {
                        let lines = bounded_log(lines, LOG_BYTES.saturating_sub(self.log_bytes));
                        if lines.is_empty() { vec![] } else { vec![WorkerEvent::WorkerLogged { worker_id, host, lines, at }] }
                    }
                    Report::Finished { state, exit_code, result } => {
                        if !matches!(state, WorkerState::Succeeded | WorkerState::Failed | WorkerState::Killed) {
                            return Err(WorkerError::BadReport("a Worker ends succeeded, failed or killed"));
                        }
                        let result = clip(&result, RESULT_CHARS);
                        vec![WorkerEvent::WorkerFinished { worker_id, box_id, host, state, exit_code, result, at }]
                    }
                })
            }
            WorkerCommand::Lose { host, at } => {
                let d = self.ours(&host)?;
                Ok(vec![WorkerEvent::WorkerLost { worker_id: d.worker_id.clone(), box_id: d.box_id.clone(), host, at }])
            }
            WorkerCommand::Stop { by, kill, at } => {
                let d = self.data.as_ref().ok_or(WorkerError::NotFound)?;
                if self.state.is_ended() {
                    return Err(WorkerError::Ended(self.state));
                }
                // Asked already (a kill after a stop still counts).
                if self.stop_requested == Some(true) || self.stop_requested == Some(kill) {
                    return Ok(vec![]);
                }
                let (worker_id, box_id) = (d.worker_id.clone(), d.box_id.clone());
                let asked = WorkerEvent::WorkerStopRequested { worker_id: worker_id.clone(), box_id: box_id.clone(), by, kill, at };
                // No host took it yet: it ends here.
                if self.state == WorkerState::Created {
                    let host = String::new();
                    return Ok(vec![
                        asked,
                        WorkerEvent::WorkerFinished { worker_id, box_id, host, state: WorkerState::Killed, exit_code: None, result: String::new(), at },
                    ]);
                }
                Ok(vec![asked])
            }
            WorkerCommand::Pause { by, pause, at } => {
                let d = self.data.as_ref().ok_or(WorkerError::NotFound)?;
                if self.state.is_ended() {
                    return Err(WorkerError::Ended(self.state));
                }
                if self.pause_requested == pause {
                    return Ok(vec![]);
                }
                Ok(vec![WorkerEvent::WorkerPauseRequested { worker_id: d.worker_id.clone(), box_id: d.box_id.clone(), by, pause, at }])
            }
            WorkerCommand::AddInput { by, input, at } => {
                let d = self.data.as_ref().ok_or(WorkerError::NotFound)?;
                if self.state.is_ended() {
                    return Err(WorkerError::Ended(self.state));
                }
                let errors = segment_errors(&input);
                if !errors.is_empty() {
                    return Err(WorkerError::Invalid(errors));
                }
                Ok(vec![WorkerEvent::WorkerInputAdded { worker_id: d.worker_id.clone(), by, input, at }])
            }
            WorkerCommand::RecordDenial { host, tool, rule, reason, input, at } => {
                let d = self.ours(&host)?;
                Ok(vec![WorkerEvent::WorkerToolDenied {
                    worker_id: d.worker_id.clone(),
                    box_id: d.box_id.clone(),
                    host,
                    tool: clip(&tool, 128),
                    rule: clip(&rule, 128),
                    reason: clip(&reason, 500),
                    input: clip(&input, DECISION_INPUT_CHARS),
                    at,
                }])
            }
            WorkerCommand::Notify { host, notification, at } => {
                let d = self.ours(&host)?;
                let id_ok = notification.notification_id.strip_prefix("ntf_").is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()));
                if !id_ok {
                    return Err(WorkerError::BadReport("a notification id is ntf_ and 32 hex digits"));
                }
                if !matches!(notification.channel.as_str(), "email" | "line") {
                    return Err(WorkerError::BadReport("a notification goes by email or line"));
                }
                if notification.to.is_empty() && !notification.broadcast {
                    return Err(WorkerError::BadReport("a notification names its recipients, or broadcasts"));
                }
                if notification.to.len() > 50
                    || notification.to.iter().any(|t| t.trim().is_empty() || t.chars().count() > 320 || t.chars().any(char::is_control))
                {
                    return Err(WorkerError::BadReport("at most 50 recipients, each 1 to 320 characters"));
                }
                if self.notifications.contains(&notification.notification_id) {
                    return Ok(vec![]);
                }
                let notification = Notification {
                    subject: clip(&notification.subject, NOTIFICATION_SUBJECT_CHARS),
                    body: clip(&notification.body, NOTIFICATION_BODY_CHARS),
                    ..notification
                };
                Ok(vec![WorkerEvent::WorkerNotificationRequested { worker_id: d.worker_id.clone(), box_id: d.box_id.clone(), host, notification, at }])
            }
            WorkerCommand::Ask { host, ask, at } => {
                let d = self.ours(&host)?;
                let id_ok = ask.request_id.strip_prefix("tur_").is_some_and(|h| h.len() == 32 && h.bytes().all(|b| b.is_ascii_hexdigit()));
                if !id_ok {
                    return Err(WorkerError::BadReport("a tool-use request id is tur_ and 32 hex digits"));
                }
                // A retried ask adds nothing.
                if self.tool_requests.contains_key(&ask.request_id) {
                    return Ok(vec![]);
                }
                Ok(vec![WorkerEvent::WorkerToolUseRequested {
                    request_id: ask.request_id,
                    worker_id: d.worker_id.clone(),
                    box_id: d.box_id.clone(),
                    host,
                    tool: clip(&ask.tool, 128),
                    rule: clip(&ask.rule, 128),
                    reason: clip(&ask.reason, 500),
                    input: clip(&ask.input, DECISION_INPUT_CHARS),
                    expires_at: ask.expires_at,
                    at,
                }])
            }
            WorkerCommand::DecideTool { request_id, by, approve, reason, now, policy } => {
                let d = self.data.as_ref().ok_or(WorkerError::NotFound)?;
                let request = self.tool_requests.get(&request_id).ok_or(WorkerError::NoToolRequest)?;
                if !by.is_human_admin() {
                    return Err(WorkerError::NotTheirDecision("only a human admin decides a Worker's tool call"));
                }
                if by.user_id == d.created_by {
                    return Err(WorkerError::NotTheirDecision("the user who launched the Worker may not decide its tool calls"));
                }
                match request.state {
                    ToolRequestState::Pending if now >= request.expires_at => return Err(WorkerError::ToolRequestDone(ToolRequestState::Expired)),
                    ToolRequestState::Pending => {}
                    done => return Err(WorkerError::ToolRequestDone(done)),
                }
                let tool = self.tool_of(&request_id);
                let (worker_id, box_id) = (d.worker_id.clone(), d.box_id.clone());
                Ok(vec![if approve {
                    WorkerEvent::WorkerToolUseApproved { request_id, worker_id, box_id, tool, by: by.user_id, at: now, policy }
                } else {
                    let reason = clip(&reason, 500);
                    WorkerEvent::WorkerToolUseRejected { request_id, worker_id, box_id, tool, by: by.user_id, reason, at: now, policy }
                }])
            }
            WorkerCommand::ExpireTool { request_id, now } => {
                let d = self.data.as_ref().ok_or(WorkerError::NotFound)?;
                let request = self.tool_requests.get(&request_id).ok_or(WorkerError::NoToolRequest)?;
                match request.state {
                    ToolRequestState::Pending if now >= request.expires_at => {}
                    // Not due yet, or decided: nothing to expire.
                    _ => return Ok(vec![]),
                }
                let tool = self.tool_of(&request_id);
                Ok(vec![WorkerEvent::WorkerToolUseExpired { request_id, worker_id: d.worker_id.clone(), box_id: d.box_id.clone(), tool, at: now }])
            }
        }
    }

    /// The tool a request asks about (kept in the request's first event only).
    fn tool_of(&self, request_id: &str) -> String {
        self.tool_names.get(request_id).cloned().unwrap_or_default()
    }

    /// The Worker's data when `host` runs it and it has not ended.
    fn ours(&self, host: &str) -> Result<&WorkerData, WorkerError> {
        let d = self.data.as_ref().ok_or(WorkerError::NotFound)?;
        if self.host.as_deref() != Some(host) {
            return Err(WorkerError::NotItsHost);
        }
        if self.state.is_ended() {
            return Err(WorkerError::Ended(self.state));
        }
        Ok(d)
    }

    pub fn evolve(&mut self, event: WorkerEvent) {
        match event {
            WorkerEvent::WorkerCreated { worker_id, launch_id, box_id, box_type, fingerprint, bundle_digest, binding_handle, created_by, at, .. } => {
                if self.data.is_none() {
                    self.data = Some(WorkerData { worker_id, launch_id, box_id, box_type, fingerprint, bundle_digest, binding_handle, created_by, at });
                }
            }
            WorkerEvent::WorkerLaunchRefused { .. } => self.refusals = self.refusals.saturating_add(1),
            WorkerEvent::WorkerClaimed { host, .. } => {
                self.state = WorkerState::Starting;
                self.host = Some(host);
            }
            WorkerEvent::WorkerLogged { lines, .. } => self.log_bytes = self.log_bytes.saturating_add(lines.iter().map(String::len).sum()),
            WorkerEvent::WorkerStopRequested { kill, .. } => self.stop_requested = Some(kill || self.stop_requested == Some(true)),
            e
            @ (WorkerEvent::WorkerRunning { .. } | WorkerEvent::WorkerPaused { .. } | WorkerEvent::WorkerFinished { .. } | WorkerEvent::WorkerLost { .. }) => {
                if let Some(state) = e.state() {
                    self.state = state;
                }
            }
            WorkerEvent::WorkerInputAdded { .. } => self.inputs = self.inputs.saturating_add(1),
            WorkerEvent::WorkerPauseRequested { pause, .. } => self.pause_requested = pause,
            WorkerEvent::WorkerToolDenied { .. } => {}
            WorkerEvent::WorkerNotificationRequested { notification, .. } => {
                self.notifications.insert(notification.notification_id);
            }
            WorkerEvent::WorkerToolUseRequested { request_id, tool, expires_at, .. } => {
                self.tool_names.insert(request_id.clone(), tool);
                self.tool_requests
                    .insert(request_id, ToolRequest { state: ToolRequestState::Pending, expires_at, decided_by: String::new(), reason: String::new() });
            }
            WorkerEvent::WorkerToolUseApproved { request_id, by, .. } => self.settle(&request_id, ToolRequestState::Approved, by, String::new()),
            WorkerEvent::WorkerToolUseRejected { request_id, by, reason, .. } => self.settle(&request_id, ToolRequestState::Rejected, by, reason),
            WorkerEvent::WorkerToolUseExpired { request_id, .. } => self.settle(&request_id, ToolRequestState::Expired, String::new(), String::new()),
        }
    }

    fn settle(&mut self, request_id: &str, state: ToolRequestState, decided_by: String, reason: String) {
        if let Some(r) = self.tool_requests.get_mut(request_id) {
            r.state = state;
            r.decided_by = decided_by;
            r.reason = reason;
        }
    }
}

/// `text` without NUL characters, at most `n` characters (what a recorded decision keeps
/// of host-sent text).
fn clip(text: &str, n: usize) -> String {
    text.chars().filter(|c| *c != '\0').take(n).collect()
}

/// Log lines within the bounds: at most [`LOG_LINES`] lines of [`LOG_LINE_CHARS`]
/// characters each, at most `room` bytes in all, without NUL characters.
pub fn bounded_log(lines: Vec<String>, room: usize) -> Vec<String> {
    let mut used = 0usize;
    let mut out = Vec::new();
    for line in lines.into_iter().take(LOG_LINES) {
        let line = clip(&line, LOG_LINE_CHARS);
        if used + line.len() > room {
            break;
        }
        used += line.len();
        out.push(line);
    }
    out
}

aggregate_via_decide!(Worker, super::types::WORKER, WorkerCommand, WorkerEvent, WorkerError);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregates::testing::given_when;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_765_000_000 + s, 0).expect("valid time")
    }

    fn new_worker(fingerprint: &str, handle: &str) -> NewWorker {
        NewWorker {
            worker_id: worker_id_for("launch-1"),
            launch_id: "launch-1".into(),
            box_id: "b1".into(),
            box_type: "sales".into(),
            role: String::new(),
            labels: BTreeMap::from([("team".to_owned(), "ops".to_owned())]),
            initial_input: vec![Segment::Text("hello".into()), Segment::TicketRef("T-1".into())],
            fingerprint: fingerprint.into(),
            bundle_digest: "sha256:aa".into(),
            binding_handle: handle.into(),
            created_by: "alice".into(),
            approval_key_id: "k1".into(),
            chain: vec!["draft/d1/2".into(), "box/b1/1".into(), "config_bundle/sha256:aa/1".into()],
            at: at(0),
            policy: None,
        }
    }

    fn create(fingerprint: &str, handle: &str) -> WorkerCommand {
        WorkerCommand::Create(Box::new(new_worker(fingerprint, handle)))
    }

    fn refuse(code: ErrorCode) -> WorkerCommand {
        WorkerCommand::RecordRefusal {
            worker_id: worker_id_for("launch-1"),
            launch_id: "launch-1".into(),
            box_id: "b1".into(),
            by: "mallory".into(),
            code,
            reason: "no".into(),
            at: at(1),
        }
    }

    #[test]
    fn r_worker_4_given_nothing_when_created_then_worker_created_holds_catalog_transcript_and_chain() {
        let events = given_when::<Worker>(vec![], create("fp-1", "bnd_1")).expect("created");
        assert_eq!(events.iter().map(WorkerEvent::name).collect::<Vec<_>>(), ["WorkerCreated"]);
        let WorkerEvent::WorkerCreated { worker_id, initial_input, created_by, chain, binding_handle, .. } = &events[0] else { panic!("created") };
        assert_eq!(worker_id, &worker_id_for("launch-1"));
        assert_eq!(initial_input.len(), 2);
        assert_eq!((created_by.as_str(), binding_handle.as_str()), ("alice", "bnd_1"));
        assert_eq!(chain.first().map(String::as_str), Some("draft/d1/2"));
        // and the payload names its actor and target as the audit reads them
        let payload = serde_json::to_value(&events[0]).expect("json");
        assert_eq!(crate::audit::actor_and_target("WorkerCreated", "x", &payload), ("alice".to_owned(), worker_id_for("launch-1")));
    }

    #[test]
    fn r_worker_4_given_a_worker_when_the_same_request_comes_again_then_nothing_new() {
        let h = given_when::<Worker>(vec![], create("fp-1", "bnd_1")).expect("created");
        // a retried browser call prepared a fresh binding: still the same request
        assert_eq!(given_when::<Worker>(h.clone(), create("fp-1", "bnd_2")), Ok(vec![]));
        // given another request under the same launch_id; then launch_id_conflict
        let err = given_when::<Worker>(h, create("fp-2", "bnd_3")).expect_err("conflict");
        assert_eq!(err.code(), ErrorCode::LaunchIdConflict);
    }

    #[test]
    fn r_worker_4_given_refusals_when_created_then_created_once_and_refusals_stay_recorded() {
        let refused = given_when::<Worker>(vec![], refuse(ErrorCode::BindingExpired)).expect("recorded");
        let WorkerEvent::WorkerLaunchRefused { code, by, .. } = &refused[0] else { panic!("refused") };
        assert_eq!((code.as_str(), by.as_str()), ("binding_expired", "mallory"));
        let payload = serde_json::to_value(&refused[0]).expect("json");
        assert_eq!(crate::audit::actor_and_target("WorkerLaunchRefused", "x", &payload), ("mallory".to_owned(), "b1".to_owned()));
        let created = given_when::<Worker>(refused.clone(), create("fp-1", "bnd_1")).expect("created after a refusal");
        assert_eq!(created.len(), 1);
        let mut w = Worker::default();
        for e in refused.into_iter().chain(created) {
            w.evolve(e);
        }
        assert_eq!((w.refusals, w.data.map(|d| d.fingerprint)), (1, Some("fp-1".to_owned())));
    }

    #[test]
    fn r_worker_5_given_a_launch_out_of_bounds_or_another_stream_when_created_then_refused() {
        let mut blank = new_worker("fp", "h");
        blank.initial_input = vec![Segment::Text("  ".into())];
        let err = given_when::<Worker>(vec![], WorkerCommand::Create(Box::new(blank))).expect_err("invalid");
        assert_eq!(err.code(), ErrorCode::InvalidRequest);
        assert_eq!(err.field_errors().iter().map(|f| f.key.as_str()).collect::<Vec<_>>(), ["input[0]"]);
        let mut other = new_worker("fp", "h");
        other.worker_id = worker_id_for("launch-2");
        assert_eq!(given_when::<Worker>(vec![], WorkerCommand::Create(Box::new(other))), Err(WorkerError::WrongWorkerId));
    }

    fn created() -> Vec<WorkerEvent> {
        given_when::<Worker>(vec![], create("fp-1", "bnd_1")).expect("created")
    }

    fn then(history: &[WorkerEvent], command: WorkerCommand) -> Result<Vec<WorkerEvent>, WorkerError> {
        given_when::<Worker>(history.to_vec(), command)
    }

    fn claim(host: &str) -> WorkerCommand {
        WorkerCommand::Claim { host: host.into(), at: at(2) }
    }

    fn report(host: &str, report: Report) -> WorkerCommand {
        WorkerCommand::Report { host: host.into(), report, at: at(3) }
    }

    fn state_of(history: &[WorkerEvent]) -> WorkerState {
        let mut w = Worker::default();
        for e in history {
            w.evolve(e.clone());
        }
        w.state
    }

    #[test]
    fn r_host_1_given_a_created_worker_when_two_hosts_claim_then_only_the_first_has_it() {
        let mut h = created();
        let claimed = then(&h, claim("host-a")).expect("claimed");
        assert_eq!(claimed.iter().map(WorkerEvent::name).collect::<Vec<_>>(), ["WorkerClaimed"]);
        h.extend(claimed);
        assert_eq!(state_of(&h), WorkerState::Starting);
        assert_eq!(then(&h, claim("host-a")), Ok(vec![]), "a retried claim adds nothing");
        assert_eq!(then(&h, claim("host-b")), Err(WorkerError::NotClaimable(WorkerState::Starting)));
        // Nothing to claim before the Worker exists.
        assert_eq!(then(&[], claim("host-a")), Err(WorkerError::NotFound));
    }

    #[test]
    fn r_host_2_given_a_claimed_worker_when_its_host_reports_then_it_runs_pauses_logs_and_ends() {
        let mut h = created();
        h.extend(then(&h, claim("host-a")).expect("claimed"));
        assert_eq!(then(&h, report("host-a", Report::Paused)), Err(WorkerError::BadReport("a Worker pauses only once it runs")));
        h.extend(then(&h, report("host-a", Report::Running)).expect("running"));
        assert_eq!(state_of(&h), WorkerState::Running);
        assert_eq!(then(&h, report("host-a", Report::Running)), Ok(vec![]));
        h.extend(then(&h, report("host-a", Report::Paused)).expect("paused"));
        assert_eq!(state_of(&h), WorkerState::Paused);
        h.extend(then(&h, report("host-a", Report::Running)).expect("resumed"));
        let logged = then(&h, report("host-a", Report::Log(vec!["step 1".into(), "x".repeat(LOG_LINE_CHARS + 10)]))).expect("logged");
        let [WorkerEvent::WorkerLogged { lines, .. }] = logged.as_slice() else { panic!("{logged:?}") };
        assert_eq!(lines[1].chars().count(), LOG_LINE_CHARS, "a long line is clipped");
        h.extend(logged);
        // Another host may not report on it.
        assert_eq!(then(&h, report("host-b", Report::Running)), Err(WorkerError::NotItsHost));
        assert_eq!(
            then(&h, report("host-a", Report::Finished { state: WorkerState::Lost, exit_code: None, result: String::new() })).map_err(|e| e.code()),
            Err(ErrorCode::InvalidRequest)
        );
        let finished =
            then(&h, report("host-a", Report::Finished { state: WorkerState::Succeeded, exit_code: Some(0), result: "done".into() })).expect("finished");
        h.extend(finished);
        assert_eq!(state_of(&h), WorkerState::Succeeded);
        // Ended: nothing more.
        assert_eq!(then(&h, report("host-a", Report::Running)), Err(WorkerError::Ended(WorkerState::Succeeded)));
        assert_eq!(then(&h, claim("host-b")), Err(WorkerError::NotClaimable(WorkerState::Succeeded)));
        let stop = WorkerCommand::Stop { by: "alice".into(), kill: true, at: at(9) };
        assert_eq!(then(&h, stop).map_err(|e| e.code()), Err(ErrorCode::WorkerEnded));
    }

    #[test]
    fn r_host_1_given_a_lost_worker_then_no_host_ever_runs_it_again() {
        let mut h = created();
        h.extend(then(&h, claim("host-a")).expect("claimed"));
        h.extend(then(&h, report("host-a", Report::Running)).expect("running"));
        assert_eq!(then(&h, WorkerCommand::Lose { host: "host-b".into(), at: at(5) }), Err(WorkerError::NotItsHost));
        h.extend(then(&h, WorkerCommand::Lose { host: "host-a".into(), at: at(5) }).expect("lost"));
        assert_eq!(state_of(&h), WorkerState::Lost);
        assert_eq!(then(&h, claim("host-b")), Err(WorkerError::NotClaimable(WorkerState::Lost)));
        assert_eq!(then(&h, claim("host-a")), Err(WorkerError::NotClaimable(WorkerState::Lost)));
        assert_eq!(then(&h, report("host-a", Report::Running)), Err(WorkerError::Ended(WorkerState::Lost)), "a host that comes back is told");
    }

    #[test]
    fn r_host_2_given_a_running_worker_a_stop_then_a_kill_counts_and_one_no_host_took_ends_at_once() {
        let stop = |kill| WorkerCommand::Stop { by: "alice".into(), kill, at: at(4) };
        let mut h = created();
        h.extend(then(&h, claim("host-a")).expect("claimed"));
        h.extend(then(&h, stop(false)).expect("stop"));
        assert_eq!(then(&h, stop(false)), Ok(vec![]));
        let kill = then(&h, stop(true)).expect("kill after stop");
        assert!(matches!(kill.as_slice(), [WorkerEvent::WorkerStopRequested { kill: true, .. }]));
        h.extend(kill);
        assert_eq!(then(&h, stop(false)), Ok(vec![]), "a stop after a kill adds nothing");
        assert_eq!(state_of(&h), WorkerState::Starting, "its host ends it");
        let unclaimed = then(&created(), stop(false)).expect("stopped");
        assert_eq!(unclaimed.iter().filter_map(WorkerEvent::state).collect::<Vec<_>>(), [WorkerState::Killed]);
        let mut h = created();
        h.extend(unclaimed);
        assert_eq!(then(&h, claim("host-a")), Err(WorkerError::NotClaimable(WorkerState::Killed)));
    }

    #[test]
    fn r_host_2_more_input_reaches_a_worker_that_has_not_ended_within_bounds() {
        let h = created();
        let add = |input: Vec<Segment>| WorkerCommand::AddInput { by: "alice".into(), input, at: at(4) };
        assert!(matches!(then(&h, add(vec![Segment::Text("more".into())])).as_deref(), Ok([WorkerEvent::WorkerInputAdded { .. }])));
        assert_eq!(then(&h, add(vec![])).map_err(|e| e.code()), Err(ErrorCode::InvalidRequest));
    }

    #[test]
    fn the_log_keeps_within_its_bytes() {
        let lines = vec!["a".repeat(100); 10];
        assert_eq!(bounded_log(lines.clone(), 1_000).len(), 10);
        assert_eq!(bounded_log(lines.clone(), 950).len(), 9);
        assert!(bounded_log(lines, 0).is_empty());
        assert_eq!(bounded_log(vec!["a\0b".into()], 10), ["ab"]);
    }

    fn ask(id: &str) -> WorkerCommand {
        ask_as("host-a", id)
    }

    fn ask_as(host: &str, id: &str) -> WorkerCommand {
        let ask = ToolAsk {
            request_id: id.into(),
            tool: "shell:exec".into(),
            rule: "shell.allowed_commands".into(),
            reason: "\"make\" is not an allowed command".into(),
            input: r#"{"command":"make"}"#.into(),
            expires_at: at(60),
        };
        WorkerCommand::Ask { host: host.into(), ask, at: at(5) }
    }

    fn decide(id: &str, by: Principal, approve: bool, now: i64) -> WorkerCommand {
        WorkerCommand::DecideTool { request_id: id.into(), by, approve, reason: "no".into(), now: at(now), policy: None }
    }

    fn human_admin(user: &str) -> Principal {
        Principal::new(user, crate::principal::Role::Admin, crate::principal::Kind::Human)
    }

    #[test]
    fn r_decide_2_given_an_ask_when_a_human_admin_decides_then_once_and_never_by_the_launcher_or_an_agent() {
        let id = format!("tur_{}", "a".repeat(32));
        let mut h = created();
        h.extend(then(&h, claim("host-a")).expect("claimed"));
        assert_eq!(then(&h, ask_as("host-b", &id)).map_err(|e| e.code()), Err(ErrorCode::Forbidden), "only its host asks");
        assert!(matches!(then(&h, ask("tur_x")), Err(WorkerError::BadReport(_))));
        let asked = then(&h, ask(&id)).expect("asked");
        assert!(matches!(asked.as_slice(), [WorkerEvent::WorkerToolUseRequested { .. }]));
        h.extend(asked);
        assert_eq!(then(&h, ask(&id)), Ok(vec![]), "a retried ask adds nothing");
        // Not the launcher (alice), not an agent, not a member.
        assert_eq!(then(&h, decide(&id, human_admin("alice"), true, 10)).map_err(|e| e.code()), Err(ErrorCode::Forbidden));
        let agent = Principal::new("bot", crate::principal::Role::Admin, crate::principal::Kind::Agent);
        assert_eq!(then(&h, decide(&id, agent, true, 10)).map_err(|e| e.code()), Err(ErrorCode::Forbidden));
        let member = Principal::new("erin", crate::principal::Role::Member, crate::principal::Kind::Human);
        assert_eq!(then(&h, decide(&id, member, true, 10)).map_err(|e| e.code()), Err(ErrorCode::Forbidden));
        assert_eq!(then(&h, decide("tur_other", human_admin("bob"), true, 10)), Err(WorkerError::NoToolRequest));
        let approved = then(&h, decide(&id, human_admin("bob"), true, 10)).expect("approved");
        assert!(matches!(approved.as_slice(), [WorkerEvent::WorkerToolUseApproved { by, tool, .. }] if by == "bob" && tool == "shell:exec"));
        h.extend(approved);
        assert_eq!(then(&h, decide(&id, human_admin("carol"), false, 11)), Err(WorkerError::ToolRequestDone(ToolRequestState::Approved)), "one decision");
        assert_eq!(then(&h, WorkerCommand::ExpireTool { request_id: id.clone(), now: at(100) }), Ok(vec![]), "a decided request does not expire");
    }

    #[test]
    fn r_decide_2_given_an_ask_past_its_deadline_then_it_expires_and_no_decision_comes_late() {
        let id = format!("tur_{}", "b".repeat(32));
        let mut h = created();
        h.extend(then(&h, claim("host-a")).expect("claimed"));
        h.extend(then(&h, ask(&id)).expect("asked"));
        assert_eq!(then(&h, WorkerCommand::ExpireTool { request_id: id.clone(), now: at(59) }), Ok(vec![]), "not due yet");
        assert_eq!(then(&h, decide(&id, human_admin("bob"), true, 60)), Err(WorkerError::ToolRequestDone(ToolRequestState::Expired)));
        let expired = then(&h, WorkerCommand::ExpireTool { request_id: id.clone(), now: at(61) }).expect("expired");
        assert!(matches!(expired.as_slice(), [WorkerEvent::WorkerToolUseExpired { .. }]));
        h.extend(expired);
        let payload = serde_json::to_value(h.last().cloned().expect("event")).expect("json");
        assert_eq!(crate::audit::action_of("worker", "WorkerToolUseExpired"), Some("worker.tool_expire"));
        assert_eq!(crate::audit::actor_and_target("WorkerToolUseExpired", "x", &payload).1, worker_id_for("launch-1"));
    }

    #[test]
    fn r_host_2_a_pause_and_a_resume_are_asked_once_each_and_not_of_an_ended_worker() {
        let pause = |p| WorkerCommand::Pause { by: "alice".into(), pause: p, at: at(6) };
        let mut h = created();
        h.extend(then(&h, claim("host-a")).expect("claimed"));
        assert_eq!(then(&h, pause(false)), Ok(vec![]), "not paused: nothing to resume");
        let asked = then(&h, pause(true)).expect("pause");
        assert!(matches!(asked.as_slice(), [WorkerEvent::WorkerPauseRequested { pause: true, .. }]));
        h.extend(asked);
        assert_eq!(then(&h, pause(true)), Ok(vec![]));
        h.extend(then(&h, pause(false)).expect("resume"));
        h.extend(then(&h, report("host-a", Report::Finished { state: WorkerState::Failed, exit_code: Some(1), result: String::new() })).expect("ended"));
        assert_eq!(then(&h, pause(true)).map_err(|e| e.code()), Err(ErrorCode::WorkerEnded));
    }
}
