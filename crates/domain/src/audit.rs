//! The audit ledger's pure rules (R-AUDIT-1, R-AUDIT-2, R-AUDIT-4): canonical rows, the HMAC chain, verification.
//!
//! Why a chain: each row's HMAC-SHA256 covers the row's canonical bytes AND the previous
//! row's MAC, so a row cannot be modified, removed, inserted or moved without breaking the
//! MAC of that row or of the row after it. Only a removed tail leaves an intact chain; it is
//! caught against the signed checkpoints (seq + head MAC) that the audit service records as
//! `AuditCheckpoint` events in the append-only event store.
//!
//! Checkpoints form a chain of their own: each one's MAC also covers the previous
//! checkpoint's seq and MAC. Verification checks every checkpoint, not just the latest, so a
//! tail removed after checkpoint K and then regrown (new rows re-using the removed seqs, new
//! honest checkpoints over them) still breaks at the first checkpoint whose head row is gone.
//!
//! Keys have ids and retired keys keep verifying, so rotation never breaks old rows
//! (R-AUDIT-4). MACs are compared in constant time (`Mac::verify_slice`,
//! `subtle::ConstantTimeEq`).
//!
//! This module does no IO and reads no clock: rows, keys and times come from the caller.

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, SecondsFormat, SubsecRound, Timelike, Utc};
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::token::push_item;

mod detail;
pub mod export;

pub use detail::detail_of;

type HmacSha256 = Hmac<Sha256>;

/// Domain separation for row MACs: a MAC made by the same key for another purpose (a
/// checkpoint, another row format) can never pass as a row MAC.
/// v2: the MAC also covers the row's `detail` (R-AUDIT-6).
pub const ROW_PURPOSE_TAG: &str = "atasira.audit-row.v2";

/// The row format before rows had a `detail`: such rows (their detail empty) keep
/// verifying under it. A v2 row whose detail was blanked does not pass as one: the tags
/// differ.
pub const ROW_PURPOSE_TAG_V1: &str = "atasira.audit-row.v1";

/// Domain separation for checkpoint MACs.
/// v2: the MAC also covers the previous checkpoint's seq and MAC (a chain of checkpoints).
pub const CHECKPOINT_PURPOSE_TAG: &str = "atasira.audit-checkpoint.v2";

/// Minimum secret length: HMAC-SHA256 keys shorter than the hash output weaken it.
pub const MIN_SECRET_LEN: usize = 32;

/// Length of an HMAC-SHA256 tag in bytes.
const MAC_LEN: usize = 32;

/// One audit HMAC key with its id. Holds the keyed HMAC state, never prints it.
#[derive(Clone)]
pub struct AuditKey {
    key_id: String,
    mac: HmacSha256,
}

impl AuditKey {
    /// Builds a key from secret bytes given by the caller (config, key file). Refuses
    /// secrets shorter than [`MIN_SECRET_LEN`] and empty key ids (a row must name its key).
    pub fn new(key_id: impl Into<String>, secret: &[u8]) -> Result<Self, AuditKeyError> {
        let key_id = key_id.into();
        if key_id.is_empty() {
            return Err(AuditKeyError::EmptyKeyId);
        }
        if secret.len() < MIN_SECRET_LEN {
            return Err(AuditKeyError::SecretTooShort { key_id, len: secret.len(), min: MIN_SECRET_LEN });
        }
        let mac = <HmacSha256 as Mac>::new_from_slice(secret).map_err(|_| AuditKeyError::InvalidSecret { key_id: key_id.clone() })?;
        Ok(Self { key_id, mac })
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    fn keyed(&self, bytes: &[u8]) -> HmacSha256 {
        let mut mac = self.mac.clone();
        mac.update(bytes);
        mac
    }

    fn tag_hex(&self, bytes: &[u8]) -> String {
        hex::encode(self.keyed(bytes).finalize().into_bytes())
    }

    /// Constant-time check of a hex MAC over `bytes` (R-AUDIT-4).
    fn verifies(&self, bytes: &[u8], mac_hex: &str) -> Result<(), MacProblem> {
        let tag = decode_mac(mac_hex)?;
        self.keyed(bytes).verify_slice(&tag).map_err(|_| MacProblem::Mismatch)
    }
}

/// Never prints the secret: keys end up in logged configuration structs.
impl fmt::Debug for AuditKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuditKey").field("key_id", &self.key_id).finish_non_exhaustive()
    }
}

/// Why an audit key could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuditKeyError {
    #[error("audit key id must not be empty")]
    EmptyKeyId,
    #[error("audit key {key_id:?}: secret has {len} bytes, at least {min} required")]
    SecretTooShort { key_id: String, len: usize, min: usize },
    #[error("audit key {key_id:?}: secret rejected by HMAC")]
    InvalidSecret { key_id: String },
}

/// The audit service's key set (R-AUDIT-4): new rows and checkpoints are MACed with the
/// current key; rows made under a retired key keep verifying as long as it is kept here.
#[derive(Debug, Clone)]
pub struct AuditKeys {
    current: AuditKey,
    retired: BTreeMap<String, AuditKey>,
}

impl AuditKeys {
    /// `current` signs; `retired` only verify. A retired key with the current key's id is
    /// ignored (the current key wins).
    pub fn new(current: AuditKey, retired: Vec<AuditKey>) -> Self {
        let retired = retired.into_iter().filter(|k| k.key_id != current.key_id).map(|k| (k.key_id.clone(), k)).collect();
        Self { current, retired }
    }

    pub fn current_key_id(&self) -> &str {
        &self.current.key_id
    }

    /// The ids of every key that verifies (current first).
    pub fn key_ids(&self) -> Vec<&str> {
        std::iter::once(self.current.key_id.as_str()).chain(self.retired.keys().map(String::as_str)).collect()
    }

    /// A secret derived from audit key `key_id` for `purpose` (hex), or `None` when this
    /// process does not hold that key. A webhook's signing secret is derived so: never
    /// stored, the same on every replica, and gone when its key is.
    pub fn derive(&self, key_id: &str, purpose: &str) -> Option<String> {
        self.get(key_id).map(|k| k.tag_hex(format!("atasira/derive/{purpose}").as_bytes()))
    }

    fn get(&self, key_id: &str) -> Option<&AuditKey> {
        if self.current.key_id == key_id { Some(&self.current) } else { self.retired.get(key_id) }
    }
}

/// A row before it is MACed: everything the ledger records about one auditable event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsignedRow {
    pub seq: i64,
    pub time: DateTime<Utc>,
    pub action: String,
    pub actor: String,
    pub target: String,
    pub event_id: String,
    /// `sha256:<hex>` of the event payload ([`payload_digest`]).
    pub payload_digest: String,
    /// What happened, in a line ([`detail_of`]).
    pub detail: String,
}

impl UnsignedRow {
    /// MACs the row with the current key, chained to `prev_mac` (empty for seq 1). The
    /// time is truncated to milliseconds first: that is all the canonical form carries.
    pub fn seal(mut self, keys: &AuditKeys, prev_mac: &str) -> LedgerRow {
        self.time = self.time.trunc_subsecs(3);
        let mac = row_mac(keys, &self, prev_mac);
        LedgerRow {
            seq: self.seq,
            time: self.time,
            action: self.action,
            actor: self.actor,
            target: self.target,
            event_id: self.event_id,
            payload_digest: self.payload_digest,
            detail: self.detail,
            key_id: keys.current_key_id().to_owned(),
            mac,
        }
    }
}

/// One ledger row (R-AUDIT-1). Serializes with `time` in the canonical form
/// ([`canonical_time`]), which is also how it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerRow {
    pub seq: i64,
    #[serde(with = "canonical_time_serde")]
    pub time: DateTime<Utc>,
    pub action: String,
    pub actor: String,
    pub target: String,
    pub event_id: String,
    /// `sha256:<hex>` of the event payload JSON bytes.
    pub payload_digest: String,
    /// What happened, in a line (R-AUDIT-6); empty in rows made before rows had one.
    #[serde(default)]
    pub detail: String,
    /// The id of the key that made `mac`.
    pub key_id: String,
    /// Lowercase hex of the HMAC-SHA256 over the canonical row and the previous row's MAC.
    pub mac: String,
}

