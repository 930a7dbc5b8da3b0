//! Principal assertion keys in a process (R-ARCH-3, R-ARCH-13). A process that signs (the
//! gateway; approval and the runtime registry for the calls they make) draws its own
//! Ed25519 key, publishes the public half in the store under its own aggregate type before
//! it signs with it, and publishes a new one every `KEY_ROTATE_AFTER`. Every process
//! verifies with public keys only: a key an assertion names is read from the store the
//! first time, under the aggregate type of the issuer the request's subject names, and kept.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use atasira_domain::aggregates::assertion_keys::{
    ApprovalAssertionKey, AssertionKeyCommand, AssertionKeyEvent, GatewayAssertionKey, RegistryAssertionKey, type_of_issuer,
};
use atasira_domain::assertion::{AssertionError, AssertionKeyring, AssertionPublicKey, AssertionSigner, Binding, PrincipalAssertion, Verified};
use chrono::{DateTime, Utc};

use crate::store::Db;

/// A process's signer (if it signs) and the public keys it has learnt.
#[derive(Clone, Default)]
pub struct AssertionKeys {
    signer: Arc<RwLock<Option<Arc<AssertionSigner>>>>,
    keyring: Arc<RwLock<AssertionKeyring>>,
}

impl std::fmt::Debug for AssertionKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AssertionKeys").field("signer", &self.signer().ok().map(|s| s.key_id().to_owned())).finish_non_exhaustive()
    }
}

impl AssertionKeys {
    /// A signer fixed by the caller and the public keys the verifier knows already (tests,
    /// benchmarks); nothing is published.
    pub fn fixed(signer: Option<AssertionSigner>, known: impl IntoIterator<Item = AssertionPublicKey>) -> Self {
        let keys = AssertionKeys::default();
        *keys.signer.write().unwrap_or_else(std::sync::PoisonError::into_inner) = signer.map(Arc::new);
        *keys.keyring.write().unwrap_or_else(std::sync::PoisonError::into_inner) = AssertionKeyring::new(known);
        keys
    }

    /// The same keyring with a signer slot of its own: each signing service of an embedded
    /// system signs with its own key.
    pub fn own_signer(&self) -> Self {
        AssertionKeys { signer: Arc::default(), keyring: self.keyring.clone() }
    }

    /// The current signer; an error in a process that signs nothing.
    pub fn signer(&self) -> anyhow::Result<Arc<AssertionSigner>> {
        self.signer.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone().ok_or_else(|| anyhow::anyhow!("this process signs no assertions"))
    }

    /// Draws a new key for `issuer`, publishes its public half in the store and signs with
    /// it from now on.
    pub async fn publish_new_key(&self, db: &Db, issuer: &str) -> anyhow::Result<()> {
        let now = Utc::now();
        let seed: [u8; 32] = rand::random();
        let key_id = format!("{issuer}-{}", hex::encode(rand::random::<[u8; 8]>()));
        let signer = AssertionSigner::new(key_id.clone(), issuer, &seed, now);
        let command = AssertionKeyCommand::Publish { key: signer.public_key(), at: now };
        let metadata = HashMap::new();
        let published = match issuer {
            atasira_contracts::subjects::GATEWAY => db.cqrs::<GatewayAssertionKey>().execute_new(&key_id, command, metadata).await,
            atasira_contracts::subjects::APPROVAL => db.cqrs::<ApprovalAssertionKey>().execute_new(&key_id, command, metadata).await,
            atasira_contracts::subjects::RUNTIME_REGISTRY => db.cqrs::<RegistryAssertionKey>().execute_new(&key_id, command, metadata).await,
            other => anyhow::bail!("the {other} process signs no assertions"),
        };
        published.map_err(|r| anyhow::anyhow!("cannot publish the assertion key {key_id}: {}", r.message))?;
        self.keyring.write().unwrap_or_else(std::sync::PoisonError::into_inner).insert(signer.public_key());
        *self.signer.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(signer));
        tracing::info!(issuer, key_id, "published a new principal assertion key");
        Ok(())
    }

    /// Checks an assertion that arrived from `issuer`; a key it names that this process has
    /// not seen is read from the store (only from `issuer`'s own aggregate type).
    pub async fn verify(&self, db: &Db, a: &PrincipalAssertion, binding: &Binding, issuer: &str, now: DateTime<Utc>) -> Result<Verified, AssertionError> {
        let known = self.keyring.read().unwrap_or_else(std::sync::PoisonError::into_inner).knows(&a.key_id);
        if !known && let Some(key) = published_key(db, issuer, &a.key_id).await {
            self.keyring.write().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key);
        }
        self.keyring.read().unwrap_or_else(std::sync::PoisonError::into_inner).verify(a, binding, issuer, now)
    }
}

/// The key `issuer` published under `key_id`, if the store holds one.
async fn published_key(db: &Db, issuer: &str, key_id: &str) -> Option<AssertionPublicKey> {
    let aggregate_type = type_of_issuer(issuer)?;
    let stored = match db.event(aggregate_type, key_id, 1).await {
        Ok(stored) => stored?,
        Err(e) => {
            tracing::warn!(issuer, key_id, error = %e, "cannot read an assertion key from the store");
            return None;
        }
    };
    let event: AssertionKeyEvent = stored.decode().ok()?;
    let key = event.key().ok()?;
    // The stream's own id and the issuer its type belongs to are what count.
    (key.key_id() == key_id && key.issuer() == issuer).then_some(key)
}

/// Publishes a new key every `KEY_ROTATE_AFTER` until shutdown; a failed publication is
/// retried a minute later (the current key verifies for `KEY_LIFETIME`).
pub async fn rotate(keys: AssertionKeys, db: Db, issuer: &'static str, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    let every = atasira_domain::assertion::KEY_ROTATE_AFTER.to_std().unwrap_or(std::time::Duration::from_secs(12 * 3600));
    let mut wait = every;
    loop {
        tokio::select! {
            () = tokio::time::sleep(wait) => {}
            _ = shutdown.changed() => return,
        }
        wait = match keys.publish_new_key(&db, issuer).await {
            Ok(()) => every,
            Err(e) => {
                tracing::error!(issuer, error = %e, "could not publish the next assertion key; retrying in a minute");
                std::time::Duration::from_secs(60)
            }
        };
    }
}
