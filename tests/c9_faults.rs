//! The C9 flow when things go wrong (R-APPROVE-7, R-BOX-1, R-AUDIT-5): the approval
//! process killed between its steps, and approval tokens that do not verify.

use std::time::Duration;

use atasira_domain::aggregates::draft::DraftEvent;
use atasira_domain::token::{ApprovalSigner, ApprovalToken};
use atasira_tests::fixtures::minimal_draft_body;
use atasira_tests::harness::{Hold, Mode, System, in_both_modes};
use serde_json::json;

#[test]
fn an_approval_killed_between_its_steps_is_completed_by_a_retry() {
    // R-APPROVE-6, R-APPROVE-7: SIGKILL after the reservation and after the decision; a
    // retried approve ends in exactly one Box, one approval event and a valid audit chain.
    let mut sys = System::start(Mode::Cluster);
    sys.kill("serve gateway");
    // A short service timeout, so the request to the killed process fails fast.
    let env = [("ATASIRA_REQUEST_TIMEOUT", "4".to_owned())];
    sys.start_gateway(&env);
    let mut drafts = Vec::new();
    for (i, failpoint) in ["approval-after-reservation", "approval-after-decision"].into_iter().enumerate() {
        let id = sys.draft(&minimal_draft_body(&format!("crash-{i}")));
        sys.kill("serve approval");
        sys.start_service("approval", &[("ATASIRA_FAILPOINT", failpoint.to_owned())]);
        let interrupted = sys.approve(&id, &sys.admin.clone(), false);
        assert!(interrupted.status == 503 || interrupted.status == 0, "{failpoint}: {}", interrupted.raw);
        assert!(sys.proc("serve approval").wait_exit(Duration::from_secs(10)).is_some(), "{failpoint} killed the process");
        sys.kill("serve approval");
        sys.start_service("approval", &[]);
        let retried = sys.approve(&id, &sys.admin.clone(), false);
        assert_eq!((retried.status, retried.body["status"].as_str()), (200, Some("active")), "{failpoint}: {}", retried.raw);
        drafts.push(id);
    }
    let boxes = sys.get("/api/v1/boxes", &sys.admin).body["boxes"].as_array().cloned().unwrap_or_default();
    assert_eq!(boxes.len(), 2, "{boxes:?}");
    for id in &drafts {
        let approvals = sys.sql_i64(&format!("SELECT COUNT(*) FROM events WHERE aggregate_id = '{id}' AND event_type = 'DraftApproved'"));
        assert_eq!(approvals, 1, "one approval event for {id}");
    }
    let verify = sys.get("/api/v1/audit/verify", &sys.admin);
    assert_eq!(verify.body["ok"], true, "{}", verify.raw);
}

/// Appends a forged `DraftApproved` straight into the store, as an attacker with database
/// access (or a bug) would; the registry must refuse to activate on it.
fn forge(sys: &System, draft_id: &str, token: ApprovalToken) {
    let event = DraftEvent::DraftApproved {
        draft_id: draft_id.into(),
        box_type: token.claims.box_type.clone(),
        approved_by: "mallory".into(),
        approved_at: chrono::Utc::now(),
        confirm_over_limit: false,
        token,
    };
    sys.append_raw_event("draft", draft_id, 2, "DraftApproved", &serde_json::to_string(&event).expect("json"));
}

fn approval_key(sys: &System) -> [u8; 32] {
    let hex_key = match sys.mode {
        Mode::Embedded => std::fs::read_to_string(sys.data_dir().join("keys/approval.key")).expect("embedded approval key"),
        Mode::Cluster => "a1".repeat(32),
    };
    hex::decode(hex_key.trim()).expect("hex").try_into().expect("32 bytes")
}

