//! A ledger that leaves the cluster and can still be checked (R-AUDIT-3): signed
//! checkpoints and the offline verification of an export.
//!
//! Row MACs need the operator's HMAC key, which never leaves the audit service. So each
//! checkpoint is also signed with an Ed25519 key derived from that HMAC key: the statement
//! names the checkpoint (its seq, head MAC and HMAC chain) and the SHA-256 of the rows it
//! covers — every row after the previous *signed* checkpoint (the first signed checkpoint
//! covers the whole ledger before it). An export carries its rows, each with its digest,
//! and the signed checkpoints that cover them; [`verify_export`] needs nothing but the
//! export (and, to be sure whose signature it is, the public key the operator published).
//!
//! A changed byte is named: in a row, its digest no longer matches (or its stated digest
//! changed and no longer matches the row); in a checkpoint, its signature fails.

use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use crate::aggregates::audit_ledger::CheckpointSignature;

use super::{AuditKeys, LedgerCheckpoint, LedgerRow};

/// Domain separation for checkpoint signatures.
pub const SIGNED_CHECKPOINT_TAG: &str = "atasira.audit-checkpoint-signature.v1";

/// A signed checkpoint as an export carries it: the checkpoint and its signature.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointProof {
    #[serde(flatten)]
    pub checkpoint: LedgerCheckpoint,
    #[serde(flatten)]
    pub signed: CheckpointSignature,
}

/// The digest of one exported row: lowercase hex SHA-256 of its JSON form (every field,
/// its MAC included, the time in the ledger's canonical form).
pub fn row_digest(row: &LedgerRow) -> String {
    hex::encode(Sha256::digest(serde_json::to_vec(row).unwrap_or_default()))
}

/// The digest a signed checkpoint covers: SHA-256 over its rows' digests, one per line.
pub fn rows_digest<'a>(digests: impl IntoIterator<Item = &'a str>) -> String {
    let mut hash = RowsDigest::default();
    for d in digests {
        hash.push(d);
    }
    hash.finish()
}

/// [`rows_digest`] taken one row digest at a time, so that its rows need not be held at
/// once.
#[derive(Debug, Default, Clone)]
pub struct RowsDigest(Sha256);

impl RowsDigest {
    pub fn push(&mut self, row_digest: &str) {
        self.0.update(row_digest.as_bytes());
        self.0.update(b"\n");
    }

    pub fn finish(self) -> String {
        hex::encode(self.0.finalize())
    }
}

/// The bytes a checkpoint's signature covers.
fn statement(p: &CheckpointProof) -> Vec<u8> {
    let s = &p.signed;
    format!(
        "{SIGNED_CHECKPOINT_TAG}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
        p.checkpoint.seq,
        p.checkpoint.head_mac,
        p.checkpoint.prev_seq,
        p.checkpoint.prev_mac,
        p.checkpoint.key_id,
        p.checkpoint.mac,
        s.covers_after,
        s.rows_digest,
        s.public_key
    )
    .into_bytes()
}

/// The Ed25519 key the checkpoints of the current audit key are signed with: derived
/// from it, so every replica has the same and none is stored.
fn signing_key(keys: &AuditKeys) -> SigningKey {
    let seed = keys.derive(keys.current_key_id(), "checkpoint-signing").and_then(|hex| hex::decode(hex).ok()).unwrap_or_default();
    let mut bytes = [0u8; 32];
    bytes.copy_from_slice(&seed[..32.min(seed.len())]);
    SigningKey::from_bytes(&bytes)
}

/// The public key checkpoints are signed with now (lowercase hex): what an operator gives
/// an auditor to pin.
pub fn checkpoint_public_key(keys: &AuditKeys) -> String {
    hex::encode(signing_key(keys).verifying_key().to_bytes())
}

/// Signs the checkpoint `proof` (its `signed` part filled but for the key and signature)
/// with the current audit key's checkpoint key.
pub fn sign_checkpoint(keys: &AuditKeys, mut proof: CheckpointProof) -> CheckpointProof {
    let key = signing_key(keys);
    proof.signed.public_key = hex::encode(key.verifying_key().to_bytes());
    proof.signed.signature = hex::encode(key.sign(&statement(&proof)).to_bytes());
    proof
}

