//! Given/when/then for triggers (R-TRIG-1).

use chrono::{DateTime, TimeZone, Utc};

use super::*;
use crate::{BoxManifest, Kind, Role};

fn at(h: u32, m: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 4, h, m, s).single().expect("valid")
}

fn every_minute() -> Schedule {
    Schedule::parse("*/1 * * * *").expect("valid")
}

#[test]
fn given_a_schedule_when_asked_at_a_time_then_the_latest_tick_since_is_due() {
    let s = every_minute();
    // Activated at 10:00:30: the first tick is 10:01:00.
    assert_eq!(s.due(at(10, 0, 30), at(10, 0, 59)), None);
    assert_eq!(s.due(at(10, 0, 30), at(10, 1, 0)), Some(at(10, 1, 0)));
    assert_eq!(s.due(at(10, 0, 30), at(10, 1, 40)), Some(at(10, 1, 0)));
    // A tick at the very moment the Box became schedulable does not count.
    assert_eq!(s.due(at(10, 1, 0), at(10, 1, 30)), None);
    // Asked before since (a clock that went back): nothing.
    assert_eq!(s.due(at(10, 5, 0), at(10, 4, 0)), None);
}

#[test]
fn given_missed_ticks_when_the_scheduler_comes_back_then_only_the_latest_is_due() {
    // Down from 10:00:30 to 10:07:10: ticks 10:01 .. 10:07 were missed; one run, for 10:07.
    assert_eq!(every_minute().due(at(10, 0, 30), at(10, 7, 10)), Some(at(10, 7, 0)));
}

#[test]
fn given_a_tick_when_the_next_is_asked_then_it_follows_the_expression() {
    let s = Schedule::parse("*/15 * * * *").expect("valid");
    assert_eq!(s.next_after(at(10, 0, 0)), Some(at(10, 15, 0)));
    assert_eq!(s.next_after(at(10, 14, 59)), Some(at(10, 15, 0)));
    assert!(Schedule::parse("* * *").is_err());
    assert!(Schedule::parse("").is_err());
}

#[test]
fn given_a_box_and_a_tick_or_a_message_then_the_launch_id_is_the_same_each_time_and_the_boxs_own() {
    let tick = tick_launch_id("b1", at(10, 1, 0));
    assert_eq!(tick, tick_launch_id("b1", at(10, 1, 0)));
    assert_ne!(tick, tick_launch_id("b2", at(10, 1, 0)));
    assert_ne!(tick, tick_launch_id("b1", at(10, 2, 0)));
    let message = message_launch_id("b1", "msg-1");
    assert_eq!(message, message_launch_id("b1", "msg-1"));
    assert_ne!(message, message_launch_id("b1", "msg-2"));
    assert_ne!(message, message_launch_id("b2", "msg-1"));
    for id in [&tick, &message] {
        assert!(is_trigger_launch_id(id));
        let request = crate::worker::LaunchRequest {
            launch_id: id.clone(),
            box_id: "b1".into(),
            role: String::new(),
            labels: Default::default(),
            input: vec![crate::worker::Segment::Text("x".into())],
        };
        assert!(crate::worker::validate_launch(&request).is_empty(), "{id} is a valid launch id");
    }
    // Only the Box's trigger launches as them.
    assert_eq!(foreign_launch_id(&tick, "b1", &trigger_principal("b1")), None);
    assert!(foreign_launch_id(&tick, "b1", &Principal::new("alice", Role::Admin, Kind::Human)).is_some());
    assert!(foreign_launch_id(&tick, "b2", &trigger_principal("b2")).is_some(), "another Box's tick");
    assert_eq!(foreign_launch_id("my-launch", "b1", &Principal::new("alice", Role::Admin, Kind::Human)), None);
    // A long message id still fits.
    assert!(message_launch_id("b1", &"x".repeat(10_000)).len() <= crate::worker::LAUNCH_ID_CHARS);
}

#[test]
fn given_the_trigger_principal_then_it_is_its_boxs_alone() {
    let p = trigger_principal("b1");
    assert!(is_trigger_of(&p, "b1"));
    assert!(!is_trigger_of(&p, "b2"));
    assert!(!p.is_admin() && !p.is_human_admin());
    assert!(is_trigger_user(&p.user_id));
    // A person whose user id merely looks like it is not a trigger.
    assert!(!is_trigger_of(&Principal::new("trigger:b1", Role::Member, Kind::Human), "b1"));
}

