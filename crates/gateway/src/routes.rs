//! The routes. Each takes its caller, ids, query and body through the extractors of
//! `extract.rs` and `query.rs`, forwards to its service, waits for the projections a write
//! affects (R-BOX-9) and answers one of the HTTP types of `api/`.
//!
//! The OpenAPI annotations name each route's own refusals; `openapi.rs` adds the ones
//! every route shares (401, 500, 503, and 400/413/422 for bodies, 400 for queries).

use std::future::Future;

use atasira_contracts::{Request, Written, subjects, v1};
use atasira_domain::{ErrorCode, Principal};
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use prost::Message as _;
use serde::Serialize;
use v1::box_action::Action;

use crate::api::{self, ErrorBody};
use crate::extract::{Admin, BoxUser, Caller, HumanAdmin, Id, IdempotencyKey, RawBody};
use crate::query::{
    AsOfQuery, AuditQuery, BoxesQuery, DraftsQuery, ExportQuery, HistoryQuery, IdempotencyHeader, Params, PendingQuery, RevokeUserQuery, TokensQuery,
    ToolRequestsQuery, WebhookDeliveriesQuery, WorkersQuery,
};
use crate::{ApiError, AppState, consistency_headers, from_wire, idempotency};

/// A read: ask the service, answer its reply as `Out`.
async fn read<Req: Request, Out: TryFrom<Req::Reply, Error = ApiError>>(
    state: &AppState,
    principal: &Principal,
    service: &str,
    request: Req,
) -> Result<Json<Out>, ApiError> {
    let (reply, _) = state.call(service, principal, &request).await?;
    Out::try_from(reply).map(Json)
}

/// A write: at most once per Idempotency-Key; forward, wait for the read models, answer
/// `status` with the reply as `Out` and the consistency headers.
async fn write<Req: Request, Out: TryFrom<Req::Reply, Error = ApiError> + Serialize>(
    state: &AppState,
    principal: &Principal,
    key: &IdempotencyKey,
    (route, body): (&str, &[u8]),
    service: &str,
    request: Req,
    status: StatusCode,
) -> Result<Response, ApiError> {
    idempotency::run(state, principal, key, route, body, async {
        let idempotency_key = key.key.as_deref().unwrap_or_default();
        let Written { reply, position, event_ids } = match state.call_keyed(service, principal, &request, idempotency_key).await {
            Ok(written) => written,
            Err(refused) => return state.refusal(refused).await,
        };
        let lagging = state.wait_for(position, &event_ids).await;
        let mut response = (status, Json(Out::try_from(reply)?)).into_response();
        consistency_headers(&mut response, position, &lagging);
        Ok(response)
    })
    .await
}

/// The check order (R-DRAFT-14, R-AUTH-1): 401 and 403 are the extractors' (`Caller`,
/// `Admin`, `HumanAdmin`); a request that does not validate (a malformed Idempotency-Key, a
/// body that is unreadable, too large or not what the route takes: 400/413/422) is first held
/// against its target, so an unknown id is 404 whatever else is wrong. The target is looked
/// up only then: a valid request costs nothing more.
async fn validated<T>(checked: Result<T, ApiError>, target: impl Future<Output = Result<(), ApiError>>) -> Result<T, ApiError> {
    match checked {
        Ok(value) => Ok(value),
        Err(invalid) => {
            target.await?;
            Err(invalid)
        }
    }
}

/// The draft, as `principal` may see it (404 `draft_not_found` otherwise).
async fn draft_exists(state: &AppState, principal: &Principal, draft_id: &str) -> Result<(), ApiError> {
    let request = v1::GetDraft { draft_id: draft_id.to_owned(), ..Default::default() };
    state.call(subjects::DRAFTS, principal, &request).await.map(|_| ())
}

/// The Box (404 `box_not_found` otherwise).
async fn box_exists(state: &AppState, principal: &Principal, box_id: &str) -> Result<(), ApiError> {
    state.call(subjects::RUNTIME_REGISTRY, principal, &v1::GetBox { box_id: box_id.to_owned(), ..Default::default() }).await.map(|_| ())
}

// --- drafts -----------------------------------------------------------------------------

/// Submit a draft (any authenticated caller). The draft is always `pending_approval`.
#[utoipa::path(post, path = "/api/v1/boxes/box-drafts", tag = "drafts", params(IdempotencyHeader),
    request_body(content = api::BoxDraftCreateRequest, description = "The draft. Unknown fields are refused."),
    responses(
        (status = 201, description = "Stored, pending approval", body = api::DraftCreated),
        (status = 403, description = "`self_privilege_forbidden`: box_type admin-pm or admin-ops", body = ErrorBody),
        (status = 409, description = "`box_type_exists`: the box_type has a Box; the message names its change-request route (POST /api/v1/boxes/{box_id}/change-requests)", body = ErrorBody),
        (status = 422, description = "`box_manifest_validation` (details: the field errors, among them a list or text over its bound, `maxItems` and `maxLength` here, naming the key and the limit), `invalid_request` (unknown fields, wrong types, a malformed Idempotency-Key), `idempotency_key_reuse`", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("authenticated"))))]
pub async fn submit_draft(State(state): State<AppState>, Caller(principal): Caller, key: IdempotencyKey, body: RawBody) -> Result<Response, ApiError> {
    key.check()?;
    let request = v1::SubmitDraft { request: Some(from_wire::draft_request(body.json()?)?) };
    write::<_, api::DraftCreated>(&state, &principal, &key, ("POST /boxes/box-drafts", body.raw()), subjects::DRAFTS, request, StatusCode::CREATED).await
}

/// Pending drafts, oldest first (admins).
#[utoipa::path(get, path = "/api/v1/boxes/box-drafts/pending", tag = "drafts", params(PendingQuery),
    responses(
        (status = 200, description = "A page of pending drafts", body = api::DraftPage),
        (status = 403, description = "`forbidden`: needs role admin", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin"))))]
pub async fn pending_drafts(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Params(q): Params<PendingQuery>,
) -> Result<Json<api::DraftPage>, ApiError> {
    let page = q.page();
    read::<_, _>(&state, &principal, subjects::DRAFTS, v1::ListPendingDrafts { limit: page.limit(), after: page.after() }).await
}

/// Drafts in submission order, decided ones included: with `mine=true` the caller's own
/// (anyone), otherwise every requester's (role admin); `status` filters.
#[utoipa::path(get, path = "/api/v1/boxes/box-drafts", tag = "drafts", params(DraftsQuery),
    responses(
        (status = 200, description = "A page of drafts", body = api::DraftPage),
        (status = 403, description = "`forbidden`: every requester's drafts need role admin (use `mine=true` for your own)", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("authenticated; every requester's drafts: admin"))))]
pub async fn list_drafts(State(state): State<AppState>, Caller(principal): Caller, Params(q): Params<DraftsQuery>) -> Result<Json<api::DraftPage>, ApiError> {
    let page = q.page();
    let status = q.status.map_or(v1::DraftStatus::Unspecified, |s| atasira_contracts::convert::draft_status_to_wire(s.into())) as i32;
    let request = v1::ListDrafts { status, mine: q.mine, limit: page.limit(), after: page.after() };
    read::<_, _>(&state, &principal, subjects::DRAFTS, request).await
}

/// One draft with its status, decision and manifest (the requester or an admin); with
/// `at`, as it was then (pending, or decided and by whom), replayed from its events.
#[utoipa::path(get, path = "/api/v1/boxes/box-drafts/{draft_id}", tag = "drafts", params(("draft_id" = String, Path), AsOfQuery),
    responses(
        (status = 200, description = "The draft", body = api::DraftDetail),
        (status = 400, description = "`invalid_query`: `at` is neither a store position nor an RFC 3339 time", body = ErrorBody),
        (status = 404, description = "`draft_not_found`: no such draft (then), or not yours", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("requester_or_admin"))))]
pub async fn get_draft(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(draft_id): Id,
    Params(q): Params<AsOfQuery>,
) -> Result<Json<api::DraftDetail>, ApiError> {
    let (at, at_time) = q.wire();
    read::<_, _>(&state, &principal, subjects::DRAFTS, v1::GetDraft { draft_id, at, at_time }).await
}

/// Withdraw a pending draft (the requester).
#[utoipa::path(post, path = "/api/v1/boxes/box-drafts/{draft_id}/withdraw", tag = "drafts", params(("draft_id" = String, Path), IdempotencyHeader),
    request_body(content = Option<api::EmptyRequest>, description = "Empty or `{}`"),
    responses(
        (status = 200, description = "Withdrawn", body = api::DraftStatusChanged),
        (status = 403, description = "`forbidden`: an admin may see the draft, but only its requester may withdraw it", body = ErrorBody),
        (status = 404, description = "`draft_not_found`: no such draft, or not yours", body = ErrorBody),
        (status = 409, description = "`draft_not_pending`", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("requester"))))]
pub async fn withdraw(
    State(state): State<AppState>,
    Caller(principal): Caller,
    key: IdempotencyKey,
    Id(draft_id): Id,
    body: RawBody,
) -> Result<Response, ApiError> {
    let api::EmptyRequest {} = validated(key.check().and_then(|()| body.parse()), draft_exists(&state, &principal, &draft_id)).await?;
    let route = format!("withdraw {draft_id}");
    let request = v1::WithdrawDraft { draft_id };
    write::<_, api::DraftStatusChanged>(&state, &principal, &key, (&route, body.raw()), subjects::DRAFTS, request, StatusCode::OK).await
}

