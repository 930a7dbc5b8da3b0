//! Given/when/then tests of the Box aggregate (SPEC §5, §9).

use chrono::TimeZone;
use serde_json::json;

use super::*;
use crate::aggregates::testing::given_when;
use crate::principal::{Kind, Role};
use crate::token::{ApprovalSigner, Keyring};

fn t(minute: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, minute, 0).single().expect("valid time")
}

fn alice() -> Principal {
    Principal::new("alice", Role::Admin, Kind::Human)
}
fn ops_bot() -> Principal {
    Principal::new("ops-bot", Role::Admin, Kind::Agent)
}
fn dave() -> Principal {
    Principal::new("dave", Role::Member, Kind::Human)
}

fn manifest() -> BoxManifest {
    BoxManifest::from_yaml_str(
        "box_type: sales\npurpose: Report sales.\ntools: [Read]\nos_operations: [notify:email]\ncredentials: {allowed_vaults: [ops]}\nnotify: {email: {vault: ops, item: smtp, recipients: [a@example.com]}}\n",
    )
    .expect("valid")
    .manifest
}

fn signer() -> ApprovalSigner {
    ApprovalSigner::from_secret("k1".into(), [9; 32])
}

fn verified(draft_id: &str, m: &BoxManifest) -> VerifiedApproval {
    let token = signer().issue(draft_id, m.box_type.as_str(), &m.digest(), "alice", t(0));
    Keyring::new(vec![signer().public_key()]).verify(&token, t(1)).expect("verifies")
}

fn activate(draft_id: &str, m: BoxManifest, approval: VerifiedApproval) -> BoxCommand {
    BoxCommand::Activate { box_id: "b1".into(), draft_id: draft_id.into(), manifest: m, approval, at: t(1) }
}

fn activated() -> Vec<BoxEvent> {
    let m = manifest();
    given_when::<BoxAggregate>(vec![], activate("d1", m.clone(), verified("d1", &m))).expect("activates")
}

fn then(history: &[BoxEvent], command: BoxCommand) -> Result<Vec<BoxEvent>, BoxError> {
    given_when::<BoxAggregate>(history.to_vec(), command)
}

fn with(history: &[BoxEvent], more: Vec<BoxEvent>) -> Vec<BoxEvent> {
    history.iter().cloned().chain(more).collect()
}

#[test]
fn given_a_verified_token_when_activated_then_the_box_is_idle() {
    // R-BOX-1, R-BOX-4
    let events = activated();
    assert_eq!(events.len(), 1);
    let BoxEvent::BoxActivated { box_type, approved_by, approval_key_id, manifest_digest, .. } = &events[0] else { panic!("expected BoxActivated") };
    assert_eq!((box_type.as_str(), approved_by.as_str(), approval_key_id.as_str()), ("sales", "alice", "k1"));
    assert_eq!(manifest_digest, &manifest().digest());
    let mut b = BoxAggregate::default();
    b.evolve(events[0].clone());
    assert_eq!(b.data.map(|d| d.state), Some(BoxState::Idle));
}

#[test]
fn given_an_active_box_when_the_same_activation_repeats_then_nothing_new() {
    // R-APPROVE-7 (3): activation is at-least-once and idempotent
    let h = activated();
    let m = manifest();
    assert_eq!(then(&h, activate("d1", m.clone(), verified("d1", &m))), Ok(vec![]));
    assert_eq!(then(&h, activate("d2", m.clone(), verified("d2", &m))), Err(BoxError::BoxIdTaken));
}

#[test]
fn given_a_token_for_another_draft_or_manifest_when_activated_then_refused() {
    // R-BOX-1: altered manifest digest / other draft never activates
    let m = manifest();
    let err = then(&[], activate("d1", m.clone(), verified("d2", &m))).expect_err("other draft");
    assert!(matches!(err, BoxError::InvalidApprovalToken(TokenError::BindingMismatch { .. })));
    assert!(err.code().is_security_violation());
    let mut altered = m.clone();
    altered.os_operations.push(crate::os_operation::OSOperation::ShellExec);
    assert!(matches!(then(&[], activate("d1", altered, verified("d1", &m))), Err(BoxError::InvalidApprovalToken(_))));
}

