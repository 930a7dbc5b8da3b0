//! The registry's projections: the Box view (list and detail, with assignments and
//! provisioning outcomes; R-BOX-5) and the manifest files on disk (R-BOX-2), both rebuilt
//! from `box` (and `access`) events.

use std::path::{Path, PathBuf};

use atasira_domain::BoxManifest;
use atasira_domain::aggregates::access::AccessEvent;
use atasira_domain::aggregates::boxes::BoxEvent;
use atasira_platform::db::{Db, StoredEvent};
use atasira_platform::projection::Projection;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use sqlx::{Any, Row, Transaction};

pub const BOXES: &str = "registry_boxes";
pub const BOXES_READS: &[&str] = &["box", "access"];
pub const MANIFESTS: &str = "registry_manifests";
pub const MANIFESTS_READS: &[&str] = &["box"];

/// The Box view.
#[derive(Debug)]
pub struct BoxesView;

#[async_trait::async_trait]
impl Projection for BoxesView {
    fn name(&self) -> &'static str {
        BOXES
    }
    fn aggregate_types(&self) -> &'static [&'static str] {
        BOXES_READS
    }
    fn tables(&self) -> &'static [&'static str] {
        &["CREATE TABLE IF NOT EXISTS registry_boxes (
            box_id TEXT PRIMARY KEY,
            box_type TEXT NOT NULL,
            draft_id TEXT NOT NULL,
            state TEXT NOT NULL,
            position BIGINT NOT NULL,
            view_json TEXT NOT NULL
        )"]
    }
    fn table_names(&self) -> &'static [&'static str] {
        &["registry_boxes"]
    }

    async fn apply(&self, tx: &mut Transaction<'static, Any>, event: &StoredEvent) -> anyhow::Result<()> {
        if event.aggregate_type == "access" {
            let outcome: AccessEvent = serde_json::from_value(event.payload.clone())?;
            let (box_id, entry) = match outcome {
                AccessEvent::AccessProvisioned { box_id, index, access, detail, attempts, at, .. } => {
                    (box_id, json!({"index": index, "access": access, "status": "provisioned", "detail": detail, "attempts": attempts, "at": at}))
                }
                AccessEvent::AccessProvisionFailed { box_id, index, access, reason, attempts, at, .. } => {
                    (box_id, json!({"index": index, "access": access, "status": "failed", "reason": reason, "attempts": attempts, "at": at}))
                }
            };
            return update(tx, &box_id, |view| {
                let list = view["provisioning"].as_array_mut();
                if let Some(list) = list {
                    list.retain(|e| e["index"] != entry["index"]);
                    list.push(entry.clone());
                    list.sort_by_key(|e| e["index"].as_u64().unwrap_or(0));
                }
                None
            })
            .await;
        }
        let parsed: BoxEvent = serde_json::from_value(event.payload.clone())?;
        match parsed {
            BoxEvent::BoxActivated { box_id, box_type, draft_id, manifest, approved_by, activated_at, .. } => {
                let view = json!({
                    "box_id": box_id,
                    "box_type": box_type,
                    "name": manifest.name,
                    "state": "idle",
                    "manifest_version": manifest.version,
                    "created_at": activated_at,
                    "draft_id": draft_id,
                    "approved_by": approved_by,
                    "manifest": manifest,
                    "assignments": [],
                    "provisioning": [],
                });
                sqlx::query("INSERT INTO registry_boxes (box_id, box_type, draft_id, state, position, view_json) VALUES ($1, $2, $3, 'idle', $4, $5) ON CONFLICT (box_id) DO NOTHING")
                    .bind(&box_id)
                    .bind(&box_type)
                    .bind(&draft_id)
                    .bind(event.position)
                    .bind(view.to_string())
                    .execute(&mut **tx)
                    .await?;
                Ok(())
            }
            BoxEvent::BoxUserAssigned { box_id, user_id, role_in_box, .. } => {
                update(tx, &box_id, |view| {
                    if let Some(list) = view["assignments"].as_array_mut() {
                        list.retain(|a| a["user_id"] != user_id.as_str());
                        list.push(json!({"user_id": user_id, "role_in_box": role_in_box}));
                    }
                    None
                })
                .await
            }
            BoxEvent::BoxManifestEdited { box_id, manifest, .. } | BoxEvent::BoxConfigEdited { box_id, manifest, .. } => {
                update(tx, &box_id, |view| {
                    view["manifest_version"] = Value::from(manifest.version.clone());
                    view["name"] = Value::from(manifest.name.clone());
                    view["manifest"] = serde_json::to_value(&manifest).unwrap_or(Value::Null);
                    None
                })
                .await
            }
            BoxEvent::BoxStopped { box_id, .. } => set_state(tx, &box_id, "stopped").await,
            BoxEvent::BoxResumed { box_id, .. } => set_state(tx, &box_id, "idle").await,
            BoxEvent::BoxArchived { box_id, .. } => set_state(tx, &box_id, "archived").await,
        }
    }
}

