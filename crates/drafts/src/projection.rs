//! The drafts view: one typed row per draft with what the approver must see (R-APPROVE-1)
//! and its status and decision (R-DRAFT-12). The pending list is its `pending_approval`
//! rows. `DraftRow::apply` is the pure half (given/when/then tests below); the
//! `Projection` impl loads the row, applies the event and stores it, in the runner's
//! transaction.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use atasira_contracts::convert::{draft_status_to_wire, timestamp};
use atasira_contracts::v1;
use atasira_domain::BoxManifest;
use atasira_domain::aggregates::boxes::BoxEvent;
#[cfg(test)]
use atasira_domain::aggregates::boxes::BoxRole;
use atasira_domain::aggregates::draft::{ChangeOf, DraftEvent, DraftStatus, RevisionOf};
use atasira_domain::aggregates::types;
use atasira_domain::os_operation::OverLimit;
use atasira_platform::org_policy::head_subquery;
use atasira_platform::projection::{
    Arg, BlindWrite, DecodedPage, PageDecoder, Projection, bind_all, for_connection, placeholders, rows_per_statement, values_list_from,
};
use atasira_platform::store::{Db, EventRef, Precondition, StoredEvent, TextEvent};
use chrono::{DateTime, Utc};
use sqlx::any::AnyRow;
use sqlx::{Any, Row, Transaction};

pub const NAME: &str = "drafts_view";
/// The aggregate types this projection reads: its drafts, and Boxes for `active`/`box_id`.
pub const READS: &[&str] = &[types::DRAFT, types::BOX];

const TABLES: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS draft_rows (
    draft_id TEXT PRIMARY KEY,
    box_type TEXT NOT NULL,
    requested_by TEXT NOT NULL,
    status TEXT NOT NULL,
    position BIGINT NOT NULL,
    submitted_at_ns BIGINT NOT NULL,
    decided_by TEXT,
    decided_at_ns BIGINT,
    decision_reason TEXT,
    box_id TEXT,
    over_limit_json TEXT NOT NULL,
    warnings_json TEXT NOT NULL,
    manifest_json TEXT NOT NULL,
    change_json TEXT,
    approvals_json TEXT,
    revision_json TEXT
)",
    // Pages in submission order read an index, not the whole view (R-DRAFT-12): any
    // status, one status (the pending list), one requester's.
    "CREATE INDEX IF NOT EXISTS draft_rows_order ON draft_rows (position)",
    "CREATE INDEX IF NOT EXISTS draft_rows_status_order ON draft_rows (status, position)",
    "CREATE INDEX IF NOT EXISTS draft_rows_requester_order ON draft_rows (requested_by, position)",
    // The Box of each box_type that is not archived: a new draft of that box_type is a
    // change request's business (R-CHANGE-1).
    "CREATE TABLE IF NOT EXISTS drafts_box_types (box_type TEXT PRIMARY KEY, box_id TEXT NOT NULL)",
];

const COLUMNS: &str = "draft_id, box_type, requested_by, status, position, submitted_at_ns, decided_by, decided_at_ns, decision_reason, box_id, over_limit_json, warnings_json, manifest_json, change_json, approvals_json, revision_json";
/// How many columns a row has.
const WIDTH: usize = 16;

const PAGE_MAX: u32 = 200;
const PAGE_DEFAULT: u32 = 50;

/// One draft in the view.
#[derive(Debug, Clone, PartialEq)]
pub struct DraftRow {
    pub draft_id: String,
    pub box_type: String,
    pub requested_by: String,
    pub status: DraftStatus,
    /// The store position of its submission: the list order and the cursor.
    pub position: i64,
    pub submitted_at: DateTime<Utc>,
    /// Who closed it (approver, rejecter, withdrawer; none for expiry) and when.
    pub decided_by: Option<String>,
    pub decided_at: Option<DateTime<Utc>>,
    pub decision_reason: Option<String>,
    pub box_id: Option<String>,
    pub over_limit: OverLimit,
    pub warnings: Vec<String>,
    pub manifest: BoxManifest,
    /// A change request's Box and diff (R-CHANGE-1).
    pub change: Option<ChangeOf>,
    /// R-CHANGE-3: the approvals required and given so far.
    pub approvals: Approvals,
    /// R-CHANGE-2: a revision's thread.
    pub revision: Option<RevisionOf>,
}

/// R-CHANGE-3: how many distinct human admins must approve a draft, and who did so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Approvals {
    pub required: u32,
    pub by: Vec<String>,
    /// R-POLICY-1: the organisation's policy's verdict at submission, as recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy: Option<atasira_domain::org_policy::Verdict>,
}

