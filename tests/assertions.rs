//! Principal assertions on a real cluster (R-ARCH-3, R-AUTH-5, R-AUDIT-5): an assertion is
//! good for the one request it was made for, once. A captured one is worthless for another
//! message type or subject and for the same request a second time, and every refused try
//! is a `security_violation` row of the audit ledger. NATS publishers are their token:
//! an unknown one gets nothing, not even a read-your-writes wait (R-AUTH-1).
//!
//! The test talks to the services as the gateway does: it has the running gateway sign
//! assertions for it (`POST /api/v1/auth/nats-assertion`; nothing else can sign them), and
//! sends them on the gateway's subjects with the gateway's NATS credentials (the attacker
//! who captured an assertion is assumed to be able to send it there). NATS publishers
//! connect with their PAT.

use std::time::{Duration, Instant};

use atasira_contracts::{Envelope, Refused, decode_reply, envelope, subjects, v1};
use atasira_domain::ErrorCode;
use atasira_tests::fixtures::block_on;
use atasira_tests::harness::{Mode, System, pat_options};
use prost::Message as _;
use serde_json::{Value, json};

/// Who a test connects to NATS as.
#[derive(Clone, Copy)]
enum As<'a> {
    /// The gateway's nkey (from the credentials `atasira nats-config` wrote).
    Gateway,
    /// A NATS publisher with this PAT.
    Pat(&'a str),
}

async fn connect(sys: &mut System, who: As<'_>) -> Result<async_nats::Client, String> {
    let url = sys.nats().url();
    let options = match who {
        As::Gateway => sys.nats_options(subjects::GATEWAY),
        As::Pat(token) => pat_options(token),
    };
    options.connect(url).await.map_err(|e| e.to_string())
}

async fn request<R: prost::Message + Default>(client: &async_nats::Client, subject: &str, env: &Envelope) -> Result<R, Refused> {
    let reply = client.request(subject.to_owned(), env.encode_to_vec().into()).await.expect("a reply");
    decode_reply::<R>(&reply.payload).expect("decodes").map(|(r, _)| r)
}

/// Sends `env` on `subject` as `who` and decodes the reply as `R`.
fn ask<R: prost::Message + Default>(sys: &mut System, who: As<'_>, subject: &str, env: &Envelope) -> Result<R, Refused> {
    block_on(async {
        let client = connect(sys, who).await.expect("connects");
        request(&client, subject, env).await
    })
}

fn security_violations(sys: &System) -> Vec<Value> {
    let a = sys.get("/api/v1/audit?action=security_violation&limit=200", &sys.admin);
    assert_eq!(a.status, 200, "{}", a.raw);
    a.body["rows"].as_array().cloned().unwrap_or_default()
}

