//! The drafts view: one row per draft with what the approver must see (R-APPROVE-1) and
//! its status and decision (R-DRAFT-12). The pending list is its `pending_approval` rows.

use atasira_domain::aggregates::boxes::BoxEvent;
use atasira_domain::aggregates::draft::DraftEvent;
use atasira_platform::db::{Db, StoredEvent};
use atasira_platform::projection::Projection;
use serde_json::{Value, json};
use sqlx::{Any, Row, Transaction};

pub const NAME: &str = "drafts_view";
/// The aggregate types this projection reads: its drafts, and Boxes for `active`/`box_id`.
pub const READS: &[&str] = &["draft", "box"];

const TABLES: &[&str] = &["CREATE TABLE IF NOT EXISTS drafts_view (
    draft_id TEXT PRIMARY KEY,
    box_type TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    status TEXT NOT NULL,
    position BIGINT NOT NULL,
    view_json TEXT NOT NULL
)"];

/// The projection of draft events into `drafts_view`.
#[derive(Debug)]
pub struct DraftsView;

const PAGE_MAX: u32 = 200;
const PAGE_DEFAULT: u32 = 50;

#[async_trait::async_trait]
impl Projection for DraftsView {
    fn name(&self) -> &'static str {
        NAME
    }
    fn aggregate_types(&self) -> &'static [&'static str] {
        READS
    }
    fn tables(&self) -> &'static [&'static str] {
        TABLES
    }
    fn table_names(&self) -> &'static [&'static str] {
        &["drafts_view"]
    }

    async fn apply(&self, tx: &mut Transaction<'static, Any>, event: &StoredEvent) -> anyhow::Result<()> {
        if event.aggregate_type == "box" {
            // R-APPROVE-4: the draft becomes `active` once its Box is.
            if let Ok(BoxEvent::BoxActivated { box_id, draft_id, .. }) = serde_json::from_value::<BoxEvent>(event.payload.clone()) {
                let row = sqlx::query("SELECT view_json FROM drafts_view WHERE draft_id = $1").bind(&draft_id).fetch_optional(&mut **tx).await?;
                if let Some(row) = row {
                    let mut view: Value = serde_json::from_str(&row.try_get::<String, _>(0)?)?;
                    view["status"] = Value::from("active");
                    view["box_id"] = Value::from(box_id);
                    sqlx::query("UPDATE drafts_view SET status = 'active', view_json = $1 WHERE draft_id = $2")
                        .bind(view.to_string())
                        .bind(&draft_id)
                        .execute(&mut **tx)
                        .await?;
                }
            }
            return Ok(());
        }
        let parsed: DraftEvent = serde_json::from_value(event.payload.clone())?;
        match parsed {
            DraftEvent::DraftSubmitted { draft_id, box_type, manifest, over_limit, warnings, requested_by, submitted_at } => {
                let view = json!({
                    "draft_id": draft_id,
                    "box_type": box_type,
                    "name": manifest.name,
                    "purpose": manifest.purpose,
                    "os_operations": manifest.os_operations,
                    "tools": manifest.tools,
                    "url_allowlist": manifest.url_allowlist,
                    "prohibited": manifest.prohibited_actions,
                    "over_limit": over_limit.over_limit,
                    "over_limit_ops": over_limit.over_limit_ops,
                    "over_limit_tools": over_limit.over_limit_tools,
                    "warnings": warnings,
                    "requested_by": requested_by.user_id,
                    "status": "pending_approval",
                    "created_at": submitted_at,
                    "network": manifest.network,
                    "file_access": manifest.file_access,
                    "allowed_apps": manifest.allowed_apps,
                    "required_access": manifest.required_access,
                    "decision": Value::Null,
                    "box_id": Value::Null,
                    "manifest": manifest,
                });
                sqlx::query(
                    "INSERT INTO drafts_view (draft_id, box_type, requested_by, status, position, view_json) VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (draft_id) DO NOTHING",
                )
                .bind(&draft_id)
                .bind(&box_type)
                .bind(&requested_by.user_id)
                .bind("pending_approval")
                .bind(event.position)
                .bind(view.to_string())
                .execute(&mut **tx)
                .await?;
            }
            DraftEvent::DraftWithdrawn { draft_id, withdrawn_by, at } => {
                set_status(tx, &draft_id, "withdrawn", json!({"withdrawn_by": withdrawn_by, "at": at})).await?;
            }
            DraftEvent::DraftExpired { draft_id, at } => set_status(tx, &draft_id, "expired", json!({"at": at})).await?,
            DraftEvent::DraftApproved { draft_id, approved_by, approved_at, .. } => {
                // A Box activated already (replay in another order) keeps `active`.
                set_status(tx, &draft_id, "approved", json!({"by": approved_by, "at": approved_at, "approved": true})).await?;
            }
            DraftEvent::DraftRejected { draft_id, rejected_by, reason, at, .. } => {
                set_status(tx, &draft_id, "rejected", json!({"by": rejected_by, "at": at, "approved": false, "reason": reason})).await?;
            }
        }
        Ok(())
    }
}