impl DraftRow {
    /// A new row from its submission; other events need a row to apply to.
    pub fn submitted(event: &DraftEvent, position: i64) -> Option<DraftRow> {
        let DraftEvent::DraftSubmitted {
            draft_id,
            box_type,
            manifest,
            over_limit,
            warnings,
            requested_by,
            submitted_at,
            change,
            approvals_required,
            revision,
            policy,
        } = event
        else {
            return None;
        };
        Some(DraftRow {
            draft_id: draft_id.clone(),
            box_type: box_type.clone(),
            requested_by: requested_by.user_id.clone(),
            status: DraftStatus::PendingApproval,
            position,
            submitted_at: *submitted_at,
            decided_by: None,
            decided_at: None,
            decision_reason: None,
            // A change request names its Box from the start.
            box_id: change.as_ref().map(|c| c.box_id.clone()),
            over_limit: over_limit.clone(),
            warnings: warnings.clone(),
            manifest: manifest.clone(),
            change: change.clone(),
            approvals: Approvals { required: (*approvals_required).max(1), by: vec![], policy: policy.clone() },
            revision: revision.clone(),
        })
    }

    /// A later event of the same draft.
    pub fn apply(&mut self, event: &DraftEvent) {
        let (status, by, at, reason) = match event {
            DraftEvent::DraftSubmitted { .. } => return,
            DraftEvent::DraftApprovalGiven { approved_by, .. } => {
                if !self.approvals.by.contains(approved_by) {
                    self.approvals.by.push(approved_by.clone());
                }
                return;
            }
            DraftEvent::DraftWithdrawn { withdrawn_by, at, .. } => (DraftStatus::Withdrawn, Some(withdrawn_by), at, None),
            DraftEvent::DraftExpired { at, .. } => (DraftStatus::Expired, None, at, None),
            // Relays of different services deliver in different orders: a Box that is
            // already active keeps its draft `active`.
            DraftEvent::DraftApproved { approved_by, approved_at, .. } => {
                (if self.status == DraftStatus::Active { DraftStatus::Active } else { DraftStatus::Approved }, Some(approved_by), approved_at, None)
            }
            DraftEvent::DraftRejected { rejected_by, reason, at, .. } => (DraftStatus::Rejected, Some(rejected_by), at, Some(reason)),
        };
        self.status = status;
        self.decided_by = by.cloned();
        self.decided_at = Some(*at);
        self.decision_reason = reason.cloned();
    }

    /// R-APPROVE-4: the draft is `active` once its Box is.
    pub fn activated(&mut self, box_id: &str) {
        self.status = DraftStatus::Active;
        self.box_id = Some(box_id.to_owned());
    }

    /// The wire form; `with_manifest` for the detail, not for lists.
    pub fn to_wire(&self, with_manifest: bool) -> v1::DraftView {
        let m = &self.manifest;
        let decision = self.decided_at.map(|at| v1::DraftDecision {
            outcome: match self.status {
                DraftStatus::Approved | DraftStatus::Active => v1::draft_decision::Outcome::Approved,
                DraftStatus::Rejected => v1::draft_decision::Outcome::Rejected,
                DraftStatus::Withdrawn => v1::draft_decision::Outcome::Withdrawn,
                DraftStatus::Expired => v1::draft_decision::Outcome::Expired,
                DraftStatus::PendingApproval => v1::draft_decision::Outcome::Unspecified,
            } as i32,
            by: self.decided_by.clone().unwrap_or_default(),
            at: Some(timestamp(at)),
            reason: self.decision_reason.clone().unwrap_or_default(),
        });
        v1::DraftView {
            draft_id: self.draft_id.clone(),
            box_type: self.box_type.clone(),
            name: m.name.clone(),
            purpose: m.purpose.clone(),
            os_operations: m.os_operations.iter().map(|o| o.as_str().to_owned()).collect(),
            tools: m.tools.clone(),
            url_allowlist: m.url_allowlist.clone(),
            prohibited: m.prohibited_actions.clone(),
            over_limit: self.over_limit.over_limit,
            over_limit_ops: self.over_limit.over_limit_ops.clone(),
            over_limit_tools: self.over_limit.over_limit_tools.clone(),
            warnings: self.warnings.clone(),
            requested_by: self.requested_by.clone(),
            status: draft_status_to_wire(self.status) as i32,
            created_at: Some(timestamp(self.submitted_at)),
            network: atasira_contracts::manifest::network_to_proto(m.network) as i32,
            file_access: m.file_access.clone(),
            allowed_apps: m.allowed_apps.clone(),
            required_access: m.required_access.iter().map(v1::RequiredAccess::from).collect(),
            decision,
            box_id: self.box_id.clone().unwrap_or_default(),
            manifest: with_manifest.then(|| v1::BoxManifest::from(m)),
            kind: if self.change.is_some() { v1::DraftKind::Change } else { v1::DraftKind::New } as i32,
            added: self.change.as_ref().map(|c| c.diff.added.clone()).unwrap_or_default(),
            removed: self.change.as_ref().map(|c| c.diff.removed.clone()).unwrap_or_default(),
            version: m.version.clone(),
            approvals: self.approvals.by.clone(),
            approvals_required: self.approvals.required.max(1),
            policy: self.approvals.policy.as_ref().map(|p| v1::DraftPolicy { version: p.version, rules: p.rules.clone(), confirm: p.confirm }),
            revision: self.revision.as_ref().map(|r| v1::Revision {
                of: r.draft_id.clone(),
                version: r.version,
                rejected_by: r.rejected_by.clone(),
                reason: r.reason.clone(),
                earlier: r.earlier.clone(),
                added: r.diff.added.clone(),
                removed: r.diff.removed.clone(),
            }),
        }
    }

