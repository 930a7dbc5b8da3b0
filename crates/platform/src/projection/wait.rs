//! Read-your-writes waits (R-BOX-9): until the named projections applied a position or
//! a set of events.

use std::time::Duration;

use super::checkpoint::{checkpoint, processed};
use crate::store::Db;

/// A consumer a read-your-writes wait waits for: its name, the aggregate types it reads,
/// and the events of those types it has nothing to do with, which a wait does not wait
/// for it to pass.
#[derive(Debug, Clone, Copy)]
pub struct ReadModel {
    pub name: &'static str,
    pub reads: &'static [&'static str],
    /// Whether the consumer passes over the event with this id (read, nothing done).
    passes_over: fn(&str) -> bool,
}

impl ReadModel {
    /// A consumer waited for on every event of `reads`.
    pub const fn new(name: &'static str, reads: &'static [&'static str]) -> Self {
        Self { name, reads, passes_over: |_| false }
    }

    /// The same consumer, not waited for on the events `passes_over` names (by event id).
    #[must_use]
    pub const fn passing_over(self, passes_over: fn(&str) -> bool) -> Self {
        Self { passes_over, ..self }
    }

    /// Whether a wait for the event `event_id` waits for this consumer.
    pub fn waits_for(&self, event_id: &str) -> bool {
        self.reads.contains(&aggregate_type_of(event_id)) && !(self.passes_over)(event_id)
    }
}

/// The aggregate type an event id names (`<type>/<id>/<sequence>`).
fn aggregate_type_of(event_id: &str) -> &str {
    event_id.split('/').next().unwrap_or_default()
}

/// R-BOX-9: waits until every projection in `names` has applied `position`, at most
/// `timeout`; returns the names still behind. By position: exact in SQLite, where
/// positions are commit order; callers in cluster mode wait by event id.
pub async fn wait_for(db: &Db, names: &[&'static str], position: i64, timeout: Duration) -> anyhow::Result<Vec<String>> {
    let elsewhere = names.iter().any(|name| !db.runs_here(name));
    if position > 0 {
        db.waited_on(&[]);
    }
    until(db, timeout, elsewhere, &[], |look| async move {
        let mut lagging = Vec::new();
        for name in names {
            let seen = db.progress_of(name).is_some_and(|c| c.position >= position);
            let from_memory = look == Look::Rung || (look == Look::Remote && db.runs_here(name));
            if !seen && (from_memory || checkpoint(db, name).await? < position) {
                lagging.push((*name).to_owned());
            }
        }
        Ok(lagging)
    })
    .await
}

/// R-BOX-9, exact form: waits until every read model that waits for an event (it reads
/// its aggregate type and does not pass over it) has applied that event (by id), at most
/// `timeout`; returns the names still behind. `position` is the write's (the last of its
/// events; 0 when not known): in SQLite a consumer that opened its feed in this process
/// before it is answered from memory. Events no read model here waits for are not waited
/// for at all, and ring nothing: their consumers may let them gather.
pub async fn wait_for_events(db: &Db, read_models: &[ReadModel], event_ids: &[String], position: i64, timeout: Duration) -> anyhow::Result<Vec<String>> {
    let waited: Vec<(&ReadModel, Vec<&str>)> = read_models
        .iter()
        .map(|model| (model, event_ids.iter().map(String::as_str).filter(|id| model.waits_for(id)).collect::<Vec<_>>()))
        .filter(|(_, ids)| !ids.is_empty())
        .collect();
    let mut types: Vec<&str> = waited.iter().flat_map(|(_, ids)| ids.iter().map(|id| aggregate_type_of(id))).collect();
    types.sort_unstable();
    types.dedup();
    if types.is_empty() {
        return Ok(vec![]);
    }
    db.waited_on(&types);
    let elsewhere = waited.iter().any(|(model, _)| !db.runs_here(model.name));
    let waited = &waited;
    until(db, timeout, elsewhere, &types, |look| async move {
        let mut lagging = Vec::new();
        for (model, ids) in waited {
            let name = &model.name;
            // The events precede `position`: none was processed before the feed opened.
            let memory_knows = position > 0 && db.follows_here(name, position.saturating_sub(event_ids.len() as i64));
            for id in ids {
                if db.processed_lately(name, id) {
                    continue;
                }
                let ask_the_store = match look {
                    Look::First => !memory_knows,
                    Look::Rung => false,
                    Look::Remote => !db.runs_here(name),
                    Look::SafetyNet => true,
                };
                let done = ask_the_store && processed(db, name, id).await?;
                if !done {
                    lagging.push((*name).to_owned());
                    break;
                }
            }
        }
        Ok(lagging)
    })
    .await
}

/// Why a wait looks (again): what it may take from memory and what it must ask the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Look {
    /// The first look: what happened before this process started is only in the store.
    First,
    /// A consumer of this process committed: what it did is in memory.
    Rung,
    /// A look of a replica standing by (a consumer runs in another process), soon after
    /// the last: the store knows what the consumers that do not run here did.
    Remote,
    /// The safety net's look, a second after the last: a consumer of another process, or
    /// an event that left the memory's window.
    SafetyNet,
}

impl Look {
    fn label(self) -> &'static str {
        match self {
            Look::First => "first",
            Look::Rung => "local",
            Look::Remote => "remote",
            Look::SafetyNet => "safety_net",
        }
    }
}

