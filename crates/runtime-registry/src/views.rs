//! The registry's projections: the Box view (list and detail, with assignments and
//! provisioning outcomes; R-BOX-5) and the manifest files on disk (R-BOX-2), both rebuilt
//! from `box` (and `access`) events.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use atasira_contracts::{convert, v1};
use atasira_domain::BoxManifest;
use atasira_domain::aggregates::access::AccessEvent;
use atasira_domain::aggregates::boxes::{BoxEvent, BoxRole, BoxState};
use atasira_domain::aggregates::types;
use atasira_platform::projection::{DecodedPage, PageDecoder, Projection, for_connection, placeholders, rows_per_statement, values_list};
use atasira_platform::store::{Db, EventRef, StoredEvent, TextEvent};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

pub const BOXES: &str = "registry_boxes";
pub const BOXES_READS: &[&str] = &[types::BOX, types::ACCESS];
/// The Box list as a read-your-writes wait waits for it.
pub const BOXES_READ_MODEL: atasira_platform::projection::ReadModel = atasira_platform::projection::ReadModel::new(BOXES, BOXES_READS);
pub const MANIFESTS: &str = "registry_manifests";
pub const MANIFESTS_READS: &[&str] = &[types::BOX];

/// One Box in the view: what `GET /boxes/{id}` shows, built from its events.
#[derive(Debug, Clone, PartialEq)]
pub struct BoxRow {
    pub box_id: String,
    pub box_type: String,
    pub draft_id: String,
    pub state: BoxState,
    /// The store position of its activation: the list order.
    pub position: i64,
    pub created_at: DateTime<Utc>,
    pub approved_by: String,
    pub manifest: BoxManifest,
    pub assignments: Vec<AssignmentRow>,
    pub provisioning: Vec<ProvisioningRow>,
    /// An active Box a Worker of which runs on an execution host (read, never stored: the
    /// Worker catalog says it).
    pub running: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssignmentRow {
    pub user_id: String,
    pub role_in_box: BoxRole,
}

/// The outcome of one `required_access` entry, as the provisioner recorded it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProvisioningRow {
    pub index: u32,
    /// The entry, described.
    pub access: String,
    pub provisioned: bool,
    /// What was set up, or why it failed.
    pub outcome: String,
    pub attempts: u32,
    pub at: DateTime<Utc>,
}

impl BoxRow {
    /// A new row from an activation; other events need a row to apply to.
    pub fn activated(event: &BoxEvent, position: i64) -> Option<BoxRow> {
        let BoxEvent::BoxActivated { box_id, box_type, draft_id, manifest, approved_by, activated_at, .. } = event else { return None };
        Some(BoxRow {
            box_id: box_id.clone(),
            box_type: box_type.clone(),
            draft_id: draft_id.clone(),
            state: BoxState::Idle,
            position,
            created_at: *activated_at,
            approved_by: approved_by.clone(),
            manifest: manifest.clone(),
            assignments: vec![],
            provisioning: vec![],
            running: false,
        })
    }

    /// A later event of the same Box.
    pub fn apply(&mut self, event: &BoxEvent) {
        match event {
            BoxEvent::BoxActivated { .. } => {}
            BoxEvent::BoxUserAssigned { user_id, role_in_box, .. } => {
                self.assignments.retain(|a| a.user_id != *user_id);
                self.assignments.push(AssignmentRow { user_id: user_id.clone(), role_in_box: *role_in_box });
            }
            BoxEvent::BoxManifestEdited { manifest, .. } | BoxEvent::BoxConfigEdited { manifest, .. } => self.manifest = manifest.clone(),
            // An approved change: its manifest, and the human admin who approved it.
            BoxEvent::BoxManifestChanged { manifest, approved_by, .. } => {
                self.manifest = manifest.clone();
                self.approved_by = approved_by.clone();
            }
            BoxEvent::BoxStopped { .. } => self.state = BoxState::Stopped,
            BoxEvent::BoxResumed { .. } => self.state = BoxState::Idle,
            BoxEvent::BoxArchived { .. } => self.state = BoxState::Archived,
            BoxEvent::BoxUserUnassigned { user_id, .. } => self.assignments.retain(|a| a.user_id != *user_id),
        }
    }