    fn from_sql(row: &AnyRow) -> anyhow::Result<DraftRow> {
        let time = |ns: i64| -> anyhow::Result<DateTime<Utc>> { Ok(DateTime::from_timestamp_nanos(ns)) };
        Ok(DraftRow {
            draft_id: row.try_get(0)?,
            box_type: row.try_get(1)?,
            requested_by: row.try_get(2)?,
            status: row.try_get::<String, _>(3)?.parse::<DraftStatus>().map_err(|e| anyhow::anyhow!("draft_rows: {e}"))?,
            position: row.try_get(4)?,
            submitted_at: time(row.try_get(5)?)?,
            decided_by: row.try_get(6)?,
            decided_at: row.try_get::<Option<i64>, _>(7)?.map(time).transpose()?,
            decision_reason: row.try_get(8)?,
            box_id: row.try_get(9)?,
            over_limit: serde_json::from_str(&row.try_get::<String, _>(10)?)?,
            warnings: serde_json::from_str(&row.try_get::<String, _>(11)?)?,
            manifest: serde_json::from_str(&row.try_get::<String, _>(12)?)?,
            change: row.try_get::<Option<String>, _>(13)?.map(|c| serde_json::from_str(&c)).transpose()?,
            approvals: row.try_get::<Option<String>, _>(14)?.map(|a| serde_json::from_str(&a)).transpose()?.unwrap_or_default(),
            revision: row.try_get::<Option<String>, _>(15)?.map(|r| serde_json::from_str(&r)).transpose()?,
        })
    }
}

/// Stores `rows` (each draft once), a few to a statement. `Stored::Update`: a new draft's
/// row is inserted; a stored one takes the row's status, decision and Box (its submission
/// never changes). `Stored::Insert`: rows of drafts submitted in this batch, inserted
/// unless the draft has a row already (a redelivered submission leaves it as it is).
async fn save_all(tx: &mut Transaction<'static, Any>, rows: &[&DraftRow], how: Stored, json: &mut HashMap<String, FixedJson>) -> anyhow::Result<()> {
    for chunk in rows.chunks(rows_per_statement(WIDTH)) {
        let (sql, args) = (for_connection(tx, insert_rows(1, chunk.len(), how)), row_args(chunk, json)?);
        bind_all(sqlx::query(&sql), &args).execute(&mut **tx).await?;
    }
    Ok(())
}

/// The statement that stores `rows` rows ([`save_all`]), its parameters from `$first`.
fn insert_rows(first: usize, rows: usize, how: Stored) -> String {
    let on_conflict = match how {
        Stored::Insert => "DO NOTHING",
        Stored::Update => {
            "(draft_id) DO UPDATE SET status = excluded.status, decided_by = excluded.decided_by,
               decided_at_ns = excluded.decided_at_ns, decision_reason = excluded.decision_reason, box_id = excluded.box_id,
               approvals_json = excluded.approvals_json"
        }
    };
    format!("INSERT INTO draft_rows ({COLUMNS}) VALUES {} ON CONFLICT {on_conflict}", values_list_from(first, rows, WIDTH))
}

/// The column values of each of `rows`, in order; what a submission fixed is taken from
/// `json` when it holds the draft's.
fn row_args(rows: &[&DraftRow], json: &mut HashMap<String, FixedJson>) -> anyhow::Result<Vec<Arg>> {
    let mut args = Vec::with_capacity(rows.len() * WIDTH);
    for row in rows {
        let fixed = match json.remove(&row.draft_id) {
            Some(fixed) => fixed,
            None => FixedJson::of(row)?,
        };
        args.extend([
            Arg::Text(row.draft_id.clone()),
            Arg::Text(row.box_type.clone()),
            Arg::Text(row.requested_by.clone()),
            Arg::Text(row.status.as_str().to_owned()),
            Arg::Int(row.position),
            Arg::Int(nanos(row.submitted_at)),
            Arg::MaybeText(row.decided_by.clone()),
            Arg::MaybeInt(row.decided_at.map(nanos)),
            Arg::MaybeText(row.decision_reason.clone()),
            Arg::MaybeText(row.box_id.clone()),
            Arg::Text(fixed.over_limit),
            Arg::Text(fixed.warnings),
            Arg::Text(fixed.manifest),
            Arg::MaybeText(fixed.change),
            Arg::Text(serde_json::to_string(&row.approvals)?),
            Arg::MaybeText(row.revision.as_ref().map(serde_json::to_string).transpose()?),
        ]);
    }
    Ok(args)
}

/// The JSON text of what a submission fixes for good (over-limit, warnings, manifest,
/// change). A rebuild's decoder writes it for the page it decodes ([`DraftsView::page_decoder`]),
/// beside the database's work on the page before, so the writer only binds it.
#[derive(Debug)]
struct FixedJson {
    over_limit: String,
    warnings: String,
    manifest: String,
    change: Option<String>,
}