#[test]
fn given_an_invalid_manifest_when_activated_then_re_validation_refuses() {
    // R-APPROVE-4: the manifest is re-validated before activation
    let mut m = manifest();
    m.purpose = " ".into();
    let err = then(&[], activate("d1", m.clone(), verified("d1", &m))).expect_err("invalid");
    assert_eq!(err.code().as_str(), "box_manifest_validation");
}

#[test]
fn given_a_box_when_a_human_admin_assigns_then_assigned_and_the_primary_may_assign_too() {
    // R-BOX-6
    let h = activated();
    let assigned = then(&h, BoxCommand::AssignUser { by: alice(), user_id: "dave".into(), role_in_box: BoxRole::Primary, at: t(2) }).expect("assigned");
    assert_eq!(assigned[0].name(), "BoxUserAssigned");
    let h = with(&h, assigned);
    let by_primary = then(&h, BoxCommand::AssignUser { by: dave(), user_id: "erin".into(), role_in_box: BoxRole::Member, at: t(3) });
    assert_eq!(by_primary.map(|e| e.len()), Ok(1));
    assert_eq!(then(&h, BoxCommand::AssignUser { by: alice(), user_id: "dave".into(), role_in_box: BoxRole::Primary, at: t(4) }), Ok(vec![]));
}

#[test]
fn given_an_assignment_when_unassigned_then_gone_and_only_an_admin_or_the_primary_may() {
    // R-BOX-6: unassign is decided like assign; a user who is not assigned is 404
    let h = activated();
    let h = with(&h, then(&h, BoxCommand::AssignUser { by: alice(), user_id: "dave".into(), role_in_box: BoxRole::Primary, at: t(2) }).expect("assigned"));
    let h = with(&h, then(&h, BoxCommand::AssignUser { by: alice(), user_id: "erin".into(), role_in_box: BoxRole::Member, at: t(3) }).expect("assigned"));
    // given a member or an agent admin; then 403 before anything else
    let carol = Principal { user_id: "carol".into(), role: Role::Member, kind: Kind::Human };
    for who in [ops_bot(), carol] {
        let err = then(&h, BoxCommand::UnassignUser { by: who, user_id: "erin".into(), at: t(4) }).expect_err("forbidden");
        assert_eq!(err.code().http_status(), 403);
    }
    // given the primary; when unassigning a member; then one event naming the role she had
    let removed = then(&h, BoxCommand::UnassignUser { by: dave(), user_id: "erin".into(), at: t(4) }).expect("unassigned");
    assert_eq!(
        removed,
        vec![BoxEvent::BoxUserUnassigned { box_id: "b1".into(), user_id: "erin".into(), role_in_box: BoxRole::Member, unassigned_by: "dave".into(), at: t(4) }]
    );
    let h = with(&h, removed);
    // when unassigning her again; then 404 assignment_not_found
    let err = then(&h, BoxCommand::UnassignUser { by: alice(), user_id: "erin".into(), at: t(5) }).expect_err("not assigned");
    assert_eq!((err.clone(), err.code().as_str(), err.code().http_status()), (BoxError::NotAssigned, "assignment_not_found", 404));
    // a human admin removes the primary; then she no longer may unassign
    let h = with(&h, then(&h, BoxCommand::UnassignUser { by: alice(), user_id: "dave".into(), at: t(6) }).expect("unassigned"));
    let err = then(&h, BoxCommand::UnassignUser { by: dave(), user_id: "dave".into(), at: t(7) }).expect_err("no longer primary");
    assert_eq!(err.code().http_status(), 403);
}

#[test]
fn given_a_box_when_assigning_no_user_or_one_over_its_bound_then_422() {
    let h = activated();
    let too_long = "u".repeat(crate::bounds::USER_ID_CHARS + 1);
    for user_id in ["", "  ", "da\0ve", too_long.as_str()] {
        let err = then(&h, BoxCommand::AssignUser { by: alice(), user_id: user_id.into(), role_in_box: BoxRole::Member, at: t(2) }).expect_err("refused");
        assert_eq!(err, BoxError::InvalidUserId, "{user_id:?}");
        assert_eq!(err.code().http_status(), 422);
    }
}

#[test]
fn given_a_box_when_a_member_or_agent_assigns_then_403() {
    // R-BOX-6, R-AUTH-2
    let h = activated();
    for who in [dave(), ops_bot()] {
        let err = then(&h, BoxCommand::AssignUser { by: who, user_id: "x".into(), role_in_box: BoxRole::Member, at: t(2) }).expect_err("forbidden");
        assert_eq!(err.code().http_status(), 403);
    }
}

