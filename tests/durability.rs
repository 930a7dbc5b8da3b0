//! No lost events (R-ARCH-6): a crash right after a commit, and NATS being down while
//! events are committed, still end with every event in every projection.

use std::collections::HashMap;
use std::time::Duration;

use atasira_domain::aggregates::draft::{Draft, DraftCommand};
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::store::Db;
use atasira_tests::harness::{Mode, System, http, in_both_modes};
use serde_json::json;

#[test]
fn a_service_killed_right_after_a_commit_loses_no_event() {
    // R-ARCH-6: the drafts service aborts (like SIGKILL) after committing, before replying
    // and before its relay or projection ran; restarted, it delivers the event.
    in_both_modes(|sys| {
        let failpoint = [("ATASIRA_FAILPOINT", "drafts-after-commit".to_owned())];
        match sys.mode {
            Mode::Embedded => {
                sys.restart_with(&failpoint);
            }
            Mode::Cluster => {
                sys.kill("serve drafts");
                sys.start_drafts(&failpoint);
            }
        }
        let body = json!({"box_type": "crash", "purpose": "p", "tools": ["Read"]}).to_string();
        let answer = http("POST", &sys.url("/api/v1/boxes/box-drafts"), Some(&sys.agent.clone()), &[], Some(body.as_bytes()));
        assert!(answer.status >= 500 || answer.status == 0, "the crash interrupts the answer: {}", answer.raw);
        let dead = match sys.mode {
            Mode::Embedded => sys.proc("atasira dev").wait_exit(Duration::from_secs(10)),
            Mode::Cluster => sys.proc("serve drafts").wait_exit(Duration::from_secs(10)),
        };
        assert!(dead.is_some(), "the failpoint ended the process");
        match sys.mode {
            Mode::Embedded => sys.restart(),
            Mode::Cluster => {
                sys.kill("serve drafts");
                sys.start_drafts(&[]);
            }
        }
        let pending = sys.eventually_pending(Duration::from_secs(20), |l| l.len() == 1);
        assert_eq!(pending[0]["box_type"], "crash");
    });
}

#[test]
fn an_event_committed_while_nats_is_down_is_delivered_when_it_is_back() {
    // R-ARCH-6, R-ARCH-7: the relay keeps the event until JetStream acknowledges it.
    let mut sys = System::start(Mode::Cluster);
    assert_eq!(sys.post("/api/v1/boxes/box-drafts", &sys.agent.clone(), &json!({"box_type": "before", "purpose": "p"})).status, 201);
    sys.nats().down();
    let url = sys.database_url();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let db = Db::connect(&url).await.expect("database");
        let plan = BoxDraftCreateRequest::from_value(json!({"box_type": "while-down", "purpose": "p"})).and_then(|r| r.plan()).expect("plan");
        let command = DraftCommand::Submit {
            draft_id: "d-while-down".into(),
            plan,
            requested_by: Principal::new("agent", Role::Member, Kind::Agent),
            at: chrono::Utc::now(),
        };
        db.cqrs::<Draft>().execute("d-while-down", command, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("committed while NATS is down");
    });
    std::thread::sleep(Duration::from_millis(700));
    sys.nats().up();
    let pending = sys.eventually_pending(Duration::from_secs(30), |l| l.len() == 2);
    assert!(pending.iter().any(|d| d["draft_id"] == "d-while-down"), "{pending:?}");
}
