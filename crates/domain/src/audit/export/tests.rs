//! Given/when/then for exports verified offline (R-AUDIT-3).

use chrono::{TimeZone, Utc};

use super::*;
use crate::audit::{AuditKey, LedgerCheckpoint, UnsignedRow, payload_digest};

fn keyed(byte: u8) -> AuditKeys {
    AuditKeys::new(AuditKey::new("audit-1", &[byte; 32]).expect("valid key"), vec![])
}

/// A ledger of `n` rows, sealed in a chain.
fn ledger(keys: &AuditKeys, n: i64) -> Vec<LedgerRow> {
    let mut rows: Vec<LedgerRow> = Vec::new();
    for seq in 1..=n {
        let row = UnsignedRow {
            seq,
            time: Utc.with_ymd_and_hms(2026, 7, 1, 0, 0, 0).single().expect("time") + chrono::TimeDelta::minutes(seq),
            action: "box_draft.create".into(),
            actor: format!("user-{seq}"),
            target: format!("draft-{seq}"),
            event_id: format!("draft/draft-{seq}/1"),
            payload_digest: payload_digest(b"{}"),
            detail: format!("submitted box {seq}"),
        };
        let prev = rows.last().map(|r| r.mac.clone()).unwrap_or_default();
        rows.push(row.seal(keys, &prev));
    }
    rows
}

/// Signed checkpoints at `at` (seqs), each covering the rows since the previous one.
fn checkpoints(keys: &AuditKeys, rows: &[LedgerRow], at: &[i64]) -> Vec<CheckpointProof> {
    let mut out: Vec<CheckpointProof> = Vec::new();
    for &seq in at {
        let after = out.last().map_or(0, |p| p.checkpoint.seq);
        let covered = rows.iter().filter(|r| r.seq > after && r.seq <= seq).map(row_digest).collect::<Vec<_>>();
        let proof = CheckpointProof {
            checkpoint: LedgerCheckpoint {
                seq,
                head_mac: rows[usize::try_from(seq - 1).expect("seq")].mac.clone(),
                prev_seq: after,
                prev_mac: out.last().map(|p| p.checkpoint.mac.clone()).unwrap_or_default(),
                key_id: "audit-1".into(),
                mac: format!("mac-{seq}"),
            },
            signed: CheckpointSignature { covers_after: after, rows_digest: rows_digest(covered.iter().map(String::as_str)), ..Default::default() },
        };
        out.push(sign_checkpoint(keys, proof));
    }
    out
}

fn exported(rows: &[LedgerRow]) -> Vec<ExportedRow> {
    rows.iter().map(|r| ExportedRow { row: r.clone(), digest: row_digest(r) }).collect()
}

#[test]
fn given_an_intact_export_when_verified_offline_then_every_row_is_covered() {
    let keys = keyed(7);
    let rows = ledger(&keys, 6);
    let proofs = checkpoints(&keys, &rows, &[3, 6]);
    let v = verify_export(&exported(&rows), &proofs, Some(&checkpoint_public_key(&keys)));
    assert!(v.ok, "{v:?}");
    assert_eq!((v.rows, v.covered, v.public_keys.clone()), (6, 6, vec![checkpoint_public_key(&keys)]));
    // The second segment alone, as an export of a later period carries it.
    let v = verify_export(&exported(&rows[3..]), &proofs[1..], None);
    assert!(v.ok, "{v:?}");
}

#[test]
fn given_a_changed_byte_when_verified_then_the_row_is_named() {
    let keys = keyed(7);
    let rows = ledger(&keys, 6);
    let proofs = checkpoints(&keys, &rows, &[3, 6]);
    // In a row's content.
    let mut changed = exported(&rows);
    changed[4].row.detail.push('!');
    let v = verify_export(&changed, &proofs, None);
    assert_eq!((v.ok, v.first_bad_seq), (false, Some(5)), "{v:?}");
    assert!(v.reason.contains("row 5"), "{}", v.reason);
    // In the row and its stated digest together: the checkpoint no longer covers them.
    changed[4].digest = row_digest(&changed[4].row);
    let v = verify_export(&changed, &proofs, None);
    assert_eq!((v.ok, v.first_bad_seq), (false, Some(4)), "{v:?}");
    assert!(v.reason.contains("rows 4 to 6"), "{}", v.reason);
    // In a checkpoint.
    let mut forged = proofs.clone();
    let flipped = if forged[0].signed.rows_digest.starts_with('0') { "1" } else { "0" };
    forged[0].signed.rows_digest.replace_range(0..1, flipped);
    let v = verify_export(&exported(&rows), &forged, None);
    assert_eq!((v.ok, v.first_bad_seq), (false, Some(3)), "{v:?}");
}