/// A signed checkpoint as recorded by an `AuditCheckpoint` event (R-AUDIT-2), linked to the
/// checkpoint before it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerCheckpoint {
    /// The ledger's last seq when the checkpoint was taken.
    pub seq: i64,
    /// The MAC of the row at `seq`.
    pub head_mac: String,
    /// The previous checkpoint's seq; 0 for the first checkpoint.
    pub prev_seq: i64,
    /// The previous checkpoint's MAC; empty for the first checkpoint.
    pub prev_mac: String,
    pub key_id: String,
    /// [`checkpoint_mac`] of `(seq, head_mac, prev_seq, prev_mac)` by `key_id`.
    pub mac: String,
}

impl LedgerCheckpoint {
    /// Signs a checkpoint of the row `(seq, head_mac)` with the current key, following
    /// `previous` (`None` for the first checkpoint).
    pub fn seal(keys: &AuditKeys, seq: i64, head_mac: &str, previous: Option<&LedgerCheckpoint>) -> LedgerCheckpoint {
        let (prev_seq, prev_mac) = previous.map(|p| (p.seq, p.mac.as_str())).unwrap_or((0, ""));
        LedgerCheckpoint {
            seq,
            head_mac: head_mac.to_owned(),
            prev_seq,
            prev_mac: prev_mac.to_owned(),
            key_id: keys.current_key_id().to_owned(),
            mac: checkpoint_mac(keys, seq, head_mac, prev_seq, prev_mac),
        }
    }
}

/// The canonical text of a ledger time: RFC 3339 in UTC with exactly three fractional
/// digits. Fixed width, so stored times sort lexicographically in time order (the `since`
/// filter compares text) and parse back to the same instant.
pub fn canonical_time(time: DateTime<Utc>) -> String {
    time.to_rfc3339_opts(SecondsFormat::Millis, true)
}

mod canonical_time_serde {
    use chrono::{DateTime, Utc};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(time: &DateTime<Utc>, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::canonical_time(*time))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<DateTime<Utc>, D::Error> {
        let text = String::deserialize(d)?;
        DateTime::parse_from_rfc3339(&text).map(|t| t.with_timezone(&Utc)).map_err(serde::de::Error::custom)
    }
}

/// `sha256:<hex>` of an event payload's JSON bytes: the row binds the exact event without
/// copying it (payloads carry whole manifests).
pub fn payload_digest(payload_json: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(payload_json)))
}

/// The ledger action of an event (R-AUDIT-1), or `None` when the event is not audited
/// (namespace bookkeeping, the ledger's own checkpoints, anything unknown).
///
/// The aggregate type must match the event's owner, so an event name reused by another
/// aggregate is not mistaken for an auditable one. A refused Worker launch has its own
/// action, so a filter on `worker.create` shows the Workers made.
pub fn action_of(aggregate_type: &str, event_type: &str) -> Option<&'static str> {
    let action = match (aggregate_type, event_type) {
        ("draft", "DraftSubmitted") => "box_draft.create",
        ("draft", "DraftApproved") => "box_draft.approve",
        ("draft", "DraftRejected") => "box_draft.reject",
        ("draft", "DraftApprovalGiven") => "box_draft.approval_given",
        ("draft", "DraftWithdrawn") => "box_draft.withdraw",
        ("draft", "DraftExpired") => "box_draft.expire",
        ("box", "BoxActivated") => "box.activate",
        ("box", "BoxUserAssigned") => "box.assign",
        ("box", "BoxManifestEdited") => "box.manifest_edit",
        ("box", "BoxConfigEdited") => "box.config_edit",
        ("box", "BoxStopped") => "box.stop",
        ("box", "BoxResumed") => "box.resume",
        ("box", "BoxArchived") => "box.archive",
        ("box", "BoxUserUnassigned") => "box.unassign",
        ("box", "BoxManifestChanged") => "box.change",
        ("access", "AccessProvisioned") => "access.provision",
        ("access", "AccessProvisionFailed") => "access.provision_failed",
        (t, "SecurityViolation") if crate::aggregates::types::SECURITY.contains(&t) => "security_violation",
        ("pat", "TokenIssued") => "token.issue",
        ("pat", "TokenRevoked") => "token.revoke",
        ("worker", "WorkerCreated") => "worker.create",
        ("worker", "WorkerLaunchRefused") => "worker.create_refused",
        ("worker", "WorkerClaimed") => "worker.claim",
        ("worker", "WorkerRunning") => "worker.run",
        ("worker", "WorkerPaused") => "worker.pause",
        ("worker", "WorkerFinished") => "worker.finish",
        ("worker", "WorkerLost") => "worker.lost",
        ("worker", "WorkerStopRequested") => "worker.stop",
        ("worker", "WorkerInputAdded") => "worker.input",
        ("worker", "WorkerPauseRequested") => "worker.pause_request",
        ("worker", "WorkerToolDenied") => "worker.tool_denied",
        ("worker", "WorkerToolUseRequested") => "worker.tool_ask",
        ("worker", "WorkerToolUseApproved") => "worker.tool_approve",
        ("worker", "WorkerToolUseRejected") => "worker.tool_reject",
        ("worker", "WorkerToolUseExpired") => "worker.tool_expire",
        ("config_bundle", "ConfigBundleSynced") => "bundle.sync",
        ("execution_binding", "BindingPrepared") => "binding.prepare",
        ("execution_binding", "BindingConsumed") => "binding.consume",
        ("execution_binding", "BindingExpired") => "binding.expire",
        ("worker", "WorkerNotificationRequested") => "worker.notify",
        ("notification", "NotificationSent") => "notify.send",
        ("notification", "NotificationFailed") => "notify.fail",
        ("notification", "NotificationRefused") => "notify.refuse",
        ("webhook", "WebhookRegistered") => "webhook.register",
        ("webhook", "WebhookRemoved") => "webhook.remove",
        ("webhook", "WebhookDeliveryDeadLettered") => "webhook.dead_letter",
        ("org_policy", "PolicyPublished") => "policy.publish",
        _ => return None,
    };
    Some(action)
}