#[test]
fn given_a_box_when_mentor_edited_then_version_bumps_and_prohibited_keys_refuse() {
    // R-EDIT-1, R-EDIT-2
    let h = activated();
    let patch = |v: Value| v.as_object().cloned().expect("object");
    let edited = then(&h, BoxCommand::MentorEdit { by: alice(), patch: patch(json!({"purpose": "Report sales weekly."})), at: t(2) }).expect("edited");
    let BoxEvent::BoxManifestEdited { manifest, changed_keys, .. } = &edited[0] else { panic!("expected BoxManifestEdited") };
    assert_eq!(manifest.version, "1.1.0");
    assert_eq!(changed_keys, &vec!["purpose".to_string()]);
    let refused = then(&h, BoxCommand::MentorEdit { by: alice(), patch: patch(json!({"network": "full"})), at: t(2) }).expect_err("refused");
    assert_eq!(refused.code().as_str(), "mentor_edit_prohibited_key");
    assert!(refused.code().is_security_violation());
    let agent = then(&h, BoxCommand::MentorEdit { by: ops_bot(), patch: patch(json!({"purpose": "x"})), at: t(2) }).expect_err("agents cannot");
    assert_eq!(agent.code().http_status(), 403);
    let again = with(&h, edited);
    assert_eq!(
        then(&again, BoxCommand::MentorEdit { by: alice(), patch: patch(json!({"purpose": "Report sales weekly."})), at: t(3) }),
        Ok(vec![]),
        "a repeated edit adds nothing"
    );
}

#[test]
fn given_a_box_when_config_edited_then_changes_within_capability_apply() {
    // R-EDIT-3: a human admin or the Box's primary (an agent too, within the same limits);
    // a widening patch needs a new draft
    let h = activated();
    let agent_admin = then(&h, BoxCommand::ConfigEdit { by: ops_bot(), patch: json!({"config_defaults": {"threshold": 5}}), at: t(2), policy: None })
        .expect_err("not primary");
    assert_eq!(agent_admin.code(), ErrorCode::Forbidden);
    let assigned = then(&h, BoxCommand::AssignUser { by: alice(), user_id: "ops-bot".into(), role_in_box: BoxRole::Primary, at: t(2) }).expect("assigned");
    let h = with(&h, assigned);
    let edited =
        then(&h, BoxCommand::ConfigEdit { by: ops_bot(), patch: json!({"config_defaults": {"threshold": 5}}), at: t(2), policy: None }).expect("edited");
    assert_eq!(edited[0].name(), "BoxConfigEdited");
    let same = with(&h, edited);
    assert_eq!(
        then(&same, BoxCommand::ConfigEdit { by: alice(), patch: json!({"config_defaults": {"threshold": 5}}), at: t(3), policy: None }),
        Ok(vec![]),
        "no-op edits add no event"
    );
    let err = then(&h, BoxCommand::ConfigEdit { by: alice(), patch: json!({"os_operations": ["shell:exec"]}), at: t(2), policy: None }).expect_err("widening");
    assert_eq!(err.code().as_str(), "capability_change_requires_new_draft");
    let agent_widening =
        then(&h, BoxCommand::ConfigEdit { by: ops_bot(), patch: json!({"notify": {"line": {"item": "x"}}}), at: t(2), policy: None }).expect_err("widening");
    assert_eq!(agent_widening.code(), ErrorCode::CapabilityChangeRequiresNewDraft);
    let member = then(&h, BoxCommand::ConfigEdit { by: dave(), patch: json!({"config_defaults": {}}), at: t(2), policy: None }).expect_err("member");
    assert_eq!(member.code().http_status(), 403);
    let nobody = then(&[], BoxCommand::ConfigEdit { by: dave(), patch: json!({}), at: t(2), policy: None }).expect_err("no Box");
    assert_eq!(nobody.code(), ErrorCode::Forbidden, "403 before 404");
    let missing = then(&[], BoxCommand::ConfigEdit { by: alice(), patch: json!({}), at: t(2), policy: None }).expect_err("no Box");
    assert_eq!(missing.code(), ErrorCode::BoxNotFound);
}

