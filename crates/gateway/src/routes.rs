//! The C9 routes: decisions on drafts, the Box registry and the audit ledger. Each
//! authenticates, forwards to its service, waits for the projections a write affects
//! (R-BOX-9) and answers JSON.

use atasira_contracts::{Named, subjects, v1};
use atasira_domain::ErrorCode;
use axum::Json;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::{ApiError, AppState, body_or_error, consistency_headers, idempotency, openapi, require_json, wire_json};

/// Parses a JSON body with unknown fields refused (R-DRAFT-14); an empty body is `{}`.
fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let body: &[u8] = if body.iter().all(u8::is_ascii_whitespace) { b"{}" } else { body };
    require_json(body)?;
    serde_json::from_slice(body).map_err(|e| ApiError::new(ErrorCode::InvalidRequest, format!("request body: {e}")))
}

/// A write: forward, wait for read models, answer 200 with the service's JSON body.
async fn write<Req: Named, Resp: prost::Message + Default>(
    state: &AppState,
    headers: &HeaderMap,
    (route, body): (&str, &[u8]),
    service: &str,
    request: Req,
    body_of: fn(Resp) -> Result<Value, ApiError>,
) -> Result<Response, ApiError> {
    let status = StatusCode::OK;
    let principal = state.principal(headers).await?;
    idempotency::run(&state.rt.db, &principal, headers, route, body, async {
        let (reply, position, event_ids): (Resp, i64, Vec<String>) = state.call_written(service, &principal, &request).await?;
        let lagging = state.wait_for(position, &event_ids).await;
        let mut response = (status, Json(body_of(reply)?)).into_response();
        consistency_headers(&mut response, position, &lagging);
        Ok(response)
    })
    .await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ApproveBody {
    #[serde(default)]
    confirm_over_limit: bool,
}

/// `POST /api/v1/boxes/box-drafts/{draft_id}/approve` (R-APPROVE-2..4, R-APPROVE-6).
#[utoipa::path(post, path = "/api/v1/boxes/box-drafts/{draft_id}/approve", tag = "approval",
    params(("draft_id" = String, Path)), request_body(content = openapi::ApproveRequest),
    responses((status = 200, description = "Approved; the Box is active", body = Object), (status = 401, body = openapi::ErrorBody),
        (status = 403, description = "forbidden, self_approval_forbidden", body = openapi::ErrorBody), (status = 404, body = openapi::ErrorBody),
        (status = 409, description = "draft_not_pending, over_limit_confirmation_required, box_limit_reached, box_type_exists, manifest_exists", body = openapi::ErrorBody)),
    security(("pat" = [])))]
pub async fn approve(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(draft_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    state.principal(&headers).await?;
    let body = body_or_error(body)?;
    let b: ApproveBody = parse(&body)?;
    let request = v1::ApproveDraft { draft_id: draft_id.clone(), confirm_over_limit: b.confirm_over_limit };
    write(&state, &headers, (&format!("approve {draft_id}"), &body), subjects::APPROVAL, request, wire_json::decision).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RejectBody {
    #[serde(default)]
    reason: String,
}

/// `POST /api/v1/boxes/box-drafts/{draft_id}/reject` (R-APPROVE-5).
#[utoipa::path(post, path = "/api/v1/boxes/box-drafts/{draft_id}/reject", tag = "approval",
    params(("draft_id" = String, Path)), request_body(content = openapi::RejectRequest),
    responses((status = 200, description = "Rejected", body = Object), (status = 403, body = openapi::ErrorBody), (status = 404, body = openapi::ErrorBody), (status = 409, body = openapi::ErrorBody)),
    security(("pat" = [])))]
pub async fn reject(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(draft_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    state.principal(&headers).await?;
    let body = body_or_error(body)?;
    let b: RejectBody = parse(&body)?;
    let request = v1::RejectDraft { draft_id: draft_id.clone(), reason: b.reason };
    write(&state, &headers, (&format!("reject {draft_id}"), &body), subjects::APPROVAL, request, wire_json::decision).await
}

/// `POST /api/v1/boxes/box-drafts/{draft_id}/withdraw` (R-DRAFT-13): the requester, pending only.
#[utoipa::path(post, path = "/api/v1/boxes/box-drafts/{draft_id}/withdraw", tag = "drafts",
    params(("draft_id" = String, Path)), request_body(content = Object, description = "Empty or {}"),
    responses((status = 200, description = "Withdrawn", body = Object), (status = 404, body = openapi::ErrorBody), (status = 409, body = openapi::ErrorBody)),
    security(("pat" = [])))]
