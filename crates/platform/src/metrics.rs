//! Metrics of one process in the Prometheus text format (OpenMetrics), for `GET /metrics`
//! on the gateway and on each service's probe port (R-OPS-1, issue 13 item 4).
//!
//! One registry per process ([`global`]), filled where things happen: the services' request
//! handling (count and latency per service and request type, with the outcome), the
//! gateway's routes (count and latency per route template and status), command appends
//! (latency per aggregate type), consumers that retry after a failure, security
//! violations. What is a state rather than an event is measured when scraped
//! ([`render`]): how many events each relay and each consumer of this process is behind,
//! and the gauges services register ([`gauge_source`]: pending drafts, active Boxes and
//! the limit).

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::cursor::Cursor;

/// Distinct request type names counted; more are `other`.
pub const MAX_REQUEST_NAMES: usize = 128;

/// The `Content-Type` of [`render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub service: String,
    pub request: String,
    pub outcome: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestKind {
    pub service: String,
    pub request: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpLabels {
    pub method: String,
    pub route: String,
    pub status: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HttpRoute {
    pub method: String,
    pub route: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Named {
    pub name: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AggregateLabel {
    pub aggregate_type: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WaitLabels {
    /// What the wait's last look followed: `first`, `local` (a consumer of this process),
    /// `remote` (a consumer of another process, by the database's notification) or
    /// `safety_net` (the once-a-second look).
    pub look: &'static str,
    /// `applied` or `lagging`.
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServiceLabel {
    pub service: String,
}

/// A reader of the store this process runs: its kind (`relay` or `consumer`), the types it
/// reads and where it stands.
#[derive(Debug, Clone)]
struct Reader {
    kind: &'static str,
    types: &'static [&'static str],
    at: Cursor,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    pub decision: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabels {
    /// `schedule` or `event`.
    pub trigger: &'static str,
    /// `launched`, or `refused` (recorded on the launch's stream).
    pub outcome: &'static str,
}

/// A gauge a service computes when scraped (a count in its read model).
pub type GaugeSource = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = anyhow::Result<i64>> + Send>> + Send + Sync>;

/// The process's metrics.
pub struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub request_seconds: Family<RequestKind, Histogram>,
    pub http_requests: Family<HttpLabels, Counter>,
    pub http_seconds: Family<HttpRoute, Histogram>,
    pub append_seconds: Family<AggregateLabel, Histogram>,
    pub consumer_retries: Family<Named, Counter>,
    pub security_violations: Family<ServiceLabel, Counter>,
    pub consistency_waits: Family<WaitLabels, Counter>,
    pub tool_decisions: Family<DecisionLabel, Counter>,
    pub trigger_launches: Family<TriggerLabels, Counter>,
    relay_lag: Family<Named, Gauge>,
    consumer_lag: Family<Named, Gauge>,
    gauges: Family<Named, Gauge>,
    readers: Mutex<BTreeMap<String, Reader>>,
    request_names: Mutex<std::collections::BTreeSet<String>>,
    sources: Mutex<BTreeMap<&'static str, GaugeSource>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

fn latency() -> Histogram {
    // 0.5 ms to ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::with_prefix("atasira");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("requests", "Requests a service answered, by request type and outcome (ok or the error code)", requests.clone());
        let request_seconds = Family::<RequestKind, Histogram>::new_with_constructor(latency as fn() -> Histogram);
        registry.register("request_seconds", "How long a service took to answer, by request type", request_seconds.clone());
        let http_requests = Family::<HttpLabels, Counter>::default();
        registry.register("http_requests", "HTTP requests the gateway answered, by route template and status", http_requests.clone());
        let http_seconds = Family::<HttpRoute, Histogram>::new_with_constructor(latency as fn() -> Histogram);
        registry.register("http_request_seconds", "How long the gateway took to answer, by route template", http_seconds.clone());
        let append_seconds = Family::<AggregateLabel, Histogram>::new_with_constructor(latency as fn() -> Histogram);
        registry.register("event_append_seconds", "How long a command took to append its events to the store, by aggregate type", append_seconds.clone());
        let consumer_retries = Family::<Named, Counter>::default();
        registry.register(
            "consumer_retries",
            "Times a consumer stopped at an event it could not handle and read it again from its checkpoint",
            consumer_retries.clone(),
        );
        let security_violations = Family::<ServiceLabel, Counter>::default();
        registry.register("security_violations", "Security violations this process recorded, by the service that refused", security_violations.clone());
        let consistency_waits = Family::<WaitLabels, Counter>::default();
        registry.register(
            "consistency_waits",
            "Read-your-writes waits this process answered, by what its last look followed and whether the read models had the write",
            consistency_waits.clone(),
        );
        let tool_decisions = Family::<DecisionLabel, Counter>::default();
        registry.register("tool_decisions", "Decisions an execution host made before a Worker's tool call: allow, deny or ask", tool_decisions.clone());
        let trigger_launches = Family::<TriggerLabels, Counter>::default();
        registry.register(
            "trigger_launches",
            "Launches Boxes' schedules asked for: launched, or refused (recorded on the launch's stream)",
            trigger_launches.clone(),
        );
        let relay_lag = Family::<Named, Gauge>::default();
        registry.register("relay_lag_events", "Events of its service a relay has not published yet", relay_lag.clone());
        let consumer_lag = Family::<Named, Gauge>::default();
        registry.register("consumer_lag_events", "Events a consumer (projection, audit writer, activation) has not applied yet", consumer_lag.clone());
        let gauges = Family::<Named, Gauge>::default();
        registry.register("state", "Counts from the read models: pending_drafts, active_boxes, box_limit", gauges.clone());
        Metrics {
            registry,
            requests,
            request_seconds,
            http_requests,
            http_seconds,
            append_seconds,
            consumer_retries,
            security_violations,
            consistency_waits,
            tool_decisions,
            trigger_launches,
            relay_lag,
            consumer_lag,
            gauges,
            readers: Mutex::new(BTreeMap::new()),
            request_names: Mutex::new(Default::default()),
            sources: Mutex::new(BTreeMap::new()),
        }
    }

    /// A service answered `request` with `outcome` (`ok` or an error code) after `took`.
    /// The request type is the sender's word: past [`MAX_REQUEST_NAMES`] distinct ones, the
    /// rest count as `other` (a NATS publisher cannot grow the registry without bound).
    pub fn request(&self, service: &str, request: &str, outcome: &str, took: Duration) {
        let request = match self.request_names.lock() {
            Ok(mut names) if names.contains(request) || names.len() < MAX_REQUEST_NAMES => {
                names.insert(request.to_owned());
                request
            }
            _ => "other",
        };
        let kind = RequestKind { service: service.to_owned(), request: request.to_owned() };
        self.request_seconds.get_or_create(&kind).observe(took.as_secs_f64());
        self.requests.get_or_create(&RequestLabels { service: kind.service, request: kind.request, outcome: outcome.to_owned() }).inc();
    }

    /// An execution host decided a tool call (`allow`, `deny` or `ask`).
    pub fn decision(&self, decision: &'static str) {
        self.tool_decisions.get_or_create(&DecisionLabel { decision: decision.to_owned() }).inc();
    }

    /// A Box's trigger (`schedule`) asked for a launch, with `outcome`.
    pub fn trigger(&self, trigger: &'static str, outcome: &'static str) {
        self.trigger_launches.get_or_create(&TriggerLabels { trigger, outcome }).inc();
    }

    /// The gateway answered `method route` with `status` after `took`.
    pub fn http(&self, method: &str, route: &str, status: u16, took: Duration) {
        let key = HttpRoute { method: method.to_owned(), route: route.to_owned() };
        self.http_seconds.get_or_create(&key).observe(took.as_secs_f64());
        self.http_requests.get_or_create(&HttpLabels { method: key.method, route: key.route, status: status.to_string() }).inc();
    }

    /// A reader of the store (`kind` `relay` or `consumer`) stands at `at`.
    pub fn reader_at(&self, name: &str, kind: &'static str, types: &'static [&'static str], at: Cursor) {
        if let Ok(mut readers) = self.readers.lock() {
            readers.insert(name.to_owned(), Reader { kind, types, at });
        }
    }

    /// A reader this process tracks moved to `at`.
    pub fn reader_moved(&self, name: &str, at: Cursor) {
        if let Ok(mut readers) = self.readers.lock()
            && let Some(reader) = readers.get_mut(name)
        {
            reader.at = at;
        }
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// This process's metrics.
pub fn global() -> &'static Metrics {
    &METRICS
}

/// Registers a gauge computed at each scrape (`atasira_state{name=...}`).
pub fn gauge_source(name: &'static str, source: GaugeSource) {
    if let Ok(mut sources) = global().sources.lock() {
        sources.insert(name, source);
    }
}

/// The relays and consumers of this process: name, kind, the types each reads, and where
/// it stands (their lag is the store's to count: `Db::lags`).
pub fn readers() -> Vec<(String, &'static str, &'static [&'static str], Cursor)> {
    let readers = global().readers.lock().map(|r| r.iter().map(|(k, v)| (k.clone(), v.kind, v.types, v.at)).collect());
    readers.unwrap_or_default()
}

/// Measures what is measured when scraped (the readers' `lags`, as the store counted them,
/// and the gauges), then the whole registry as text.
pub async fn render(lags: Vec<(String, &'static str, i64)>) -> String {
    let m = global();
    for (name, kind, behind) in lags {
        let family = if kind == "relay" { &m.relay_lag } else { &m.consumer_lag };
        family.get_or_create(&Named { name }).set(behind);
    }
    let sources: Vec<(&'static str, GaugeSource)> = m.sources.lock().map(|s| s.iter().map(|(k, v)| (*k, v.clone())).collect()).unwrap_or_default();
    for (name, source) in sources {
        match source().await {
            Ok(value) => {
                m.gauges.get_or_create(&Named { name: name.to_owned() }).set(value);
            }
            Err(e) => tracing::debug!(gauge = name, error = %e, "metrics: gauge unknown"),
        }
    }
    let mut text = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut text, &m.registry) {
        tracing::warn!(error = %e, "metrics: encoding failed");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_counted_with_its_outcome_and_timed() {
        let m = Metrics::new();
        m.request("drafts", "SubmitDraft", "ok", Duration::from_millis(3));
        m.request("drafts", "SubmitDraft", "forbidden", Duration::from_millis(1));
        m.http("POST", "/api/v1/boxes/box-drafts", 201, Duration::from_millis(4));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &m.registry).expect("encodes");
        assert!(text.contains(r#"atasira_requests_total{service="drafts",request="SubmitDraft",outcome="ok"} 1"#), "{text}");
        assert!(text.contains(r#"atasira_requests_total{service="drafts",request="SubmitDraft",outcome="forbidden"} 1"#), "{text}");
        assert!(text.contains(r#"atasira_request_seconds_count{service="drafts",request="SubmitDraft"} 2"#), "{text}");
        assert!(text.contains(r#"atasira_http_requests_total{method="POST",route="/api/v1/boxes/box-drafts",status="201"} 1"#), "{text}");
    }

    /// The example Grafana dashboard (`examples/grafana/atasira.json`) asks only for series
    /// this registry exports.
    #[test]
    fn the_example_dashboard_asks_for_series_that_exist() {
        let m = Metrics::new();
        let named = Named { name: "x".to_owned() };
        m.request("s", "r", "ok", Duration::from_millis(1));
        m.http("GET", "/", 200, Duration::from_millis(1));
        m.append_seconds.get_or_create(&AggregateLabel { aggregate_type: "draft".to_owned() }).observe(0.001);
        m.consumer_retries.get_or_create(&named).inc();
        m.security_violations.get_or_create(&ServiceLabel { service: "approval".to_owned() }).inc();
        m.relay_lag.get_or_create(&named).set(1);
        m.consumer_lag.get_or_create(&named).set(1);
        m.gauges.get_or_create(&named).set(1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &m.registry).expect("encodes");
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/grafana/atasira.json");
        let dashboard: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).expect("the example dashboard")).expect("JSON");
        let mut asked = 0;
        for target in dashboard["panels"].as_array().expect("panels").iter().flat_map(|p| p["targets"].as_array().expect("targets")) {
            let expr = target["expr"].as_str().expect("expr");
            for (at, _) in expr.match_indices("atasira_") {
                let name: String = expr[at..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                asked += 1;
                assert!(text.lines().any(|l| l.starts_with(&format!("{name}{{"))), "the dashboard asks for {name}, which is not exported:\n{text}");
            }
        }
        assert!(asked >= 10, "{asked}");
    }
}