    /// A provisioning outcome for one of its entries; a later outcome replaces an earlier.
    pub fn provisioned(&mut self, event: &AccessEvent) {
        let entry = match event {
            AccessEvent::AccessProvisioned { index, access, detail, attempts, at, .. } => {
                ProvisioningRow { index: *index, access: access.clone(), provisioned: true, outcome: detail.clone(), attempts: *attempts, at: *at }
            }
            AccessEvent::AccessProvisionFailed { index, access, reason, attempts, at, .. } => {
                ProvisioningRow { index: *index, access: access.clone(), provisioned: false, outcome: reason.clone(), attempts: *attempts, at: *at }
            }
        };
        self.provisioning.retain(|e| e.index != entry.index);
        self.provisioning.push(entry);
        self.provisioning.sort_by_key(|e| e.index);
    }

    pub fn summary(&self) -> v1::BoxSummary {
        v1::BoxSummary {
            box_id: self.box_id.clone(),
            box_type: self.box_type.clone(),
            name: self.manifest.name.clone(),
            state: if self.running && self.state == BoxState::Idle { v1::BoxState::Running } else { convert::box_state_to_wire(self.state) } as i32,
            manifest_version: self.manifest.version.clone(),
            created_at: Some(convert::timestamp(self.created_at)),
        }
    }

    /// The detail, with whether the file on disk drifted from what the registry wrote.
    pub fn to_wire(&self, manifest_drift: bool) -> v1::BoxView {
        v1::BoxView {
            summary: Some(self.summary()),
            draft_id: self.draft_id.clone(),
            approved_by: self.approved_by.clone(),
            manifest: Some(v1::BoxManifest::from(&self.manifest)),
            assignments: self
                .assignments
                .iter()
                .map(|a| v1::Assignment { user_id: a.user_id.clone(), role_in_box: convert::box_role_to_wire(a.role_in_box) as i32 })
                .collect(),
            provisioning: self
                .provisioning
                .iter()
                .map(|p| v1::Provisioning {
                    index: p.index,
                    access: p.access.clone(),
                    status: if p.provisioned { v1::provisioning::Status::Provisioned } else { v1::provisioning::Status::Failed } as i32,
                    detail: if p.provisioned { p.outcome.clone() } else { String::new() },
                    reason: if p.provisioned { String::new() } else { p.outcome.clone() },
                    attempts: p.attempts,
                    at: Some(convert::timestamp(p.at)),
                })
                .collect(),
            manifest_drift,
        }
    }

    fn from_sql(row: &AnyRow) -> anyhow::Result<BoxRow> {
        Ok(BoxRow {
            box_id: row.try_get(0)?,
            box_type: row.try_get(1)?,
            draft_id: row.try_get(2)?,
            state: serde_json::from_value(serde_json::Value::String(row.try_get(3)?))?,
            position: row.try_get(4)?,
            created_at: DateTime::from_timestamp_nanos(row.try_get(5)?),
            approved_by: row.try_get(6)?,
            manifest: serde_json::from_str(&row.try_get::<String, _>(7)?)?,
            assignments: serde_json::from_str(&row.try_get::<String, _>(8)?)?,
            provisioning: serde_json::from_str(&row.try_get::<String, _>(9)?)?,
            // Read with `RUNNING`; rows loaded to be changed have no such column.
            running: row.try_get::<i64, _>(10).is_ok_and(|n| n != 0),
        })
    }
}

/// Stores `rows` (each Box once), a few to a statement: a new Box's row is inserted; a
/// stored one takes the row's state, manifest (and its approver), assignments and provisioning.
async fn save_all(tx: &mut Transaction<'static, Any>, rows: &[&BoxRow]) -> anyhow::Result<()> {
    for chunk in rows.chunks(rows_per_statement(10)) {
        let sql = format!(
            "INSERT INTO box_rows ({COLUMNS}) VALUES {} ON CONFLICT (box_id) DO UPDATE SET state = excluded.state, manifest_json = excluded.manifest_json,
               approved_by = excluded.approved_by, assignments_json = excluded.assignments_json, provisioning_json = excluded.provisioning_json",
            values_list(chunk.len(), 10)
        );
        let sql = for_connection(tx, sql);
        let mut query = sqlx::query(&sql);
        for row in chunk {
            let state = serde_json::to_value(row.state)?.as_str().unwrap_or_default().to_owned();
            query = query
                .bind(row.box_id.clone())
                .bind(row.box_type.clone())
                .bind(row.draft_id.clone())
                .bind(state)
                .bind(row.position)
                .bind(row.created_at.timestamp_nanos_opt().unwrap_or(i64::MAX))
                .bind(row.approved_by.clone())
                .bind(serde_json::to_string(&row.manifest)?)
                .bind(serde_json::to_string(&row.assignments)?)
                .bind(serde_json::to_string(&row.provisioning)?);
        }
        query.execute(&mut **tx).await?;
    }
    Ok(())
}

