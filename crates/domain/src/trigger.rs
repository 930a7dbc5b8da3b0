//! When a Box runs on its own (R-TRIG-1): `trigger_type: schedule` Boxes at each tick of
//! their `trigger_schedule`, `event` Boxes at each message on their `trigger_event` topic.
//!
//! Pure: the registry's trigger loop brings the clock, the Box's events and the message
//! ids; this module says which tick is due and which launch a tick or a message is.
//!
//! Exactly once: a tick's launch id is derived from the Box and the tick, a message's from
//! the Box and the message id, and a Worker's id from its launch id, so a retry, a second
//! scheduler or a redelivered message makes the same Worker, never a second one. Launch
//! ids under [`TRIGGER_LAUNCH_PREFIX`] belong to the Box's trigger alone.
//!
//! Events: a message on an active `event` Box's `trigger_event` topic launches a Worker
//! of every Box listening there ([`listening`]). Who may publish on a topic is who may
//! launch every Box listening on it ([`may_publish`]): a publish launches them all. A Box's
//! triggered Workers in flight are bounded ([`in_flight_refusal`]); an event past the
//! bound is refused, not queued, so a flood cannot pile up.
//!
//! Missed ticks: a tick counts only after the Box last became schedulable (activated,
//! resumed, or its manifest or config changed: [`schedule_since`]). When ticks were missed
//! (everything was down), only the latest of them runs, once; the older are skipped, so a
//! restart never starts a burst.

use chrono::{DateTime, Utc};
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use sha2::{Digest, Sha256};

use crate::Principal;
use crate::aggregates::boxes::BoxEvent;
pub use crate::principal::{TRIGGER_USER_PREFIX, is_trigger_of, is_trigger_user, trigger_principal};

/// The start of every launch id a trigger makes: `trigger:<box_id>:...`.
pub const TRIGGER_LAUNCH_PREFIX: &str = "trigger:";

/// Whether `launch_id` is a trigger's: only the trigger of the Box it names may use it.
pub fn is_trigger_launch_id(launch_id: &str) -> bool {
    launch_id.starts_with(TRIGGER_LAUNCH_PREFIX)
}

/// Why `principal` may not launch as `launch_id` for Box `box_id`, if it may not: launch
/// ids beginning `trigger:` are the Box's trigger's alone (else anyone who may launch
/// some Box could take a tick or a message of another before its trigger does).
pub fn foreign_launch_id(launch_id: &str, box_id: &str, principal: &Principal) -> Option<&'static str> {
    let own = launch_id.strip_prefix(TRIGGER_LAUNCH_PREFIX).and_then(|rest| rest.strip_prefix(box_id)).is_some_and(|rest| rest.starts_with(':'));
    match (is_trigger_launch_id(launch_id), is_trigger_of(principal, box_id)) {
        (false, _) => None,
        (true, true) if own => None,
        _ => Some("launch ids beginning with \"trigger:\" are taken by Boxes' schedules and events"),
    }
}

/// The launch of Box `box_id`'s tick at `tick`: `trigger:<box_id>:tick:<unix seconds>`.
pub fn tick_launch_id(box_id: &str, tick: DateTime<Utc>) -> String {
    format!("{TRIGGER_LAUNCH_PREFIX}{box_id}:tick:{}", tick.timestamp())
}

/// The launch of Box `box_id` for the message with id `message_id`:
/// `trigger:<box_id>:event:<first 32 hex digits of SHA-256 of the id>` (a message id is
/// the publisher's text: hashed, it fits the launch id's characters and length).
pub fn message_launch_id(box_id: &str, message_id: &str) -> String {
    let hash = Sha256::digest(message_id.as_bytes());
    let hex: String = hash.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!("{TRIGGER_LAUNCH_PREFIX}{box_id}:event:{hex}")
}

/// Unended Workers an `event` Box may have before its events are refused (the default
/// of `ATASIRA_TRIGGER_IN_FLIGHT`).
pub const IN_FLIGHT: usize = 4;

/// An active `event` Box as the triggers see it: its topic and who may launch it besides
/// human admins (its assigned users).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventBox {
    pub box_id: String,
    pub topic: String,
    pub assigned: Vec<String>,
}

impl EventBox {
    fn launchable_by(&self, principal: &Principal) -> bool {
        let assignments: Vec<(String, ())> = self.assigned.iter().map(|u| (u.clone(), ())).collect();
        crate::worker::may_launch(principal, &self.box_id, &assignments)
    }
}

/// The Boxes a message on `topic` launches, by box id.
pub fn listening<'a>(topic: &str, boxes: &'a [EventBox]) -> Vec<&'a EventBox> {
    boxes.iter().filter(|b| b.topic == topic).collect()
}

/// Whether `principal` may publish on `topic`: some Box listens there and `principal` may
/// launch every one of them.
pub fn may_publish(principal: &Principal, topic: &str, boxes: &[EventBox]) -> bool {
    let listeners = listening(topic, boxes);
    !listeners.is_empty() && listeners.iter().all(|b| b.launchable_by(principal))
}

/// The topics `principal` may publish on (sorted, each once): what a NATS publisher is
/// granted when it connects.
pub fn topics_for(principal: &Principal, boxes: &[EventBox]) -> Vec<String> {
    let mut topics: Vec<String> = boxes.iter().map(|b| b.topic.clone()).filter(|t| may_publish(principal, t, boxes)).collect();
    topics.sort();
    topics.dedup();
    topics
}

/// Why an event may not launch another Worker of a Box that has `in_flight` unended
/// Workers, when `limit` is the bound.
pub fn in_flight_refusal(in_flight: usize, limit: usize) -> Option<String> {
    (in_flight >= limit)
        .then(|| format!("the Box has {in_flight} Workers still running and its triggers may start at most {limit}; publish again once some have ended"))
}

/// A parsed `trigger_schedule` (5 fields, UTC).
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Cron,
}

impl Schedule {
    /// Parses a 5-field cron expression (the manifest's rule, R-MAN-5).
    pub fn parse(expr: &str) -> Result<Schedule, String> {
        crate::manifest::validate_cron(expr)?;
        let cron = CronParser::builder().seconds(Seconds::Disallowed).year(Year::Disallowed).build().parse(expr.trim()).map_err(|e| e.to_string())?;
        Ok(Schedule { cron })
    }

    /// The tick that is due at `now`: the latest tick `t` with `since < t <= now`, if any.
    pub fn due(&self, since: DateTime<Utc>, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if now <= since {
            return None;
        }
        let tick = self.cron.find_previous_occurrence(&now, true).ok()?;
        (tick > since).then_some(tick)
    }

    /// The first tick after `after`.
    pub fn next_after(&self, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.find_next_occurrence(&after, false).ok()
    }
}

/// Since when a Box's ticks count, from its events in order: the last activation, resume,
/// config edit or approved change (each may change whether and when it runs). `None` while
/// the Box is stopped or archived.
pub fn schedule_since<'a>(events: impl IntoIterator<Item = &'a BoxEvent>) -> Option<DateTime<Utc>> {
    let mut since = None;
    for event in events {
        match event {
            BoxEvent::BoxActivated { activated_at, .. } => since = Some(*activated_at),
            BoxEvent::BoxResumed { at, .. } => since = Some(*at),
            BoxEvent::BoxConfigEdited { at, .. } | BoxEvent::BoxManifestChanged { at, .. } => since = since.map(|_| *at),
            BoxEvent::BoxStopped { .. } | BoxEvent::BoxArchived { .. } => since = None,
            _ => {}
        }
    }
    since
}

#[cfg(test)]
mod tests;