/// Who did it and to what, from an event payload (externally tagged,
/// `{"DraftSubmitted": {...}}`, or the bare body). Falls back to `"system"` (nobody named:
/// expiry, provisioning) and to `aggregate_id` (the stream the event belongs to).
pub fn actor_and_target(event_type: &str, aggregate_id: &str, payload: &Value) -> (String, String) {
    let body = payload.get(event_type).unwrap_or(payload);
    let text = |path: &[&str]| -> Option<String> {
        let mut v = body;
        for key in path {
            v = v.get(key)?;
        }
        v.as_str().filter(|s| !s.is_empty()).map(str::to_owned)
    };
    let (actor_paths, target_paths): (&[&[&str]], &[&[&str]]) = match event_type {
        "DraftSubmitted" => (&[&["requested_by", "user_id"]], &[&["draft_id"]]),
        "DraftApproved" | "DraftApprovalGiven" => (&[&["approved_by"]], &[&["draft_id"]]),
        "DraftRejected" => (&[&["rejected_by"]], &[&["draft_id"]]),
        "DraftWithdrawn" => (&[&["withdrawn_by"]], &[&["draft_id"]]),
        "DraftExpired" => (&[], &[&["draft_id"]]),
        "BoxActivated" => (&[&["approved_by"]], &[&["box_id"]]),
        "BoxUserAssigned" => (&[&["assigned_by"]], &[&["box_id"]]),
        "BoxUserUnassigned" => (&[&["unassigned_by"]], &[&["box_id"]]),
        "BoxManifestEdited" | "BoxConfigEdited" => (&[&["edited_by"]], &[&["box_id"]]),
        "BoxStopped" | "BoxResumed" | "BoxArchived" => (&[&["by"]], &[&["box_id"]]),
        "BoxManifestChanged" => (&[&["approved_by"]], &[&["box_id"]]),
        "AccessProvisioned" | "AccessProvisionFailed" => (&[], &[&["box_id"]]),
        "SecurityViolation" => (&[&["actor"]], &[&["target"]]),
        "TokenIssued" => (&[&["issued_by"]], &[&["token_id"]]),
        "TokenRevoked" => (&[&["revoked_by"]], &[&["token_id"]]),
        "WorkerCreated" => (&[&["created_by"], &["created_by", "user_id"], &["by"]], &[&["worker_id"], &["box_id"]]),
        "WorkerLaunchRefused" => (&[&["by"]], &[&["box_id"]]),
        "WorkerClaimed" | "WorkerRunning" | "WorkerPaused" | "WorkerFinished" | "WorkerLost" | "WorkerToolDenied" => (&[&["host"]], &[&["worker_id"]]),
        "WorkerStopRequested" | "WorkerInputAdded" | "WorkerPauseRequested" | "WorkerToolUseApproved" | "WorkerToolUseRejected" => {
            (&[&["by"]], &[&["worker_id"]])
        }
        "WorkerToolUseRequested" => (&[&["host"]], &[&["worker_id"]]),
        "WorkerToolUseExpired" => (&[], &[&["worker_id"]]),
        "ConfigBundleSynced" => (&[&["by"]], &[&["box_id"]]),
        "BindingPrepared" => (&[&["prepared_by"]], &[&["box_id"]]),
        "BindingConsumed" => (&[&["by"]], &[&["box_id"]]),
        "BindingExpired" => (&[], &[&["box_id"]]),
        "WorkerNotificationRequested" => (&[&["host"]], &[&["worker_id"]]),
        "NotificationSent" | "NotificationFailed" | "NotificationRefused" => (&[], &[&["worker_id"]]),
        "WebhookRegistered" => (&[&["registered_by"]], &[&["webhook_id"]]),
        "WebhookRemoved" => (&[&["removed_by"]], &[&["webhook_id"]]),
        "WebhookDeliveryDeadLettered" => (&[], &[&["webhook_id"]]),
        "PolicyPublished" => (&[&["published_by"]], &[&["digest"]]),
        _ => (&[&["by"], &["actor"]], &[&["target"]]),
    };
    let actor = actor_paths.iter().find_map(|p| text(p)).unwrap_or_else(|| "system".to_owned());
    let target = target_paths.iter().find_map(|p| text(p)).unwrap_or_else(|| aggregate_id.to_owned());
    (actor, target)
}

/// The row formats a MAC may cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RowFormat {
    /// Before `detail`.
    V1,
    /// With `detail`.
    V2,
}

/// The MACed bytes of a row: purpose tag, then seq (i64 big-endian), time
/// ([`canonical_time`]), action, actor, target, event id, payload digest, the detail (v2
/// only), key id and the previous row's MAC (hex text, empty for seq 1), each prefixed by
/// its u32 big-endian length so that no two distinct rows share an encoding.
fn row_bytes(row: &UnsignedRow, key_id: &str, prev_mac: &str, format: RowFormat) -> Vec<u8> {
    let time = canonical_time(row.time);
    let mut out = Vec::with_capacity(
        128 + time.len()
            + row.action.len()
            + row.actor.len()
            + row.target.len()
            + row.event_id.len()
            + row.payload_digest.len()
            + row.detail.len()
            + key_id.len()
            + prev_mac.len(),
    );
    let tag = match format {
        RowFormat::V1 => ROW_PURPOSE_TAG_V1,
        RowFormat::V2 => ROW_PURPOSE_TAG,
    };
    push_item(&mut out, tag.as_bytes());
    push_item(&mut out, &row.seq.to_be_bytes());
    push_item(&mut out, time.as_bytes());
    push_item(&mut out, row.action.as_bytes());
    push_item(&mut out, row.actor.as_bytes());
    push_item(&mut out, row.target.as_bytes());
    push_item(&mut out, row.event_id.as_bytes());
    push_item(&mut out, row.payload_digest.as_bytes());
    if format == RowFormat::V2 {
        push_item(&mut out, row.detail.as_bytes());
    }
    push_item(&mut out, key_id.as_bytes());
    push_item(&mut out, prev_mac.as_bytes());
    out
}

/// The MACed bytes of a checkpoint: purpose tag, key id, seq, head MAC, the previous
/// checkpoint's seq and MAC (0 and empty for the first), each length-prefixed.
fn checkpoint_bytes(key_id: &str, seq: i64, head_mac: &str, prev_seq: i64, prev_mac: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(96 + key_id.len() + head_mac.len() + prev_mac.len());
    push_item(&mut out, CHECKPOINT_PURPOSE_TAG.as_bytes());
    push_item(&mut out, key_id.as_bytes());
    push_item(&mut out, &seq.to_be_bytes());
    push_item(&mut out, head_mac.as_bytes());
    push_item(&mut out, &prev_seq.to_be_bytes());
    push_item(&mut out, prev_mac.as_bytes());
    out
}

/// The row's MAC by the current key (whose id the canonical bytes include), chained to
/// `prev_mac`, the previous row's MAC (empty for seq 1). Prefer [`UnsignedRow::seal`],
/// which also truncates the time to what the canonical form carries.
pub fn row_mac(keys: &AuditKeys, row: &UnsignedRow, prev_mac: &str) -> String {
    keys.current.tag_hex(&row_bytes(row, &keys.current.key_id, prev_mac, RowFormat::V2))
}

/// The MAC of a checkpoint `(seq, head_mac)` following the checkpoint `(prev_seq,
/// prev_mac)` (0 and empty for the first) by the current key, for the `AuditCheckpoint`
/// event (whose `key_id` is [`AuditKeys::current_key_id`]). Prefer [`LedgerCheckpoint::seal`].
pub fn checkpoint_mac(keys: &AuditKeys, seq: i64, head_mac: &str, prev_seq: i64, prev_mac: &str) -> String {
    keys.current.tag_hex(&checkpoint_bytes(&keys.current.key_id, seq, head_mac, prev_seq, prev_mac))
}

/// The result of a verification (R-AUDIT-2). Serializes exactly as `{"ok": true, "rows":
/// N}` or `{"ok": false, "first_bad_seq": S, "reason": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verification {
    Ok { rows: u64 },
    Broken { first_bad_seq: i64, reason: String },
}

impl Verification {
    pub fn is_ok(&self) -> bool {
        matches!(self, Verification::Ok { .. })
    }

    fn broken(first_bad_seq: i64, reason: impl Into<String>) -> Self {
        Verification::Broken { first_bad_seq, reason: reason.into() }
    }
}

#[derive(Serialize, Deserialize)]
struct VerificationWire {
    ok: bool,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    rows: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    first_bad_seq: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    reason: Option<String>,
}

impl Serialize for Verification {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let wire = match self {
            Verification::Ok { rows } => VerificationWire { ok: true, rows: Some(*rows), first_bad_seq: None, reason: None },
            Verification::Broken { first_bad_seq, reason } => {
                VerificationWire { ok: false, rows: None, first_bad_seq: Some(*first_bad_seq), reason: Some(reason.clone()) }
            }
        };
        wire.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Verification {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = VerificationWire::deserialize(d)?;
        match wire {
            VerificationWire { ok: true, rows: Some(rows), first_bad_seq: None, reason: None } => Ok(Verification::Ok { rows }),
            VerificationWire { ok: false, rows: None, first_bad_seq: Some(first_bad_seq), reason: Some(reason) } => {
                Ok(Verification::Broken { first_bad_seq, reason })
            }
            _ => Err(serde::de::Error::custom("expected {\"ok\": true, \"rows\": N} or {\"ok\": false, \"first_bad_seq\": S, \"reason\": ...}")),
        }
    }
}

/// Why a MAC did not check out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MacProblem {
    /// Not exactly 64 lowercase hex characters: the chain hashes the MAC text, so only one
    /// spelling of a MAC may exist.
    Malformed,
    Mismatch,
}

