//! Key settings, one format for the approval signing key and the audit MAC key:
//! `ID:HEX[,ID:HEX...]`. The first key is current (it signs or MACs);
//! the others are retired and only verify, so rotation never breaks what an older key
//! signed. A bare `HEX` (the format before key ids were configurable) is the kind's
//! default id (`approval-1`, `audit-1`). Principal assertion keys have no setting: each
//! signing process draws its own and publishes the public half in the store.
//!
//! `atasira keys rotate` prints the next setting of one key: a fresh current key, the
//! present keys kept as retired. Secrets never reach an error message or a log line; only
//! key ids do.

use std::fmt;

use anyhow::Context;
use atasira_domain::audit::{AuditKey, AuditKeys};
use atasira_domain::token::{ApprovalSigner, PublicKeyEntry};
use clap::Subcommand;

/// Longest key id accepted.
const MAX_ID_LEN: usize = 64;

/// Which key a setting is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyKind {
    /// The approval service's Ed25519 signing key (the approval service only).
    Approval,
    /// The audit ledger's MAC key (the audit service and `atasira audit verify`).
    Audit,
}

impl KeyKind {
    /// The id a bare hex key gets: the id these keys had before ids were configurable.
    pub fn default_id(self) -> &'static str {
        match self {
            KeyKind::Approval => "approval-1",
            KeyKind::Audit => "audit-1",
        }
    }

    /// The variable (and flag) that holds the setting, for messages.
    pub fn setting(self) -> &'static str {
        match self {
            KeyKind::Approval => "ATASIRA_APPROVAL_KEY (--approval-key, --approval-key-file)",
            KeyKind::Audit => "ATASIRA_AUDIT_KEY (--audit-key)",
        }
    }

    fn name(self) -> &'static str {
        match self {
            KeyKind::Approval => "approval",
            KeyKind::Audit => "audit",
        }
    }

    /// Ed25519 seeds are exactly 32 bytes; HMAC keys are at least 32.
    fn check_len(self, len: usize) -> Result<(), String> {
        match self {
            KeyKind::Approval if len != 32 => Err(format!("has {len} bytes; an approval key is exactly 32 bytes (64 hex digits)")),
            KeyKind::Audit if len < 32 => Err(format!("has {len} bytes; at least 32 (64 hex digits) are required")),
            _ => Ok(()),
        }
    }
}

/// One key: its id and its secret bytes.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyEntry {
    pub id: String,
    secret: Vec<u8>,
}

/// Never prints the secret.
impl fmt::Debug for KeyEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyEntry").field("id", &self.id).finish_non_exhaustive()
    }
}

/// A parsed key setting: the current key and the retired ones, in the order given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySetting {
    pub kind: KeyKind,
    pub current: KeyEntry,
    pub retired: Vec<KeyEntry>,
}