#[test]
fn a_captured_assertion_is_refused_for_another_request_and_a_second_time_and_each_try_is_audited() {
    // given a cluster, a pending draft of the agent, and an admin's assertion for
    // ListPendingDrafts as the gateway makes it
    let mut sys = System::start(Mode::Cluster);
    let draft_id = sys.draft(&json!({"box_type": "replayed", "purpose": "p", "tools": ["Read"]}));
    let to_drafts = subjects::request(subjects::GATEWAY, subjects::DRAFTS);
    let to_approval = subjects::request(subjects::GATEWAY, subjects::APPROVAL);
    let list = v1::ListPendingDrafts { limit: 50, after: 0 };
    let captured = sys.gateway_signed(&to_drafts, &list, "captured-1");

    // when it is used for its request; then it works, once
    let page: v1::DraftPage = ask(&mut sys, As::Gateway, &to_drafts, &captured).expect("the request it was made for");
    assert!(page.drafts.iter().any(|d| d.draft_id == draft_id), "{page:?}");
    let again = ask::<v1::DraftPage>(&mut sys, As::Gateway, &to_drafts, &captured).expect_err("a replay");
    assert_eq!((again.code, again.message.as_str()), (ErrorCode::Unauthenticated, "invalid principal assertion: replayed"));

    // when a fresh admin assertion for ListPendingDrafts rides on an ApproveDraft of the
    // agent's draft; then it approves nothing
    let fresh = sys.gateway_signed(&to_drafts, &list, "captured-2");
    let approve = Envelope {
        assertion: fresh.assertion.clone(),
        ..envelope(&v1::ApproveDraft { draft_id: draft_id.clone(), confirm_over_limit: false }, "captured-2", "")
    };
    let refused = ask::<v1::DecisionReply>(&mut sys, As::Gateway, &to_approval, &approve).expect_err("another request");
    assert_eq!((refused.code, refused.message.as_str()), (ErrorCode::Unauthenticated, "invalid principal assertion: subject_mismatch"));
    // nor as another message type to the service it was made for
    let submit = Envelope { assertion: fresh.assertion.clone(), ..envelope(&v1::SubmitDraft::default(), "captured-2", "") };
    let refused = ask::<v1::SubmitDraftReply>(&mut sys, As::Gateway, &to_drafts, &submit).expect_err("another message type");
    assert_eq!(refused.message, "invalid principal assertion: message_type_mismatch");
    let pending = sys.pending();
    assert!(pending.iter().any(|d| d["draft_id"] == draft_id.as_str()), "the draft is still pending: {pending:?}");

    // then each refusal is a security_violation row naming the subject and the sender
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut rows = security_violations(&sys);
    while rows.len() < 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
        rows = security_violations(&sys);
    }
    let seen: Vec<(&str, &str)> = rows.iter().map(|r| (r["actor"].as_str().unwrap_or(""), r["target"].as_str().unwrap_or(""))).collect();
    assert_eq!(seen.len(), 3, "{rows:?}");
    for expected in [("gateway", to_drafts.as_str()), ("gateway", to_approval.as_str())] {
        assert!(seen.contains(&expected), "{expected:?} in {seen:?}");
    }
    let verify = sys.get("/api/v1/audit/verify", &sys.admin);
    assert_eq!(verify.body["ok"], true, "{}", verify.raw);
}

#[test]
fn a_nats_publisher_with_a_revoked_token_gets_not_even_a_wait_and_nobody_else_reserves_a_box_type() {
    // R-AUTH-1, R-AUTH-4, R-ARCH-4: given a cluster and a publisher connected with a PAT
    let mut sys = System::start(Mode::Cluster);
    let token = sys.token("leaving", "member", "agent");
    let hash = atasira_platform::auth::hash_token(&token);
    let wait = envelope(&v1::WaitForPosition { position: 1, timeout_ms: 10, event_ids: vec![] }, "w1", "");
    let reserve = envelope(&v1::ReserveBoxType { box_type: "research".into(), draft_id: "d1".into(), deadline_unix: 0 }, "a1", "");
    block_on(async {
        let publisher = connect(&mut sys, As::Pat(&token)).await.expect("a known PAT connects");
        // when it waits; then it is answered
        assert!(request::<v1::WaitForPositionReply>(&publisher, &subjects::client_request(&hash, subjects::DRAFTS), &wait).await.is_ok());
        // when it asks the registry to reserve a box_type; then that is not theirs to ask
        let refused = request::<v1::Ack>(&publisher, &subjects::client_request(&hash, subjects::RUNTIME_REGISTRY), &reserve).await.expect_err("not a service");
        assert_eq!(refused.code, ErrorCode::Forbidden, "{refused}");
        // when its token is revoked; then even its waits are refused, on every service it may address
        let mut args = vec!["tokens", "revoke", token.as_str()];
        let target = sys.target_args();
        args.extend(target.iter().map(String::as_str));
        let (code, _, err) = sys.cli(&args);
        assert_eq!(code, 0, "{err}");
        for to in [subjects::DRAFTS, subjects::RUNTIME_REGISTRY] {
            let refused = request::<v1::WaitForPositionReply>(&publisher, &subjects::client_request(&hash, to), &wait).await.expect_err("revoked");
            assert_eq!(refused.code, ErrorCode::Unauthenticated, "{to}: {refused}");
        }
        // and it cannot connect again, nor can an unknown token
        assert!(connect(&mut sys, As::Pat(&token)).await.is_err(), "a revoked PAT is refused by the auth callout");
        assert!(connect(&mut sys, As::Pat("atasira_pat_unknown")).await.is_err(), "an unknown PAT is refused by the auth callout");
        // nor, without an assertion, from the gateway's subject
        let gateway = connect(&mut sys, As::Gateway).await.expect("the gateway's credentials connect");
        let refused =
            request::<v1::Ack>(&gateway, &subjects::request(subjects::GATEWAY, subjects::RUNTIME_REGISTRY), &reserve).await.expect_err("no principal");
        assert_eq!(refused.code, ErrorCode::Unauthenticated, "{refused}");
    });
}

