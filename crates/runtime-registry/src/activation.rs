//! Activation (R-APPROVE-7 (3), R-BOX-1): driven by the recorded `DraftApproved` event, at
//! least once and idempotently. The draft's own stream must hold that decision (same
//! draft, approver, time and token, the token binding the draft's manifest digest); a
//! `DraftApproved` it does not hold is a forgery: no Box, a `SecurityViolation`. The token
//! is then verified with the public keys the approval service published in the store, at
//! the time the decision was recorded, so a replay after a crash activates the same Box;
//! the Box id is derived from the draft id. A token that does not verify never makes a
//! Box and leaves a `SecurityViolation`. A replayed approval of an archived Box binds
//! nothing and activates nothing: the namespace and the Box add no event.

use std::collections::HashMap;
use std::sync::Arc;

use atasira_domain::ErrorCode;
use atasira_domain::aggregates::boxes::{BoxCommand, box_id_for};
use atasira_domain::aggregates::bundle::SYSTEM;
use atasira_domain::aggregates::draft::{ChangeOf, Draft, DraftEvent};
use atasira_domain::aggregates::namespace::NamespaceCommand;
use atasira_domain::aggregates::security::{RegistrySecurity, SecurityCommand};
use atasira_domain::aggregates::types;
use atasira_platform::projection as proj;
use atasira_platform::store::{Retry, StoredEvent};

use crate::Registry;

pub const NAME: &str = "registry_activation";

/// What activation reads.
pub const READS: &[&str] = &[types::DRAFT];

/// A read-your-writes wait does not wait for activation to pass over a submission: a
/// draft stream's first event is its submission and no later one is (`Draft::decide`
/// submits only a draft that has none), and a submission needs nothing from activation.
pub fn passes_over(event_id: &str) -> bool {
    event_id.rsplit('/').next() == Some("1")
}

/// Runs until shutdown: for each draft event, act (idempotently), then mark it processed
/// (checkpoint) and ack. Its feed lingers while no wait asks for a decision, so that the
/// submissions it passes over gather out of the way of the writes being waited for.
pub async fn run(registry: Arc<Registry>, shutdown: tokio::sync::watch::Receiver<bool>) {
    let (db, feeds) = (registry.rt.db.clone(), registry.rt.feeds.lingering());
    // A submitted draft needs nothing from activation: only decisions are acted on.
    let acts_on = |event: &StoredEvent| event.event_type != DraftEvent::SUBMITTED;
    proj::consume_selected(db, feeds, NAME, READS, shutdown, acts_on, move |event| {
        let registry = registry.clone();
        async move {
            handle(&registry, &event).await?;
            proj::mark_processed(&registry.rt.db, NAME, &event).await?;
            Ok(())
        }
    })
    .await
}

async fn handle(registry: &Registry, event: &StoredEvent) -> anyhow::Result<()> {
    let parsed: DraftEvent = event.decode()?;
    match parsed {
        DraftEvent::DraftApproved { .. } => activate(registry, parsed).await,
        // A change request holds no reservation: its Box keeps its box_type and slot.
        DraftEvent::DraftRejected { draft_id, box_type, .. } => match registry.rt.db.load::<Draft>(&draft_id).await?.data {
            Some(d) if d.change.is_some() => Ok(()),
            _ => release(registry, &box_type, &draft_id, "rejected").await,
        },
        DraftEvent::DraftWithdrawn { draft_id, .. } | DraftEvent::DraftExpired { draft_id, .. } => {
            let draft: Draft = registry.rt.db.load(&draft_id).await?;
            match draft.data {
                Some(d) if d.change.is_none() => release(registry, d.manifest.box_type.as_str(), &draft_id, "draft closed").await,
                _ => Ok(()),
            }
        }
        DraftEvent::DraftSubmitted { .. } | DraftEvent::DraftApprovalGiven { .. } => Ok(()),
    }
}

