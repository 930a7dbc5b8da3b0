//! The approval service's public keys, as events (R-APPROVE-4, R-ARCH-11): at start the
//! approval service publishes its current key and every retired key it is configured
//! with, once each, on one stream (id [`KEYS_ID`]). Verifiers (the registry) build their
//! keyring from this stream, so the keys that verify an approval are in the same store as
//! the approval itself, never in an answer from whoever replies on the bus.
//!
//! A published key stays published: a key later dropped from the configuration is not
//! withdrawn (a recorded approval stays verifiable, so replaying it stays an idempotent
//! no-op rather than a security violation). A key id names one public key forever; the
//! same id with another key is refused, so a verifier never has two keys for one id.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;
use crate::token::{Keyring, PublicKeyEntry};

/// The single aggregate id of the published keys.
pub const KEYS_ID: &str = "keys";

/// The published keys: key id -> 32-byte Ed25519 public key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApprovalKeys {
    pub keys: BTreeMap<String, [u8; 32]>,
}

#[derive(Debug, Clone)]
pub enum ApprovalKeysCommand {
    /// At the approval service's start: its current key, then its retired keys.
    Publish { keys: Vec<PublicKeyEntry>, at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum ApprovalKeysEvent {
    ApprovalKeyPublished {
        key_id: String,
        /// Lowercase hex of the 32-byte Ed25519 public key.
        public_key: String,
        published_at: DateTime<Utc>,
    },
}

impl ApprovalKeysEvent {
    pub fn name(&self) -> &'static str {
        "ApprovalKeyPublished"
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApprovalKeysError {
    /// The configuration names a published key id with another key (an edited key file):
    /// tokens signed under that id would no longer verify, or verify against two keys.
    /// Never a request's refusal: the approval service does not start.
    #[error(
        "approval key id {key_id:?} was published with another public key; a key id names one key forever, so give a new key a new id (atasira keys rotate)"
    )]
    KeyIdReused { key_id: String },
}

/// Never a request's refusal (the approval service does not start): ours, if ever answered.
impl crate::Refusing for ApprovalKeysError {
    fn error_code(&self) -> crate::ErrorCode {
        crate::ErrorCode::Internal
    }
}

impl ApprovalKeys {
    /// Publishes what is not published yet; a key published before (same id, same key) is
    /// nothing new, so every start after the first appends nothing.
    pub fn decide(&self, command: ApprovalKeysCommand) -> Result<Vec<ApprovalKeysEvent>, ApprovalKeysError> {
        let ApprovalKeysCommand::Publish { keys, at } = command;
        let mut seen = self.keys.clone();
        let mut events = Vec::new();
        for entry in keys {
            match seen.get(&entry.key_id) {
                Some(known) if *known == entry.public_key => {}
                Some(_) => return Err(ApprovalKeysError::KeyIdReused { key_id: entry.key_id }),
                None => {
                    seen.insert(entry.key_id.clone(), entry.public_key);
                    events.push(ApprovalKeysEvent::ApprovalKeyPublished { key_id: entry.key_id, public_key: hex::encode(entry.public_key), published_at: at });
                }
            }
        }
        Ok(events)
    }

    pub fn evolve(&mut self, event: ApprovalKeysEvent) {
        let ApprovalKeysEvent::ApprovalKeyPublished { key_id, public_key, .. } = event;
        let mut bytes = [0u8; 32];
        // Only `decide` writes these events, always 64 hex digits; anything else is skipped
        // (a key that cannot be read verifies nothing).
        if hex::decode_to_slice(public_key.as_bytes(), &mut bytes).is_ok() {
            self.keys.insert(key_id, bytes);
        }
    }

    /// The keyring of every published key.
    pub fn keyring(&self) -> Keyring {
        Keyring::new(self.keys.iter().map(|(key_id, public_key)| PublicKeyEntry { key_id: key_id.clone(), public_key: *public_key }).collect())
    }
}

aggregate_via_decide!(ApprovalKeys, super::types::APPROVAL_KEYS, ApprovalKeysCommand, ApprovalKeysEvent, ApprovalKeysError);

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;
    use crate::aggregates::testing::given_when;
    use crate::token::ApprovalSigner;

