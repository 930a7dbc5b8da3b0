//! Given/when/then tests of the box-type namespace (R-APPROVE-7, R-BOX-3).

use chrono::{TimeDelta, TimeZone};
use proptest::prelude::*;

use super::*;
use crate::aggregates::testing::given_when;

fn t(minute: i64) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, 0).single().expect("valid time") + TimeDelta::minutes(minute)
}

fn reserve(bt: &str, draft: &str, now: i64) -> NamespaceCommand {
    NamespaceCommand::Reserve { box_type: bt.into(), draft_id: draft.into(), now: t(now), deadline: t(now + 10), max_boxes: 3, foreign_manifest_file: false }
}

fn bind(bt: &str, draft: &str, now: i64) -> NamespaceCommand {
    NamespaceCommand::Bind { box_type: bt.into(), draft_id: draft.into(), box_id: format!("box-{bt}"), now: t(now), max_boxes: 3 }
}

/// Applies commands in order, failing the test on a refusal; returns all events.
fn history(commands: Vec<NamespaceCommand>) -> Vec<NamespaceEvent> {
    let mut events = Vec::new();
    for c in commands {
        let new = given_when::<BoxTypeNamespace>(events.clone(), c.clone()).unwrap_or_else(|e| panic!("{c:?} refused: {e}"));
        events.extend(new);
    }
    events
}

fn active(bt: &str) -> Vec<NamespaceCommand> {
    vec![reserve(bt, &format!("d-{bt}"), 0), bind(bt, &format!("d-{bt}"), 1)]
}

#[test]
fn given_a_free_box_type_when_reserved_then_reserved_until_the_deadline() {
    // R-APPROVE-7 (1)
    assert_eq!(
        given_when::<BoxTypeNamespace>(vec![], reserve("sales", "d1", 0)),
        Ok(vec![NamespaceEvent::BoxTypeReserved { box_type: "sales".into(), draft_id: Some("d1".into()), box_id: None, expires_at: Some(t(10)) }])
    );
}

#[test]
fn given_a_reservation_when_the_same_draft_reserves_again_then_nothing_new() {
    // R-APPROVE-7: idempotent per draft
    let h = history(vec![reserve("sales", "d1", 0)]);
    assert_eq!(given_when::<BoxTypeNamespace>(h, reserve("sales", "d1", 5)), Ok(vec![]));
}

#[test]
fn given_a_live_reservation_or_box_when_another_draft_reserves_then_box_type_exists() {
    // R-BOX-3: one Box per box_type
    let h = history(vec![reserve("sales", "d1", 0)]);
    assert_eq!(given_when::<BoxTypeNamespace>(h, reserve("sales", "d2", 5)), Err(NamespaceError::BoxTypeExists("sales".into())));
    let h = history(active("sales"));
    let err = given_when::<BoxTypeNamespace>(h, reserve("sales", "d2", 500)).expect_err("taken by a Box");
    assert_eq!(err.code().as_str(), "box_type_exists");
}

#[test]
fn given_a_lapsed_reservation_when_another_draft_reserves_then_it_takes_over() {
    // R-APPROVE-7: a reservation expires if no decision follows within the deadline
    let h = history(vec![reserve("sales", "d1", 0)]);
    let events = given_when::<BoxTypeNamespace>(h, reserve("sales", "d2", 11)).expect("taken over");
    assert_eq!(events.iter().map(NamespaceEvent::name).collect::<Vec<_>>(), vec!["BoxTypeReleased", "BoxTypeReserved"]);
}

#[test]
fn given_the_limit_when_another_box_type_reserves_then_box_limit_reached() {
    // R-BOX-3: ATASIRA_MAX_BOXES; pending reservations count
    let h = history([active("a"), active("b"), vec![reserve("c", "dc", 2)]].concat());
    let err = given_when::<BoxTypeNamespace>(h, reserve("d", "dd", 3)).expect_err("full");
    assert_eq!(err, NamespaceError::BoxLimitReached { max: 3 });
    assert_eq!(err.code().http_status(), 409);
}

#[test]
fn given_the_limit_with_a_lapsed_reservation_then_the_lapsed_one_does_not_count() {
    // R-BOX-3, R-APPROVE-7
    let h = history([active("a"), active("b"), vec![reserve("c", "dc", 0)]].concat());
    assert!(given_when::<BoxTypeNamespace>(h, reserve("d", "dd", 20)).is_ok());
}

#[test]
fn given_a_foreign_manifest_file_when_reserved_then_manifest_exists() {
    // R-BOX-2
    let cmd =
        NamespaceCommand::Reserve { box_type: "sales".into(), draft_id: "d1".into(), now: t(0), deadline: t(10), max_boxes: 3, foreign_manifest_file: true };
    let err = given_when::<BoxTypeNamespace>(vec![], cmd).expect_err("refused");
    assert_eq!(err.code().as_str(), "manifest_exists");
}

