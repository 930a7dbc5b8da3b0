//! Principal assertion keys, as events (R-ARCH-13): each process that signs assertions
//! (the gateway; approval and the runtime registry for the calls they make) draws a fresh
//! Ed25519 key at start and every [`KEY_ROTATE_AFTER`](crate::assertion::KEY_ROTATE_AFTER),
//! and publishes its public half on a stream of its own (id: the key id) under its own
//! aggregate type, before it signs anything with it. Verifiers read a key from the store
//! the first time an assertion names it, and accept it only on requests its issuer sends.
//! A key id names one key forever.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::assertion::{AssertionKeyError, AssertionPublicKey};

/// One published key (one stream per key id).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AssertionKeyRecord {
    /// The public key, once published (lowercase hex).
    pub public_key: Option<String>,
}

#[derive(Debug, Clone)]
pub enum AssertionKeyCommand {
    Publish { key: AssertionPublicKey, at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AssertionKeyEvent {
    AssertionKeyPublished {
        key_id: String,
        /// The process identity that signs with it.
        issuer: String,
        /// Lowercase hex of the 32-byte Ed25519 public key.
        public_key: String,
        published_at: DateTime<Utc>,
        /// It verifies nothing after this.
        expires_at: DateTime<Utc>,
    },
}

impl AssertionKeyEvent {
    pub fn name(&self) -> &'static str {
        "AssertionKeyPublished"
    }

    /// The key it published.
    pub fn key(&self) -> Result<AssertionPublicKey, AssertionKeyError> {
        let AssertionKeyEvent::AssertionKeyPublished { key_id, issuer, public_key, expires_at, .. } = self;
        AssertionPublicKey::from_hex(key_id.clone(), issuer.clone(), public_key, *expires_at)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssertionKeyPublishError {
    /// Never a request's refusal: the signing process does not start (ids are random).
    #[error("assertion key id {key_id:?} is published already with another key")]
    KeyIdReused { key_id: String },
}

impl AssertionKeyPublishError {
    pub fn code(&self) -> crate::ErrorCode {
        crate::ErrorCode::Conflict
    }
}

impl AssertionKeyRecord {
    /// Publishes the key; publishing the same key again is nothing new.
    pub fn decide(&self, command: AssertionKeyCommand) -> Result<Vec<AssertionKeyEvent>, AssertionKeyPublishError> {
        let AssertionKeyCommand::Publish { key, at } = command;
        match &self.public_key {
            Some(known) if *known == key.to_hex() => Ok(vec![]),
            Some(_) => Err(AssertionKeyPublishError::KeyIdReused { key_id: key.key_id().to_owned() }),
            None => Ok(vec![AssertionKeyEvent::AssertionKeyPublished {
                key_id: key.key_id().to_owned(),
                issuer: key.issuer().to_owned(),
                public_key: key.to_hex(),
                published_at: at,
                expires_at: key.expires_at(),
            }]),
        }
    }

    pub fn evolve(&mut self, event: AssertionKeyEvent) {
        let AssertionKeyEvent::AssertionKeyPublished { public_key, .. } = event;
        self.public_key = Some(public_key);
    }
}

/// The gateway's keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GatewayAssertionKey(pub AssertionKeyRecord);
/// The approval service's keys (its calls to the registry).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ApprovalAssertionKey(pub AssertionKeyRecord);
/// The runtime registry's keys (its calls to the provisioner).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RegistryAssertionKey(pub AssertionKeyRecord);

impl cqrs_es::DomainEvent for AssertionKeyEvent {
    fn event_type(&self) -> String {
        self.name().to_owned()
    }
    fn event_version(&self) -> String {
        crate::aggregates::EVENT_VERSION.to_owned()
    }
}

// One record under each issuer's own aggregate type.
crate::aggregates::record_aggregates!(AssertionKeyCommand, AssertionKeyEvent, AssertionKeyPublishError;
    GatewayAssertionKey => super::types::GATEWAY_ASSERTION_KEYS,
    ApprovalAssertionKey => super::types::APPROVAL_ASSERTION_KEYS,
    RegistryAssertionKey => super::types::REGISTRY_ASSERTION_KEYS,
);

/// The aggregate type holding `issuer`'s keys; `None` for a process that signs nothing.
pub fn type_of_issuer(issuer: &str) -> Option<&'static str> {
    use super::types;
    Some(match issuer {
        "gateway" => types::GATEWAY_ASSERTION_KEYS,
        "approval" => types::APPROVAL_ASSERTION_KEYS,
        "runtime-registry" => types::REGISTRY_ASSERTION_KEYS,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregates::testing::given_when;
    use crate::assertion::AssertionSigner;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(1_750_000_000, 0).expect("time")
    }

    #[test]
    fn r_arch_13_given_no_key_when_published_then_one_event_that_reads_back_as_the_key() {
        let key = AssertionSigner::new("gateway-ab", "gateway", &[4; 32], at()).public_key();
        let events = given_when::<GatewayAssertionKey>(vec![], AssertionKeyCommand::Publish { key: key.clone(), at: at() }).expect("published");
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].key(), Ok(key.clone()));
        // the same key again: nothing new; another key under the id: refused
        let again = given_when::<GatewayAssertionKey>(events.clone(), AssertionKeyCommand::Publish { key, at: at() });
        assert_eq!(again, Ok(vec![]));
        let other = AssertionSigner::new("gateway-ab", "gateway", &[5; 32], at()).public_key();
        let err = given_when::<GatewayAssertionKey>(events, AssertionKeyCommand::Publish { key: other, at: at() }).expect_err("reused id");
        assert_eq!(err, AssertionKeyPublishError::KeyIdReused { key_id: "gateway-ab".into() });
    }

    #[test]
    fn r_arch_13_each_signing_process_has_its_own_aggregate_type() {
        assert_eq!(type_of_issuer("gateway"), Some(super::super::types::GATEWAY_ASSERTION_KEYS));
        assert_eq!(type_of_issuer("runtime-registry"), Some(super::super::types::REGISTRY_ASSERTION_KEYS));
        assert_eq!(type_of_issuer("provisioner"), None, "the provisioner signs nothing");
        assert_eq!(type_of_issuer("drafts"), None);
    }
}
