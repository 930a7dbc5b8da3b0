//! What this process appended lately, handed to its own feeds without a read (SQLite).
//!
//! In embedded mode every command of the system appends in this process, one at a time
//! (the writer's turn), so the events it just committed are, most of the time, all the
//! events there are. Recording them here, in position order, lets a feed take its next
//! batch from memory instead of asking SQLite for rows and parsing their JSON again, once
//! per consumer.
//!
//! The record only serves what it can prove complete: it holds a run of events whose
//! positions follow each other without a hole. SQLite gives a new row the position after
//! the greatest one, so a hole means that something else (another process on the same
//! file, such as `atasira tokens`) appended in between; the run then starts again after
//! it, and a feed behind the run's start reads the store as before. A feed woken by its
//! safety-net poll, not by this process's bell, reads the store too, so events appended
//! by another process reach it as they did without the record.
//!
//! An event is recorded while its writer still holds the turn, right after its commit,
//! with the payload and metadata parsed from the very text stored: a feed gets the same
//! event from here as from a read.

use std::collections::VecDeque;
use std::sync::{Mutex, PoisonError};

use super::StoredEvent;

/// Events kept at most: the newest run, so a feed that fell behind further reads the store.
const KEEP: usize = 2048;

/// The text the kept events were parsed from, at most (large manifests make fewer events).
const KEEP_BYTES: usize = 8 << 20;

/// An event to record, and the size of the text it was parsed from.
#[derive(Debug)]
pub(super) struct Recorded {
    pub(super) event: StoredEvent,
    pub(super) bytes: usize,
}

/// The newest run of events this process appended, with no hole between them.
#[derive(Debug, Default)]
pub(super) struct Recent {
    run: Mutex<Run>,
}

#[derive(Debug, Default)]
struct Run {
    events: VecDeque<Recorded>,
    bytes: usize,
}

/// What [`Recent::after`] found.
#[derive(Debug)]
pub(super) struct Taken {
    pub(super) events: Vec<StoredEvent>,
    /// The position up to which every event was looked at (the last one returned when the
    /// limit cut the batch short).
    pub(super) covered: i64,
}

impl Recent {
    /// Records events just committed, in the order of their positions.
    pub(super) fn committed(&self, events: impl IntoIterator<Item = Recorded>) {
        let mut run = self.run.lock().unwrap_or_else(PoisonError::into_inner);
        for recorded in events {
            if run.events.back().is_some_and(|last| last.event.position + 1 != recorded.event.position) {
                // A hole (or a position out of order): the proof starts again here.
                run.events.clear();
                run.bytes = 0;
            }
            run.bytes += recorded.bytes;
            run.events.push_back(recorded);
            while run.events.len() > KEEP || (run.bytes > KEEP_BYTES && run.events.len() > 1) {
                if let Some(gone) = run.events.pop_front() {
                    run.bytes -= gone.bytes;
                }
            }
        }
    }

    /// The greatest position recorded, if any.
    pub(super) fn last(&self) -> Option<i64> {
        self.run.lock().unwrap_or_else(PoisonError::into_inner).events.back().map(|r| r.event.position)
    }