const COLUMNS: &str = "box_id, box_type, draft_id, state, position, created_at_ns, approved_by, manifest_json, assignments_json, provisioning_json";

/// Whether a Worker of the Box runs (R-HOST-2): the eleventh column of a read.
const RUNNING: &str =
    "CASE WHEN EXISTS (SELECT 1 FROM worker_life w WHERE w.box_id = box_rows.box_id AND w.state IN ('starting', 'running', 'paused')) THEN 1 ELSE 0 END";

/// Rows as reads show them.
fn select() -> String {
    format!("SELECT {COLUMNS}, {RUNNING} FROM box_rows")
}

/// The stored rows of these Boxes, by box id.
async fn load_all(tx: &mut Transaction<'static, Any>, box_ids: &[&str]) -> anyhow::Result<HashMap<String, BoxRow>> {
    let mut rows = HashMap::with_capacity(box_ids.len());
    for chunk in box_ids.chunks(rows_per_statement(1)) {
        let sql = format!("SELECT {COLUMNS} FROM box_rows WHERE box_id IN ({})", placeholders(chunk.len()));
        let mut query = sqlx::query(&sql);
        for id in chunk {
            query = query.bind(*id);
        }
        for row in query.fetch_all(&mut **tx).await? {
            let row = BoxRow::from_sql(&row)?;
            rows.insert(row.box_id.clone(), row);
        }
    }
    Ok(rows)
}

/// What one event does to the view, decoded.
enum Change {
    /// An activation: the Box's row, unless it has one (a redelivery leaves it).
    Activated(Box<BoxRow>),
    /// A later event of Box `id`.
    Later { id: String, event: BoxEvent },
    /// A provisioning outcome of one of the Box's entries.
    Provisioned { box_id: String, event: AccessEvent },
}

impl Change {
    fn of(event: EventRef<'_>) -> anyhow::Result<Change> {
        if event.aggregate_type == types::ACCESS {
            let outcome: AccessEvent = event.decode()?;
            let (AccessEvent::AccessProvisioned { box_id, .. } | AccessEvent::AccessProvisionFailed { box_id, .. }) = &outcome;
            return Ok(Change::Provisioned { box_id: box_id.clone(), event: outcome });
        }
        let parsed: BoxEvent = event.decode()?;
        Ok(match BoxRow::activated(&parsed, event.position) {
            Some(row) => Change::Activated(Box::new(row)),
            None => Change::Later { id: event.aggregate_id.to_owned(), event: parsed },
        })
    }

    fn box_id(&self) -> &str {
        match self {
            Change::Activated(row) => &row.box_id,
            Change::Later { id, .. } => id,
            Change::Provisioned { box_id, .. } => box_id,
        }
    }
}

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
        &["CREATE TABLE IF NOT EXISTS box_rows (
            box_id TEXT PRIMARY KEY,
            box_type TEXT NOT NULL,
            draft_id TEXT NOT NULL,
            state TEXT NOT NULL,
            position BIGINT NOT NULL,
            created_at_ns BIGINT NOT NULL,
            approved_by TEXT NOT NULL,
            manifest_json TEXT NOT NULL,
            assignments_json TEXT NOT NULL,
            provisioning_json TEXT NOT NULL
        )"]
    }
    fn table_names(&self) -> &'static [&'static str] {
        &["box_rows"]
    }

    async fn apply(&self, tx: &mut Transaction<'static, Any>, event: &StoredEvent) -> anyhow::Result<()> {
        self.apply_batch(tx, std::slice::from_ref(event)).await
    }

    async fn apply_batch(&self, tx: &mut Transaction<'static, Any>, events: &[StoredEvent]) -> anyhow::Result<()> {
        let changes = events.iter().map(|e| Change::of(e.as_event())).collect::<anyhow::Result<Vec<_>>>()?;
        apply_changes(tx, changes).await
    }

    /// A rebuild's page is decoded from the stored text into its changes.
    fn page_decoder(&self) -> PageDecoder {
        |events| Ok(DecodedPage::new(events.iter().map(|e| Change::of(e.as_event())).collect::<anyhow::Result<Vec<_>>>()?))
    }

    async fn apply_page(&self, tx: &mut Transaction<'static, Any>, _: &[TextEvent], decoded: DecodedPage) -> anyhow::Result<()> {
        apply_changes(tx, decoded.take()?).await
    }
}