#[test]
fn a_captured_assertion_is_admitted_once_by_all_the_replicas_of_a_service_together() {
    // R-ARCH-13: given two drafts processes (NATS hands each request to one of them) and a
    // captured admin assertion for ListPendingDrafts
    let mut sys = System::start(Mode::Cluster);
    sys.start_drafts(&[]);
    let to_drafts = subjects::request(subjects::GATEWAY, subjects::DRAFTS);
    let captured = sys.gateway_signed(&to_drafts, &v1::ListPendingDrafts { limit: 5, after: 0 }, "replicated-1");
    block_on(async {
        let gateway = connect(&mut sys, As::Gateway).await.expect("connects as the gateway");
        // when it is used once, then sent again and again (each time to either replica)
        assert!(request::<v1::DraftPage>(&gateway, &to_drafts, &captured).await.is_ok(), "the first use");
        for attempt in 0..12 {
            // then no replica admits it a second time
            let again = request::<v1::DraftPage>(&gateway, &to_drafts, &captured).await.expect_err("a replay");
            assert_eq!(again.message, "invalid principal assertion: replayed", "attempt {attempt}");
        }
    });
}

#[test]
fn a_captured_command_runs_once_on_all_the_replicas_together_and_its_replays_append_nothing() {
    // R-ARCH-13: the drafts service admits an assertion for the cluster in the statement of
    // the command's append. Given two drafts processes and a captured agent's submit
    let mut sys = System::start(Mode::Cluster);
    sys.start_drafts(&[]);
    let to_drafts = subjects::request(subjects::GATEWAY, subjects::DRAFTS);
    let submit = v1::SubmitDraft {
        request: Some(v1::BoxDraftCreateRequest { box_type: "captured-submit".into(), purpose: "p".into(), tools: vec!["Read".into()], ..Default::default() }),
    };
    let captured = sys.gateway_signed(&to_drafts, &submit, "replicated-submit");
    block_on(async {
        let gateway = connect(&mut sys, As::Gateway).await.expect("connects as the gateway");
        // when it is used once, then sent again and again (each time to either replica)
        let first = request::<v1::SubmitDraftReply>(&gateway, &to_drafts, &captured).await.expect("the first use");
        assert_eq!(first.box_type, "captured-submit");
        for attempt in 0..12 {
            // then neither replica carries it out a second time
            let again = request::<v1::SubmitDraftReply>(&gateway, &to_drafts, &captured).await.expect_err("a replay");
            assert_eq!((again.code, again.message.as_str()), (ErrorCode::Unauthenticated, "invalid principal assertion: replayed"), "attempt {attempt}");
        }
    });
    // and the store holds one draft of it, and the replays as security violations
    let drafts = sys.sql_i64("SELECT count(*) FROM events WHERE event_type = 'DraftSubmitted' AND payload::text LIKE '%captured-submit%'");
    assert_eq!(drafts, 1, "one submission, whatever the replays");
    let replays = sys.sql_i64(&format!(
        "SELECT count(*) FROM events WHERE aggregate_type = '{}' AND payload::text LIKE '%replayed: atasira.v1.SubmitDraft%'",
        atasira_domain::aggregates::types::DRAFTS_SECURITY
    ));
    assert!(replays >= 1, "the replays are recorded as security violations");
}
