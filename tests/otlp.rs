//! One trace per API call (R-OPS-1, issue 13 item 3): with `OTEL_EXPORTER_OTLP_ENDPOINT`
//! set, every process exports its spans over OTLP/HTTP, and the W3C trace context travels
//! in bus request headers and in event metadata, so one approve is one trace across the
//! gateway, approval, the runtime registry (reserve, activation), the provisioner and the
//! audit writer. The receiver is a small OTLP/HTTP collector in this test, decoding the
//! protobuf `ExportTraceServiceRequest` with the opentelemetry-proto crate.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use atasira_tests::harness::receiver::Receiver;
use atasira_tests::harness::{Mode, System, http};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;
use serde_json::json;

/// One received span: the exporting process's `service.name`, its ids, name and string (and
/// integer) attributes.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    trace_id: String,
    span_id: String,
    parent: String,
    name: String,
    attributes: BTreeMap<String, String>,
}

/// An OTLP/HTTP receiver on a free loopback port, keeping every span it is sent.
struct Collector {
    receiver: Receiver,
}

impl Collector {
    fn start() -> Collector {
        let receiver = Receiver::start(|r, _| match (r.method.as_str(), r.path.as_str()) {
            ("POST", "/v1/traces") if ExportTraceServiceRequest::decode(r.body.as_slice()).is_ok() => "200 OK",
            ("POST", "/v1/traces") => "400 Bad Request",
            _ => "404 Not Found",
        });
        Collector { receiver }
    }

    fn endpoint(&self) -> String {
        self.receiver.url("")
    }

    fn spans(&self) -> Vec<Span> {
        self.receiver.at("/v1/traces").iter().flat_map(|r| decode(&r.body)).collect()
    }

    /// Waits until the trace holds a span of every `(service.name, label)` in `wanted` (or a
    /// minute passed); a span's label is the service it serves or the consumer it runs. Each
    /// process exports in its own batches, so one span of a process says nothing of the others.
    fn trace(&self, trace_id: &str, wanted: &[(&str, &str)]) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let spans: Vec<Span> = self.spans().into_iter().filter(|s| s.trace_id == trace_id).collect();
            let seen: BTreeSet<(&str, &str)> = spans.iter().map(|s| (s.service.as_str(), s.label())).collect();
            if wanted.iter().all(|w| seen.contains(w)) || Instant::now() > deadline {
                return spans;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Span {
    /// The service a request span serves, the consumer an event span runs, or its name.
    fn label(&self) -> &str {
        self.attributes.get("service").or_else(|| self.attributes.get("consumer")).map_or(self.name.as_str(), String::as_str)
    }
}

/// The spans of one export request.
fn decode(body: &[u8]) -> Vec<Span> {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else { return vec![] };
    let mut spans = Vec::new();
    for resource_spans in request.resource_spans {
        let resource = resource_spans.resource.map(|r| strings(&r.attributes)).unwrap_or_default();
        let service = resource.get("service.name").cloned().unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(Span {
                    service: service.clone(),
                    trace_id: hex::encode(&span.trace_id),
                    span_id: hex::encode(&span.span_id),
                    parent: hex::encode(&span.parent_span_id),
                    name: span.name,
                    attributes: strings(&span.attributes),
                });
            }
        }
    }
    spans
}

fn strings(attributes: &[opentelemetry_proto::tonic::common::v1::KeyValue]) -> BTreeMap<String, String> {
    attributes
        .iter()
        .filter_map(|kv| match kv.value.as_ref()?.value.as_ref()? {
            AnyValue::StringValue(s) => Some((kv.key.clone(), s.clone())),
            AnyValue::IntValue(i) => Some((kv.key.clone(), i.to_string())),
            _ => None,
        })
        .collect()
}