/// Each Box's row is read once, takes the batch's changes in order in memory, and is
/// written once.
async fn apply_changes(tx: &mut Transaction<'static, Any>, changes: Vec<Change>) -> anyhow::Result<()> {
    let ids: Vec<&str> = changes.iter().map(Change::box_id).collect::<BTreeSet<_>>().into_iter().collect();
    let mut rows = load_all(tx, &ids).await?;
    let mut changed = BTreeSet::new();
    for change in changes {
        match change {
            // A redelivered activation leaves the row as it is.
            Change::Activated(new) => {
                if !rows.contains_key(&new.box_id) {
                    changed.insert(new.box_id.clone());
                    rows.insert(new.box_id.clone(), *new);
                }
            }
            Change::Later { id, event } => {
                if let Some(row) = rows.get_mut(&id) {
                    row.apply(&event);
                    changed.insert(id);
                }
            }
            Change::Provisioned { box_id, event } => {
                if let Some(row) = rows.get_mut(&box_id) {
                    row.provisioned(&event);
                    changed.insert(box_id);
                }
            }
        }
    }
    let changed: Vec<&BoxRow> = changed.iter().filter_map(|id| rows.get(id)).collect();
    save_all(tx, &changed).await
}

/// R-BOX-5: active Boxes (not stopped or archived), one per box_type.
pub async fn list(db: &Db) -> anyhow::Result<Vec<BoxRow>> {
    let rows = sqlx::query(&format!("{} WHERE state = 'idle' ORDER BY position", select())).fetch_all(db.any()).await?;
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    for row in rows {
        let row = BoxRow::from_sql(&row)?;
        if seen.insert(row.box_type.clone()) {
            out.push(row);
        }
    }
    Ok(out)
}

/// Which Boxes a page lists (`GET /boxes?state=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateFilter {
    /// R-BOX-5's default: the Boxes that hold a slot (idle, and running once Workers run on
    /// hosts), not stopped or archived ones.
    Active,
    Only(BoxState),
    /// Active Boxes a Worker of which runs.
    Running,
    All,
}

impl StateFilter {
    pub fn from_wire(filter: v1::BoxStateFilter) -> StateFilter {
        match filter {
            v1::BoxStateFilter::Unspecified => StateFilter::Active,
            v1::BoxStateFilter::Idle => StateFilter::Only(BoxState::Idle),
            v1::BoxStateFilter::Running => StateFilter::Running,
            v1::BoxStateFilter::Stopped => StateFilter::Only(BoxState::Stopped),
            v1::BoxStateFilter::Archived => StateFilter::Only(BoxState::Archived),
            v1::BoxStateFilter::All => StateFilter::All,
        }
    }

    fn clause(self) -> &'static str {
        // Boxes with a running Worker are the idle ones `RUNNING` says run.
        match self {
            StateFilter::Active => "state NOT IN ('stopped', 'archived')",
            StateFilter::Only(BoxState::Idle) => {
                "state = 'idle' AND NOT EXISTS (SELECT 1 FROM worker_life w WHERE w.box_id = box_rows.box_id AND w.state IN ('starting', 'running', 'paused'))"
            }
            StateFilter::Only(BoxState::Stopped) => "state = 'stopped'",
            StateFilter::Only(BoxState::Archived) => "state = 'archived'",
            StateFilter::Running => {
                "state = 'idle' AND EXISTS (SELECT 1 FROM worker_life w WHERE w.box_id = box_rows.box_id AND w.state IN ('starting', 'running', 'paused'))"
            }
            StateFilter::All => "1 = 1",
        }
    }
}

/// Largest page of Boxes, and the size of a page when none is asked for.
pub const PAGE_MAX: u32 = 200;
pub const PAGE_DEFAULT: u32 = 50;

