//! Boxes that run on their own (R-TRIG-1), in embedded mode and as a cluster with two
//! runtime registries: a `schedule` Box gets exactly one Worker per cron tick, across
//! replicas and a restart; ticks missed while everything was down run once, not in a burst;
//! a config edit of the schedule takes effect at the next tick; a stopped Box's schedule
//! stops. Time is a test clock the test moves (a file every
//! process reads in a test build), never a sleep to the next minute.

use std::path::Path;
use std::time::Duration;

use atasira_tests::fixtures::eventually;
use atasira_tests::harness::{Answer, Mode, System, TempDir, http};
use chrono::{DateTime, DurationRound, TimeDelta, Utc};
use serde_json::{Value, json};

fn set_clock(file: &Path, at: DateTime<Utc>) {
    // Written whole, then renamed: a reader never sees half a time.
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, at.to_rfc3339()).expect("clock");
    std::fs::rename(&tmp, file).expect("clock");
}

fn clock_env(file: &Path) -> Vec<(&'static str, String)> {
    vec![("ATASIRA_TEST_CLOCK", file.display().to_string())]
}

/// An active Box whose approved change made it `schedule` with `expression`; its id.
fn scheduled_box(sys: &System, box_type: &str, expression: &str) -> String {
    let draft = json!({"box_type": box_type, "name": box_type, "purpose": "Summarise the day's tickets.", "tools": ["Read"]});
    let id = sys.draft(&draft);
    let a = sys.approve(&id, &sys.admin, true);
    assert_eq!(a.status, 200, "{:?}: {}", sys.mode, a.raw);
    let box_id = a.body["box_id"].as_str().expect("box_id").to_owned();
    // trigger_type changes only through an approved change.
    let change = json!({"trigger_type": "schedule", "trigger_schedule": expression});
    let asked = sys.post(&format!("/api/v1/boxes/{box_id}/change-requests"), &sys.admin, &change);
    assert_eq!(asked.status, 201, "{}", asked.raw);
    let bob = sys.token("bob", "admin", "human");
    let approved = sys.approve(asked.body["draft_id"].as_str().expect("draft_id"), &bob, true);
    assert_eq!(approved.body["status"], json!("active"), "{}", approved.raw);
    box_id
}

/// A config edit of the Box's `trigger_schedule`.
fn schedule(sys: &System, box_id: &str, expression: &str) -> Answer {
    let body = json!({"trigger_schedule": expression}).to_string();
    let headers = [("Content-Type", "application/merge-patch+json")];
    http("PATCH", &sys.url(&format!("/api/v1/boxes/{box_id}/config")), Some(&sys.admin), &headers, Some(body.as_bytes()))
}

/// The Box's Workers, oldest first.
fn workers(sys: &System, box_id: &str) -> Vec<Value> {
    let a = sys.get(&format!("/api/v1/boxes/{box_id}/workers?limit=100"), &sys.admin);
    assert_eq!(a.status, 200, "{}", a.raw);
    a.body["workers"].as_array().cloned().unwrap_or_default()
}

fn launch_ids(workers: &[Value]) -> Vec<String> {
    workers.iter().filter_map(|w| w["launch_id"].as_str().map(str::to_owned)).collect()
}

fn tick_id(box_id: &str, tick: DateTime<Utc>) -> String {
    format!("trigger:{box_id}:tick:{}", tick.timestamp())
}

/// Waits until the Box's Workers are those of exactly `ticks`.
fn has_ticks(sys: &System, box_id: &str, ticks: &[DateTime<Utc>]) -> Vec<Value> {
    let want: Vec<String> = ticks.iter().map(|t| tick_id(box_id, *t)).collect();
    eventually(&format!("{:?}: the Workers of {} ticks", sys.mode, ticks.len()), Duration::from_secs(30), || {
        let ws = workers(sys, box_id);
        let mut have = launch_ids(&ws);
        have.sort();
        if have == want { Ok(ws) } else { Err(format!("{have:?}, want {want:?}")) }
    })
}

/// The system with the test clock; as a cluster, with a second runtime registry.
fn start(mode: Mode, clock: &Path) -> System {
    let mut sys = System::start_with(mode, &clock_env(clock));
    if mode == Mode::Cluster {
        // A second scheduler: two registries side by side.
        sys.start_service("runtime-registry", &clock_env(clock));
    }
    sys
}