impl FixedJson {
    fn of(row: &DraftRow) -> anyhow::Result<FixedJson> {
        Ok(FixedJson {
            over_limit: serde_json::to_string(&row.over_limit)?,
            warnings: serde_json::to_string(&row.warnings)?,
            manifest: serde_json::to_string(&row.manifest)?,
            change: row.change.as_ref().map(serde_json::to_string).transpose()?,
        })
    }
}

/// How [`save_all`] stores rows.
#[derive(Clone, Copy)]
enum Stored {
    /// Rows of drafts submitted in the batch: inserted, an existing row left as it is.
    Insert,
    /// Stored rows the batch changed: updated (or inserted).
    Update,
}

/// Times are stored as nanoseconds since the epoch (exact, and ordered as numbers).
fn nanos(t: DateTime<Utc>) -> i64 {
    t.timestamp_nanos_opt().unwrap_or(i64::MAX)
}

/// The stored rows of these drafts, by draft id.
async fn load_all(tx: &mut Transaction<'static, Any>, draft_ids: &[&str]) -> anyhow::Result<HashMap<String, DraftRow>> {
    let mut rows = HashMap::with_capacity(draft_ids.len());
    for chunk in draft_ids.chunks(rows_per_statement(1)) {
        let sql = format!("SELECT {COLUMNS} FROM draft_rows WHERE draft_id IN ({})", placeholders(chunk.len()));
        let mut query = sqlx::query(&sql);
        for id in chunk {
            query = query.bind(*id);
        }
        for row in query.fetch_all(&mut **tx).await? {
            let row = DraftRow::from_sql(&row)?;
            rows.insert(row.draft_id.clone(), row);
        }
    }
    Ok(rows)
}

/// The Box events the view takes nothing from ([`Change::of`]): a rebuild does not read
/// them.
const IGNORED_BOX_EVENTS: &[&str] = &["BoxUserAssigned", "BoxUserUnassigned", "BoxManifestEdited", "BoxConfigEdited", "BoxStopped", "BoxResumed"];

/// What one event does to the view, decoded.
enum Change {
    /// A submission: the draft's row, unless it has one (a redelivery leaves it), and the
    /// JSON of what it fixes when a decoder wrote it already.
    Submitted(DraftRow, Option<FixedJson>),
    /// A later event of draft `id`.
    Later { id: String, event: DraftEvent },
    /// The draft's Box became active.
    Activated { draft_id: String, box_id: String },
    /// A box_type now has a Box (`Some`), or its Box was archived (`None`).
    BoxType { box_type: String, box_id: Option<String> },
}

impl Change {
    fn of(event: EventRef<'_>) -> anyhow::Result<Vec<Change>> {
        if event.aggregate_type == types::BOX {
            return Ok(match event.decode::<BoxEvent>()? {
                BoxEvent::BoxActivated { box_id, draft_id, box_type, .. } => {
                    return Ok(vec![Change::BoxType { box_type, box_id: Some(box_id.clone()) }, Change::Activated { draft_id, box_id }]);
                }
                BoxEvent::BoxManifestChanged { box_id, draft_id, .. } => Some(Change::Activated { draft_id, box_id }),
                BoxEvent::BoxArchived { box_type, .. } => Some(Change::BoxType { box_type, box_id: None }),
                // IGNORED_BOX_EVENTS
                BoxEvent::BoxUserAssigned { .. }
                | BoxEvent::BoxUserUnassigned { .. }
                | BoxEvent::BoxManifestEdited { .. }
                | BoxEvent::BoxConfigEdited { .. }
                | BoxEvent::BoxStopped { .. }
                | BoxEvent::BoxResumed { .. } => None,
            }
            .into_iter()
            .collect());
        }
        let parsed: DraftEvent = event.decode()?;
        Ok(vec![match DraftRow::submitted(&parsed, event.position) {
            Some(row) => Change::Submitted(row, None),
            None => Change::Later { id: event.aggregate_id.to_owned(), event: parsed },
        }])
    }

    /// The draft it changes, if any.
    fn draft_id(&self) -> Option<&str> {
        match self {
            Change::Submitted(row, _) => Some(&row.draft_id),
            Change::Later { id, .. } => Some(id),
            Change::Activated { draft_id, .. } => Some(draft_id),
            Change::BoxType { .. } => None,
        }
    }
}

/// The projection of draft events into `draft_rows`.
#[derive(Debug)]
pub struct DraftsView;

