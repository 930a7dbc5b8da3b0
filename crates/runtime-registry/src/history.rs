//! A Box's whole life (`GET /boxes/{id}/history`), read from the store, the only truth:
//! its own events and the provisioning outcomes of its `access` streams, in commit order,
//! each as a typed entry (who, when, what changed).

use atasira_contracts::{convert, v1};
use atasira_domain::aggregates::access::AccessEvent;
use atasira_domain::aggregates::boxes::{BoxEvent, BoxState};
use atasira_domain::aggregates::types;
use atasira_platform::store::{Cursor, Db, StoredEvent};

use v1::box_history_entry::{AccessOutcome, Activated, Changed, Edited, Kind, StateChanged, UserAssigned, UserUnassigned};

/// Largest page of history entries, and the size of a page when none is asked for.
pub const PAGE_MAX: u32 = 200;
pub const PAGE_DEFAULT: u32 = 50;

/// A page of the Box's history after `after`, and the cursor of the next page (`None` on
/// the last).
pub async fn page(db: &Db, box_id: &str, limit: u32, after: Cursor) -> anyhow::Result<(Vec<v1::BoxHistoryEntry>, Option<Cursor>)> {
    let limit = if limit == 0 { PAGE_DEFAULT } else { limit.min(PAGE_MAX) } as usize;
    let events = db.history(types::BOX, box_id, types::ACCESS, after, i64::try_from(limit).unwrap_or(i64::MAX) + 1).await?;
    let more = events.len() > limit;
    let kept = &events[..events.len().min(limit)];
    let entries = kept.iter().map(entry).collect::<anyhow::Result<Vec<_>>>()?;
    Ok((entries, if more { kept.last().map(StoredEvent::cursor) } else { None }))
}

