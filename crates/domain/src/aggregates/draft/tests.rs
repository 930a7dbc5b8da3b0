//! Given/when/then tests of the Draft aggregate (SPEC §3, §4).

use chrono::{TimeDelta, TimeZone};

use super::*;
use crate::aggregates::testing::given_when;
use crate::draft_request::BoxDraftCreateRequest;
use crate::principal::{Kind, Role};
use crate::token::ApprovalSigner;

fn t(minute: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, minute, 0).single().expect("valid time")
}

fn agent() -> Principal {
    Principal::new("agent-1", Role::Member, Kind::Agent)
}
fn alice() -> Principal {
    Principal::new("alice", Role::Admin, Kind::Human)
}
fn bob() -> Principal {
    Principal::new("bob", Role::Admin, Kind::Human)
}

fn plan(over_limit: bool) -> DraftPlan {
    let ops = if over_limit { serde_json::json!(["shell:exec"]) } else { serde_json::json!(["file:read"]) };
    BoxDraftCreateRequest::from_value(serde_json::json!({"box_type": "sales", "purpose": "p", "os_operations": ops}))
        .and_then(|r| r.plan())
        .expect("valid plan")
}

fn submitted(over_limit: bool, by: Principal) -> DraftEvent {
    let mut events = given_when::<Draft>(vec![], DraftCommand::Submit { draft_id: "d1".into(), plan: plan(over_limit), requested_by: by, at: t(0) })
        .expect("submit is accepted");
    events.remove(0)
}

fn token_for(event: &DraftEvent, approver: &str) -> ApprovalToken {
    let DraftEvent::DraftSubmitted { draft_id, box_type, manifest, .. } = event else { panic!("not a submit") };
    ApprovalSigner::from_secret("k1".into(), [7; 32]).issue(draft_id, box_type, &manifest.digest(), approver, t(1))
}

fn approve(by: Principal, confirm: bool, token: ApprovalToken) -> DraftCommand {
    DraftCommand::Approve { by, confirm_over_limit: confirm, token, at: t(1), reserved: true }
}

#[test]
fn given_nothing_when_submitted_then_pending_with_the_full_manifest() {
    // R-DRAFT-1, R-DRAFT-10
    let event = submitted(false, agent());
    let DraftEvent::DraftSubmitted { manifest, requested_by, .. } = &event else { panic!("expected DraftSubmitted") };
    assert_eq!(manifest.box_type.as_str(), "sales");
    assert_eq!(requested_by.user_id, "agent-1");
    let mut draft = Draft::default();
    draft.evolve(event.clone());
    assert_eq!(draft.data.as_ref().map(|d| d.status), Some(DraftStatus::PendingApproval));
    assert_eq!(event.name(), "DraftSubmitted");
}

#[test]
fn given_a_submitted_draft_when_submitted_again_then_nothing_new() {
    // R-ARCH-6: redelivered commands are idempotent
    let event = submitted(false, agent());
    let again = given_when::<Draft>(vec![event], DraftCommand::Submit { draft_id: "d1".into(), plan: plan(false), requested_by: agent(), at: t(5) });
    assert_eq!(again, Ok(vec![]));
}

#[test]
fn given_pending_when_a_human_admin_approves_then_draft_approved() {
    // R-APPROVE-2, R-APPROVE-4
    let s = submitted(false, agent());
    let token = token_for(&s, "alice");
    let events = given_when::<Draft>(vec![s], approve(alice(), false, token.clone())).expect("approved");
    assert_eq!(
        events,
        vec![DraftEvent::DraftApproved {
            draft_id: "d1".into(),
            box_type: "sales".into(),
            approved_by: "alice".into(),
            approved_at: t(1),
            confirm_over_limit: false,
            token
        }]
    );
}

#[test]
fn given_pending_when_an_agent_or_member_decides_then_403() {
    // R-AUTH-2: an agent-kind admin can never approve; a member cannot either
    let s = submitted(false, agent());
    let token = token_for(&s, "x");
    for who in [Principal::new("ops-bot", Role::Admin, Kind::Agent), Principal::new("carol", Role::Member, Kind::Human)] {
        assert_eq!(given_when::<Draft>(vec![s.clone()], approve(who.clone(), true, token.clone())), Err(DraftError::NotHumanAdmin));
        assert_eq!(given_when::<Draft>(vec![s.clone()], DraftCommand::Reject { by: who, reason: "r".into(), at: t(1) }), Err(DraftError::NotHumanAdmin));
    }
    assert_eq!(DraftError::NotHumanAdmin.code().http_status(), 403);
}