/// R-BOX-5: a page of Boxes in activation order after position `after`, and the cursor of
/// the next page (0 on the last). Not deduplicated by box_type: at most one Box per
/// box_type is not archived (R-BOX-3), and archived Boxes stay listed beside their
/// successors.
pub async fn page(db: &Db, filter: StateFilter, limit: u32, after: u64) -> anyhow::Result<(Vec<BoxRow>, u64)> {
    let limit = if limit == 0 { PAGE_DEFAULT } else { limit.min(PAGE_MAX) };
    let after = i64::try_from(after).unwrap_or(i64::MAX);
    let sql = format!("{} WHERE position > $1 AND {} ORDER BY position LIMIT $2", select(), filter.clause());
    let rows = sqlx::query(&sql).bind(after).bind(i64::from(limit) + 1).fetch_all(db.any()).await?;
    let more = rows.len() > limit as usize;
    let page = rows.iter().take(limit as usize).map(BoxRow::from_sql).collect::<anyhow::Result<Vec<_>>>()?;
    let next = if more { page.last().map_or(0, |r| u64::try_from(r.position).unwrap_or(0)) } else { 0 };
    Ok((page, next))
}

/// The Box of `box_type` that is not archived (at most one, R-BOX-3).
pub async fn current_of_type(db: &Db, box_type: &str) -> anyhow::Result<Option<BoxRow>> {
    let row = sqlx::query(&format!("{} WHERE box_type = $1 AND state <> 'archived' ORDER BY position DESC LIMIT 1", select()))
        .bind(box_type)
        .fetch_optional(db.any())
        .await?;
    row.as_ref().map(BoxRow::from_sql).transpose()
}

/// One Box's row, if it has one.
pub async fn row(db: &Db, box_id: &str) -> anyhow::Result<Option<BoxRow>> {
    let row = sqlx::query(&format!("{} WHERE box_id = $1", select())).bind(box_id).fetch_optional(db.any()).await?;
    row.as_ref().map(BoxRow::from_sql).transpose()
}

/// One Box with manifest, assignments, provisioning and drift.
pub async fn get(db: &Db, manifests_dir: &Path, box_id: &str) -> anyhow::Result<Option<v1::BoxView>> {
    let row = sqlx::query(&format!("{} WHERE box_id = $1", select())).bind(box_id).fetch_optional(db.any()).await?;
    let Some(row) = row.as_ref().map(BoxRow::from_sql).transpose()? else { return Ok(None) };
    let drift = if row.state == BoxState::Archived { false } else { drift(db, manifests_dir, &row.box_type).await? };
    Ok(Some(row.to_wire(drift)))
}

