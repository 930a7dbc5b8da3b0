//! Retries after a gateway died mid-request (R-DRAFT-11, R-APPROVE-6): an Idempotency-Key
//! claim left unfinished is taken over once its lease ends, and the work done again answers
//! what the first run did: the same draft, the same decision, the same unassignment, never
//! a second draft or Box.

use std::time::Duration;

use atasira_tests::harness::{Answer, Mode, System, http, in_both_modes};
use serde_json::{Value, json};

/// A lease short enough for a test (the default outlasts any request: minutes).
fn short_lease() -> (&'static str, String) {
    ("ATASIRA_IDEMPOTENCY_LEASE", "1".to_owned())
}

fn kill_after_work() -> (&'static str, String) {
    ("ATASIRA_FAILPOINT", "gateway-after-work".to_owned())
}

/// Restarts the gateway (every process, embedded) with `env`.
fn restart_gateway(sys: &mut System, env: &[(&str, String)]) {
    match sys.mode {
        Mode::Embedded => sys.restart_with(env),
        Mode::Cluster => {
            sys.kill("serve gateway");
            sys.start_gateway(env);
        }
    }
}

/// Sends a request the failpoint kills after its work; waits until the gateway is dead.
fn killed_after_work(sys: &mut System, path: &str, token: &str, key: &str, body: &Value) {
    killed_after(sys, "POST", path, token, key, Some(body));
}

fn killed_after(sys: &mut System, method: &str, path: &str, token: &str, key: &str, body: Option<&Value>) {
    let body = body.map(Value::to_string);
    let answer = http(method, &sys.url(path), Some(token), &[("Idempotency-Key", key)], body.as_deref().map(str::as_bytes));
    assert!(answer.status == 0 || answer.status >= 500, "the gateway died before answering: {} {}", answer.status, answer.raw);
    let name = if sys.mode == Mode::Embedded { "atasira dev" } else { "serve gateway" };
    assert!(sys.proc(name).wait_exit(Duration::from_secs(10)).is_some(), "the failpoint ended the gateway");
}

fn post_keyed(sys: &System, path: &str, token: &str, key: &str, body: &Value) -> Answer {
    http("POST", &sys.url(path), Some(token), &[("Idempotency-Key", key)], Some(body.to_string().as_bytes()))
}

fn count(sys: &System, query: &str) -> i64 {
    sys.sql_i64(query)
}

