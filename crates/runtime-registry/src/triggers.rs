//! Boxes that run on their own (R-TRIG-1): the schedule loop launches a Worker of each
//! active `trigger_type: schedule` Box at each tick of its `trigger_schedule`; the event
//! loop hears the `trigger_event` topic of each active `event` Box on NATS (as the trigger
//! listener, in a queue group so one replica takes each message) and launches a Worker of
//! every Box listening there per message id. `PublishTriggerEvent` does the same for a
//! REST caller who may launch every one of them.
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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use atasira_contracts::{Reply, convert, reply_ok, subjects, v1};
use atasira_domain::aggregates::boxes::BoxEvent;
use atasira_domain::aggregates::security::SecurityCommand;
use atasira_domain::aggregates::types;
use atasira_domain::aggregates::worker::WorkerEvent;
use atasira_domain::manifest::{BoxManifest, TriggerType};
use atasira_domain::trigger::{self, EventBox, Schedule};
use atasira_domain::worker::{SEGMENT_TEXT_CHARS, Segment, worker_id_for};
use atasira_domain::{ErrorCode, FieldError, Principal};
use atasira_platform::bus::{TopicListener, TopicMessage};
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

/// The queue group every replica hears topics in: one of them takes each message.
const QUEUE: &str = "runtime-registry";

/// How long a slot waits for its launch's Worker before another event may take it.
const SLOT_GRACE: Duration = Duration::from_secs(60);

/// Longest message id an event may carry.
const MESSAGE_ID_CHARS: usize = 200;

/// What starts a triggered launch (a Box's `trigger_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Trigger {
    Schedule,
    Event,
}

impl Trigger {
    fn as_str(self) -> &'static str {
        match self {
            Trigger::Schedule => "schedule",
            Trigger::Event => "event",
        }
    }
}

/// What a triggered launch came to.
#[derive(Debug)]
pub(crate) enum Launched {
    /// The Worker was created now.
    Made,
    /// The launch was made (or refused) before: `refused` says which.
    Before { refused: Option<(String, String)> },
    /// Refused, and the refusal recorded on the launch's stream.
    Refused(Refusal),
    /// Not settled: try again.
    Retry(String),
}