/// Whether `proof`'s signature verifies with the key it names.
fn signature_verifies(proof: &CheckpointProof) -> bool {
    let key = hex::decode(&proof.signed.public_key).ok().and_then(|b| <[u8; 32]>::try_from(b).ok()).and_then(|b| VerifyingKey::from_bytes(&b).ok());
    let signature = hex::decode(&proof.signed.signature).ok().and_then(|b| <[u8; 64]>::try_from(b).ok()).map(|b| Signature::from_bytes(&b));
    match (key, signature) {
        (Some(key), Some(signature)) => key.verify(&statement(proof), &signature).is_ok(),
        _ => false,
    }
}

/// The seqs an export of rows `lo..=hi` holds, so that each row is in a whole segment of
/// a signed checkpoint (`signed`: each one's `(covers_after, seq)`, in order): from the
/// start of the first segment that reaches `lo` to the end of the first that reaches
/// `hi`. Rows after the last signed checkpoint have none.
pub fn export_range(lo: i64, hi: i64, signed: &[(i64, i64)]) -> (i64, i64) {
    let start = signed.iter().find(|(_, seq)| *seq >= lo).map_or(lo, |(after, _)| (after + 1).min(lo));
    let end = signed.iter().find(|(_, seq)| *seq >= hi).map_or(hi, |(_, seq)| *seq);
    (start, end)
}

/// One exported row: the row and its stated digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportedRow {
    #[serde(flatten)]
    pub row: LedgerRow,
    pub digest: String,
}

/// What [`verify_export`] found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExportVerification {
    pub ok: bool,
    /// Rows in the export.
    pub rows: u64,
    /// Rows a verified signature covers.
    pub covered: u64,
    /// The public keys whose signatures verified.
    pub public_keys: Vec<String>,
    /// The first row or checkpoint that does not verify (its seq), when one does not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_bad_seq: Option<i64>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// Verifies an export offline (R-AUDIT-3): every row's digest, each signed checkpoint's
/// signature (by `pinned` when given) over its rows, and that every row is covered. Rows
/// come in seq order, without gaps.
pub fn verify_export(rows: &[ExportedRow], proofs: &[CheckpointProof], pinned: Option<&str>) -> ExportVerification {
    let mut result = ExportVerification { ok: false, rows: rows.len() as u64, covered: 0, public_keys: Vec::new(), first_bad_seq: None, reason: String::new() };
    let broken = |mut r: ExportVerification, seq: i64, reason: String| {
        r.first_bad_seq = Some(seq);
        r.reason = reason;
        r
    };
    for pair in rows.windows(2) {
        if pair[1].row.seq != pair[0].row.seq + 1 {
            return broken(result, pair[0].row.seq + 1, format!("row {} is missing from the export", pair[0].row.seq + 1));
        }
    }
    for r in rows {
        if row_digest(&r.row) != r.digest {
            return broken(result, r.row.seq, format!("row {} does not match its digest: it was changed", r.row.seq));
        }
    }
    let (first, last) = match (rows.first(), rows.last()) {
        (Some(f), Some(l)) => (f.row.seq, l.row.seq),
        _ => {
            result.ok = true;
            return result;
        }
    };
    let mut covered_to = first - 1;
    let mut proofs: Vec<&CheckpointProof> = proofs.iter().collect();
    proofs.sort_by_key(|p| p.checkpoint.seq);
    for p in proofs {
        if !signature_verifies(p) {
            return broken(result, p.checkpoint.seq, format!("the checkpoint at row {} does not verify: its signature fails", p.checkpoint.seq));
        }
        if pinned.is_some_and(|k| !k.eq_ignore_ascii_case(&p.signed.public_key)) {
            return broken(result, p.checkpoint.seq, format!("the checkpoint at row {} is signed by another key ({})", p.checkpoint.seq, p.signed.public_key));
        }
        if p.signed.covers_after < first - 1 || p.checkpoint.seq > last {
            return broken(result, p.checkpoint.seq, format!("the export does not hold every row the checkpoint at row {} covers", p.checkpoint.seq));
        }
        let mut segment = rows.iter().filter(|r| r.row.seq > p.signed.covers_after && r.row.seq <= p.checkpoint.seq);
        if rows_digest(segment.clone().map(|r| r.digest.as_str())) != p.signed.rows_digest {
            let bad = p.signed.covers_after + 1;
            return broken(result, bad, format!("rows {bad} to {} are not the rows the checkpoint at row {} signed", p.checkpoint.seq, p.checkpoint.seq));
        }
        if segment.next_back().is_none_or(|r| r.row.mac != p.checkpoint.head_mac) {
            return broken(result, p.checkpoint.seq, format!("row {} is not the head the checkpoint signed", p.checkpoint.seq));
        }
        if p.signed.covers_after <= covered_to {
            covered_to = covered_to.max(p.checkpoint.seq);
        }
        if !result.public_keys.contains(&p.signed.public_key) {
            result.public_keys.push(p.signed.public_key.clone());
        }
    }
    result.covered = u64::try_from((covered_to - first + 1).max(0)).unwrap_or(0);
    if covered_to < last {
        return broken(result, covered_to + 1, format!("rows {} to {last} are covered by no signed checkpoint", covered_to + 1));
    }
    result.ok = true;
    result
}

