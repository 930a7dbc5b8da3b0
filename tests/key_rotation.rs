//! Key rotation in cluster mode (issue 8, item 6): each key setting holds a current key and
//! retired ones (verify only); `atasira keys rotate` prints the next setting and the
//! affected processes restart with it. Audit: rows MACed before and after verify.
//! Approval: the approval service publishes its keys in the store and the registry learns
//! the new key from there without a restart; a key dropped from the setting stays
//! published, so what it signed still verifies. Assertion keys: each signing process
//! draws and publishes its own; a restarted gateway's new key needs no service restart.

use std::time::{Duration, Instant};

use atasira_domain::aggregates::draft::DraftEvent;
use atasira_domain::token::ApprovalSigner;
use atasira_tests::fixtures::draft_body;
use atasira_tests::harness::{Mode, System};
use serde_json::{Value, json};

/// `(id, hex)` of each key of a setting, current first.
fn keys_of(setting: &str) -> Vec<(String, String)> {
    setting.split(',').map(|e| e.split_once(':').map(|(id, hex)| (id.to_owned(), hex.to_owned())).expect("ID:HEX")).collect()
}

/// `atasira keys rotate --kind KIND FLAG PRESENT`: the new setting. Its secrets go to
/// stdout alone; stderr says what to do and names key ids only.
fn rotate(sys: &System, kind: &str, flag: &str, present: &str) -> String {
    let (code, out, err) = sys.cli(&["keys", "rotate", "--kind", kind, flag, present]);
    assert_eq!(code, 0, "keys rotate failed: {err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "keys rotate prints the setting alone: {out:?}");
    let next = lines[0].to_owned();
    for (id, hex) in keys_of(&next) {
        assert!(!err.contains(&hex), "keys rotate put the secret of {id} on stderr: {err}");
    }
    next
}

/// The audit rows' key ids, once there are `n` rows.
fn audit_key_ids(sys: &System, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let a = sys.get("/api/v1/audit?limit=500", &sys.admin);
        let rows = a.body["rows"].as_array().cloned().unwrap_or_default();
        if a.status == 200 && rows.len() >= n {
            return rows.iter().map(|r| r["key_id"].as_str().unwrap_or_default().to_owned()).collect();
        }
        assert!(Instant::now() < deadline, "the ledger never had {n} rows; last answer {}: {}", a.status, a.raw);
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn audit_verify(sys: &System, setting: &str) -> (i32, Value) {
    let mut args = vec!["audit", "verify", "--audit-key", setting];
    let target = sys.target_args();
    args.extend(target.iter().map(String::as_str));
    let (code, out, err) = sys.cli(&args);
    (code, serde_json::from_str(out.trim()).unwrap_or_else(|_| panic!("audit verify printed no JSON: {out} {err}")))
}

/// Stops a service gracefully (its final work done) and forgets its process.
fn stop(sys: &mut System, service: &str) {
    let name = format!("serve {service}");
    sys.proc(&name).interrupt();
    sys.kill(&name);
}

fn approve_active(sys: &System, draft_id: &str) -> Value {
    let a = sys.approve(draft_id, &sys.admin, false);
    assert_eq!(a.status, 200, "{}", a.raw);
    assert_eq!(a.body["status"], "active", "{}", a.raw);
    a.body
}

/// How many recorded events of `event_type` carry `"key_id":"<id>"` in their payload.
fn events_with_key(sys: &System, event_type: &str, id: &str) -> i64 {
    sys.sql_i64(&format!("SELECT count(*) FROM events WHERE event_type = '{event_type}' AND payload::text ~ '\"key_id\": *\"{id}\"'"))
}

#[test]
fn rotating_the_audit_key_keeps_rows_and_checkpoints_of_the_old_key_verifiable() {
    // given a cluster whose audit key is a bare hex key (id audit-1), with a row and a
    // checkpoint MACed by it (a graceful stop records the checkpoint)
    let mut sys = System::start(Mode::Cluster);
    let old = "b2".repeat(32);
    // (rows 1 and 2: the issue of the admin's and the agent's tokens)
    sys.draft(&draft_body("before-rotation"));
    assert_eq!(audit_key_ids(&sys, 3), ["audit-1"; 3]);
    stop(&mut sys, "audit");
    assert_eq!(events_with_key(&sys, "AuditCheckpoint", "audit-1"), 1);
    // when the key is rotated and the audit service starts with the new setting
    let next = rotate(&sys, "audit", "--audit-key", &old);
    let keys = keys_of(&next);
    assert_eq!(keys.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), ["audit-2", "audit-1"]);
    assert_eq!(keys[1].1, old, "the present key is kept, retired");
    sys.start_service("audit", &[("ATASIRA_AUDIT_KEY", next.clone())]);
    sys.draft(&draft_body("after-rotation"));
    // then new rows carry the new key id, and the whole ledger verifies: through the API
    // and with `atasira audit verify`, before and after the new key's checkpoint
    assert_eq!(audit_key_ids(&sys, 4), ["audit-1", "audit-1", "audit-1", "audit-2"]);
    assert_eq!(sys.get("/api/v1/audit/verify", &sys.admin).body, json!({"ok": true, "rows": 4}));
    assert_eq!(audit_verify(&sys, &next), (0, json!({"ok": true, "rows": 4})));
    stop(&mut sys, "audit");
    assert_eq!(events_with_key(&sys, "AuditCheckpoint", "audit-2"), 1);
    assert_eq!(audit_verify(&sys, &next), (0, json!({"ok": true, "rows": 4})));
    // and it is the retired key that keeps the old row verifiable: without it, row 1 breaks
    let new_only = format!("audit-2:{}", keys[0].1);
    let (code, broken) = audit_verify(&sys, &new_only);
    assert_eq!((code, &broken["first_bad_seq"]), (1, &json!(1)), "{broken}");
    assert!(broken["reason"].as_str().unwrap_or_default().contains("audit-1"), "{broken}");
}

#[test]
fn rotating_the_approval_key_needs_no_registry_restart() {
    // given a cluster whose approval key is a bare hex key (id approval-1), with a Box
    // approved under it
    let mut sys = System::start(Mode::Cluster);
    let before = sys.draft(&draft_body("approved-before"));
    approve_active(&sys, &before);
    // when only the approval service restarts, with the rotated setting
    let next = rotate(&sys, "approval", "--approval-key", &"a1".repeat(32));
    assert_eq!(keys_of(&next).iter().map(|(id, _)| id.clone()).collect::<Vec<_>>(), ["approval-2", "approval-1"]);
    sys.kill("serve approval");
    sys.start_service("approval", &[("ATASIRA_APPROVAL_KEY", next)]);
    // then the approval service published the new key, and the old one only once (its
    // restart found it published)
    assert_eq!(published(&sys), (1, 1));
    // and an approval signed with the new key activates its Box: the registry, never
    // restarted, read the new public key from the store when the token named it
    let after = sys.draft(&draft_body("approved-after"));
    let approved = approve_active(&sys, &after);
    assert_eq!((events_with_key(&sys, "DraftApproved", "approval-1"), events_with_key(&sys, "DraftApproved", "approval-2")), (1, 1));
    let boxes = sys.get("/api/v1/boxes", &sys.admin);
    let types: Vec<&str> = boxes.body["boxes"].as_array().expect("boxes").iter().filter_map(|b| b["box_type"].as_str()).collect();
    assert!(types.contains(&"approved-before") && types.contains(&"approved-after"), "{}", boxes.raw);
    assert!(approved["box_id"].is_string());
    assert_eq!(sys.get("/api/v1/audit/verify", &sys.admin).body["ok"], true);
}

/// How many `ApprovalKeyPublished` events the store holds for approval-1 and approval-2.
fn published(sys: &System) -> (i64, i64) {
    (events_with_key(sys, "ApprovalKeyPublished", "approval-1"), events_with_key(sys, "ApprovalKeyPublished", "approval-2"))
}

#[test]
fn an_approval_key_dropped_from_the_setting_keeps_verifying_what_it_signed() {
    // given a cluster whose approval service published approval-1, then restarted
    // with only approval-2 (approval-1 dropped from the setting, not just retired), and a
    // registry restarted after it, so its keyring is read afresh
    let mut sys = System::start(Mode::Cluster);
    let old = "a1".repeat(32);
    let next = rotate(&sys, "approval", "--approval-key", &old);
    let new_only = next.split(',').next().expect("the new key").to_owned();
    sys.kill("serve approval");
    sys.start_service("approval", &[("ATASIRA_APPROVAL_KEY", new_only)]);
    sys.kill("serve runtime-registry");
    sys.start_service("runtime-registry", &[]);
    // then approval-1 is still published: dropping a key from the setting withdraws nothing
    assert_eq!(published(&sys), (1, 1));
    // when a decision approval-1 signed reaches a draft's stream (recorded before the drop,
    // activated only now; written into the store as approval would have)
    let id = sys.draft(&draft_body("signed-before-the-drop"));
    let d = sys.get(&format!("/api/v1/boxes/box-drafts/{id}"), &sys.admin);
    let manifest: atasira_domain::BoxManifest = serde_json::from_value(d.body["manifest"].clone()).expect("manifest");
    let key: [u8; 32] = hex::decode(&old).expect("hex").try_into().expect("32 bytes");
    let token = ApprovalSigner::from_secret("approval-1".into(), key).issue(&id, "signed-before-the-drop", &manifest.digest(), "admin", chrono::Utc::now());
    let event = DraftEvent::DraftApproved {
        draft_id: id.clone(),
        box_type: "signed-before-the-drop".into(),
        approved_by: "admin".into(),
        approved_at: chrono::Utc::now(),
        confirm_over_limit: false,
        token,
    };
    sys.append_raw_event("draft", &id, 2, "DraftApproved", &serde_json::to_string(&event).expect("json"));
    // then its Box is activated: the registry verified the token with the published key
    // (it used to forget a key the approval service stopped listing, and refuse the token)
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let b = sys.get("/api/v1/boxes", &sys.admin);
        if b.body["boxes"].as_array().is_some_and(|l| l.iter().any(|x| x["box_type"] == "signed-before-the-drop")) {
            break;
        }
        assert!(Instant::now() < deadline, "the approval signed by the dropped key never activated: {}", b.raw);
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(sys.sql_i64("SELECT count(*) FROM events WHERE event_type = 'SecurityViolation'"), 0);
}

/// The assertion keys published in the store under `aggregate_type`.
fn published_keys(sys: &System, aggregate_type: &str) -> i64 {
    sys.sql_i64(&format!("SELECT count(*) FROM events WHERE aggregate_type = '{aggregate_type}' AND event_type = 'AssertionKeyPublished'"))
}

#[test]
fn each_signing_process_publishes_a_key_of_its_own_and_a_new_gateway_key_needs_no_service_restart() {
    // R-ARCH-13: given a cluster; each process that signs assertions published its own
    // public key, and no process holds a shared secret (there is no setting for one)
    let mut sys = System::start(Mode::Cluster);
    for signer in ["gateway_assertion_keys", "approval_assertion_keys", "registry_assertion_keys"] {
        assert_eq!(published_keys(&sys, signer), 1, "{signer}");
    }
    let first = sys.draft(&draft_body("first"));
    // when the gateway restarts (a new process draws and publishes a new key)
    sys.kill("serve gateway");
    sys.start_gateway(&[]);
    assert_eq!(published_keys(&sys, "gateway_assertion_keys"), 2);
    // then the services, not restarted, learn it from the store: drafts and approvals work
    let second = sys.draft(&draft_body("second"));
    approve_active(&sys, &first);
    approve_active(&sys, &second);
    assert_eq!(sys.sql_i64("SELECT count(*) FROM events WHERE event_type = 'SecurityViolation'"), 0);
    // and the gateway's key speaks for the gateway only: an assertion it signed for the
    // approval service's subject is refused there when approval's identity sends it
    let reserve = atasira_contracts::v1::ReleaseReservation { box_type: "first".into(), draft_id: first.clone(), reason: "forged".into() };
    let subject = atasira_contracts::subjects::request("approval", "runtime-registry");
    let env = sys.gateway_signed(&subject, &reserve, "not-approvals");
    let refused = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(async {
        use prost::Message as _;
        let options = sys.nats_options("approval");
        let client = options.connect(sys.nats_url()).await.expect("connects as approval");
        let reply = client.request(subject.clone(), env.encode_to_vec().into()).await.expect("a reply");
        atasira_contracts::decode_reply::<atasira_contracts::v1::Ack>(&reply.payload).expect("decodes").expect_err("refused")
    });
    // (the registry looks the key up among approval's published keys only)
    assert_eq!(refused.message, "invalid principal assertion: unknown_key_id", "{refused}");
}