#[test]
fn a_draft_submit_retried_after_its_gateway_died_answers_the_same_draft_once() {
    // R-DRAFT-11: the first run committed the draft; its gateway died before storing the
    // answer. Retries with the same key, after the claim's lease, take the claim over (one
    // of them), and every one answers the draft the first run made.
    in_both_modes(|sys| {
        let body = json!({"box_type": "retried", "purpose": "p", "tools": ["Read"]});
        let path = "/api/v1/boxes/box-drafts";
        let agent = sys.agent.clone();
        restart_gateway(sys, &[kill_after_work(), short_lease()]);
        killed_after_work(sys, path, &agent, "submit-1", &body);
        let drafts = "SELECT COUNT(*) FROM events WHERE aggregate_type = 'draft' AND event_type = 'DraftSubmitted'";
        assert_eq!(count(sys, drafts), 1, "the first run committed its draft");
        let first_id = sys.sql_text("SELECT aggregate_id FROM events WHERE aggregate_type = 'draft' AND event_type = 'DraftSubmitted'");

        if sys.mode == Mode::Cluster {
            // A gateway whose lease outlasts the wait: the claim may still be running, so
            // 503 with Retry-After, and nothing is done again.
            sys.kill("serve gateway");
            sys.start_gateway(&[("ATASIRA_IDEMPOTENCY_LEASE", "3600".to_owned())]);
            let waiting = post_keyed(sys, path, &agent, "submit-1", &body);
            assert_eq!((waiting.status, waiting.body["error"].as_str()), (503, Some("service_unavailable")), "{}", waiting.raw);
            assert!(waiting.body["message"].as_str().is_some_and(|m| m.contains("retry")), "{}", waiting.raw);
            let after: u64 = waiting.header("retry-after").and_then(|v| v.parse().ok()).expect("Retry-After");
            assert!(after >= 1, "{after}");
        }

        restart_gateway(sys, &[short_lease()]);
        let answers: Vec<Answer> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..3).map(|_| s.spawn(|| post_keyed(sys, path, &agent, "submit-1", &body))).collect();
            handles.into_iter().map(|h| h.join().expect("thread")).collect()
        });
        for a in &answers {
            assert_eq!(a.status, 201, "{}", a.raw);
            assert_eq!(a.body["draft_id"].as_str(), Some(first_id.as_str()), "{}", a.raw);
            assert_eq!(a.body["status"], "pending_approval");
            assert_eq!(a.body["box_type"], "retried");
            assert!(a.header("x-atasira-position").is_some(), "read-your-writes: {}", a.raw);
        }
        assert_eq!(count(sys, drafts), 1, "no second draft");
        let took_over = sys
            .stderr_of(if sys.mode == Mode::Embedded { "atasira dev" } else { "serve gateway" })
            .concat()
            .matches("took over an Idempotency-Key claim")
            .count();
        assert_eq!(took_over, 1, "one retry took the abandoned claim over; the others waited for its answer");
        // the answer is the draft, readable at once
        let mine = sys.get(&format!("{path}/{first_id}"), &agent);
        assert_eq!((mine.status, mine.body["status"].as_str()), (200, Some("pending_approval")), "{}", mine.raw);
        // and stored now: the next retry is a replay
        let again = post_keyed(sys, path, &agent, "submit-1", &body);
        assert_eq!((again.status, again.header("idempotent-replayed")), (201, Some("true")), "{}", again.raw);
        assert_eq!(again.body["draft_id"].as_str(), Some(first_id.as_str()));
        // the same key with another draft is still refused
        let other = post_keyed(sys, path, &agent, "submit-1", &json!({"box_type": "other", "purpose": "p", "tools": ["Read"]}));
        assert_eq!((other.status, other.body["error"].as_str()), (422, Some("idempotency_key_reuse")), "{}", other.raw);
    });
}

#[test]
fn an_approve_and_an_unassign_retried_after_their_gateway_died_answer_as_the_first_run_did() {
    // R-APPROVE-6: the first approve activated the Box; its gateway died before storing
    // the answer. The retry with the same key, after the lease, answers the same decision.
    in_both_modes(|sys| {
        let draft_id = sys.draft(&json!({"box_type": "approved-once", "purpose": "p", "tools": ["Read"]}));
        let admin = sys.admin.clone();
        let path = format!("/api/v1/boxes/box-drafts/{draft_id}/approve");
        let body = json!({"confirm_over_limit": false});
        restart_gateway(sys, &[kill_after_work(), short_lease()]);
        killed_after_work(sys, &path, &admin, "approve-1", &body);
        let activated = "SELECT COUNT(*) FROM events WHERE aggregate_type = 'box' AND event_type = 'BoxActivated'";
        assert_eq!(count(sys, activated), 1, "the first run activated the Box");

        restart_gateway(sys, &[short_lease()]);
        let retried = post_keyed(sys, &path, &admin, "approve-1", &body);
        assert_eq!(retried.status, 200, "{}", retried.raw);
        assert_eq!(retried.body["draft_id"].as_str(), Some(draft_id.as_str()));
        assert_eq!(retried.body["status"], "active", "{}", retried.raw);
        let box_id = retried.body["box_id"].as_str().expect("box_id").to_owned();
        assert_eq!(count(sys, activated), 1, "no second Box");
        assert_eq!(count(sys, "SELECT COUNT(*) FROM events WHERE aggregate_type = 'draft' AND event_type = 'DraftApproved'"), 1, "one decision");
        let got = sys.get(&format!("/api/v1/boxes/{box_id}"), &admin);
        assert_eq!(got.status, 200, "{}", got.raw);
        // the same answer again, now stored
        let again = post_keyed(sys, &path, &admin, "approve-1", &body);
        assert_eq!((again.status, again.header("idempotent-replayed")), (200, Some("true")), "{}", again.raw);
        assert_eq!(again.body, retried.body);
        // another admin still gets 409
        let other = sys.token("carol", "admin", "human");
        let theirs = post_keyed(sys, &path, &other, "approve-1", &body);
        assert_eq!((theirs.status, theirs.body["error"].as_str()), (409, Some("draft_not_pending")), "{}", theirs.raw);

        // An unassign run again answers the Box, not `assignment_not_found`: the first run
        // recorded its key with the event.
        let assigned = sys.post(&format!("/api/v1/boxes/{box_id}/user-assignments"), &admin, &json!({"user_id": "erin", "role_in_box": "member"}));
        assert_eq!(assigned.status, 200, "{}", assigned.raw);
        let erin = format!("/api/v1/boxes/{box_id}/user-assignments/erin");
        restart_gateway(sys, &[kill_after_work(), short_lease()]);
        killed_after(sys, "DELETE", &erin, &admin, "unassign-1", None);
        restart_gateway(sys, &[short_lease()]);
        let unassigned = http("DELETE", &sys.url(&erin), Some(&admin), &[("Idempotency-Key", "unassign-1")], None);
        assert_eq!(unassigned.status, 200, "{}", unassigned.raw);
        assert_eq!(unassigned.body["assignments"], json!([]), "{}", unassigned.raw);
        assert!(unassigned.header("x-atasira-position").is_some(), "{:?}", unassigned.headers);
        let unassigns = "SELECT COUNT(*) FROM events WHERE aggregate_type = 'box' AND event_type = 'BoxUserUnassigned'";
        assert_eq!(count(sys, unassigns), 1);
        // another key is another request: erin is not assigned
        let other_key = http("DELETE", &sys.url(&erin), Some(&admin), &[("Idempotency-Key", "unassign-2")], None);
        assert_eq!((other_key.status, other_key.body["error"].as_str()), (404, Some("assignment_not_found")), "{}", other_key.raw);
    });
}

