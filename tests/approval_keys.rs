//! Keys and decisions come from the store (R-ARCH-11, R-APPROVE-4, R-APPROVE-7, R-BOX-1):
//! the registry verifies approval tokens with the public keys the approval service
//! published as events, never with keys some NATS responder offers; it activates only on a
//! `DraftApproved` the draft's own stream holds; and a replayed approval of an archived Box
//! changes nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use atasira_contracts::{subjects, v1};
use atasira_domain::aggregates::draft::DraftEvent;
use atasira_domain::token::{ApprovalSigner, ApprovalToken};
use atasira_tests::fixtures::minimal_draft_body;
use atasira_tests::harness::{Mode, System, creds_seed, nats_tls};
use futures::StreamExt as _;
use prost::Message as _;
use serde_json::{Value, json};

/// The digest of a draft's manifest, as the approval service signs it.
fn manifest_digest(sys: &System, draft_id: &str) -> String {
    let d = sys.get(&format!("/api/v1/boxes/box-drafts/{draft_id}"), &sys.admin);
    let manifest: atasira_domain::BoxManifest = serde_json::from_value(d.body["manifest"].clone()).expect("manifest");
    manifest.digest()
}

fn approved(draft_id: &str, token: ApprovalToken) -> DraftEvent {
    DraftEvent::DraftApproved {
        draft_id: draft_id.into(),
        box_type: token.claims.box_type.clone(),
        approved_by: token.claims.approver.clone(),
        approved_at: chrono::Utc::now(),
        confirm_over_limit: false,
        token,
    }
}