#[test]
fn given_my_own_draft_when_i_decide_then_self_approval_forbidden() {
    // R-AUTH-3
    let s = submitted(false, alice());
    let token = token_for(&s, "alice");
    assert_eq!(given_when::<Draft>(vec![s.clone()], approve(alice(), false, token)), Err(DraftError::SelfApproval));
    assert_eq!(given_when::<Draft>(vec![s], DraftCommand::Reject { by: alice(), reason: "r".into(), at: t(1) }), Err(DraftError::SelfApproval));
    assert!(DraftError::SelfApproval.code().is_security_violation());
}

#[test]
fn given_no_draft_when_decided_then_404() {
    // R-APPROVE-2
    let token = ApprovalSigner::from_secret("k1".into(), [7; 32]).issue("d1", "sales", "sha256:00", "alice", t(1));
    assert_eq!(given_when::<Draft>(vec![], approve(alice(), false, token)), Err(DraftError::NotFound));
    assert_eq!(DraftError::NotFound.code().http_status(), 404);
}

#[test]
fn given_over_limit_when_approved_without_confirmation_then_409_and_with_it_200() {
    // R-APPROVE-3
    let s = submitted(true, agent());
    let token = token_for(&s, "alice");
    assert_eq!(given_when::<Draft>(vec![s.clone()], approve(alice(), false, token.clone())), Err(DraftError::OverLimitConfirmationRequired));
    assert_eq!(DraftError::OverLimitConfirmationRequired.code().as_str(), "over_limit_confirmation_required");
    assert_eq!(given_when::<Draft>(vec![s], approve(alice(), true, token)).map(|e| e.len()), Ok(1));
}

#[test]
fn given_approved_when_the_same_admin_repeats_then_ok_without_new_events_and_others_409() {
    // R-APPROVE-6: one decision only; the approver's retry completes, others conflict
    let s = submitted(false, agent());
    let token = token_for(&s, "alice");
    let approved = given_when::<Draft>(vec![s.clone()], approve(alice(), false, token.clone())).expect("approved");
    let history: Vec<DraftEvent> = std::iter::once(s).chain(approved).collect();
    assert_eq!(given_when::<Draft>(history.clone(), approve(alice(), false, token.clone())), Ok(vec![]));
    assert_eq!(given_when::<Draft>(history.clone(), approve(bob(), false, token_for(&history[0], "bob"))), Err(DraftError::NotPending(DraftStatus::Approved)));
    assert_eq!(
        given_when::<Draft>(history, DraftCommand::Reject { by: bob(), reason: "late".into(), at: t(2) }),
        Err(DraftError::NotPending(DraftStatus::Approved))
    );
}

#[test]
fn given_pending_when_rejected_with_a_nul_in_the_reason_or_one_over_its_bound_then_422() {
    // R-ARCH-6: the reason is bounded, so DraftRejected fits the bus
    let s = submitted(false, agent());
    for reason in ["no\0".to_owned(), "n".repeat(crate::bounds::REASON_CHARS + 1)] {
        let err = given_when::<Draft>(vec![s.clone()], DraftCommand::Reject { by: bob(), reason, at: t(1) }).expect_err("refused");
        assert_eq!(err, DraftError::InvalidReason);
        assert_eq!(err.code().http_status(), 422);
    }
    let at_bound = "な".repeat(crate::bounds::REASON_CHARS);
    assert!(given_when::<Draft>(vec![s], DraftCommand::Reject { by: bob(), reason: at_bound, at: t(1) }).is_ok());
}

#[test]
fn given_rejected_when_approved_then_409() {
    // R-APPROVE-5, R-APPROVE-6
    let s = submitted(false, agent());
    let rejected = given_when::<Draft>(vec![s.clone()], DraftCommand::Reject { by: bob(), reason: "too broad".into(), at: t(1) }).expect("rejected");
    assert_eq!(rejected[0].name(), "DraftRejected");
    let history: Vec<DraftEvent> = std::iter::once(s.clone()).chain(rejected).collect();
    let err = given_when::<Draft>(history.clone(), approve(alice(), false, token_for(&s, "alice"))).expect_err("conflict");
    assert_eq!(err.code().as_str(), "draft_not_pending");
    assert_eq!(err.code().http_status(), 409);
    assert_eq!(given_when::<Draft>(history, DraftCommand::Reject { by: bob(), reason: "again".into(), at: t(2) }), Ok(vec![]));
}