fn decode_mac(mac_hex: &str) -> Result<[u8; MAC_LEN], MacProblem> {
    if mac_hex.len() != 2 * MAC_LEN || !mac_hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(MacProblem::Malformed);
    }
    let mut tag = [0u8; MAC_LEN];
    hex::decode_to_slice(mac_hex.as_bytes(), &mut tag).map_err(|_| MacProblem::Malformed)?;
    Ok(tag)
}

/// Whether two MAC texts are equal, in time independent of where they differ (R-AUDIT-4).
fn macs_equal(a: &str, b: &str) -> bool {
    a.len() == b.len() && bool::from(a.as_bytes().ct_eq(b.as_bytes()))
}

/// Where and why a ledger breaks.
struct Break {
    seq: i64,
    reason: String,
}

impl Break {
    fn at(seq: i64, reason: impl Into<String>) -> Self {
        Break { seq, reason: reason.into() }
    }
}

/// Verifies a ledger (R-AUDIT-2): `rows` as stored, in seq order, and every signed
/// checkpoint in the order they were recorded. Names the first bad seq:
///
/// - a seq that is not the previous one + 1 (a deleted, inserted or moved row),
/// - a row under an unknown key id, with a malformed MAC, or whose MAC does not match its
///   fields and the previous row's MAC (modified, inserted or reordered rows),
/// - a checkpoint whose own MAC does not verify (forged), that does not name the checkpoint
///   recorded before it (one was removed, forged or reordered) or does not move past it,
/// - a checkpoint beyond the last row (a removed tail), or whose row does not carry its head
///   MAC (a removed tail that regrew, or a replaced one).
///
/// A checkpoint's problem is named at its seq, a removed tail at its first missing seq; when
/// both the rows and a checkpoint break, the lower seq is named (the row's on a tie).
pub fn verify_chain(keys: &AuditKeys, rows: &[LedgerRow], checkpoints: &[LedgerCheckpoint]) -> Verification {
    let (intact, row_break) = verify_rows(keys, rows);
    let checkpoint_break = verify_checkpoints(keys, &rows[..intact], row_break.is_none(), checkpoints);
    let first = match (row_break, checkpoint_break) {
        (Some(row), Some(checkpoint)) => Some(if checkpoint.seq < row.seq { checkpoint } else { row }),
        (row, checkpoint) => row.or(checkpoint),
    };
    match first {
        Some(b) => Verification::broken(b.seq, b.reason),
        None => Verification::Ok { rows: rows.len() as u64 },
    }
}

/// The number of leading rows that verify (they hold seqs 1..=n in order), and the first
/// broken row, if any.
fn verify_rows(keys: &AuditKeys, rows: &[LedgerRow]) -> (usize, Option<Break>) {
    let mut prev_mac = "";
    for (intact, (row, expected)) in rows.iter().zip(1i64..).enumerate() {
        let problem = if row.seq != expected {
            Some(if row.seq > expected {
                Break::at(expected, format!("row {expected} is missing or out of order: the ledger goes on with seq {}", row.seq))
            } else {
                Break::at(row.seq, format!("seq {} appears again or out of order after seq {}", row.seq, expected - 1))
            })
        } else if row.time.nanosecond() % 1_000_000 != 0 {
            Some(Break::at(row.seq, "the row's time carries sub-millisecond digits, which its mac does not cover"))
        } else {
            match keys.get(&row.key_id) {
                None => Some(Break::at(row.seq, format!("the row is MACed with unknown key id {:?}", row.key_id))),
                Some(key) => {
                    let unsigned = UnsignedRow {
                        seq: row.seq,
                        time: row.time,
                        action: row.action.clone(),
                        actor: row.actor.clone(),
                        target: row.target.clone(),
                        event_id: row.event_id.clone(),
                        payload_digest: row.payload_digest.clone(),
                        detail: row.detail.clone(),
                    };
                    // A row without a detail may be one of the format before details.
                    let v2 = key.verifies(&row_bytes(&unsigned, &row.key_id, prev_mac, RowFormat::V2), &row.mac);
                    let verified = match v2 {
                        Err(MacProblem::Mismatch) if row.detail.is_empty() => {
                            key.verifies(&row_bytes(&unsigned, &row.key_id, prev_mac, RowFormat::V1), &row.mac)
                        }
                        other => other,
                    };
                    match verified {
                        Ok(()) => None,
                        Err(MacProblem::Malformed) => Some(Break::at(row.seq, "the row's mac is not 64 lowercase hex characters")),
                        Err(MacProblem::Mismatch) => {
                            Some(Break::at(row.seq, "the row's mac does not match its fields and the previous row's mac: modified, inserted or reordered"))
                        }
                    }
                }
            }
        };
        if problem.is_some() {
            return (intact, problem);
        }
        prev_mac = &row.mac;
    }
    (rows.len(), None)
}

