//! The audit ledger's pure rules (R-AUDIT-1, R-AUDIT-2, R-AUDIT-4): canonical rows, the HMAC chain, verification.
//!
//! Why a chain: each row's HMAC-SHA256 covers the row's canonical bytes AND the previous
//! row's MAC, so a row cannot be modified, removed, inserted or moved without breaking the
//! MAC of that row or of the row after it. Only a removed tail leaves an intact chain; it is
//! caught against the latest signed checkpoint (seq + head MAC) that the audit service
//! records as an `AuditCheckpoint` event in the append-only event store.
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

type HmacSha256 = Hmac<Sha256>;

/// Domain separation for row MACs: a MAC made by the same key for another purpose (a
/// checkpoint, a future row format) can never pass as a row MAC.
pub const ROW_PURPOSE_TAG: &str = "atasira.audit-row.v1";

/// Domain separation for checkpoint MACs.
pub const CHECKPOINT_PURPOSE_TAG: &str = "atasira.audit-checkpoint.v1";

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
    /// The id of the key that made `mac`.
    pub key_id: String,
    /// Lowercase hex of the HMAC-SHA256 over the canonical row and the previous row's MAC.
    pub mac: String,
}

/// The latest signed checkpoint as recorded by an `AuditCheckpoint` event (R-AUDIT-2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerCheckpoint {
    /// The ledger's last seq when the checkpoint was taken.
    pub seq: i64,
    /// The MAC of the row at `seq`.
    pub head_mac: String,
    pub key_id: String,
    /// [`checkpoint_mac`] of `(seq, head_mac)` by `key_id`.
    pub mac: String,
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
/// aggregate is not mistaken for an auditable one. `WorkerCreated` has no aggregate yet;
/// it is accepted from any aggregate type but `audit_ledger`.
pub fn action_of(aggregate_type: &str, event_type: &str) -> Option<&'static str> {
    let action = match (aggregate_type, event_type) {
        ("draft", "DraftSubmitted") => "box_draft.create",
        ("draft", "DraftApproved") => "box_draft.approve",
        ("draft", "DraftRejected") => "box_draft.reject",
        ("draft", "DraftWithdrawn") => "box_draft.withdraw",
        ("draft", "DraftExpired") => "box_draft.expire",
        ("box", "BoxActivated") => "box.activate",
        ("box", "BoxUserAssigned") => "box.assign",
        ("box", "BoxManifestEdited") => "box.manifest_edit",
        ("box", "BoxConfigEdited") => "box.config_edit",
        ("box", "BoxStopped") => "box.stop",
        ("box", "BoxResumed") => "box.resume",
        ("box", "BoxArchived") => "box.archive",
        ("access", "AccessProvisioned") => "access.provision",
        ("access", "AccessProvisionFailed") => "access.provision_failed",
        (t, "SecurityViolation") if crate::aggregates::types::SECURITY.contains(&t) => "security_violation",
        (t, "WorkerCreated") if t != "audit_ledger" => "worker.create",
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
        "DraftApproved" => (&[&["approved_by"]], &[&["draft_id"]]),
        "DraftRejected" => (&[&["rejected_by"]], &[&["draft_id"]]),
        "DraftWithdrawn" => (&[&["withdrawn_by"]], &[&["draft_id"]]),
        "DraftExpired" => (&[], &[&["draft_id"]]),
        "BoxActivated" => (&[&["approved_by"]], &[&["box_id"]]),
        "BoxUserAssigned" => (&[&["assigned_by"]], &[&["box_id"]]),
        "BoxManifestEdited" | "BoxConfigEdited" => (&[&["edited_by"]], &[&["box_id"]]),
        "BoxStopped" | "BoxResumed" | "BoxArchived" => (&[&["by"]], &[&["box_id"]]),
        "AccessProvisioned" | "AccessProvisionFailed" => (&[], &[&["box_id"]]),
        "SecurityViolation" => (&[&["actor"]], &[&["target"]]),
        "WorkerCreated" => (&[&["created_by"], &["created_by", "user_id"], &["by"]], &[&["worker_id"], &["box_id"]]),
        _ => (&[&["by"], &["actor"]], &[&["target"]]),
    };
    let actor = actor_paths.iter().find_map(|p| text(p)).unwrap_or_else(|| "system".to_owned());
    let target = target_paths.iter().find_map(|p| text(p)).unwrap_or_else(|| aggregate_id.to_owned());
    (actor, target)
}