#[test]
fn an_idempotency_key_is_honoured_for_24_hours_and_then_forgotten() {
    // R-DRAFT-11, R-ARCH-15: within 24 h the same key answers the first answer (another body
    // is 422); once its answer is older than that, the key names a new request.
    in_both_modes(|sys| {
        let approved = sys.approve(&sys.draft(&json!({"box_type": "keyed-for-a-day", "purpose": "p", "tools": ["Read"]})), &sys.admin, false);
        assert_eq!(approved.status, 200, "{}", approved.raw);
        let path = format!("/api/v1/boxes/{}/user-assignments", approved.body["box_id"].as_str().expect("box_id"));
        let carol = json!({"user_id": "carol", "role_in_box": "member"});
        let dave = json!({"user_id": "dave", "role_in_box": "member"});
        assert_eq!(post_keyed(sys, &path, &sys.admin, "assign-1", &carol).status, 200);
        let again = post_keyed(sys, &path, &sys.admin, "assign-1", &carol);
        assert_eq!((again.status, again.header("idempotent-replayed")), (200, Some("true")), "{}", again.raw);
        let reuse = post_keyed(sys, &path, &sys.admin, "assign-1", &dave);
        assert_eq!((reuse.status, reuse.body["error"].as_str()), (422, Some("idempotency_key_reuse")), "{}", reuse.raw);

        // A day and a moment later (the stored answer's time moved back, as the clock would)
        sys.sql("UPDATE gateway_idempotency SET created_at_ms = created_at_ms - 86400001 WHERE idem_key = 'assign-1'");
        let fresh = post_keyed(sys, &path, &sys.admin, "assign-1", &dave);
        assert_eq!((fresh.status, fresh.header("idempotent-replayed")), (200, None), "a new request: {}", fresh.raw);
        let users: Vec<&str> = fresh.body["assignments"].as_array().expect("assignments").iter().filter_map(|a| a["user_id"].as_str()).collect();
        assert!(users.contains(&"dave") && users.contains(&"carol"), "{users:?}");
        let replayed = post_keyed(sys, &path, &sys.admin, "assign-1", &dave);
        assert_eq!((replayed.status, replayed.header("idempotent-replayed")), (200, Some("true")), "its answer is the one kept now: {}", replayed.raw);
    });
}