/// Checks every checkpoint in recorded order against `rows`, the verified rows (seqs
/// 1..=n). `complete` says whether they are the whole ledger; when not, the rows break at
/// seq n + 1, which is named instead of anything a checkpoint beyond n could show.
fn verify_checkpoints(keys: &AuditKeys, rows: &[LedgerRow], complete: bool, checkpoints: &[LedgerCheckpoint]) -> Option<Break> {
    let last_seq = rows.len() as i64;
    let mut prev: Option<&LedgerCheckpoint> = None;
    for cp in checkpoints {
        let (prev_seq, prev_mac) = prev.map(|p| (p.seq, p.mac.as_str())).unwrap_or((0, ""));
        let Some(key) = keys.get(&cp.key_id) else {
            return Some(Break::at(cp.seq, format!("the checkpoint at seq {} is MACed with unknown key id {:?}", cp.seq, cp.key_id)));
        };
        if key.verifies(&checkpoint_bytes(&cp.key_id, cp.seq, &cp.head_mac, cp.prev_seq, &cp.prev_mac), &cp.mac).is_err() {
            return Some(Break::at(cp.seq, format!("the mac of the checkpoint at seq {} does not verify: forged checkpoint", cp.seq)));
        }
        if cp.prev_seq != prev_seq || !macs_equal(&cp.prev_mac, prev_mac) {
            return Some(Break::at(
                cp.seq,
                format!(
                    "the checkpoint at seq {} does not follow the checkpoint recorded before it (seq {prev_seq}): a checkpoint was removed or reordered",
                    cp.seq
                ),
            ));
        }
        if cp.seq <= prev_seq {
            return Some(Break::at(cp.seq, format!("the checkpoint at seq {} does not move past the checkpoint before it (seq {prev_seq})", cp.seq)));
        }
        if cp.seq > last_seq {
            return complete.then(|| {
                Break::at(
                    last_seq + 1,
                    format!("the ledger ends at seq {last_seq} but the checkpoint at seq {} covers more: rows were removed from the tail", cp.seq),
                )
            });
        }
        // 1 <= cp.seq <= last_seq, and rows[i] holds seq i + 1.
        let row = usize::try_from(cp.seq - 1).ok().and_then(|i| rows.get(i));
        if !row.is_some_and(|row| macs_equal(&row.mac, &cp.head_mac)) {
            return Some(Break::at(
                cp.seq,
                format!(
                    "row {} does not carry the head mac of the checkpoint at seq {}: the tail after seq {prev_seq} was removed and regrew, or was replaced",
                    cp.seq, cp.seq
                ),
            ));
        }
        prev = Some(cp);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeDelta, TimeZone};
    use serde_json::json;

    fn key(id: &str, byte: u8) -> AuditKey {
        AuditKey::new(id, &[byte; 32]).expect("valid key")
    }

    fn keys() -> AuditKeys {
        AuditKeys::new(key("audit-1", 1), vec![])
    }

    fn t(second: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, 12, 0, second).single().expect("valid time") + TimeDelta::milliseconds(250)
    }

    fn unsigned(seq: i64) -> UnsignedRow {
        UnsignedRow {
            seq,
            time: t(u32::try_from(seq).expect("small seq")),
            action: "box_draft.create".into(),
            actor: format!("user-{seq}"),
            target: format!("draft-{seq}"),
            event_id: format!("draft/draft-{seq}/1"),
            payload_digest: payload_digest(format!("{{\"n\":{seq}}}").as_bytes()),
            detail: format!("submitted box {seq}"),
        }
    }

    /// A row as the ledger sealed it before rows had a detail (format v1, detail empty).
    fn sealed_v1(keys: &AuditKeys, seq: i64, prev_mac: &str) -> LedgerRow {
        let row = UnsignedRow { detail: String::new(), ..unsigned(seq) };
        let mac = keys.current.tag_hex(&row_bytes(&row, keys.current_key_id(), prev_mac, RowFormat::V1));
        LedgerRow { mac, ..row.seal(keys, prev_mac) }
    }

    #[test]
    fn r_audit_6_the_mac_covers_the_detail() {
        // given an intact ledger of rows with details
        let keys = keys();
        let mut rows = ledger(&keys, 4);
        assert!(verify_chain(&keys, &rows, &[]).is_ok());
        // when one row's detail is changed, or blanked as if it were an older row
        for changed in ["approved: nothing to see", ""] {
            let mut tampered = rows.clone();
            tampered[2].detail = changed.to_owned();
            // then the ledger breaks at that row
            assert_eq!(first_bad(&verify_chain(&keys, &tampered, &[])), Some(3), "{changed:?}");
        }
        rows[1].detail.push('!');
        assert_eq!(first_bad(&verify_chain(&keys, &rows, &[])), Some(2));
    }

    #[test]
    fn r_audit_6_rows_from_before_details_keep_verifying_and_the_chain_goes_on() {
        // given two rows sealed in the old format, then rows with details chained to them
        let keys = keys();
        let first = sealed_v1(&keys, 1, "");
        let second = sealed_v1(&keys, 2, &first.mac);
        let third = unsigned(3).seal(&keys, &second.mac);
        let rows = vec![first, second, third];
        // then the whole ledger verifies
        assert_eq!(verify_chain(&keys, &rows, &[]), Verification::Ok { rows: 3 });
        // and an old row given a detail afterwards does not
        let mut tampered = rows.clone();
        tampered[0].detail = "made up".into();
        assert_eq!(first_bad(&verify_chain(&keys, &tampered, &[])), Some(1));
    }

    /// A chained ledger of `n` rows under `keys`' current key.
    fn ledger(keys: &AuditKeys, n: i64) -> Vec<LedgerRow> {
        let mut rows: Vec<LedgerRow> = Vec::new();
        for seq in 1..=n {
            let prev = rows.last().map(|r| r.mac.clone()).unwrap_or_default();
            rows.push(unsigned(seq).seal(keys, &prev));
        }
        rows
    }

    /// The first checkpoint, over the last of `rows`.
    fn checkpoint_of(keys: &AuditKeys, rows: &[LedgerRow]) -> LedgerCheckpoint {
        let last = rows.last().expect("a row");
        LedgerCheckpoint::seal(keys, last.seq, &last.mac, None)
    }

    /// Checkpoints over `rows` at each of `seqs`, chained, by `keys`' current key.
    fn checkpoints_at(keys: &AuditKeys, rows: &[LedgerRow], seqs: &[i64]) -> Vec<LedgerCheckpoint> {
        let mut out: Vec<LedgerCheckpoint> = Vec::new();
        for &seq in seqs {
            let row = &rows[usize::try_from(seq - 1).expect("seq >= 1")];
            let cp = LedgerCheckpoint::seal(keys, seq, &row.mac, out.last());
            out.push(cp);
        }
        out
    }

    fn first_bad(v: &Verification) -> Option<i64> {
        match v {
            Verification::Broken { first_bad_seq, .. } => Some(*first_bad_seq),
            Verification::Ok { .. } => None,
        }
    }

    #[test]
    fn r_audit_1_action_of_maps_auditable_events_only() {
        // given the event catalog; then each auditable event has its action, others none
        let cases = [
            ("draft", "DraftSubmitted", Some("box_draft.create")),
            ("draft", "DraftApproved", Some("box_draft.approve")),
            ("draft", "DraftRejected", Some("box_draft.reject")),
            ("draft", "DraftWithdrawn", Some("box_draft.withdraw")),
            ("draft", "DraftExpired", Some("box_draft.expire")),
            ("box", "BoxActivated", Some("box.activate")),
            ("box", "BoxUserAssigned", Some("box.assign")),
            ("box", "BoxManifestEdited", Some("box.manifest_edit")),
            ("box", "BoxConfigEdited", Some("box.config_edit")),
            ("box", "BoxStopped", Some("box.stop")),
            ("box", "BoxResumed", Some("box.resume")),
            ("box", "BoxArchived", Some("box.archive")),
            ("box", "BoxUserUnassigned", Some("box.unassign")),
            ("access", "AccessProvisioned", Some("access.provision")),
            ("access", "AccessProvisionFailed", Some("access.provision_failed")),
            ("approval_security", "SecurityViolation", Some("security_violation")),
            ("registry_security", "SecurityViolation", Some("security_violation")),
            ("drafts_security", "SecurityViolation", Some("security_violation")),
            ("audit_security", "SecurityViolation", Some("security_violation")),
            ("provisioner_security", "SecurityViolation", Some("security_violation")),
            ("draft", "SecurityViolation", None),
            ("pat", "TokenIssued", Some("token.issue")),
            ("pat", "TokenRevoked", Some("token.revoke")),
            ("draft", "TokenRevoked", None),
            ("worker", "WorkerCreated", Some("worker.create")),
            ("worker", "WorkerLaunchRefused", Some("worker.create_refused")),
            ("box", "WorkerCreated", None),
            ("config_bundle", "ConfigBundleSynced", Some("bundle.sync")),
            ("execution_binding", "BindingPrepared", Some("binding.prepare")),
            ("execution_binding", "BindingConsumed", Some("binding.consume")),
            ("execution_binding", "BindingExpired", Some("binding.expire")),
            ("box_type_namespace", "BoxTypeReserved", None),
            ("box_type_namespace", "BoxTypeReleased", None),
            ("audit_ledger", "AuditCheckpoint", None),
            ("audit_ledger", "WorkerCreated", None),
            ("box", "DraftSubmitted", None),
            ("draft", "Unknown", None),
        ];
        for (aggregate_type, event_type, want) in cases {
            assert_eq!(action_of(aggregate_type, event_type), want, "{aggregate_type}/{event_type}");
        }
    }

    #[test]
    fn r_audit_1_actor_and_target_come_from_the_payload() {
        // given externally tagged payloads; when read; then who and what, else system / id
        let submitted = json!({"DraftSubmitted": {"draft_id": "d1", "requested_by": {"user_id": "agent-1", "role": "member", "kind": "agent"}}});
        assert_eq!(actor_and_target("DraftSubmitted", "d1", &submitted), ("agent-1".into(), "d1".into()));
        let approved = json!({"DraftApproved": {"draft_id": "d1", "approved_by": "alice"}});
        assert_eq!(actor_and_target("DraftApproved", "d1", &approved), ("alice".into(), "d1".into()));
        let activated = json!({"BoxActivated": {"box_id": "b1", "approved_by": "alice"}});
        assert_eq!(actor_and_target("BoxActivated", "b1", &activated), ("alice".into(), "b1".into()));
        let stopped = json!({"BoxStopped": {"box_id": "b1", "by": "bob"}});
        assert_eq!(actor_and_target("BoxStopped", "b1", &stopped), ("bob".into(), "b1".into()));
        let unassigned = json!({"BoxUserUnassigned": {"box_id": "b1", "user_id": "erin", "unassigned_by": "dave"}});
        assert_eq!(actor_and_target("BoxUserUnassigned", "b1", &unassigned), ("dave".into(), "b1".into()));
        let violation = json!({"SecurityViolation": {"actor": "mallory", "target": "d9", "kind": "self_approval"}});
        assert_eq!(actor_and_target("SecurityViolation", "x", &violation), ("mallory".into(), "d9".into()));
        let revoked = json!({"TokenRevoked": {"token_id": "tok_1", "user_id": "bob", "revoked_by": "alice"}});
        assert_eq!(actor_and_target("TokenRevoked", "tok_1", &revoked), ("alice".into(), "tok_1".into()));
        let expired = json!({"DraftExpired": {"draft_id": "d2"}});
        assert_eq!(actor_and_target("DraftExpired", "d2", &expired), ("system".into(), "d2".into()));
        let provisioned = json!({"AccessProvisioned": {"box_id": "b1"}});
        assert_eq!(actor_and_target("AccessProvisioned", "b1/0", &provisioned), ("system".into(), "b1".into()));
        // a bare body and an unknown shape fall back
        assert_eq!(actor_and_target("DraftApproved", "d1", &json!({"approved_by": "alice", "draft_id": "d1"})), ("alice".into(), "d1".into()));
        assert_eq!(actor_and_target("DraftApproved", "d3", &json!("garbage")), ("system".into(), "d3".into()));
    }

    #[test]
    fn r_audit_1_payload_digest_is_sha256_of_the_bytes() {
        // given bytes; then sha256:<hex>, different bytes differ
        assert_eq!(payload_digest(b""), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
        assert_ne!(payload_digest(b"{\"a\":1}"), payload_digest(b"{\"a\":2}"));
    }

    #[test]
    fn r_audit_1_sealed_chain_verifies_and_names_its_key() {
        // given a 5-row chain; when verified with its checkpoint; then ok with 5 rows
        let ks = keys();
        let rows = ledger(&ks, 5);
        assert!(rows.iter().all(|r| r.key_id == "audit-1" && r.mac.len() == 64));
        assert_eq!(verify_chain(&ks, &rows, &[checkpoint_of(&ks, &rows)]), Verification::Ok { rows: 5 });
        assert_eq!(verify_chain(&ks, &rows, &[]), Verification::Ok { rows: 5 });
        // and an empty ledger without a checkpoint is ok with 0 rows
        assert_eq!(verify_chain(&ks, &[], &[]), Verification::Ok { rows: 0 });
    }

    #[test]
    fn r_audit_1_each_mac_chains_to_the_previous_one() {
        // given the same row; when chained to a different previous mac; then its mac differs
        let ks = keys();
        assert_ne!(row_mac(&ks, &unsigned(2), "aa"), row_mac(&ks, &unsigned(2), "bb"));
        assert_ne!(row_mac(&ks, &unsigned(1), ""), row_mac(&ks, &unsigned(1), "aa"));
    }

    #[test]
    fn r_audit_2_a_modified_row_is_named() {
        // given a 4-row chain; when any field of row 2 changes; then row 2 is the first bad
        let ks = keys();
        let rows = ledger(&ks, 4);
        let alterations: Vec<fn(&mut LedgerRow)> = vec![
            |r| r.actor = "mallory".into(),
            |r| r.action = "box.stop".into(),
            |r| r.target = "draft-9".into(),
            |r| r.event_id = "draft/x/1".into(),
            |r| r.payload_digest = payload_digest(b"other"),
            |r| r.time += TimeDelta::milliseconds(1),
            |r| r.mac = "0".repeat(64),
        ];
        for alter in alterations {
            let mut tampered = rows.clone();
            alter(&mut tampered[1]);
            let v = verify_chain(&ks, &tampered, &[]);
            assert_eq!(first_bad(&v), Some(2), "{v:?}");
        }
    }

    #[test]
    fn r_audit_2_a_deleted_middle_row_is_named() {
        // given a 3-row chain; when row 2 is deleted; then seq 2 is named as missing
        let ks = keys();
        let mut rows = ledger(&ks, 3);
        rows.remove(1);
        let v = verify_chain(&ks, &rows, &[]);
        assert_eq!(first_bad(&v), Some(2), "{v:?}");
        // and renumbering the rest to hide the gap breaks the mac of the moved row
        rows[1].seq = 2;
        assert_eq!(first_bad(&verify_chain(&ks, &rows, &[])), Some(2));
        // and deleting the first row is a missing seq 1
        let rows = ledger(&ks, 3);
        assert_eq!(first_bad(&verify_chain(&ks, &rows[1..], &[])), Some(1));
    }

    #[test]
    fn r_audit_2_an_inserted_row_is_named() {
        // given a 3-row chain
        let ks = keys();
        let rows = ledger(&ks, 3);
        // when a forged row takes seq 2 and the rest are renumbered; then seq 2 is bad
        let forger = AuditKeys::new(key("audit-1", 9), vec![]);
        let mut forged = unsigned(2).seal(&forger, &rows[0].mac);
        forged.actor = "mallory".into();
        let mut inserted = vec![rows[0].clone(), forged.clone()];
        for r in &rows[1..] {
            let mut r = r.clone();
            r.seq += 1;
            inserted.push(r);
        }
        assert_eq!(first_bad(&verify_chain(&ks, &inserted, &[])), Some(2));
        // when a row repeats a seq; then that seq is named
        let duplicated = vec![rows[0].clone(), rows[1].clone(), rows[1].clone(), rows[2].clone()];
        assert_eq!(first_bad(&verify_chain(&ks, &duplicated, &[])), Some(2));
        // when a forged row is appended at the end; then its seq is named
        let mut appended = rows.clone();
        appended.push(unsigned(4).seal(&forger, &rows[2].mac));
        assert_eq!(first_bad(&verify_chain(&ks, &appended, &[])), Some(4));
    }

    #[test]
    fn r_audit_2_reordered_rows_are_named() {
        // given a 4-row chain; when rows 2 and 3 swap places; then seq 2 is named
        let ks = keys();
        let rows = ledger(&ks, 4);
        let swapped = vec![rows[0].clone(), rows[2].clone(), rows[1].clone(), rows[3].clone()];
        assert_eq!(first_bad(&verify_chain(&ks, &swapped, &[])), Some(2));
        // and when their seqs are swapped too (as stored, read by seq); then the mac breaks
        let mut renumbered = swapped;
        renumbered[1].seq = 2;
        renumbered[2].seq = 3;
        assert_eq!(first_bad(&verify_chain(&ks, &renumbered, &[])), Some(2));
    }

    #[test]
    fn r_audit_2_a_removed_tail_is_caught_by_the_checkpoint() {
        // given a 5-row chain checkpointed at seq 5
        let ks = keys();
        let rows = ledger(&ks, 5);
        let cp = checkpoint_of(&ks, &rows);
        // when rows 4 and 5 are removed; then the chain alone is fine but seq 4 is named
        assert!(verify_chain(&ks, &rows[..3], &[]).is_ok());
        let v = verify_chain(&ks, &rows[..3], std::slice::from_ref(&cp));
        assert_eq!(first_bad(&v), Some(4), "{v:?}");
        // when every row is removed; then seq 1 is named
        assert_eq!(first_bad(&verify_chain(&ks, &[], std::slice::from_ref(&cp))), Some(1));
        // rows added after the checkpoint are fine
        let longer = ledger(&ks, 7);
        assert_eq!(verify_chain(&ks, &longer, std::slice::from_ref(&cp)), Verification::Ok { rows: 7 });
    }

    /// `rows` with everything after `keep` replaced by `n` other rows (other actors), chained
    /// on from row `keep` as the ledger writer would append them: a tail removed by someone
    /// with database access, then regrown by the service.
    fn regrown(keys: &AuditKeys, rows: &[LedgerRow], keep: usize, n: i64) -> Vec<LedgerRow> {
        let mut out = rows[..keep].to_vec();
        for seq in (keep as i64 + 1)..=(keep as i64 + n) {
            let mut u = unsigned(seq);
            u.actor = format!("regrown-{seq}");
            let prev = out.last().map(|r| r.mac.clone()).unwrap_or_default();
            out.push(u.seal(keys, &prev));
        }
        out
    }

    #[test]
    fn r_audit_2_a_chain_of_checkpoints_verifies() {
        // given 9 rows checkpointed at seqs 3, 6 and 9, each checkpoint after the one before
        let ks = keys();
        let rows = ledger(&ks, 9);
        let cps = checkpoints_at(&ks, &rows, &[3, 6, 9]);
        assert_eq!((cps[0].prev_seq, cps[0].prev_mac.as_str()), (0, ""));
        assert_eq!((cps[1].prev_seq, &cps[1].prev_mac), (3, &cps[0].mac));
        assert_eq!((cps[2].prev_seq, &cps[2].prev_mac), (6, &cps[1].mac));
        // when verified; then ok, and rows appended after the last checkpoint are fine
        assert_eq!(verify_chain(&ks, &rows, &cps), Verification::Ok { rows: 9 });
        assert_eq!(verify_chain(&ks, &ledger(&ks, 12), &cps), Verification::Ok { rows: 12 });
        // and the link is part of the mac: the same head after another checkpoint differs
        assert_ne!(checkpoint_mac(&ks, 6, &rows[5].mac, 3, &cps[0].mac), checkpoint_mac(&ks, 6, &rows[5].mac, 0, ""));
    }

    #[test]
    fn r_audit_2_a_tail_removed_after_checkpoint_k_and_regrown_is_named() {
        // given 6 rows checkpointed at seq 3 (checkpoint K) and seq 6
        let ks = keys();
        let rows = ledger(&ks, 6);
        let cps = checkpoints_at(&ks, &rows, &[3, 6]);
        assert!(verify_chain(&ks, &rows, &cps).is_ok());
        // when rows 4..6 are deleted and the ledger regrows to seq 9 (new rows re-using the
        // deleted seqs), and the service honestly checkpoints seq 9 after checkpoint 6
        let tampered = regrown(&ks, &rows, 3, 6);
        let mut after = cps.clone();
        after.push(LedgerCheckpoint::seal(&ks, 9, &tampered[8].mac, cps.last()));
        // then the row chain alone and the latest checkpoint alone look fine...
        assert!(verify_chain(&ks, &tampered, &[]).is_ok());
        assert!(matches!(verify_chain(&ks, &tampered, &after[2..]), Verification::Broken { first_bad_seq: 9, .. }), "only by its link");
        // ...but checkpoint 6 no longer finds its head: seq 6 is named
        let v = verify_chain(&ks, &tampered, &after);
        let Verification::Broken { first_bad_seq, reason } = &v else { panic!("regrown tail accepted") };
        assert_eq!(*first_bad_seq, 6);
        assert!(reason.contains("checkpoint") && reason.contains("tail"), "{reason}");
        // when it has regrown only up to seq 5; then seq 6 is named as removed
        let short = regrown(&ks, &rows, 3, 2);
        let v = verify_chain(&ks, &short, &cps);
        assert!(matches!(&v, Verification::Broken { first_bad_seq: 6, reason } if reason.contains("removed from the tail")), "{v:?}");
        // when it has regrown exactly to seq 6; then seq 6 is named
        assert_eq!(first_bad(&verify_chain(&ks, &regrown(&ks, &rows, 3, 3), &cps)), Some(6));
        // and a tail regrown after the last checkpoint (seq 6) is the lower seq named
        // before a modified row further on
        let mut modified = tampered.clone();
        modified[7].actor = "mallory".into();
        assert_eq!(first_bad(&verify_chain(&ks, &modified, &after)), Some(6));
        modified[1].actor = "mallory".into();
        assert_eq!(first_bad(&verify_chain(&ks, &modified, &after)), Some(2), "a broken row before it comes first");
    }

    #[test]
    fn r_audit_2_a_removed_forged_or_reordered_checkpoint_link_is_named() {
        // given 9 rows checkpointed at 3, 6 and 9
        let ks = keys();
        let rows = ledger(&ks, 9);
        let cps = checkpoints_at(&ks, &rows, &[3, 6, 9]);
        let broken_at = |list: &[LedgerCheckpoint]| match verify_chain(&ks, &rows, list) {
            Verification::Broken { first_bad_seq, reason } => {
                assert!(reason.contains("checkpoint"), "{reason}");
                Some(first_bad_seq)
            }
            Verification::Ok { .. } => None,
        };
        // when the middle checkpoint is missing; then the next one is named
        assert_eq!(broken_at(&[cps[0].clone(), cps[2].clone()]), Some(9));
        // when the first one is missing; then the one that names it is named
        assert_eq!(broken_at(&cps[1..]), Some(6));
        // when a link is rewritten (seq or mac of the previous); then its mac fails
        let mut relinked = cps.clone();
        relinked[1].prev_mac = "cd".repeat(32);
        assert_eq!(broken_at(&relinked), Some(6));
        let mut renumbered = cps.clone();
        renumbered[2].prev_seq = 3;
        assert_eq!(broken_at(&renumbered), Some(9));
        // when a correctly MACed checkpoint starts a chain of its own in the middle (made
        // with the key, after the tail was cut); then it is named
        let restarted = vec![cps[0].clone(), cps[1].clone(), LedgerCheckpoint::seal(&ks, 9, &rows[8].mac, None)];
        assert_eq!(broken_at(&restarted), Some(9));
        // when checkpoints are reordered; then the first out of place is named
        assert_eq!(broken_at(&[cps[1].clone(), cps[0].clone(), cps[2].clone()]), Some(6));
        // when a checkpoint made with the key goes backwards; then it is named
        let backwards = vec![cps[0].clone(), cps[1].clone(), LedgerCheckpoint::seal(&ks, 2, &rows[1].mac, Some(&cps[1]))];
        assert_eq!(broken_at(&backwards), Some(2));
        // and a forged checkpoint after an intact chain is named at its seq
        let forger = AuditKeys::new(key("audit-1", 9), vec![]);
        let mut forged = cps.clone();
        forged.push(LedgerCheckpoint::seal(&forger, 9, &rows[8].mac, cps.last()));
        assert_eq!(broken_at(&forged), Some(9));
    }

    #[test]
    fn r_audit_2_a_tail_that_does_not_carry_the_head_mac_is_named() {
        // given a checkpoint over seq 3 of one ledger; when verifying another chain of
        // the same length (a rewritten tail); then seq 3 is named
        let ks = keys();
        let rows = ledger(&ks, 3);
        let mut cp = checkpoint_of(&ks, &rows);
        cp.head_mac = "ab".repeat(32);
        cp.mac = checkpoint_mac(&ks, cp.seq, &cp.head_mac, 0, "");
        let v = verify_chain(&ks, &rows, std::slice::from_ref(&cp));
        assert_eq!(first_bad(&v), Some(3), "{v:?}");
    }

    #[test]
    fn r_audit_2_a_forged_checkpoint_is_refused() {
        // given a 3-row chain and its checkpoint
        let ks = keys();
        let rows = ledger(&ks, 3);
        let cp = checkpoint_of(&ks, &rows);
        // when the checkpoint's seq, head or mac change, or another key made it; then refused
        let mut higher = cp.clone();
        higher.seq = 9;
        let mut other_head = cp.clone();
        other_head.head_mac = rows[1].mac.clone();
        let mut bad_mac = cp.clone();
        bad_mac.mac = "0".repeat(64);
        let forger = AuditKeys::new(key("audit-1", 9), vec![]);
        let mut by_forger = cp.clone();
        by_forger.mac = checkpoint_mac(&forger, cp.seq, &cp.head_mac, 0, "");
        let mut unknown = cp.clone();
        unknown.key_id = "nobody".into();
        for forged in [higher, other_head, bad_mac, by_forger, unknown] {
            let v = verify_chain(&ks, &rows, std::slice::from_ref(&forged));
            let Verification::Broken { first_bad_seq, reason } = &v else { panic!("forged checkpoint accepted: {forged:?}") };
            assert_eq!(*first_bad_seq, forged.seq);
            assert!(reason.contains("checkpoint"), "{reason}");
        }
        // and a checkpoint mac is not a row mac (domain separation)
        assert_ne!(checkpoint_mac(&ks, 1, &rows[0].mac, 0, ""), rows[1].mac);
    }

    #[test]
    fn r_audit_4_rows_under_a_rotated_key_still_verify() {
        // given 2 rows under the old key
        let old = AuditKeys::new(key("audit-old", 1), vec![]);
        let mut rows = ledger(&old, 2);
        // when the key rotates (old kept for verification) and 2 more rows are appended
        let rotated = AuditKeys::new(key("audit-new", 2), vec![key("audit-old", 1)]);
        for seq in 3..=4 {
            let prev = rows.last().map(|r| r.mac.clone()).unwrap_or_default();
            rows.push(unsigned(seq).seal(&rotated, &prev));
        }
        // and checkpoints: one by the old key over seq 2, the next by the new key over seq 4
        let old_cp = checkpoint_of(&old, &rows[..2]);
        let new_cp = LedgerCheckpoint::seal(&rotated, 4, &rows[3].mac, Some(&old_cp));
        // then the whole ledger verifies, old rows under the old id, new ones under the new,
        // and the checkpoint chain crosses the rotation
        assert_eq!(verify_chain(&rotated, &rows, &[old_cp.clone(), new_cp.clone()]), Verification::Ok { rows: 4 });
        assert_eq!(rows[0].key_id, "audit-old");
        assert_eq!(rows[3].key_id, "audit-new");
        assert_eq!((old_cp.key_id.as_str(), new_cp.key_id.as_str()), ("audit-old", "audit-new"));
        assert_eq!(rotated.key_ids(), vec!["audit-new", "audit-old"]);
        // but without the old key, its checkpoint is refused too
        let forgotten = AuditKeys::new(key("audit-new", 2), vec![]);
        let v = verify_chain(&forgotten, &rows[2..], &[old_cp, new_cp]);
        assert!(matches!(&v, Verification::Broken { reason, .. } if reason.contains("missing")), "{v:?}");
    }

    #[test]
    fn r_audit_4_an_unknown_key_id_is_named() {
        // given rows by audit-old; when the verifier only knows audit-new; then seq 1 named
        let old = AuditKeys::new(key("audit-old", 1), vec![]);
        let rows = ledger(&old, 2);
        let v = verify_chain(&keys(), &rows, &[]);
        let Verification::Broken { first_bad_seq, reason } = v else { panic!("unknown key accepted") };
        assert_eq!(first_bad_seq, 1);
        assert!(reason.contains("unknown key id"), "{reason}");
        // and relabelling a row with another known key id breaks its mac
        let rotated = AuditKeys::new(key("audit-new", 2), vec![key("audit-old", 1)]);
        let mut relabelled = rows;
        relabelled[1].key_id = "audit-new".into();
        assert_eq!(first_bad(&verify_chain(&rotated, &relabelled, &[])), Some(2));
    }

    #[test]
    fn r_audit_4_macs_are_compared_in_constant_time_and_spelled_one_way() {
        // Row and checkpoint MACs go through `Mac::verify_slice`, the head MAC through
        // `subtle::ConstantTimeEq`; here the comparison helpers' answers are pinned.
        let a = "ab".repeat(32);
        assert!(macs_equal(&a, &a.clone()));
        assert!(!macs_equal(&a, &format!("ac{}", &a[2..])));
        assert!(!macs_equal(&a, &format!("{}ac", &a[..62])));
        assert!(!macs_equal(&a, &a[..62]));
        assert_eq!(decode_mac(&a).map(|t| t.len()), Ok(MAC_LEN));
        // an uppercase spelling of a valid mac is refused: the chain hashes the text
        assert_eq!(decode_mac(&a.to_uppercase()), Err(MacProblem::Malformed));
        assert_eq!(decode_mac("xyz"), Err(MacProblem::Malformed));
        let ks = keys();
        let mut rows = ledger(&ks, 2);
        rows[0].mac = rows[0].mac.to_uppercase();
        let v = verify_chain(&ks, &rows, &[]);
        assert_eq!(first_bad(&v), Some(1), "{v:?}");
    }

    #[test]
    fn r_audit_2_sub_millisecond_times_are_refused_and_seal_truncates() {
        // given a row sealed from a time with nanoseconds; then the stored time is millis
        let ks = keys();
        let mut u = unsigned(1);
        u.time += TimeDelta::nanoseconds(123);
        let row = u.seal(&ks, "");
        assert_eq!(row.time, t(1));
        assert!(verify_chain(&ks, std::slice::from_ref(&row), &[]).is_ok());
        // when nanoseconds are added afterwards (not covered by the mac); then refused
        let mut tampered = row;
        tampered.time += TimeDelta::nanoseconds(5);
        assert_eq!(first_bad(&verify_chain(&ks, &[tampered], &[])), Some(1));
    }

    #[test]
    fn r_audit_2_verification_serializes_exactly() {
        // given both outcomes; then exactly the spec's JSON, and it parses back
        let ok = Verification::Ok { rows: 3 };
        assert_eq!(serde_json::to_value(&ok).expect("json"), json!({"ok": true, "rows": 3}));
        let bad = Verification::Broken { first_bad_seq: 2, reason: "r".into() };
        assert_eq!(serde_json::to_value(&bad).expect("json"), json!({"ok": false, "first_bad_seq": 2, "reason": "r"}));
        assert_eq!(serde_json::to_string(&ok).expect("json"), r#"{"ok":true,"rows":3}"#);
        for v in [ok, bad] {
            let back: Verification = serde_json::from_value(serde_json::to_value(&v).expect("json")).expect("parses");
            assert_eq!(back, v);
        }
        assert!(serde_json::from_value::<Verification>(json!({"ok": true})).is_err());
    }

    #[test]
    fn r_audit_1_rows_serialize_with_the_canonical_time() {
        // given a sealed row; when serialized; then all fields, time in canonical form
        let row = unsigned(1).seal(&keys(), "");
        let v = serde_json::to_value(&row).expect("json");
        assert_eq!(v["time"], json!("2026-11-30T12:00:01.250Z"));
        for field in ["seq", "time", "action", "actor", "target", "event_id", "payload_digest", "key_id", "mac"] {
            assert!(v.get(field).is_some(), "{field}");
        }
        let back: LedgerRow = serde_json::from_value(v).expect("parses");
        assert_eq!(back, row);
        assert_eq!(canonical_time(t(0)).len(), "2026-11-30T12:00:00.250Z".len());
    }

    #[test]
    fn r_audit_1_canonical_bytes_are_length_prefixed() {
        // given two rows whose actor + target concatenate identically; then bytes differ
        let mut a = unsigned(1);
        let mut b = unsigned(1);
        a.actor = "ab".into();
        a.target = "c".into();
        b.actor = "a".into();
        b.target = "bc".into();
        assert_ne!(row_bytes(&a, "k", "", RowFormat::V2), row_bytes(&b, "k", "", RowFormat::V2));
        assert_ne!(checkpoint_bytes("k1", 1, "m", 0, ""), checkpoint_bytes("k", 1, "1m", 0, ""));
        assert_ne!(checkpoint_bytes("k", 2, "ab", 1, "c"), checkpoint_bytes("k", 2, "a", 1, "bc"));
    }

    #[test]
    fn r_audit_4_key_debug_hides_secret_and_bad_keys_are_refused() {
        // given a key; when debug-printed; then only the key id shows
        let k = AuditKey::new("audit-1", &[0xCD; 32]).expect("valid");
        let text = format!("{:?}", AuditKeys::new(k, vec![]));
        assert!(text.contains("audit-1"));
        assert!(!text.to_lowercase().contains("cdcd"));
        assert!(!text.contains("205"));
        // and a short secret or an empty key id is refused
        assert_eq!(AuditKey::new("k", b"short").map(|_| ()), Err(AuditKeyError::SecretTooShort { key_id: "k".into(), len: 5, min: 32 }));
        assert_eq!(AuditKey::new("", &[1; 32]).map(|_| ()), Err(AuditKeyError::EmptyKeyId));
        // and a retired key sharing the current id is ignored
        let ks = AuditKeys::new(key("k", 1), vec![key("k", 2), key("old", 3)]);
        assert_eq!(ks.key_ids(), vec!["k", "old"]);
    }
}