/// Revise a rejected draft or change request (its requester): a JSON merge patch of its
/// manifest's keys (`box_type` and `version`, if given, the draft's own) makes a new
/// pending version that keeps the thread: who rejected it and why, the earlier versions,
/// and what this version changes.
#[utoipa::path(post, path = "/api/v1/boxes/box-drafts/{draft_id}/revise", tag = "drafts", params(("draft_id" = String, Path), IdempotencyHeader),
    request_body(content = Object, content_type = "application/merge-patch+json", description = "A JSON merge patch of the rejected version's manifest. `application/json` is read the same way."),
    responses(
        (status = 201, description = "The new version, pending approval, with its `revision`", body = api::DraftDetail),
        (status = 403, description = "`forbidden`: an admin may see the draft, but only its requester may revise it", body = ErrorBody),
        (status = 404, description = "`draft_not_found`: no such draft, or not yours", body = ErrorBody),
        (status = 409, description = "`draft_not_pending`: the draft is not rejected, or was revised already (the message names its revision); `box_not_active`: a change request's Box is archived", body = ErrorBody),
        (status = 422, description = "`box_manifest_validation` (details names each key), `invalid_request` (not a JSON object, or a patch that changes nothing)", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("requester"))))]
pub async fn revise(
    State(state): State<AppState>,
    Caller(principal): Caller,
    key: IdempotencyKey,
    Id(draft_id): Id,
    body: RawBody,
) -> Result<Response, ApiError> {
    let patch = validated(patch_body(&key, &body), draft_exists(&state, &principal, &draft_id)).await?;
    let route = format!("revise {draft_id}");
    let request = v1::ReviseDraft { draft_id, patch: Some(patch) };
    write::<_, api::DraftDetail>(&state, &principal, &key, (&route, body.raw()), subjects::DRAFTS, request, StatusCode::CREATED).await
}

/// A merge-patch body as protobuf: a JSON object whose whole numbers travel exactly.
fn patch_body(key: &IdempotencyKey, body: &RawBody) -> Result<prost_types::Struct, ApiError> {
    match key.check().and_then(|()| body.json()) {
        Ok(serde_json::Value::Object(map)) => match inexact_integer(&map) {
            None => Ok(atasira_contracts::manifest::struct_to_proto(&map)),
            Some(key) => Err(ApiError::new(
                ErrorCode::InvalidRequest,
                format!("{key}: numbers travel as doubles; a whole number must be within ±{MAX_EXACT_INTEGER} to arrive unchanged"),
            )),
        },
        Ok(_) => Err(ApiError::new(ErrorCode::InvalidRequest, "request body must be a JSON object")),
        Err(e) => Err(e),
    }
}

// --- approval ---------------------------------------------------------------------------

/// Approve a draft (a human admin, not the requester): the Box is activated.
#[utoipa::path(post, path = "/api/v1/boxes/box-drafts/{draft_id}/approve", tag = "approval", params(("draft_id" = String, Path), IdempotencyHeader),
    request_body(content = Option<api::ApproveRequest>, description = "Empty or `{\"confirm_over_limit\": bool}`"),
    responses(
        (status = 200, description = "Approved; the Box is active", body = api::Approved),
        (status = 403, description = "`forbidden` (needs a human admin), `self_approval_forbidden`", body = ErrorBody),
        (status = 404, description = "`draft_not_found`", body = ErrorBody),
        (status = 409, description = "`draft_not_pending`, `over_limit_confirmation_required`, `box_limit_reached`, `box_type_exists`, `manifest_exists`", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin"))))]
pub async fn approve(
    State(state): State<AppState>,
    HumanAdmin(principal): HumanAdmin,
    Id(draft_id): Id,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    let b: api::ApproveRequest = validated(key.check().and_then(|()| body.parse()), draft_exists(&state, &principal, &draft_id)).await?;
    let route = format!("approve {draft_id}");
    let request = v1::ApproveDraft { draft_id, confirm_over_limit: b.confirm_over_limit };
    write::<_, api::Approved>(&state, &principal, &key, (&route, body.raw()), subjects::APPROVAL, request, StatusCode::OK).await
}

/// Reject a draft (a human admin, not the requester).
#[utoipa::path(post, path = "/api/v1/boxes/box-drafts/{draft_id}/reject", tag = "approval", params(("draft_id" = String, Path), IdempotencyHeader),
    request_body(content = Option<api::RejectRequest>, description = "Empty or `{\"reason\": text}`"),
    responses(
        (status = 200, description = "Rejected", body = api::DraftStatusChanged),
        (status = 403, description = "`forbidden` (needs a human admin), `self_approval_forbidden`", body = ErrorBody),
        (status = 404, description = "`draft_not_found`", body = ErrorBody),
        (status = 409, description = "`draft_not_pending`", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin"))))]
pub async fn reject(
    State(state): State<AppState>,
    HumanAdmin(principal): HumanAdmin,
    Id(draft_id): Id,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    let b: api::RejectRequest = validated(key.check().and_then(|()| body.parse()), draft_exists(&state, &principal, &draft_id)).await?;
    let route = format!("reject {draft_id}");
    let request = v1::RejectDraft { draft_id, reason: b.reason };
    write::<_, api::DraftStatusChanged>(&state, &principal, &key, (&route, body.raw()), subjects::APPROVAL, request, StatusCode::OK).await
}

// --- Boxes ------------------------------------------------------------------------------

/// Boxes in activation order (any caller): by default the active ones (idle or running),
/// one per box_type; `state` narrows or widens (`stopped`, `archived`, `all`; archived
/// Boxes stay listed, several of a box_type once one is archived).
#[utoipa::path(get, path = "/api/v1/boxes", tag = "boxes", params(BoxesQuery),
    responses((status = 200, description = "A page of Boxes", body = api::BoxList)),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("authenticated"))))]
pub async fn list_boxes(State(state): State<AppState>, Caller(principal): Caller, Params(q): Params<BoxesQuery>) -> Result<Json<api::BoxList>, ApiError> {
    let page = q.page();
    let filter = match q.state {
        None => v1::BoxStateFilter::Unspecified,
        Some(api::BoxStateFilter::Idle) => v1::BoxStateFilter::Idle,
        Some(api::BoxStateFilter::Running) => v1::BoxStateFilter::Running,
        Some(api::BoxStateFilter::Stopped) => v1::BoxStateFilter::Stopped,
        Some(api::BoxStateFilter::Archived) => v1::BoxStateFilter::Archived,
        Some(api::BoxStateFilter::All) => v1::BoxStateFilter::All,
    } as i32;
    let request = v1::ListBoxesPage { state: filter, limit: page.limit(), after: page.after() };
    read::<_, _>(&state, &principal, subjects::RUNTIME_REGISTRY, request).await
}

/// One Box with manifest, assignments, provisioning and drift (any caller); with `at`, as
/// it was then: its manifest, assignments, state and the approver of the manifest in force,
/// replayed from its events (drift is not known of the past: false).
#[utoipa::path(get, path = "/api/v1/boxes/{box_id}", tag = "boxes", params(("box_id" = String, Path), AsOfQuery),
    responses(
        (status = 200, description = "The Box", body = api::BoxDetail),
        (status = 400, description = "`invalid_query`: `at` is neither a store position nor an RFC 3339 time", body = ErrorBody),
        (status = 404, description = "`box_not_found`: no such Box (then)", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("authenticated"))))]
pub async fn get_box(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(box_id): Id,
    Params(q): Params<AsOfQuery>,
) -> Result<Json<api::BoxDetail>, ApiError> {
    let (at, at_time) = q.wire();
    read::<_, _>(&state, &principal, subjects::RUNTIME_REGISTRY, v1::GetBox { box_id, at, at_time }).await
}