#[async_trait::async_trait]
impl Projection for DraftsView {
    fn name(&self) -> &'static str {
        NAME
    }
    fn aggregate_types(&self) -> &'static [&'static str] {
        READS
    }
    fn ignored_event_types(&self) -> &'static [&'static str] {
        IGNORED_BOX_EVENTS
    }
    fn tables(&self) -> &'static [&'static str] {
        TABLES
    }
    fn table_names(&self) -> &'static [&'static str] {
        &["draft_rows", "drafts_box_types"]
    }
    fn added_columns(&self) -> &'static [(&'static str, &'static str, &'static str)] {
        &[("draft_rows", "change_json", "TEXT"), ("draft_rows", "approvals_json", "TEXT"), ("draft_rows", "revision_json", "TEXT")]
    }

    /// A batch of submissions (nothing else the view takes) needs no row read: its rows,
    /// inserted unless there (as many as one statement holds).
    fn blind_write(&self, events: &[StoredEvent], first: usize) -> anyhow::Result<Option<BlindWrite>> {
        let mut rows = Vec::with_capacity(events.len());
        for change in changes(events.iter().map(StoredEvent::as_event))? {
            match change {
                Change::Submitted(row, _) => rows.push(row),
                Change::Later { .. } | Change::Activated { .. } | Change::BoxType { .. } => return Ok(None),
            }
        }
        if rows.is_empty() || rows.len() > rows_per_statement(WIDTH) {
            return Ok(None);
        }
        let args = row_args(&rows.iter().collect::<Vec<_>>(), &mut HashMap::new())?;
        Ok(Some(BlindWrite { statement: insert_rows(first, rows.len(), Stored::Insert), args }))
    }

    async fn apply(&self, tx: &mut Transaction<'static, Any>, event: &StoredEvent) -> anyhow::Result<()> {
        self.apply_batch(tx, std::slice::from_ref(event)).await
    }

    async fn apply_batch(&self, tx: &mut Transaction<'static, Any>, events: &[StoredEvent]) -> anyhow::Result<()> {
        apply_changes(tx, changes(events.iter().map(StoredEvent::as_event))?).await
    }

    /// A rebuild's page is decoded from the stored text into its changes, with the JSON of
    /// what its submissions fix.
    fn page_decoder(&self) -> PageDecoder {
        |events| {
            let mut changes = changes(events.iter().map(TextEvent::as_event))?;
            for change in &mut changes {
                if let Change::Submitted(row, json @ None) = change {
                    *json = Some(FixedJson::of(row)?);
                }
            }
            Ok(DecodedPage::new(changes))
        }
    }

    async fn apply_page(&self, tx: &mut Transaction<'static, Any>, _: &[TextEvent], decoded: DecodedPage) -> anyhow::Result<()> {
        apply_changes(tx, decoded.take()?).await
    }
}

/// What `events` do to the view, in order.
fn changes<'a>(events: impl Iterator<Item = EventRef<'a>>) -> anyhow::Result<Vec<Change>> {
    let mut changes = Vec::with_capacity(events.size_hint().0);
    for event in events {
        changes.extend(Change::of(event)?);
    }
    Ok(changes)
}

/// Each draft's row is read once, takes the batch's changes in order in memory, and is
/// written once. A draft submitted in the batch has no stored row to read (its row is
/// inserted, and left as it is should the draft have one), so a batch of submissions is
/// one statement.
async fn apply_changes(tx: &mut Transaction<'static, Any>, changes: Vec<Change>) -> anyhow::Result<()> {
    let submitted: BTreeSet<&str> = changes.iter().filter(|c| matches!(c, Change::Submitted(..))).filter_map(Change::draft_id).collect();
    let stored: Vec<&str> = changes.iter().filter_map(Change::draft_id).filter(|id| !submitted.contains(id)).collect::<BTreeSet<_>>().into_iter().collect();
    let mut rows = load_all(tx, &stored).await?;
    let (mut new, mut changed) = (BTreeSet::new(), BTreeSet::new());
    let mut json = HashMap::new();
    // Each box_type's Box as the batch leaves it.
    let mut box_types = BTreeMap::new();
    for change in changes {
        match change {
            Change::Submitted(row, fixed) => {
                if !rows.contains_key(&row.draft_id) {
                    new.insert(row.draft_id.clone());
                    if let Some(fixed) = fixed {
                        json.insert(row.draft_id.clone(), fixed);
                    }
                    rows.insert(row.draft_id.clone(), row);
                }
            }
            Change::Later { id, event } => {
                if let Some(row) = rows.get_mut(&id) {
                    row.apply(&event);
                    changed.insert(id);
                }
            }
            Change::Activated { draft_id, box_id } => {
                if let Some(row) = rows.get_mut(&draft_id) {
                    row.activated(&box_id);
                    changed.insert(draft_id);
                }
            }
            Change::BoxType { box_type, box_id } => {
                box_types.insert(box_type, box_id);
            }
        }
    }
    save_box_types(tx, box_types).await?;
    // A draft submitted in this batch is inserted as it ends up; only stored rows are updated.
    changed.retain(|id| !new.contains(id));
    let pick = |ids: &BTreeSet<String>| ids.iter().filter_map(|id| rows.get(id)).collect::<Vec<&DraftRow>>();
    save_all(tx, &pick(&new), Stored::Insert, &mut json).await?;
    save_all(tx, &pick(&changed), Stored::Update, &mut json).await
}