/// The MACed bytes of a row: purpose tag, then seq (i64 big-endian), time
/// ([`canonical_time`]), action, actor, target, event id, payload digest, key id and the
/// previous row's MAC (hex text, empty for seq 1), each prefixed by its u32 big-endian
/// length so that no two distinct rows share an encoding.
fn row_bytes(row: &UnsignedRow, key_id: &str, prev_mac: &str) -> Vec<u8> {
    let time = canonical_time(row.time);
    let mut out = Vec::with_capacity(
        128 + time.len()
            + row.action.len()
            + row.actor.len()
            + row.target.len()
            + row.event_id.len()
            + row.payload_digest.len()
            + key_id.len()
            + prev_mac.len(),
    );
    push_item(&mut out, ROW_PURPOSE_TAG.as_bytes());
    push_item(&mut out, &row.seq.to_be_bytes());
    push_item(&mut out, time.as_bytes());
    push_item(&mut out, row.action.as_bytes());
    push_item(&mut out, row.actor.as_bytes());
    push_item(&mut out, row.target.as_bytes());
    push_item(&mut out, row.event_id.as_bytes());
    push_item(&mut out, row.payload_digest.as_bytes());
    push_item(&mut out, key_id.as_bytes());
    push_item(&mut out, prev_mac.as_bytes());
    out
}

fn checkpoint_bytes(key_id: &str, seq: i64, head_mac: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + key_id.len() + head_mac.len());
    push_item(&mut out, CHECKPOINT_PURPOSE_TAG.as_bytes());
    push_item(&mut out, key_id.as_bytes());
    push_item(&mut out, &seq.to_be_bytes());
    push_item(&mut out, head_mac.as_bytes());
    out
}

/// The row's MAC by the current key (whose id the canonical bytes include), chained to
/// `prev_mac`, the previous row's MAC (empty for seq 1). Prefer [`UnsignedRow::seal`],
/// which also truncates the time to what the canonical form carries.
pub fn row_mac(keys: &AuditKeys, row: &UnsignedRow, prev_mac: &str) -> String {
    keys.current.tag_hex(&row_bytes(row, &keys.current.key_id, prev_mac))
}

