//! Liveness and readiness of a process (R-OPS-2), for container health checks and load
//! balancers: `GET /healthz` answers while the process runs; `GET /readyz` answers 200 only
//! when the process can do its work: NATS connected, the database answering, none of its
//! consumers stalled (`Db::stalled_consumers`), and none of its relays and consumers more
//! than [`MAX_LAG`] events behind.
//!
//! [`router`] is the small HTTP server `atasira serve <service> --metrics-listen` (and
//! `atasira dev --metrics-listen`) runs; the port also serves `/metrics` (`metrics.rs`).
//! It is for operators and their monitoring only: its answers name what failed (database
//! and NATS errors included), so the gateway's public address serves none of them.

use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Response};
use axum::routing::get;
use serde_json::{Value, json};

use atasira_platform::Runtime;

/// How many events a relay or consumer of the process may be behind and still be ready.
pub const MAX_LAG: i64 = 1000;

/// How long the database may take to answer the readiness question.
const DATABASE_WAIT: Duration = Duration::from_secs(2);

/// What the readiness checks found.
#[derive(Debug, Clone)]
pub struct Readiness {
    /// Whether every check passed.
    pub ready: bool,
    /// Each check by name (`nats`, `database`, `consumers`): `{"ok": bool, ...}`.
    pub checks: Value,
}

/// Runs the readiness checks of the process `rt` belongs to.
pub async fn readiness(rt: &Runtime) -> Readiness {
    let nats = match rt.bus.connected() {
        Ok(()) => json!({"ok": true}),
        Err(e) => json!({"ok": false, "error": e}),
    };
    let database = match tokio::time::timeout(DATABASE_WAIT, rt.db.ping()).await {
        Ok(Ok(())) => json!({"ok": true}),
        Ok(Err(e)) => json!({"ok": false, "error": format!("{e:#}")}),
        Err(_) => json!({"ok": false, "error": format!("the database did not answer within {} s", DATABASE_WAIT.as_secs())}),
    };
    let consumers = consumers_check(rt.db.stalled_consumers(), rt.db.lags().await, MAX_LAG);
    let ready = [&nats, &database, &consumers].iter().all(|c| c["ok"] == true);
    Readiness { ready, checks: json!({"nats": nats, "database": database, "consumers": consumers}) }
}

/// The consumers' check: none stalled, and none of the readers more than `bound` events
/// behind (a replica that just took over, or a backlog after an outage, serves stale reads
/// until it catches up).
fn consumers_check(stalled: Vec<(String, String)>, lags: Vec<(String, &'static str, i64)>, bound: i64) -> Value {
    let stalled: Vec<Value> = stalled.into_iter().map(|(consumer, error)| json!({"consumer": consumer, "error": error})).collect();
    let behind: Vec<Value> =
        lags.into_iter().filter(|(_, _, lag)| *lag > bound).map(|(reader, _, lag)| json!({"reader": reader, "behind": lag, "bound": bound})).collect();
    if stalled.is_empty() && behind.is_empty() { json!({"ok": true}) } else { json!({"ok": false, "stalled": stalled, "behind": behind}) }
}

/// `GET /readyz`: 200 `{"status": "ready"}`, or 503 `{"status": "not_ready", "checks":
/// {...}}` naming what failed.
pub async fn answer(rt: &Runtime) -> Response {
    let readiness = readiness(rt).await;
    if readiness.ready {
        return Json(json!({"status": "ready"})).into_response();
    }
    (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "not_ready", "checks": readiness.checks}))).into_response()
}

/// `GET /healthz` on the probe port: the process is alive.
async fn healthz() -> Response {
    Json(json!({"status": "alive"})).into_response()
}

async fn readyz(State(rt): State<Runtime>) -> Response {
    answer(&rt).await
}

/// `GET /metrics`: the process's metrics (`metrics.rs`), Prometheus text.
async fn metrics(State(rt): State<Runtime>) -> Response {
    let text = atasira_platform::metrics::render(rt.db.lags().await).await;
    ([(axum::http::header::CONTENT_TYPE, atasira_platform::metrics::CONTENT_TYPE)], text).into_response()
}

/// The probe port's routes: `/healthz`, `/readyz` and `/metrics`.
pub fn router(rt: Runtime) -> Router {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).route("/metrics", get(metrics)).with_state(rt)
}

/// The probe port of an execution host (no database): `/healthz`, `/readyz` (200 while it
/// is connected to NATS) and `/metrics` (its tool-call decisions among them).
pub fn host_router(bus: std::sync::Arc<dyn atasira_platform::bus::Bus>) -> Router {
    async fn ready(State(bus): State<std::sync::Arc<dyn atasira_platform::bus::Bus>>) -> Response {
        match bus.connected() {
            Ok(()) => Json(json!({"status": "ready"})).into_response(),
            Err(e) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "not_ready", "checks": {"nats": {"ok": false, "error": e}}}))).into_response(),
        }
    }
    async fn host_metrics() -> Response {
        let text = atasira_platform::metrics::render(Vec::new()).await;
        ([(axum::http::header::CONTENT_TYPE, atasira_platform::metrics::CONTENT_TYPE)], text).into_response()
    }
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(ready)).route("/metrics", get(host_metrics)).with_state(bus)
}

/// Serves [`router`] on `listener` until `shutdown` resolves.
pub async fn serve(listener: tokio::net::TcpListener, rt: Runtime, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    axum::serve(listener, router(rt)).with_graceful_shutdown(shutdown).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_far_behind_or_a_stalled_consumer_is_not_ready() {
        // Given readers within the bound and nothing stalled, then ready.
        let near = vec![("drafts_view".to_owned(), "consumer", 3), ("relay-drafts".to_owned(), "relay", 1000)];
        assert_eq!(consumers_check(vec![], near.clone(), 1000), json!({"ok": true}));
        // When one reader is past the bound, then not ready, naming it.
        let far = vec![("drafts_view".to_owned(), "consumer", 1001)];
        let check = consumers_check(vec![], far, 1000);
        assert_eq!(check["ok"], false);
        assert_eq!(check["behind"][0], json!({"reader": "drafts_view", "behind": 1001, "bound": 1000}));
        // When a consumer is stalled, then not ready, naming it and its error.
        let check = consumers_check(vec![("audit_ledger".to_owned(), "bad event".to_owned())], near, 1000);
        assert_eq!(check["stalled"][0], json!({"consumer": "audit_ledger", "error": "bad event"}));
    }
}
