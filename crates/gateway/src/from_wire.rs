//! Between the wire and HTTP: each typed protobuf reply of a service becomes its HTTP type
//! (one `TryFrom` per pair), and the draft and launch request bodies become their protobuf
//! requests. A reply we cannot read is our bug (500), never the caller's.

use atasira_contracts::{convert, v1};
use atasira_domain::BoxManifest;
use atasira_domain::draft_request::BoxDraftCreateRequest as DomainRequest;
use atasira_domain::{ErrorCode, Refusing};

use atasira_domain::FieldError;
use atasira_domain::worker::{self, LaunchRequest};
use serde_json::Value;

use crate::ApiError;
use crate::api::{
    Approved, Assignment, AuditRow, AuditRows, BoxDetail, BoxHistory, BoxList, BoxState, BoxSummary, ChangeRequested, Decision, DraftCreated, DraftDetail,
    DraftKind, DraftPage, DraftStatus, DraftStatusChanged, DraftSummary, FeasibilityAnswer, HistoryEntry, HistoryKind, Manifest, Network, ProvenanceKind,
    ProvenanceStep, Provisioning, ProvisioningStatus, RequiredAccess, Revision, RoleInBox, Segment, SegmentKind, StopRequested, ToolRequest, ToolRequestList,
    TranscriptEntry, TriggerLaunch, TriggerLaunches, TriggerOutcome, VerifyResult, Webhook, WebhookDelivery, WebhookDeliveryList, WebhookDeliveryState,
    WebhookFormat, WebhookList, WebhookRegistered, Worker, WorkerList, WorkerProvenance, WorkerState, WorkerSummary,
};
use crate::extract::RawBody;

fn unreadable(what: &str, e: impl std::fmt::Display) -> ApiError {
    ApiError::internal(format!("unreadable {what} reply: {e}"))
}

fn time(what: &str, t: Option<&prost_types::Timestamp>) -> Result<chrono::DateTime<chrono::Utc>, ApiError> {
    convert::time_from_wire(t).ok_or_else(|| unreadable(what, "a time is missing or out of range"))
}

fn cursor(next: u64) -> Option<String> {
    (next != 0).then(|| next.to_string())
}

fn draft_status(s: i32) -> Result<DraftStatus, ApiError> {
    convert::draft_status_from_wire(s).map(DraftStatus::from).ok_or_else(|| unreadable("draft status", s))
}

fn network(n: i32) -> Network {
    match v1::Network::try_from(n).unwrap_or_default() {
        v1::Network::Local => Network::Local,
        v1::Network::Filtered => Network::Filtered,
        v1::Network::Full => Network::Full,
        v1::Network::None | v1::Network::Unspecified => Network::None,
    }
}

fn access(a: v1::RequiredAccess) -> Result<RequiredAccess, ApiError> {
    use v1::required_access::Kind;
    Ok(match a.kind.ok_or_else(|| unreadable("required_access", "an entry without a kind"))? {
        Kind::GitRemote(g) => RequiredAccess::GitRemote { url: g.url },
        Kind::SshTarget(s) => RequiredAccess::SshTarget {
            host: s.host,
            user: s.user,
            port: if s.port == 0 { atasira_contracts::manifest::DEFAULT_SSH_PORT } else { u16::try_from(s.port).map_err(|e| unreadable("ssh port", e))? },
        },
        Kind::NetrcEntry(n) => RequiredAccess::NetrcEntry { machine: n.machine, login: n.login, vault: n.vault, item: n.item },
    })
}

/// The manifest as the API shows it: the domain's own form of it, key for key.
fn manifest(m: Option<v1::BoxManifest>) -> Result<Manifest, ApiError> {
    let domain = BoxManifest::try_from(m.ok_or_else(|| unreadable("manifest", "missing"))?).map_err(|e| unreadable("manifest", e))?;
    serde_json::to_value(&domain).and_then(serde_json::from_value).map_err(|e| unreadable("manifest", e))
}

fn decision(d: v1::DraftDecision) -> Result<Decision, ApiError> {
    use v1::draft_decision::Outcome;
    let at = time("decision", d.at.as_ref())?;
    let by = (!d.by.is_empty()).then_some(d.by);
    Ok(match Outcome::try_from(d.outcome).unwrap_or_default() {
        Outcome::Approved => Decision { by, at, approved: Some(true), reason: None, withdrawn_by: None },
        Outcome::Rejected => Decision { by, at, approved: Some(false), reason: Some(d.reason), withdrawn_by: None },
        Outcome::Withdrawn => Decision { by: None, at, approved: None, reason: None, withdrawn_by: by },
        Outcome::Expired | Outcome::Unspecified => Decision { by: None, at, approved: None, reason: None, withdrawn_by: None },
    })
}

fn summary(d: v1::DraftView) -> Result<(DraftSummary, Option<v1::BoxManifest>), ApiError> {
    let summary = DraftSummary {
        status: draft_status(d.status)?,
        created_at: time("draft", d.created_at.as_ref())?,
        network: network(d.network),
        required_access: d.required_access.into_iter().map(access).collect::<Result<_, _>>()?,
        decision: d.decision.map(decision).transpose()?,
        box_id: (!d.box_id.is_empty()).then_some(d.box_id),
        kind: if d.kind == v1::DraftKind::Change as i32 { DraftKind::Change } else { DraftKind::New },
        version: d.version,
        added: d.added,
        removed: d.removed,
        approvals: d.approvals,
        approvals_required: d.approvals_required.max(1),
        policy: d.policy.map(|p| crate::api::DraftPolicy { version: p.version, rules: p.rules, confirm: p.confirm }),
        revision: d.revision.map(|r| Revision {
            of: r.of,
            version: r.version,
            rejected_by: r.rejected_by,
            reason: r.reason,
            earlier: r.earlier,
            added: r.added,
            removed: r.removed,
        }),
        draft_id: d.draft_id,
        box_type: d.box_type,
        name: d.name,
        purpose: d.purpose,
        os_operations: d.os_operations,
        tools: d.tools,
        url_allowlist: d.url_allowlist,
        prohibited: d.prohibited,
        over_limit: d.over_limit,
        over_limit_ops: d.over_limit_ops,
        over_limit_tools: d.over_limit_tools,
        warnings: d.warnings,
        requested_by: d.requested_by,
        file_access: d.file_access,
        allowed_apps: d.allowed_apps,
    };
    Ok((summary, d.manifest))
}