#[test]
fn given_a_reservation_when_released_by_its_draft_then_free_and_by_another_nothing() {
    // R-APPROVE-7 (2): a losing decision releases its reservation
    let h = history(vec![reserve("sales", "d1", 0)]);
    let other = NamespaceCommand::Release { box_type: "sales".into(), draft_id: "d2".into(), reason: "rejected".into() };
    assert_eq!(given_when::<BoxTypeNamespace>(h.clone(), other), Ok(vec![]));
    let mine = NamespaceCommand::Release { box_type: "sales".into(), draft_id: "d1".into(), reason: "rejected".into() };
    let released = given_when::<BoxTypeNamespace>(h.clone(), mine).expect("released");
    assert_eq!(released.len(), 1);
    let h: Vec<NamespaceEvent> = h.into_iter().chain(released).collect();
    assert!(given_when::<BoxTypeNamespace>(h, reserve("sales", "d2", 1)).is_ok());
}

#[test]
fn given_a_reservation_when_expired_before_the_deadline_then_nothing_and_after_it_released() {
    // R-APPROVE-7
    let h = history(vec![reserve("sales", "d1", 0)]);
    let early = NamespaceCommand::Expire { box_type: "sales".into(), draft_id: "d1".into(), now: t(5) };
    assert_eq!(given_when::<BoxTypeNamespace>(h.clone(), early), Ok(vec![]));
    let late = NamespaceCommand::Expire { box_type: "sales".into(), draft_id: "d1".into(), now: t(11) };
    assert_eq!(given_when::<BoxTypeNamespace>(h, late).map(|e| e.len()), Ok(1));
}

#[test]
fn given_a_reservation_when_bound_then_held_forever_and_binding_again_is_a_no_op() {
    // R-APPROVE-7 (3): at least once, idempotent
    let h = history(active("sales"));
    assert!(matches!(&h[1], NamespaceEvent::BoxTypeReserved { box_id: Some(_), expires_at: None, .. }));
    assert_eq!(given_when::<BoxTypeNamespace>(h.clone(), bind("sales", "d-sales", 999)), Ok(vec![]));
    let late_expire = NamespaceCommand::Expire { box_type: "sales".into(), draft_id: "d-sales".into(), now: t(999) };
    assert_eq!(given_when::<BoxTypeNamespace>(h, late_expire), Ok(vec![]));
}

#[test]
fn given_an_approval_whose_reservation_lapsed_when_bound_then_it_still_activates_if_free() {
    // R-APPROVE-7 (3): a crash after the decision still ends in exactly one Box
    let h = history(vec![reserve("sales", "d1", 0)]);
    assert_eq!(given_when::<BoxTypeNamespace>(h.clone(), bind("sales", "d1", 60)).map(|e| e.len()), Ok(1));
    let taken = history(vec![reserve("sales", "d1", 0), reserve("sales", "d2", 11)]);
    assert_eq!(given_when::<BoxTypeNamespace>(taken, bind("sales", "d1", 12)), Err(NamespaceError::BoxTypeExists("sales".into())));
}

#[test]
fn given_a_full_house_when_a_box_stops_then_its_slot_is_free_and_resume_needs_a_slot() {
    // R-BOX-3, R-BOX-7: stopped Boxes do not count; resume takes a slot or 409
    let full = history([active("a"), active("b"), active("c")].concat());
    assert!(given_when::<BoxTypeNamespace>(full.clone(), reserve("d", "dd", 2)).is_err());
    let stop = NamespaceCommand::FreeSlot { box_type: "a".into(), box_id: "box-a".into() };
    let h = history([active("a"), active("b"), active("c"), vec![stop.clone()]].concat());
    assert_eq!(given_when::<BoxTypeNamespace>(h.clone(), stop), Ok(vec![]), "stop is idempotent");
    assert_eq!(
        given_when::<BoxTypeNamespace>(h.clone(), reserve("a", "d-again", 3)),
        Err(NamespaceError::BoxTypeExists("a".into())),
        "a stopped Box keeps its box_type"
    );
    let h2 = history(
        [active("a"), active("b"), active("c"), vec![NamespaceCommand::FreeSlot { box_type: "a".into(), box_id: "box-a".into() }], active("d")].concat(),
    );
    let resume = NamespaceCommand::TakeSlot { box_type: "a".into(), box_id: "box-a".into(), now: t(5), max_boxes: 3 };
    assert_eq!(given_when::<BoxTypeNamespace>(h2, resume.clone()), Err(NamespaceError::BoxLimitReached { max: 3 }));
    assert_eq!(given_when::<BoxTypeNamespace>(h, resume).map(|e| e.len()), Ok(1));
}