fn valid_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && id.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl KeySetting {
    /// Parses `ID:HEX[,ID:HEX...]` (entries may also be on separate lines, as in a key
    /// file). Errors name the entry and its id, never its secret.
    pub fn parse(kind: KeyKind, text: &str) -> anyhow::Result<KeySetting> {
        let what = format!("the {} key setting {}", kind.name(), kind.setting());
        let mut entries: Vec<KeyEntry> = Vec::new();
        for (n, raw) in text.split([',', '\n']).map(str::trim).filter(|s| !s.is_empty()).enumerate() {
            let (id, hex_text) = match raw.split_once(':') {
                Some((id, hex_text)) => (id.trim(), hex_text.trim()),
                None => (kind.default_id(), raw),
            };
            let place = if n == 0 { "the current key".to_owned() } else { format!("retired key {n}") };
            if !valid_id(id) {
                anyhow::bail!("{what}: {place} has a bad id; ids are 1 to {MAX_ID_LEN} letters, digits, '-', '_' or '.'");
            }
            // The decoder's error would quote a character of the secret: say only what is wrong.
            let secret = hex::decode(hex_text).map_err(|_| anyhow::anyhow!("{what}: key {id:?} is not hex (expected ID:HEX)"))?;
            kind.check_len(secret.len()).map_err(|e| anyhow::anyhow!("{what}: key {id:?} {e}"))?;
            if entries.iter().any(|e| e.id == id) {
                anyhow::bail!("{what}: key id {id:?} appears twice");
            }
            entries.push(KeyEntry { id: id.to_owned(), secret });
        }
        let mut entries = entries.into_iter();
        let current = entries.next().ok_or_else(|| anyhow::anyhow!("{what} is empty"))?;
        Ok(KeySetting { kind, current, retired: entries.collect() })
    }

    /// The setting in its text form (a secret: only for `keys rotate`'s stdout).
    pub fn render(&self) -> String {
        std::iter::once(&self.current).chain(&self.retired).map(|e| format!("{}:{}", e.id, hex::encode(&e.secret))).collect::<Vec<_>>().join(",")
    }

    /// Key ids, current first (not secret: fine for logs).
    pub fn ids(&self) -> Vec<&str> {
        std::iter::once(&self.current).chain(&self.retired).map(|e| e.id.as_str()).collect()
    }

    /// A fresh setting of one key, `id` or the kind's default id.
    pub fn fresh(kind: KeyKind, id: Option<&str>, secret: [u8; 32]) -> anyhow::Result<KeySetting> {
        let id = id.unwrap_or(kind.default_id());
        anyhow::ensure!(valid_id(id), "--id {id:?}: ids are 1 to {MAX_ID_LEN} letters, digits, '-', '_' or '.'");
        Ok(KeySetting { kind, current: KeyEntry { id: id.to_owned(), secret: secret.to_vec() }, retired: vec![] })
    }

    /// The next setting: `secret` becomes current under `id` (default: the current id with
    /// its number raised); every present key is kept, retired, in the same order.
    pub fn rotated(&self, id: Option<&str>, secret: [u8; 32]) -> anyhow::Result<KeySetting> {
        let taken = self.ids();
        let id = match id {
            Some(id) => {
                anyhow::ensure!(!taken.contains(&id), "--id {id:?} is already in the setting; choose a new id");
                id.to_owned()
            }
            None => next_id(&self.current.id, &taken),
        };
        let mut next = KeySetting::fresh(self.kind, Some(&id), secret)?;
        next.retired = std::iter::once(self.current.clone()).chain(self.retired.iter().cloned()).collect();
        Ok(next)
    }

    pub fn audit_keys(&self) -> anyhow::Result<AuditKeys> {
        let key = |e: &KeyEntry| AuditKey::new(e.id.clone(), &e.secret).map_err(|err| anyhow::anyhow!("audit key: {err}"));
        Ok(AuditKeys::new(key(&self.current)?, self.retired.iter().map(key).collect::<anyhow::Result<_>>()?))
    }

    /// The signer (current key) and the public keys of the retired ones, which the approval
    /// service publishes too (in the event store) so that approvals they signed verify.
    pub fn approval(&self) -> anyhow::Result<(ApprovalSigner, Vec<PublicKeyEntry>)> {
        let signer = |e: &KeyEntry| -> anyhow::Result<ApprovalSigner> {
            let secret: [u8; 32] = e.secret.as_slice().try_into().context("an approval key is exactly 32 bytes")?;
            Ok(ApprovalSigner::from_secret(e.id.clone(), secret))
        };
        let retired = self.retired.iter().map(|e| signer(e).map(|s| s.public_key())).collect::<anyhow::Result<_>>()?;
        Ok((signer(&self.current)?, retired))
    }
}