pub async fn withdraw(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(draft_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    state.principal(&headers).await?;
    let body = body_or_error(body)?;
    let _: serde_json::Map<String, Value> = parse(&body)?;
    write(&state, &headers, (&format!("withdraw {draft_id}"), &body), subjects::DRAFTS, v1::WithdrawDraft { draft_id }, wire_json::withdrawn).await
}

/// `GET /api/v1/boxes` (R-BOX-5): active Boxes, one per box_type; any authenticated caller.
#[utoipa::path(get, path = "/api/v1/boxes", tag = "boxes", responses((status = 200, description = "Active Boxes", body = Object), (status = 401, body = openapi::ErrorBody)), security(("pat" = [])))]
pub async fn list_boxes(State(state): State<AppState>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    let principal = state.principal(&headers).await?;
    let (reply, _): (v1::BoxList, i64) = state.call(subjects::RUNTIME_REGISTRY, &principal, &v1::ListBoxes {}).await?;
    let boxes: Vec<Value> = reply.boxes.iter().map(wire_json::box_summary).collect();
    Ok(Json(json!({"boxes": boxes})))
}

/// `GET /api/v1/boxes/{box_id}`: the Box with manifest, assignments and provisioning.
#[utoipa::path(get, path = "/api/v1/boxes/{box_id}", tag = "boxes", params(("box_id" = String, Path)),
    responses((status = 200, description = "The Box", body = Object), (status = 404, body = openapi::ErrorBody)), security(("pat" = [])))]
pub async fn get_box(State(state): State<AppState>, headers: HeaderMap, Path(box_id): Path<String>) -> Result<Json<Value>, ApiError> {
    let principal = state.principal(&headers).await?;
    let (reply, _): (v1::BoxReply, i64) = state.call(subjects::RUNTIME_REGISTRY, &principal, &v1::GetBox { box_id }).await?;
    Ok(Json(wire_json::box_view(reply)?))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AssignBody {
    user_id: String,
    role_in_box: BoxRoleBody,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "snake_case")]
enum BoxRoleBody {
    Primary,
    Member,
}

/// `POST /api/v1/boxes/{box_id}/user-assignments` (R-BOX-6): a human admin or the Box's primary.
#[utoipa::path(post, path = "/api/v1/boxes/{box_id}/user-assignments", tag = "boxes", params(("box_id" = String, Path)), request_body(content = openapi::AssignRequest),
    responses((status = 200, description = "The Box", body = Object), (status = 403, body = openapi::ErrorBody), (status = 404, body = openapi::ErrorBody)), security(("pat" = [])))]