/// How an export is written: JSON lines, or CSV with a header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Jsonl,
    Csv,
}

/// The CSV columns: a row's, a checkpoint's, and `type` saying which a line is.
pub const CSV_COLUMNS: &[&str] = &[
    "type",
    "seq",
    "time",
    "action",
    "actor",
    "target",
    "event_id",
    "payload_digest",
    "detail",
    "key_id",
    "mac",
    "digest",
    "head_mac",
    "prev_seq",
    "prev_mac",
    "covers_after",
    "rows_digest",
    "public_key",
    "signature",
];

/// One line of an export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    Row(ExportedRow),
    Checkpoint(CheckpointProof),
}

fn csv_record(fields: &[String]) -> String {
    let mut w = csv::WriterBuilder::new().quote_style(csv::QuoteStyle::Necessary).from_writer(Vec::new());
    let _ = w.write_record(fields);
    String::from_utf8(w.into_inner().unwrap_or_default()).unwrap_or_default()
}

/// The CSV header line.
pub fn csv_header() -> String {
    csv_record(&CSV_COLUMNS.iter().map(|c| (*c).to_owned()).collect::<Vec<_>>())
}

/// `line` in `format`, ending with a newline.
pub fn write_line(line: &Line, format: Format) -> String {
    match (format, line) {
        (Format::Jsonl, Line::Row(r)) => tagged("row", r),
        (Format::Jsonl, Line::Checkpoint(c)) => tagged("checkpoint", c),
        (Format::Csv, Line::Row(e)) => {
            let r = &e.row;
            let mut fields = vec!["row".to_owned(), r.seq.to_string(), super::canonical_time(r.time), r.action.clone(), r.actor.clone(), r.target.clone()];
            fields.extend([r.event_id.clone(), r.payload_digest.clone(), r.detail.clone(), r.key_id.clone(), r.mac.clone(), e.digest.clone()]);
            fields.resize(CSV_COLUMNS.len(), String::new());
            csv_record(&fields)
        }
        (Format::Csv, Line::Checkpoint(c)) => {
            let mut fields = vec!["checkpoint".to_owned(), c.checkpoint.seq.to_string()];
            fields.resize(9, String::new());
            fields.extend([
                c.checkpoint.key_id.clone(),
                c.checkpoint.mac.clone(),
                String::new(),
                c.checkpoint.head_mac.clone(),
                c.checkpoint.prev_seq.to_string(),
                c.checkpoint.prev_mac.clone(),
            ]);
            let s = &c.signed;
            fields.extend([s.covers_after.to_string(), s.rows_digest.clone(), s.public_key.clone(), s.signature.clone()]);
            csv_record(&fields)
        }
    }
}