#[test]
fn given_a_token_for_another_draft_when_approved_then_refused() {
    // R-APPROVE-4: the token binds draft, box_type, manifest digest and approver
    let s = submitted(false, agent());
    let wrong = ApprovalSigner::from_secret("k1".into(), [7; 32]).issue("d1", "sales", "sha256:00", "alice", t(1));
    assert_eq!(given_when::<Draft>(vec![s.clone()], approve(alice(), false, wrong)), Err(DraftError::TokenMismatch));
    let for_bob = token_for(&s, "bob");
    assert_eq!(given_when::<Draft>(vec![s], approve(alice(), false, for_bob)), Err(DraftError::TokenMismatch));
}

#[test]
fn given_pending_when_the_requester_withdraws_then_withdrawn_and_no_longer_decidable() {
    // R-DRAFT-13
    let s = submitted(false, agent());
    assert_eq!(given_when::<Draft>(vec![s.clone()], DraftCommand::Withdraw { by: bob(), at: t(1) }), Err(DraftError::NotRequester));
    let mallory = Principal::new("mallory", Role::Member, Kind::Agent);
    assert_eq!(given_when::<Draft>(vec![s.clone()], DraftCommand::Withdraw { by: mallory, at: t(1) }), Err(DraftError::NotFound), "invisible to members");
    let withdrawn = given_when::<Draft>(vec![s.clone()], DraftCommand::Withdraw { by: agent(), at: t(1) }).expect("withdrawn");
    assert_eq!(withdrawn, vec![DraftEvent::DraftWithdrawn { draft_id: "d1".into(), withdrawn_by: "agent-1".into(), at: t(1) }]);
    let history: Vec<DraftEvent> = std::iter::once(s.clone()).chain(withdrawn).collect();
    assert_eq!(given_when::<Draft>(history.clone(), approve(alice(), false, token_for(&s, "alice"))), Err(DraftError::NotPending(DraftStatus::Withdrawn)));
    assert_eq!(given_when::<Draft>(history, DraftCommand::Withdraw { by: agent(), at: t(2) }), Ok(vec![]));
}

#[test]
fn given_a_decided_draft_when_withdrawn_then_409() {
    // R-DRAFT-13: pending only
    let s = submitted(false, agent());
    let rejected = given_when::<Draft>(vec![s.clone()], DraftCommand::Reject { by: bob(), reason: "no".into(), at: t(1) }).expect("rejected");
    let history: Vec<DraftEvent> = std::iter::once(s).chain(rejected).collect();
    assert_eq!(given_when::<Draft>(history, DraftCommand::Withdraw { by: agent(), at: t(2) }), Err(DraftError::NotPending(DraftStatus::Rejected)));
}

#[test]
fn given_pending_when_the_ttl_passes_then_expired_and_before_it_nothing() {
    // R-DRAFT-13: ATASIRA_DRAFT_TTL
    let s = submitted(false, agent());
    let ttl = TimeDelta::minutes(30);
    assert_eq!(given_when::<Draft>(vec![s.clone()], DraftCommand::Expire { now: t(29), ttl }), Ok(vec![]));
    let expired = given_when::<Draft>(vec![s.clone()], DraftCommand::Expire { now: t(30), ttl }).expect("expired");
    assert_eq!(expired, vec![DraftEvent::DraftExpired { draft_id: "d1".into(), at: t(30) }]);
    let history: Vec<DraftEvent> = std::iter::once(s.clone()).chain(expired).collect();
    assert_eq!(given_when::<Draft>(history.clone(), DraftCommand::Expire { now: t(59), ttl }), Ok(vec![]));
    assert_eq!(given_when::<Draft>(history, approve(alice(), false, token_for(&s, "alice"))), Err(DraftError::NotPending(DraftStatus::Expired)));
    assert_eq!(given_when::<Draft>(vec![], DraftCommand::Expire { now: t(59), ttl }), Ok(vec![]));
}

#[test]
fn events_round_trip_through_json_with_their_catalog_names() {
    // R-ARCH-9
    use cqrs_es::DomainEvent;
    let s = submitted(false, agent());
    assert_eq!(s.event_type(), "DraftSubmitted");
    assert_eq!(s.event_version(), "1");
    let json = serde_json::to_string(&s).expect("serializes");
    assert_eq!(serde_json::from_str::<DraftEvent>(&json).expect("deserializes"), s);
}

