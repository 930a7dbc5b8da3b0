//! Proto replies -> the JSON bodies the HTTP API answers with.

use atasira_contracts::{convert, v1};
use atasira_domain::BoxManifest;
use atasira_domain::manifest::RequiredAccess;
use serde_json::{Value, json};

use crate::ApiError;

/// `DRAFT_STATUS_PENDING_APPROVAL` -> `pending_approval`.
fn enum_name(full: &str, prefix: &str) -> String {
    full.strip_prefix(prefix).unwrap_or(full).to_ascii_lowercase()
}

fn time(t: Option<&prost_types::Timestamp>) -> Value {
    convert::time_from_wire(t).map_or(Value::Null, |t| json!(t))
}

fn manifest(m: Option<v1::BoxManifest>) -> Result<Value, ApiError> {
    match m {
        None => Ok(Value::Null),
        Some(m) => Ok(json!(BoxManifest::try_from(m).map_err(ApiError::internal)?)),
    }
}

fn draft_status(s: i32) -> String {
    enum_name(v1::DraftStatus::try_from(s).unwrap_or_default().as_str_name(), "DRAFT_STATUS_")
}

pub fn draft(d: v1::DraftView) -> Result<Value, ApiError> {
    use v1::draft_decision::Outcome;
    let decision = match &d.decision {
        None => Value::Null,
        Some(dec) => match Outcome::try_from(dec.outcome).unwrap_or_default() {
            Outcome::Approved => json!({"by": dec.by, "at": time(dec.at.as_ref()), "approved": true}),
            Outcome::Rejected => json!({"by": dec.by, "at": time(dec.at.as_ref()), "approved": false, "reason": dec.reason}),
            Outcome::Withdrawn => json!({"withdrawn_by": dec.by, "at": time(dec.at.as_ref())}),
            Outcome::Expired | Outcome::Unspecified => json!({"at": time(dec.at.as_ref())}),
        },
    };
    let required_access: Vec<RequiredAccess> =
        d.required_access.into_iter().map(RequiredAccess::try_from).collect::<Result<_, _>>().map_err(ApiError::internal)?;
    let mut body = json!({
        "draft_id": d.draft_id,
        "box_type": d.box_type,
        "name": d.name,
        "purpose": d.purpose,
        "os_operations": d.os_operations,
        "tools": d.tools,
        "url_allowlist": d.url_allowlist,
        "prohibited": d.prohibited,
        "over_limit": d.over_limit,
        "over_limit_ops": d.over_limit_ops,
        "over_limit_tools": d.over_limit_tools,
        "warnings": d.warnings,
        "requested_by": d.requested_by,
        "status": draft_status(d.status),
        "created_at": time(d.created_at.as_ref()),
        "network": enum_name(v1::Network::try_from(d.network).unwrap_or_default().as_str_name(), "NETWORK_"),
        "file_access": d.file_access,
        "allowed_apps": d.allowed_apps,
        "required_access": required_access,
        "decision": decision,
        "box_id": if d.box_id.is_empty() { Value::Null } else { Value::from(d.box_id) },
    });
    if d.manifest.is_some() {
        body["manifest"] = manifest(d.manifest)?;
    }
    Ok(body)
}

pub fn draft_page(p: v1::DraftPage) -> Result<Value, ApiError> {
    let drafts = p.drafts.into_iter().map(draft).collect::<Result<Vec<_>, _>>()?;
    Ok(json!({"drafts": drafts, "next_cursor": cursor(p.next_cursor)}))
}

pub fn cursor(next: u64) -> Value {
    if next == 0 { Value::Null } else { Value::from(next.to_string()) }
}

pub fn decision(r: v1::DecisionReply) -> Result<Value, ApiError> {
    let status = draft_status(r.status);
    if status == "rejected" {
        return Ok(json!({"draft_id": r.draft_id, "status": status}));
    }
    Ok(json!({
        "draft_id": r.draft_id,
        "status": status,
        "box_id": r.box_id,
        "box_type": r.box_type,
        "approved_by": r.approved_by,
        "approved_at": time(r.approved_at.as_ref()),
    }))
}

pub fn withdrawn(r: v1::WithdrawReply) -> Result<Value, ApiError> {
    Ok(json!({"draft_id": r.draft_id, "status": draft_status(r.status)}))
}