async fn set_state(tx: &mut Transaction<'static, Any>, box_id: &str, state: &'static str) -> anyhow::Result<()> {
    update(tx, box_id, |view| {
        view["state"] = Value::from(state);
        Some(state)
    })
    .await
}

/// Read-modify-write of one view row; `edit` returns a new state column value if any.
async fn update(tx: &mut Transaction<'static, Any>, box_id: &str, edit: impl FnOnce(&mut Value) -> Option<&'static str>) -> anyhow::Result<()> {
    let row = sqlx::query("SELECT view_json, state FROM registry_boxes WHERE box_id = $1").bind(box_id).fetch_optional(&mut **tx).await?;
    let Some(row) = row else { return Ok(()) };
    let mut view: Value = serde_json::from_str(&row.try_get::<String, _>(0)?)?;
    let state = edit(&mut view).map(str::to_owned).unwrap_or(row.try_get::<String, _>(1)?);
    sqlx::query("UPDATE registry_boxes SET view_json = $1, state = $2 WHERE box_id = $3")
        .bind(view.to_string())
        .bind(state)
        .bind(box_id)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// R-BOX-5: active Boxes (not stopped or archived), one per box_type.
pub async fn list(db: &Db) -> anyhow::Result<Vec<Value>> {
    let rows = sqlx::query("SELECT view_json FROM registry_boxes WHERE state = 'idle' ORDER BY position").fetch_all(db.any()).await?;
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for row in rows {
        let v: Value = serde_json::from_str(&row.try_get::<String, _>(0)?)?;
        if seen.insert(v["box_type"].as_str().unwrap_or_default().to_owned()) {
            out.push(json!({
                "box_id": v["box_id"], "box_type": v["box_type"], "name": v["name"], "state": v["state"],
                "manifest_version": v["manifest_version"], "created_at": v["created_at"],
            }));
        }
    }
    Ok(out)
}

/// One Box with manifest, assignments, provisioning and drift.
pub async fn get(db: &Db, manifests_dir: &Path, box_id: &str) -> anyhow::Result<Option<Value>> {
    let row = sqlx::query("SELECT view_json FROM registry_boxes WHERE box_id = $1").bind(box_id).fetch_optional(db.any()).await?;
    let Some(row) = row else { return Ok(None) };
    let mut v: Value = serde_json::from_str(&row.try_get::<String, _>(0)?)?;
    let box_type = v["box_type"].as_str().unwrap_or_default().to_owned();
    let drift = if v["state"] == "archived" { false } else { drift(db, manifests_dir, &box_type).await? };
    v["manifest_drift"] = Value::from(drift);
    Ok(Some(v))
}

/// `<manifests_dir>/<box_type>.yaml`.
pub fn manifest_path(manifests_dir: &Path, box_type: &str) -> PathBuf {
    manifests_dir.join(format!("{box_type}.yaml"))
}

fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The digest the registry last wrote for `box_type`, if any.
async fn written_digest(db: &Db, box_type: &str) -> anyhow::Result<Option<String>> {
    let row = sqlx::query("SELECT digest FROM registry_manifest_files WHERE box_type = $1").bind(box_type).fetch_optional(db.any()).await?;
    Ok(row.map(|r| r.try_get::<String, _>(0)).transpose()?)
}

/// R-BOX-2: a file at the manifest path that the registry did not write (by digest).
pub async fn foreign_file(db: &Db, manifests_dir: &Path, box_type: &str) -> anyhow::Result<bool> {
    match std::fs::read(manifest_path(manifests_dir, box_type)) {
        Ok(bytes) => Ok(written_digest(db, box_type).await?.as_deref() != Some(digest(&bytes).as_str())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// R-BOX-2: the file on disk differs from (or is missing versus) what the registry wrote.
async fn drift(db: &Db, manifests_dir: &Path, box_type: &str) -> anyhow::Result<bool> {
    let written = written_digest(db, box_type).await?;
    let on_disk = std::fs::read(manifest_path(manifests_dir, box_type)).ok().map(|b| digest(&b));
    Ok(written != on_disk)
}

/// Writes atomically: a temp file in the same directory, then rename.
fn write_atomically(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let dir = path.parent().ok_or_else(|| anyhow::anyhow!("no parent directory for {}", path.display()))?;
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(".{}.tmp-{}", path.file_name().and_then(|n| n.to_str()).unwrap_or("manifest"), uuid::Uuid::new_v4().simple()));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

/// The manifest files: the YAML a running host agent reads, a projection of the Box's
/// events. A file the registry did not write is never overwritten (drift is reported).
#[derive(Debug)]
pub struct ManifestFiles {
    pub manifests_dir: PathBuf,
}

#[async_trait::async_trait]
impl Projection for ManifestFiles {
    fn name(&self) -> &'static str {
        MANIFESTS
    }
    fn aggregate_types(&self) -> &'static [&'static str] {
        MANIFESTS_READS
    }
    fn tables(&self) -> &'static [&'static str] {
        &["CREATE TABLE IF NOT EXISTS registry_manifest_files (box_type TEXT PRIMARY KEY, box_id TEXT NOT NULL, digest TEXT NOT NULL)"]
    }
    fn table_names(&self) -> &'static [&'static str] {
        &["registry_manifest_files"]
    }

    async fn apply(&self, tx: &mut Transaction<'static, Any>, event: &StoredEvent) -> anyhow::Result<()> {
        let parsed: BoxEvent = serde_json::from_value(event.payload.clone())?;
        let (box_id, manifest): (String, BoxManifest) = match parsed {
            BoxEvent::BoxActivated { box_id, manifest, .. }
            | BoxEvent::BoxManifestEdited { box_id, manifest, .. }
            | BoxEvent::BoxConfigEdited { box_id, manifest, .. } => (box_id, manifest),
            BoxEvent::BoxArchived { box_id, box_type, .. } => {
                let path = manifest_path(&self.manifests_dir, &box_type);
                let ours = sqlx::query("SELECT digest FROM registry_manifest_files WHERE box_type = $1 AND box_id = $2")
                    .bind(&box_type)
                    .bind(&box_id)
                    .fetch_optional(&mut **tx)
                    .await?;
                if let Some(row) = ours {
                    let digest_now = std::fs::read(&path).ok().map(|b| digest(&b));
                    if digest_now.as_deref() == Some(row.try_get::<String, _>(0)?.as_str()) {
                        let archived = self.manifests_dir.join(".archived").join(format!("{box_type}-{box_id}.yaml"));
                        std::fs::create_dir_all(archived.parent().unwrap_or(&self.manifests_dir))?;
                        std::fs::rename(&path, &archived)?;
                    }
                    sqlx::query("DELETE FROM registry_manifest_files WHERE box_type = $1").bind(&box_type).execute(&mut **tx).await?;
                }
                return Ok(());
            }
            _ => return Ok(()),
        };
        let box_type = manifest.box_type.to_string();
        let path = manifest_path(&self.manifests_dir, &box_type);
        let yaml = manifest.to_yaml();
        let new_digest = digest(yaml.as_bytes());
        let previous = sqlx::query("SELECT digest FROM registry_manifest_files WHERE box_type = $1")
            .bind(&box_type)
            .fetch_optional(&mut **tx)
            .await?
            .map(|r| r.try_get::<String, _>(0))
            .transpose()?;
        let on_disk = std::fs::read(&path).ok().map(|b| digest(&b));
        let ours_or_absent = on_disk.is_none() || on_disk == previous || on_disk.as_deref() == Some(new_digest.as_str());
        if !ours_or_absent {
            tracing::warn!(box_type, path = %path.display(), "manifest file was changed outside atasira; not overwriting (drift)");
            return Ok(());
        }
        write_atomically(&path, yaml.as_bytes())?;
        sqlx::query("INSERT INTO registry_manifest_files (box_type, box_id, digest) VALUES ($1, $2, $3) ON CONFLICT (box_type) DO UPDATE SET box_id = excluded.box_id, digest = excluded.digest")
            .bind(&box_type)
            .bind(&box_id)
            .bind(&new_digest)
            .execute(&mut **tx)
            .await?;
        Ok(())
    }
}