/// Asks `behind` again each time a consumer made progress, until it says nothing is behind
/// or `timeout` passed; returns its last answer. The caller marked `aggregate_types` (the
/// events waited for; all when empty) waited for ([`Db::waited_on`]); a first look that
/// finds one behind also rings their consumers to read now ([`Db::hurry`]). The consumers a service answers for usually run in its own process,
/// so their progress bell is the signal to look, and what they committed is in memory
/// ([`Db::progressed_to`]), so a look after a ring asks no database. A replica standing
/// by for some of them (`elsewhere`: they run in another one) also looks in the store soon
/// and then less often ([`STANDBY_LOOKS`]): no notification tells it of another process's
/// progress, since one at every consumer commit would wake every process listening to the
/// database.
async fn until<F, Fut>(db: &Db, timeout: Duration, elsewhere: bool, aggregate_types: &[&str], behind: F) -> anyhow::Result<Vec<String>>
where
    F: Fn(Look) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Vec<String>>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    let mut progress = db.on_progress();
    let mut look = Look::First;
    let mut standby = STANDBY_LOOKS;
    loop {
        progress.borrow_and_update();
        let lagging = behind(look).await?;
        if lagging.is_empty() || tokio::time::Instant::now() >= deadline {
            let outcome = if lagging.is_empty() { "applied" } else { "lagging" };
            crate::metrics::global().consistency_waits.get_or_create(&crate::metrics::WaitLabels { look: look.label(), outcome }).inc();
            return Ok(lagging);
        }
        if look == Look::First {
            // Consumers of what another process committed read now, not at its next
            // doorbell (a wait for what they already hold rings nothing).
            db.hurry(aggregate_types);
        }
        let safety_net = deadline.min(tokio::time::Instant::now() + Duration::from_secs(1));
        let next_standby_look = deadline.min(tokio::time::Instant::now() + standby.take());
        // The bells live as long as `db`, so `changed` fails only when it is gone.
        look = tokio::select! {
            Ok(()) = progress.changed() => Look::Rung,
            () = tokio::time::sleep_until(next_standby_look), if elsewhere => Look::Remote,
            () = tokio::time::sleep_until(safety_net) => Look::SafetyNet,
        };
    }
}

/// How often a replica standing by looks in the store while it waits: 2 ms after the
/// last look, doubling up to 50 ms.
const STANDBY_LOOKS: crate::feed::Pause = crate::feed::Pause::new(Duration::from_millis(2), Duration::from_millis(50));