impl TryFrom<v1::SubmitDraftReply> for DraftCreated {
    type Error = ApiError;
    fn try_from(r: v1::SubmitDraftReply) -> Result<Self, ApiError> {
        Ok(Self { status: draft_status(r.status)?, draft_id: r.draft_id, box_type: r.box_type, over_limit: r.over_limit, warnings: r.warnings })
    }
}

impl TryFrom<v1::SubmitChangeReply> for ChangeRequested {
    type Error = ApiError;
    fn try_from(r: v1::SubmitChangeReply) -> Result<Self, ApiError> {
        Ok(Self {
            status: draft_status(r.status)?,
            draft_id: r.draft_id,
            box_id: r.box_id,
            box_type: r.box_type,
            over_limit: r.over_limit,
            over_limit_ops: r.over_limit_ops,
            over_limit_tools: r.over_limit_tools,
            added: r.added,
            removed: r.removed,
            version: r.version,
        })
    }
}

impl TryFrom<v1::DraftPage> for DraftPage {
    type Error = ApiError;
    fn try_from(r: v1::DraftPage) -> Result<Self, ApiError> {
        let drafts = r.drafts.into_iter().map(|d| summary(d).map(|(s, _)| s)).collect::<Result<_, _>>()?;
        Ok(Self { drafts, next_cursor: cursor(r.next_cursor) })
    }
}

impl TryFrom<v1::DraftReply> for DraftDetail {
    type Error = ApiError;
    fn try_from(r: v1::DraftReply) -> Result<Self, ApiError> {
        let (summary, m) = summary(r.draft.ok_or_else(|| unreadable("draft", "missing"))?)?;
        Ok(Self { summary, manifest: manifest(m)? })
    }
}

/// Withdraw.
impl TryFrom<v1::WithdrawReply> for DraftStatusChanged {
    type Error = ApiError;
    fn try_from(r: v1::WithdrawReply) -> Result<Self, ApiError> {
        Ok(Self { status: draft_status(r.status)?, draft_id: r.draft_id })
    }
}

/// Reject.
impl TryFrom<v1::DecisionReply> for DraftStatusChanged {
    type Error = ApiError;
    fn try_from(r: v1::DecisionReply) -> Result<Self, ApiError> {
        Ok(Self { status: draft_status(r.status)?, draft_id: r.draft_id })
    }
}

impl TryFrom<v1::DecisionReply> for Approved {
    type Error = ApiError;
    fn try_from(r: v1::DecisionReply) -> Result<Self, ApiError> {
        Ok(Self {
            status: draft_status(r.status)?,
            approved_at: time("approval", r.approved_at.as_ref())?,
            draft_id: r.draft_id,
            box_id: r.box_id,
            box_type: r.box_type,
            approved_by: r.approved_by,
            approvals: r.approvals,
            approvals_required: r.approvals_required.max(1),
        })
    }
}

fn box_summary(s: v1::BoxSummary) -> Result<BoxSummary, ApiError> {
    Ok(BoxSummary {
        state: box_state(s.state)?,
        created_at: time("Box", s.created_at.as_ref())?,
        box_id: s.box_id,
        box_type: s.box_type,
        name: s.name,
        manifest_version: s.manifest_version,
    })
}

impl TryFrom<v1::BoxPage> for BoxList {
    type Error = ApiError;
    fn try_from(r: v1::BoxPage) -> Result<Self, ApiError> {
        Ok(Self { boxes: r.boxes.into_iter().map(box_summary).collect::<Result<_, _>>()?, next_cursor: cursor(r.next_cursor) })
    }
}

fn role(r: i32) -> Result<RoleInBox, ApiError> {
    Ok(match convert::box_role_from_wire(r).map_err(|e| unreadable("role", e))? {
        atasira_domain::aggregates::boxes::BoxRole::Primary => RoleInBox::Primary,
        atasira_domain::aggregates::boxes::BoxRole::Member => RoleInBox::Member,
    })
}

fn box_state(s: i32) -> Result<BoxState, ApiError> {
    Ok(match v1::BoxState::try_from(s).map_err(|e| unreadable("Box state", e))? {
        v1::BoxState::Idle => BoxState::Idle,
        v1::BoxState::Running => BoxState::Running,
        v1::BoxState::Stopped => BoxState::Stopped,
        v1::BoxState::Archived => BoxState::Archived,
        v1::BoxState::Unspecified => return Err(unreadable("Box state", "unspecified")),
    })
}

