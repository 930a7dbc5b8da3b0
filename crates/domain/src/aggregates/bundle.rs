//! The ConfigBundle aggregate (SPEC §10, R-WORKER-2): one stream per digest, so a bundle
//! is synced once however often it is asked for. The digest is
//! [`crate::worker::bundle_digest`] of the Box and its effective manifest; `derived_from`
//! names the Box events the manifest came from (its activation, then each edit), the
//! links from the human approval to the bundle.
//!
//! Architecture Invariant: syncing never creates a Worker, and a bundle's digest is always
//! the one its own manifest gives.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;
use crate::error::{ErrorCode, Refusing};
use crate::manifest::BoxManifest;
use crate::worker::bundle_digest;

/// Who syncs when no principal did (the registry after an activation).
pub const SYSTEM: &str = "system";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BundleData {
    pub digest: String,
    pub box_id: String,
    pub box_type: String,
    pub manifest_version: String,
    pub derived_from: Vec<String>,
    pub by: String,
    pub at: DateTime<Utc>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ConfigBundle {
    /// `None` until synced.
    pub data: Option<BundleData>,
}

#[derive(Debug, Clone)]
pub enum BundleCommand {
    /// Syncs the bundle of the Box's current `manifest` (the approved one plus its edits,
    /// as the Box's events left it); `derived_from` are those events' ids, activation first.
    Sync { digest: String, box_id: String, manifest: BoxManifest, derived_from: Vec<String>, by: String, at: DateTime<Utc> },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum BundleEvent {
    ConfigBundleSynced {
        digest: String,
        box_id: String,
        box_type: String,
        manifest_version: String,
        /// The effective manifest (`tools` is the effective tool list).
        manifest: BoxManifest,
        derived_from: Vec<String>,
        by: String,
        at: DateTime<Utc>,
    },
}

impl BundleEvent {
    pub fn name(&self) -> &'static str {
        match self {
            BundleEvent::ConfigBundleSynced { .. } => "ConfigBundleSynced",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BundleError {
    /// 409: the digest is not the manifest's.
    #[error("the bundle digest is not the digest of its manifest")]
    DigestMismatch,
    /// 422: the digest belongs to another Box's bundle.
    #[error("this bundle belongs to another Box")]
    OtherBox,
    /// 409: nothing links the bundle to an activation.
    #[error("a bundle derives from a Box activation")]
    NoActivation,
}

impl BundleError {
    pub fn code(&self) -> ErrorCode {
        match self {
            BundleError::DigestMismatch => ErrorCode::BundleDigestMismatch,
            BundleError::OtherBox => ErrorCode::BundleProfileIncompatible,
            BundleError::NoActivation => ErrorCode::BoxNotActive,
        }
    }
}

impl Refusing for BundleError {
    fn error_code(&self) -> ErrorCode {
        self.code()
    }
}

impl ConfigBundle {
    pub fn decide(&self, command: BundleCommand) -> Result<Vec<BundleEvent>, BundleError> {
        match command {
            BundleCommand::Sync { digest, box_id, manifest, derived_from, by, at } => {
                if let Some(d) = &self.data {
                    return if d.box_id == box_id { Ok(vec![]) } else { Err(BundleError::OtherBox) };
                }
                if digest != bundle_digest(&box_id, &manifest) {
                    return Err(BundleError::DigestMismatch);
                }
                if derived_from.is_empty() {
                    return Err(BundleError::NoActivation);
                }
                Ok(vec![BundleEvent::ConfigBundleSynced {
                    digest,
                    box_id,
                    box_type: manifest.box_type.to_string(),
                    manifest_version: manifest.version.clone(),
                    manifest: manifest.effective(),
                    derived_from,
                    by,
                    at,
                }])
            }
        }
    }

    pub fn evolve(&mut self, event: BundleEvent) {
        match event {
            BundleEvent::ConfigBundleSynced { digest, box_id, box_type, manifest_version, derived_from, by, at, .. } => {
                if self.data.is_none() {
                    self.data = Some(BundleData { digest, box_id, box_type, manifest_version, derived_from, by, at });
                }
            }
        }
    }
}

aggregate_via_decide!(ConfigBundle, super::types::CONFIG_BUNDLE, BundleCommand, BundleEvent, BundleError);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregates::testing::given_when;

    fn at() -> DateTime<Utc> {
        DateTime::from_timestamp(1_765_000_000, 0).expect("valid time")
    }

    fn manifest() -> BoxManifest {
        BoxManifest::from_yaml_str("box_type: sales\npurpose: Report sales.\ntools: [Read]\nos_operations: [notify:email]\nnotify: {email: {vault: ops, item: smtp, recipients: [a@example.com]}}\ncredentials: {allowed_vaults: [ops]}\n")
            .expect("valid")
            .manifest
    }

    fn sync(box_id: &str, m: &BoxManifest) -> BundleCommand {
        BundleCommand::Sync {
            digest: bundle_digest("b1", m),
            box_id: box_id.into(),
            manifest: m.clone(),
            derived_from: vec!["box/b1/1".into()],
            by: SYSTEM.into(),
            at: at(),
        }
    }

    #[test]
    fn r_worker_2_given_nothing_when_synced_then_the_bundle_holds_the_effective_manifest() {
        let events = given_when::<ConfigBundle>(vec![], sync("b1", &manifest())).expect("synced");
        let [BundleEvent::ConfigBundleSynced { digest, manifest: stored, box_type, derived_from, .. }] = &events[..] else { panic!("one event") };
        assert_eq!(digest, &bundle_digest("b1", &manifest()));
        assert_eq!(box_type, "sales");
        assert!(stored.tools.contains(&"notify:email".to_owned()), "effective tools: {:?}", stored.tools);
        assert_eq!(derived_from, &["box/b1/1".to_owned()]);
        // the stored effective manifest gives the same digest
        assert_eq!(bundle_digest("b1", stored), *digest);
        let payload = serde_json::to_value(&events[0]).expect("json");
        assert_eq!(crate::audit::actor_and_target("ConfigBundleSynced", "x", &payload), (SYSTEM.to_owned(), "b1".to_owned()));
    }

    #[test]
    fn r_worker_2_given_a_synced_bundle_when_synced_again_then_nothing_new() {
        let h = given_when::<ConfigBundle>(vec![], sync("b1", &manifest())).expect("synced");
        assert_eq!(given_when::<ConfigBundle>(h.clone(), sync("b1", &manifest())), Ok(vec![]));
        assert_eq!(given_when::<ConfigBundle>(h, sync("b2", &manifest())), Err(BundleError::OtherBox));
    }

    #[test]
    fn r_worker_2_a_digest_that_is_not_the_manifests_or_a_bundle_without_activation_is_refused() {
        let mut edited = manifest();
        edited.purpose = "Report better.".into();
        let BundleCommand::Sync { digest, .. } = sync("b1", &manifest());
        let forged = BundleCommand::Sync { digest, box_id: "b1".into(), manifest: edited, derived_from: vec!["box/b1/1".into()], by: "x".into(), at: at() };
        assert_eq!(given_when::<ConfigBundle>(vec![], forged).map_err(|e| e.code()), Err(ErrorCode::BundleDigestMismatch));
        let BundleCommand::Sync { digest, box_id, manifest, by, at, .. } = sync("b1", &manifest());
        let orphan = BundleCommand::Sync { digest, box_id, manifest, derived_from: vec![], by, at };
        assert_eq!(given_when::<ConfigBundle>(vec![], orphan), Err(BundleError::NoActivation));
    }
}