    /// The events after position `covered` of `types` (all when empty), at most `limit`,
    /// when the run holds every event after `covered`: `None` when it cannot tell (the run
    /// starts later, or holds nothing).
    pub(super) fn after(&self, covered: i64, types: &[&str], limit: usize) -> Option<Taken> {
        let run = self.run.lock().unwrap_or_else(PoisonError::into_inner);
        let first = run.events.front()?.event.position;
        if covered + 1 < first {
            return None;
        }
        let last = run.events.back().map_or(covered, |r| r.event.position);
        let skip = usize::try_from(covered + 1 - first).unwrap_or(usize::MAX);
        let mut events = Vec::new();
        for Recorded { event, .. } in run.events.iter().skip(skip) {
            if types.is_empty() || types.contains(&event.aggregate_type.as_str()) {
                events.push(event.clone());
                if events.len() >= limit {
                    return Some(Taken { covered: event.position, events });
                }
            }
        }
        Some(Taken { events, covered: last.max(covered) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(position: i64, aggregate_type: &str) -> Recorded {
        sized(position, aggregate_type, 100)
    }

    fn sized(position: i64, aggregate_type: &str, bytes: usize) -> Recorded {
        let event = StoredEvent {
            event_id: format!("{aggregate_type}/a/{position}"),
            aggregate_type: aggregate_type.into(),
            aggregate_id: "a".into(),
            sequence: position,
            position,
            tx_id: 0,
            event_type: "E".into(),
            event_version: "1".into(),
            payload: serde_json::json!({"n": position}).into(),
            metadata: serde_json::json!({}).into(),
            recorded_at_ms: 0,
        };
        Recorded { event, bytes }
    }

    fn positions(taken: &Taken) -> Vec<i64> {
        taken.events.iter().map(|e| e.position).collect()
    }

    #[test]
    fn a_feed_inside_the_run_gets_its_types_after_its_position() {
        // given events 10..=14 of two types
        let recent = Recent::default();
        recent.committed((10..=14).map(|p| event(p, if p % 2 == 0 { "draft" } else { "box" })));
        // when a feed of drafts that has seen up to 10 asks
        let taken = recent.after(10, &["draft"], 100).expect("inside the run");
        // then it gets 12 and 14, and has looked at everything up to 14
        assert_eq!((positions(&taken), taken.covered), (vec![12, 14], 14));
        // and a feed of every type gets every event after its position
        assert_eq!(positions(&recent.after(9, &[], 100).expect("just before the run")), vec![10, 11, 12, 13, 14]);
    }

    #[test]
    fn a_feed_before_the_run_or_an_empty_record_reads_the_store() {
        let recent = Recent::default();
        assert!(recent.after(0, &[], 10).is_none(), "nothing recorded proves nothing");
        recent.committed([event(10, "draft")]);
        assert!(recent.after(8, &[], 10).is_none(), "position 9 may be anywhere");
    }

    #[test]
    fn a_hole_in_the_positions_starts_the_run_again() {
        // given 10 and 11, then 13: something else appended 12
        let recent = Recent::default();
        recent.committed([event(10, "draft"), event(11, "draft")]);
        recent.committed([event(13, "draft")]);
        // then a feed at 11 cannot be served (12 is not here), one at 12 can
        assert!(recent.after(11, &[], 10).is_none());
        assert_eq!(positions(&recent.after(12, &[], 10).expect("run from 13")), vec![13]);
        assert_eq!(recent.last(), Some(13));
    }

    #[test]
    fn a_limit_cuts_the_batch_and_covers_only_what_it_returned() {
        let recent = Recent::default();
        recent.committed((1..=6).map(|p| event(p, "draft")));
        let taken = recent.after(0, &["draft"], 2).expect("run");
        assert_eq!((positions(&taken), taken.covered), (vec![1, 2], 2));
        // a feed past the run's end gets nothing and stays where it is
        let taken = recent.after(9, &["draft"], 2).expect("after the run");
        assert_eq!((positions(&taken), taken.covered), (vec![], 9));
    }

    #[test]
    fn large_events_make_the_run_shorter_but_the_newest_is_always_kept() {
        let recent = Recent::default();
        recent.committed((1..=5).map(|p| sized(p, "draft", KEEP_BYTES / 2)));
        assert!(recent.after(2, &[], 10).is_none(), "only what fits is kept");
        assert_eq!(positions(&recent.after(3, &[], 10).expect("the newest")), vec![4, 5]);
        recent.committed([sized(6, "draft", KEEP_BYTES * 2)]);
        assert_eq!(positions(&recent.after(5, &[], 10).expect("one too large is kept alone")), vec![6]);
    }

    #[test]
    fn the_run_keeps_only_the_newest_events() {
        let recent = Recent::default();
        recent.committed((1..=(KEEP as i64 + 10)).map(|p| event(p, "draft")));
        assert!(recent.after(5, &[], 10).is_none(), "fell out of the record");
        assert_eq!(positions(&recent.after(KEEP as i64 + 8, &[], 10).expect("newest")), vec![KEEP as i64 + 9, KEEP as i64 + 10]);
    }
}
