//! Boxes that run on their own (R-TRIG-1): the schedule loop launches a Worker of each
//! active `trigger_type: schedule` Box at each tick of its `trigger_schedule`.
//!
//! A triggered launch is the one-request launch done by the registry for the Box's own
//! trigger principal (`trigger:<box_id>`, which may launch that Box and nothing else): the
//! bundle synced, a binding prepared by the provisioner, the Worker created by
//! `create_worker` with every check a person's launch gets. Its launch id derives from the
//! Box and the tick ([`atasira_domain::trigger`]), so a retry, a second replica or a
//! restart makes the same Worker; one replica runs the loop at a time
//! ([`atasira_platform::exclusive`]), the others stand by.
//!
//! Time is [`failpoints::now`]: the real clock, or a test's clock in a test build.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::{subjects, v1};
use atasira_domain::aggregates::boxes::BoxEvent;
use atasira_domain::aggregates::types;
use atasira_domain::manifest::{BoxManifest, TriggerType};
use atasira_domain::trigger::{self, Schedule};
use atasira_domain::worker::{Segment, worker_id_for};
use atasira_platform::failpoints;
use atasira_platform::refusal::Refusal;
use atasira_platform::service as platform_service;
use chrono::{DateTime, Utc};
use sqlx::Row;

use crate::Registry;
use crate::workers_view::segment_to_wire;

/// The schedule loop's name among the readers one replica runs at a time.
pub(crate) const SCHEDULER: &str = "scheduler";

/// How often the loop looks for Boxes that became (or stopped being) scheduled.
const LOOK: Duration = Duration::from_secs(1);

/// With a test clock, time moves when the test says: look often.
const LOOK_TEST_CLOCK: Duration = Duration::from_millis(100);

/// What starts a triggered launch (a Box's `trigger_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trigger {
    Schedule,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Schedule => "schedule",
        }
    }
}

/// A scheduled Box as the loop knows it.
struct Scheduled {
    expression: String,
    schedule: Schedule,
    /// Ticks after this count (the Box last became schedulable).
    since: DateTime<Utc>,
    /// The latest tick launched (or found launched).
    done: Option<DateTime<Utc>>,
}

/// One pass of the loop: its time, and the previous pass's.
#[derive(Debug, Clone, Copy)]
struct Pass {
    now: DateTime<Utc>,
    previous: DateTime<Utc>,
}

/// Runs the schedule loop while this replica holds it, until `shutdown`.
pub(crate) async fn run_schedules(registry: Arc<Registry>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
    loop {
        let Some(mut lease) = atasira_platform::exclusive::acquire(&registry.rt.db, SCHEDULER, &mut shutdown).await else { return };
        tokio::select! {
            () = schedule_loop(&registry) => {}
            () = lease.lost() => tracing::warn!("the schedule loop's lock was lost; competing for it again"),
            () = platform_service::until_shutdown(shutdown.clone()) => return,
        }
    }
}

async fn schedule_loop(registry: &Registry) {
    let mut known: HashMap<String, Scheduled> = HashMap::new();
    let mut warned = false;
    // When the last pass looked: a schedule edited since counts from then.
    let mut previous = None;
    loop {
        // The time of this pass, read before the Boxes: what they say held at it.
        let now = failpoints::now();
        match scheduled_boxes(registry).await {
            Ok(boxes) => {
                warned = false;
                known.retain(|box_id, _| boxes.contains_key(box_id));
                let pass = Pass { now, previous: previous.unwrap_or(now) };
                for (box_id, manifest) in boxes {
                    registry.schedule_tick(&mut known, &box_id, &manifest, pass).await;
                }
                previous = Some(now);
            }
            Err(e) => {
                if !std::mem::replace(&mut warned, true) {
                    tracing::warn!(error = %e, "could not read the scheduled Boxes; trying again");
                }
            }
        }
        tokio::time::sleep(if failpoints::test_clock() { LOOK_TEST_CLOCK } else { next_wait(&known) }).await;
    }
}

/// Until the next tick of any scheduled Box, at most [`LOOK`].
fn next_wait(known: &HashMap<String, Scheduled>) -> Duration {
    let now = failpoints::now();
    known.values().filter_map(|s| s.schedule.next_after(now)).map(|next| (next - now).to_std().unwrap_or_default()).min().map_or(LOOK, |d| d.min(LOOK))
}

/// The active Boxes whose manifest says `trigger_type: schedule`, by box id.
async fn scheduled_boxes(registry: &Registry) -> anyhow::Result<BTreeMap<String, BoxManifest>> {
    let rows = sqlx::query("SELECT box_id, manifest_json FROM box_rows WHERE state = 'idle' AND manifest_json LIKE '%\"trigger_type\":\"schedule\"%'")
        .fetch_all(registry.rt.db.any())
        .await?;
    let mut boxes = BTreeMap::new();
    for row in rows {
        let manifest: BoxManifest = serde_json::from_str(&row.try_get::<String, _>(1)?)?;
        if manifest.trigger_type == TriggerType::Schedule {
            boxes.insert(row.try_get(0)?, manifest);
        }
    }
    Ok(boxes)
}