/// The security violations the ledger shows whose target names `draft_id`, once there
/// is one (or none after a bound that is never reached when all is well).
fn violations_about(sys: &System, draft_id: &str) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = sys.get("/api/v1/audit?action=security_violation&limit=500", &sys.admin).body["rows"].as_array().cloned().unwrap_or_default();
        let about: Vec<Value> = rows.into_iter().filter(|r| r["target"].as_str().is_some_and(|t| t.contains(draft_id))).collect();
        if !about.is_empty() || Instant::now() > deadline {
            return about;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn box_types(sys: &System) -> Vec<String> {
    let boxes = sys.get("/api/v1/boxes", &sys.admin);
    boxes.body["boxes"].as_array().cloned().unwrap_or_default().iter().filter_map(|b| b["box_type"].as_str().map(str::to_owned)).collect()
}

/// The wire shape of the key request atasira once had (`GetApprovalKeys`): an impostor
/// answers it as the approval service would have.
#[derive(Clone, PartialEq, prost::Message)]
struct OfferedKey {
    #[prost(string, tag = "1")]
    key_id: String,
    #[prost(bytes = "vec", tag = "2")]
    ed25519: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct OfferedKeys {
    #[prost(message, repeated, tag = "1")]
    keys: Vec<OfferedKey>,
}

/// A process holding the approval identity's NATS credentials but another signing key: it
/// answers every request to the approval service with its own public key, and counts them.
struct Impostor {
    _runtime: tokio::runtime::Runtime,
    asked: Arc<AtomicUsize>,
}

impl Impostor {
    fn start(sys: &System, signer: &ApprovalSigner) -> Impostor {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().expect("runtime");
        let asked = Arc::new(AtomicUsize::new(0));
        let seed = creds_seed(&sys.nats_creds(subjects::APPROVAL));
        let url = sys.nats_url();
        let offer = OfferedKeys { keys: vec![OfferedKey { key_id: signer.key_id().to_owned(), ed25519: signer.public_key().public_key.to_vec() }] };
        let reply = atasira_contracts::reply_ok(&offer).encode_to_vec();
        let counter = asked.clone();
        runtime.block_on(async move {
            let options = nats_tls(async_nats::ConnectOptions::with_nkey(seed).custom_inbox_prefix(subjects::inbox_prefix(subjects::APPROVAL)));
            let client = options.connect(url).await.expect("the impostor connects with the approval credentials");
            let mut requests = client.subscribe(subjects::request("*", subjects::APPROVAL)).await.expect("subscribes");
            client.flush().await.expect("flush");
            tokio::spawn(async move {
                while let Some(request) = requests.next().await {
                    counter.fetch_add(1, Ordering::SeqCst);
                    if let Some(to) = request.reply {
                        let _ = client.publish(to, reply.clone().into()).await;
                    }
                }
            });
        });
        Impostor { _runtime: runtime, asked }
    }

    fn asked(&self) -> usize {
        self.asked.load(Ordering::SeqCst)
    }
}

#[test]
fn r_arch_11_an_impostor_offering_its_key_over_nats_cannot_get_a_forged_approval_activated() {
    // given a cluster whose approval service published its key (approval-1) at start, a
    // pending draft, the approval service gone, and an impostor with the approval identity's
    // NATS credentials answering key requests with its own key under the next id
    let mut sys = System::start(Mode::Cluster);
    let id = sys.draft(&minimal_draft_body("impostor-target"));
    sys.kill("serve approval");
    let forger = ApprovalSigner::from_secret("approval-2".into(), [9; 32]);
    let impostor = Impostor::start(&sys, &forger);
    // when an approval signed by the impostor's key reaches the draft's stream
    let token = forger.issue(&id, "impostor-target", &manifest_digest(&sys, &id), "mallory", chrono::Utc::now());
    sys.append_raw_event("draft", &id, 2, "DraftApproved", &serde_json::to_string(&approved(&id, token)).expect("json"));
    // then the registry refuses it as signed by a key the store does not hold: a security
    // violation, no Box, no manifest file; and it never asked anyone over NATS for keys
    let violations = violations_about(&sys, &id);
    assert_eq!(violations.len(), 1, "one violation for the forged approval: {violations:?}; Boxes: {:?}", box_types(&sys));
    let unknown_key = sys.sql_i64(&format!(
        "SELECT count(*) FROM events WHERE event_type = 'SecurityViolation' AND payload::text LIKE '%{id}%' AND payload::text LIKE '%unknown_key_id%'"
    ));
    assert_eq!(unknown_key, 1, "refused for its unknown key id");
    assert!(box_types(&sys).is_empty(), "no Box for a token by the impostor's key");
    assert!(!sys.data_dir().join("manifests/impostor-target.yaml").exists());
    assert_eq!(impostor.asked(), 0, "the registry asked the impostor for keys");
    // and, the impostor gone (it would answer the gateway's requests too), the genuine
    // approval service, back, still approves into an active Box
    drop(impostor);
    sys.start_service("approval", &[]);
    let genuine = sys.draft(&minimal_draft_body("genuine"));
    let answer = sys.approve(&genuine, &sys.admin, false);
    assert_eq!((answer.status, answer.body["status"].as_str()), (200, Some("active")), "{}", answer.raw);
    assert_eq!(box_types(&sys), ["genuine"]);
}

#[test]
fn r_arch_11_an_approval_the_drafts_stream_does_not_hold_activates_nothing() {
    // given a cluster and a pending draft
    let sys = System::start(Mode::Cluster);
    let id = sys.draft(&minimal_draft_body("unrecorded"));
    // when a process with the drafts identity's NATS credentials publishes a DraftApproved
    // the store does not hold, with a token the real approval key signed (so only the
    // store tells it apart; the notification names an unused sequence)
    let real = ApprovalSigner::from_secret("approval-1".into(), hex::decode("a1".repeat(32)).expect("hex").try_into().expect("32 bytes"));
    let token = real.issue(&id, "unrecorded", &manifest_digest(&sys, &id), "admin", chrono::Utc::now());
    let event = approved(&id, token);
    let notification = v1::EventNotification {
        event_id: format!("draft/{id}/7"),
        aggregate_type: "draft".into(),
        aggregate_id: id.clone(),
        sequence: 7,
        position: 1_000_000,
        event_type: "DraftApproved".into(),
        event_version: "1".into(),
        payload_json: serde_json::to_vec(&event).expect("json"),
        metadata: Default::default(),
        recorded_at_unix_ms: chrono::Utc::now().timestamp_millis(),
    };
    let seed = creds_seed(&sys.nats_creds(subjects::DRAFTS));
    let url = sys.nats_url();
    tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime").block_on(async move {
        let options = nats_tls(async_nats::ConnectOptions::with_nkey(seed).custom_inbox_prefix(subjects::inbox_prefix(subjects::DRAFTS)));
        let client = options.connect(url).await.expect("connects with the drafts credentials");
        let js = async_nats::jetstream::new(client);
        let mut headers = async_nats::HeaderMap::new();
        headers.insert("Nats-Msg-Id", uuid::Uuid::new_v4().to_string().as_str());
        let ack = js.publish_with_headers(subjects::events(subjects::DRAFTS), headers, notification.encode_to_vec().into()).await.expect("published");
        ack.await.expect("stored in the events stream");
    });
    // then it is recorded as a security violation, no Box exists, and the draft's stream
    // holds no decision
    let violations = violations_about(&sys, &id);
    assert!(!violations.is_empty(), "the forged approval left no security violation; Boxes: {:?}", box_types(&sys));
    assert!(box_types(&sys).is_empty(), "a DraftApproved the store does not hold made a Box");
    assert!(!sys.data_dir().join("manifests/unrecorded.yaml").exists());
    let decisions = sys.sql_i64(&format!("SELECT count(*) FROM events WHERE aggregate_id = '{id}' AND event_type = 'DraftApproved'"));
    assert_eq!(decisions, 0);
}

