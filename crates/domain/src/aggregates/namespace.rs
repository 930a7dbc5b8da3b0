//! The box-type namespace (R-APPROVE-7, R-BOX-3): one aggregate for the whole cluster
//! (id [`NAMESPACE_ID`]) that hands out box_types and Box slots, so that "one Box per
//! box_type" and "at most `ATASIRA_MAX_BOXES` active Boxes" hold under concurrency: every
//! change goes through this one event stream with optimistic concurrency.
//!
//! A box_type entry is either a draft's reservation (expires at the activation deadline
//! unless bound) or held by a Box (forever, until archived). An entry counts against the
//! limit while it holds a slot: reservations and active Boxes do, stopped Boxes do not.
//! Slot changes use the two catalog events: `BoxTypeReserved` takes (or re-takes) a slot,
//! `BoxTypeReleased` gives back a slot (`scope: slot`, stop) or the whole box_type
//! (`scope: box_type`, archive, rejection, expiry).

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::aggregates::aggregate_via_decide;
use crate::error::ErrorCode;

/// The single aggregate id of the namespace.
pub const NAMESPACE_ID: &str = "box-types";

/// `ATASIRA_MAX_BOXES` default (R-BOX-3).
pub const DEFAULT_MAX_BOXES: usize = 3;

/// One box_type's hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// The draft whose approval this reservation is for.
    pub draft_id: Option<String>,
    /// Set once a Box holds the box_type.
    pub box_id: Option<String>,
    /// Reservations not yet bound to a Box lapse here.
    pub expires_at: Option<DateTime<Utc>>,
    /// Counts against `ATASIRA_MAX_BOXES`.
    pub holds_slot: bool,
}