/// Answers a `WaitForPosition` for a service's read models (by event ids when given, by
/// position otherwise).
pub async fn answer_wait(db: &Db, read_models: &[ReadModel], request: &atasira_contracts::v1::WaitForPosition) -> anyhow::Result<Vec<String>> {
    let timeout = Duration::from_millis(u64::from(request.timeout_ms.min(30_000)));
    if request.event_ids.is_empty() {
        let names: Vec<&'static str> = read_models.iter().map(|m| m.name).collect();
        wait_for(db, &names, request.position, timeout).await
    } else {
        wait_for_events(db, read_models, &request.event_ids, request.position, timeout).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use atasira_domain::aggregates::draft::Draft;

    use crate::store::testing;

    #[tokio::test]
    async fn r_box_9_a_wait_does_not_wait_for_a_read_model_to_pass_over_an_event() {
        // given a store with a draft's submission that no consumer has read, and a read
        // model that passes over submissions (a draft's first event)
        let store = testing::TempDb::new().await;
        let db = &store.db;
        let receipt = db.cqrs::<Draft>().execute_new("d1", testing::submit("d1"), std::collections::HashMap::new()).await.expect("submit");
        let submission = receipt.head().expect("head");
        let model = ReadModel::new("activation", &["draft"]).passing_over(|id| id.ends_with("/1"));
        // when a write's wait asks for the submission, then it is answered at once, and
        // no lingering feed is asked to read
        let lagging = wait_for_events(db, &[model], std::slice::from_ref(&submission.id), submission.position, Duration::ZERO).await.expect("wait");
        assert!(lagging.is_empty(), "waited for a read model that has nothing to do: {lagging:?}");
        assert!(!db.wanted_within(&[], Duration::from_secs(60)), "a wait for an event passed over asked the read models to hurry");
        // when a wait asks for a later event of the stream (a decision), then it waits
        let decision = "draft/d1/2".to_owned();
        let lagging = wait_for_events(db, &[model], &[decision], 0, Duration::ZERO).await.expect("wait");
        assert_eq!(lagging, ["activation"]);
        assert!(db.wanted_within(&["draft"], Duration::from_secs(60)));
    }

    #[tokio::test]
    async fn r_box_9_a_wait_for_a_write_marks_its_types_wanted_even_when_the_read_models_hold_it() {
        // given a draft that read model "view" has applied
        let store = testing::TempDb::new().await;
        let db = &store.db;
        let receipt = db.cqrs::<Draft>().execute_new("d1", testing::submit("d1"), std::collections::HashMap::new()).await.expect("submit");
        let head = receipt.head().expect("head");
        let events = db.read(crate::store::Cursor::START, &["draft"], 10).await.expect("read").events;
        super::super::mark_processed(db, "view", &events[0]).await.expect("marked");
        // when a write's wait asks for it, then it is answered at once
        let lagging = wait_for_events(db, &[ReadModel::new("view", &["draft"])], std::slice::from_ref(&head.id), head.position, Duration::ZERO).await;
        assert!(lagging.expect("wait").is_empty());
        // and draft events are marked waited for (this process's doorbell rings at once,
        // its draft read models do not linger), other types are not
        assert!(db.wanted_within(&["draft"], Duration::from_secs(60)), "the wait left no mark");
        assert!(!db.wanted_within(&["webhook"], Duration::from_secs(60)), "the wait marked a type it did not ask for");
    }

    #[tokio::test]
    async fn r_box_9_only_a_wait_for_a_write_asks_lingering_feeds_to_read() {
        // given a store with one draft that no consumer named "view" has applied
        let store = testing::TempDb::new().await;
        let db = &store.db;
        let position =
            db.cqrs::<Draft>().execute_new("d1", testing::submit("d1"), std::collections::HashMap::new()).await.expect("submit").head().expect("head").position;
        // when a wait asks for what every read model holds (a readiness probe), then no
        // lingering feed is asked to read
        assert!(wait_for(db, &["view"], 0, Duration::ZERO).await.expect("wait").is_empty());
        assert!(!db.wanted_within(&[], Duration::from_secs(60)), "a wait for nothing asked the read models to hurry");
        // when a wait asks for a write, then the wanted bell rings
        let wanted = db.on_wanted();
        assert_eq!(wait_for(db, &["view"], position, Duration::from_millis(10)).await.expect("wait"), ["view"]);
        assert!(db.wanted_within(&["draft"], Duration::from_secs(60)));
        assert!(wanted.has_changed().expect("the bell is there"), "the wanted bell did not ring");
    }
}
