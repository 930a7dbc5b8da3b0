//! The approval service's public keys, as the registry knows them (R-APPROVE-4, R-BOX-1):
//! the `ApprovalKeyPublished` events in the store, read at start and again when a token
//! names a key id the registry does not know (the approval key was rotated, so no registry
//! restart is needed). Never from an answer on the bus: whoever can answer a NATS request
//! could offer its own key. A published key stays in the keyring (nothing withdraws one),
//! so a recorded approval stays verifiable.
//!
//! The approval service publishes its keys before it signs anything, so the key of any
//! approval in the store is in the store too: an id still unknown after a reload was
//! never published, and the token is refused.

use atasira_domain::aggregates::approval_keys::{ApprovalKeys, KEYS_ID};
use atasira_domain::token::Keyring;
use atasira_platform::store::Db;
use tokio::sync::{Mutex, RwLock};

/// Published public keys, reloaded from the store on an unknown key id.
pub(crate) struct KeyProvider {
    db: Db,
    keyring: RwLock<Keyring>,
    /// Held while reloading, so concurrent unknown ids cost one read.
    reloading: Mutex<()>,
}

impl KeyProvider {
    /// The provider with the keys published so far.
    pub(crate) async fn load(db: Db) -> anyhow::Result<Self> {
        let keyring = published(&db).await?;
        Ok(Self { db, keyring: RwLock::new(keyring), reloading: Mutex::new(()) })
    }

    /// The keyring to verify a token signed by `key_id`: reloaded first when the id is
    /// unknown. An error only when the store cannot be read (the caller retries later).
    pub(crate) async fn keyring_for(&self, key_id: &str) -> anyhow::Result<Keyring> {
        if !self.keyring.read().await.contains(key_id) {
            let _one = self.reloading.lock().await;
            if !self.keyring.read().await.contains(key_id) {
                let keyring = published(&self.db).await?;
                tracing::debug!(key_id, known = keyring.contains(key_id), "approval public keys reloaded from the store");
                *self.keyring.write().await = keyring;
            }
        }
        Ok(self.keyring.read().await.clone())
    }
}

async fn published(db: &Db) -> anyhow::Result<Keyring> {
    Ok(db.load::<ApprovalKeys>(KEYS_ID).await?.keyring())
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::PathBuf;

    use atasira_domain::aggregates::approval_keys::ApprovalKeysCommand;
    use atasira_domain::token::{ApprovalSigner, PublicKeyEntry};

    use super::*;

    /// A data directory removed on drop.
    struct TempDir(PathBuf);

    impl TempDir {
        fn new() -> Self {
            let dir = std::env::temp_dir().join(format!("atasira-registry-keys-{}", uuid::Uuid::new_v4().simple()));
            std::fs::create_dir_all(&dir).expect("temp dir");
            TempDir(dir)
        }
    }

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn signer(id: &str, byte: u8) -> ApprovalSigner {
        ApprovalSigner::from_secret(id.to_owned(), [byte; 32])
    }

    /// What the approval service does at start with this key setting.
    async fn publish(db: &Db, keys: Vec<PublicKeyEntry>) {
        let command = ApprovalKeysCommand::Publish { keys, at: chrono::Utc::now() };
        db.cqrs::<ApprovalKeys>().execute(KEYS_ID, command, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("published");
    }

    #[tokio::test]
    async fn a_rotated_key_is_learned_from_the_store_without_a_restart() {
        // given a registry started when only approval-1 was published
        let dir = TempDir::new();
        let db = Db::connect(&Db::sqlite_url(&dir.0)).await.expect("db");
        publish(&db, vec![signer("approval-1", 1).public_key()]).await;
        let provider = KeyProvider::load(db.clone()).await.expect("loaded");
        // when the approval service restarts rotated (approval-2 current, approval-1 retired)
        // and a token by approval-2 comes, twice at once
        publish(&db, vec![signer("approval-2", 2).public_key(), signer("approval-1", 1).public_key()]).await;
        let (a, b) = tokio::join!(provider.keyring_for("approval-2"), provider.keyring_for("approval-2"));
        // then both keyrings know both keys, and the token verifies
        for ring in [a.expect("keyring"), b.expect("keyring")] {
            assert!(ring.contains("approval-2") && ring.contains("approval-1"));
            let token = signer("approval-2", 2).issue("d", "b", "sha256:00", "alice", chrono::Utc::now());
            assert!(ring.verify(&token, chrono::Utc::now()).is_ok());
        }
    }

    #[tokio::test]
    async fn an_unpublished_id_stays_unknown_and_a_dropped_key_stays_verifiable() {
        // given approval-1 published, then a setting without it (approval-2 only)
        let dir = TempDir::new();
        let db = Db::connect(&Db::sqlite_url(&dir.0)).await.expect("db");
        publish(&db, vec![signer("approval-1", 1).public_key()]).await;
        publish(&db, vec![signer("approval-2", 2).public_key()]).await;
        let provider = KeyProvider::load(db).await.expect("loaded");
        // when a token names an id nobody published
        let ring = provider.keyring_for("approval-9").await.expect("keyring");
        // then it stays unknown (the token is refused), and approval-1 is still known
        assert!(!ring.contains("approval-9"));
        assert!(ring.contains("approval-1") && ring.contains("approval-2"));
        let token = signer("approval-9", 9).issue("d", "b", "sha256:00", "alice", chrono::Utc::now());
        assert_eq!(ring.verify(&token, chrono::Utc::now()).map_err(|e| e.reason()), Err("unknown_key_id"));
    }

    #[tokio::test]
    async fn an_empty_store_is_an_empty_keyring() {
        let dir = TempDir::new();
        let db = Db::connect(&Db::sqlite_url(&dir.0)).await.expect("db");
        let provider = KeyProvider::load(db).await.expect("loaded");
        assert!(!provider.keyring_for("approval-1").await.expect("keyring").contains("approval-1"));
    }
}
