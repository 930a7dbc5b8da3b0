//! Given/when/then for what approvers are told and how deliveries go (R-NOTIFY-1).

use chrono::TimeZone;

use super::*;
use crate::aggregates::draft::ChangeOf;
use crate::change::CapabilityDiff;
use crate::os_operation::OverLimit;
use crate::{BoxManifest, Kind, Principal, Role};

fn at() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 12, 4, 10, 0, 0).single().expect("valid")
}

fn submitted(change: Option<ChangeOf>, over: bool) -> DraftEvent {
    let manifest = BoxManifest::from_yaml_str("box_type: sales\npurpose: p\nos_operations: [\"shell:exec\"]\n").expect("valid").manifest;
    DraftEvent::DraftSubmitted {
        draft_id: "d1".into(),
        box_type: "sales".into(),
        manifest,
        over_limit: OverLimit { over_limit: over, over_limit_ops: if over { vec!["shell:exec".into()] } else { vec![] }, over_limit_tools: vec![] },
        warnings: vec![],
        requested_by: Principal::new("agent-7", Role::Member, Kind::Agent),
        submitted_at: at(),
        change,
        approvals_required: 1,
        revision: None,
        policy: None,
    }
}

#[test]
fn given_a_submitted_draft_then_approvers_are_told_who_asked_for_what_and_whether_it_is_over_the_limit() {
    let a = of_draft(&submitted(None, true), "draft/d1/1").expect("announced");
    assert_eq!((a.kind.as_str(), a.requested_by.as_str(), a.box_type.as_str()), ("draft.pending", "agent-7", "sales"));
    assert_eq!(a.details["over_limit"], json!(true));
    assert_eq!(a.details["over_limit_ops"], json!(["shell:exec"]));
    assert_eq!(a.details["os_operations"], json!(["shell:exec"]));
    assert!(a.title.contains("over the limit"), "{}", a.title);
    assert_eq!(a.link, "/#pending");
}

#[test]
fn given_a_change_request_then_the_diff_is_told() {
    let change = ChangeOf { box_id: "b1".into(), base_digest: "sha256:x".into(), diff: CapabilityDiff { added: vec!["shell:exec".into()], removed: vec![] } };
    let a = of_draft(&submitted(Some(change), false), "draft/d1/1").expect("announced");
    assert_eq!((a.kind.as_str(), a.box_id.as_deref()), ("change.pending", Some("b1")));
    assert_eq!(a.details["diff"]["added"], json!(["shell:exec"]));
    assert!(a.title.contains("+shell:exec"), "{}", a.title);
}

#[test]
fn given_other_events_then_nobody_is_told() {
    let withdrawn = DraftEvent::DraftWithdrawn { draft_id: "d1".into(), withdrawn_by: "agent-7".into(), at: at() };
    assert_eq!(of_draft(&withdrawn, "draft/d1/2"), None);
}

#[test]
fn given_an_announcement_then_each_format_carries_the_absolute_link() {
    let a = of_draft(&submitted(None, false), "draft/d1/1").expect("valid");
    let j = body(&a, Format::Json, "https://atasira.example/");
    assert_eq!(j["link"], json!("https://atasira.example/#pending"));
    assert_eq!(j["event_id"], json!("draft/d1/1"));
    let s = body(&a, Format::Slack, "https://atasira.example");
    let text = s["text"].as_str().expect("valid");
    assert!(text.contains("<https://atasira.example/#pending|Open in atasira>") && text.contains("agent-7"), "{text}");
    assert_eq!(Format::parse("slack"), Some(Format::Slack));
    assert_eq!(Format::parse("xml"), None);
}

#[test]
fn a_signature_binds_the_secret_the_time_and_the_body() {
    let s = signature("whsec_1", 1_700_000_000, b"{}");
    assert!(s.starts_with("t=1700000000,v1=") && s.len() == "t=1700000000,v1=".len() + 64, "{s}");
    assert_eq!(s, signature("whsec_1", 1_700_000_000, b"{}"));
    assert_ne!(s, signature("whsec_2", 1_700_000_000, b"{}"));
    assert_ne!(s, signature("whsec_1", 1_700_000_001, b"{}"));
    assert_ne!(s, signature("whsec_1", 1_700_000_000, b"{ }"));
}

#[test]
fn given_failed_attempts_then_waits_double_until_the_attempts_are_spent() {
    let policy = RetryPolicy { attempts: 4, backoff: Duration::from_secs(1) };
    assert_eq!(after(1, &Attempt::Status(204), policy), Next::Delivered);
    assert_eq!(after(1, &Attempt::Status(500), policy), Next::RetryIn(Duration::from_secs(1)));
    assert_eq!(after(2, &Attempt::Failed("refused".into()), policy), Next::RetryIn(Duration::from_secs(2)));
    assert_eq!(after(3, &Attempt::Status(429), policy), Next::RetryIn(Duration::from_secs(4)));
    assert_eq!(after(4, &Attempt::Status(500), policy), Next::DeadLetter);
    assert_eq!(after(1, &Attempt::Status(410), policy), Next::DeadLetter, "gone for good");
    let long = RetryPolicy { attempts: 100, backoff: Duration::from_secs(60) };
    assert_eq!(after(50, &Attempt::Status(500), long), Next::RetryIn(MAX_BACKOFF));
}

#[test]
fn webhook_urls_are_http_with_a_host_and_no_credentials() {
    assert_eq!(webhook_url_problem("https://hooks.example/abc"), None);
    assert_eq!(webhook_url_problem("http://127.0.0.1:9000/x"), None);
    assert!(webhook_url_problem("ftp://x/").is_some());
    assert!(webhook_url_problem("https://user:pw@hooks.example/").is_some());
    assert!(webhook_url_problem("not a url").is_some());
    assert!(webhook_url_problem(&format!("https://x/{}", "a".repeat(3000))).is_some());
}

#[test]
fn given_a_failed_worker_of_an_escalating_box_then_approvers_and_its_primaries_are_told() {
    let f = Failure {
        worker_id: "wkr_1",
        box_id: "b1",
        box_type: "sales",
        exit_code: Some(3),
        result: "it broke",
        launched_by: "trigger:b1",
        primaries: vec!["erin".into()],
        at: at(),
    };
    let a = of_failure(&f, "worker/wkr_1/5");
    assert_eq!((a.kind.as_str(), a.link.as_str()), ("worker.escalated", "/#workers/wkr_1"));
    assert_eq!(a.details["primaries"], json!(["erin"]));
    assert!(a.title.contains("exit code 3"), "{}", a.title);
    assert!(KINDS.contains(&a.kind.as_str()));
}