impl Registry {
    /// Launches Box `box_id`'s due tick, if one is due and not launched yet.
    async fn schedule_tick(&self, known: &mut HashMap<String, Scheduled>, box_id: &str, manifest: &BoxManifest, pass: Pass) {
        let stale = known.get(box_id).is_none_or(|s| s.expression != manifest.trigger_schedule);
        if stale {
            // A schedule edited while the loop runs counts from the last pass, when the
            // old one was still in force: its next tick is the first (a Box first seen
            // counts from its events, so a missed tick still runs).
            let edited = known.contains_key(box_id);
            match self.scheduled(box_id, &manifest.trigger_schedule).await {
                Ok(Some(mut s)) => {
                    if edited {
                        s.since = s.since.max(pass.previous);
                    }
                    known.insert(box_id.to_owned(), s);
                }
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(box_id, error = %e, "could not read the Box's schedule; trying again");
                    return;
                }
            }
        }
        let Some(s) = known.get_mut(box_id) else { return };
        let Some(tick) = s.schedule.due(s.since, pass.now) else { return };
        if s.done.is_some_and(|done| done >= tick) {
            return;
        }
        let input = format!("Scheduled run for {} (trigger_schedule {:?}).", tick.to_rfc3339(), s.expression);
        let labels = BTreeMap::from([("trigger".to_owned(), "schedule".to_owned())]);
        if self.launch_triggered(Trigger::Schedule, box_id, &trigger::tick_launch_id(box_id, tick), vec![Segment::Text(input)], labels).await {
            s.done = Some(tick);
        }
    }

    /// The Box's schedule, read from its stream (`None`: not schedulable now).
    async fn scheduled(&self, box_id: &str, expression: &str) -> anyhow::Result<Option<Scheduled>> {
        let schedule = match Schedule::parse(expression) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(box_id, error = %e, "the Box's trigger_schedule does not parse; it does not run");
                return Ok(None);
            }
        };
        let events = self.rt.db.stream(types::BOX, box_id).await?.iter().map(|e| e.decode::<BoxEvent>()).collect::<Result<Vec<_>, _>>()?;
        Ok(trigger::schedule_since(&events).map(|since| Scheduled { expression: expression.to_owned(), schedule, since, done: None }))
    }

    /// Launches a Worker of Box `box_id` for its trigger as `launch_id` (see the module
    /// documentation). Whether the launch is settled: made now or before, or refused and the
    /// refusal recorded on the launch's stream; `false` when it should be tried again.
    pub(crate) async fn launch_triggered(&self, kind: Trigger, box_id: &str, launch_id: &str, input: Vec<Segment>, labels: BTreeMap<String, String>) -> bool {
        let worker_id = worker_id_for(launch_id);
        match self.rt.db.stream(types::WORKER, &worker_id).await {
            Ok(events) if !events.is_empty() => return true,
            Ok(_) => {}
            Err(e) => {
                tracing::warn!(box_id, launch_id, error = %e, "could not look for the launch; trying again");
                return false;
            }
        }
        let principal = trigger::trigger_principal(box_id);
        // The bundle and the binding; a refusal of either is recorded like the Worker's own.
        let prepared = async {
            let digest = self.current_bundle(&principal, box_id).await?;
            let prepare = v1::PrepareBinding { box_id: box_id.to_owned(), launch_id: launch_id.to_owned() };
            match self.client.call(subjects::PROVISIONER, &principal, &prepare, "").await? {
                Ok(written) => Ok((digest, written.reply.handle)),
                Err(refused) => Err(Refusal::passed_on(refused)),
            }
        }
        .await;
        let outcome = match prepared {
            Ok((bundle_digest, binding_handle)) => {
                let create = v1::CreateWorker {
                    launch_id: launch_id.to_owned(),
                    box_id: box_id.to_owned(),
                    bundle_digest,
                    binding_handle,
                    role: String::new(),
                    labels,
                    initial_input: input.iter().map(segment_to_wire).collect(),
                };
                self.create_worker(principal, create).await.map(|_| ())
            }
            Err(refusal) => Err(self.refused(&principal, launch_id, box_id, refusal).await),
        };
        let settled = match self.rt.db.stream(types::WORKER, &worker_id).await {
            Ok(events) => !events.is_empty(),
            Err(_) => false,
        };
        let metrics = atasira_platform::metrics::global();
        match outcome {
            Ok(_) => {
                metrics.trigger(kind.as_str(), "launched");
                tracing::info!(box_id, launch_id, worker_id, trigger = kind.as_str(), "launched a Worker for the Box's trigger");
            }
            Err(refusal) if settled => {
                metrics.trigger(kind.as_str(), "refused");
                tracing::warn!(box_id, launch_id, code = refusal.code.as_str(), reason = refusal.message, "the Box's triggered launch was refused");
            }
            Err(refusal) => {
                tracing::warn!(box_id, launch_id, code = refusal.code.as_str(), reason = refusal.message, "the Box's triggered launch failed; trying again");
            }
        }
        settled
    }
}
