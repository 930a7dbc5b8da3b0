//! Metrics (R-OPS-1, issue 13 item 4): `GET /metrics` on the gateway speaks the Prometheus
//! text format and counts what happened: requests per route template (no ids in labels),
//! service requests per type and outcome, event appends, consumers' lag, security
//! violations, pending drafts and active Boxes against the limit. Embedded mode has every
//! service in the gateway's process; in a cluster the gateway shows its own routes.

use atasira_tests::harness::{Mode, System, http};
use serde_json::json;

/// The value of the sample `name{labels}` (labels exactly as rendered), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.split(' ').next()?.parse().ok())
}

fn scrape(sys: &System) -> String {
    let answer = http("GET", &sys.url("/metrics"), None, &[], None);
    assert_eq!(answer.status, 200, "{}", answer.raw);
    assert!(answer.header("content-type").is_some_and(|t| t.starts_with("application/openmetrics-text")), "{:?}", answer.header("content-type"));
    answer.raw
}

#[test]
fn r_ops_1_metrics_count_requests_appends_lag_and_the_state_of_the_read_models_embedded() {
    let sys = System::start_with(Mode::Embedded, &[("ATASIRA_MAX_BOXES", "7".to_owned())]);
    let approved = sys.draft(&json!({"box_type": "metrics-approved", "purpose": "counted"}));
    let a = sys.approve(&approved, &sys.admin, false);
    assert_eq!(a.status, 200, "{}", a.raw);
    sys.draft(&json!({"box_type": "metrics-pending", "purpose": "still pending"}));
    // A self-approval is a security violation (recorded, and counted).
    let mine = sys.post("/api/v1/boxes/box-drafts", &sys.admin, &json!({"box_type": "metrics-mine", "purpose": "mine"}));
    let mine = mine.body["draft_id"].as_str().expect("draft_id").to_owned();
    assert_eq!(sys.approve(&mine, &sys.admin, false).status, 403);

    let text = scrape(&sys);
    let http_drafts = sample(&text, r#"atasira_http_requests_total{method="POST",route="/api/v1/boxes/box-drafts",status="201"}"#);
    assert_eq!(http_drafts, Some(3.0), "{text}");
    // Route templates, never ids.
    assert!(text.contains(r#"route="/api/v1/boxes/box-drafts/{draft_id}/approve",status="200""#), "{text}");
    assert!(!text.contains(&approved), "an id leaked into a label:\n{text}");
    assert!(sample(&text, r#"atasira_http_request_seconds_count{method="POST",route="/api/v1/boxes/box-drafts"}"#).is_some_and(|n| n >= 3.0), "{text}");
    assert_eq!(sample(&text, r#"atasira_requests_total{service="drafts",request="SubmitDraft",outcome="ok"}"#), Some(3.0), "{text}");
    assert_eq!(sample(&text, r#"atasira_requests_total{service="approval",request="ApproveDraft",outcome="self_approval_forbidden"}"#), Some(1.0), "{text}");
    assert!(sample(&text, r#"atasira_event_append_seconds_count{aggregate_type="draft"}"#).is_some_and(|n| n >= 4.0), "{text}");
    assert_eq!(sample(&text, r#"atasira_security_violations_total{service="approval"}"#), Some(1.0), "{text}");
    // The state of the read models, measured when scraped.
    assert_eq!(sample(&text, r#"atasira_state{name="pending_drafts"}"#), Some(2.0), "{text}");
    assert_eq!(sample(&text, r#"atasira_state{name="active_boxes"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, r#"atasira_state{name="box_limit"}"#), Some(7.0), "{text}");
    // Every consumer has a lag, and after read-your-writes nothing the drafts view reads is left.
    assert!(text.contains("atasira_consumer_lag_events{name="), "{text}");
    assert!(text.trim_end().ends_with("# EOF"), "{text}");
}

#[test]
fn r_ops_1_the_gateway_of_a_cluster_counts_its_routes_and_each_service_its_requests() {
    let mut sys = System::start(Mode::Cluster);
    sys.draft(&json!({"box_type": "metrics-cluster", "purpose": "counted"}));
    let unknown = sys.get("/api/v1/boxes/no-such-box", &sys.admin);
    assert_eq!(unknown.status, 404, "{}", unknown.raw);
    let text = scrape(&sys);
    assert_eq!(sample(&text, r#"atasira_http_requests_total{method="POST",route="/api/v1/boxes/box-drafts",status="201"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, r#"atasira_http_requests_total{method="GET",route="/api/v1/boxes/{box_id}",status="404"}"#), Some(1.0), "{text}");

    // The drafts process's probe port: its requests, its relay's and consumers' lag, the
    // pending drafts it keeps.
    let probe = sys.probe_url("serve drafts");
    let answer = http("GET", &format!("{probe}/metrics"), None, &[], None);
    assert_eq!(answer.status, 200, "{}", answer.raw);
    let text = answer.raw;
    assert_eq!(sample(&text, r#"atasira_requests_total{service="drafts",request="SubmitDraft",outcome="ok"}"#), Some(1.0), "{text}");
    assert_eq!(sample(&text, r#"atasira_state{name="pending_drafts"}"#), Some(1.0), "{text}");
    assert!(text.contains(r#"atasira_relay_lag_events{name="relay-drafts"}"#), "{text}");
    assert!(text.contains(r#"atasira_consumer_lag_events{name="drafts_view"}"#), "{text}");
}