/// `audit-1` -> `audit-2`, `k9` -> `k10`, `main` -> `main-2`; skips ids in `taken`.
fn next_id(current: &str, taken: &[&str]) -> String {
    let stem = current.trim_end_matches(|c: char| c.is_ascii_digit());
    let (stem, mut n) = match current[stem.len()..].parse::<u64>() {
        Ok(n) => (stem.to_owned(), n.saturating_add(1)),
        Err(_) => (format!("{current}-"), 2),
    };
    loop {
        let id = format!("{stem}{n}");
        if !taken.contains(&id.as_str()) && valid_id(&id) {
            return id;
        }
        n = n.saturating_add(1);
    }
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Print the next setting of one key: a fresh current key, with the keys of the present
    /// setting kept as retired (they only verify). The setting goes to stdout and nowhere
    /// else (it is a secret); what to do with it goes to stderr. Without a present setting,
    /// prints a fresh one.
    Rotate {
        /// Which key to rotate.
        #[arg(long, value_enum)]
        kind: KeyKind,
        /// Id of the new key (default: the current id with its number raised, e.g.
        /// audit-1 -> audit-2).
        #[arg(long)]
        id: Option<String>,
        /// The present approval key setting (read with --kind approval).
        #[arg(long, env = "ATASIRA_APPROVAL_KEY", hide_env_values = true, value_name = "KEYS")]
        approval_key: Option<String>,
        /// File holding the present approval key setting (read with --kind approval).
        #[arg(long, env = "ATASIRA_APPROVAL_KEY_FILE")]
        approval_key_file: Option<std::path::PathBuf>,
        /// The present audit key setting (read with --kind audit).
        #[arg(long, env = "ATASIRA_AUDIT_KEY", hide_env_values = true, value_name = "KEYS")]
        audit_key: Option<String>,
    },
}

/// `atasira keys ...`.
pub fn keys(cmd: KeysCommand) -> anyhow::Result<()> {
    let KeysCommand::Rotate { kind, id, approval_key, approval_key_file, audit_key } = cmd;
    let present = match kind {
        KeyKind::Audit => audit_key,
        KeyKind::Approval => match (approval_key, approval_key_file) {
            (Some(k), _) => Some(k),
            (None, Some(path)) => Some(std::fs::read_to_string(&path).with_context(|| format!("failed to read the approval key file {}", path.display()))?),
            (None, None) => None,
        },
    };
    let secret = atasira_platform::auth::random_secret();
    let (next, retired) = match present.filter(|p| !p.trim().is_empty()) {
        Some(text) => {
            let present = KeySetting::parse(kind, &text)?;
            let next = present.rotated(id.as_deref(), secret)?;
            let retired = present.ids().join(", ");
            (next, Some(retired))
        }
        None => (KeySetting::fresh(kind, id.as_deref(), secret)?, None),
    };
    println!("{}", next.render());
    eprintln!("{}", instructions(kind, &next.current.id, retired.as_deref()));
    Ok(())
}

