//! Live updates for the dashboard (R-UI-1, R-BOX-9): `GET /api/v1/events/stream` announces,
//! as server-sent events, that the read models changed; a read right after an announcement
//! sees the change. In both modes: embedded (the in-process bell) and cluster (a commit in
//! another process reaches the gateway by PostgreSQL's `LISTEN`).

use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::Duration;

use atasira_tests::harness::{Mode, System, http};
use serde_json::{Value, json};

/// The server-sent events of one stream, `(event, data)`, read on a thread.
struct Events(mpsc::Receiver<(String, String)>);

impl Events {
    fn open(sys: &System, token: &str) -> Events {
        let response = ureq::get(&sys.url("/api/v1/events/stream")).set("Authorization", &format!("Bearer {token}")).call().expect("the stream opens");
        assert_eq!(response.status(), 200);
        assert_eq!(response.header("content-type"), Some("text/event-stream"));
        let reader = BufReader::new(response.into_reader());
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut event = String::new();
            for line in reader.lines() {
                let Ok(line) = line else { return };
                if let Some(name) = line.strip_prefix("event: ") {
                    event = name.to_owned();
                } else if let Some(data) = line.strip_prefix("data: ")
                    && tx.send((std::mem::take(&mut event), data.to_owned())).is_err()
                {
                    return;
                }
            }
        });
        Events(rx)
    }

    /// The next event named `name` (others are skipped); panics when none comes.
    fn next(&self, name: &str) -> Value {
        loop {
            let (event, data) = self.0.recv_timeout(Duration::from_secs(30)).unwrap_or_else(|e| panic!("no `{name}` event came: {e}"));
            if event == name {
                return serde_json::from_str(&data).expect("event data is JSON");
            }
        }
    }

    /// The next `changed` event whose topics include `topic`.
    fn changed(&self, topic: &str) -> Value {
        loop {
            let change = self.next("changed");
            if change["topics"].as_array().expect("topics").iter().any(|t| t == topic) {
                return change;
            }
        }
    }
}

fn scenario(mode: Mode) {
    let mut sys = System::start(mode);

    // Without a token there is no stream.
    let refused = http("GET", &sys.url("/api/v1/events/stream"), None, &[], None);
    assert_eq!(refused.status, 401, "{}", refused.raw);
    assert_eq!(refused.body["error"], "unauthenticated", "{}", refused.raw);

    // An agent listens; the dashboard of an admin would too.
    let events = Events::open(&sys, &sys.agent);
    let ready = events.next("ready");
    let start = ready["position"].as_i64().expect("position");
    assert_eq!(ready["topics"], json!(["drafts", "boxes", "workers", "audit"]), "the first event is a StreamChange as documented: {ready}");

    // A draft: the pending list changed, and reading it right after the announcement shows it.
    let draft_id = sys.draft(&json!({"box_type": "live-stream", "purpose": "watch the stream"}));
    let change = events.changed("drafts");
    assert!(change["position"].as_i64().expect("position") > start, "{change}");
    let pending = sys.get("/api/v1/boxes/box-drafts/pending", &sys.admin);
    assert!(pending.body["drafts"].as_array().expect("drafts").iter().any(|d| d["draft_id"] == draft_id.as_str()), "{}", pending.raw);

    // The approval: the Boxes view changed.
    let approved = sys.approve(&draft_id, &sys.admin, false);
    assert_eq!(approved.status, 200, "{}", approved.raw);
    let box_id = approved.body["box_id"].as_str().expect("box_id").to_owned();
    events.changed("boxes");
    let boxes = sys.get("/api/v1/boxes", &sys.admin);
    assert!(boxes.body["boxes"].as_array().expect("boxes").iter().any(|b| b["box_id"] == box_id.as_str()), "{}", boxes.raw);

    // A write no request of this stream's gateway waited for: an operator issues a token
    // straight into the store. The announcement comes only once the audit ledger has the
    // row, so the read right after it finds it.
    let issued = || {
        let rows = sys.get("/api/v1/audit?action=token.issue&limit=200", &sys.admin);
        assert_eq!(rows.status, 200, "{}", rows.raw);
        rows.body["rows"].as_array().expect("rows").len()
    };
    let before = issued();
    sys.token("live-stream-user", "member", "human");
    let position = if mode == Mode::Embedded { "rowid" } else { "global_position" };
    let written = sys.sql_i64(&format!("SELECT MAX({position}) FROM events"));
    // Announcements of earlier writes (the approval's last events) may come first.
    loop {
        let change = events.changed("audit");
        if change["position"].as_i64().expect("position") >= written {
            assert_eq!(issued(), before + 1, "announced at {change} but the ledger has no new row");
            break;
        }
    }

    // A stream does not hold the gateway's graceful stop open.
    let gateway = if mode == Mode::Embedded { "atasira dev" } else { "gateway" };
    let p = sys.proc(gateway);
    let _ = std::process::Command::new("kill").arg("-INT").arg(p.child_id().to_string()).status();
    assert!(p.wait_exit(Duration::from_secs(20)).is_some(), "the gateway did not stop while a stream was open");
}

#[test]
fn r_ui_1_the_stream_announces_drafts_and_boxes_once_readable_embedded() {
    scenario(Mode::Embedded);
}

#[test]
fn r_ui_1_the_stream_announces_drafts_and_boxes_once_readable_cluster() {
    scenario(Mode::Cluster);
}

#[test]
fn r_arch_15_a_user_holds_a_bounded_number_of_streams_open() {
    // given a user holding as many streams open as it may
    let sys = System::start(Mode::Embedded);
    let open: Vec<Events> = (0..8).map(|_| Events::open(&sys, &sys.agent)).collect();
    for events in &open {
        events.next("ready");
    }
    // when it opens one more; then 429, without holding anything
    let refused = http("GET", &sys.url("/api/v1/events/stream"), Some(&sys.agent), &[], None);
    assert_eq!((refused.status, refused.body["error"].as_str()), (429, Some("rate_limited")), "{}", refused.raw);
    assert!(refused.header("retry-after").is_some());
    // and another user still gets one
    Events::open(&sys, &sys.admin).next("ready");
}