pub async fn assign_user(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(box_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    state.principal(&headers).await?;
    let body = body_or_error(body)?;
    let b: AssignBody = parse(&body)?;
    let role_in_box = match b.role_in_box {
        BoxRoleBody::Primary => v1::BoxRole::Primary,
        BoxRoleBody::Member => v1::BoxRole::Member,
    } as i32;
    let request = v1::AssignUser { box_id: box_id.clone(), user_id: b.user_id, role_in_box };
    write(&state, &headers, (&format!("assign {box_id}"), &body), subjects::RUNTIME_REGISTRY, request, wire_json::box_view).await
}

async fn box_action(state: AppState, headers: HeaderMap, box_id: String, body: Result<Bytes, BytesRejection>, action: &str) -> Result<Response, ApiError> {
    state.principal(&headers).await?;
    let body = body_or_error(body)?;
    let _: serde_json::Map<String, Value> = parse(&body)?;
    let wire_action = match action {
        "stop" => v1::box_action::Action::Stop,
        "resume" => v1::box_action::Action::Resume,
        _ => v1::box_action::Action::Archive,
    } as i32;
    let request = v1::BoxAction { box_id: box_id.clone(), action: wire_action };
    write(&state, &headers, (&format!("{action} {box_id}"), &body), subjects::RUNTIME_REGISTRY, request, wire_json::box_view).await
}

/// `POST /api/v1/boxes/{box_id}/stop` (R-BOX-7): frees the slot, keeps the manifest.
#[utoipa::path(post, path = "/api/v1/boxes/{box_id}/stop", tag = "boxes", params(("box_id" = String, Path)), request_body(content = Object, description = "Empty or {}"), responses((status = 200, body = Object), (status = 403, body = openapi::ErrorBody)), security(("pat" = [])))]
pub async fn stop(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(box_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    box_action(state, headers, box_id, body, "stop").await
}

/// `POST /api/v1/boxes/{box_id}/resume` (R-BOX-7): takes a slot again or 409 `box_limit_reached`.
#[utoipa::path(post, path = "/api/v1/boxes/{box_id}/resume", tag = "boxes", params(("box_id" = String, Path)), request_body(content = Object, description = "Empty or {}"), responses((status = 200, body = Object), (status = 409, body = openapi::ErrorBody)), security(("pat" = [])))]
pub async fn resume(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(box_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    box_action(state, headers, box_id, body, "resume").await
}

/// `POST /api/v1/boxes/{box_id}/archive` (R-BOX-7): terminal; the YAML moves to `.archived/`.
#[utoipa::path(post, path = "/api/v1/boxes/{box_id}/archive", tag = "boxes", params(("box_id" = String, Path)), request_body(content = Object, description = "Empty or {}"), responses((status = 200, body = Object), (status = 403, body = openapi::ErrorBody)), security(("pat" = [])))]
pub async fn archive(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(box_id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    box_action(state, headers, box_id, body, "archive").await
}

#[derive(Debug, Deserialize)]
pub struct AuditQuery {
    action: Option<String>,
    target: Option<String>,
    since: Option<String>,
    limit: Option<u32>,
    cursor: Option<String>,
}

/// `GET /api/v1/audit?action=&target=&since=` (R-AUDIT-3): admins.
#[utoipa::path(get, path = "/api/v1/audit", tag = "audit",
    params(("action" = Option<String>, Query), ("target" = Option<String>, Query), ("since" = Option<String>, Query, description = "RFC 3339"), ("limit" = Option<u32>, Query), ("cursor" = Option<String>, Query)),
    responses((status = 200, description = "Ledger rows", body = Object), (status = 403, body = openapi::ErrorBody)), security(("pat" = [])))]
pub async fn audit(State(state): State<AppState>, headers: HeaderMap, query: Result<Query<AuditQuery>, QueryRejection>) -> Result<Json<Value>, ApiError> {
    let principal = state.principal(&headers).await?;
    let Query(q) = query.map_err(|e| ApiError::new(ErrorCode::InvalidRequest, e.body_text()))?;
    let request = v1::QueryAudit {
        action: q.action.unwrap_or_default(),
        target: q.target.unwrap_or_default(),
        since: match q.since.as_deref() {
            None | Some("") => None,
            Some(text) => Some(atasira_contracts::convert::timestamp(
                chrono::DateTime::parse_from_rfc3339(text)
                    .map_err(|e| ApiError::new(ErrorCode::InvalidQuery, format!("since must be an RFC 3339 time: {e}")))?
                    .with_timezone(&chrono::Utc),
            )),
        },
        limit: q.limit.unwrap_or(0),
        after: wire_json::parse_cursor(q.cursor.as_deref())?,
    };
    let (reply, _): (v1::AuditPage, i64) = state.call(subjects::AUDIT, &principal, &request).await?;
    Ok(Json(wire_json::audit_page(reply)?))
}

/// `GET /api/v1/audit/verify` (R-AUDIT-2): `{"ok": true, "rows": N}` or the first bad row.
#[utoipa::path(get, path = "/api/v1/audit/verify", tag = "audit", responses((status = 200, description = "Verification result", body = Object), (status = 403, body = openapi::ErrorBody)), security(("pat" = [])))]
pub async fn audit_verify(State(state): State<AppState>, headers: HeaderMap) -> Result<Json<Value>, ApiError> {
    let principal = state.principal(&headers).await?;
    let (reply, _): (v1::VerifyReply, i64) = state.call(subjects::AUDIT, &principal, &v1::VerifyAudit {}).await?;
    Ok(Json(wire_json::verification(reply)?))
}
