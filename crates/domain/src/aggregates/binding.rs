//! Execution bindings (R-WORKER-3, seed 003): what the execution host prepares for one
//! launch of a Box — the workspace directory, the tool scope, the ticket access — kept on
//! the execution host's side (the provisioner) under an opaque handle, id `bnd_<hex>`.
//! The runtime only ever holds the handle.
//!
//! A binding has a lease: it is consumed by at most one Worker before `expires_at`, and a
//! prepared binding nobody consumed is expired once the lease is over (`BindingExpired`).
//! It is consumed only for the launch and the user it was prepared for. Once consumed, it
//! belongs to that Worker: asking again for the same Worker is a no-op, whatever the time
//! (a retried `CreateWorker`), and it is never expired.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;
use crate::error::ErrorCode;

/// What is known of a prepared binding.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BindingData {
    pub handle: String,
    pub box_id: String,
    pub launch_id: String,
    /// The user the binding was prepared for: only a launch on their behalf consumes it.
    pub prepared_by: String,
    pub expires_at: DateTime<Utc>,
    /// The Worker that holds it, once consumed.
    pub consumed_by: Option<String>,
    /// `BindingExpired` was recorded.
    pub expired: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExecutionBinding {
    pub data: Option<BindingData>,
}

#[derive(Debug, Clone)]
pub enum BindingCommand {
    /// Records a binding the execution host prepared (its workspace exists).
    Prepare {
        handle: String,
        box_id: String,
        launch_id: String,
        prepared_by: String,
        execution_host: String,
        workspace: String,
        tool_scope: Vec<String>,
        ticket_access: String,
        expires_at: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    /// A Worker claims the binding; `by` is the user the launch acts for.
    Consume { box_id: String, worker_id: String, by: String, now: DateTime<Utc> },
    /// The sweeper: the lease of a prepared, unconsumed binding is over.
    Expire { now: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BindingEvent {
    BindingPrepared {
        handle: String,
        box_id: String,
        launch_id: String,
        prepared_by: String,
        /// Where the Worker's tools run (`local`: this provisioner's host).
        execution_host: String,
        /// The absolute workspace directory (the Worker's cwd).
        workspace: String,
        /// The Box's effective tools.
        tool_scope: Vec<String>,
        /// `referenced`: the tickets and objectives the Worker's input names.
        ticket_access: String,
        expires_at: DateTime<Utc>,
        at: DateTime<Utc>,
    },
    BindingConsumed {
        handle: String,
        box_id: String,
        worker_id: String,
        by: String,
        at: DateTime<Utc>,
    },
    BindingExpired {
        handle: String,
        box_id: String,
        at: DateTime<Utc>,
    },
}

impl BindingEvent {
    pub fn name(&self) -> &'static str {
        match self {
            BindingEvent::BindingPrepared { .. } => "BindingPrepared",
            BindingEvent::BindingConsumed { .. } => "BindingConsumed",
            BindingEvent::BindingExpired { .. } => "BindingExpired",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BindingError {
    /// 404: no binding has this handle.
    #[error("no execution binding has this handle")]
    NotFound,
    /// 410: the lease ran out before a Worker consumed it.
    #[error("the execution binding's lease ran out; launch again")]
    Expired,
    /// 409: prepared for another Box.
    #[error("the execution binding was prepared for another Box")]
    BoxMismatch,
    /// 409: held by another Worker, or prepared for another launch or another user.
    #[error("the execution binding cannot be used here: {0}")]
    Unusable(&'static str),
}

impl BindingError {
    pub fn code(&self) -> ErrorCode {
        match self {
            BindingError::NotFound => ErrorCode::BindingNotFound,
            BindingError::Expired => ErrorCode::BindingExpired,
            BindingError::BoxMismatch => ErrorCode::BindingBoxMismatch,
            BindingError::Unusable(_) => ErrorCode::BindingUnusable,
        }
    }
}

crate::error::refusing_via_code!(BindingError);

impl ExecutionBinding {
    pub fn decide(&self, command: BindingCommand) -> Result<Vec<BindingEvent>, BindingError> {
        match command {
            BindingCommand::Prepare { handle, box_id, launch_id, prepared_by, execution_host, workspace, tool_scope, ticket_access, expires_at, at } => {
                match &self.data {
                    // Handles are fresh random ids: the same one twice is a repeat of the
                    // same preparation, or nothing this binding can become.
                    Some(d) if d.box_id == box_id && d.launch_id == launch_id && d.prepared_by == prepared_by => Ok(vec![]),
                    Some(_) => Err(BindingError::Unusable("its handle names another preparation")),
                    None => Ok(vec![BindingEvent::BindingPrepared {
                        handle,
                        box_id,
                        launch_id,
                        prepared_by,
                        execution_host,
                        workspace,
                        tool_scope,
                        ticket_access,
                        expires_at,
                        at,
                    }]),
                }
            }
            BindingCommand::Consume { box_id, worker_id, by, now } => {
                let d = self.data.as_ref().ok_or(BindingError::NotFound)?;
                let unconsumed = d.consumed_by.is_none();
                if unconsumed && (d.expired || now >= d.expires_at) {
                    return Err(BindingError::Expired);
                }
                if d.box_id != box_id {
                    return Err(BindingError::BoxMismatch);
                }
                if let Some(holder) = &d.consumed_by {
                    return if *holder != worker_id {
                        Err(BindingError::Unusable("another Worker holds it"))
                    } else if d.prepared_by != by {
                        Err(BindingError::Unusable("it was prepared for another user"))
                    } else {
                        Ok(vec![])
                    };
                }
                if crate::worker::worker_id_for(&d.launch_id) != worker_id {
                    return Err(BindingError::Unusable("it was prepared for another launch"));
                }
                if d.prepared_by != by {
                    return Err(BindingError::Unusable("it was prepared for another user"));
                }
                Ok(vec![BindingEvent::BindingConsumed { handle: d.handle.clone(), box_id, worker_id, by, at: now }])
            }
            BindingCommand::Expire { now } => {
                let d = self.data.as_ref().ok_or(BindingError::NotFound)?;
                if d.consumed_by.is_some() || d.expired || now < d.expires_at {
                    return Ok(vec![]);
                }
                Ok(vec![BindingEvent::BindingExpired { handle: d.handle.clone(), box_id: d.box_id.clone(), at: now }])
            }
        }
    }

    pub fn evolve(&mut self, event: BindingEvent) {
        match event {
            BindingEvent::BindingPrepared { handle, box_id, launch_id, prepared_by, expires_at, .. } => {
                self.data = Some(BindingData { handle, box_id, launch_id, prepared_by, expires_at, consumed_by: None, expired: false });
            }
            BindingEvent::BindingConsumed { worker_id, .. } => {
                if let Some(d) = &mut self.data {
                    d.consumed_by = Some(worker_id);
                }
            }
            BindingEvent::BindingExpired { .. } => {
                if let Some(d) = &mut self.data {
                    d.expired = true;
                }
            }
        }
    }
}

aggregate_via_decide!(ExecutionBinding, super::types::EXECUTION_BINDING, BindingCommand, BindingEvent, BindingError);

#[cfg(test)]
mod tests {
    use chrono::TimeDelta;

    use super::*;
    use crate::aggregates::testing::given_when;
    use crate::worker::worker_id_for;

    fn t0() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("time")
    }

    fn lease_end() -> DateTime<Utc> {
        t0() + TimeDelta::minutes(10)
    }

    fn prepare() -> BindingCommand {
        prepare_for("box-a")
    }

    fn prepare_for(box_id: &str) -> BindingCommand {
        BindingCommand::Prepare {
            handle: "bnd_1".into(),
            box_id: box_id.into(),
            launch_id: "launch-1".into(),
            prepared_by: "erin".into(),
            execution_host: "local".into(),
            workspace: "/data/workspaces/sales".into(),
            tool_scope: vec!["git".into(), "read_file".into()],
            ticket_access: "referenced".into(),
            expires_at: lease_end(),
            at: t0(),
        }
    }

    fn prepared() -> Vec<BindingEvent> {
        given_when::<ExecutionBinding>(vec![], prepare()).expect("prepared")
    }

    fn consume(box_id: &str, launch_id: &str, by: &str, now: DateTime<Utc>) -> BindingCommand {
        BindingCommand::Consume { box_id: box_id.into(), worker_id: worker_id_for(launch_id), by: by.into(), now }
    }

    fn consumed() -> Vec<BindingEvent> {
        let mut events = prepared();
        events.extend(given_when::<ExecutionBinding>(events.clone(), consume("box-a", "launch-1", "erin", t0())).expect("consumed"));
        events
    }

    #[test]
    fn r_worker_3_a_prepared_binding_holds_what_only_the_execution_host_knows_and_preparing_again_adds_nothing() {
        let events = prepared();
        assert_eq!(events.len(), 1);
        let BindingEvent::BindingPrepared { workspace, tool_scope, ticket_access, execution_host, expires_at, .. } = &events[0] else {
            panic!("expected BindingPrepared: {events:?}")
        };
        assert_eq!((workspace.as_str(), ticket_access.as_str(), execution_host.as_str()), ("/data/workspaces/sales", "referenced", "local"));
        assert_eq!((tool_scope.len(), *expires_at), (2, lease_end()));
        assert_eq!(given_when::<ExecutionBinding>(events.clone(), prepare()), Ok(vec![]));
        // the same handle for another preparation is refused
        assert_eq!(given_when::<ExecutionBinding>(events, prepare_for("box-b")).map_err(|e| e.code()), Err(ErrorCode::BindingUnusable));
    }

    #[test]
    fn r_worker_3_a_binding_is_consumed_once_within_its_lease_and_again_by_the_same_worker_is_a_no_op() {
        // given a prepared binding; when its launch's Worker claims it in time; then consumed
        let events = given_when::<ExecutionBinding>(prepared(), consume("box-a", "launch-1", "erin", lease_end() - TimeDelta::seconds(1))).expect("ok");
        let [BindingEvent::BindingConsumed { handle, box_id, worker_id, by, .. }] = events.as_slice() else { panic!("expected BindingConsumed: {events:?}") };
        assert_eq!((handle.as_str(), box_id.as_str(), by.as_str()), ("bnd_1", "box-a", "erin"));
        assert_eq!(*worker_id, worker_id_for("launch-1"));
        // when the same Worker claims it again, even after the lease; then nothing new
        assert_eq!(given_when::<ExecutionBinding>(consumed(), consume("box-a", "launch-1", "erin", lease_end() + TimeDelta::hours(1))), Ok(vec![]));
        // when another Worker claims it; then unusable
        let other = BindingCommand::Consume { box_id: "box-a".into(), worker_id: "wkr_other".into(), by: "erin".into(), now: t0() };
        assert_eq!(given_when::<ExecutionBinding>(consumed(), other).map_err(|e| e.code()), Err(ErrorCode::BindingUnusable));
        // when the same Worker is claimed for someone else; then unusable
        let someone_else = consume("box-a", "launch-1", "mallory", t0());
        assert_eq!(given_when::<ExecutionBinding>(consumed(), someone_else).map_err(|e| e.code()), Err(ErrorCode::BindingUnusable));
    }

    #[test]
    fn r_worker_6_each_refusal_of_a_claim_has_its_code() {
        let refused = |events: Vec<BindingEvent>, command| given_when::<ExecutionBinding>(events, command).map_err(|e| e.code());
        // no binding
        assert_eq!(refused(vec![], consume("box-a", "launch-1", "erin", t0())), Err(ErrorCode::BindingNotFound));
        // the lease is over (at its end exactly, too), swept or not
        assert_eq!(refused(prepared(), consume("box-a", "launch-1", "erin", lease_end())), Err(ErrorCode::BindingExpired));
        let mut swept = prepared();
        swept.push(BindingEvent::BindingExpired { handle: "bnd_1".into(), box_id: "box-a".into(), at: lease_end() });
        assert_eq!(refused(swept, consume("box-a", "launch-1", "erin", t0())), Err(ErrorCode::BindingExpired));
        // prepared for Box A, used for Box B
        assert_eq!(refused(prepared(), consume("box-b", "launch-1", "erin", t0())), Err(ErrorCode::BindingBoxMismatch));
        // prepared for another launch, or for another user
        assert_eq!(refused(prepared(), consume("box-a", "launch-2", "erin", t0())), Err(ErrorCode::BindingUnusable));
        assert_eq!(refused(prepared(), consume("box-a", "launch-1", "mallory", t0())), Err(ErrorCode::BindingUnusable));
    }

    #[test]
    fn r_worker_3_only_a_prepared_unconsumed_binding_past_its_lease_expires_and_only_once() {
        let expire = |events: Vec<BindingEvent>, now| given_when::<ExecutionBinding>(events, BindingCommand::Expire { now });
        assert_eq!(expire(vec![], lease_end()).map_err(|e| e.code()), Err(ErrorCode::BindingNotFound));
        assert_eq!(expire(prepared(), lease_end() - TimeDelta::seconds(1)), Ok(vec![]), "still leased");
        assert_eq!(expire(consumed(), lease_end() + TimeDelta::hours(1)), Ok(vec![]), "a Worker holds it");
        let events = expire(prepared(), lease_end()).expect("expired");
        assert_eq!(events, [BindingEvent::BindingExpired { handle: "bnd_1".into(), box_id: "box-a".into(), at: lease_end() }]);
        let mut all = prepared();
        all.extend(events);
        assert_eq!(expire(all, lease_end() + TimeDelta::hours(1)), Ok(vec![]), "once");
    }

    #[test]
    fn binding_events_carry_the_fields_the_audit_reads() {
        // actor prepared_by / by, target box_id (audit.rs)
        let json = serde_json::to_value(&prepared()[0]).expect("json");
        assert_eq!((json["BindingPrepared"]["prepared_by"].as_str(), json["BindingPrepared"]["box_id"].as_str()), (Some("erin"), Some("box-a")));
        let json = serde_json::to_value(&consumed()[1]).expect("json");
        assert_eq!((json["BindingConsumed"]["by"].as_str(), json["BindingConsumed"]["box_id"].as_str()), (Some("erin"), Some("box-a")));
    }
}