async fn set_status(tx: &mut Transaction<'static, Any>, draft_id: &str, status: &str, decision: Value) -> anyhow::Result<()> {
    let row = sqlx::query("SELECT view_json FROM drafts_view WHERE draft_id = $1").bind(draft_id).fetch_optional(&mut **tx).await?;
    let Some(row) = row else { return Ok(()) };
    let mut view: Value = serde_json::from_str(&row.try_get::<String, _>(0)?)?;
    // Relays of different services deliver in different orders: a Box that is already
    // active keeps its draft `active`.
    let status = if status == "approved" && view["status"] == "active" { "active" } else { status };
    view["status"] = Value::from(status);
    view["decision"] = decision;
    sqlx::query("UPDATE drafts_view SET status = $1, view_json = $2 WHERE draft_id = $3")
        .bind(status)
        .bind(view.to_string())
        .bind(draft_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// A page of drafts in submission order, filtered by status and/or requester. The cursor
/// is the position of the last row of the previous page.
pub async fn list(db: &Db, status: Option<&str>, requested_by: Option<&str>, limit: u32, cursor: &str) -> anyhow::Result<(Vec<Vec<u8>>, String)> {
    let limit = if limit == 0 { PAGE_DEFAULT } else { limit.min(PAGE_MAX) };
    let after: i64 = if cursor.is_empty() { 0 } else { cursor.parse().map_err(|_| anyhow::anyhow!("bad cursor"))? };
    let rows = sqlx::query(
        "SELECT position, view_json FROM drafts_view
          WHERE position > $1 AND ($2 = '' OR status = $2) AND ($3 = '' OR requested_by = $3)
          ORDER BY position LIMIT $4",
    )
    .bind(after)
    .bind(status.unwrap_or(""))
    .bind(requested_by.unwrap_or(""))
    .bind(i64::from(limit) + 1)
    .fetch_all(db.any())
    .await?;
    let more = rows.len() > limit as usize;
    let mut out = Vec::new();
    let mut last = 0i64;
    for row in rows.iter().take(limit as usize) {
        last = row.try_get(0)?;
        let json: String = row.try_get(1)?;
        let mut v: Value = serde_json::from_str(&json)?;
        // The list shows what the approver needs; the full manifest is in the detail.
        if let Some(o) = v.as_object_mut() {
            o.remove("manifest");
        }
        out.push(v.to_string().into_bytes());
    }
    Ok((out, if more { last.to_string() } else { String::new() }))
}

/// The requester and the full view of one draft.
pub async fn get(db: &Db, draft_id: &str) -> anyhow::Result<Option<(String, Vec<u8>)>> {
    let row = sqlx::query("SELECT requested_by, view_json FROM drafts_view WHERE draft_id = $1").bind(draft_id).fetch_optional(db.any()).await?;
    Ok(match row {
        Some(r) => Some((r.try_get(0)?, r.try_get::<String, _>(1)?.into_bytes())),
        None => None,
    })
}

/// Ids of pending drafts submitted before `cutoff` (R-DRAFT-13).
pub async fn pending_older_than(db: &Db, cutoff: chrono::DateTime<chrono::Utc>) -> anyhow::Result<Vec<String>> {
    let rows = sqlx::query("SELECT draft_id, view_json FROM drafts_view WHERE status = 'pending_approval' ORDER BY position").fetch_all(db.any()).await?;
    let mut out = Vec::new();
    for row in rows {
        let view: Value = serde_json::from_str(&row.try_get::<String, _>(1)?)?;
        let created = view["created_at"].as_str().and_then(|s| chrono::DateTime::parse_from_rfc3339(s).ok());
        if created.is_some_and(|c| c < cutoff) {
            out.push(row.try_get(0)?);
        }
    }
    Ok(out)
}