/// Assign a user to a Box (a human admin or the Box's primary).
#[utoipa::path(post, path = "/api/v1/boxes/{box_id}/user-assignments", tag = "boxes", params(("box_id" = String, Path), IdempotencyHeader),
    request_body(content = api::AssignRequest, description = "Unknown fields are refused."),
    responses(
        (status = 200, description = "The Box", body = api::BoxDetail),
        (status = 403, description = "`forbidden`: needs a human admin or the Box's primary", body = ErrorBody),
        (status = 404, description = "`box_not_found`", body = ErrorBody),
        (status = 409, description = "`box_not_active`: the Box is archived or changed meanwhile", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin_or_box_primary"))))]
pub async fn assign_user(
    State(state): State<AppState>,
    Caller(principal): Caller,
    key: IdempotencyKey,
    Id(box_id): Id,
    body: RawBody,
) -> Result<Response, ApiError> {
    let b: api::AssignRequest = validated(key.check().and_then(|()| body.parse()), box_exists(&state, &principal, &box_id)).await?;
    let route = format!("assign {box_id}");
    let role_in_box = match b.role_in_box {
        api::RoleInBox::Primary => v1::BoxRole::Primary,
        api::RoleInBox::Member => v1::BoxRole::Member,
    } as i32;
    let request = v1::AssignUser { box_id, user_id: b.user_id, role_in_box };
    write::<_, api::BoxDetail>(&state, &principal, &key, (&route, body.raw()), subjects::RUNTIME_REGISTRY, request, StatusCode::OK).await
}

async fn box_action(state: AppState, principal: Principal, key: IdempotencyKey, box_id: String, body: RawBody, action: Action) -> Result<Response, ApiError> {
    let api::EmptyRequest {} = validated(key.check().and_then(|()| body.parse()), box_exists(&state, &principal, &box_id)).await?;
    // The idempotency scope: "stop <id>", "resume <id>", "archive <id>".
    let verb = action.as_str_name().trim_start_matches("ACTION_").to_ascii_lowercase();
    let route = format!("{verb} {box_id}");
    let request = v1::BoxAction { box_id, action: action as i32 };
    write::<_, api::BoxDetail>(&state, &principal, &key, (&route, body.raw()), subjects::RUNTIME_REGISTRY, request, StatusCode::OK).await
}

/// Stop a Box (a human admin): frees its slot, keeps the manifest.
#[utoipa::path(post, path = "/api/v1/boxes/{box_id}/stop", tag = "boxes", params(("box_id" = String, Path), IdempotencyHeader),
    request_body(content = Option<api::EmptyRequest>, description = "Empty or `{}`"),
    responses(
        (status = 200, description = "The Box, stopped", body = api::BoxDetail),
        (status = 403, description = "`forbidden`: needs a human admin", body = ErrorBody),
        (status = 404, description = "`box_not_found`", body = ErrorBody),
        (status = 409, description = "`box_not_active`: not running (stopped or archived), or changed meanwhile", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin"))))]
pub async fn stop(
    State(state): State<AppState>,
    HumanAdmin(principal): HumanAdmin,
    Id(box_id): Id,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    box_action(state, principal, key, box_id, body, Action::Stop).await
}

/// Resume a stopped Box (a human admin): takes a slot again.
#[utoipa::path(post, path = "/api/v1/boxes/{box_id}/resume", tag = "boxes", params(("box_id" = String, Path), IdempotencyHeader),
    request_body(content = Option<api::EmptyRequest>, description = "Empty or `{}`"),
    responses(
        (status = 200, description = "The Box, idle again", body = api::BoxDetail),
        (status = 403, description = "`forbidden`: needs a human admin", body = ErrorBody),
        (status = 404, description = "`box_not_found`", body = ErrorBody),
        (status = 409, description = "`box_limit_reached`, `box_not_active` (archived, not stopped, or changed meanwhile), `box_type_exists`", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin"))))]
pub async fn resume(
    State(state): State<AppState>,
    HumanAdmin(principal): HumanAdmin,
    Id(box_id): Id,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    box_action(state, principal, key, box_id, body, Action::Resume).await
}

/// Archive a Box (a human admin): final; its YAML moves to `.archived/` and the box_type
/// may be drafted again.
#[utoipa::path(post, path = "/api/v1/boxes/{box_id}/archive", tag = "boxes", params(("box_id" = String, Path), IdempotencyHeader),
    request_body(content = Option<api::EmptyRequest>, description = "Empty or `{}`"),
    responses(
        (status = 200, description = "The Box, archived", body = api::BoxDetail),
        (status = 403, description = "`forbidden`: needs a human admin", body = ErrorBody),
        (status = 404, description = "`box_not_found`", body = ErrorBody),
        (status = 409, description = "`box_not_active`: archived already, or changed meanwhile", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin"))))]
pub async fn archive(
    State(state): State<AppState>,
    HumanAdmin(principal): HumanAdmin,
    Id(box_id): Id,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    box_action(state, principal, key, box_id, body, Action::Archive).await
}

/// The Box's whole life, oldest first (any caller): activation, assignments and
/// unassignments, edits (who, when, which keys), stop, resume, archive and provisioning
/// outcomes, read from the event store.
#[utoipa::path(get, path = "/api/v1/boxes/{box_id}/history", tag = "boxes", params(("box_id" = String, Path), HistoryQuery),
    responses((status = 200, description = "A page of the Box's history", body = api::BoxHistory), (status = 404, description = "`box_not_found`", body = ErrorBody)),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("authenticated"))))]
pub async fn box_history(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(box_id): Id,
    Params(q): Params<HistoryQuery>,
) -> Result<Json<api::BoxHistory>, ApiError> {
    let (after_tx, after) = q.cursor.map_or((0, 0), |c| (c.tx_id, c.position));
    let request = v1::GetBoxHistory { box_id: box_id.clone(), limit: q.limit.map(crate::query::Limit::get).unwrap_or(0), after, after_tx };
    let Json(mut history) = read::<_, api::BoxHistory>(&state, &principal, subjects::RUNTIME_REGISTRY, request).await?;
    history.box_id = box_id;
    Ok(Json(history))
}

/// Remove a user from a Box (a human admin or the Box's primary).
#[utoipa::path(delete, path = "/api/v1/boxes/{box_id}/user-assignments/{user_id}", tag = "boxes",
    params(("box_id" = String, Path), ("user_id" = String, Path), IdempotencyHeader),
    responses(
        (status = 200, description = "The Box, without the assignment", body = api::BoxDetail),
        (status = 403, description = "`forbidden`: needs a human admin or the Box's primary", body = ErrorBody),
        (status = 404, description = "`box_not_found`, `assignment_not_found`: the user is not assigned to the Box", body = ErrorBody),
        (status = 409, description = "`box_not_active`: the Box is archived or changed meanwhile", body = ErrorBody),
        (status = 422, description = "`invalid_request`: a malformed Idempotency-Key; `idempotency_key_reuse`", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin or the Box's primary"))))]
pub async fn unassign_user(State(state): State<AppState>, Caller(principal): Caller, key: IdempotencyKey, ids: BoxUser) -> Result<Response, ApiError> {
    let BoxUser { box_id, user_id } = ids;
    validated(key.check(), box_exists(&state, &principal, &box_id)).await?;
    // The idempotency scope names the Box and the user: the request has no body.
    let route = format!("unassign {box_id} {user_id}");
    let request = v1::UnassignUser { box_id, user_id };
    write::<_, api::BoxDetail>(&state, &principal, &key, (&route, b""), subjects::RUNTIME_REGISTRY, request, StatusCode::OK).await
}

/// Can the Box of `box_type` take this task within what was approved (any caller)? A
/// deterministic English/Japanese keyword check, read-only (nothing is recorded).
#[utoipa::path(post, path = "/api/v1/boxes/feasibility", tag = "boxes",
    request_body(content = api::FeasibilityRequest, description = "Unknown fields are refused."),
    responses(
        (status = 200, description = "The assessment", body = api::FeasibilityAnswer),
        (status = 404, description = "`box_not_found`: no Box of that box_type (or only archived ones); a new kind of Box needs a draft", body = ErrorBody),
        (status = 422, description = "`invalid_request`: unknown fields, wrong types, or a blank task_description or one over its `maxLength`", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("authenticated"))))]
pub async fn feasibility(State(state): State<AppState>, Caller(principal): Caller, body: RawBody) -> Result<Json<api::FeasibilityAnswer>, ApiError> {
    let b: api::FeasibilityRequest = body.parse()?;
    let request = v1::AssessFeasibility { task_description: b.task_description, box_type: b.box_type };
    read::<_, _>(&state, &principal, subjects::RUNTIME_REGISTRY, request).await
}

// --- edits after activation -------------------------------------------------------------

/// The largest whole number a double holds exactly (2^53 - 1).
const MAX_EXACT_INTEGER: u64 = (1 << 53) - 1;

/// The key of the first whole number in `map` that a double (protobuf `Struct`'s only
/// number) would not carry exactly, e.g. `business_procedure[0].step`.
fn inexact_integer(map: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    fn walk(value: &serde_json::Value, path: String) -> Option<String> {
        match value {
            serde_json::Value::Number(n) => {
                let magnitude = n.as_u64().or_else(|| n.as_i64().map(i64::unsigned_abs));
                magnitude.is_some_and(|m| m > MAX_EXACT_INTEGER).then_some(path)
            }
            serde_json::Value::Array(items) => items.iter().enumerate().find_map(|(i, v)| walk(v, format!("{path}[{i}]"))),
            serde_json::Value::Object(map) => map.iter().find_map(|(k, v)| walk(v, if path.is_empty() { k.clone() } else { format!("{path}.{k}") })),
            _ => None,
        }
    }
    map.iter().find_map(|(k, v)| walk(v, k.clone()))
}

/// The edit request for a body: a JSON object, as a protobuf Struct (after the
/// Idempotency-Key is found well-formed). Its keys are the
/// registry's to judge (an unknown key of a mentor edit is a security violation, not a
/// malformed request), so the gateway checks only that it is an object. A body that is
/// not is answered in the spec's order (401, 403, 404, then 400/422): the registry is
/// first asked the same edit, empty, which changes nothing, so who may not edit, or a Box
/// that does not exist, is answered as such.
async fn edit_request<Req: Request>(
    state: &AppState,
    principal: &Principal,
    key: &IdempotencyKey,
    body: &RawBody,
    request: impl Fn(prost_types::Struct) -> Req,
) -> Result<Req, ApiError> {
    let object = match patch_body(key, body) {
        Ok(patch) => return Ok(request(patch)),
        Err(e) => e,
    };
    state.call(subjects::RUNTIME_REGISTRY, principal, &request(prost_types::Struct::default())).await?;
    Err(object)
}

/// A mentor edit of the Box's wording (a human admin): purpose, success criteria,
/// prohibited actions, business procedure. The Box's view and its manifest file follow.
#[utoipa::path(put, path = "/api/v1/boxes/{box_id}/manifest", tag = "boxes", params(("box_id" = String, Path), IdempotencyHeader),
    request_body(content = api::MentorEditRequest, description = "Only the four keys; any other key, top-level or nested, is refused (403) and recorded on the audit ledger."),
    responses(
        (status = 200, description = "The Box with its edited manifest (minor version bumped when something changed)", body = api::BoxDetail),
        (status = 403, description = "`forbidden`: needs a human admin; `mentor_edit_prohibited_key`: a key other than the four (one of the prohibited keys, another manifest key, or a key of no manifest, top-level or nested such as `business_procedure[0].x`); details names each key, nothing changes, and a `security_violation` row naming them is on the audit ledger (`X-Atasira-Position` says where)", body = ErrorBody,
            headers(("X-Atasira-Position" = i64, description = "With `mentor_edit_prohibited_key`: the position of the recorded security violation"))),
        (status = 404, description = "`box_not_found`", body = ErrorBody),
        (status = 409, description = "`box_not_active`: the Box is archived; `conflict`: a concurrent edit was recorded first (retry)", body = ErrorBody),
        (status = 422, description = "`box_manifest_validation` (details names the key: a blank purpose, a null, a wrong type, a text or list over its bound), `invalid_request` (the body is not a JSON object, or holds a whole number beyond ±2^53, which cannot travel exactly)", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin"))))]
pub async fn edit_manifest(
    State(state): State<AppState>,
    Caller(principal): Caller,
    key: IdempotencyKey,
    Id(box_id): Id,
    body: RawBody,
) -> Result<Response, ApiError> {
    let route = format!("edit manifest {box_id}");
    let request = edit_request(&state, &principal, &key, &body, |edit| v1::EditBoxManifest { box_id: box_id.clone(), edit: Some(edit) }).await?;
    write::<_, api::BoxDetail>(&state, &principal, &key, (&route, body.raw()), subjects::RUNTIME_REGISTRY, request, StatusCode::OK).await
}

/// A config edit of the Box's operating parameters (a human admin or the Box's primary):
/// a JSON merge patch (RFC 7396) of `config_defaults`, `trigger_schedule`, `notify`,
/// `credentials` (names only), `shell` and `browser`, within what was approved. The Box's
/// view and its manifest file follow.
#[utoipa::path(patch, path = "/api/v1/boxes/{box_id}/config", tag = "boxes", params(("box_id" = String, Path), IdempotencyHeader),
    request_body(content = api::ConfigPatch, content_type = "application/merge-patch+json", description = "A JSON merge patch (RFC 7396): objects merge key by key, `null` deletes a key. `application/json` is read the same way."),
    responses(
        (status = 200, description = "The Box with its edited manifest (unchanged when the patch changes nothing)", body = api::BoxDetail),
        (status = 403, description = "`forbidden`: needs a human admin or the Box's primary; `capability_change_requires_new_draft`: the patch would change what the Box may do (another manifest key such as `os_operations`, `tools` or `network`; `shell` without an approved `shell:exec`, commands or directories beyond those approved with it, or the approval gate off; vaults not approved; a notify channel without its `notify:<channel>` operation, emptied recipients or broadcast on; browser approval gates removed). details names each key and why; the message names the route of a change request (POST /api/v1/boxes/{box_id}/change-requests)", body = ErrorBody),
        (status = 404, description = "`box_not_found`", body = ErrorBody),
        (status = 409, description = "`box_not_active`: the Box is archived; `conflict`: a concurrent edit was recorded first (retry)", body = ErrorBody),
        (status = 422, description = "`box_manifest_validation` (details names the key: an invalid cron in `trigger_schedule`, a notify vault not among `credentials.allowed_vaults`, a wrong type, a key of no manifest, top-level or nested), `invalid_request` (the body is not a JSON object, or holds a whole number beyond ±2^53, which cannot travel exactly)", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin or the Box's primary"))))]
pub async fn edit_config(
    State(state): State<AppState>,
    Caller(principal): Caller,
    key: IdempotencyKey,
    Id(box_id): Id,
    body: RawBody,
) -> Result<Response, ApiError> {
    let route = format!("edit config {box_id}");
    let request = edit_request(&state, &principal, &key, &body, |patch| v1::EditBoxConfig { box_id: box_id.clone(), patch: Some(patch) }).await?;
    write::<_, api::BoxDetail>(&state, &principal, &key, (&route, body.raw()), subjects::RUNTIME_REGISTRY, request, StatusCode::OK).await
}

/// Request a change of what a Box may do (an admin or the Box's primary, agents
/// included): a JSON merge patch (RFC 7396) of its manifest's keys (`trigger_type`
/// included), or the whole manifest; `box_type` and `version`, if given, are the Box's own. It becomes a draft in the pending list with the
/// Box and what it adds and removes; a human admin approves it like any draft, and the Box
/// keeps its id, assignments and history with the next major version.
#[utoipa::path(post, path = "/api/v1/boxes/{box_id}/change-requests", tag = "boxes", params(("box_id" = String, Path), IdempotencyHeader),
    request_body(content = Object, content_type = "application/merge-patch+json", description = "A JSON merge patch of the Box's manifest: objects merge key by key, `null` deletes a key. `application/json` is read the same way."),
    responses(
        (status = 201, description = "Stored, pending approval", body = api::ChangeRequested),
        (status = 403, description = "`forbidden`: needs role admin or the Box's primary", body = ErrorBody),
        (status = 404, description = "`box_not_found`: no such Box, or it is archived", body = ErrorBody),
        (status = 409, description = "`change_request_pending`: the Box has a change request pending; `conflict`: a concurrent request was recorded first (retry)", body = ErrorBody),
        (status = 422, description = "`box_manifest_validation` (details names each key: another `box_type` or `version` than the Box's, a key of no manifest, a value the manifest does not allow), `invalid_request` (not a JSON object, or a patch that changes nothing), `idempotency_key_reuse`", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin or the Box's primary"))))]
pub async fn request_change(
    State(state): State<AppState>,
    Caller(principal): Caller,
    key: IdempotencyKey,
    Id(box_id): Id,
    body: RawBody,
) -> Result<Response, ApiError> {
    let patch = validated(patch_body(&key, &body), box_exists(&state, &principal, &box_id)).await?;
    let route = format!("change request {box_id}");
    let request = v1::SubmitChange { box_id, patch: Some(patch) };
    write::<_, api::ChangeRequested>(&state, &principal, &key, (&route, body.raw()), subjects::DRAFTS, request, StatusCode::CREATED).await
}

// --- Workers ----------------------------------------------------------------------------

/// The longest id the runtime looks a Box up by: no Box has a longer (or a blank) one.
const BOX_ID_CHARS: usize = 128;

/// Launch a Worker of an active Box: the one request a browser makes. Behind it the gateway
/// syncs the Box's configuration bundle, has an execution binding prepared for the launch
/// and creates the Worker with both (the answer names neither). A retry with the same
/// launch_id and request answers the same Worker (200), also after a failure half-way.
/// Every launch and refusal is on the audit ledger (`worker.create`,
/// `worker.create_refused`).
#[utoipa::path(post, path = "/api/v1/boxes/{box_id}/workers", tag = "workers", params(("box_id" = String, Path), IdempotencyHeader),
    request_body(content = api::LaunchRequest, description = "The launch. Unknown fields are refused."),
    responses(
        (status = 201, description = "Launched: the Worker with its initial transcript", body = api::Worker),
        (status = 200, description = "An earlier request with this launch_id launched it: the same Worker", body = api::Worker),
        (status = 403, description = "`forbidden`: launching needs a human admin or a user assigned to the Box (an agent only when assigned); recorded on the audit ledger (`X-Atasira-Position` says where)", body = ErrorBody,
            headers(("X-Atasira-Position" = i64, description = "The position of the recorded refusal"))),
        (status = 404, description = "`box_not_found`: no such Box, answered when the request is also malformed or the id could name no Box (a well-formed launch on an unknown Box is `box_not_active`); `bundle_not_found`: the Box's configuration bundle was never synced; `binding_not_found`: the execution binding prepared for the launch is gone", body = ErrorBody,
            headers(("X-Atasira-Position" = i64, description = "The position of the recorded refusal"))),
        (status = 409, description = "`box_not_active`: the Box is stopped, archived or unknown; `launch_id_conflict`: the launch_id was used with another request; `bundle_digest_mismatch`: the bundle does not derive from the Box's approved manifest and its recorded edits (the configuration changed during the launch: retry); `binding_box_mismatch`: the execution binding was prepared for another Box; `binding_unusable`: the binding cannot serve this Worker (held by another one); `invalid_approval_token`: the Box's approval no longer verifies; `conflict`: a concurrent write was recorded first (retry)", body = ErrorBody,
            headers(("X-Atasira-Position" = i64, description = "The position of the recorded refusal"))),
        (status = 410, description = "`binding_expired`: the execution binding's lease ran out before the Worker was created (retry with the same launch_id)", body = ErrorBody,
            headers(("X-Atasira-Position" = i64, description = "The position of the recorded refusal"))),
        (status = 422, description = "`invalid_segment`: a segment of input is not `{\"kind\", \"value\"}` of kind `text`, `ticket_ref` or `objective_ref` (there is no `system` segment); details names each `input[i]`. `invalid_request`: unknown fields, wrong types, a bound (details names each field: `launch_id`, `role`, `labels`, `input`, `input[i]`), or a malformed Idempotency-Key. `bundle_profile_incompatible`: the bundle belongs to another Box", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin or a user assigned to the Box"))))]
pub async fn launch_worker(
    State(state): State<AppState>,
    Caller(principal): Caller,
    key: IdempotencyKey,
    Id(box_id): Id,
    body: RawBody,
) -> Result<Response, ApiError> {
    if box_id.trim().is_empty() || box_id.chars().count() > BOX_ID_CHARS {
        return Err(ApiError::new(ErrorCode::BoxNotFound, format!("no Box {box_id:?}")));
    }
    let launch = validated(key.check().and_then(|()| from_wire::launch_request(&box_id, &body)), box_exists(&state, &principal, &box_id)).await?;
    let route = format!("launch worker {box_id}");
    idempotency::run(&state, &principal, &key, &route, body.raw(), launch_steps(&state, &principal, launch)).await
}

/// The steps of a launch (R-WORKER-1): sync the bundle, prepare a binding, create the
/// Worker; then wait for the read models to hold every event the steps wrote. A refused
/// step is the answer.
async fn launch_steps(state: &AppState, principal: &Principal, launch: atasira_domain::worker::LaunchRequest) -> Result<Response, ApiError> {
    let sync = v1::SyncBundle { box_id: launch.box_id.clone(), launch_id: launch.launch_id.clone() };
    let Written { reply: synced, mut position, mut event_ids } = match state.call_keyed(subjects::RUNTIME_REGISTRY, principal, &sync, "").await {
        Ok(written) => written,
        Err(refused) => return state.refusal(refused).await,
    };
    let prepare = v1::PrepareBinding { box_id: launch.box_id.clone(), launch_id: launch.launch_id.clone() };
    let lease = match state.call_keyed(subjects::PROVISIONER, principal, &prepare, "").await {
        Ok(written) => {
            position = position.max(written.position);
            event_ids.extend(written.event_ids);
            written.reply
        }
        Err(refused) => return state.refusal(refused).await,
    };
    // Race hook: a test holds a launch here to let its binding's lease run out, or to edit
    // the Box between the sync and the create.
    atasira_platform::failpoints::failpoint_delay("gateway.launch.before_create").await;
    let create = from_wire::create_worker(&launch, synced.digest, lease.handle);
    let reply = match state.call_keyed(subjects::RUNTIME_REGISTRY, principal, &create, "").await {
        Ok(written) => {
            position = position.max(written.position);
            event_ids.extend(written.event_ids);
            written.reply
        }
        Err(refused) => return state.refusal(refused).await,
    };
    let status = if reply.created { StatusCode::CREATED } else { StatusCode::OK };
    let worker = api::Worker::try_from(reply)?;
    let lagging = state.wait_for(position, &event_ids).await;
    let mut response = (status, Json(worker)).into_response();
    consistency_headers(&mut response, position, &lagging);
    Ok(response)
}

async fn worker_exists(state: &AppState, principal: &Principal, worker_id: &str) -> Result<(), ApiError> {
    state.call(subjects::RUNTIME_REGISTRY, principal, &v1::GetWorker { worker_id: worker_id.to_owned(), ..Default::default() }).await.map(|_| ())
}

/// Stop, kill, pause or resume (`verb`) the Worker with `request`: an empty body, the
/// Worker known first.
async fn control_worker<R: Request<Reply = v1::WorkerReply>>(
    state: AppState,
    principal: Principal,
    key: IdempotencyKey,
    body: RawBody,
    verb: &str,
    worker_id: &str,
    request: R,
) -> Result<Response, ApiError> {
    let api::EmptyRequest {} = validated(key.check().and_then(|()| body.parse()), worker_exists(&state, &principal, worker_id)).await?;
    let route = format!("{verb} {worker_id}");
    write::<_, api::Worker>(&state, &principal, &key, (&route, body.raw()), subjects::RUNTIME_REGISTRY, request, StatusCode::OK).await
}

/// Stop a Worker (a human admin or the Box's primary): its runner gets SIGTERM, then
/// SIGKILL after a grace; it ends `killed`. A Worker no execution host took yet ends at once.
#[utoipa::path(post, path = "/api/v1/workers/{worker_id}/stop", tag = "workers", params(("worker_id" = String, Path), IdempotencyHeader),
    request_body(content = Option<api::EmptyRequest>, description = "Empty or `{}`"),
    responses(
        (status = 200, description = "The Worker, with the stop asked", body = api::Worker),
        (status = 403, description = "`forbidden`: needs a human admin or the Box's primary", body = ErrorBody),
        (status = 404, description = "`worker_not_found`", body = ErrorBody),
        (status = 409, description = "`worker_ended`: it has ended already", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin or the Box's primary"))))]
pub async fn stop_worker_route(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(worker_id): Id,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    control_worker(state, principal, key, body, "stop", &worker_id, v1::StopWorker { worker_id: worker_id.clone(), kill: false }).await
}

/// Kill a Worker at once (a human admin or the Box's primary): its runner gets SIGKILL; it
/// ends `killed`.
#[utoipa::path(post, path = "/api/v1/workers/{worker_id}/kill", tag = "workers", params(("worker_id" = String, Path), IdempotencyHeader),
    request_body(content = Option<api::EmptyRequest>, description = "Empty or `{}`"),
    responses(
        (status = 200, description = "The Worker, with the kill asked", body = api::Worker),
        (status = 403, description = "`forbidden`: needs a human admin or the Box's primary", body = ErrorBody),
        (status = 404, description = "`worker_not_found`", body = ErrorBody),
        (status = 409, description = "`worker_ended`: it has ended already", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin or the Box's primary"))))]
pub async fn kill_worker_route(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(worker_id): Id,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    control_worker(state, principal, key, body, "kill", &worker_id, v1::StopWorker { worker_id: worker_id.clone(), kill: true }).await
}

/// Pause a running Worker (a human admin or the Box's primary): its runner is stopped
/// (SIGSTOP) until resumed; the Worker is `paused`.
#[utoipa::path(post, path = "/api/v1/workers/{worker_id}/pause", tag = "workers", params(("worker_id" = String, Path), IdempotencyHeader),
    request_body(content = Option<api::EmptyRequest>, description = "Empty or `{}`"),
    responses(
        (status = 200, description = "The Worker, with the pause asked", body = api::Worker),
        (status = 403, description = "`forbidden`: needs a human admin or the Box's primary", body = ErrorBody),
        (status = 404, description = "`worker_not_found`", body = ErrorBody),
        (status = 409, description = "`worker_ended`: it has ended", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin or the Box's primary"))))]
pub async fn pause_worker_route(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(worker_id): Id,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    control_worker(state, principal, key, body, "pause", &worker_id, v1::PauseWorker { worker_id: worker_id.clone(), pause: true }).await
}

/// Resume a paused Worker (a human admin or the Box's primary).
#[utoipa::path(post, path = "/api/v1/workers/{worker_id}/resume", tag = "workers", params(("worker_id" = String, Path), IdempotencyHeader),
    request_body(content = Option<api::EmptyRequest>, description = "Empty or `{}`"),
    responses(
        (status = 200, description = "The Worker, with the resume asked", body = api::Worker),
        (status = 403, description = "`forbidden`: needs a human admin or the Box's primary", body = ErrorBody),
        (status = 404, description = "`worker_not_found`", body = ErrorBody),
        (status = 409, description = "`worker_ended`: it has ended", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin or the Box's primary"))))]
pub async fn resume_worker_route(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(worker_id): Id,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    control_worker(state, principal, key, body, "resume", &worker_id, v1::PauseWorker { worker_id: worker_id.clone(), pause: false }).await
}

/// More input for a running Worker (a human admin or a user assigned to its Box): it
/// reaches the Worker on its standard input and joins its transcript.
#[utoipa::path(post, path = "/api/v1/workers/{worker_id}/input", tag = "workers", params(("worker_id" = String, Path), IdempotencyHeader),
    request_body(content = api::InputRequest, description = "The input. Unknown fields are refused."),
    responses(
        (status = 200, description = "The Worker, with the input in its transcript", body = api::Worker),
        (status = 403, description = "`forbidden`: needs a human admin or a user assigned to the Box", body = ErrorBody),
        (status = 404, description = "`worker_not_found`", body = ErrorBody),
        (status = 409, description = "`worker_ended`: it has ended", body = ErrorBody),
        (status = 422, description = "`invalid_segment`, `invalid_request`: as in a launch's input", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin or a user assigned to the Box"))))]
pub async fn worker_input(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(worker_id): Id,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    let input = validated(key.check().and_then(|()| from_wire::input_request(&body)), worker_exists(&state, &principal, &worker_id)).await?;
    let route = format!("input {worker_id}");
    let request = v1::AddWorkerInput { worker_id, input };
    write::<_, api::Worker>(&state, &principal, &key, (&route, body.raw()), subjects::RUNTIME_REGISTRY, request, StatusCode::OK).await
}

/// The tool calls Workers wait to make until a human admin decides (admins), newest first;
/// `?state=pending` (the default), `approved`, `rejected`, `expired` or `all`.
#[utoipa::path(get, path = "/api/v1/tool-requests", tag = "workers", params(ToolRequestsQuery),
    responses((status = 200, description = "A page of tool-use requests", body = api::ToolRequestList), (status = 403, description = "`forbidden`: needs role admin", body = ErrorBody)),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin"))))]
pub async fn list_tool_requests(
    State(state): State<AppState>,
    Admin(principal): Admin,
    Params(q): Params<ToolRequestsQuery>,
) -> Result<Json<api::ToolRequestList>, ApiError> {
    let page = q.page();
    let request = v1::ListToolRequests { state: q.state.map(|s| s.as_str().to_owned()).unwrap_or_default(), limit: page.limit(), after: page.after() };
    read::<_, _>(&state, &principal, subjects::RUNTIME_REGISTRY, request).await
}

/// One tool-use request (admins).
#[utoipa::path(get, path = "/api/v1/tool-requests/{request_id}", tag = "workers", params(("request_id" = String, Path)),
    responses(
        (status = 200, description = "The request", body = api::ToolRequest),
        (status = 403, description = "`forbidden`: needs role admin", body = ErrorBody),
        (status = 404, description = "`tool_request_not_found`", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin"))))]
pub async fn get_tool_request(State(state): State<AppState>, Admin(principal): Admin, Id(request_id): Id) -> Result<Json<api::ToolRequest>, ApiError> {
    read::<_, _>(&state, &principal, subjects::RUNTIME_REGISTRY, v1::GetToolRequest { request_id }).await
}

async fn decide_tool(
    state: AppState,
    principal: Principal,
    key: IdempotencyKey,
    request_id: String,
    body: RawBody,
    approve: bool,
) -> Result<Response, ApiError> {
    let exists = async { state.call(subjects::RUNTIME_REGISTRY, &principal, &v1::GetToolRequest { request_id: request_id.clone() }).await.map(|_| ()) };
    let b: api::ToolDecisionRequest = validated(key.check().and_then(|()| body.parse()), exists).await?;
    let route = format!("{} {request_id}", if approve { "approve tool" } else { "reject tool" });
    let request = v1::DecideToolRequest { request_id, approve, reason: b.reason.unwrap_or_default() };
    write::<_, api::ToolRequest>(&state, &principal, &key, (&route, body.raw()), subjects::RUNTIME_REGISTRY, request, StatusCode::OK).await
}

/// Let a Worker make the tool call it waits for (a human admin who did not launch it).
/// Recorded on the audit ledger (`worker.tool_approve`).
#[utoipa::path(post, path = "/api/v1/tool-requests/{request_id}/approve", tag = "workers", params(("request_id" = String, Path), IdempotencyHeader),
    request_body(content = Option<api::ToolDecisionRequest>, description = "Empty, `{}` or `{\"reason\": ...}`"),
    responses(
        (status = 200, description = "The request, approved", body = api::ToolRequest),
        (status = 403, description = "`forbidden`: needs a human admin who did not launch the Worker", body = ErrorBody),
        (status = 404, description = "`tool_request_not_found`", body = ErrorBody),
        (status = 409, description = "`tool_request_not_pending`: decided or expired already", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin who did not launch the Worker"))))]
pub async fn approve_tool(
    State(state): State<AppState>,
    Admin(principal): Admin,
    Id(request_id): Id,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    decide_tool(state, principal, key, request_id, body, true).await
}

/// Refuse a Worker the tool call it waits for (a human admin who did not launch it); the
/// Worker learns the reason. Recorded on the audit ledger (`worker.tool_reject`).
#[utoipa::path(post, path = "/api/v1/tool-requests/{request_id}/reject", tag = "workers", params(("request_id" = String, Path), IdempotencyHeader),
    request_body(content = Option<api::ToolDecisionRequest>, description = "Empty, `{}` or `{\"reason\": ...}`"),
    responses(
        (status = 200, description = "The request, rejected", body = api::ToolRequest),
        (status = 403, description = "`forbidden`: needs a human admin who did not launch the Worker", body = ErrorBody),
        (status = 404, description = "`tool_request_not_found`", body = ErrorBody),
        (status = 409, description = "`tool_request_not_pending`: decided or expired already", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin who did not launch the Worker"))))]
pub async fn reject_tool(
    State(state): State<AppState>,
    Admin(principal): Admin,
    Id(request_id): Id,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    decide_tool(state, principal, key, request_id, body, false).await
}

/// One Worker with its transcript (an admin, or a user assigned to its Box); with `at`, as
/// it was then (its transcript, state and log so far), replayed from its events.
#[utoipa::path(get, path = "/api/v1/workers/{worker_id}", tag = "workers", params(("worker_id" = String, Path), AsOfQuery),
    responses(
        (status = 200, description = "The Worker", body = api::Worker),
        (status = 400, description = "`invalid_query`: `at` is neither a store position nor an RFC 3339 time", body = ErrorBody),
        (status = 403, description = "`forbidden`: needs role admin or an assignment to the Worker's Box", body = ErrorBody),
        (status = 404, description = "`worker_not_found`: no such Worker (then)", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin or a user assigned to the Worker's Box"))))]
pub async fn get_worker(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(worker_id): Id,
    Params(q): Params<AsOfQuery>,
) -> Result<Json<api::Worker>, ApiError> {
    let (at, at_time) = q.wire();
    read::<_, _>(&state, &principal, subjects::RUNTIME_REGISTRY, v1::GetWorker { worker_id, at, at_time }).await
}

/// The Box's Workers, oldest first, without transcripts (an admin, or a user assigned to
/// the Box).
#[utoipa::path(get, path = "/api/v1/boxes/{box_id}/workers", tag = "workers", params(("box_id" = String, Path), WorkersQuery),
    responses(
        (status = 200, description = "A page of the Box's Workers", body = api::WorkerList),
        (status = 403, description = "`forbidden`: needs role admin or an assignment to the Box", body = ErrorBody),
        (status = 404, description = "`box_not_found`", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin or a user assigned to the Box"))))]
pub async fn list_workers(
    State(state): State<AppState>,
    Caller(principal): Caller,
    Id(box_id): Id,
    Params(q): Params<WorkersQuery>,
) -> Result<Json<api::WorkerList>, ApiError> {
    let page = q.page();
    let request = v1::ListBoxWorkers { box_id, limit: page.limit(), after: page.after() };
    read::<_, _>(&state, &principal, subjects::RUNTIME_REGISTRY, request).await
}

/// Where the Worker's configuration comes from (an admin, or a user assigned to its Box):
/// the human approval, the activation, every recorded edit, the bundle and the Worker, each
/// with the event that recorded it and its row on the audit ledger; the approval verified
/// again with public keys only.
#[utoipa::path(get, path = "/api/v1/workers/{worker_id}/provenance", tag = "workers", params(("worker_id" = String, Path)),
    responses(
        (status = 200, description = "The chain from the approval to the Worker", body = api::WorkerProvenance),
        (status = 403, description = "`forbidden`: needs role admin or an assignment to the Worker's Box", body = ErrorBody),
        (status = 404, description = "`worker_not_found`", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin or a user assigned to the Worker's Box"))))]
pub async fn worker_provenance(State(state): State<AppState>, Caller(principal): Caller, Id(worker_id): Id) -> Result<Json<api::WorkerProvenance>, ApiError> {
    let Json(mut provenance) = read::<_, api::WorkerProvenance>(&state, &principal, subjects::RUNTIME_REGISTRY, v1::GetWorkerProvenance { worker_id }).await?;
    // Each step's row on the ledger, asked for at once; none yet is `null`.
    let event_ids: Vec<String> = provenance.steps.iter().map(|step| step.event_id.clone()).collect();
    let rows = event_ids.into_iter().map(|event_id| {
        let request = v1::QueryAudit { event_id, limit: 1, ..Default::default() };
        let (state, principal) = (&state, &principal);
        async move { state.call(subjects::AUDIT, principal, &request).await }
    });
    let answers = futures::future::join_all(rows).await;
    for (step, answer) in provenance.steps.iter_mut().zip(answers) {
        let (page, _) = answer?;
        step.audit_seq = page.rows.iter().find(|r| r.event_id == step.event_id).map(|r| r.seq);
    }
    Ok(Json(provenance))
}

// --- audit ------------------------------------------------------------------------------

/// The audit ledger, a page of rows in seq order (admins).
#[utoipa::path(get, path = "/api/v1/audit", tag = "audit", params(AuditQuery),
    responses((status = 200, description = "Ledger rows", body = api::AuditRows), (status = 403, description = "`forbidden`: needs role admin", body = ErrorBody)),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin"))))]
pub async fn audit(State(state): State<AppState>, Caller(principal): Caller, Params(q): Params<AuditQuery>) -> Result<Json<api::AuditRows>, ApiError> {
    let page = q.page();
    let request = v1::QueryAudit {
        action: q.action.unwrap_or_default(),
        target: q.target.unwrap_or_default(),
        since: q.since.map(atasira_contracts::convert::timestamp),
        limit: page.limit(),
        after: page.after(),
        event_id: String::new(),
    };
    read::<_, _>(&state, &principal, subjects::AUDIT, request).await
}

/// Export the ledger rows of a period (admins), with their MACs and the signed checkpoints
/// that cover them, so that `atasira audit verify --file` checks it offline. Rows before
/// and after the period are included up to whole checkpoints; a checkpoint is recorded
/// first, so every row up to now is covered.
#[utoipa::path(get, path = "/api/v1/audit/export", tag = "audit", params(ExportQuery),
    responses(
        (status = 200, description = "The export, streamed: `jsonl` (an `export` line, then `row` lines, each with its `digest`, and `checkpoint` lines after the rows they cover) or `csv` (a header, then one line each, its `type` column saying which)",
            content((api::AuditExportLine = "application/x-ndjson"), (api::AuditExportLine = "text/csv"))),
        (status = 400, description = "`invalid_query`: `since` or `until` is not an RFC 3339 time, or `format` is not `jsonl` or `csv`", body = ErrorBody),
        (status = 403, description = "`forbidden`: needs role admin", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin"))))]
pub async fn audit_export(State(state): State<AppState>, Caller(principal): Caller, Params(q): Params<ExportQuery>) -> Result<Response, ApiError> {
    use atasira_domain::audit::export::{self, ExportedRow, Format, Line};
    let format = if q.format == Some(crate::query::ExportFormat::Csv) { Format::Csv } else { Format::Jsonl };
    let request = v1::ExportAudit {
        since: q.since.map(atasira_contracts::convert::timestamp),
        until: q.until.map(atasira_contracts::convert::timestamp),
        ..Default::default()
    };
    let (first, _) = state.call(subjects::AUDIT, &principal, &request).await?;
    let header = match format {
        Format::Csv => export::csv_header(),
        Format::Jsonl => format!(
            "{}\n",
            serde_json::json!({"type": "export", "since": q.since, "until": q.until, "from_seq": first.from_seq, "to_seq": first.to_seq,
                   "public_key": first.public_key, "generated_at": chrono::Utc::now()})
        ),
    };
    let to_seq = first.to_seq;
    let lines = move |page: &v1::AuditExportPage| -> Result<String, std::io::Error> {
        let mut text = String::new();
        for wire in &page.rows {
            let row = atasira_contracts::convert::ledger_row_from_wire(wire).map_err(std::io::Error::other)?;
            let seq = row.seq;
            text.push_str(&export::write_line(&Line::Row(ExportedRow { digest: export::row_digest(&row), row }), format));
            for c in page.checkpoints.iter().filter(|c| c.seq == seq) {
                text.push_str(&export::write_line(&Line::Checkpoint(atasira_contracts::convert::checkpoint_proof_from_wire(c)), format));
            }
        }
        Ok(text)
    };
    let pages = futures::stream::unfold(Some(first), move |page| {
        let (state, principal) = (state.clone(), principal.clone());
        async move {
            let page = page?;
            let chunk = lines(&page);
            let next = match page.next_cursor {
                0 => None,
                after => match state.call(subjects::AUDIT, &principal, &v1::ExportAudit { after, to_seq, ..Default::default() }).await {
                    Ok((next, _)) => Some(next),
                    Err(e) => {
                        // The body ends short: a verification of it says which rows are missing.
                        tracing::warn!(error = e.message, "an audit export stopped before its end");
                        return Some((Err(std::io::Error::other("the export stopped before its end")), None));
                    }
                },
            };
            Some((chunk.map(axum::body::Bytes::from), next))
        }
    });
    let body = axum::body::Body::from_stream(futures::StreamExt::chain(futures::stream::once(async move { Ok(axum::body::Bytes::from(header)) }), pages));
    let (content_type, file) = match format {
        Format::Csv => ("text/csv; charset=utf-8", "atasira-audit.csv"),
        Format::Jsonl => ("application/x-ndjson", "atasira-audit.jsonl"),
    };
    Ok((
        [(axum::http::header::CONTENT_TYPE, content_type.to_owned()), (axum::http::header::CONTENT_DISPOSITION, format!("attachment; filename=\"{file}\""))],
        body,
    )
        .into_response())
}

/// Verifies the whole ledger against its latest signed checkpoint (admins).
#[utoipa::path(get, path = "/api/v1/audit/verify", tag = "audit",
    responses((status = 200, description = "The verification result", body = api::VerifyResult), (status = 403, description = "`forbidden`: needs role admin", body = ErrorBody)),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin"))))]
pub async fn audit_verify(State(state): State<AppState>, Caller(principal): Caller) -> Result<Json<api::VerifyResult>, ApiError> {
    read::<_, _>(&state, &principal, subjects::AUDIT, v1::VerifyAudit {}).await
}

// --- the organisation's policy -----------------------------------------------------------

/// The organisation's policy in force (admins): its version, text and rules; version 0
/// when none was ever published.
#[utoipa::path(get, path = "/api/v1/policies", tag = "policies",
    responses((status = 200, description = "The policy in force", body = api::Policy), (status = 403, description = "`forbidden`: needs role admin", body = ErrorBody)),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin"))))]
pub async fn get_policy(State(state): State<AppState>, Admin(principal): Admin) -> Result<Json<api::Policy>, ApiError> {
    read::<_, _>(&state, &principal, subjects::APPROVAL, v1::GetPolicy {}).await
}

/// Publish a new version of the organisation's policy (a human admin): in force for every
/// request from now on; what was decided before keeps its recorded decision. The same text
/// again changes nothing. Recorded on the audit ledger.
#[utoipa::path(put, path = "/api/v1/policies", tag = "policies", params(IdempotencyHeader),
    request_body(content = api::PublishPolicyRequest, description = "The Cedar text. Unknown fields are refused."),
    responses(
        (status = 200, description = "The version now in force", body = api::Policy),
        (status = 403, description = "`forbidden`: needs a human admin", body = ErrorBody),
        (status = 422, description = "`invalid_request`: unknown fields, wrong types, a malformed Idempotency-Key, or a text that is empty, over 65536 bytes, does not parse as Cedar, holds a template, repeats an `@id`, or has an annotation other than `@id`, `@reason`, `@approvals` (1 to 10, on permit rules) and `@confirm` (on permit rules); the message names the rule", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin"))))]
pub async fn publish_policy(
    State(state): State<AppState>,
    HumanAdmin(principal): HumanAdmin,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    key.check()?;
    let b: api::PublishPolicyRequest = body.parse()?;
    write::<_, api::Policy>(&state, &principal, &key, ("PUT /policies", body.raw()), subjects::APPROVAL, v1::PublishPolicy { text: b.text }, StatusCode::OK)
        .await
}

/// A dry run (admins; nothing is recorded): what a policy decides on a proposed draft, and
/// which pending drafts, change requests and Boxes a proposed version decides differently
/// from the one in force.
#[utoipa::path(post, path = "/api/v1/policies/check", tag = "policies",
    request_body(content = api::PolicyCheckRequest, description = "A proposed version, a proposed draft, or both. Unknown fields are refused."),
    responses(
        (status = 200, description = "What would be decided", body = api::PolicyCheck),
        (status = 403, description = "`forbidden`: needs role admin", body = ErrorBody),
        (status = 422, description = "`invalid_request`: unknown fields, wrong types, neither `text` nor `draft`, or a proposed text that does not load (as for publishing); `box_manifest_validation`: a proposed draft that is not valid", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin"))))]
pub async fn check_policy(State(state): State<AppState>, Admin(principal): Admin, body: RawBody) -> Result<Json<api::PolicyCheck>, ApiError> {
    let b: api::PolicyCheckRequest = body.parse()?;
    if b.text.is_none() && b.draft.is_none() {
        return Err(ApiError::new(ErrorCode::InvalidRequest, "nothing to check: give `text` (a proposed version), `draft` (a proposed draft), or both"));
    }
    let draft = b.draft.map(from_wire::draft_request).transpose()?;
    read::<_, _>(&state, &principal, subjects::DRAFTS, v1::CheckPolicy { text: b.text.unwrap_or_default(), draft }).await
}

// --- webhooks ---------------------------------------------------------------------------

/// Register a webhook (a human admin): every announcement of the chosen kinds is POSTed to
/// `url`, signed with the secret this answer shows once. Recorded on the audit ledger.
#[utoipa::path(post, path = "/api/v1/webhooks", tag = "webhooks", params(IdempotencyHeader),
    request_body(content = api::RegisterWebhookRequest, description = "Where to send announcements and which. Unknown fields are refused."),
    responses(
        (status = 201, description = "Registered: the webhook and its secret, shown this once", body = api::WebhookRegistered),
        (status = 403, description = "`forbidden`: needs a human admin", body = ErrorBody),
        (status = 422, description = "`invalid_request`: unknown fields, wrong types, a malformed Idempotency-Key, or a `url` that is not http or https with a host, holds a user name or password or is over 2048 characters, a `format` other than `json` or `slack`, or an unknown kind (details names each: `url`, `format`, `kinds[i]`)", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin"))))]
pub async fn register_webhook(
    State(state): State<AppState>,
    HumanAdmin(principal): HumanAdmin,
    key: IdempotencyKey,
    body: RawBody,
) -> Result<Response, ApiError> {
    key.check()?;
    let b: api::RegisterWebhookRequest = body.parse()?;
    let request = v1::RegisterWebhook { url: b.url, format: b.format.unwrap_or_default(), kinds: b.kinds.unwrap_or_default() };
    write::<_, api::WebhookRegistered>(&state, &principal, &key, ("register webhook", body.raw()), subjects::AUDIT, request, StatusCode::CREATED).await
}

/// The registered webhooks, with how their deliveries went (admins). Never their secrets.
#[utoipa::path(get, path = "/api/v1/webhooks", tag = "webhooks",
    responses(
        (status = 200, description = "The webhooks", body = api::WebhookList),
        (status = 403, description = "`forbidden`: needs role admin", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin"))))]
pub async fn list_webhooks(State(state): State<AppState>, Admin(principal): Admin) -> Result<Json<api::WebhookList>, ApiError> {
    read::<_, _>(&state, &principal, subjects::AUDIT, v1::ListWebhooks {}).await
}

/// The webhook (404 `not_found` otherwise).
async fn webhook_exists(state: &AppState, principal: &Principal, webhook_id: &str) -> Result<(), ApiError> {
    let (list, _) = state.call(subjects::AUDIT, principal, &v1::ListWebhooks {}).await?;
    if list.webhooks.iter().any(|w| w.webhook_id == webhook_id) {
        return Ok(());
    }
    Err(ApiError::new(ErrorCode::NotFound, format!("no webhook {webhook_id:?}")))
}

/// Remove a webhook (a human admin): nothing more is sent to it. Recorded on the audit
/// ledger.
#[utoipa::path(delete, path = "/api/v1/webhooks/{webhook_id}", tag = "webhooks", params(("webhook_id" = String, Path), IdempotencyHeader),
    responses(
        (status = 200, description = "The webhook, removed", body = api::Webhook),
        (status = 403, description = "`forbidden`: needs a human admin", body = ErrorBody),
        (status = 404, description = "`not_found`: no such webhook", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin"))))]
pub async fn remove_webhook(
    State(state): State<AppState>,
    HumanAdmin(principal): HumanAdmin,
    Id(webhook_id): Id,
    key: IdempotencyKey,
) -> Result<Response, ApiError> {
    validated(key.check(), webhook_exists(&state, &principal, &webhook_id)).await?;
    // The idempotency scope names the webhook: the request has no body.
    let route = format!("remove webhook {webhook_id}");
    let request = v1::RemoveWebhook { webhook_id };
    write::<_, api::Webhook>(&state, &principal, &key, (&route, b""), subjects::AUDIT, request, StatusCode::OK).await
}

/// A webhook's deliveries (admins): what was sent, how often it was tried, what the
/// receiver answered, and those given up on (`state=dead`).
#[utoipa::path(get, path = "/api/v1/webhooks/{webhook_id}/deliveries", tag = "webhooks", params(("webhook_id" = String, Path), WebhookDeliveriesQuery),
    responses(
        (status = 200, description = "The deliveries", body = api::WebhookDeliveryList),
        (status = 403, description = "`forbidden`: needs role admin", body = ErrorBody),
        (status = 404, description = "`not_found`: no such webhook", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin"))))]
pub async fn webhook_deliveries(
    State(state): State<AppState>,
    Admin(principal): Admin,
    Id(webhook_id): Id,
    Params(q): Params<WebhookDeliveriesQuery>,
) -> Result<Json<api::WebhookDeliveryList>, ApiError> {
    let request = v1::ListWebhookDeliveries {
        webhook_id,
        state: q.state.map(|s| s.as_str().to_owned()).unwrap_or_default(),
        limit: q.limit.map(crate::query::Limit::get).unwrap_or(0),
    };
    read::<_, _>(&state, &principal, subjects::AUDIT, request).await
}

// --- events -----------------------------------------------------------------------------

/// Publish an event (any user who may start every Box listening on the topic): each active
/// Box whose `trigger_event` is `topic` launches a Worker with `data` as its input, once per
/// `message_id`. The same as a NATS message on the topic with a `Nats-Msg-Id` header.
#[utoipa::path(post, path = "/api/v1/trigger-events", tag = "workers", params(IdempotencyHeader),
    request_body(content = api::TriggerEventRequest, description = "The topic, the event's id and its data. Unknown fields are refused."),
    responses(
        (status = 200, description = "What the event did for each Box listening on the topic (none when no active Box does)", body = api::TriggerLaunches),
        (status = 403, description = "`forbidden`: a Box you may not start listens on the topic (recorded on the audit ledger)", body = ErrorBody),
        (status = 422, description = "`invalid_request`: unknown fields, wrong types, a malformed Idempotency-Key, a `topic` that is not 1 to 16 dot-separated tokens of letters, digits, `_` and `-` or begins with `atasira.` or `_INBOX.`, a `message_id` that is empty or over 200 characters, `data` over 16384 characters (details names each)", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("authenticated"))))]
pub async fn publish_trigger_event(State(state): State<AppState>, Caller(principal): Caller, key: IdempotencyKey, body: RawBody) -> Result<Response, ApiError> {
    key.check()?;
    let b: api::TriggerEventRequest = body.parse()?;
    let request = v1::PublishTriggerEvent { topic: b.topic, message_id: b.message_id, data: b.data };
    write::<_, api::TriggerLaunches>(&state, &principal, &key, ("publish event", body.raw()), subjects::RUNTIME_REGISTRY, request, StatusCode::OK).await
}

// --- auth -------------------------------------------------------------------------------

/// A principal assertion for the caller's PAT, bound to one NATS request: its subject,
/// message type, payload digest, correlation id and idempotency key; valid for 60 s and accepted once.
/// Services take assertions only on the subjects atasira's own processes publish on; a NATS
/// publisher authenticates with its PAT instead and needs none.
/// It records nothing; `X-Atasira-Position` is the store's head when it was minted.
#[utoipa::path(post, path = "/api/v1/auth/nats-assertion", tag = "auth", params(IdempotencyHeader),
    request_body = api::AssertionRequest,
    responses((status = 200, description = "The assertion", body = api::AssertionIssued)),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("authenticated"))))]
pub async fn nats_assertion(State(state): State<AppState>, Caller(principal): Caller, key: IdempotencyKey, body: RawBody) -> Result<Response, ApiError> {
    key.check()?;
    let req: api::AssertionRequest = body.parse()?;
    let mut binding = req.binding().map_err(|errors| {
        ApiError::new(ErrorCode::InvalidRequest, "the request the assertion is for is not described right").with_details(Some(serde_json::json!(errors)))
    })?;
    idempotency::run(&state, &principal, &key, "nats-assertion", body.raw(), async {
        if binding.correlation_id.is_empty() {
            binding.correlation_id = uuid::Uuid::new_v4().to_string();
        }
        let assertion = state.rt.assertion_keys.signer().map_err(ApiError::internal)?.sign(&principal, &binding, chrono::Utc::now());
        let wire = atasira_contracts::assertion_to_wire(&assertion).encode_to_vec();
        let mut response = Json(api::AssertionIssued::new(&assertion, &wire)).into_response();
        let head = state.rt.db.head_position().await.map_err(ApiError::internal)?;
        consistency_headers(&mut response, head, &[]);
        Ok(response)
    })
    .await
}

/// Who the caller is: the user, role and kind of the token (any caller). The dashboard
/// shows it and renders only the controls the role may use.
#[utoipa::path(get, path = "/api/v1/auth/whoami", tag = "auth",
    responses((status = 200, description = "The caller", body = api::PrincipalView)),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("authenticated"))))]
pub async fn whoami(Caller(principal): Caller) -> Json<api::PrincipalView> {
    Json(api::PrincipalView::from(&principal))
}

// --- tokens -----------------------------------------------------------------------------
// The gateway owns the token table and the `pat` events: no service is asked.

/// Personal access tokens, oldest first (admins). Never the token or its hash.
#[utoipa::path(get, path = "/api/v1/auth/tokens", tag = "auth", params(TokensQuery),
    responses((status = 200, description = "The tokens", body = api::TokenList), (status = 403, description = "`forbidden`: needs role admin", body = ErrorBody)),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("admin"))))]
pub async fn list_tokens(State(state): State<AppState>, Admin(_admin): Admin, Params(q): Params<TokensQuery>) -> Result<Json<api::TokenList>, ApiError> {
    let tokens = atasira_platform::auth::list_tokens(&state.rt.db, q.user_id.as_deref()).await.map_err(ApiError::internal)?;
    let tokens = tokens.iter().map(api::TokenView::from).filter(|t| q.state.is_none_or(|s| s == t.state)).collect();
    Ok(Json(api::TokenList { tokens }))
}

/// Revokes tokens `by` the caller, recorded as `TokenRevoked` events; answers once the
/// audit ledger holds them (`X-Atasira-Position`).
async fn revoke_tokens(
    state: &AppState,
    principal: &Principal,
    key: &IdempotencyKey,
    route: &str,
    which: atasira_platform::auth::Which<'_>,
) -> Result<Response, ApiError> {
    // 404 before a malformed Idempotency-Key (the check order).
    if let atasira_platform::auth::Which::Id(id) = which {
        let known = atasira_platform::auth::token_exists(&state.rt.db, id).await.map_err(ApiError::internal)?;
        if !known {
            return Err(ApiError::new(ErrorCode::TokenNotFound, format!("no token {id:?}")));
        }
    }
    idempotency::run(state, principal, key, route, b"", async {
        let revoked = atasira_platform::auth::revoke(&state.rt.db, which, &principal.user_id).await.map_err(ApiError::internal)?;
        let recorded = revoked.recorded;
        let lagging = state.wait_for(recorded.position, &recorded.event_ids).await;
        let mut response = Json(api::TokensRevoked { revoked: revoked.token_ids }).into_response();
        let position = if recorded.position > 0 { recorded.position } else { state.rt.db.head_position().await.map_err(ApiError::internal)? };
        consistency_headers(&mut response, position, &lagging);
        Ok(response)
    })
    .await
}

/// Revoke one token by its id (a human admin): it stops working at once, over REST and
/// NATS. Revoking a revoked token changes nothing.
#[utoipa::path(delete, path = "/api/v1/auth/tokens/{token_id}", tag = "auth", params(("token_id" = String, Path), IdempotencyHeader),
    responses(
        (status = 200, description = "Revoked (the list is empty when it was revoked already)", body = api::TokensRevoked),
        (status = 403, description = "`forbidden`: needs a human admin", body = ErrorBody),
        (status = 404, description = "`token_not_found`", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin"))))]
pub async fn revoke_token(
    State(state): State<AppState>,
    HumanAdmin(principal): HumanAdmin,
    Id(token_id): Id,
    key: IdempotencyKey,
) -> Result<Response, ApiError> {
    let route = format!("revoke token {token_id}");
    revoke_tokens(&state, &principal, &key, &route, atasira_platform::auth::Which::Id(&token_id)).await
}

/// Revoke every live token of a user (a human admin): they stop working at once, over
/// REST and NATS.
#[utoipa::path(delete, path = "/api/v1/auth/tokens", tag = "auth", params(RevokeUserQuery, IdempotencyHeader),
    responses(
        (status = 200, description = "Revoked (the list is empty when the user had no live token)", body = api::TokensRevoked),
        (status = 403, description = "`forbidden`: needs a human admin", body = ErrorBody),
    ),
    security(("pat" = [])), extensions(("x-atasira-access" = json!("human_admin"))))]
pub async fn revoke_user_tokens(
    State(state): State<AppState>,
    HumanAdmin(principal): HumanAdmin,
    Params(q): Params<RevokeUserQuery>,
    key: IdempotencyKey,
) -> Result<Response, ApiError> {
    let route = format!("revoke tokens of {}", q.user_id);
    revoke_tokens(&state, &principal, &key, &route, atasira_platform::auth::Which::User(&q.user_id)).await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn whole_numbers_a_double_cannot_carry_are_named() {
        let map = |v: serde_json::Value| v.as_object().cloned().expect("object");
        assert_eq!(inexact_integer(&map(json!({"a": 9007199254740991_i64, "b": -9007199254740991_i64, "c": 1e300, "d": [1, {"e": 2}]}))), None);
        assert_eq!(inexact_integer(&map(json!({"business_procedure": [{"step": 9007199254740992_i64}]}))), Some("business_procedure[0].step".to_owned()));
        assert_eq!(inexact_integer(&map(json!({"config_defaults": {"n": -9007199254740993_i64}}))), Some("config_defaults.n".to_owned()));
        assert_eq!(inexact_integer(&map(json!({"n": u64::MAX}))), Some("n".to_owned()));
    }
}