fn otlp_env(collector: &Collector) -> Vec<(&'static str, String)> {
    // A short batch delay, so spans arrive while the test looks.
    vec![("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint()), ("OTEL_BSP_SCHEDULE_DELAY", "100".to_owned())]
}

/// A draft whose approval provisions something (an SSH target: no network involved).
fn provisioned(box_type: &str) -> serde_json::Value {
    json!({"box_type": box_type, "name": box_type, "purpose": "traced", "success_criteria": ["one trace"], "tools": ["Read"], "os_operations": ["file:read"],
           "required_access": [{"type": "ssh_target", "host": "build.example", "user": "ci", "port": 2222}]})
}

/// The `traceparent` headers of the public feed's notifications of `aggregate_id`'s events
/// (waits until one is there, at most half a minute).
fn feed_traceparents(sys: &System, aggregate_id: &str) -> Vec<String> {
    use atasira_contracts::subjects;
    use futures::StreamExt as _;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        let js = sys.jetstream_as(subjects::OPERATOR).await;
        let stream = js.get_stream(subjects::EVENTS_STREAM).await.expect("the events stream");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let consumer: async_nats::jetstream::consumer::PullConsumer =
                stream.create_consumer(async_nats::jetstream::consumer::pull::Config::default()).await.expect("an ephemeral consumer");
            let pending = consumer.clone().info().await.expect("info").num_pending as usize;
            let mut messages = consumer.fetch().max_messages(pending.max(1)).expires(Duration::from_secs(2)).messages().await.expect("fetch");
            let mut found = Vec::new();
            while let Some(Ok(message)) = messages.next().await {
                let n = atasira_contracts::v1::EventNotification::decode(&message.payload[..]).expect("a notification");
                if n.aggregate_id == aggregate_id
                    && let Some(h) = message.headers.as_ref().and_then(|h| h.get("traceparent"))
                {
                    found.push(h.as_str().to_owned());
                }
            }
            if !found.is_empty() || Instant::now() > deadline {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Approves `draft` with the caller's own W3C `traceparent`; the trace id it names.
fn approve_traced(sys: &System, draft: &str) -> String {
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let traceparent = format!("00-{trace_id}-{}-01", &uuid::Uuid::new_v4().simple().to_string()[..16]);
    let body = json!({"confirm_over_limit": false}).to_string();
    let a =
        http("POST", &sys.url(&format!("/api/v1/boxes/box-drafts/{draft}/approve")), Some(&sys.admin), &[("traceparent", &traceparent)], Some(body.as_bytes()));
    assert_eq!(a.status, 200, "{}", a.raw);
    trace_id
}

#[test]
fn r_ops_1_one_approve_is_one_trace_across_every_process_of_a_cluster() {
    let collector = Collector::start();
    let sys = System::start_with(Mode::Cluster, &otlp_env(&collector));
    let draft = sys.draft(&provisioned("traced-cluster"));
    let trace_id = approve_traced(&sys, &draft);
    let wanted = [
        ("atasira-gateway", "http"),
        ("atasira-approval", "approval"),
        ("atasira-runtime-registry", "runtime-registry"),
        ("atasira-runtime-registry", "registry_activation"),
        ("atasira-provisioner", "provisioner"),
        ("atasira-audit", "audit_ledger"),
    ];
    let spans = collector.trace(&trace_id, &wanted);
    let seen: BTreeSet<(&str, &str)> = spans.iter().map(|s| (s.service.as_str(), s.label())).collect();
    for w in wanted {
        assert!(seen.contains(&w), "no span of {w:?} in the approve's trace; seen {seen:?}\n{spans:#?}");
    }
    // The gateway's HTTP span is the child of the caller's span; the approval request is its
    // child, the registry's reserve and activation the approval's, the provisioner follows the
    // activation's events, and the audit writer records them all.
    let http_span = spans.iter().find(|s| s.service == "atasira-gateway" && s.name == "http").expect("the gateway's HTTP span");
    assert_eq!(http_span.attributes.get("http.route").map(String::as_str), Some("/api/v1/boxes/box-drafts/{draft_id}/approve"), "{http_span:?}");
    assert!(!http_span.parent.is_empty(), "the caller's traceparent is the parent");
    let of = |service: &str, name: &str| spans.iter().filter(|s| s.service == service && s.name == name).collect::<Vec<_>>();
    let approval = of("atasira-approval", "request");
    assert!(approval.iter().any(|s| s.parent == http_span.span_id), "{spans:#?}");
    let approval_ids: BTreeSet<&str> = approval.iter().map(|s| s.span_id.as_str()).collect();
    let registry = of("atasira-runtime-registry", "request");
    assert!(registry.iter().any(|s| approval_ids.contains(s.parent.as_str())), "the reserve is the approval's child: {spans:#?}");
    let activation: Vec<&Span> =
        of("atasira-runtime-registry", "consume").into_iter().filter(|s| s.attributes.get("consumer").is_some_and(|c| c == "registry_activation")).collect();
    assert!(activation.iter().any(|s| approval_ids.contains(s.parent.as_str())), "activation follows the approval's events: {spans:#?}");
    let registry_ids: BTreeSet<&str> = spans.iter().filter(|s| s.service == "atasira-runtime-registry").map(|s| s.span_id.as_str()).collect();
    assert!(
        of("atasira-provisioner", "consume").iter().any(|s| registry_ids.contains(s.parent.as_str())),
        "provisioning follows the activation's events: {spans:#?}"
    );
    assert!(!of("atasira-audit", "consume").is_empty(), "{spans:#?}");
    // The approve's events carry the trace context in the store and on the public feed.
    let metadata = sys.sql_text(&format!("SELECT CAST(metadata AS TEXT) FROM events WHERE aggregate_id = '{draft}' ORDER BY sequence DESC LIMIT 1"));
    assert!(metadata.contains(&trace_id), "{metadata}");
    let headers = feed_traceparents(&sys, &draft);
    assert!(headers.iter().any(|h| h.contains(&trace_id)), "the relay's publish carries the traceparent: {headers:?}");
    // Every span of every process names a service; no secret is an attribute.
    let all = collector.spans();
    assert!(all.iter().all(|s| s.service.starts_with("atasira-")), "{all:#?}");
    assert!(!all.iter().any(|s| s.attributes.values().any(|v| v.contains(&sys.admin))), "a secret in a span");
}

#[test]
fn r_ops_1_one_approve_is_one_trace_in_embedded_mode() {
    // `atasira dev` is one process: one service.name, and the spans name the service
    // (requests) or the consumer (events).
    let collector = Collector::start();
    let sys = System::start_with(Mode::Embedded, &otlp_env(&collector));
    let draft = sys.draft(&provisioned("traced-embedded"));
    let trace_id = approve_traced(&sys, &draft);
    let wanted = ["approval", "runtime-registry", "registry_activation", "provisioner", "audit_ledger"];
    let spans = collector.trace(&trace_id, &wanted.map(|w| ("atasira-dev", w)));
    let named: BTreeSet<&str> = spans.iter().map(Span::label).collect();
    for w in wanted {
        assert!(named.contains(w), "no span of {w} in the approve's trace; seen {named:?}");
    }
    assert!(spans.iter().all(|s| s.service == "atasira-dev"), "{spans:#?}");
}

#[test]
fn r_arch_15_a_huge_tracestate_is_ignored_and_stalls_nothing() {
    // given a cluster that exports spans (so the trace context is taken from callers)
    let collector = Collector::start();
    let sys = System::start_with(Mode::Cluster, &otlp_env(&collector));
    // when a draft is submitted with a valid traceparent and a 300 KB tracestate
    let trace_id = uuid::Uuid::new_v4().simple().to_string();
    let traceparent = format!("00-{trace_id}-{}-01", &uuid::Uuid::new_v4().simple().to_string()[..16]);
    let tracestate = format!("vendor={}", "a".repeat(300 * 1024));
    let body = provisioned("huge-tracestate").to_string();
    let a = http(
        "POST",
        &sys.url("/api/v1/boxes/box-drafts"),
        Some(&sys.agent),
        &[("traceparent", &traceparent), ("tracestate", &tracestate)],
        Some(body.as_bytes()),
    );
    // then it is accepted, and the stored event carries the caller's trace id without the
    // tracestate: no event grows with what a caller sends
    assert_eq!(a.status, 201, "{}", a.raw);
    let draft = a.body["draft_id"].as_str().expect("draft_id").to_owned();
    let metadata = sys.sql_text(&format!("SELECT CAST(metadata AS TEXT) FROM events WHERE aggregate_id = '{draft}' ORDER BY sequence LIMIT 1"));
    assert!(metadata.len() < 2048, "{} bytes of metadata", metadata.len());
    assert!(metadata.contains(&trace_id), "the traceparent is still taken: {metadata}");
    // and the relay goes on: the event and the next one reach the public feed
    assert!(!feed_traceparents(&sys, &draft).is_empty(), "the draft's event reached the feed");
    let next = sys.draft(&provisioned("after-tracestate"));
    assert!(!feed_traceparents(&sys, &next).is_empty(), "the next event reached the feed");
    assert_eq!(sys.sql_i64("SELECT count(*) FROM relay_dead_letters"), 0, "nothing was too large to relay");
}
