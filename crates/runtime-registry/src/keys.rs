//! The approval service's public keys, as the registry knows them (R-APPROVE-4, R-BOX-1).
//! In cluster mode they come from the approval service (`GetApprovalKeys`): when a token
//! names a key id the registry does not know (the approval key was rotated, so no registry
//! restart is needed) and every [`REFRESH_EVERY`] (so a key removed there is forgotten
//! here). Each answer replaces the keyring: the approval service's list is the truth.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use atasira_contracts::{convert, subjects, v1};
use atasira_domain::token::{Keyring, PublicKeyEntry};
use atasira_platform::bus::Bus;
use prost::Message as _;
use tokio::sync::{Mutex, RwLock};
use tokio::time::Instant;

/// How often the registry asks for the keys without a reason.
pub const REFRESH_EVERY: Duration = Duration::from_secs(300);
/// At most one request for the keys per this interval, however many unknown key ids come.
const FETCH_INTERVAL: Duration = Duration::from_secs(1);

/// The last request for the keys.
#[derive(Debug, Clone, Copy)]
struct Fetched {
    at: Instant,
    ok: bool,
}

/// Public keys, fixed or refreshed from the approval service.
pub(crate) struct KeyProvider {
    keyring: RwLock<Keyring>,
    /// Where to ask; `None`: the keyring is fixed (embedded mode).
    bus: Option<Arc<dyn Bus>>,
    /// Held while asking, so one request is in flight at a time.
    last: Mutex<Option<Fetched>>,
}

impl KeyProvider {
    pub(crate) fn new(keyring: Keyring, bus: Option<Arc<dyn Bus>>) -> Self {
        Self { keyring: RwLock::new(keyring), bus, last: Mutex::new(None) }
    }

    /// The keyring to verify a token signed by `key_id`. An unknown id makes the registry
    /// ask the approval service first; when it cannot be asked, an error (the caller
    /// retries later) rather than a keyring that would refuse a genuine approval.
    pub(crate) async fn keyring_for(&self, key_id: &str) -> anyhow::Result<Keyring> {
        if self.bus.is_some() && !self.keyring.read().await.contains(key_id) {
            self.refresh(Instant::now()).await?;
        }
        Ok(self.keyring.read().await.clone())
    }

    /// Replaces the keyring with the approval service's keys (its current key and the
    /// retired ones it still publishes), unless a request sent after `asked` answered
    /// already. Requests are at least [`FETCH_INTERVAL`] apart, so a flood of unknown key
    /// ids costs the approval service one request a second.
    async fn refresh(&self, asked: Instant) -> anyhow::Result<()> {
        let Some(bus) = &self.bus else {
            return Ok(());
        };
        let mut last = self.last.lock().await;
        if let Some(f) = *last {
            if f.at >= asked {
                return if f.ok { Ok(()) } else { Err(anyhow::anyhow!("the approval service's public keys are unavailable")) };
            }
            tokio::time::sleep_until(f.at + FETCH_INTERVAL).await;
        }
        let fetched = fetch(bus.as_ref()).await;
        *last = Some(Fetched { at: Instant::now(), ok: fetched.is_ok() });
        let entries = fetched.context("cannot fetch the approval service's public keys")?;
        let ids: Vec<&str> = entries.iter().map(|e| e.key_id.as_str()).collect();
        tracing::debug!(?ids, "approval public keys fetched");
        *self.keyring.write().await = Keyring::new(entries);
        Ok(())
    }

    /// Refreshes every [`REFRESH_EVERY`] until shutdown (only when keys come from approval).
    pub(crate) async fn refresh_periodically(&self, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        if self.bus.is_none() {
            return;
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(REFRESH_EVERY) => {}
                _ = shutdown.changed() => return,
            }
            if *shutdown.borrow() {
                return;
            }
            if let Err(e) = self.refresh(Instant::now()).await {
                tracing::warn!(error = %format!("{e:#}"), "approval public keys not refreshed; keeping the known ones");
            }
        }
    }
}