pub fn box_summary(s: &v1::BoxSummary) -> Value {
    json!({
        "box_id": s.box_id,
        "box_type": s.box_type,
        "name": s.name,
        "state": enum_name(v1::BoxState::try_from(s.state).unwrap_or_default().as_str_name(), "BOX_STATE_"),
        "manifest_version": s.manifest_version,
        "created_at": time(s.created_at.as_ref()),
    })
}

pub fn box_view(r: v1::BoxReply) -> Result<Value, ApiError> {
    let b = r.r#box.ok_or_else(|| ApiError::internal("empty Box reply"))?;
    let mut body = b.summary.as_ref().map(box_summary).unwrap_or_else(|| json!({}));
    body["draft_id"] = Value::from(b.draft_id);
    body["approved_by"] = Value::from(b.approved_by);
    body["manifest"] = manifest(b.manifest)?;
    body["assignments"] = b
        .assignments
        .iter()
        .map(|a| json!({"user_id": a.user_id, "role_in_box": enum_name(v1::BoxRole::try_from(a.role_in_box).unwrap_or_default().as_str_name(), "BOX_ROLE_")}))
        .collect();
    body["provisioning"] = b
        .provisioning
        .iter()
        .map(|p| {
            let ok = p.status == v1::provisioning::Status::Provisioned as i32;
            let mut e = json!({"index": p.index, "access": p.access, "status": if ok { "provisioned" } else { "failed" }, "attempts": p.attempts, "at": time(p.at.as_ref())});
            if ok {
                e["detail"] = Value::from(p.detail.clone());
            } else {
                e["reason"] = Value::from(p.reason.clone());
            }
            e
        })
        .collect();
    body["manifest_drift"] = Value::from(b.manifest_drift);
    Ok(body)
}

pub fn audit_page(p: v1::AuditPage) -> Result<Value, ApiError> {
    let rows = p.rows.iter().map(|r| convert::ledger_row_from_wire(r).map(|r| json!(r))).collect::<Result<Vec<_>, _>>().map_err(ApiError::internal)?;
    Ok(json!({"rows": rows, "next_cursor": cursor(p.next_cursor)}))
}

pub fn verification(v: v1::VerifyReply) -> Result<Value, ApiError> {
    Ok(json!(convert::verification_from_wire(&v)))
}

/// The draft request body -> its wire form; the domain parser reports what is malformed.
pub fn draft_request(body: &[u8]) -> Result<v1::BoxDraftCreateRequest, ApiError> {
    let r = atasira_domain::draft_request::BoxDraftCreateRequest::from_json_bytes(body).map_err(|e| ApiError::new(e.code(), e.to_string()))?;
    let required_access = r
        .required_access
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            serde_json::from_value::<AccessBody>(v)
                .map(AccessBody::into_wire)
                .map_err(|e| ApiError::new(atasira_domain::ErrorCode::InvalidRequest, format!("required_access[{i}]: {e}")))
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

/// A page cursor: the `next_cursor` of an earlier page.
pub fn parse_cursor(cursor: Option<&str>) -> Result<u64, ApiError> {
    match cursor {
        None | Some("") => Ok(0),
        Some(c) => c.parse().map_err(|_| ApiError::new(atasira_domain::ErrorCode::InvalidCursor, "cursor: use the next_cursor of an earlier page")),
    }
}

/// One `required_access` entry as the API takes it: only the keys of its kind (a
/// `password`, say, is refused, never dropped).
#[derive(Debug, serde::Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum AccessBody {
    GitRemote { url: String },
    SshTarget { host: String, user: String, port: Option<u16> },
    NetrcEntry { machine: String, login: String, vault: String, item: String },
}

impl AccessBody {
    fn into_wire(self) -> v1::RequiredAccess {
        use v1::required_access::{GitRemote, Kind, NetrcEntry, SshTarget};
        let kind = match self {
            AccessBody::GitRemote { url } => Kind::GitRemote(GitRemote { url }),
            AccessBody::SshTarget { host, user, port } => Kind::SshTarget(SshTarget { host, user, port: port.map_or(0, u32::from) }),
            AccessBody::NetrcEntry { machine, login, vault, item } => Kind::NetrcEntry(NetrcEntry { machine, login, vault, item }),
        };
        v1::RequiredAccess { kind: Some(kind) }
    }
}