fn tagged<T: Serialize>(kind: &str, value: &T) -> String {
    let mut v = serde_json::to_value(value).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("type".to_owned(), kind.into());
    }
    format!("{v}\n")
}

/// Why an export could not be read: the line (from 1) and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct ParseError {
    pub line: usize,
    pub reason: String,
}

/// Reads an export (either format: CSV starts with its header), skipping its `export`
/// header line; the rows and checkpoints in the order written.
pub fn parse_export(text: &str) -> Result<Vec<Line>, ParseError> {
    if text.starts_with("type,") {
        return parse_csv(text);
    }
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |reason: String| ParseError { line: i + 1, reason };
        let value: serde_json::Value = serde_json::from_str(line).map_err(|e| bad(format!("not JSON: {e}")))?;
        match value["type"].as_str() {
            Some("row") => lines.push(Line::Row(serde_json::from_value(value).map_err(|e| bad(format!("not a ledger row: {e}")))?)),
            Some("checkpoint") => lines.push(Line::Checkpoint(serde_json::from_value(value).map_err(|e| bad(format!("not a checkpoint: {e}")))?)),
            Some("export") => {}
            other => return Err(bad(format!("unknown line type {other:?}"))),
        }
    }
    Ok(lines)
}

fn parse_csv(text: &str) -> Result<Vec<Line>, ParseError> {
    let mut reader = csv::ReaderBuilder::new().has_headers(true).from_reader(text.as_bytes());
    let mut lines = Vec::new();
    for (i, record) in reader.records().enumerate() {
        let bad = |reason: String| ParseError { line: i + 2, reason };
        let record = record.map_err(|e| bad(format!("not CSV: {e}")))?;
        let field = |name: &str| CSV_COLUMNS.iter().position(|c| *c == name).and_then(|at| record.get(at)).unwrap_or_default().to_owned();
        let number = |name: &str| field(name).parse::<i64>().map_err(|_| bad(format!("{name} is not a number")));
        match field("type").as_str() {
            "row" => {
                let time =
                    chrono::DateTime::parse_from_rfc3339(&field("time")).map_err(|_| bad("time is not an RFC 3339 time".into()))?.with_timezone(&chrono::Utc);
                let row = LedgerRow {
                    seq: number("seq")?,
                    time,
                    action: field("action"),
                    actor: field("actor"),
                    target: field("target"),
                    event_id: field("event_id"),
                    payload_digest: field("payload_digest"),
                    detail: field("detail"),
                    key_id: field("key_id"),
                    mac: field("mac"),
                };
                lines.push(Line::Row(ExportedRow { row, digest: field("digest") }));
            }
            "checkpoint" => lines.push(Line::Checkpoint(CheckpointProof {
                checkpoint: LedgerCheckpoint {
                    seq: number("seq")?,
                    head_mac: field("head_mac"),
                    prev_seq: number("prev_seq")?,
                    prev_mac: field("prev_mac"),
                    key_id: field("key_id"),
                    mac: field("mac"),
                },
                signed: CheckpointSignature {
                    covers_after: number("covers_after")?,
                    rows_digest: field("rows_digest"),
                    public_key: field("public_key"),
                    signature: field("signature"),
                },
            })),
            "export" => {}
            other => return Err(bad(format!("unknown line type {other:?}"))),
        }
    }
    Ok(lines)
}

/// Verifies the text of an export ([`parse_export`], then [`verify_export`]).
pub fn verify_export_text(text: &str, pinned: Option<&str>) -> Result<ExportVerification, ParseError> {
    let (mut rows, mut proofs) = (Vec::new(), Vec::new());
    for line in parse_export(text)? {
        match line {
            Line::Row(r) => rows.push(r),
            Line::Checkpoint(c) => proofs.push(c),
        }
    }
    Ok(verify_export(&rows, &proofs, pinned))
}

#[cfg(test)]
mod tests;