    fn t(minute: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 12, 1, 12, minute, 0).single().expect("valid time")
    }

    fn key(id: &str, secret: u8) -> PublicKeyEntry {
        ApprovalSigner::from_secret(id.to_owned(), [secret; 32]).public_key()
    }

    fn publish(keys: Vec<PublicKeyEntry>, minute: u32) -> ApprovalKeysCommand {
        ApprovalKeysCommand::Publish { keys, at: t(minute) }
    }

    fn published(entry: &PublicKeyEntry, minute: u32) -> ApprovalKeysEvent {
        ApprovalKeysEvent::ApprovalKeyPublished { key_id: entry.key_id.clone(), public_key: hex::encode(entry.public_key), published_at: t(minute) }
    }

    fn state(events: &[ApprovalKeysEvent]) -> ApprovalKeys {
        let mut keys = ApprovalKeys::default();
        for e in events {
            keys.evolve(e.clone());
        }
        keys
    }

    #[test]
    fn given_nothing_when_the_approval_service_starts_then_each_key_is_published_once() {
        // R-APPROVE-4: the current key and the retired ones
        let (current, retired) = (key("approval-2", 2), key("approval-1", 1));
        let events = given_when::<ApprovalKeys>(vec![], publish(vec![current.clone(), retired.clone()], 0)).expect("published");
        assert_eq!(events, vec![published(&current, 0), published(&retired, 0)]);
        assert_eq!(events[0].name(), "ApprovalKeyPublished");
        // and the keyring built from the events verifies tokens of both keys
        let ring = state(&events).keyring();
        assert!(ring.contains("approval-2") && ring.contains("approval-1"));
        let token = ApprovalSigner::from_secret("approval-1".into(), [1; 32]).issue("d", "b", "sha256:00", "alice", t(0));
        assert!(ring.verify(&token, t(1)).is_ok());
    }

    #[test]
    fn given_published_keys_when_the_service_restarts_with_the_same_keys_then_nothing_new() {
        // idempotent at every start
        let k = key("approval-1", 1);
        let history = vec![published(&k, 0)];
        assert_eq!(given_when::<ApprovalKeys>(history, publish(vec![k], 5)), Ok(vec![]));
    }

    #[test]
    fn given_a_published_key_when_rotated_then_only_the_new_key_is_published() {
        // key rotation: approval-2 becomes current, approval-1 is kept as retired
        let (old, new) = (key("approval-1", 1), key("approval-2", 2));
        let history = vec![published(&old, 0)];
        assert_eq!(given_when::<ApprovalKeys>(history, publish(vec![new.clone(), old], 5)), Ok(vec![published(&new, 5)]));
    }

    #[test]
    fn given_published_keys_when_a_key_is_dropped_from_the_configuration_then_it_stays_published() {
        // retired keys stay verifiable: dropping one from the setting withdraws nothing
        let (old, new) = (key("approval-1", 1), key("approval-2", 2));
        let history = vec![published(&old, 0), published(&new, 5)];
        assert_eq!(given_when::<ApprovalKeys>(history.clone(), publish(vec![new], 9)), Ok(vec![]));
        assert!(state(&history).keyring().contains("approval-1"));
    }

    #[test]
    fn given_a_published_key_id_when_configured_with_another_key_then_refused() {
        // a key id names one key forever
        let history = vec![published(&key("approval-1", 1), 0)];
        let refused = given_when::<ApprovalKeys>(history, publish(vec![key("approval-2", 2), key("approval-1", 7)], 5));
        assert_eq!(refused, Err(ApprovalKeysError::KeyIdReused { key_id: "approval-1".into() }));
        // and within one configuration too
        let twice = given_when::<ApprovalKeys>(vec![], publish(vec![key("approval-1", 1), key("approval-1", 7)], 0));
        assert_eq!(twice, Err(ApprovalKeysError::KeyIdReused { key_id: "approval-1".into() }));
    }

    #[test]
    fn an_event_with_an_unreadable_key_adds_nothing_to_the_keyring() {
        let mut keys = ApprovalKeys::default();
        keys.evolve(ApprovalKeysEvent::ApprovalKeyPublished { key_id: "approval-9".into(), public_key: "zz".into(), published_at: t(0) });
        assert!(!keys.keyring().contains("approval-9"));
    }
}