#[test]
fn r_trig_1_a_schedule_box_gets_one_worker_per_tick_across_replicas_and_restarts() {
    for mode in [Mode::Embedded, Mode::Cluster] {
        let dir = TempDir::new("atasira-clock");
        let clock = dir.0.join("clock");
        // Long ago: nothing is due while the Box is set up.
        set_clock(&clock, DateTime::from_timestamp(946_684_800, 0).expect("2000"));
        let mut sys = start(mode, &clock);
        let box_id = scheduled_box(&sys, "daily-summary", "*/1 * * * *");
        // Ticks count from the approved change: the first whole minute two minutes on is
        // surely after it.
        let base = Utc::now().duration_trunc(TimeDelta::minutes(1)).expect("minute") + TimeDelta::minutes(2);
        assert!(workers(&sys, &box_id).is_empty(), "{mode:?}: nothing before the first tick");
        // Nobody else launches as the Box's trigger: a tick cannot be taken before it runs.
        let taken = json!({"launch_id": tick_id(&box_id, base), "input": [{"kind": "text", "value": "mine"}]});
        let refused = sys.post(&format!("/api/v1/boxes/{box_id}/workers"), &sys.admin, &taken);
        assert_eq!(refused.status, 422, "{mode:?}: {}", refused.raw);
        assert!(refused.raw.contains("launch_id"), "{mode:?}: {}", refused.raw);

        // The first tick: one Worker, launched by the Box's trigger with the tick as input.
        set_clock(&clock, base + TimeDelta::seconds(5));
        let ws = has_ticks(&sys, &box_id, &[base]);
        assert_eq!(ws[0]["created_by"], json!(format!("trigger:{box_id}")), "{mode:?}: {}", ws[0]);
        assert_eq!(ws[0]["labels"]["trigger"], json!("schedule"), "{mode:?}: {}", ws[0]);
        let first = sys.get(&format!("/api/v1/workers/{}", ws[0]["worker_id"].as_str().expect("id")), &sys.admin);
        let input = first.body["transcript"][0].to_string();
        assert!(input.contains(&base.to_rfc3339()), "{mode:?}: the tick is the input: {input}");

        // Within the minute nothing more; at the next tick one more.
        set_clock(&clock, base + TimeDelta::seconds(40));
        set_clock(&clock, base + TimeDelta::seconds(65));
        has_ticks(&sys, &box_id, &[base, base + TimeDelta::minutes(1)]);

        // Everything restarts within the same minute: the tick is not run again.
        sys.restart_with(&clock_env(&clock));
        if mode == Mode::Cluster {
            sys.start_service("runtime-registry", &clock_env(&clock));
        }
        // Down for five minutes: the latest missed tick runs once, the older are skipped.
        set_clock(&clock, base + TimeDelta::seconds(6 * 60 + 10));
        let ws = has_ticks(&sys, &box_id, &[base, base + TimeDelta::minutes(1), base + TimeDelta::minutes(6)]);
        assert_eq!(ws.len(), 3, "{mode:?}: no burst");

        // A config edit of trigger_schedule takes effect at the next tick: yearly, the Box
        // misses the next minutes (a second scheduled Box shows the loop saw them) ...
        let yearly = schedule(&sys, &box_id, "0 0 1 1 *");
        assert_eq!(yearly.status, 200, "{mode:?}: {}", yearly.raw);
        set_clock(&clock, base + TimeDelta::seconds(7 * 60 + 5));
        let other = scheduled_box(&sys, "hourly-check", "*/1 * * * *");
        has_ticks(&sys, &other, &[base + TimeDelta::minutes(7)]);
        assert_eq!(workers(&sys, &box_id).len(), 3, "{mode:?}: the edited schedule has no tick now");
        // ... and back to every minute, it runs at the next tick.
        assert_eq!(schedule(&sys, &box_id, "*/1 * * * *").status, 200, "{mode:?}");
        set_clock(&clock, base + TimeDelta::seconds(8 * 60 + 5));
        let minutes = [0, 1, 6, 8].map(|m| base + TimeDelta::minutes(m));
        has_ticks(&sys, &box_id, &minutes);

        // A stopped Box's schedule stops.
        let stop = sys.post(&format!("/api/v1/boxes/{box_id}/stop"), &sys.admin, &json!({}));
        assert_eq!(stop.status, 200, "{}", stop.raw);
        set_clock(&clock, base + TimeDelta::seconds(9 * 60 + 5));
        has_ticks(&sys, &other, &[7, 8, 9].map(|m| base + TimeDelta::minutes(m)));
        assert_eq!(workers(&sys, &box_id).len(), 4, "{mode:?}: a stopped Box is not scheduled");
        drop(sys);
    }
}
