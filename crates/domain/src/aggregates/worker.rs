//! The Worker aggregate (SPEC §10, R-WORKER-4, R-WORKER-7): one stream per launch, its id
//! [`worker_id_for`] the launch_id, so every retry of a launch names the same stream. The
//! stream holds the Worker's creation (catalog entry and initial transcript, with the
//! chain of custody that led to its bundle) and every refused attempt at the launch.
//!
//! Architecture Invariant: only `Create` issues a Worker, once per launch_id; a second
//! `Create` of the same request adds nothing, of another request is `launch_id_conflict`.
//! The binding handle is kept here as an opaque string and nowhere else in the runtime.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;
use crate::error::{ErrorCode, FieldError, Refusing};
use crate::worker::{LaunchRequest, Segment, validate_launch, worker_id_for};

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
}

/// The Worker as its stream knows it (what a later `Create` is compared with).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerData {
    pub worker_id: String,
    pub launch_id: String,
    pub box_id: String,
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
}

#[derive(Debug, Clone)]
pub enum WorkerCommand {
    /// R-WORKER-4.
    Create(Box<NewWorker>),
    /// A refused attempt at this launch (audited as `worker.create_refused`).
    RecordRefusal { worker_id: String, launch_id: String, box_id: String, by: String, code: ErrorCode, reason: String, at: DateTime<Utc> },
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
}

impl WorkerEvent {
    pub fn name(&self) -> &'static str {
        match self {
            WorkerEvent::WorkerCreated { .. } => "WorkerCreated",
            WorkerEvent::WorkerLaunchRefused { .. } => "WorkerLaunchRefused",
        }
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
}

impl WorkerError {
    pub fn code(&self) -> ErrorCode {
        match self {
            WorkerError::LaunchIdConflict(_) => ErrorCode::LaunchIdConflict,
            WorkerError::Invalid(_) | WorkerError::WrongWorkerId => ErrorCode::InvalidRequest,
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
        }
    }

    pub fn evolve(&mut self, event: WorkerEvent) {
        match event {
            WorkerEvent::WorkerCreated { worker_id, launch_id, box_id, fingerprint, bundle_digest, binding_handle, created_by, at, .. } => {
                if self.data.is_none() {
                    self.data = Some(WorkerData { worker_id, launch_id, box_id, fingerprint, bundle_digest, binding_handle, created_by, at });
                }
            }
            WorkerEvent::WorkerLaunchRefused { .. } => self.refusals = self.refusals.saturating_add(1),
        }
    }
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
}