/// Stores each box_type's Box as a batch leaves it (`None`: its Box was archived), a few
/// box_types to a statement.
async fn save_box_types(tx: &mut Transaction<'static, Any>, box_types: BTreeMap<String, Option<String>>) -> anyhow::Result<()> {
    let (active, archived): (Vec<_>, Vec<_>) = box_types.into_iter().partition(|(_, box_id)| box_id.is_some());
    for chunk in active.chunks(rows_per_statement(2)) {
        let sql = format!(
            "INSERT INTO drafts_box_types (box_type, box_id) VALUES {} ON CONFLICT (box_type) DO UPDATE SET box_id = excluded.box_id",
            values_list_from(1, chunk.len(), 2)
        );
        let sql = for_connection(tx, sql);
        let args: Vec<Arg> = chunk.iter().flat_map(|(box_type, box_id)| [Arg::Text(box_type.clone()), Arg::MaybeText(box_id.clone())]).collect();
        bind_all(sqlx::query(&sql), &args).execute(&mut **tx).await?;
    }
    for chunk in archived.chunks(rows_per_statement(1)) {
        let sql = format!("DELETE FROM drafts_box_types WHERE box_type IN ({})", placeholders(chunk.len()));
        let args: Vec<Arg> = chunk.iter().map(|(box_type, _)| Arg::Text(box_type.clone())).collect();
        bind_all(sqlx::query(&sql), &args).execute(&mut **tx).await?;
    }
    Ok(())
}

/// Rows in submission order after position `after`, filtered by status and/or requester,
/// and the cursor of the next page (0 when this is the last).
pub async fn list(db: &Db, status: Option<DraftStatus>, requested_by: Option<&str>, limit: u32, after: u64) -> anyhow::Result<(Vec<DraftRow>, u64)> {
    list_in(db, status.as_slice(), requested_by, limit, after).await
}

/// The row statuses a status filter of `GET /box-drafts?status=` matches (empty: any).
/// `approved` also matches drafts whose Box is active: they were approved.
pub fn statuses_of(status: v1::DraftStatus) -> &'static [DraftStatus] {
    match status {
        v1::DraftStatus::Unspecified => &[],
        v1::DraftStatus::PendingApproval => &[DraftStatus::PendingApproval],
        v1::DraftStatus::Approved => &[DraftStatus::Approved, DraftStatus::Active],
        v1::DraftStatus::Active => &[DraftStatus::Active],
        v1::DraftStatus::Rejected => &[DraftStatus::Rejected],
        v1::DraftStatus::Withdrawn => &[DraftStatus::Withdrawn],
        v1::DraftStatus::Expired => &[DraftStatus::Expired],
    }
}

/// Like [`list`], with any of `statuses` (empty: any status).
pub async fn list_in(db: &Db, statuses: &[DraftStatus], requested_by: Option<&str>, limit: u32, after: u64) -> anyhow::Result<(Vec<DraftRow>, u64)> {
    let limit = if limit == 0 { PAGE_DEFAULT } else { limit.min(PAGE_MAX) };
    let after = i64::try_from(after).unwrap_or(i64::MAX);
    let sql = list_statement(statuses, requested_by.is_some());
    let mut query = sqlx::query(&sql).bind(after).bind(i64::from(limit) + 1);
    if let Some(requester) = requested_by {
        query = query.bind(requester);
    }
    let rows = query.fetch_all(db.any()).await?;
    let more = rows.len() > limit as usize;
    let page = rows.iter().take(limit as usize).map(DraftRow::from_sql).collect::<anyhow::Result<Vec<_>>>()?;
    let next = if more { page.last().map_or(0, |r| u64::try_from(r.position).unwrap_or(0)) } else { 0 };
    Ok((page, next))
}

/// The statement of a page: rows after position `$1` in submission order, at most `$2`,
/// with any of `statuses` (empty: any) and, `by_requester`, of requester `$3`. A filter
/// that is not asked for is not in the statement, so the planner picks the index that fits
/// the page (each filter has one, see `TABLES`).
pub fn list_statement(statuses: &[DraftStatus], by_requester: bool) -> String {
    // Statuses are our own words, quoted as literals.
    let status_clause = if statuses.is_empty() {
        String::new()
    } else {
        format!(" AND status IN ({})", statuses.iter().map(|s| format!("'{}'", s.as_str())).collect::<Vec<_>>().join(", "))
    };
    let requester_clause = if by_requester { " AND requested_by = $3" } else { "" };
    format!("SELECT {COLUMNS} FROM draft_rows WHERE position > $1{status_clause}{requester_clause} ORDER BY position LIMIT $2")
}

/// One draft.
pub async fn get(db: &Db, draft_id: &str) -> anyhow::Result<Option<DraftRow>> {
    let row = sqlx::query(&format!("SELECT {COLUMNS} FROM draft_rows WHERE draft_id = $1")).bind(draft_id).fetch_optional(db.any()).await?;
    row.as_ref().map(DraftRow::from_sql).transpose()
}

/// The draft as it was `as_of` (R-HIST), replayed from its stream; `None` before it was
/// submitted.
pub async fn at(db: &Db, draft_id: &str, as_of: atasira_platform::store::AsOf) -> anyhow::Result<Option<DraftRow>> {
    let mut row: Option<DraftRow> = None;
    for event in db.stream_as_of(atasira_domain::aggregates::types::DRAFT, draft_id, as_of).await? {
        let decoded: DraftEvent = event.decode()?;
        match &mut row {
            Some(r) => r.apply(&decoded),
            None => row = DraftRow::submitted(&decoded, event.position),
        }
    }
    Ok(row)
}

