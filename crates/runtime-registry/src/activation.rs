//! Activation (R-APPROVE-7 (3), R-BOX-1): driven by the recorded `DraftApproved` event, at
//! least once and idempotently. The token is verified (with public keys only) at the time
//! the decision was recorded, so a replay after a crash activates the same Box; the Box id
//! is derived from the draft id. A token that does not verify never makes a Box and leaves
//! a `SecurityViolation`.

use std::collections::HashMap;
use std::sync::Arc;

use atasira_domain::aggregates::boxes::{BoxCommand, box_id_for};
use atasira_domain::aggregates::draft::{Draft, DraftEvent};
use atasira_domain::aggregates::namespace::NamespaceCommand;
use atasira_domain::aggregates::security::{RegistrySecurity, SecurityCommand};
use atasira_domain::aggregates::types;
use atasira_platform::db::StoredEvent;
use atasira_platform::projection as proj;

use crate::Registry;

pub const NAME: &str = "registry_activation";

/// Runs until shutdown: for each draft event, act (idempotently), then mark it processed
/// (checkpoint) and ack.
pub async fn run(registry: Arc<Registry>, shutdown: tokio::sync::watch::Receiver<bool>) {
    let (db, feeds) = (registry.rt.db.clone(), registry.rt.feeds.clone());
    proj::consume(db, feeds, NAME, &[types::DRAFT], shutdown, move |event| {
        let registry = registry.clone();
        async move {
            handle(&registry, &event).await?;
            proj::mark_processed(&registry.rt.db, NAME, &event).await?;
            registry.rt.notify_committed();
            Ok(())
        }
    })
    .await
}

async fn handle(registry: &Registry, event: &StoredEvent) -> anyhow::Result<()> {
    let parsed: DraftEvent = serde_json::from_value(event.payload.clone())?;
    match parsed {
        DraftEvent::DraftApproved { draft_id, box_type, approved_at, token, .. } => {
            atasira_platform::failpoint_delay("activation").await;
            let draft: Draft = registry.rt.db.load(&draft_id).await?;
            let Some(data) = draft.data else {
                anyhow::bail!("approved draft {draft_id} has no submission");
            };
            // Unreachable approval service: an error, so this event is retried, not refused.
            let keyring = registry.keys.keyring_for(&token.claims.key_id).await?;
            let approval = match keyring.verify(&token, approved_at) {
                Ok(v) => v,
                Err(e) => {
                    record_violation(registry, &token.claims.approver, &draft_id, &format!("approval token refused: {}", e.reason())).await?;
                    release(registry, &box_type, &draft_id, "invalid approval token").await?;
                    return Ok(());
                }
            };
            let box_id = box_id_for(&draft_id);
            let bind = NamespaceCommand::Bind {
                box_type: box_type.clone(),
                draft_id: draft_id.clone(),
                box_id: box_id.clone(),
                now: chrono::Utc::now(),
                max_boxes: registry.config.max_boxes,
            };
            if let Err(e) = registry.namespace(bind).await {
                // Reserved before the decision, so this only happens when the reservation
                // lapsed and someone else took the box_type or the last slot meanwhile.
                tracing::error!(draft_id, box_type, error = %e, "approved draft cannot be activated");
                return Ok(());
            }
            let activate = BoxCommand::Activate { box_id: box_id.clone(), draft_id: draft_id.clone(), manifest: data.manifest, approval, at: approved_at };
            match registry.boxes.execute(&box_id, activate, HashMap::new()).await {
                Ok(()) => Ok(()),
                Err(cqrs_es::AggregateError::UserError(e)) if e.code().is_security_violation() => {
                    record_violation(registry, &token.claims.approver, &draft_id, &e.to_string()).await?;
                    release(registry, &box_type, &draft_id, "invalid approval token").await
                }
                Err(cqrs_es::AggregateError::UserError(e)) => {
                    tracing::error!(draft_id, error = %e, "activation refused");
                    Ok(())
                }
                Err(cqrs_es::AggregateError::AggregateConflict) => Ok(()),
                Err(e) => Err(anyhow::anyhow!("activation failed: {e}")),
            }
        }
        DraftEvent::DraftRejected { draft_id, box_type, .. } => release(registry, &box_type, &draft_id, "rejected").await,
        DraftEvent::DraftWithdrawn { draft_id, .. } | DraftEvent::DraftExpired { draft_id, .. } => {
            let draft: Draft = registry.rt.db.load(&draft_id).await?;
            match draft.data {
                Some(d) => release(registry, d.manifest.box_type.as_str(), &draft_id, "draft closed").await,
                None => Ok(()),
            }
        }
        DraftEvent::DraftSubmitted { .. } => Ok(()),
    }
}

async fn release(registry: &Registry, box_type: &str, draft_id: &str, reason: &str) -> anyhow::Result<()> {
    let command = NamespaceCommand::Release { box_type: box_type.to_owned(), draft_id: draft_id.to_owned(), reason: reason.to_owned() };
    registry.namespace(command).await.map_err(|e| anyhow::anyhow!("release failed: {e}"))
}

async fn record_violation(registry: &Registry, actor: &str, target: &str, reason: &str) -> anyhow::Result<()> {
    // One violation per refused approval event: replays find it recorded.
    let id = format!("invalid-token:{target}");
    let command = SecurityCommand::Record {
        service: "runtime-registry".into(),
        actor: actor.to_owned(),
        target: target.to_owned(),
        kind: "invalid_approval_token".into(),
        reason: reason.to_owned(),
        at: chrono::Utc::now(),
    };
    registry.rt.db.cqrs::<RegistrySecurity>().execute(&id, command, HashMap::new()).await.map_err(|e| anyhow::anyhow!("cannot record the violation: {e}"))
}