/// The MAC of a checkpoint `(seq, head_mac)` by the current key, for the `AuditCheckpoint`
/// event (whose `key_id` is [`AuditKeys::current_key_id`]).
pub fn checkpoint_mac(keys: &AuditKeys, seq: i64, head_mac: &str) -> String {
    keys.current.tag_hex(&checkpoint_bytes(&keys.current.key_id, seq, head_mac))
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

/// Verifies a ledger (R-AUDIT-2): `rows` as stored, in seq order, and the latest signed
/// checkpoint, if any. Names the first bad seq:
///
/// - a seq that is not the previous one + 1 (a deleted, inserted or moved row),
/// - a row under an unknown key id, with a malformed MAC, or whose MAC does not match its
///   fields and the previous row's MAC (modified, inserted or reordered rows),
/// - a checkpoint whose own MAC does not verify (forged),
/// - fewer rows than the checkpoint covers, or a row at the checkpoint's seq that does not
///   carry its head MAC (a removed or replaced tail).
pub fn verify_chain(keys: &AuditKeys, rows: &[LedgerRow], latest_checkpoint: Option<&LedgerCheckpoint>) -> Verification {
    let mut prev_mac = "";
    let mut expected = 1i64;
    for row in rows {
        if row.seq != expected {
            return if row.seq > expected {
                Verification::broken(expected, format!("row {expected} is missing or out of order: the ledger goes on with seq {}", row.seq))
            } else {
                Verification::broken(row.seq, format!("seq {} appears again or out of order after seq {}", row.seq, expected - 1))
            };
        }
        if row.time.nanosecond() % 1_000_000 != 0 {
            return Verification::broken(row.seq, "the row's time carries sub-millisecond digits, which its mac does not cover");
        }
        let Some(key) = keys.get(&row.key_id) else {
            return Verification::broken(row.seq, format!("the row is MACed with unknown key id {:?}", row.key_id));
        };
        let unsigned = UnsignedRow {
            seq: row.seq,
            time: row.time,
            action: row.action.clone(),
            actor: row.actor.clone(),
            target: row.target.clone(),
            event_id: row.event_id.clone(),
            payload_digest: row.payload_digest.clone(),
        };
        match key.verifies(&row_bytes(&unsigned, &row.key_id, prev_mac), &row.mac) {
            Ok(()) => {}
            Err(MacProblem::Malformed) => return Verification::broken(row.seq, "the row's mac is not 64 lowercase hex characters"),
            Err(MacProblem::Mismatch) => {
                return Verification::broken(row.seq, "the row's mac does not match its fields and the previous row's mac: modified, inserted or reordered");
            }
        }
        prev_mac = &row.mac;
        expected += 1;
    }
    let last_seq = expected - 1;
    if let Some(cp) = latest_checkpoint {
        let Some(key) = keys.get(&cp.key_id) else {
            return Verification::broken(cp.seq, format!("the latest checkpoint is MACed with unknown key id {:?}", cp.key_id));
        };
        if key.verifies(&checkpoint_bytes(&cp.key_id, cp.seq, &cp.head_mac), &cp.mac).is_err() {
            return Verification::broken(cp.seq, "the latest checkpoint's mac does not verify: forged checkpoint");
        }
        if cp.seq > last_seq {
            return Verification::broken(
                last_seq + 1,
                format!("the ledger ends at seq {last_seq} but the latest checkpoint covers seq {}: rows were removed from the tail", cp.seq),
            );
        }
        if cp.seq >= 1 {
            // In range: rows[0..last_seq] hold seqs 1..=last_seq in order.
            let at = usize::try_from(cp.seq - 1).ok().and_then(|i| rows.get(i));
            if !at.is_some_and(|row| macs_equal(&row.mac, &cp.head_mac)) {
                return Verification::broken(cp.seq, format!("row {} does not carry the latest checkpoint's head mac: the tail was replaced", cp.seq));
            }
        }
    }
    Verification::Ok { rows: rows.len() as u64 }
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
        }
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

    fn checkpoint_of(keys: &AuditKeys, rows: &[LedgerRow]) -> LedgerCheckpoint {
        let last = rows.last().expect("a row");
        LedgerCheckpoint { seq: last.seq, head_mac: last.mac.clone(), key_id: keys.current_key_id().into(), mac: checkpoint_mac(keys, last.seq, &last.mac) }
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
            ("access", "AccessProvisioned", Some("access.provision")),
            ("access", "AccessProvisionFailed", Some("access.provision_failed")),
            ("approval_security", "SecurityViolation", Some("security_violation")),
            ("registry_security", "SecurityViolation", Some("security_violation")),
            ("drafts_security", "SecurityViolation", Some("security_violation")),
            ("audit_security", "SecurityViolation", Some("security_violation")),
            ("provisioner_security", "SecurityViolation", Some("security_violation")),
            ("draft", "SecurityViolation", None),
            ("worker", "WorkerCreated", Some("worker.create")),
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
        let violation = json!({"SecurityViolation": {"actor": "mallory", "target": "d9", "kind": "self_approval"}});
        assert_eq!(actor_and_target("SecurityViolation", "x", &violation), ("mallory".into(), "d9".into()));
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
        assert_eq!(verify_chain(&ks, &rows, Some(&checkpoint_of(&ks, &rows))), Verification::Ok { rows: 5 });
        assert_eq!(verify_chain(&ks, &rows, None), Verification::Ok { rows: 5 });
        // and an empty ledger without a checkpoint is ok with 0 rows
        assert_eq!(verify_chain(&ks, &[], None), Verification::Ok { rows: 0 });
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
            let v = verify_chain(&ks, &tampered, None);
            assert_eq!(first_bad(&v), Some(2), "{v:?}");
        }
    }

    #[test]
    fn r_audit_2_a_deleted_middle_row_is_named() {
        // given a 3-row chain; when row 2 is deleted; then seq 2 is named as missing
        let ks = keys();
        let mut rows = ledger(&ks, 3);
        rows.remove(1);
        let v = verify_chain(&ks, &rows, None);
        assert_eq!(first_bad(&v), Some(2), "{v:?}");
        // and renumbering the rest to hide the gap breaks the mac of the moved row
        rows[1].seq = 2;
        assert_eq!(first_bad(&verify_chain(&ks, &rows, None)), Some(2));
        // and deleting the first row is a missing seq 1
        let rows = ledger(&ks, 3);
        assert_eq!(first_bad(&verify_chain(&ks, &rows[1..], None)), Some(1));
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
        assert_eq!(first_bad(&verify_chain(&ks, &inserted, None)), Some(2));
        // when a row repeats a seq; then that seq is named
        let duplicated = vec![rows[0].clone(), rows[1].clone(), rows[1].clone(), rows[2].clone()];
        assert_eq!(first_bad(&verify_chain(&ks, &duplicated, None)), Some(2));
        // when a forged row is appended at the end; then its seq is named
        let mut appended = rows.clone();
        appended.push(unsigned(4).seal(&forger, &rows[2].mac));
        assert_eq!(first_bad(&verify_chain(&ks, &appended, None)), Some(4));
    }

    #[test]
    fn r_audit_2_reordered_rows_are_named() {
        // given a 4-row chain; when rows 2 and 3 swap places; then seq 2 is named
        let ks = keys();
        let rows = ledger(&ks, 4);
        let swapped = vec![rows[0].clone(), rows[2].clone(), rows[1].clone(), rows[3].clone()];
        assert_eq!(first_bad(&verify_chain(&ks, &swapped, None)), Some(2));
        // and when their seqs are swapped too (as stored, read by seq); then the mac breaks
        let mut renumbered = swapped;
        renumbered[1].seq = 2;
        renumbered[2].seq = 3;
        assert_eq!(first_bad(&verify_chain(&ks, &renumbered, None)), Some(2));
    }

    #[test]
    fn r_audit_2_a_removed_tail_is_caught_by_the_checkpoint() {
        // given a 5-row chain checkpointed at seq 5
        let ks = keys();
        let rows = ledger(&ks, 5);
        let cp = checkpoint_of(&ks, &rows);
        // when rows 4 and 5 are removed; then the chain alone is fine but seq 4 is named
        assert!(verify_chain(&ks, &rows[..3], None).is_ok());
        let v = verify_chain(&ks, &rows[..3], Some(&cp));
        assert_eq!(first_bad(&v), Some(4), "{v:?}");
        // when every row is removed; then seq 1 is named
        assert_eq!(first_bad(&verify_chain(&ks, &[], Some(&cp))), Some(1));
        // rows added after the checkpoint are fine
        let longer = ledger(&ks, 7);
        assert_eq!(verify_chain(&ks, &longer, Some(&cp)), Verification::Ok { rows: 7 });
    }

    #[test]
    fn r_audit_2_a_tail_that_does_not_carry_the_head_mac_is_named() {
        // given a checkpoint over seq 3 of one ledger; when verifying another chain of
        // the same length (a rewritten tail); then seq 3 is named
        let ks = keys();
        let rows = ledger(&ks, 3);
        let mut cp = checkpoint_of(&ks, &rows);
        cp.head_mac = "ab".repeat(32);
        cp.mac = checkpoint_mac(&ks, cp.seq, &cp.head_mac);
        let v = verify_chain(&ks, &rows, Some(&cp));
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
        by_forger.mac = checkpoint_mac(&forger, cp.seq, &cp.head_mac);
        let mut unknown = cp.clone();
        unknown.key_id = "nobody".into();
        for forged in [higher, other_head, bad_mac, by_forger, unknown] {
            let v = verify_chain(&ks, &rows, Some(&forged));
            let Verification::Broken { first_bad_seq, reason } = &v else { panic!("forged checkpoint accepted: {forged:?}") };
            assert_eq!(*first_bad_seq, forged.seq);
            assert!(reason.contains("checkpoint"), "{reason}");
        }
        // and a checkpoint mac is not a row mac (domain separation)
        assert_ne!(checkpoint_mac(&ks, 1, &rows[0].mac), rows[1].mac);
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
        let cp = checkpoint_of(&rotated, &rows);
        // then the whole ledger verifies, old rows under the old id, new ones under the new
        assert_eq!(verify_chain(&rotated, &rows, Some(&cp)), Verification::Ok { rows: 4 });
        assert_eq!(rows[0].key_id, "audit-old");
        assert_eq!(rows[3].key_id, "audit-new");
        assert_eq!(rotated.key_ids(), vec!["audit-new", "audit-old"]);
        // and a checkpoint by the old key still verifies after rotation
        let old_cp = checkpoint_of(&old, &rows[..2]);
        assert!(verify_chain(&rotated, &rows, Some(&old_cp)).is_ok());
    }

    #[test]
    fn r_audit_4_an_unknown_key_id_is_named() {
        // given rows by audit-old; when the verifier only knows audit-new; then seq 1 named
        let old = AuditKeys::new(key("audit-old", 1), vec![]);
        let rows = ledger(&old, 2);
        let v = verify_chain(&keys(), &rows, None);
        let Verification::Broken { first_bad_seq, reason } = v else { panic!("unknown key accepted") };
        assert_eq!(first_bad_seq, 1);
        assert!(reason.contains("unknown key id"), "{reason}");
        // and relabelling a row with another known key id breaks its mac
        let rotated = AuditKeys::new(key("audit-new", 2), vec![key("audit-old", 1)]);
        let mut relabelled = rows;
        relabelled[1].key_id = "audit-new".into();
        assert_eq!(first_bad(&verify_chain(&rotated, &relabelled, None)), Some(2));
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
        let v = verify_chain(&ks, &rows, None);
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
        assert!(verify_chain(&ks, std::slice::from_ref(&row), None).is_ok());
        // when nanoseconds are added afterwards (not covered by the mac); then refused
        let mut tampered = row;
        tampered.time += TimeDelta::nanoseconds(5);
        assert_eq!(first_bad(&verify_chain(&ks, &[tampered], None)), Some(1));
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
        assert_ne!(row_bytes(&a, "k", ""), row_bytes(&b, "k", ""));
        assert_ne!(checkpoint_bytes("k1", 1, "m"), checkpoint_bytes("k", 1, "1m"));
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