fn history_entry(e: v1::BoxHistoryEntry) -> Result<HistoryEntry, ApiError> {
    use v1::box_history_entry::Kind;
    let mut entry = HistoryEntry {
        at: time("history", e.at.as_ref())?,
        event_id: e.event_id,
        position: e.position,
        actor: e.actor,
        kind: HistoryKind::Activated,
        draft_id: None,
        box_type: None,
        approved_by: None,
        manifest_version: None,
        manifest_digest: None,
        approval_key_id: None,
        user_id: None,
        role_in_box: None,
        changed_keys: None,
        state: None,
        index: None,
        access: None,
        detail: None,
        reason: None,
        attempts: None,
        added: None,
        removed: None,
    };
    let kind = e.kind.ok_or_else(|| unreadable("history", "an entry without a kind"))?;
    entry.kind = match &kind {
        Kind::Activated(_) => HistoryKind::Activated,
        Kind::UserAssigned(_) => HistoryKind::UserAssigned,
        Kind::UserUnassigned(_) => HistoryKind::UserUnassigned,
        Kind::ManifestEdited(_) => HistoryKind::ManifestEdited,
        Kind::Changed(_) => HistoryKind::ManifestChanged,
        Kind::ConfigEdited(_) => HistoryKind::ConfigEdited,
        Kind::Stopped(_) => HistoryKind::Stopped,
        Kind::Resumed(_) => HistoryKind::Resumed,
        Kind::Archived(_) => HistoryKind::Archived,
        Kind::Access(a) if a.status == v1::provisioning::Status::Provisioned as i32 => HistoryKind::AccessProvisioned,
        Kind::Access(_) => HistoryKind::AccessProvisionFailed,
    };
    match kind {
        Kind::Activated(a) => {
            entry.draft_id = Some(a.draft_id);
            entry.box_type = Some(a.box_type);
            entry.approved_by = Some(a.approved_by);
            entry.manifest_version = Some(a.manifest_version);
            entry.manifest_digest = Some(a.manifest_digest);
            entry.approval_key_id = Some(a.approval_key_id);
        }
        Kind::UserAssigned(v1::box_history_entry::UserAssigned { user_id, role_in_box })
        | Kind::UserUnassigned(v1::box_history_entry::UserUnassigned { user_id, role_in_box }) => {
            entry.role_in_box = Some(role(role_in_box)?);
            entry.user_id = Some(user_id);
        }
        Kind::Changed(c) => {
            entry.draft_id = Some(c.draft_id);
            entry.approved_by = Some(c.approved_by);
            entry.manifest_version = Some(c.manifest_version);
            entry.manifest_digest = Some(c.manifest_digest);
            entry.approval_key_id = Some(c.approval_key_id);
            entry.added = Some(c.added);
            entry.removed = Some(c.removed);
        }
        Kind::ManifestEdited(ed) | Kind::ConfigEdited(ed) => {
            entry.changed_keys = Some(ed.changed_keys);
            entry.manifest_version = Some(ed.manifest_version);
        }
        Kind::Stopped(c) | Kind::Resumed(c) | Kind::Archived(c) => entry.state = Some(box_state(c.state)?),
        Kind::Access(a) => {
            let ok = a.status == v1::provisioning::Status::Provisioned as i32;
            entry.index = Some(a.index);
            entry.access = Some(a.access);
            entry.detail = ok.then_some(a.detail);
            entry.reason = (!ok).then_some(a.reason);
            entry.attempts = Some(a.attempts);
        }
    }
    Ok(entry)
}

impl TryFrom<v1::BoxHistoryPage> for BoxHistory {
    type Error = ApiError;
    fn try_from(r: v1::BoxHistoryPage) -> Result<Self, ApiError> {
        Ok(Self {
            box_id: String::new(),
            entries: r.entries.into_iter().map(history_entry).collect::<Result<_, _>>()?,
            next_cursor: (r.next_cursor != 0).then(|| crate::query::CommitCursor::text(r.next_cursor_tx, r.next_cursor)),
        })
    }
}

impl TryFrom<v1::FeasibilityReply> for FeasibilityAnswer {
    type Error = ApiError;
    fn try_from(r: v1::FeasibilityReply) -> Result<Self, ApiError> {
        Ok(Self {
            feasible: r.feasible,
            available_operations: r.available_operations,
            available_tools: r.available_tools,
            missing_capabilities: r.missing_capabilities,
            required_approvals: r.required_approvals,
            summary: r.summary,
            notes: r.notes,
            box_id: r.box_id,
        })
    }
}

impl TryFrom<v1::BoxReply> for BoxDetail {
    type Error = ApiError;
    fn try_from(r: v1::BoxReply) -> Result<Self, ApiError> {
        let b = r.r#box.ok_or_else(|| unreadable("Box", "missing"))?;
        let s = box_summary(b.summary.ok_or_else(|| unreadable("Box", "no summary"))?)?;
        let assignments = b
            .assignments
            .into_iter()
            .map(|a| {
                let role_in_box = match convert::box_role_from_wire(a.role_in_box).map_err(|e| unreadable("assignment", e))? {
                    atasira_domain::aggregates::boxes::BoxRole::Primary => RoleInBox::Primary,
                    atasira_domain::aggregates::boxes::BoxRole::Member => RoleInBox::Member,
                };
                Ok(Assignment { user_id: a.user_id, role_in_box })
            })
            .collect::<Result<_, ApiError>>()?;
        let provisioning = b
            .provisioning
            .into_iter()
            .map(|p| {
                let ok = p.status == v1::provisioning::Status::Provisioned as i32;
                Ok(Provisioning {
                    at: time("provisioning", p.at.as_ref())?,
                    index: p.index,
                    access: p.access,
                    status: if ok { ProvisioningStatus::Provisioned } else { ProvisioningStatus::Failed },
                    detail: ok.then_some(p.detail),
                    reason: (!ok).then_some(p.reason),
                    attempts: p.attempts,
                })
            })
            .collect::<Result<_, ApiError>>()?;
        Ok(Self {
            box_id: s.box_id,
            box_type: s.box_type,
            name: s.name,
            state: s.state,
            manifest_version: s.manifest_version,
            created_at: s.created_at,
            draft_id: b.draft_id,
            approved_by: b.approved_by,
            manifest: manifest(b.manifest)?,
            assignments,
            provisioning,
            manifest_drift: b.manifest_drift,
        })
    }
}

impl TryFrom<v1::AuditPage> for AuditRows {
    type Error = ApiError;
    fn try_from(r: v1::AuditPage) -> Result<Self, ApiError> {
        let rows = r
            .rows
            .iter()
            .map(|row| {
                let row = convert::ledger_row_from_wire(row).map_err(|e| unreadable("audit row", e))?;
                Ok(AuditRow {
                    seq: row.seq,
                    // The MACed text of the time, exactly as the ledger stores it.
                    time: atasira_domain::audit::canonical_time(row.time),
                    action: row.action,
                    actor: row.actor,
                    target: row.target,
                    event_id: row.event_id,
                    payload_digest: row.payload_digest,
                    detail: row.detail,
                    key_id: row.key_id,
                    mac: row.mac,
                })
            })
            .collect::<Result<_, ApiError>>()?;
        Ok(Self { rows, next_cursor: cursor(r.next_cursor) })
    }
}

impl TryFrom<v1::VerifyReply> for VerifyResult {
    type Error = ApiError;
    fn try_from(r: v1::VerifyReply) -> Result<Self, ApiError> {
        Ok(if r.ok {
            Self { ok: true, rows: Some(r.rows), first_bad_seq: None, reason: None }
        } else {
            Self { ok: false, rows: None, first_bad_seq: Some(r.first_bad_seq), reason: Some(r.reason) }
        })
    }
}