impl Entry {
    /// A Box's hold never lapses; a reservation lapses after its deadline.
    fn is_live(&self, now: DateTime<Utc>) -> bool {
        self.box_id.is_some() || self.expires_at.is_none_or(|t| now <= t)
    }
    fn counts(&self, now: DateTime<Utc>) -> bool {
        self.holds_slot && self.is_live(now)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BoxTypeNamespace {
    pub entries: BTreeMap<String, Entry>,
    /// Boxes that were archived: they never hold a box_type or a slot again, so a replayed
    /// activation of one binds nothing.
    pub retired: BTreeSet<String>,
}

/// What is given back by a `BoxTypeReleased`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReleaseScope {
    /// The slot only; the Box keeps its box_type (stop).
    Slot,
    /// The box_type and its slot (archive, rejection, expiry, lost race).
    BoxType,
}

#[derive(Debug, Clone)]
pub enum NamespaceCommand {
    /// R-APPROVE-7 (1): reserve for a draft before its decision is recorded. Idempotent per
    /// draft. `foreign_manifest_file`: a file at `<manifests_dir>/<box_type>.yaml` that the
    /// registry did not write (R-BOX-2), checked by the adapter.
    Reserve { box_type: String, draft_id: String, now: DateTime<Utc>, deadline: DateTime<Utc>, max_boxes: usize, foreign_manifest_file: bool },
    /// A reservation whose decision lost, was a rejection, or was withdrawn.
    Release { box_type: String, draft_id: String, reason: String },
    /// A reservation past its deadline with no recorded approval.
    Expire { box_type: String, draft_id: String, now: DateTime<Utc> },
    /// R-APPROVE-7 (3): the Box activated for this draft now holds the box_type. Succeeds
    /// even after the deadline while nobody else took the box_type, so a crash between
    /// decision and activation still ends in exactly one Box. A Box archived already binds
    /// nothing (a replayed approval): it takes neither its box_type nor a slot again.
    Bind { box_type: String, draft_id: String, box_id: String, now: DateTime<Utc>, max_boxes: usize },
    /// R-BOX-7 stop: the slot is freed, the box_type kept.
    FreeSlot { box_type: String, box_id: String },
    /// R-BOX-7 resume: takes a slot again or `box_limit_reached`.
    TakeSlot { box_type: String, box_id: String, now: DateTime<Utc>, max_boxes: usize },
    /// R-BOX-7 archive: the box_type can be drafted again.
    Retire { box_type: String, box_id: String },
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum NamespaceEvent {
    BoxTypeReserved { box_type: String, draft_id: Option<String>, box_id: Option<String>, expires_at: Option<DateTime<Utc>> },
    BoxTypeReleased { box_type: String, draft_id: Option<String>, box_id: Option<String>, scope: ReleaseScope, reason: String },
}

impl NamespaceEvent {
    pub fn name(&self) -> &'static str {
        match self {
            NamespaceEvent::BoxTypeReserved { .. } => "BoxTypeReserved",
            NamespaceEvent::BoxTypeReleased { .. } => "BoxTypeReleased",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NamespaceError {
    /// 409 (R-BOX-3).
    #[error("box_type {0:?} already has a Box or a pending reservation")]
    BoxTypeExists(String),
    /// 409 (R-BOX-3).
    #[error("{max} Boxes are active already (ATASIRA_MAX_BOXES); stop or archive one first")]
    BoxLimitReached { max: usize },
    /// 409 (R-BOX-2).
    #[error("a manifest file for {0:?} exists that atasira did not write; it is never overwritten")]
    ManifestExists(String),
    /// 409: the Box does not hold this box_type (archived, or never activated).
    #[error("box_type {0:?} is not held by this Box")]
    NotHeld(String),
}

impl NamespaceError {
    pub fn code(&self) -> ErrorCode {
        match self {
            NamespaceError::BoxTypeExists(_) => ErrorCode::BoxTypeExists,
            NamespaceError::BoxLimitReached { .. } => ErrorCode::BoxLimitReached,
            NamespaceError::ManifestExists(_) => ErrorCode::ManifestExists,
            NamespaceError::NotHeld(_) => ErrorCode::BoxNotActive,
        }
    }
}

impl BoxTypeNamespace {
    /// Slots in use at `now`, not counting `except`.
    fn used_slots(&self, now: DateTime<Utc>, except: &str) -> usize {
        self.entries.iter().filter(|(bt, e)| bt.as_str() != except && e.counts(now)).count()
    }

    /// Frees a lapsed reservation of another draft before it is taken over.
    fn lapse(&self, box_type: &str, now: DateTime<Utc>) -> Option<NamespaceEvent> {
        let e = self.entries.get(box_type)?;
        (!e.is_live(now)).then(|| NamespaceEvent::BoxTypeReleased {
            box_type: box_type.to_owned(),
            draft_id: e.draft_id.clone(),
            box_id: None,
            scope: ReleaseScope::BoxType,
            reason: "expired".into(),
        })
    }

    pub fn decide(&self, command: NamespaceCommand) -> Result<Vec<NamespaceEvent>, NamespaceError> {
        match command {
            NamespaceCommand::Reserve { box_type, draft_id, now, deadline, max_boxes, foreign_manifest_file } => {
                let mut events = Vec::new();
                if let Some(e) = self.entries.get(&box_type) {
                    if e.is_live(now) {
                        if e.draft_id.as_deref() == Some(draft_id.as_str()) {
                            return Ok(vec![]);
                        }
                        return Err(NamespaceError::BoxTypeExists(box_type));
                    }
                    events.extend(self.lapse(&box_type, now));
                }
                if foreign_manifest_file {
                    return Err(NamespaceError::ManifestExists(box_type));
                }
                if self.used_slots(now, &box_type) >= max_boxes {
                    return Err(NamespaceError::BoxLimitReached { max: max_boxes });
                }
                events.push(NamespaceEvent::BoxTypeReserved { box_type, draft_id: Some(draft_id), box_id: None, expires_at: Some(deadline) });
                Ok(events)
            }
            NamespaceCommand::Release { box_type, draft_id, reason } => Ok(self.release_reservation(box_type, draft_id, reason)),
            NamespaceCommand::Expire { box_type, draft_id, now } => match self.entries.get(&box_type) {
                Some(e) if !e.is_live(now) && e.draft_id.as_deref() == Some(draft_id.as_str()) => {
                    Ok(self.release_reservation(box_type, draft_id, "expired".into()))
                }
                _ => Ok(vec![]),
            },
            NamespaceCommand::Bind { box_type, draft_id, box_id, now, max_boxes } => {
                if self.retired.contains(&box_id) {
                    return Ok(vec![]);
                }
                let mut events = Vec::new();
                match self.entries.get(&box_type) {
                    Some(e) if e.box_id.as_deref() == Some(box_id.as_str()) => return Ok(vec![]),
                    Some(e) if e.draft_id.as_deref() == Some(draft_id.as_str()) && e.box_id.is_none() => {
                        // A lapsed reservation stopped counting: others may have taken
                        // its slot meanwhile, so it needs a free one again.
                        if !e.is_live(now) && self.used_slots(now, &box_type) >= max_boxes {
                            return Err(NamespaceError::BoxLimitReached { max: max_boxes });
                        }
                    }
                    Some(e) if e.is_live(now) => return Err(NamespaceError::BoxTypeExists(box_type)),
                    Some(_) => {
                        events.extend(self.lapse(&box_type, now));
                        if self.used_slots(now, &box_type) >= max_boxes {
                            return Err(NamespaceError::BoxLimitReached { max: max_boxes });
                        }
                    }
                    None => {
                        if self.used_slots(now, &box_type) >= max_boxes {
                            return Err(NamespaceError::BoxLimitReached { max: max_boxes });
                        }
                    }
                }
                events.push(NamespaceEvent::BoxTypeReserved { box_type, draft_id: Some(draft_id), box_id: Some(box_id), expires_at: None });
                Ok(events)
            }
            NamespaceCommand::FreeSlot { box_type, box_id } => {
                let e = self.held_by(&box_type, &box_id)?;
                if !e.holds_slot {
                    return Ok(vec![]);
                }
                Ok(vec![NamespaceEvent::BoxTypeReleased {
                    box_type,
                    draft_id: None,
                    box_id: Some(box_id),
                    scope: ReleaseScope::Slot,
                    reason: "stopped".into(),
                }])
            }
            NamespaceCommand::TakeSlot { box_type, box_id, now, max_boxes } => {
                let e = self.held_by(&box_type, &box_id)?;
                if e.holds_slot {
                    return Ok(vec![]);
                }
                if self.used_slots(now, &box_type) >= max_boxes {
                    return Err(NamespaceError::BoxLimitReached { max: max_boxes });
                }
                Ok(vec![NamespaceEvent::BoxTypeReserved { box_type, draft_id: None, box_id: Some(box_id), expires_at: None }])
            }
            NamespaceCommand::Retire { box_type, box_id } => match self.entries.get(&box_type) {
                Some(e) if e.box_id.as_deref() == Some(box_id.as_str()) => Ok(vec![NamespaceEvent::BoxTypeReleased {
                    box_type,
                    draft_id: None,
                    box_id: Some(box_id),
                    scope: ReleaseScope::BoxType,
                    reason: "archived".into(),
                }]),
                _ => Ok(vec![]),
            },
        }
    }

    fn held_by(&self, box_type: &str, box_id: &str) -> Result<&Entry, NamespaceError> {
        self.entries.get(box_type).filter(|e| e.box_id.as_deref() == Some(box_id)).ok_or_else(|| NamespaceError::NotHeld(box_type.to_owned()))
    }

    /// Releases a draft's unbound reservation; a no-op if it is gone, bound or another's.
    fn release_reservation(&self, box_type: String, draft_id: String, reason: String) -> Vec<NamespaceEvent> {
        match self.entries.get(&box_type) {
            Some(e) if e.box_id.is_none() && e.draft_id.as_deref() == Some(draft_id.as_str()) => {
                vec![NamespaceEvent::BoxTypeReleased { box_type, draft_id: Some(draft_id), box_id: None, scope: ReleaseScope::BoxType, reason }]
            }
            _ => vec![],
        }
    }

    pub fn evolve(&mut self, event: NamespaceEvent) {
        match event {
            NamespaceEvent::BoxTypeReserved { box_type, draft_id, box_id, expires_at } => {
                let entry = self.entries.entry(box_type).or_insert(Entry { draft_id: None, box_id: None, expires_at: None, holds_slot: true });
                if draft_id.is_some() {
                    entry.draft_id = draft_id;
                }
                if box_id.is_some() {
                    entry.box_id = box_id;
                }
                entry.expires_at = expires_at;
                entry.holds_slot = true;
            }
            NamespaceEvent::BoxTypeReleased { box_type, scope: ReleaseScope::Slot, .. } => {
                if let Some(e) = self.entries.get_mut(&box_type) {
                    e.holds_slot = false;
                }
            }
            NamespaceEvent::BoxTypeReleased { box_type, box_id, scope: ReleaseScope::BoxType, .. } => {
                self.entries.remove(&box_type);
                // Only archiving releases a Box's box_type (a reservation has no Box yet).
                self.retired.extend(box_id);
            }
        }
    }
}

aggregate_via_decide!(BoxTypeNamespace, super::types::BOX_TYPE_NAMESPACE, NamespaceCommand, NamespaceEvent, NamespaceError);

#[cfg(test)]
mod tests;