fn activated(when: DateTime<Utc>) -> BoxEvent {
    let manifest = BoxManifest::from_yaml_str("box_type: sales\npurpose: p\n").expect("valid").manifest;
    BoxEvent::BoxActivated {
        box_id: "b1".into(),
        box_type: "sales".into(),
        draft_id: "d1".into(),
        manifest_digest: manifest.digest(),
        manifest,
        approved_by: "alice".into(),
        approval_key_id: "k1".into(),
        activated_at: when,
    }
}

fn stopped(when: DateTime<Utc>) -> BoxEvent {
    BoxEvent::BoxStopped { box_id: "b1".into(), box_type: "sales".into(), by: "alice".into(), at: when }
}

fn resumed(when: DateTime<Utc>) -> BoxEvent {
    BoxEvent::BoxResumed { box_id: "b1".into(), box_type: "sales".into(), by: "alice".into(), at: when }
}

#[test]
fn given_a_boxs_events_then_ticks_count_from_when_it_last_became_schedulable() {
    assert_eq!(schedule_since(&[]), None);
    assert_eq!(schedule_since(&[activated(at(9, 0, 0))]), Some(at(9, 0, 0)));
    // Stopped: no schedule; resumed: ticks count again from the resume, not from before.
    assert_eq!(schedule_since(&[activated(at(9, 0, 0)), stopped(at(9, 10, 0))]), None);
    assert_eq!(schedule_since(&[activated(at(9, 0, 0)), stopped(at(9, 10, 0)), resumed(at(9, 20, 30))]), Some(at(9, 20, 30)));
    let archived = BoxEvent::BoxArchived { box_id: "b1".into(), box_type: "sales".into(), by: "alice".into(), at: at(9, 30, 0) };
    assert_eq!(schedule_since(&[activated(at(9, 0, 0)), archived]), None);
}

fn event_box(box_id: &str, topic: &str, assigned: &[&str]) -> EventBox {
    EventBox { box_id: box_id.into(), topic: topic.into(), assigned: assigned.iter().map(|u| (*u).to_owned()).collect() }
}

#[test]
fn given_event_boxes_when_a_publisher_asks_then_it_may_publish_where_it_may_launch_every_listener() {
    let boxes = vec![event_box("b1", "sales.csv", &["ana"]), event_box("b2", "sales.csv", &["ana", "bob"]), event_box("b3", "hr.new", &["bob"])];
    let ana = Principal::new("ana", Role::Member, Kind::Agent);
    let bob = Principal::new("bob", Role::Member, Kind::Agent);
    let admin = Principal::new("root", Role::Admin, Kind::Human);
    // A publish launches every listener: bob may launch b2 but not b1, so not sales.csv.
    assert!(may_publish(&ana, "sales.csv", &boxes));
    assert!(!may_publish(&bob, "sales.csv", &boxes));
    assert!(may_publish(&bob, "hr.new", &boxes));
    // Nobody publishes where nothing listens.
    assert!(!may_publish(&admin, "nothing.here", &boxes));
    assert_eq!(topics_for(&ana, &boxes), vec!["sales.csv"]);
    assert_eq!(topics_for(&bob, &boxes), vec!["hr.new"]);
    assert_eq!(topics_for(&admin, &boxes), vec!["hr.new", "sales.csv"]);
    // A Box's trigger launches its own Box only.
    assert!(topics_for(&trigger_principal("b3"), &boxes) == vec!["hr.new"]);
    assert_eq!(listening("sales.csv", &boxes).len(), 2);
}

#[test]
fn given_workers_in_flight_when_an_event_arrives_then_the_bound_refuses_it() {
    assert_eq!(in_flight_refusal(0, IN_FLIGHT), None);
    assert_eq!(in_flight_refusal(IN_FLIGHT - 1, IN_FLIGHT), None);
    assert!(in_flight_refusal(IN_FLIGHT, IN_FLIGHT).is_some_and(|why| why.contains("at most 4")));
}

#[test]
fn given_a_message_id_when_launched_then_the_launch_is_the_box_and_the_id() {
    let a = message_launch_id("b1", "msg-1");
    assert_eq!(a, message_launch_id("b1", "msg-1"));
    assert_ne!(a, message_launch_id("b1", "msg-2"));
    assert_ne!(a, message_launch_id("b2", "msg-1"));
    assert!(foreign_launch_id(&a, "b1", &trigger_principal("b1")).is_none());
    assert!(foreign_launch_id(&a, "b1", &Principal::new("root", Role::Admin, Kind::Human)).is_some());
}