async fn activate(registry: &Registry, approved: DraftEvent) -> anyhow::Result<()> {
    atasira_platform::failpoint_delay("activation").await;
    let DraftEvent::DraftApproved { draft_id, box_type, approved_at, token, .. } = &approved else {
        return Ok(());
    };
    let draft: Draft = registry.rt.db.load(draft_id).await?;
    // The decision must be the draft stream's own, whatever delivered this event.
    if !draft.holds_approval(&approved) {
        // Nothing to release: the draft's reservation (if any) belongs to its real decision.
        let reason = "no matching DraftApproved on the draft's stream (draft, manifest digest, approver, token)";
        return record_violation(registry, Violation::UnrecordedApproval, &token.claims.approver, draft_id, reason).await;
    }
    let Some(data) = draft.data else {
        anyhow::bail!("approved draft {draft_id} has no submission");
    };
    // The store unreadable: an error, so this event is retried, not refused.
    let keyring = registry.keys.keyring_for(&token.claims.key_id).await?;
    let approval = match keyring.verify(token, *approved_at) {
        Ok(v) => v,
        Err(e) => {
            let reason = format!("approval token refused: {}", e.reason());
            record_violation(registry, Violation::InvalidToken, &token.claims.approver, draft_id, &reason).await?;
            return release(registry, box_type, draft_id, "invalid approval token").await;
        }
    };
    if let Some(change) = data.change {
        return apply_change(registry, draft_id, &token.claims.approver, data.manifest, change, approval, *approved_at).await;
    }
    let box_id = box_id_for(draft_id);
    // An archived Box binds nothing here and activates nothing below (a replay).
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
    let activate = BoxCommand::Activate { box_id: box_id.clone(), draft_id: draft_id.clone(), manifest: data.manifest, approval, at: *approved_at };
    // A conflict is retried on fresh state, where the aggregate finds the Box active.
    match registry.boxes.execute(&box_id, activate, HashMap::new(), Retry::ONCE).await {
        Ok(_) => {
            // R-WORKER-2: the activated manifest's bundle (a replay finds it synced).
            let _ = registry.sync_after_change(&box_id, SYSTEM).await;
            Ok(())
        }
        Err(e) if e.code.is_security_violation() => {
            record_violation(registry, Violation::InvalidToken, &token.claims.approver, draft_id, &e.message).await?;
            release(registry, box_type, draft_id, "invalid approval token").await
        }
        Err(e) if e.code == ErrorCode::Internal || e.code == ErrorCode::ServiceUnavailable => Err(anyhow::anyhow!("activation failed: {e}")),
        Err(e) => {
            tracing::error!(draft_id, error = %e, "activation refused");
            Ok(())
        }
    }
}

/// R-CHANGE-1: an approved change request replaces the Box's manifest, if the Box still has
/// the one it was made on; new Workers then get the new bundle.
async fn apply_change(
    registry: &Registry,
    draft_id: &str,
    approver: &str,
    manifest: atasira_domain::BoxManifest,
    change: ChangeOf,
    approval: atasira_domain::token::VerifiedApproval,
    at: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<()> {
    let command = BoxCommand::ApplyChange { draft_id: draft_id.to_owned(), manifest, base_digest: change.base_digest, approval, at };
    match registry.boxes.execute(&change.box_id, command, HashMap::new(), Retry::ONCE).await {
        Ok(_) => {
            let _ = registry.sync_after_change(&change.box_id, SYSTEM).await;
            Ok(())
        }
        Err(e) if e.code.is_security_violation() => record_violation(registry, Violation::InvalidToken, approver, draft_id, &e.message).await,
        Err(e) if e.code == ErrorCode::Internal || e.code == ErrorCode::ServiceUnavailable => Err(anyhow::anyhow!("applying the change failed: {e}")),
        Err(e) => {
            tracing::error!(draft_id, error = %e, "the approved change was not applied");
            Ok(())
        }
    }
}

async fn release(registry: &Registry, box_type: &str, draft_id: &str, reason: &str) -> anyhow::Result<()> {
    let command = NamespaceCommand::Release { box_type: box_type.to_owned(), draft_id: draft_id.to_owned(), reason: reason.to_owned() };
    registry.namespace(command).await.map_err(|e| anyhow::anyhow!("release failed: {e}"))
}

/// Why an approval made no Box.
#[derive(Debug, Clone, Copy)]
enum Violation {
    /// The token does not verify or does not bind the draft.
    InvalidToken,
    /// The draft's stream does not hold this decision.
    UnrecordedApproval,
}

async fn record_violation(registry: &Registry, violation: Violation, actor: &str, target: &str, reason: &str) -> anyhow::Result<()> {
    // One violation per draft and kind: replays find it recorded.
    let (id, kind) = match violation {
        Violation::InvalidToken => (format!("invalid-token:{target}"), "invalid_approval_token"),
        Violation::UnrecordedApproval => (format!("unrecorded-approval:{target}"), "unrecorded_approval"),
    };
    let command = SecurityCommand::Record {
        service: "runtime-registry".into(),
        actor: actor.to_owned(),
        target: target.to_owned(),
        kind: kind.into(),
        reason: reason.to_owned(),
        at: chrono::Utc::now(),
    };
    registry
        .rt
        .db
        .cqrs::<RegistrySecurity>()
        .execute(&id, command, HashMap::new(), Retry::ONCE)
        .await
        .map(|_| ())
        .map_err(|e| anyhow::anyhow!("cannot record the violation: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r_box_9_a_wait_passes_over_a_drafts_submission_and_nothing_else() {
        // given a draft's submission, its first event
        let submission = atasira_platform::store::StoredEvent::event_id_of(types::DRAFT, "d1", 1);
        // then a wait does not wait for activation on it, and does on every later event
        assert!(passes_over(&submission));
        for sequence in [2, 10, 11, 21, 101] {
            let later = atasira_platform::store::StoredEvent::event_id_of(types::DRAFT, "d1", sequence);
            assert!(!passes_over(&later), "{later} passed over");
        }
    }
}