#[test]
fn given_rows_missing_or_uncovered_or_another_key_then_the_export_does_not_verify() {
    let keys = keyed(7);
    let rows = ledger(&keys, 6);
    let proofs = checkpoints(&keys, &rows, &[3, 6]);
    let mut gap = exported(&rows);
    gap.remove(2);
    assert_eq!(verify_export(&gap, &proofs, None).first_bad_seq, Some(3));
    // Rows after the last signed checkpoint are not covered.
    let v = verify_export(&exported(&rows), &proofs[..1], None);
    assert_eq!((v.ok, v.first_bad_seq, v.covered), (false, Some(4), 3), "{v:?}");
    // Signed by someone else: the pinned key says so.
    let v = verify_export(&exported(&rows), &proofs, Some(&checkpoint_public_key(&keyed(8))));
    assert!(!v.ok && v.reason.contains("another key"), "{v:?}");
    // A checkpoint re-signed by another key over the changed rows fails the pin too.
    let other = checkpoints(&keyed(8), &rows, &[3, 6]);
    assert!(!verify_export(&exported(&rows), &other, Some(&checkpoint_public_key(&keys))).ok);
}

#[test]
fn given_a_period_then_the_export_extends_to_whole_signed_segments() {
    let signed = [(0, 3), (3, 6), (6, 10)];
    assert_eq!(export_range(4, 5, &signed), (4, 6));
    assert_eq!(export_range(5, 8, &signed), (4, 10));
    assert_eq!(export_range(1, 2, &signed), (1, 3));
    // Past the last signed checkpoint, the rows themselves.
    assert_eq!(export_range(9, 12, &signed), (7, 12));
    assert_eq!(export_range(11, 12, &signed), (11, 12));
}

#[test]
fn given_an_export_written_in_either_format_when_read_back_then_it_verifies_and_a_changed_byte_names_its_row() {
    let keys = keyed(7);
    let mut rows = ledger(&keys, 5);
    rows[1].detail = "a detail, with \"quotes\", commas\nand a new line".into();
    let rows = {
        // Re-sealed so the chain holds with the odd detail.
        let mut sealed: Vec<LedgerRow> = Vec::new();
        for r in rows {
            let prev = sealed.last().map(|p| p.mac.clone()).unwrap_or_default();
            let unsigned = UnsignedRow {
                seq: r.seq,
                time: r.time,
                action: r.action,
                actor: r.actor,
                target: r.target,
                event_id: r.event_id,
                payload_digest: r.payload_digest,
                detail: r.detail,
            };
            sealed.push(unsigned.seal(&keys, &prev));
        }
        sealed
    };
    let proofs = checkpoints(&keys, &rows, &[2, 5]);
    for format in [Format::Jsonl, Format::Csv] {
        let mut text = if format == Format::Csv { csv_header() } else { "{\"type\":\"export\"}\n".to_owned() };
        for (i, r) in exported(&rows).into_iter().enumerate() {
            text.push_str(&write_line(&Line::Row(r), format));
            if let Some(p) = proofs.iter().find(|p| p.checkpoint.seq == i64::try_from(i).expect("small") + 1) {
                text.push_str(&write_line(&Line::Checkpoint(p.clone()), format));
            }
        }
        let v = verify_export_text(&text, Some(&checkpoint_public_key(&keys))).expect("reads");
        assert!(v.ok && v.rows == 5, "{format:?}: {v:?}");
        let changed = text.replacen("user-4", "user-X", 1);
        let v = verify_export_text(&changed, None).expect("reads");
        assert_eq!((v.ok, v.first_bad_seq), (false, Some(4)), "{format:?}: {v:?}");
    }
    assert!(parse_export("{\"type\":\"row\"}\n").is_err_and(|e| e.line == 1));
}