/// The webhook of a list, a removal or a registration.
impl TryFrom<v1::Webhook> for Webhook {
    type Error = ApiError;
    fn try_from(w: v1::Webhook) -> Result<Self, ApiError> {
        let format = match w.format.as_str() {
            "" | "json" => WebhookFormat::Json,
            "slack" => WebhookFormat::Slack,
            other => return Err(unreadable("webhook format", other)),
        };
        Ok(Webhook {
            registered_at: time("webhook", w.registered_at.as_ref())?,
            webhook_id: w.webhook_id,
            url: w.url,
            format,
            kinds: w.kinds,
            registered_by: w.registered_by,
            delivered: w.delivered,
            pending: w.pending,
            dead: w.dead,
        })
    }
}

impl TryFrom<v1::WebhookRegistered> for WebhookRegistered {
    type Error = ApiError;
    fn try_from(r: v1::WebhookRegistered) -> Result<Self, ApiError> {
        let webhook = Webhook::try_from(r.webhook.ok_or_else(|| unreadable("webhook", "missing"))?)?;
        Ok(Self { webhook, secret: r.secret })
    }
}

impl TryFrom<v1::WebhookList> for WebhookList {
    type Error = ApiError;
    fn try_from(r: v1::WebhookList) -> Result<Self, ApiError> {
        Ok(Self { webhooks: r.webhooks.into_iter().map(Webhook::try_from).collect::<Result<_, _>>()? })
    }
}

impl TryFrom<v1::WebhookDelivery> for WebhookDelivery {
    type Error = ApiError;
    fn try_from(d: v1::WebhookDelivery) -> Result<Self, ApiError> {
        let state = match d.state.as_str() {
            "pending" => WebhookDeliveryState::Pending,
            "delivered" => WebhookDeliveryState::Delivered,
            "dead" => WebhookDeliveryState::Dead,
            other => return Err(unreadable("webhook delivery state", other)),
        };
        let next_attempt_at = match (state, d.next_attempt_at.as_ref()) {
            (WebhookDeliveryState::Pending, Some(t)) => Some(time("webhook delivery", Some(t))?),
            _ => None,
        };
        Ok(WebhookDelivery {
            created_at: time("webhook delivery", d.created_at.as_ref())?,
            updated_at: time("webhook delivery", d.updated_at.as_ref())?,
            next_attempt_at,
            delivery_id: d.delivery_id,
            webhook_id: d.webhook_id,
            event_id: d.event_id,
            kind: d.kind,
            state,
            attempts: d.attempts,
            last_status: (d.last_status != 0).then_some(d.last_status),
            last_error: d.last_error,
        })
    }
}

impl TryFrom<v1::WebhookDeliveryPage> for WebhookDeliveryList {
    type Error = ApiError;
    fn try_from(r: v1::WebhookDeliveryPage) -> Result<Self, ApiError> {
        Ok(Self { deliveries: r.deliveries.into_iter().map(WebhookDelivery::try_from).collect::<Result<_, _>>()? })
    }
}