/// R-CHANGE-1: the Box of `box_type` that is not archived, if the view knows one; with the
/// last sequence of the organisation's policy stream (`None`: no policy was published; see
/// `atasira_platform::org_policy::head_of`) in the same statement: what a submission reads
/// before it is decided, when it reads first.
pub async fn box_of_type_and_policy_head(db: &Db, box_type: &str) -> anyhow::Result<(Option<String>, Option<i64>)> {
    let sql = format!("SELECT (SELECT box_id FROM drafts_box_types WHERE box_type = $1), {}", head_subquery());
    // Every submission that reads first makes this read: on a kept connection.
    let mut conn = db.held().await?;
    let row = sqlx::query(&sql).bind(box_type).fetch_one(&mut *conn).await?;
    conn.keep();
    Ok((row.try_get::<Option<String>, _>(0)?, row.try_get::<Option<i64>, _>(1)?))
}

/// What a submission decided without reading first assumed, as the condition of its append
/// (R-CHANGE-1, R-POLICY-1): the view knows no Box of `box_type`, and the organisation's
/// policy stream's last sequence is `policy` (`None`: no policy was published).
pub fn as_assumed(box_type: &str, policy: Option<i64>) -> Precondition {
    Precondition {
        condition: format!("NOT EXISTS (SELECT 1 FROM drafts_box_types WHERE box_type = {{0}}) AND COALESCE({}, 0) = CAST({{1}} AS bigint)", head_subquery()),
        params: vec![box_type.to_owned(), policy.unwrap_or(0).to_string()],
    }
}

/// R-CHANGE-1: how many change requests the view holds for `box_id`, and its pending one.
pub async fn changes_of(db: &Db, box_id: &str) -> anyhow::Result<(u64, Option<DraftRow>)> {
    let rows = sqlx::query(&format!("SELECT {COLUMNS} FROM draft_rows WHERE box_id = $1 AND change_json IS NOT NULL")).bind(box_id).fetch_all(db.any()).await?;
    let rows = rows.iter().map(DraftRow::from_sql).collect::<anyhow::Result<Vec<_>>>()?;
    let pending = rows.iter().find(|r| r.status == DraftStatus::PendingApproval).cloned();
    Ok((rows.len() as u64, pending))
}