/// The draft state after `events`.
fn state(events: &[DraftEvent]) -> Draft {
    let mut draft = Draft::default();
    for e in events {
        draft.evolve(e.clone());
    }
    draft
}

#[test]
fn given_an_approved_draft_then_its_stream_holds_exactly_the_recorded_approval() {
    // R-APPROVE-7 (3), R-BOX-1: activation acts only on the DraftApproved the store holds
    let s = submitted(false, agent());
    let approved = given_when::<Draft>(vec![s.clone()], approve(alice(), false, token_for(&s, "alice"))).expect("approved").remove(0);
    let draft = state(&[s.clone(), approved.clone()]);
    // when the recorded approval is claimed; then it is held
    assert!(draft.holds_approval(&approved));
    // when a claim differs in anything: draft, box_type, approver, time or token; then not
    let DraftEvent::DraftApproved { draft_id, box_type, approved_by, approved_at, confirm_over_limit, token } = approved.clone() else { panic!("approval") };
    let claim = |draft_id: &str, box_type: &str, by: &str, at: DateTime<Utc>, token: ApprovalToken| DraftEvent::DraftApproved {
        draft_id: draft_id.into(),
        box_type: box_type.into(),
        approved_by: by.into(),
        approved_at: at,
        confirm_over_limit,
        token,
    };
    let other_key = ApprovalSigner::from_secret("k2".into(), [8; 32]).issue(&draft_id, &box_type, &token.claims.manifest_digest, "alice", t(1));
    let other_digest = ApprovalSigner::from_secret("k1".into(), [7; 32]).issue(&draft_id, &box_type, "sha256:00", "alice", t(1));
    let forged = [
        claim("d2", &box_type, &approved_by, approved_at, token.clone()),
        claim(&draft_id, "other", &approved_by, approved_at, token.clone()),
        claim(&draft_id, &box_type, "bob", approved_at, token.clone()),
        claim(&draft_id, &box_type, &approved_by, t(2), token.clone()),
        claim(&draft_id, &box_type, &approved_by, approved_at, other_key),
        claim(&draft_id, &box_type, &approved_by, approved_at, other_digest),
    ];
    for f in &forged {
        assert!(!draft.holds_approval(f), "{f:?}");
    }
    // given a pending, rejected or unknown draft; then no approval is held
    let rejected = given_when::<Draft>(vec![s.clone()], DraftCommand::Reject { by: bob(), reason: "no".into(), at: t(1) }).expect("rejected");
    for history in [vec![s.clone()], std::iter::once(s.clone()).chain(rejected).collect(), vec![]] {
        assert!(!state(&history).holds_approval(&approved), "{history:?}");
    }
    // and a submission is never an approval
    assert!(!draft.holds_approval(&s));
}

#[test]
fn given_a_stream_whose_approval_does_not_bind_its_manifest_then_it_holds_no_approval() {
    // R-BOX-1: a DraftApproved written behind the aggregate's back (its token for another
    // manifest or another approver) is not the draft's decision
    let s = submitted(false, agent());
    let DraftEvent::DraftSubmitted { draft_id, box_type, .. } = s.clone() else { panic!("submit") };
    let signer = ApprovalSigner::from_secret("k1".into(), [7; 32]);
    for token in [signer.issue(&draft_id, &box_type, "sha256:00", "alice", t(1)), signer.issue(&draft_id, &box_type, "sha256:00", "mallory", t(1))] {
        let written = DraftEvent::DraftApproved {
            draft_id: draft_id.clone(),
            box_type: box_type.clone(),
            approved_by: "alice".into(),
            approved_at: t(1),
            confirm_over_limit: false,
            token,
        };
        assert!(!state(&[s.clone(), written.clone()]).holds_approval(&written));
    }
}

#[test]
fn r_draft_11_given_a_key_when_the_same_user_submits_again_then_the_same_draft_id() {
    // given one user and one Idempotency-Key; when the submit runs twice; then one id
    let first = draft_id_for("alice", "k-1");
    assert_eq!(first, draft_id_for("alice", "k-1"));
    assert!(uuid::Uuid::parse_str(&first).is_ok(), "{first}");
    // and another key, or another user with the same key, names another draft
    assert_ne!(first, draft_id_for("alice", "k-2"));
    assert_ne!(first, draft_id_for("bob", "k-1"));
    // and the boundary between user and key cannot be moved
    assert_ne!(draft_id_for("ab", "c"), draft_id_for("a", "bc"));
}

