//! Nothing poisons the pipeline (R-ARCH-6, R-BOX-9): a request that would make an event
//! larger than the bus carries (NATS: 1 MiB a message) is refused up front, over REST and
//! from a NATS publisher, naming the key and its limit (422) or the body's size (413); a
//! draft at every bound still travels the whole way, and later drafts still activate.

use std::time::Duration;

use atasira_contracts::v1;
use atasira_domain::bounds;
use atasira_tests::fixtures::block_on;
use atasira_tests::harness::{Answer, Mode, System, in_both_modes, pat_options};
use prost::Message as _;
use serde_json::{Value, json};

const DRAFTS: &str = "/api/v1/boxes/box-drafts";

/// The issue's draft: ten thousand `required_access` entries, about 640 KB of JSON.
fn ten_thousand_entries() -> Value {
    let entries: Vec<Value> = (0..10_000).map(|i| json!({"type": "git_remote", "url": format!("https://git.example.com/team/repo-{i}.git")})).collect();
    json!({"box_type": "many-remotes", "purpose": "clone everything", "tools": ["Read"], "required_access": entries})
}

fn assert_names_required_access_and_its_limit(a: &Answer, mode: Mode) {
    assert_eq!((a.status, a.body["error"].as_str()), (422, Some("box_manifest_validation")), "{mode:?}: {}", a.raw);
    assert_eq!(a.body["details"], json!([{"key": "required_access", "message": "has 10000 entries; at most 16 are allowed"}]), "{mode:?}");
}

/// A normal draft is submitted, approved and active, every read model caught up.
fn a_normal_draft_activates(sys: &System, box_type: &str) {
    let id = sys.draft(&json!({"box_type": box_type, "purpose": "週次売上レポートの自動作成", "tools": ["Read"]}));
    let approved = sys.approve(&id, &sys.admin, false);
    assert_eq!((approved.status, approved.body["status"].as_str()), (200, Some("active")), "{:?}: {}", sys.mode, approved.raw);
    assert_eq!(approved.header("x-atasira-lagging"), None, "{:?}", sys.mode);
}

#[test]
fn r_arch_6_oversized_drafts_are_refused_over_rest_and_later_drafts_still_activate() {
    in_both_modes(|sys| {
        let mode = sys.mode;
        // 422 naming the key and its limit; nothing is stored.
        assert_names_required_access_and_its_limit(&sys.post(DRAFTS, &sys.agent, &ten_thousand_entries()), mode);
        let over_text = sys.post(DRAFTS, &sys.agent, &json!({"box_type": "long-purpose", "purpose": "p".repeat(bounds::DRAFT_PURPOSE_CHARS + 1)}));
        assert_eq!(over_text.status, 422, "{mode:?}: {}", over_text.raw);
        assert_eq!(over_text.body["details"][0]["key"], "purpose", "{mode:?}: {}", over_text.raw);
        // A body over the HTTP limit: 413 as our JSON error.
        let huge = sys.post(DRAFTS, &sys.agent, &json!({"box_type": "huge", "purpose": "p".repeat(1024 * 1024)}));
        assert_eq!((huge.status, huge.body["error"].as_str()), (413, Some("payload_too_large")), "{mode:?}: {}", huge.raw);
        assert!(sys.pending().is_empty(), "{mode:?}: nothing was stored");

        // A rejection reason: bounded in the event, and a body under the HTTP limit that the
        // bus could not carry is 413 before it is sent.
        let id = sys.draft(&json!({"box_type": "to-reject", "purpose": "p", "tools": ["Read"]}));
        let reject = |reason: String| sys.post(&format!("{DRAFTS}/{id}/reject"), &sys.admin, &json!({"reason": reason}));
        let long = reject("r".repeat(bounds::REASON_CHARS + 1));
        assert_eq!((long.status, long.body["error"].as_str()), (422, Some("invalid_request")), "{mode:?}: {}", long.raw);
        let near_the_body_limit = reject("r".repeat(1024 * 1024 - 64));
        assert_eq!(
            (near_the_body_limit.status, near_the_body_limit.body["error"].as_str()),
            (413, Some("payload_too_large")),
            "{mode:?}: {}",
            near_the_body_limit.raw
        );
        assert_eq!(reject("too wide".into()).status, 200, "{mode:?}");

        // The largest draft the bounds admit, in the characters JSON escapes widest, travels
        // the whole way (relayed in cluster mode), and a normal one after it.
        let widest = sys.post(DRAFTS, &sys.agent, &bounds::draft_at_bounds('\u{1}', None));
        assert_eq!(widest.status, 201, "{mode:?}: {}", widest.raw);
        let id = widest.body["draft_id"].as_str().expect("draft_id");
        let approved = sys.approve(id, &sys.admin, true);
        assert_eq!((approved.status, approved.body["status"].as_str()), (200, Some("active")), "{mode:?}: {}", approved.raw);
        a_normal_draft_activates(sys, "after-the-refusals");
    });
}