async fn fetch(bus: &dyn Bus) -> anyhow::Result<Vec<PublicKeyEntry>> {
    let env = atasira_contracts::envelope(&v1::GetApprovalKeys {}, &uuid::Uuid::new_v4().to_string(), "");
    let subject = subjects::request(subjects::RUNTIME_REGISTRY, subjects::APPROVAL);
    let bytes = bus.request(&subject, Default::default(), env.encode_to_vec().into(), Duration::from_secs(5)).await?;
    match atasira_contracts::decode_reply::<v1::ApprovalKeysReply>(&bytes)? {
        Ok((reply, _)) => Ok(reply.keys.iter().map(convert::public_key_from_wire).collect::<Result<_, _>>()?),
        Err(e) => anyhow::bail!("approval refused: {}", e.message),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use atasira_domain::token::ApprovalSigner;
    use atasira_platform::bus::InprocBus;

    use super::*;

    fn entry(id: &str, byte: u8) -> PublicKeyEntry {
        ApprovalSigner::from_secret(id.to_owned(), [byte; 32]).public_key()
    }

    /// An approval service on an in-process bus that publishes `keys` and counts requests.
    struct Approval {
        bus: Arc<InprocBus>,
        keys: Arc<std::sync::Mutex<Vec<PublicKeyEntry>>>,
        asked: Arc<AtomicUsize>,
    }

    impl Approval {
        async fn start(keys: Vec<PublicKeyEntry>) -> Approval {
            let approval = Approval { bus: Arc::new(InprocBus::default()), keys: Arc::new(std::sync::Mutex::new(keys)), asked: Arc::new(AtomicUsize::new(0)) };
            let (keys, asked) = (approval.keys.clone(), approval.asked.clone());
            let handler: atasira_platform::bus::Handler = Arc::new(move |_msg| {
                asked.fetch_add(1, Ordering::SeqCst);
                let wire = keys.lock().expect("keys").iter().map(convert::public_key_to_wire).collect();
                let reply = atasira_contracts::reply_ok(&v1::ApprovalKeysReply { keys: wire });
                Box::pin(async move { reply.encode_to_vec().into() })
            });
            approval.bus.serve(subjects::APPROVAL, &[subjects::request("*", subjects::APPROVAL)], handler).await.expect("serves");
            approval
        }

        fn provider(&self) -> KeyProvider {
            KeyProvider::new(Keyring::default(), Some(self.bus.clone()))
        }

        fn asked(&self) -> usize {
            self.asked.load(Ordering::SeqCst)
        }
    }

    #[tokio::test]
    async fn an_unknown_key_id_is_learned_from_the_approval_service_once() {
        // given an approval service that rotated to approval-2 and still publishes approval-1
        let approval = Approval::start(vec![entry("approval-2", 2), entry("approval-1", 1)]).await;
        let provider = approval.provider();
        // when a token names approval-2, twice at once and then once more
        let (a, b) = tokio::join!(provider.keyring_for("approval-2"), provider.keyring_for("approval-2"));
        let again = provider.keyring_for("approval-2").await.expect("keyring");
        // then the keyring knows both keys after one request
        assert!(a.expect("keyring").contains("approval-2") && b.expect("keyring").contains("approval-1"));
        assert!(again.contains("approval-2"));
        assert_eq!(approval.asked(), 1);
    }

    #[tokio::test]
    async fn an_id_the_approval_service_does_not_publish_stays_unknown_and_removed_keys_are_forgotten() {
        let approval = Approval::start(vec![entry("approval-1", 1)]).await;
        let provider = approval.provider();
        // given a keyring learned from the approval service
        assert!(provider.keyring_for("approval-1").await.expect("keyring").contains("approval-1"));
        // when the approval service drops approval-1 for approval-2 and a token names a forged id
        *approval.keys.lock().expect("keys") = vec![entry("approval-2", 2)];
        let ring = provider.keyring_for("forged").await.expect("keyring");
        // then the forged id stays unknown (the token is refused), and approval-1 is gone
        assert!(!ring.contains("forged") && !ring.contains("approval-1") && ring.contains("approval-2"));
        assert_eq!(approval.asked(), 2);
    }

    #[tokio::test]
    async fn an_unreachable_approval_service_is_an_error_not_an_empty_keyring() {
        // given no approval service on the bus; when a token names an unknown id
        let provider = KeyProvider::new(Keyring::default(), Some(Arc::new(InprocBus::default())));
        // then the caller gets an error to retry on, not a keyring that would refuse the token
        assert!(provider.keyring_for("approval-1").await.is_err());
        // and a fixed keyring (embedded) never asks
        let fixed = KeyProvider::new(Keyring::new(vec![entry("approval-1", 1)]), None);
        assert!(!fixed.keyring_for("approval-9").await.expect("keyring").contains("approval-9"));
    }
}