#[test]
fn given_a_box_when_stopped_resumed_and_archived_then_states_follow_and_archive_is_terminal() {
    // R-BOX-7
    let h = activated();
    let stopped = then(&h, BoxCommand::Stop { by: alice(), at: t(2) }).expect("stopped");
    assert_eq!(stopped[0].name(), "BoxStopped");
    let h = with(&h, stopped);
    assert_eq!(then(&h, BoxCommand::Stop { by: alice(), at: t(3) }), Ok(vec![]));
    let resumed = then(&h, BoxCommand::Resume { by: alice(), at: t(3) }).expect("resumed");
    assert_eq!(resumed[0].name(), "BoxResumed");
    let h = with(&h, resumed);
    let archived = then(&h, BoxCommand::Archive { by: alice(), at: t(4) }).expect("archived");
    let h = with(&h, archived);
    assert_eq!(then(&h, BoxCommand::Archive { by: alice(), at: t(5) }), Ok(vec![]));
    assert_eq!(then(&h, BoxCommand::Resume { by: alice(), at: t(5) }), Err(BoxError::Archived));
    assert_eq!(BoxError::Archived.code().http_status(), 409);
}

#[test]
fn given_an_archived_box_when_its_activation_is_replayed_then_nothing_new() {
    // R-APPROVE-7 (3), R-BOX-7: a replayed DraftApproved does not bring an archived Box back
    let h = activated();
    let h = with(&h, then(&h, BoxCommand::Archive { by: alice(), at: t(4) }).expect("archived"));
    let m = manifest();
    assert_eq!(then(&h, activate("d1", m.clone(), verified("d1", &m))), Ok(vec![]));
    let mut state = BoxAggregate::default();
    for e in h {
        cqrs_es::Aggregate::apply(&mut state, e);
    }
    assert_eq!(state.data.map(|d| d.state), Some(BoxState::Archived));
}

#[test]
fn given_a_box_when_an_agent_admin_stops_then_403_and_unknown_box_404() {
    // R-AUTH-2, R-BOX-7
    let h = activated();
    assert_eq!(then(&h, BoxCommand::Stop { by: ops_bot(), at: t(2) }), Err(BoxError::Forbidden(HUMAN_ADMIN)));
    assert_eq!(then(&[], BoxCommand::Stop { by: alice(), at: t(2) }).map_err(|e| e.code().http_status()), Err(404));
}

/// The state after `history`.
fn state_after(history: &[BoxEvent]) -> BoxAggregate {
    let mut state = BoxAggregate::default();
    for e in history {
        cqrs_es::Aggregate::apply(&mut state, e.clone());
    }
    state
}

#[test]
fn r_worker_1_given_a_box_when_someone_launches_then_only_admins_and_assigned_users_of_an_idle_box_may() {
    // given no Box: nobody launches
    assert_eq!(state_after(&[]).launchable(&alice(), "b1").map(|_| ()), Err(LaunchRefused::NoActiveBox("b1".into())));
    // given an active Box with dave assigned
    let h = activated();
    let assign = BoxCommand::AssignUser { by: alice(), user_id: dave().user_id, role_in_box: BoxRole::Member, at: t(2) };
    let h = with(&h, then(&h, assign).expect("assigned"));
    let idle = state_after(&h);
    // then a human admin and the assigned user may; an unassigned agent admin may not
    assert!(idle.launchable(&alice(), "b1").is_ok());
    assert!(idle.launchable(&dave(), "b1").is_ok());
    assert_eq!(idle.launchable(&ops_bot(), "b1").map(|_| ()), Err(LaunchRefused::Forbidden));
    // when it is stopped, then nobody may, and it is box_not_active (409)
    let stopped = with(&h, then(&h, BoxCommand::Stop { by: alice(), at: t(3) }).expect("stopped"));
    assert_eq!(state_after(&stopped).launchable(&alice(), "b1").map(|_| ()), Err(LaunchRefused::Stopped));
    // when it is archived, the same
    let archived = with(&stopped, then(&stopped, BoxCommand::Archive { by: alice(), at: t(4) }).expect("archived"));
    assert_eq!(state_after(&archived).launchable(&dave(), "b1").map(|_| ()), Err(LaunchRefused::Archived));
    use crate::Refusing as _;
    assert_eq!(LaunchRefused::Forbidden.error_code().http_status(), 403);
    assert_eq!(LaunchRefused::Stopped.error_code(), ErrorCode::BoxNotActive);
}