#[test]
fn r_box_7_a_replayed_approval_of_an_archived_box_takes_no_box_type_and_no_slot() {
    // given an archived Box (embedded: its activation feed reads the store, so a replay is
    // a reset checkpoint away)
    let mut sys = System::start(Mode::Embedded);
    let id = sys.draft(&minimal_draft_body("archived-once"));
    let a = sys.approve(&id, &sys.admin, false);
    assert_eq!(a.body["status"], "active", "{}", a.raw);
    let box_id = a.body["box_id"].as_str().expect("box_id").to_owned();
    assert_eq!(sys.post(&format!("/api/v1/boxes/{box_id}/archive"), &sys.admin, &json!({})).body["state"], "archived");
    let namespace_events = |sys: &System| sys.sql_i64("SELECT count(*) FROM events WHERE aggregate_type = 'box_type_namespace'");
    let before = namespace_events(&sys);
    // when the activation consumer replays every draft event from the start
    sys.stop_gracefully();
    sys.sql("DELETE FROM projection_processed WHERE name = 'registry_activation'");
    sys.sql("DELETE FROM projection_checkpoints WHERE name = 'registry_activation'");
    sys.restart();
    let head = sys.sql_i64("SELECT COALESCE(MAX(rowid), 0) FROM events WHERE aggregate_type = 'draft'");
    let deadline = Instant::now() + Duration::from_secs(30);
    while sys.sql_i64("SELECT COALESCE(MAX(position), 0) FROM projection_checkpoints WHERE name = 'registry_activation'") < head {
        assert!(Instant::now() < deadline, "the activation consumer never replayed the draft events");
        std::thread::sleep(Duration::from_millis(50));
    }
    // then the namespace is unchanged, the Box stays archived, and the box_type is free
    assert_eq!(namespace_events(&sys), before, "the replay changed the namespace");
    assert_eq!(sys.get(&format!("/api/v1/boxes/{box_id}"), &sys.admin).body["state"], "archived");
    let again = sys.draft(&minimal_draft_body("archived-once"));
    let b = sys.approve(&again, &sys.admin, false);
    assert_eq!((b.status, b.body["status"].as_str()), (200, Some("active")), "{}", b.raw);
}
