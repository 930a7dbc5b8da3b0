//! Metrics (R-OPS-1, issue 13 item 4): `GET /metrics` on a process's probe port speaks the
//! Prometheus text format and counts what happened: requests per route template (no ids in
//! labels), service requests per type and outcome, event appends, consumers' lag, security
//! violations, pending drafts and active Boxes against the limit. Embedded mode has every
//! service in one process; in a cluster the gateway shows its own routes. The gateway's
//! public address serves no metrics (R-ARCH-13).

use atasira_tests::harness::{Mode, System, http};
use serde_json::json;

/// The value of the sample `name{labels}` (labels exactly as rendered), if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.split(' ').next()?.parse().ok())
}

/// `GET /metrics` on the probe port of the process that serves the REST API.
fn scrape(sys: &mut System) -> String {
    let process = if sys.mode == Mode::Embedded { "atasira dev" } else { "serve gateway" };
    let answer = http("GET", &format!("{}/metrics", sys.probe_url(process)), None, &[], None);
    assert_eq!(answer.status, 200, "{}", answer.raw);
    assert!(answer.header("content-type").is_some_and(|t| t.starts_with("application/openmetrics-text")), "{:?}", answer.header("content-type"));
    answer.raw
}

#[test]
fn r_ops_1_metrics_count_requests_appends_lag_and_the_state_of_the_read_models_embedded() {
    let mut sys = System::start_with(Mode::Embedded, &[("ATASIRA_MAX_BOXES", "7".to_owned())]);
    let approved = sys.draft(&json!({"box_type": "metrics-approved", "purpose": "counted"}));
    let a = sys.approve(&approved, &sys.admin, false);
    assert_eq!(a.status, 200, "{}", a.raw);
    sys.draft(&json!({"box_type": "metrics-pending", "purpose": "still pending"}));
    // A self-approval is a security violation (recorded, and counted).
    let mine = sys.post("/api/v1/boxes/box-drafts", &sys.admin, &json!({"box_type": "metrics-mine", "purpose": "mine"}));
    let mine = mine.body["draft_id"].as_str().expect("draft_id").to_owned();
    assert_eq!(sys.approve(&mine, &sys.admin, false).status, 403);

    let text = scrape(&mut sys);
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
    let text = scrape(&mut sys);
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

#[test]
fn r_arch_13_the_public_address_serves_no_metrics_and_the_probe_port_does() {
    // Metrics tell who is busy with what; only the operator's monitoring reads them.
    atasira_tests::harness::in_both_modes(|sys| {
        for token in [None, Some(sys.admin.clone())] {
            let public = http("GET", &sys.url("/metrics"), token.as_deref(), &[], None);
            assert_eq!(public.status, 404, "{:?}: {}", sys.mode, public.raw);
            assert!(!public.raw.contains("atasira_"), "{}", public.raw);
        }
        assert_eq!(sys.get("/api/v1/boxes", &sys.admin).status, 200);
        let text = scrape(sys);
        assert!(text.contains(r#"atasira_http_requests_total{method="GET",route="/api/v1/boxes",status="200"}"#), "{text}");
    });
}