/// What to do with a new setting; names key ids only.
fn instructions(kind: KeyKind, new_id: &str, retired: Option<&str>) -> String {
    let variable = match kind {
        KeyKind::Approval => "ATASIRA_APPROVAL_KEY",
        KeyKind::Audit => "ATASIRA_AUDIT_KEY",
    };
    let head = match retired {
        Some(ids) => format!("atasira: above is the new {variable}: {new_id} is current, {ids} only verify."),
        None => format!("atasira: above is a fresh {variable} with the key {new_id}."),
    };
    let how = match kind {
        KeyKind::Approval => {
            "Give it to the approval service (ATASIRA_APPROVAL_KEY or the file of ATASIRA_APPROVAL_KEY_FILE) and restart that service \
             alone: it publishes the new public key in the event store, where the runtime registry reads it. Published keys stay \
             published (dropping one from the setting withdraws nothing), so recorded approvals keep verifying."
        }
        KeyKind::Audit => {
            "Give it to the audit service and restart it; pass it to `atasira audit verify` too. New ledger rows and checkpoints are \
             MACed with the new key; keep retired audit keys for as long as the ledger holds rows they MACed (that is, always), or \
             those rows stop verifying."
        }
    };
    format!("{head}\n{how}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex_of(byte: u8) -> String {
        hex::encode([byte; 32])
    }

    #[test]
    fn a_bare_hex_key_gets_the_default_id_and_no_retired_keys() {
        // given today's format; when parsed; then the id is the one such keys always had
        for (kind, id) in [(KeyKind::Approval, "approval-1"), (KeyKind::Audit, "audit-1")] {
            let s = KeySetting::parse(kind, &format!(" {}\n", hex_of(1))).expect("parses");
            assert_eq!((s.ids(), s.retired.len()), (vec![id], 0));
        }
    }

    #[test]
    fn the_first_key_is_current_and_the_rest_are_retired_in_order() {
        let text = format!("audit-3:{}, audit-2:{}\naudit-1:{}", hex_of(3), hex_of(2), hex_of(1));
        let s = KeySetting::parse(KeyKind::Audit, &text).expect("parses");
        assert_eq!(s.ids(), vec!["audit-3", "audit-2", "audit-1"]);
        assert_eq!(s.current.id, "audit-3");
        // and rendering gives back a setting that parses to the same keys
        assert_eq!(KeySetting::parse(KeyKind::Audit, &s.render()).expect("parses"), s);
    }

    #[test]
    fn bad_settings_are_refused_without_quoting_the_secret() {
        let secret = "zz".repeat(32);
        let cases = [
            (KeyKind::Audit, String::new(), "is empty"),
            (KeyKind::Audit, format!("k1:{secret}"), "not hex"),
            (KeyKind::Audit, format!("k1:{}", "ab".repeat(16)), "at least 32"),
            (KeyKind::Approval, format!("k1:{}", "ab".repeat(33)), "exactly 32"),
            (KeyKind::Audit, format!("a b:{}", hex_of(1)), "bad id"),
            (KeyKind::Audit, format!("k1:{},k1:{}", hex_of(1), hex_of(2)), "appears twice"),
            // a bare retired key takes the default id, so two bare keys collide
            (KeyKind::Audit, format!("{},{}", hex_of(1), hex_of(2)), "appears twice"),
        ];
        for (kind, text, needle) in cases {
            let e = KeySetting::parse(kind, &text).expect_err("refused").to_string();
            assert!(e.contains(needle), "{text:?}: {e}");
            assert!(!e.contains(&secret) && !e.contains(&hex_of(1)) && !e.contains("zz"), "the error quotes the secret: {e}");
        }
        // and Debug never shows a secret either
        let s = KeySetting::parse(KeyKind::Audit, &hex_of(7)).expect("parses");
        assert!(!format!("{s:?}").contains(&hex_of(7)));
    }

    #[test]
    fn rotation_adds_a_fresh_current_key_and_retires_the_present_ones() {
        // given a bare (legacy) audit key
        let present = KeySetting::parse(KeyKind::Audit, &hex_of(1)).expect("parses");
        // when rotated twice
        let once = present.rotated(None, [2; 32]).expect("rotates");
        let twice = once.rotated(None, [3; 32]).expect("rotates");
        // then the ids count up and every older key is kept, newest retired first
        assert_eq!(once.ids(), vec!["audit-2", "audit-1"]);
        assert_eq!(twice.ids(), vec!["audit-3", "audit-2", "audit-1"]);
        assert_eq!(twice.render(), format!("audit-3:{},audit-2:{},audit-1:{}", hex_of(3), hex_of(2), hex_of(1)));
        // and an explicit id is used, unless it is taken
        assert_eq!(present.rotated(Some("2025-06"), [2; 32]).expect("rotates").current.id, "2025-06");
        assert!(once.rotated(Some("audit-1"), [3; 32]).is_err());
        assert!(present.rotated(Some("no spaces"), [3; 32]).is_err());
    }

    #[test]
    fn next_ids_raise_the_number_or_add_one() {
        assert_eq!(next_id("audit-1", &["audit-1"]), "audit-2");
        assert_eq!(next_id("k9", &["k9"]), "k10");
        assert_eq!(next_id("main", &["main"]), "main-2");
        assert_eq!(next_id("k1", &["k1", "k2", "k3"]), "k4");
    }

    #[test]
    fn a_rotated_approval_setting_publishes_the_retired_public_keys() {
        let present = KeySetting::parse(KeyKind::Approval, &hex_of(1)).expect("parses");
        let (old_signer, _) = present.approval().expect("signer");
        let (signer, retired) = present.rotated(None, [2; 32]).expect("rotates").approval().expect("signer");
        assert_eq!(signer.key_id(), "approval-2");
        assert_eq!(retired, vec![old_signer.public_key()]);
    }

    #[test]
    fn rotated_audit_keys_mac_with_the_new_id_and_know_the_old_one() {
        let next = KeySetting::parse(KeyKind::Audit, &hex_of(1)).expect("parses").rotated(None, [2; 32]).expect("rotates");
        let keys = next.audit_keys().expect("keys");
        assert_eq!((keys.current_key_id(), keys.key_ids()), ("audit-2", vec!["audit-2", "audit-1"]));
    }
}