#[test]
fn given_a_box_when_retired_then_the_box_type_can_be_drafted_again() {
    // R-BOX-7 archive
    let h = history([active("sales"), vec![NamespaceCommand::Retire { box_type: "sales".into(), box_id: "box-sales".into() }]].concat());
    assert!(given_when::<BoxTypeNamespace>(h.clone(), reserve("sales", "d2", 5)).is_ok());
    let foreign = NamespaceCommand::FreeSlot { box_type: "sales".into(), box_id: "box-sales".into() };
    assert_eq!(given_when::<BoxTypeNamespace>(h, foreign), Err(NamespaceError::NotHeld("sales".into())));
}

#[test]
fn given_an_archived_box_when_its_approval_is_replayed_then_it_binds_nothing() {
    // R-APPROVE-7 (3), R-BOX-7: a replayed DraftApproved of an archived Box takes neither
    // its box_type nor a slot, full house or not
    let h = history([active("sales"), vec![NamespaceCommand::Retire { box_type: "sales".into(), box_id: "box-sales".into() }]].concat());
    assert_eq!(given_when::<BoxTypeNamespace>(h.clone(), bind("sales", "d-sales", 500)), Ok(vec![]));
    // and after another draft took the box_type over, the replay neither steals nor refuses it
    let mut h2 = h.clone();
    h2.extend(given_when::<BoxTypeNamespace>(h.clone(), reserve("sales", "d2", 5)).expect("reserved"));
    assert_eq!(given_when::<BoxTypeNamespace>(h2, bind("sales", "d-sales", 6)), Ok(vec![]));
    // while a Box that was only stopped binds as before: it still holds its box_type
    let stopped = history([active("ops"), vec![NamespaceCommand::FreeSlot { box_type: "ops".into(), box_id: "box-ops".into() }]].concat());
    assert_eq!(given_when::<BoxTypeNamespace>(stopped, bind("ops", "d-ops", 7)), Ok(vec![]));
}

fn counted(events: &[NamespaceEvent], now: DateTime<Utc>) -> usize {
    let mut ns = BoxTypeNamespace::default();
    for e in events {
        ns.evolve(e.clone());
    }
    ns.entries.values().filter(|e| e.counts(now)).count()
}

fn any_command() -> impl Strategy<Value = (u8, u8, u8, i64)> {
    (0u8..7, 0u8..6, 0u8..4, 0i64..40)
}

proptest! {
    /// R-BOX-3: whatever sequence of commands is accepted, the limit is never exceeded.
    #[test]
    fn the_limit_holds_under_any_command_sequence(steps in proptest::collection::vec(any_command(), 1..60)) {
        let mut events: Vec<NamespaceEvent> = Vec::new();
        let mut clock = 0;
        for (kind, bt, draft, dt) in steps {
            clock += dt % 5;
            let box_type = format!("bt{bt}");
            let draft_id = format!("d{bt}-{draft}");
            let box_id = format!("box-{bt}");
            let cmd = match kind {
                0 | 1 => NamespaceCommand::Reserve { box_type, draft_id, now: t(clock), deadline: t(clock + 10), max_boxes: 3, foreign_manifest_file: false },
                2 => NamespaceCommand::Bind { box_type, draft_id, box_id, now: t(clock), max_boxes: 3 },
                3 => NamespaceCommand::FreeSlot { box_type, box_id },
                4 => NamespaceCommand::TakeSlot { box_type, box_id, now: t(clock), max_boxes: 3 },
                5 => NamespaceCommand::Retire { box_type, box_id },
                _ => NamespaceCommand::Release { box_type, draft_id, reason: "rejected".into() },
            };
            if let Ok(new) = given_when::<BoxTypeNamespace>(events.clone(), cmd) {
                events.extend(new);
            }
            prop_assert!(counted(&events, t(clock)) <= 3, "more than 3 slots in use");
        }
    }
}

#[test]
fn given_a_lapsed_reservation_and_a_full_house_when_bound_then_box_limit_reached() {
    // R-BOX-3: found by the property test above — a lapsed reservation must not come back
    // to life over the limit.
    let h = history([vec![reserve("late", "d-late", 0)], active_at("a", 11), active_at("b", 11), active_at("c", 11)].concat());
    assert_eq!(given_when::<BoxTypeNamespace>(h, bind("late", "d-late", 12)), Err(NamespaceError::BoxLimitReached { max: 3 }));
}

fn active_at(bt: &str, now: i64) -> Vec<NamespaceCommand> {
    vec![reserve(bt, &format!("d-{bt}"), now), bind(bt, &format!("d-{bt}"), now)]
}