#[test]
fn every_draft_status_has_one_name_that_reads_back() {
    for status in DraftStatus::ALL {
        assert_eq!(status.as_str().parse::<DraftStatus>(), Ok(status));
        assert_eq!(serde_json::to_value(status).expect("serializes"), serde_json::json!(status.as_str()));
    }
    assert!("pending".parse::<DraftStatus>().is_err_and(|e| e.contains("pending_approval")));
}

/// A draft over the limit that needs `n` approvals.
fn submitted_needing(n: u32) -> DraftEvent {
    let mut plan = plan(true);
    plan.approvals_required = n;
    let command = DraftCommand::Submit { draft_id: "d1".into(), plan, requested_by: agent(), at: t(0) };
    given_when::<Draft>(vec![], command).expect("submit is accepted").remove(0)
}

#[test]
fn r_change_3_given_two_approvals_required_when_one_admin_approves_then_it_is_given_without_a_token() {
    // given an over-limit draft that needs two human admins
    let submitted = submitted_needing(2);
    // when alice approves; then her approval is recorded alone, no decision yet
    let given = given_when::<Draft>(vec![submitted.clone()], approve(alice(), true, token_for(&submitted, "alice"))).expect("accepted");
    assert!(matches!(&given[..], [DraftEvent::DraftApprovalGiven { approved_by, approvals: 1, approvals_required: 2, .. }] if approved_by == "alice"));
    // when alice approves again; then nothing more is recorded
    let again = given_when::<Draft>(vec![submitted.clone(), given[0].clone()], approve(alice(), true, token_for(&submitted, "alice")));
    assert_eq!(again, Ok(vec![]));
    // when bob approves; then the decision is made, with his token
    let decided = given_when::<Draft>(vec![submitted.clone(), given[0].clone()], approve(bob(), true, token_for(&submitted, "bob"))).expect("accepted");
    assert!(matches!(&decided[..], [DraftEvent::DraftApproved { approved_by, .. }] if approved_by == "bob"));
}

#[test]
fn r_change_3_the_completing_approval_needs_its_reservation_and_a_rejection_ends_it() {
    let submitted = submitted_needing(2);
    let given = given_when::<Draft>(vec![submitted.clone()], approve(alice(), true, token_for(&submitted, "alice"))).expect("accepted");
    // when bob's approval, decided as one that completes nothing, arrives after alice's
    let unreserved = DraftCommand::Approve { by: bob(), confirm_over_limit: true, token: token_for(&submitted, "bob"), at: t(2), reserved: false };
    // then it is a conflict to retry, never an unreserved activation
    assert_eq!(given_when::<Draft>(vec![submitted.clone(), given[0].clone()], unreserved), Err(DraftError::ApprovalsMoved));
    // and a rejection after one approval ends the draft
    let reject = DraftCommand::Reject { by: bob(), reason: "no".into(), at: t(3) };
    let rejected = given_when::<Draft>(vec![submitted.clone(), given[0].clone()], reject).expect("accepted");
    assert!(matches!(&rejected[..], [DraftEvent::DraftRejected { .. }]));
    // and a draft within the limit needs one approval whatever the setting
    let within = {
        let mut plan = plan(false);
        plan.approvals_required = 1;
        given_when::<Draft>(vec![], DraftCommand::Submit { draft_id: "d1".into(), plan, requested_by: agent(), at: t(0) }).expect("ok").remove(0)
    };
    let one = given_when::<Draft>(vec![within.clone()], approve(alice(), false, token_for(&within, "alice"))).expect("accepted");
    assert!(matches!(&one[..], [DraftEvent::DraftApproved { .. }]));
}