impl Launched {
    fn settled(&self) -> bool {
        !matches!(self, Launched::Retry(_))
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

/// The active Boxes whose manifest has `trigger_type` `kind`: box id, manifest and the
/// assignments' JSON, by box id.
async fn triggered_boxes(registry: &Registry, kind: TriggerType) -> anyhow::Result<BTreeMap<String, (BoxManifest, String)>> {
    let wanted = serde_json::to_string(&kind)?;
    let rows = sqlx::query("SELECT box_id, manifest_json, assignments_json FROM box_rows WHERE state = 'idle' AND manifest_json LIKE $1")
        .bind(format!("%\"trigger_type\":{wanted}%"))
        .fetch_all(registry.rt.db.any())
        .await?;
    let mut boxes = BTreeMap::new();
    for row in rows {
        let manifest: BoxManifest = serde_json::from_str(&row.try_get::<String, _>(1)?)?;
        if manifest.trigger_type == kind {
            boxes.insert(row.try_get(0)?, (manifest, row.try_get(2)?));
        }
    }
    Ok(boxes)
}

/// The active Boxes whose manifest says `trigger_type: schedule`, by box id.
async fn scheduled_boxes(registry: &Registry) -> anyhow::Result<BTreeMap<String, BoxManifest>> {
    Ok(triggered_boxes(registry, TriggerType::Schedule).await?.into_iter().map(|(id, (manifest, _))| (id, manifest)).collect())
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
        if self.launch_triggered(Trigger::Schedule, box_id, &trigger::tick_launch_id(box_id, tick), vec![Segment::Text(input)], labels).await.settled() {
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
    /// documentation): made now or before, refused (the refusal recorded on the launch's
    /// stream), or to be tried again. An event's launch is refused `too_many_workers` while
    /// the Box has as many triggered Workers in flight as `ATASIRA_TRIGGER_IN_FLIGHT`.
    pub(crate) async fn launch_triggered(
        &self,
        kind: Trigger,
        box_id: &str,
        launch_id: &str,
        input: Vec<Segment>,
        labels: BTreeMap<String, String>,
    ) -> Launched {
        let worker_id = worker_id_for(launch_id);
        match self.before(&worker_id).await {
            Ok(Some(before)) => return before,
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(box_id, launch_id, error = %e, "could not look for the launch; trying again");
                return Launched::Retry(e.to_string());
            }
        }
        let principal = trigger::trigger_principal(box_id);
        let metrics = atasira_platform::metrics::global();
        if kind == Trigger::Event {
            match self.admit(box_id, launch_id).await {
                Ok(None) => {}
                Ok(Some(why)) => {
                    let refusal = self.refused(&principal, launch_id, box_id, Refusal::new(ErrorCode::TooManyWorkers, why)).await;
                    metrics.trigger(kind.as_str(), "throttled");
                    tracing::warn!(box_id, launch_id, "an event for the Box was refused: its Workers in flight are at their bound");
                    return Launched::Refused(refusal);
                }
                Err(e) => return Launched::Retry(e.to_string()),
            }
        }
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
        if kind == Trigger::Event && outcome.is_err() {
            // Nothing runs for this launch: its slot is free again.
            self.free_slot(launch_id).await;
        }
        match outcome {
            Ok(()) => {
                metrics.trigger(kind.as_str(), "launched");
                tracing::info!(box_id, launch_id, worker_id, trigger = kind.as_str(), "launched a Worker for the Box's trigger");
                Launched::Made
            }
            Err(refusal) if settled => {
                metrics.trigger(kind.as_str(), "refused");
                tracing::warn!(box_id, launch_id, code = refusal.code.as_str(), reason = refusal.message, "the Box's triggered launch was refused");
                Launched::Refused(refusal)
            }
            Err(refusal) => {
                tracing::warn!(box_id, launch_id, code = refusal.code.as_str(), reason = refusal.message, "the Box's triggered launch failed; trying again");
                Launched::Retry(refusal.message)
            }
        }
    }

    /// What the launch's stream holds already, if anything: the Worker, or a refusal.
    async fn before(&self, worker_id: &str) -> anyhow::Result<Option<Launched>> {
        let events = self.rt.db.stream(types::WORKER, worker_id).await?;
        if events.is_empty() {
            return Ok(None);
        }
        let mut refused = None;
        for link in &events {
            match link.decode::<WorkerEvent>()? {
                WorkerEvent::WorkerCreated { .. } => return Ok(Some(Launched::Before { refused: None })),
                WorkerEvent::WorkerLaunchRefused { code, reason, .. } => refused = Some((code, reason)),
                _ => {}
            }
        }
        Ok(Some(Launched::Before { refused }))
    }

    /// A slot for the event launch `launch_id` of Box `box_id`, among the Box's
    /// `ATASIRA_TRIGGER_IN_FLIGHT`: `None` when it has one (now or before), else why not.
    /// Slots whose Worker ended, and slots of launches that made no Worker within
    /// [`SLOT_GRACE`] (a replica stopped between the two), are freed first.
    async fn admit(&self, box_id: &str, launch_id: &str) -> anyhow::Result<Option<String>> {
        let db = self.rt.db.any();
        let now_ms = failpoints::now().timestamp_millis();
        let stale = now_ms - i64::try_from(SLOT_GRACE.as_millis()).unwrap_or(i64::MAX);
        sqlx::query(
            "DELETE FROM trigger_slots WHERE box_id = $1 AND (\
                launch_id IN (SELECT w.launch_id FROM worker_rows w JOIN worker_life l ON l.worker_id = w.worker_id \
                              WHERE w.box_id = $1 AND l.ended_at_ns IS NOT NULL) \
                OR (taken_at_ms < $2 AND launch_id NOT IN (SELECT launch_id FROM worker_rows WHERE box_id = $1)))",
        )
        .bind(box_id)
        .bind(stale)
        .execute(db)
        .await?;
        let limit = self.config.trigger_in_flight;
        let mut taken = 0;
        let admitted = async || -> anyhow::Result<bool> {
            let row = sqlx::query("SELECT COUNT(*) FROM trigger_slots WHERE launch_id = $1").bind(launch_id).fetch_one(db).await?;
            Ok(row.try_get::<i64, _>(0)? > 0)
        };
        // A retry of the launch holds its slot already.
        if admitted().await? {
            return Ok(None);
        }
        for slot in 0..limit {
            let inserted = sqlx::query("INSERT INTO trigger_slots (box_id, slot, launch_id, taken_at_ms) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING")
                .bind(box_id)
                .bind(i64::try_from(slot).unwrap_or(i64::MAX))
                .bind(launch_id)
                .bind(now_ms)
                .execute(db)
                .await?;
            if inserted.rows_affected() == 1 {
                return Ok(None);
            }
            taken += 1;
        }
        // Every insert conflicted: the slots are full, or the same message took one at once
        // on another replica (its launch id is unique among the slots).
        if admitted().await? {
            return Ok(None);
        }
        Ok(trigger::in_flight_refusal(taken, limit))
    }

    /// Frees the slot of an event launch that made no Worker.
    async fn free_slot(&self, launch_id: &str) {
        if let Err(e) = sqlx::query("DELETE FROM trigger_slots WHERE launch_id = $1").bind(launch_id).execute(self.rt.db.any()).await {
            tracing::warn!(launch_id, error = %e, "could not free the launch's slot; it is freed after a while");
        }
    }

    /// The active `event` Boxes, with their topics and assigned users.
    async fn event_boxes(&self) -> anyhow::Result<Vec<EventBox>> {
        let mut boxes = Vec::new();
        for (box_id, (manifest, assignments)) in triggered_boxes(self, TriggerType::Event).await? {
            if atasira_domain::manifest::validate_topic(&manifest.trigger_event).is_ok() {
                let assignments: Vec<crate::views::AssignmentRow> = serde_json::from_str(&assignments)?;
                boxes.push(EventBox { box_id, topic: manifest.trigger_event, assigned: assignments.into_iter().map(|a| a.user_id).collect() });
            }
        }
        Ok(boxes)
    }

    /// An event on `topic` with id `message_id`: a launch of every Box listening there.
    async fn fire(&self, boxes: &[EventBox], topic: &str, message_id: &str, data: &str) -> Vec<v1::TriggerLaunch> {
        let mut launches = Vec::new();
        let data = if data.is_empty() { format!("An event on {topic} (message {message_id}) with no data.") } else { data.to_owned() };
        for b in trigger::listening(topic, boxes) {
            let launch_id = trigger::message_launch_id(&b.box_id, message_id);
            let labels = BTreeMap::from([("trigger".to_owned(), "event".to_owned()), ("topic".to_owned(), topic.to_owned())]);
            let launched = self.launch_triggered(Trigger::Event, &b.box_id, &launch_id, vec![Segment::Text(data.clone())], labels).await;
            let mut launch = v1::TriggerLaunch { box_id: b.box_id.clone(), worker_id: worker_id_for(&launch_id), ..Default::default() };
            let (outcome, code, reason) = match launched {
                Launched::Made => ("launched", None, String::new()),
                Launched::Before { refused: None } => ("existing", None, String::new()),
                Launched::Before { refused: Some((code, reason)) } => ("refused", ErrorCode::parse(&code), reason),
                Launched::Refused(r) => ("refused", Some(r.code), r.message),
                Launched::Retry(reason) => ("failed", None, reason),
            };
            launch.outcome = outcome.to_owned();
            launch.code = code.map_or(0, |c| convert::error_code_to_wire(c) as i32);
            launch.reason = reason;
            launches.push(launch);
        }
        launches
    }

    /// `PublishTriggerEvent` (from the gateway, R-TRIG-1): an event on `topic` for a caller
    /// who may launch every Box listening there; anyone else is refused, and recorded.
    pub(crate) async fn publish_event(&self, principal: Principal, r: v1::PublishTriggerEvent) -> Result<Reply, Refusal> {
        let mut errors = Vec::new();
        if let Err(why) = atasira_domain::manifest::validate_topic(&r.topic) {
            errors.push(FieldError::new("topic", why));
        }
        if r.message_id.is_empty() || r.message_id.chars().count() > MESSAGE_ID_CHARS {
            errors.push(FieldError::new("message_id", format!("1 to {MESSAGE_ID_CHARS} characters")));
        }
        if r.data.chars().count() > SEGMENT_TEXT_CHARS {
            errors.push(FieldError::new("data", format!("at most {SEGMENT_TEXT_CHARS} characters")));
        }
        if !errors.is_empty() {
            return Err(Refusal { field_errors: errors, ..Refusal::new(ErrorCode::InvalidRequest, "the event is not well-formed") });
        }
        let boxes = self.event_boxes().await.map_err(Refusal::internal)?;
        if !trigger::listening(&r.topic, &boxes).is_empty() && !trigger::may_publish(&principal, &r.topic, &boxes) {
            let record = SecurityCommand::Record {
                service: crate::SERVICE.to_owned(),
                actor: principal.user_id.clone(),
                target: r.topic.clone(),
                kind: "trigger_event_forbidden".to_owned(),
                reason: format!("{} published on {:?}, where a Box it may not launch listens", principal.user_id, r.topic),
                at: chrono::Utc::now(),
            };
            let refusal = Refusal::new(ErrorCode::Forbidden, "you may not start every Box that listens on this topic");
            return Err(platform_service::refuse_recorded(&self.rt, crate::SERVICE, refusal, record).await);
        }
        Ok(reply_ok(&v1::TriggerLaunches { launches: self.fire(&boxes, &r.topic, &r.message_id, &r.data).await }))
    }

    /// `ListTriggerTopics` (from the gateway's auth callout): the topics the caller may
    /// publish on.
    pub(crate) async fn trigger_topics(&self, principal: &Principal) -> Result<Reply, Refusal> {
        let boxes = self.event_boxes().await.map_err(Refusal::internal)?;
        Ok(reply_ok(&v1::TriggerTopics { topics: trigger::topics_for(principal, &boxes) }))
    }

    /// A message heard on NATS: launched as `fire` does, the launches answered as JSON
    /// when the publisher asked (a request).
    async fn heard(&self, message: TopicMessage, listener: &TopicListener) {
        let answer = match message.id.as_deref().filter(|id| !id.is_empty() && id.chars().count() <= MESSAGE_ID_CHARS) {
            None => {
                atasira_platform::metrics::global().trigger(Trigger::Event.as_str(), "refused");
                tracing::warn!(topic = message.topic, "a message without a Nats-Msg-Id header was not launched: the id is what makes a repeat one message");
                serde_json::json!({"error": {"code": "invalid_request", "message": "name the message with a Nats-Msg-Id header (1 to 200 characters): a repeat of the id launches nothing"}})
            }
            Some(id) => {
                let data = String::from_utf8_lossy(&message.data);
                let launches = match self.event_boxes().await {
                    Ok(boxes) => self.fire(&boxes, &message.topic, id, &data).await,
                    Err(e) => {
                        tracing::warn!(topic = message.topic, error = %e, "could not read the event Boxes; the message was not launched");
                        Vec::new()
                    }
                };
                serde_json::json!({"launches": launches.iter().map(launch_json).collect::<Vec<_>>()})
            }
        };
        if let Some(reply) = &message.reply
            && let Err(e) = listener.answer(reply, serde_json::to_vec(&answer).unwrap_or_default().into()).await
        {
            tracing::warn!(topic = message.topic, error = %e, "could not answer the publisher");
        }
    }
}

/// A launch as a NATS publisher reads it (the REST API's shape).
pub(crate) fn launch_json(l: &v1::TriggerLaunch) -> serde_json::Value {
    let code = convert::error_code_from_wire(l.code);
    let mut v = serde_json::json!({"box_id": l.box_id, "worker_id": l.worker_id, "outcome": l.outcome});
    if l.code != 0 {
        v["code"] = code.as_str().into();
    }
    if !l.reason.is_empty() {
        v["reason"] = l.reason.clone().into();
    }
    v
}

/// Hears the topics of the active `event` Boxes until `shutdown`, launching per message.
pub(crate) async fn run_events(registry: Arc<Registry>, listener: TopicListener, shutdown: tokio::sync::watch::Receiver<bool>) {
    let (to, mut heard) = tokio::sync::mpsc::channel::<TopicMessage>(64);
    let mut topics: HashMap<String, tokio::task::JoinHandle<()>> = HashMap::new();
    let mut look = tokio::time::interval(LOOK);
    let mut warned = false;
    loop {
        tokio::select! {
            _ = look.tick() => match registry.event_boxes().await {
                Ok(boxes) => {
                    warned = false;
                    let wanted: BTreeSet<String> = boxes.into_iter().map(|b| b.topic).collect();
                    topics.retain(|topic, task| {
                        let keep = wanted.contains(topic);
                        if !keep {
                            task.abort();
                            tracing::info!(topic, "no active Box listens on the topic any more");
                        }
                        keep
                    });
                    for topic in wanted {
                        if topics.contains_key(&topic) {
                            continue;
                        }
                        match listener.listen(&topic, QUEUE, to.clone()).await {
                            Ok(task) => {
                                tracing::info!(topic, "listening for events on the topic");
                                topics.insert(topic, task);
                            }
                            Err(e) => tracing::warn!(topic, error = %e, "cannot listen on the topic; trying again"),
                        }
                    }
                }
                Err(e) => {
                    if !std::mem::replace(&mut warned, true) {
                        tracing::warn!(error = %e, "could not read the event Boxes; trying again");
                    }
                }
            },
            Some(message) = heard.recv() => registry.heard(message, &listener).await,
            () = platform_service::until_shutdown(shutdown.clone()) => break,
        }
    }
    for task in topics.into_values() {
        task.abort();
    }
}
