//! Span export over OTLP/HTTP (protobuf) when `OTEL_EXPORTER_OTLP_ENDPOINT` is set (R-OPS-1).
//!
//! The exporter reads the standard variables itself (`OTEL_EXPORTER_OTLP_ENDPOINT`, with
//! `/v1/traces` appended, or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`; `OTEL_EXPORTER_OTLP_HEADERS`;
//! `OTEL_BSP_SCHEDULE_DELAY` and the other batch settings). Spans are sent by the batch
//! processor's own thread with ureq, so no second HTTP or TLS stack comes with it.

use std::io::Read as _;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::trace::SdkTracerProvider;

/// Whether spans are to be exported: an OTLP endpoint is configured.
pub fn configured() -> bool {
    ["OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"].iter().any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()))
}

/// The exporting tracer provider for `service_name` (`service.name` of every span), with the
/// W3C trace context propagator set globally. Shut it down before exiting so that the last
/// spans are sent.
pub fn provider(service_name: &str) -> anyhow::Result<SdkTracerProvider> {
    let agent = ureq::AgentBuilder::new().timeout(std::time::Duration::from_secs(10)).build();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_http_client(Ureq(agent))
        .build()?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name(service_name.to_owned()).build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
    Ok(provider)
}

/// The tracing layer that records spans with `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer("atasira"))
}

/// The exporter's HTTP client: blocking ureq, called from the batch processor's thread.
#[derive(Debug)]
struct Ureq(ureq::Agent);

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for Ureq {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (parts, body) = request.into_parts();
        let mut call = self.0.request(parts.method.as_str(), &parts.uri.to_string());
        for (name, value) in &parts.headers {
            if let Ok(value) = value.to_str() {
                call = call.set(name.as_str(), value);
            }
        }
        let response = match call.send_bytes(&body) {
            Ok(r) | Err(ureq::Error::Status(_, r)) => r,
            Err(e) => return Err(Box::new(e)),
        };
        let status = response.status();
        let mut bytes = Vec::new();
        response.into_reader().take(1 << 20).read_to_end(&mut bytes)?;
        Ok(Response::builder().status(status).body(Bytes::from(bytes))?)
    }
}