/// The body of `POST /boxes/box-drafts` (already JSON) -> its wire form. The domain's
/// parser checks the shape (unknown fields, types) and the bounds of every list and text,
/// so every entry point reports the same errors and nothing too large for the bus is
/// forwarded; each `required_access` entry takes only the keys of its kind.
pub fn draft_request(body: serde_json::Value) -> Result<v1::BoxDraftCreateRequest, ApiError> {
    let refused = |e: atasira_domain::draft_request::DraftRequestError| {
        let details = e.field_errors();
        ApiError::new(e.error_code(), e.to_string()).with_details((!details.is_empty()).then(|| serde_json::json!(details)))
    };
    let r = DomainRequest::from_value(body).map_err(refused)?;
    r.check().map_err(refused)?;
    let required_access = r
        .required_access
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            serde_json::from_value::<RequiredAccess>(v)
                .map(|a| v1::RequiredAccess::from(&domain_access(a)))
                .map_err(|e| ApiError::new(ErrorCode::InvalidRequest, format!("required_access[{i}]: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(v1::BoxDraftCreateRequest {
        box_type: r.box_type.unwrap_or_default(),
        purpose: r.purpose.unwrap_or_default(),
        name: r.name.unwrap_or_default(),
        success_criteria: r.success_criteria.unwrap_or_default(),
        os_operations: r.os_operations.unwrap_or_default(),
        tools: r.tools.unwrap_or_default(),
        allowed_apps: r.allowed_apps.unwrap_or_default(),
        url_allowlist: r.url_allowlist.unwrap_or_default(),
        file_access: r.file_access.unwrap_or_default(),
        prohibited_actions: r.prohibited_actions.unwrap_or_default(),
        allow_network: r.allow_network.unwrap_or(false),
        required_access,
    })
}

// --- Workers ----------------------------------------------------------------------------

/// The body of `POST /boxes/{box_id}/workers` -> the launch it asks for. An unreadable body
/// is 400 `invalid_json`; unknown fields or wrong types 422 `invalid_request`; a segment
/// that is not `{"kind", "value"}` of a known kind (`system` included) 422
/// `invalid_segment`, each named `input[i]` in details; then the domain's bounds
/// (`validate_launch`) 422 `invalid_request`, each field named in details.
pub fn launch_request(box_id: &str, body: &RawBody) -> Result<LaunchRequest, ApiError> {
    let b: crate::api::LaunchRequest = body.parse()?;
    let input = segments(&b.input)?;
    let request =
        LaunchRequest { launch_id: b.launch_id, box_id: box_id.to_owned(), role: b.role.unwrap_or_default(), labels: b.labels.unwrap_or_default(), input };
    let errors = worker::validate_launch(&request);
    if let Some(first) = errors.first() {
        let message = format!("{}: {}", first.key, first.message);
        return Err(ApiError::new(ErrorCode::InvalidRequest, message).with_details(Some(serde_json::json!(errors))));
    }
    Ok(request)
}

/// A launch's or a later input's segments: each a known kind (else 422 `invalid_segment`
/// naming every `input[i]`).
fn segments(values: &[Value]) -> Result<Vec<worker::Segment>, ApiError> {
    let mut input = Vec::with_capacity(values.len());
    let mut wrong = Vec::new();
    for (i, value) in values.iter().enumerate() {
        match segment(value) {
            Ok(s) => input.push(s),
            Err(message) => wrong.push(FieldError::new(format!("input[{i}]"), message)),
        }
    }
    if let Some(first) = wrong.first() {
        let message = format!("{}: {}", first.key, first.message);
        return Err(ApiError::new(ErrorCode::InvalidSegment, message).with_details(Some(serde_json::json!(wrong))));
    }
    Ok(input)
}

/// `POST /workers/{id}/input`: the segments, within a launch's bounds.
pub fn input_request(body: &RawBody) -> Result<Vec<v1::Segment>, ApiError> {
    let b: crate::api::InputRequest = body.parse()?;
    let input = segments(&b.input)?;
    let errors = worker::segment_errors(&input);
    if let Some(first) = errors.first() {
        let message = format!("{}: {}", first.key, first.message);
        return Err(ApiError::new(ErrorCode::InvalidRequest, message).with_details(Some(serde_json::json!(errors))));
    }
    Ok(input.iter().map(segment_to_wire).collect())
}

/// One segment of a launch's input, or why it is none.
fn segment(value: &Value) -> Result<worker::Segment, String> {
    let Some(object) = value.as_object() else { return Err("a segment is an object {\"kind\": ..., \"value\": ...}".to_owned()) };
    if let Some(other) = object.keys().find(|k| !matches!(k.as_str(), "kind" | "value")) {
        return Err(format!("a segment holds only kind and value, not {other:?}"));
    }
    let kind = object.get("kind").and_then(Value::as_str).ok_or("a segment needs a kind: text, ticket_ref or objective_ref")?;
    let text = || object.get("value").and_then(Value::as_str).map(str::to_owned).ok_or("a segment's value is text".to_owned());
    match kind {
        "text" => Ok(worker::Segment::Text(text()?)),
        "ticket_ref" => Ok(worker::Segment::TicketRef(text()?)),
        "objective_ref" => Ok(worker::Segment::ObjectiveRef(text()?)),
        "system" => Err("there is no system segment: a Worker's role prompt comes from its Box's configuration".to_owned()),
        other => Err(format!("{other:?} is not a segment kind: text, ticket_ref or objective_ref")),
    }
}

/// A domain segment on the wire.
pub fn segment_to_wire(s: &worker::Segment) -> v1::Segment {
    use v1::segment::Kind;
    let kind = match s {
        worker::Segment::Text(v) => Kind::Text(v.clone()),
        worker::Segment::TicketRef(v) => Kind::TicketRef(v.clone()),
        worker::Segment::ObjectiveRef(v) => Kind::ObjectiveRef(v.clone()),
    };
    v1::Segment { kind: Some(kind) }
}

/// The launch as the runtime's `CreateWorker`, with the bundle and binding the gateway
/// prepared for it.
pub fn create_worker(request: &LaunchRequest, bundle_digest: String, binding_handle: String) -> v1::CreateWorker {
    v1::CreateWorker {
        launch_id: request.launch_id.clone(),
        box_id: request.box_id.clone(),
        bundle_digest,
        binding_handle,
        role: request.role.clone(),
        labels: request.labels.clone(),
        initial_input: request.input.iter().map(segment_to_wire).collect(),
    }
}

fn segment_from_wire(s: v1::Segment) -> Result<Segment, ApiError> {
    use v1::segment::Kind;
    Ok(match s.kind.ok_or_else(|| unreadable("segment", "a segment without a kind"))? {
        Kind::Text(value) => Segment { kind: SegmentKind::Text, value },
        Kind::TicketRef(value) => Segment { kind: SegmentKind::TicketRef, value },
        Kind::ObjectiveRef(value) => Segment { kind: SegmentKind::ObjectiveRef, value },
    })
}

fn worker_state(state: &str) -> Result<WorkerState, ApiError> {
    serde_json::from_value(serde_json::Value::String(state.to_owned())).map_err(|e| unreadable("Worker state", e))
}

/// A Worker of the catalog, and its transcript.
fn worker_from_wire(w: v1::WorkerView) -> Result<(WorkerSummary, v1::WorkerView), ApiError> {
    let summary = WorkerSummary {
        created_at: time("Worker", w.created_at.as_ref())?,
        worker_id: w.worker_id.clone(),
        launch_id: w.launch_id.clone(),
        box_id: w.box_id.clone(),
        box_type: w.box_type.clone(),
        role: w.role.clone(),
        labels: w.labels.clone(),
        created_by: w.created_by.clone(),
        state: worker_state(&w.state)?,
    };
    Ok((summary, w))
}

impl TryFrom<v1::WorkerView> for Worker {
    type Error = ApiError;
    fn try_from(w: v1::WorkerView) -> Result<Self, ApiError> {
        let (s, w) = worker_from_wire(w)?;
        let ended = worker::WorkerState::parse(&w.state).is_some_and(worker::WorkerState::is_ended);
        let stop_requested = match w.stop_requested.as_str() {
            _ if ended => None,
            "stop" => Some(StopRequested::Stop),
            "kill" => Some(StopRequested::Kill),
            _ => None,
        };
        let ended_at = w.ended_at.as_ref().map(|t| time("Worker", Some(t))).transpose()?;
        let transcript = w
            .transcript
            .into_iter()
            .map(|e| {
                Ok(TranscriptEntry {
                    seq: e.seq,
                    at: time("transcript", e.at.as_ref())?,
                    author: e.author,
                    segments: e.segments.into_iter().map(segment_from_wire).collect::<Result<_, _>>()?,
                })
            })
            .collect::<Result<_, ApiError>>()?;
        Ok(Self {
            worker_id: s.worker_id,
            launch_id: s.launch_id,
            box_id: s.box_id,
            box_type: s.box_type,
            role: s.role,
            labels: s.labels,
            created_by: s.created_by,
            created_at: s.created_at,
            state: s.state,
            host: Some(w.host).filter(|h| !h.is_empty()),
            stop_requested,
            transcript,
            log: w.log,
            result: ended.then_some(w.result),
            exit_code: w.exit_code,
            ended_at,
        })
    }
}

impl TryFrom<v1::ToolRequestView> for ToolRequest {
    type Error = ApiError;
    fn try_from(r: v1::ToolRequestView) -> Result<Self, ApiError> {
        let state = serde_json::from_value(Value::String(r.state.clone())).map_err(|e| unreadable("tool-use request state", e))?;
        let some = |s: String| Some(s).filter(|s| !s.is_empty());
        Ok(ToolRequest {
            requested_at: time("tool-use request", r.requested_at.as_ref())?,
            expires_at: time("tool-use request", r.expires_at.as_ref())?,
            decided_at: r.decided_at.as_ref().map(|t| time("tool-use request", Some(t))).transpose()?,
            input: r.input.map(atasira_contracts::manifest::value_from_proto).unwrap_or(Value::Null),
            request_id: r.request_id,
            worker_id: r.worker_id,
            box_id: r.box_id,
            box_type: r.box_type,
            tool: r.tool,
            rule: r.rule,
            reason: r.reason,
            state,
            launched_by: r.launched_by,
            decided_by: some(r.decided_by),
            decision_reason: some(r.decision_reason),
        })
    }
}

impl TryFrom<v1::ToolRequestPage> for ToolRequestList {
    type Error = ApiError;
    fn try_from(r: v1::ToolRequestPage) -> Result<Self, ApiError> {
        Ok(Self { requests: r.requests.into_iter().map(ToolRequest::try_from).collect::<Result<_, _>>()?, next_cursor: cursor(r.next_cursor) })
    }
}

/// The launch and `GET /workers/{id}`.
impl TryFrom<v1::WorkerReply> for Worker {
    type Error = ApiError;
    fn try_from(r: v1::WorkerReply) -> Result<Self, ApiError> {
        Worker::try_from(r.worker.ok_or_else(|| unreadable("Worker", "missing"))?)
    }
}

impl TryFrom<v1::WorkerPage> for WorkerList {
    type Error = ApiError;
    fn try_from(r: v1::WorkerPage) -> Result<Self, ApiError> {
        let workers = r.workers.into_iter().map(|w| worker_from_wire(w).map(|(s, _)| s)).collect::<Result<_, _>>()?;
        Ok(Self { workers, next_cursor: cursor(r.next_cursor) })
    }
}

/// The provenance without the audit rows' seqs (the route asks the audit service for them).
impl TryFrom<v1::WorkerProvenance> for WorkerProvenance {
    type Error = ApiError;
    fn try_from(r: v1::WorkerProvenance) -> Result<Self, ApiError> {
        use v1::provenance_step::Kind;
        let steps = r
            .steps
            .into_iter()
            .map(|step| {
                let kind = match Kind::try_from(step.kind).map_err(|e| unreadable("provenance step", e))? {
                    Kind::Approval => ProvenanceKind::Approval,
                    Kind::Activation => ProvenanceKind::Activation,
                    Kind::ManifestEdit => ProvenanceKind::ManifestEdit,
                    Kind::ConfigEdit => ProvenanceKind::ConfigEdit,
                    Kind::Change => ProvenanceKind::Change,
                    Kind::Bundle => ProvenanceKind::Bundle,
                    Kind::Worker => ProvenanceKind::Worker,
                    Kind::Unspecified => return Err(unreadable("provenance step", "unspecified")),
                };
                Ok(ProvenanceStep {
                    kind,
                    at: time("provenance step", step.at.as_ref())?,
                    event_id: step.event_id,
                    position: step.position,
                    actor: step.actor,
                    digest: (!step.digest.is_empty()).then_some(step.digest),
                    manifest_version: (!step.manifest_version.is_empty()).then_some(step.manifest_version),
                    audit_seq: None,
                })
            })
            .collect::<Result<_, ApiError>>()?;
        Ok(Self {
            worker_id: r.worker_id,
            box_id: r.box_id,
            bundle_digest: r.bundle_digest,
            approval_key_id: r.approval_key_id,
            approval_verified: r.approval_verified,
            steps,
        })
    }
}

fn domain_access(a: RequiredAccess) -> atasira_domain::manifest::RequiredAccess {
    use atasira_domain::manifest::RequiredAccess as D;
    match a {
        RequiredAccess::GitRemote { url } => D::GitRemote { url },
        RequiredAccess::SshTarget { host, user, port } => D::SshTarget { host, user, port },
        RequiredAccess::NetrcEntry { machine, login, vault, item } => D::NetrcEntry { machine, login, vault, item },
    }
}

impl TryFrom<v1::TriggerLaunches> for TriggerLaunches {
    type Error = ApiError;
    fn try_from(r: v1::TriggerLaunches) -> Result<Self, ApiError> {
        let launch = |l: v1::TriggerLaunch| -> Result<TriggerLaunch, ApiError> {
            let outcome = match l.outcome.as_str() {
                "launched" => TriggerOutcome::Launched,
                "existing" => TriggerOutcome::Existing,
                "refused" => TriggerOutcome::Refused,
                "failed" => TriggerOutcome::Failed,
                other => return Err(unreadable("trigger outcome", other)),
            };
            let code = (l.code != 0).then(|| atasira_contracts::convert::error_code_from_wire(l.code).as_str().to_owned());
            Ok(TriggerLaunch { box_id: l.box_id, worker_id: l.worker_id, outcome, code, reason: (!l.reason.is_empty()).then_some(l.reason) })
        };
        Ok(Self { launches: r.launches.into_iter().map(launch).collect::<Result<_, _>>()? })
    }
}

// --- the organisation's policy -------------------------------------------------------------

impl TryFrom<v1::PolicyReply> for crate::api::Policy {
    type Error = ApiError;
    fn try_from(p: v1::PolicyReply) -> Result<Self, ApiError> {
        use crate::api::{PolicyEffect, PolicyRule};
        let rules = p
            .rules
            .into_iter()
            .map(|r| {
                let effect = match r.effect.as_str() {
                    "permit" => PolicyEffect::Permit,
                    "forbid" => PolicyEffect::Forbid,
                    other => return Err(unreadable("policy rule effect", other)),
                };
                Ok(PolicyRule {
                    id: r.id,
                    effect,
                    reason: (!r.reason.is_empty()).then_some(r.reason),
                    approvals: (r.approvals > 0).then_some(r.approvals),
                    confirm: r.confirm,
                })
            })
            .collect::<Result<_, ApiError>>()?;
        let published = p.version > 0;
        Ok(Self {
            version: p.version,
            digest: p.digest,
            text: p.text,
            rules,
            published_by: published.then_some(p.published_by),
            published_at: if published { Some(time("policy", p.published_at.as_ref())?) } else { None },
        })
    }
}

fn policy_outcome(o: Option<v1::PolicyOutcome>) -> Result<crate::api::PolicyOutcome, ApiError> {
    use crate::api::PolicyDecision;
    let o = o.ok_or_else(|| unreadable("policy outcome", "missing"))?;
    let decision = match o.decision.as_str() {
        "allow" => PolicyDecision::Allow,
        "deny" => PolicyDecision::Deny,
        other => return Err(unreadable("policy decision", other)),
    };
    Ok(crate::api::PolicyOutcome {
        version: o.version,
        decision,
        rules: o.rules,
        approvals_required: o.approvals_required.max(1),
        confirm: o.confirm,
        reason: (!o.reason.is_empty()).then_some(o.reason),
    })
}

impl TryFrom<v1::PolicyCheckReply> for crate::api::PolicyCheck {
    type Error = ApiError;
    fn try_from(r: v1::PolicyCheckReply) -> Result<Self, ApiError> {
        use crate::api::{PolicyChange, PolicyChangeKind};
        let changes = r
            .changes
            .into_iter()
            .map(|c| {
                let kind = match c.kind.as_str() {
                    "draft" => PolicyChangeKind::Draft,
                    "change" => PolicyChangeKind::Change,
                    "box" => PolicyChangeKind::Box,
                    other => return Err(unreadable("policy change kind", other)),
                };
                Ok(PolicyChange { kind, id: c.id, box_type: c.box_type, before: policy_outcome(c.before)?, after: policy_outcome(c.after)? })
            })
            .collect::<Result<_, ApiError>>()?;
        Ok(Self {
            active_version: r.active_version,
            draft: r.draft.map(|d| policy_outcome(Some(d))).transpose()?,
            changes,
            checked: r.checked,
            truncated: r.truncated,
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_draft_body_becomes_its_typed_request_and_foreign_keys_are_refused() {
        let body = json!({"box_type": "b", "purpose": "p", "required_access": [{"type": "ssh_target", "host": "h", "user": "u", "port": 943.0}]});
        let request = draft_request(body).expect("valid");
        let Some(v1::required_access::Kind::SshTarget(ssh)) = request.required_access[0].kind.clone() else { panic!("{request:?}") };
        assert_eq!((ssh.host.as_str(), ssh.port), ("h", 943));
        let secret = json!({"box_type": "b", "purpose": "p", "required_access": [{"type": "netrc_entry", "machine": "m", "login": "l", "vault": "v", "item": "i", "password": "x"}]});
        assert_eq!(draft_request(secret).map_err(|e| e.code).err(), Some(ErrorCode::InvalidRequest), "a password is refused, never dropped");
        let unreadable = crate::extract::RawBody::new(bytes::Bytes::from_static(b"{"));
        assert_eq!(unreadable.json().map_err(|e| e.code).err(), Some(ErrorCode::InvalidJson));
        assert_eq!(draft_request(json!([])).map_err(|e| e.code).err(), Some(ErrorCode::InvalidRequest));
        assert_eq!(draft_request(json!({"box_type": "b", "state": "active"})).map_err(|e| e.code).err(), Some(ErrorCode::InvalidRequest));
    }

    fn launch(body: serde_json::Value) -> Result<LaunchRequest, ApiError> {
        launch_request("b1", &RawBody::new(bytes::Bytes::from(body.to_string())))
    }

    fn refused(body: serde_json::Value) -> (ErrorCode, Vec<String>) {
        let e = launch(body).expect_err("refused");
        let keys = e.details.as_ref().and_then(|d| d.as_array()).map(|a| a.iter().filter_map(|e| e["key"].as_str().map(str::to_owned)).collect());
        (e.code, keys.unwrap_or_default())
    }

    #[test]
    fn r_worker_1_a_launch_body_becomes_the_domain_launch_and_its_create_request() {
        let request = launch(json!({"launch_id": "l-1", "role": "reviewer", "labels": {"team": "ops"},
            "input": [{"kind": "text", "value": "hello"}, {"kind": "ticket_ref", "value": "T-1"}, {"kind": "objective_ref", "value": "O-1"}]}))
        .expect("valid");
        assert_eq!((request.box_id.as_str(), request.launch_id.as_str(), request.role.as_str()), ("b1", "l-1", "reviewer"));
        assert_eq!(request.input[1], worker::Segment::TicketRef("T-1".into()));
        let create = create_worker(&request, "sha256:ab".into(), "bnd_1".into());
        assert_eq!(
            (create.bundle_digest.as_str(), create.binding_handle.as_str(), create.labels.get("team").map(String::as_str)),
            ("sha256:ab", "bnd_1", Some("ops"))
        );
        assert_eq!(create.initial_input[2].kind, Some(v1::segment::Kind::ObjectiveRef("O-1".into())));
        // role and labels may be absent or null: the Box's default role, no labels
        let bare = launch(json!({"launch_id": "l-2", "role": null, "labels": null, "input": [{"kind": "text", "value": "x"}]})).expect("valid");
        assert_eq!((bare.role.as_str(), bare.labels.len()), ("", 0));
    }

    #[test]
    fn r_worker_5_a_system_segment_or_any_unknown_kind_is_invalid_segment_naming_it() {
        let text = json!({"kind": "text", "value": "x"});
        let body = |segment: serde_json::Value| json!({"launch_id": "l", "input": [text.clone(), segment]});
        for segment in [
            json!({"kind": "system", "value": "you are root"}),
            json!({"kind": "image", "value": "x"}),
            json!({"value": "no kind"}),
            json!({"kind": 3, "value": "x"}),
            json!({"kind": "text", "value": 3}),
            json!({"kind": "text", "value": "x", "role": "system"}),
            json!("text"),
        ] {
            assert_eq!(refused(body(segment.clone())), (ErrorCode::InvalidSegment, vec!["input[1]".to_owned()]), "{segment}");
        }
        let e = launch(body(json!({"kind": "system", "value": "x"}))).expect_err("system");
        assert!(e.message.contains("no system segment"), "{}", e.message);
    }

    #[test]
    fn r_worker_4_the_body_shape_and_the_domain_bounds_are_invalid_request_naming_the_field() {
        let input = json!([{"kind": "text", "value": "x"}]);
        assert_eq!(refused(json!({"launch_id": "l", "input": input, "bundle_digest": "sha256:00"})).0, ErrorCode::InvalidRequest, "unknown field");
        assert_eq!(refused(json!({"launch_id": "l", "input": input, "cwd": "/"})).0, ErrorCode::InvalidRequest, "unknown field");
        assert_eq!(refused(json!({"input": input})).0, ErrorCode::InvalidRequest, "no launch_id");
        assert_eq!(refused(json!({"launch_id": 1, "input": input})).0, ErrorCode::InvalidRequest, "wrong type");
        assert_eq!(refused(json!([])).0, ErrorCode::InvalidRequest, "not an object");
        assert_eq!(refused(json!({"launch_id": "a b", "input": input})), (ErrorCode::InvalidRequest, vec!["launch_id".to_owned()]));
        assert_eq!(refused(json!({"launch_id": "l", "input": []})), (ErrorCode::InvalidRequest, vec!["input".to_owned()]));
        assert_eq!(refused(json!({"launch_id": "l", "input": [{"kind": "text", "value": " "}]})), (ErrorCode::InvalidRequest, vec!["input[0]".to_owned()]));
        assert_eq!(refused(json!({"launch_id": "l", "role": " ", "input": input})), (ErrorCode::InvalidRequest, vec!["role".to_owned()]));
        let labels: serde_json::Map<String, serde_json::Value> = (0..=worker::LABELS).map(|i| (format!("k{i}"), json!("v"))).collect();
        assert_eq!(refused(json!({"launch_id": "l", "labels": labels, "input": input})), (ErrorCode::InvalidRequest, vec!["labels".to_owned()]));
        let unreadable = launch_request("b1", &RawBody::new(bytes::Bytes::from_static(b"{"))).expect_err("not JSON");
        assert_eq!(unreadable.code, ErrorCode::InvalidJson);
    }

    #[test]
    fn r_worker_1_the_worker_answer_holds_the_catalog_entry_and_transcript_and_nothing_of_how_it_runs() {
        let at = Some(convert::timestamp(chrono::DateTime::from_timestamp(1_700_000_000, 0).expect("time")));
        let view = v1::WorkerView {
            worker_id: "wkr_1".into(),
            launch_id: "l".into(),
            box_id: "b1".into(),
            box_type: "notes".into(),
            role: String::new(),
            labels: [("team".to_owned(), "ops".to_owned())].into(),
            created_by: "alice".into(),
            created_at: at,
            transcript: vec![v1::TranscriptEntry { seq: 0, author: "alice".into(), at, segments: vec![segment_to_wire(&worker::Segment::Text("hi".into()))] }],
            state: "running".into(),
            host: "h1".into(),
            log: vec!["step 1".into()],
            // Not ended: no result yet.
            result: "partial".into(),
            ..Default::default()
        };
        let worker = Worker::try_from(v1::WorkerReply { worker: Some(view.clone()), created: true }).expect("worker");
        let json = serde_json::to_value(&worker).expect("json");
        let mut keys: Vec<&str> = json.as_object().expect("object").keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "box_id",
                "box_type",
                "created_at",
                "created_by",
                "ended_at",
                "exit_code",
                "host",
                "labels",
                "launch_id",
                "log",
                "result",
                "role",
                "state",
                "stop_requested",
                "transcript",
                "worker_id"
            ]
        );
        assert_eq!((json["state"].as_str(), json["host"].as_str(), json["result"].is_null()), (Some("running"), Some("h1"), true));
        assert_eq!(json["transcript"], json!([{"seq": 0, "author": "alice", "at": "2023-11-14T22:13:20Z", "segments": [{"kind": "text", "value": "hi"}]}]));
        let list = WorkerList::try_from(v1::WorkerPage { workers: vec![view], next_cursor: 7 }).expect("page");
        let json = serde_json::to_value(&list).expect("json");
        assert!(json["workers"][0].get("transcript").is_none());
        assert_eq!(json["next_cursor"], "7");
        assert!(Worker::try_from(v1::WorkerReply { worker: None, created: false }).is_err(), "no Worker: our bug");
    }

    #[test]
    fn each_decision_outcome_answers_with_its_own_keys() {
        use v1::draft_decision::Outcome;
        let at = Some(convert::timestamp(chrono::DateTime::from_timestamp(1_700_000_000, 5).expect("time")));
        let decided = |outcome: Outcome, by: &str, reason: &str| {
            decision(v1::DraftDecision { outcome: outcome as i32, by: by.into(), at, reason: reason.into() }).expect("decision")
        };
        let rejected = decided(Outcome::Rejected, "alice", "too wide");
        assert_eq!((rejected.by.as_deref(), rejected.approved, rejected.reason.as_deref()), (Some("alice"), Some(false), Some("too wide")));
        let withdrawn = decided(Outcome::Withdrawn, "agent", "");
        assert_eq!((withdrawn.by, withdrawn.withdrawn_by.as_deref(), withdrawn.approved), (None, Some("agent"), None));
        assert_eq!(decided(Outcome::Expired, "", "").by, None);
        assert!(
            decision(v1::DraftDecision { outcome: Outcome::Approved as i32, by: "alice".into(), at: None, reason: String::new() }).is_err(),
            "no time: our bug"
        );
    }
}