#[test]
fn r_change_2_given_a_rejected_draft_when_its_requester_revises_it_then_a_new_version_keeps_the_thread() {
    // given a draft that alice rejected
    let submitted = submitted(false, agent());
    let reject = DraftCommand::Reject { by: alice(), reason: "needs Grep".into(), at: t(2) };
    let rejected = given_when::<Draft>(vec![submitted.clone()], reject).expect("rejected").remove(0);
    let mut draft = Draft::default();
    draft.evolve(submitted.clone());
    draft.evolve(rejected);
    let revised = draft.data.clone().expect("data");
    let mut manifest = revised.manifest.clone();
    manifest.tools.push("Grep".into());
    let revise = |by: Principal, revised: DraftData| DraftCommand::Revise {
        draft_id: revision_id_for("d1"),
        revised,
        manifest: manifest.clone(),
        over_limit: OverLimit::default(),
        change: None,
        approvals_required: 1,
        policy: None,
        requested_by: by,
        at: t(3),
    };
    // when its requester revises it; then a pending version 2 that names the rejection
    let events = given_when::<Draft>(vec![], revise(agent(), revised.clone())).expect("revised");
    let [DraftEvent::DraftSubmitted { revision: Some(r), .. }] = &events[..] else { panic!("a revision: {events:?}") };
    assert_eq!((r.draft_id.as_str(), r.version, r.rejected_by.as_str(), r.reason.as_str()), ("d1", 2, "alice", "needs Grep"));
    assert_eq!((r.earlier.clone(), r.diff.added.clone()), (vec!["d1".to_owned()], vec!["tools: Grep".to_owned()]));
    // and nobody else revises it, and a draft not rejected is not revised
    assert_eq!(given_when::<Draft>(vec![], revise(bob(), revised.clone())), Err(DraftError::NotRequester));
    let mut pending = revised;
    pending.status = DraftStatus::PendingApproval;
    assert_eq!(given_when::<Draft>(vec![], revise(agent(), pending)), Err(DraftError::NotRejected(DraftStatus::PendingApproval)));
}

#[test]
fn r_change_3_a_revision_needs_the_approvals_its_own_version_needs() {
    // given a rejected draft within the limit (one approval)
    let submitted = submitted(false, agent());
    let rejected = given_when::<Draft>(vec![submitted.clone()], DraftCommand::Reject { by: alice(), reason: "r".into(), at: t(2) }).expect("ok").remove(0);
    let mut draft = Draft::default();
    draft.evolve(submitted);
    draft.evolve(rejected);
    let revised = draft.data.expect("data");
    // when its revision goes over the limit, where two approvals are required
    let command = DraftCommand::Revise {
        draft_id: revision_id_for("d1"),
        manifest: revised.manifest.clone(),
        revised,
        over_limit: OverLimit { over_limit: true, over_limit_ops: vec!["shell:exec".into()], over_limit_tools: vec![] },
        change: None,
        approvals_required: 2,
        policy: None,
        requested_by: agent(),
        at: t(3),
    };
    // then the new version needs two
    let events = given_when::<Draft>(vec![], command).expect("revised");
    assert!(matches!(&events[..], [DraftEvent::DraftSubmitted { approvals_required: 2, .. }]), "{events:?}");
}

#[test]
fn r_policy_1_a_policy_asking_for_confirmation_and_two_approvals_holds_a_draft_within_the_limit() {
    use crate::org_policy::{PolicyDecision, Verdict};
    // given a draft within the limit whose recorded verdict asks for two approvals and the confirmation
    let verdict = Verdict { version: 4, decision: PolicyDecision::Allow, rules: vec!["careful".into()], reason: None, approvals_required: 2, confirm: true };
    let mut p = plan(false);
    p.approvals_required = verdict.approvals_required;
    p.policy = Some(verdict.clone());
    let events = given_when::<Draft>(vec![], DraftCommand::Submit { draft_id: "d1".into(), plan: p, requested_by: agent(), at: t(0) }).expect("submitted");
    let [DraftEvent::DraftSubmitted { policy: Some(recorded), approvals_required: 2, .. }] = &events[..] else { panic!("{events:?}") };
    assert_eq!(recorded, &verdict);
    let submitted = events[0].clone();
    // when approved without the confirmation: refused naming the rule
    let refused = given_when::<Draft>(vec![submitted.clone()], approve(alice(), false, token_for(&submitted, "alice"))).expect_err("refused");
    assert_eq!(refused, DraftError::ConfirmationRequiredByPolicy("careful".into()));
    assert_eq!(refused.code(), ErrorCode::OverLimitConfirmationRequired);
    // when approved with it: one approval of two, no token yet
    let given = given_when::<Draft>(vec![submitted.clone()], approve(alice(), true, token_for(&submitted, "alice"))).expect("given");
    assert!(matches!(&given[..], [DraftEvent::DraftApprovalGiven { approvals: 1, approvals_required: 2, .. }]), "{given:?}");
}
