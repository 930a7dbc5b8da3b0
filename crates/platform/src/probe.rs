//! Liveness and readiness of a process (R-OPS-2), for container health checks and load
//! balancers: `GET /healthz` answers while the process runs; `GET /readyz` answers 200 only
//! when the process can do its work: NATS connected, the database answering, and none of
//! its consumers stalled (`Db::stalled_consumers`).
//!
//! [`router`] is the small HTTP server `atasira serve <service> --metrics-listen` runs; the
//! gateway answers [`readyz`] on its own listener too. The port also serves `/metrics`
//! (`metrics.rs`).

use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Response};
use axum::routing::get;
use serde_json::{Value, json};

use crate::Runtime;

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
    let stalled: Vec<Value> = rt.db.stalled_consumers().into_iter().map(|(consumer, error)| json!({"consumer": consumer, "error": error})).collect();
    let consumers = if stalled.is_empty() { json!({"ok": true}) } else { json!({"ok": false, "stalled": stalled}) };
    let ready = [&nats, &database, &consumers].iter().all(|c| c["ok"] == true);
    Readiness { ready, checks: json!({"nats": nats, "database": database, "consumers": consumers}) }
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
    let text = crate::metrics::render(&rt.db).await;
    ([(axum::http::header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

/// The probe port's routes: `/healthz`, `/readyz` and `/metrics`.
pub fn router(rt: Runtime) -> Router {
    Router::new().route("/healthz", get(healthz)).route("/readyz", get(readyz)).route("/metrics", get(metrics)).with_state(rt)
}

/// Serves [`router`] on `listener` until `shutdown` resolves.
pub async fn serve(listener: tokio::net::TcpListener, rt: Runtime, shutdown: impl std::future::Future<Output = ()> + Send + 'static) -> anyhow::Result<()> {
    axum::serve(listener, router(rt)).with_graceful_shutdown(shutdown).await?;
    Ok(())
}