#[test]
fn a_forged_approval_token_never_activates_a_box_and_leaves_a_security_violation() {
    // R-BOX-1, R-APPROVE-4, R-AUDIT-5
    in_both_modes(|sys| {
        let manifest_digest = |id: &str| -> String {
            let d = sys.get(&format!("/api/v1/boxes/box-drafts/{id}"), &sys.admin);
            let manifest: atasira_domain::BoxManifest = serde_json::from_value(d.body["manifest"].clone()).expect("manifest");
            manifest.digest()
        };
        let now = chrono::Utc::now();
        let real = ApprovalSigner::from_secret("approval-1".into(), approval_key(sys));
        let wrong = ApprovalSigner::from_secret("approval-1".into(), [7; 32]);

        let a = sys.draft(&minimal_draft_body("forged-key"));
        forge(sys, &a, wrong.issue(&a, "forged-key", &manifest_digest(&a), "mallory", now));
        let b = sys.draft(&minimal_draft_body("forged-digest"));
        forge(sys, &b, real.issue(&b, "forged-digest", "sha256:0000", "mallory", now));
        let c = sys.draft(&minimal_draft_body("forged-late"));
        forge(sys, &c, real.issue(&c, "forged-late", &manifest_digest(&c), "mallory", now - chrono::TimeDelta::hours(1)));
        sys.notify_store_changed();

        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let violations = loop {
            let rows = sys.get("/api/v1/audit?action=security_violation", &sys.admin).body["rows"].as_array().cloned().unwrap_or_default();
            if rows.len() >= 3 || std::time::Instant::now() > deadline {
                break rows;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let targets: std::collections::BTreeSet<&str> = violations.iter().filter_map(|r| r["target"].as_str()).collect();
        assert_eq!(targets, [a.as_str(), b.as_str(), c.as_str()].into_iter().collect(), "{violations:?}");
        assert_eq!(sys.get("/api/v1/boxes", &sys.admin).body["boxes"], json!([]), "no Box for a forged token");
        for bt in ["forged-key", "forged-digest", "forged-late"] {
            assert!(!sys.data_dir().join(format!("manifests/{bt}.yaml")).exists());
        }
        // A genuine approval still works afterwards.
        let ok = sys.draft(&minimal_draft_body("genuine"));
        assert_eq!(sys.approve(&ok, &sys.admin, false).status, 200);
    });
}

#[test]
fn a_losing_approve_does_not_release_the_winners_reservation() {
    // R-APPROVE-7 (2), R-BOX-3: two admins approve one draft; the loser must not give back
    // the reservation the winner's activation needs, or a third approval could take the
    // last slot and leave an approved draft without a Box. The test holds the winner's
    // activation until the loser has answered and the third approval has been tried.
    let hold = Hold::new("activation");
    let sys = System::start_with(Mode::Embedded, &[hold.setting()]);
    for bt in ["one", "two"] {
        let id = sys.draft(&minimal_draft_body(bt));
        assert_eq!(sys.approve(&id, &sys.admin, false).status, 200);
    }
    let contested = sys.draft(&minimal_draft_body("contested"));
    let competitor = sys.draft(&minimal_draft_body("competitor"));
    let alice = sys.token("alice", "admin", "human");
    let bob = sys.token("bob", "admin", "human");
    hold.arm();
    let (winner, third) = std::thread::scope(|s| {
        let a = s.spawn(|| sys.approve(&contested, &alice, false));
        let b = s.spawn(|| sys.approve(&contested, &bob, false));
        // The decision is recorded and its activation held: the winner waits for it, the
        // loser answers (after giving back, or not, the reservation).
        hold.wait_reached(Duration::from_secs(30));
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !a.is_finished() && !b.is_finished() {
            assert!(std::time::Instant::now() < deadline, "the losing approve did not answer");
            std::thread::sleep(Duration::from_millis(5));
        }
        let third = sys.approve(&competitor, &sys.admin, false);
        hold.release();
        let answers = [a.join().expect("thread"), b.join().expect("thread")];
        (answers.into_iter().find(|x| x.status == 200).expect("one approve wins"), third)
    });
    assert_eq!(
        (third.status, third.body["error"].as_str()),
        (409, Some("box_limit_reached")),
        "the contested draft's reservation still holds the slot: {}",
        third.raw
    );
    assert_eq!(winner.body["status"], "active", "{}", winner.raw);
    let boxes = sys.get("/api/v1/boxes", &sys.admin).body["boxes"].as_array().cloned().unwrap_or_default();
    assert!(boxes.iter().any(|b| b["box_type"] == "contested"), "{boxes:?}");
    assert_eq!(boxes.len(), 3);
}