/// Submits `request` over NATS as the publisher of `token`: the draft id, or the refusal.
async fn submit_over_nats(url: &str, token: &str, request: v1::BoxDraftCreateRequest) -> Result<String, atasira_contracts::Refused> {
    let client = pat_options(token).connect(url).await.expect("the PAT connects");
    let subject = format!("atasira.box.client.{}.drafts", atasira_platform::auth::hash_token(token));
    let env = atasira_contracts::envelope(&v1::SubmitDraft { request: Some(request) }, &uuid::Uuid::new_v4().to_string(), "");
    let reply = tokio::time::timeout(Duration::from_secs(10), client.request(subject, env.encode_to_vec().into()))
        .await
        .expect("an answer in time")
        .expect("an answer");
    atasira_contracts::decode_reply::<v1::SubmitDraftReply>(&reply.payload).expect("decodes").map(|(r, _)| r.draft_id)
}

#[test]
fn r_arch_6_oversized_drafts_from_a_nats_publisher_are_refused_and_later_drafts_still_activate() {
    let mut sys = System::start(Mode::Cluster);
    let url = sys.nats().url();
    let remote = |i: usize| v1::RequiredAccess {
        kind: Some(v1::required_access::Kind::GitRemote(v1::required_access::GitRemote { url: format!("https://git.example.com/team/repo-{i}.git") })),
    };
    let many = v1::BoxDraftCreateRequest {
        box_type: "many-remotes".into(),
        purpose: "clone everything".into(),
        tools: vec!["Read".into()],
        required_access: (0..10_000).map(remote).collect(),
        ..Default::default()
    };
    let refused = block_on(submit_over_nats(&url, &sys.agent, many)).expect_err("refused");
    assert_eq!(refused.code.as_str(), "box_manifest_validation", "{refused:?}");
    let keys: Vec<(&str, &str)> = refused.field_errors.iter().map(|e| (e.key.as_str(), e.message.as_str())).collect();
    assert_eq!(keys, [("required_access", "has 10000 entries; at most 16 are allowed")]);
    assert!(sys.pending().is_empty(), "nothing was stored");

    // A normal draft over NATS is still approved and activates, and so does one over REST.
    let normal = v1::BoxDraftCreateRequest { box_type: "from-nats".into(), purpose: "p".into(), tools: vec!["Read".into()], ..Default::default() };
    let id = block_on(submit_over_nats(&url, &sys.agent, normal)).expect("submitted");
    let approved = sys.approve(&id, &sys.admin, false);
    assert_eq!((approved.status, approved.body["status"].as_str()), (200, Some("active")), "{}", approved.raw);
    a_normal_draft_activates(&sys, "after-nats");
}

#[test]
fn r_arch_15_each_user_has_a_rate_and_beyond_it_gets_429_with_retry_after() {
    for mode in [Mode::Embedded, Mode::Cluster] {
        // given a gateway that lets each user send one request a second, three at once
        let sys = System::start_with(mode, &[("ATASIRA_RATE_LIMIT", "1".to_owned()), ("ATASIRA_RATE_BURST", "3".to_owned())]);
        // when the agent sends four requests at once
        let answers: Vec<Answer> = (0..4).map(|_| sys.get("/api/v1/boxes", &sys.agent)).collect();
        // then three are served and the fourth is 429, saying when to come back
        assert!(answers[..3].iter().all(|a| a.status == 200), "{mode:?}: {:?}", answers.iter().map(|a| a.status).collect::<Vec<_>>());
        let limited = &answers[3];
        assert_eq!((limited.status, limited.body["error"].as_str()), (429, Some("rate_limited")), "{mode:?}: {}", limited.raw);
        let retry: u64 = limited.header("retry-after").and_then(|v| v.parse().ok()).expect("Retry-After");
        assert!((1..=2).contains(&retry), "{mode:?}: Retry-After {retry}");
        // and another user is not held by the agent's rate
        assert_eq!(sys.get("/api/v1/boxes", &sys.admin).status, 200, "{mode:?}");
        // and once the wait has passed, the agent is served again
        std::thread::sleep(Duration::from_secs(retry));
        assert_eq!(sys.get("/api/v1/boxes", &sys.agent).status, 200, "{mode:?}");
    }
}
