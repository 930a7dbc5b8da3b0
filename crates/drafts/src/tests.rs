//! R-ARCH-6: no draft makes an event or a reply the bus cannot carry. A draft at every
//! bound of the request at once, in the characters JSON escapes widest, is stored on a real
//! (SQLite) event store, approved and activated; each event, read back from the store and
//! encoded as the relay publishes it, stays far below NATS's 1 MiB message limit. Pages of
//! such drafts are cut short instead of growing past it.

use std::collections::HashMap;
use std::path::PathBuf;

use atasira_domain::aggregates::boxes::{BoxAggregate, BoxCommand};
use atasira_domain::aggregates::draft::{Draft, DraftCommand};
use atasira_domain::aggregates::types;
use atasira_domain::bounds;
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::token::{ApprovalSigner, Keyring};
use atasira_domain::{Kind, Principal, Role};
use atasira_platform::feed::encode_notification;
use atasira_platform::store::Db;
use chrono::Utc;
use prost::Message as _;

use super::*;

/// Comfortably under NATS's 1 MiB `max_payload`, headers and all.
const EVENT_BUDGET: usize = 512 * 1024;

/// A data directory removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Submits, approves and activates `request` on a fresh store; each event's encoded size.
async fn sizes_of_the_events_of(request: BoxDraftCreateRequest) -> Vec<(String, usize)> {
    let dir = TempDir(std::env::temp_dir().join(format!("atasira-drafts-{}", uuid::Uuid::new_v4().simple())));
    std::fs::create_dir_all(&dir.0).expect("temp dir");
    let db = Db::connect(&Db::sqlite_url(&dir.0)).await.expect("sqlite db");
    let agent = Principal::new("agent-with-a-realistic-user-id", Role::Member, Kind::Agent);
    let metadata =
        |who: &Principal| HashMap::from([("correlation_id".to_owned(), uuid::Uuid::new_v4().to_string()), ("principal".to_owned(), who.user_id.clone())]);
    let draft_id = uuid::Uuid::new_v4().to_string();
    let now = Utc::now();

    let plan = request.plan().expect("a draft at every bound is accepted");
    let manifest = plan.manifest.clone();
    let submit = DraftCommand::Submit { draft_id: draft_id.clone(), plan, requested_by: agent.clone(), at: now };
    db.cqrs::<Draft>().execute(&draft_id, submit, metadata(&agent), atasira_platform::store::Retry::ONCE).await.expect("submitted");

    let admin = Principal::new("admin", Role::Admin, Kind::Human);
    let signer = ApprovalSigner::from_secret("approval-1".into(), [7; 32]);
    let token = signer.issue(&draft_id, manifest.box_type.as_str(), &manifest.digest(), &admin.user_id, now);
    let approval = Keyring::new(vec![signer.public_key()]).verify(&token, now).expect("verifies");
    let approve = DraftCommand::Approve { by: admin.clone(), confirm_over_limit: true, token, at: now, reserved: true };
    db.cqrs::<Draft>().execute(&draft_id, approve, metadata(&admin), atasira_platform::store::Retry::ONCE).await.expect("approved");

    let box_id = uuid::Uuid::new_v4().to_string();
    let activate = BoxCommand::Activate { box_id: box_id.clone(), draft_id, manifest, approval, at: now };
    db.cqrs::<BoxAggregate>().execute(&box_id, activate, HashMap::new(), atasira_platform::store::Retry::ONCE).await.expect("activated");

    let events = db.events_after(0, &[types::DRAFT, types::BOX], 100).await.expect("events");
    events.iter().map(|e| (e.event_type.clone(), encode_notification(e).len())).collect()
}

#[tokio::test]
async fn a_draft_at_every_bound_makes_events_far_below_the_bus_limit() {
    // '\u{1}' is six bytes in JSON (`\u0001`), the widest a character gets; the others
    // are what people write.
    for fill in ['\u{1}', '😀', 'あ', 'a'] {
        let request = BoxDraftCreateRequest::from_value(bounds::draft_at_bounds(fill, None)).expect("shape");
        let sizes = sizes_of_the_events_of(request).await;
        let names: Vec<&str> = sizes.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["DraftSubmitted", "DraftApproved", "BoxActivated"], "{fill:?}");
        eprintln!("{fill:?}: {sizes:?}");
        for (name, size) in &sizes {
            assert!(*size < EVENT_BUDGET, "{fill:?}: {name} is {size} bytes as a notification");
        }
    }
}

#[test]
fn pages_of_large_drafts_are_cut_short_and_continue_after_the_last_one_kept() {
    let agent = Principal::new("agent", Role::Member, Kind::Agent);
    let row = |position: i64, fill: char| {
        let plan = BoxDraftCreateRequest::from_value(bounds::draft_at_bounds(fill, None)).and_then(|r| r.plan()).expect("plan");
        let submit = DraftCommand::Submit { draft_id: format!("d{position}"), plan, requested_by: agent.clone(), at: Utc::now() };
        let events = Draft::default().decide(submit).expect("submitted");
        DraftRow::submitted(&events[0], position).expect("a row")
    };
    let large: Vec<DraftRow> = (1..=20).map(|p| row(p, '😀')).collect();
    let cut = page(&large, 99);
    assert!(cut.encoded_len() <= PAGE_BYTES && cut.encoded_len() < atasira_contracts::MAX_MESSAGE_BYTES / 2, "{}", cut.encoded_len());
    assert!(!cut.drafts.is_empty() && cut.drafts.len() < large.len(), "{}", cut.drafts.len());
    assert_eq!(cut.next_cursor, cut.drafts.len() as u64, "the next page starts after the last draft kept");
    let detail = large[0].to_wire(true).encoded_len();
    assert!(detail < atasira_contracts::MAX_MESSAGE_BYTES - 64 * 1024, "one draft with its manifest (GetDraft) is {detail} bytes");
    let one = page(&large[..1], 0);
    assert_eq!((one.drafts.len(), one.next_cursor), (1, 0), "one draft always fits");
    let small: Vec<DraftRow> = (1..=3)
        .map(|p| {
            let plan =
                BoxDraftCreateRequest::from_value(serde_json::json!({"box_type": format!("s{p}"), "purpose": "p"})).and_then(|r| r.plan()).expect("plan");
            let events = Draft::default()
                .decide(DraftCommand::Submit { draft_id: format!("s{p}"), plan, requested_by: agent.clone(), at: Utc::now() })
                .expect("submitted");
            DraftRow::submitted(&events[0], p).expect("a row")
        })
        .collect();
    let whole = page(&small, 7);
    assert_eq!((whole.drafts.len(), whole.next_cursor), (3, 7), "small pages are as the projection gave them");
}