/// Ids of pending drafts submitted before `cutoff` (R-DRAFT-13).
pub async fn pending_older_than(db: &Db, cutoff: DateTime<Utc>) -> anyhow::Result<Vec<String>> {
    let rows = sqlx::query("SELECT draft_id FROM draft_rows WHERE status = 'pending_approval' AND submitted_at_ns < $1 ORDER BY position")
        .bind(nanos(cutoff))
        .fetch_all(db.any())
        .await?;
    rows.iter().map(|r| Ok(r.try_get(0)?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use atasira_domain::draft_request::BoxDraftCreateRequest;
    use atasira_domain::{Kind, Principal, Role};

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 0).expect("time")
    }

    fn submitted() -> DraftEvent {
        let request = BoxDraftCreateRequest {
            box_type: Some("ops-bot".into()),
            purpose: Some("p".into()),
            os_operations: Some(vec!["shell:exec".into()]),
            ..Default::default()
        };
        let plan = request.plan().expect("plan");
        DraftEvent::DraftSubmitted {
            draft_id: "d1".into(),
            box_type: "ops-bot".into(),
            manifest: plan.manifest,
            over_limit: plan.over_limit,
            warnings: plan.warnings,
            requested_by: Principal::new("agent", Role::Member, Kind::Agent),
            submitted_at: t(0),
            change: None,
            approvals_required: 1,
            revision: None,
            policy: None,
        }
    }

    #[test]
    fn given_a_submission_then_a_pending_row_with_what_the_approver_must_see() {
        // R-APPROVE-1
        let row = DraftRow::submitted(&submitted(), 7).expect("row");
        assert_eq!((row.status, row.position, row.requested_by.as_str()), (DraftStatus::PendingApproval, 7, "agent"));
        let wire = row.to_wire(false);
        assert!(wire.over_limit);
        assert_eq!(wire.over_limit_ops, vec!["shell:exec".to_owned()]);
        assert!(wire.manifest.is_none() && wire.decision.is_none());
        assert!(row.to_wire(true).manifest.is_some());
    }

    #[test]
    fn given_an_active_box_when_its_approval_arrives_late_then_the_draft_stays_active() {
        // Relays of different services deliver in different orders.
        let mut row = DraftRow::submitted(&submitted(), 1).expect("row");
        row.activated("b1");
        let approved = DraftEvent::DraftApproved {
            draft_id: "d1".into(),
            box_type: "ops-bot".into(),
            approved_by: "alice".into(),
            approved_at: t(5),
            confirm_over_limit: true,
            token: placeholder_token(),
        };
        row.apply(&approved);
        assert_eq!(row.status, DraftStatus::Active);
        assert_eq!((row.decided_by.as_deref(), row.box_id.as_deref()), (Some("alice"), Some("b1")));
        assert_eq!(row.to_wire(false).decision.map(|d| d.outcome), Some(v1::draft_decision::Outcome::Approved as i32));
    }

    #[test]
    fn given_pending_when_rejected_then_the_decision_carries_the_reason() {
        // R-APPROVE-5
        let mut row = DraftRow::submitted(&submitted(), 1).expect("row");
        row.apply(&DraftEvent::DraftRejected {
            draft_id: "d1".into(),
            box_type: "ops-bot".into(),
            rejected_by: "alice".into(),
            reason: "too wide".into(),
            at: t(3),
        });
        assert_eq!(row.status, DraftStatus::Rejected);
        let d = row.to_wire(false).decision.expect("decision");
        assert_eq!((d.by.as_str(), d.reason.as_str()), ("alice", "too wide"));
    }

    fn stored(event: &DraftEvent, sequence: i64) -> StoredEvent {
        use cqrs_es::DomainEvent as _;
        StoredEvent {
            event_id: StoredEvent::event_id_of(types::DRAFT, "d1", sequence),
            aggregate_type: types::DRAFT.into(),
            aggregate_id: "d1".into(),
            sequence,
            position: sequence,
            tx_id: 0,
            event_type: event.event_type(),
            event_version: event.event_version(),
            payload: serde_json::to_value(event).expect("json").into(),
            metadata: serde_json::json!({}).into(),
            recorded_at_ms: 0,
        }
    }

    #[test]
    fn given_a_batch_of_submissions_then_its_rows_are_written_without_reading_the_view() {
        // given a batch holding only a submission; then its row is written blind
        let write = DraftsView.blind_write(&[stored(&submitted(), 1)], 4).expect("decodes").expect("a submission needs no read");
        assert_eq!(write.args.len(), WIDTH, "one row of every column");
        assert_eq!(write.args[0], Arg::Text("d1".into()));
        assert!(write.statement.contains("VALUES ($4, ") && write.statement.contains("$19)"), "{}", write.statement);
        // given a decision in the batch; then the stored row is read first (apply_batch)
        let rejected =
            DraftEvent::DraftRejected { draft_id: "d1".into(), box_type: "ops-bot".into(), rejected_by: "alice".into(), reason: "no".into(), at: t(3) };
        assert!(DraftsView.blind_write(&[stored(&submitted(), 1), stored(&rejected, 2)], 1).expect("decodes").is_none());
    }

    #[test]
    fn given_a_box_event_the_rebuild_skips_then_the_view_takes_nothing_from_it() {
        // R-ARCH-5: a rebuild that does not read these events builds the same view.
        let DraftEvent::DraftSubmitted { manifest, .. } = submitted() else { unreachable!() };
        let (id, by) = (String::from("b1"), String::from("alice"));
        let ignored = [
            BoxEvent::BoxUserAssigned { box_id: id.clone(), user_id: by.clone(), role_in_box: BoxRole::Member, assigned_by: by.clone(), at: t(1) },
            BoxEvent::BoxUserUnassigned { box_id: id.clone(), user_id: by.clone(), role_in_box: BoxRole::Member, unassigned_by: by.clone(), at: t(1) },
            BoxEvent::BoxManifestEdited { box_id: id.clone(), manifest: manifest.clone(), changed_keys: vec![], edited_by: by.clone(), at: t(1) },
            BoxEvent::BoxConfigEdited { box_id: id.clone(), manifest, changed_keys: vec![], edited_by: by.clone(), at: t(1), policy: None },
            BoxEvent::BoxStopped { box_id: id.clone(), box_type: "ops-bot".into(), by: by.clone(), at: t(1) },
            BoxEvent::BoxResumed { box_id: id.clone(), box_type: "ops-bot".into(), by, at: t(1) },
        ];
        assert_eq!(ignored.iter().map(BoxEvent::name).collect::<Vec<_>>(), IGNORED_BOX_EVENTS);
        for event in ignored {
            let stored = TextEvent {
                aggregate_type: types::BOX.into(),
                aggregate_id: "b1".into(),
                sequence: 2,
                position: 2,
                tx_id: 0,
                event_type: event.name().into(),
                event_version: "1".into(),
                payload: serde_json::to_string(&event).expect("json"),
                metadata: "{}".into(),
                recorded_at_ms: 0,
            };
            assert!(Change::of(stored.as_event()).expect("decodes").is_empty(), "{}", event.name());
        }
        for used in ["BoxActivated", "BoxManifestChanged", "BoxArchived"] {
            assert!(!IGNORED_BOX_EVENTS.contains(&used), "{used}");
        }
    }

    fn placeholder_token() -> atasira_domain::token::ApprovalToken {
        let signer = atasira_domain::token::ApprovalSigner::from_secret("k1".into(), [7; 32]);
        signer.issue("d1", "ops-bot", "sha256:00", "alice", t(5))
    }
}