/// One stored event of a Box (or of one of its access streams) as a history entry.
pub fn entry(event: &StoredEvent) -> anyhow::Result<v1::BoxHistoryEntry> {
    let (actor, at, kind) = if event.aggregate_type == types::ACCESS {
        let (index, access, provisioned, outcome, attempts, at) = match event.decode::<AccessEvent>()? {
            AccessEvent::AccessProvisioned { index, access, detail, attempts, at, .. } => (index, access, true, detail, attempts, at),
            AccessEvent::AccessProvisionFailed { index, access, reason, attempts, at, .. } => (index, access, false, reason, attempts, at),
        };
        let status = if provisioned { v1::provisioning::Status::Provisioned } else { v1::provisioning::Status::Failed };
        let (detail, reason) = if provisioned { (outcome, String::new()) } else { (String::new(), outcome) };
        ("system".to_owned(), at, Kind::Access(AccessOutcome { index, access, status: status as i32, detail, reason, attempts }))
    } else {
        let state = |s: BoxState| StateChanged { state: convert::box_state_to_wire(s) as i32 };
        match event.decode::<BoxEvent>()? {
            BoxEvent::BoxActivated { box_type, draft_id, manifest, manifest_digest, approved_by, approval_key_id, activated_at, .. } => (
                approved_by.clone(),
                activated_at,
                Kind::Activated(Activated { draft_id, box_type, approved_by, manifest_version: manifest.version, manifest_digest, approval_key_id }),
            ),
            BoxEvent::BoxUserAssigned { user_id, role_in_box, assigned_by, at, .. } => {
                (assigned_by, at, Kind::UserAssigned(UserAssigned { user_id, role_in_box: convert::box_role_to_wire(role_in_box) as i32 }))
            }
            BoxEvent::BoxUserUnassigned { user_id, role_in_box, unassigned_by, at, .. } => {
                (unassigned_by, at, Kind::UserUnassigned(UserUnassigned { user_id, role_in_box: convert::box_role_to_wire(role_in_box) as i32 }))
            }
            BoxEvent::BoxManifestEdited { manifest, changed_keys, edited_by, at, .. } => {
                (edited_by, at, Kind::ManifestEdited(Edited { changed_keys, manifest_version: manifest.version }))
            }
            BoxEvent::BoxConfigEdited { manifest, changed_keys, edited_by, at, .. } => {
                (edited_by, at, Kind::ConfigEdited(Edited { changed_keys, manifest_version: manifest.version }))
            }
            BoxEvent::BoxStopped { by, at, .. } => (by, at, Kind::Stopped(state(BoxState::Stopped))),
            BoxEvent::BoxResumed { by, at, .. } => (by, at, Kind::Resumed(state(BoxState::Idle))),
            BoxEvent::BoxArchived { by, at, .. } => (by, at, Kind::Archived(state(BoxState::Archived))),
            BoxEvent::BoxManifestChanged { draft_id, manifest, manifest_digest, diff, approved_by, approval_key_id, at, .. } => (
                approved_by.clone(),
                at,
                Kind::Changed(Changed {
                    draft_id,
                    approved_by,
                    manifest_version: manifest.version,
                    manifest_digest,
                    approval_key_id,
                    added: diff.added,
                    removed: diff.removed,
                }),
            ),
        }
    };
    Ok(v1::BoxHistoryEntry {
        event_id: event.event_id.clone(),
        position: u64::try_from(event.position).unwrap_or(0),
        at: Some(convert::timestamp(at)),
        actor,
        kind: Some(kind),
    })
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};

    use super::*;

    fn t(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 5).expect("time")
    }

    fn stored(aggregate_type: &str, aggregate_id: &str, payload: serde_json::Value) -> StoredEvent {
        StoredEvent {
            event_id: format!("{aggregate_type}/{aggregate_id}/1"),
            aggregate_type: aggregate_type.into(),
            aggregate_id: aggregate_id.into(),
            sequence: 1,
            position: 9,
            tx_id: 0,
            event_type: String::new(),
            event_version: "1".into(),
            payload: payload.into(),
            metadata: serde_json::json!({}).into(),
            recorded_at_ms: 0,
        }
    }

    #[test]
    fn given_box_events_then_typed_entries_name_who_when_and_what() {
        // R-BOX-6, R-BOX-7: an unassignment keeps the role the user had; state changes name the new state
        let unassigned = BoxEvent::BoxUserUnassigned {
            box_id: "b1".into(),
            user_id: "erin".into(),
            role_in_box: atasira_domain::aggregates::boxes::BoxRole::Member,
            unassigned_by: "alice".into(),
            at: t(1),
        };
        let e = entry(&stored("box", "b1", serde_json::to_value(&unassigned).expect("json"))).expect("entry");
        assert_eq!((e.actor.as_str(), e.position, e.event_id.as_str()), ("alice", 9, "box/b1/1"));
        assert_eq!(convert::time_from_wire(e.at.as_ref()), Some(t(1)));
        assert_eq!(e.kind, Some(Kind::UserUnassigned(UserUnassigned { user_id: "erin".into(), role_in_box: v1::BoxRole::Member as i32 })));
        let stopped = BoxEvent::BoxStopped { box_id: "b1".into(), box_type: "sales".into(), by: "bob".into(), at: t(2) };
        let e = entry(&stored("box", "b1", serde_json::to_value(&stopped).expect("json"))).expect("entry");
        assert_eq!(e.kind, Some(Kind::Stopped(StateChanged { state: v1::BoxState::Stopped as i32 })));
    }

    #[test]
    fn given_edits_then_entries_name_the_changed_keys_and_the_new_version() {
        // R-EDIT-1, R-EDIT-3: who edited, when, which keys, the version after the edit
        let request = atasira_domain::draft_request::BoxDraftCreateRequest { box_type: Some("sales".into()), purpose: Some("p".into()), ..Default::default() };
        let mut manifest = request.plan().expect("plan").manifest;
        manifest.version = "1.1.0".into();
        let edits = [
            BoxEvent::BoxManifestEdited {
                box_id: "b1".into(),
                manifest: manifest.clone(),
                changed_keys: vec!["purpose".into()],
                edited_by: "alice".into(),
                at: t(4),
            },
            BoxEvent::BoxConfigEdited {
                box_id: "b1".into(),
                manifest,
                changed_keys: vec!["trigger_schedule".into()],
                edited_by: "dave".into(),
                at: t(5),
                policy: None,
            },
        ];
        let entries: Vec<v1::BoxHistoryEntry> =
            edits.iter().map(|e| entry(&stored("box", "b1", serde_json::to_value(e).expect("json"))).expect("entry")).collect();
        assert_eq!((entries[0].actor.as_str(), entries[1].actor.as_str()), ("alice", "dave"));
        assert_eq!(entries[0].kind, Some(Kind::ManifestEdited(Edited { changed_keys: vec!["purpose".into()], manifest_version: "1.1.0".into() })));
        assert_eq!(entries[1].kind, Some(Kind::ConfigEdited(Edited { changed_keys: vec!["trigger_schedule".into()], manifest_version: "1.1.0".into() })));
    }

    #[test]
    fn given_a_failed_provisioning_then_the_entry_is_the_systems_with_its_reason() {
        // R-PROV-1
        let failed = AccessEvent::AccessProvisionFailed {
            box_id: "b1".into(),
            box_type: "sales".into(),
            index: 0,
            access: "git_remote u".into(),
            reason: "unreachable".into(),
            attempts: 5,
            at: t(3),
        };
        let e = entry(&stored("access", "b1/0", serde_json::to_value(&failed).expect("json"))).expect("entry");
        assert_eq!(e.actor, "system");
        let Some(Kind::Access(outcome)) = e.kind else { panic!("{e:?}") };
        assert_eq!(
            (outcome.status, outcome.reason.as_str(), outcome.detail.as_str(), outcome.attempts),
            (v1::provisioning::Status::Failed as i32, "unreachable", "", 5)
        );
    }
}