/// The Box as it was `as_of` (R-HIST): its events and its entries' provisioning outcomes
/// replayed up to then; `None` when it was not yet activated. Drift is not known of the
/// past: `false`.
pub async fn at(db: &Db, box_id: &str, as_of: atasira_platform::store::AsOf) -> anyhow::Result<Option<v1::BoxView>> {
    let mut row: Option<BoxRow> = None;
    let mut after = atasira_platform::store::Cursor::default();
    loop {
        let page = db.history(types::BOX, box_id, types::ACCESS, after, 1000).await?;
        let Some(last) = page.last() else { break };
        after = last.cursor();
        for event in page.iter().filter(|e| as_of.holds(e)) {
            match (&mut row, event.aggregate_type.as_str()) {
                (Some(r), types::ACCESS) => r.provisioned(&event.decode()?),
                (Some(r), _) => r.apply(&event.decode()?),
                (None, types::BOX) => row = BoxRow::activated(&event.decode()?, event.position),
                (None, _) => {}
            }
        }
    }
    Ok(row.map(|r| r.to_wire(false)))
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
        let parsed: BoxEvent = event.decode()?;
        let (box_id, manifest): (String, BoxManifest) = match parsed {
            BoxEvent::BoxActivated { box_id, manifest, .. }
            | BoxEvent::BoxManifestEdited { box_id, manifest, .. }
            | BoxEvent::BoxConfigEdited { box_id, manifest, .. }
            | BoxEvent::BoxManifestChanged { box_id, manifest, .. } => (box_id, manifest),
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

#[cfg(test)]
mod tests {
    use super::*;
    use atasira_domain::draft_request::BoxDraftCreateRequest;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 123_456_789).expect("time")
    }

    fn activated() -> BoxEvent {
        let request = BoxDraftCreateRequest { box_type: Some("sales".into()), purpose: Some("p".into()), ..Default::default() };
        let manifest = request.plan().expect("plan").manifest;
        BoxEvent::BoxActivated {
            box_id: "b1".into(),
            box_type: "sales".into(),
            draft_id: "d1".into(),
            manifest_digest: manifest.digest(),
            manifest,
            approved_by: "alice".into(),
            approval_key_id: "k1".into(),
            activated_at: t(0),
        }
    }

    #[test]
    fn given_an_activation_then_an_idle_box_whose_time_is_exact() {
        // R-BOX-5
        let row = BoxRow::activated(&activated(), 4).expect("row");
        assert_eq!((row.state, row.position, row.created_at), (BoxState::Idle, 4, t(0)));
        let wire = row.to_wire(false);
        let summary = wire.summary.expect("summary");
        assert_eq!(summary.state, v1::BoxState::Idle as i32);
        assert_eq!(convert::time_from_wire(summary.created_at.as_ref()), Some(t(0)));
        assert_eq!(wire.manifest.map(|m| m.box_type), Some("sales".to_owned()));
    }

    #[test]
    fn given_a_box_when_edited_then_the_view_shows_the_edited_manifest() {
        // R-EDIT-1, R-EDIT-3: both edits carry the whole manifest; the view takes it
        let mut row = BoxRow::activated(&activated(), 1).expect("row");
        let BoxEvent::BoxActivated { manifest, .. } = activated() else { panic!("an activation") };
        let mut edited = manifest.clone();
        edited.purpose = "Edited.".into();
        edited.version = "1.1.0".into();
        row.apply(&BoxEvent::BoxManifestEdited {
            box_id: "b1".into(),
            manifest: edited.clone(),
            changed_keys: vec!["purpose".into()],
            edited_by: "alice".into(),
            at: t(1),
        });
        assert_eq!(row.summary().manifest_version, "1.1.0");
        let mut configured = edited.clone();
        configured.trigger_schedule = "0 9 * * 1".into();
        row.apply(&BoxEvent::BoxConfigEdited {
            box_id: "b1".into(),
            manifest: configured.clone(),
            changed_keys: vec!["trigger_schedule".into()],
            edited_by: "bob".into(),
            at: t(2),
            policy: None,
        });
        assert_eq!(row.manifest, configured);
        assert_eq!(row.to_wire(false).manifest.map(|m| m.purpose), Some("Edited.".to_owned()));
    }

    #[test]
    fn given_a_box_when_assigned_twice_then_the_later_role_counts_once() {
        // R-BOX-6
        let mut row = BoxRow::activated(&activated(), 1).expect("row");
        for role in [BoxRole::Member, BoxRole::Primary] {
            row.apply(&BoxEvent::BoxUserAssigned { box_id: "b1".into(), user_id: "bob".into(), role_in_box: role, assigned_by: "alice".into(), at: t(1) });
        }
        assert_eq!(row.assignments, vec![AssignmentRow { user_id: "bob".into(), role_in_box: BoxRole::Primary }]);
        row.apply(&BoxEvent::BoxStopped { box_id: "b1".into(), box_type: "sales".into(), by: "alice".into(), at: t(2) });
        assert_eq!(row.state, BoxState::Stopped);
        // R-BOX-6: an unassignment removes the user
        row.apply(&BoxEvent::BoxUserUnassigned {
            box_id: "b1".into(),
            user_id: "bob".into(),
            role_in_box: BoxRole::Primary,
            unassigned_by: "alice".into(),
            at: t(3),
        });
        assert_eq!(row.assignments, vec![]);
    }

    #[test]
    fn given_a_failed_entry_when_a_retry_succeeds_then_the_success_replaces_it_in_index_order() {
        // R-PROV-1
        let mut row = BoxRow::activated(&activated(), 1).expect("row");
        let failed = |index| AccessEvent::AccessProvisionFailed {
            box_id: "b1".into(),
            box_type: "sales".into(),
            index,
            access: "git_remote x".into(),
            reason: "unreachable".into(),
            attempts: 5,
            at: t(3),
        };
        row.provisioned(&failed(1));
        row.provisioned(&failed(0));
        row.provisioned(&AccessEvent::AccessProvisioned {
            box_id: "b1".into(),
            box_type: "sales".into(),
            index: 1,
            access: "git_remote x".into(),
            detail: "cloned".into(),
            attempts: 2,
            at: t(4),
        });
        let wire = row.to_wire(false).provisioning;
        assert_eq!(
            wire.iter().map(|p| (p.index, p.status)).collect::<Vec<_>>(),
            vec![(0, v1::provisioning::Status::Failed as i32), (1, v1::provisioning::Status::Provisioned as i32)]
        );
        assert_eq!((wire[0].reason.as_str(), wire[1].detail.as_str()), ("unreachable", "cloned"));
    }
}
