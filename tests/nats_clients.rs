//! NATS publishers in cluster mode (R-AUTH-5, R-ARCH-2, R-ARCH-3): a person or agent
//! connects to the real nats-server with their PAT as the NATS token; the gateway's auth
//! callout admits them with permissions for their own subjects and inbox only, and the
//! services look the token up again on every request.

use std::time::Duration;

use async_nats::ConnectOptions;
use atasira_contracts::v1;
use atasira_tests::fixtures::block_on;
use atasira_tests::harness::{Mode, System, nats_tls, pat_options, reporting_server_errors};
use prost::Message as _;
use tokio::sync::mpsc;

fn hash(token: &str) -> String {
    atasira_platform::auth::hash_token(token)
}

/// A publisher's connection, with the server's complaints (permission violations) caught.
struct Publisher {
    client: async_nats::Client,
    errors: mpsc::UnboundedReceiver<String>,
    hash: String,
}

async fn connect(url: &str, token: &str) -> Result<Publisher, String> {
    let (options, errors) = reporting_server_errors(pat_options(token));
    let client = options.connect(url).await.map_err(|e| e.to_string())?;
    Ok(Publisher { client, errors, hash: hash(token) })
}

impl Publisher {
    fn subject(&self, to: &str) -> String {
        format!("atasira.box.client.{}.{to}", self.hash)
    }

    /// Sends `message` to `to` on our own subject; the reply or the typed refusal's code.
    async fn call<M: atasira_contracts::Named, R: prost::Message + Default>(&self, to: &str, message: &M) -> Result<R, String> {
        self.written(to, message).await.map(|(r, _)| r)
    }

    /// Like `call`, with the store position of what the request wrote.
    async fn written<M: atasira_contracts::Named, R: prost::Message + Default>(&self, to: &str, message: &M) -> Result<(R, i64), String> {
        self.keyed(to, message, "").await
    }

    /// Like `written`, with an idempotency key in the envelope.
    async fn keyed<M: atasira_contracts::Named, R: prost::Message + Default>(&self, to: &str, message: &M, key: &str) -> Result<(R, i64), String> {
        let env = atasira_contracts::envelope(message, &uuid::Uuid::new_v4().to_string(), key);
        let reply = tokio::time::timeout(Duration::from_secs(10), self.client.request(self.subject(to), env.encode_to_vec().into()))
            .await
            .map_err(|_| "timeout".to_owned())?
            .map_err(|e| e.to_string())?;
        match atasira_contracts::decode_reply::<R>(&reply.payload).map_err(|e| e.to_string())? {
            Ok(written) => Ok(written),
            Err(e) => Err(e.code.as_str().to_owned()),
        }
    }

    /// The next permission violation the server reports, if one comes soon.
    async fn violation(&mut self) -> Option<String> {
        // A PING round trip makes the server's answer to what we sent before arrive first.
        let _ = self.client.flush().await;
        tokio::time::timeout(Duration::from_secs(3), self.errors.recv()).await.ok().flatten().filter(|e| e.to_lowercase().contains("permissions violation"))
    }
}

fn submit(box_type: &str, purpose: &str) -> v1::SubmitDraft {
    v1::SubmitDraft {
        request: Some(v1::BoxDraftCreateRequest { box_type: box_type.into(), purpose: purpose.into(), tools: vec!["Read".into()], ..Default::default() }),
    }
}

#[test]
fn nats_publishers_connect_with_their_pat_and_reach_only_their_own_subjects() {
    // R-AUTH-5, R-ARCH-2, R-AUTH-1: PAT over NATS, least privilege
    let mut sys = System::start(Mode::Cluster);
    let url = sys.nats().url();
    block_on(async {
        // Anonymous and unknown tokens are refused by the auth callout.
        let anonymous = nats_tls(ConnectOptions::new()).connect(&url).await;
        assert!(anonymous.is_err(), "an anonymous connection is refused");
        assert!(connect(&url, "atasira_pat_unknown").await.is_err(), "a wrong PAT is refused");

        let mut agent = connect(&url, &sys.agent).await.expect("the agent's PAT connects");
        // Submitting a draft on its own subject works, as the agent.
        let (reply, position): (v1::SubmitDraftReply, i64) = agent.written("drafts", &submit("from-nats", "over NATS")).await.expect("submitted");
        assert_eq!(reply.status, v1::DraftStatus::PendingApproval as i32);
        // Read-your-writes over NATS: wait for the drafts projection to reach the write.
        let wait = v1::WaitForPosition { position, timeout_ms: 10_000, event_ids: vec![] };
        let caught_up: v1::WaitForPositionReply = agent.call("drafts", &wait).await.expect("waited");
        assert!(caught_up.lagging.is_empty(), "{caught_up:?}");
        // Reading what REST lets an agent read: its drafts, the Box list.
        let mine: v1::DraftPage = agent.call("drafts", &v1::ListMyDrafts { limit: 10, after: 0 }).await.expect("mine");
        assert_eq!(mine.drafts.len(), 1);
        assert_eq!(mine.drafts[0].requested_by, "agent");
        let _: v1::BoxList = agent.call("runtime-registry", &v1::ListBoxes::default()).await.expect("boxes");
        // What REST refuses an agent, the services refuse too; what only services may do is refused.
        assert_eq!(agent.call::<_, v1::DraftPage>("drafts", &v1::ListPendingDrafts { limit: 10, after: 0 }).await.err().as_deref(), Some("forbidden"));
        let reserve = v1::ReserveBoxType { box_type: "mine".into(), draft_id: reply.draft_id.clone(), deadline_unix: 0 };
        assert_eq!(agent.call::<_, v1::Ack>("runtime-registry", &reserve).await.err().as_deref(), Some("forbidden"));
        let text = |s: &str| s.to_owned();
        // A NUL character is the caller's mistake, named.
        assert_eq!(agent.call::<_, v1::SubmitDraftReply>("drafts", &submit("nul-type", "p\u{0}")).await.err(), Some(text("invalid_request")));

        // NATS itself refuses everything outside the agent's own subjects and inbox.
        for subject in
            ["atasira.box.gateway.drafts", "atasira.box.approval.runtime-registry", "atasira.box.drafts.events", "$JS.API.STREAM.PURGE.ATASIRA_EVENTS"]
        {
            agent.client.publish(subject.to_owned(), "x".into()).await.expect("sent");
            let seen = agent.violation().await;
            assert!(seen.is_some(), "publishing on {subject} is refused by NATS");
        }
        let other = format!("atasira.box.client.{}.drafts", hash(&sys.admin));
        agent.client.publish(other.clone(), "x".into()).await.expect("sent");
        assert!(agent.violation().await.is_some(), "another token's subject is refused: {other}");
        for subject in ["atasira.box.>", "$JS.API.>", "_INBOX.>", "$SYS.REQ.USER.AUTH"] {
            let _sub = agent.client.subscribe(subject.to_owned()).await.expect("sent");
            assert!(agent.violation().await.is_some(), "subscribing to {subject} is refused by NATS");
        }

        // An admin's PAT lists pending drafts over NATS (as the REST API lets it).
        let admin = connect(&url, &sys.admin).await.expect("the admin's PAT connects");
        let pending: v1::DraftPage = admin.call("drafts", &v1::ListPendingDrafts { limit: 10, after: 0 }).await.expect("pending");
        assert!(pending.drafts.iter().any(|d| d.draft_id == reply.draft_id));
        // Nobody decides on a draft over NATS.
        let approve = v1::ApproveDraft { draft_id: reply.draft_id.clone(), confirm_over_limit: false };
        let _ = admin.client.publish(admin.subject("approval"), atasira_contracts::envelope(&approve, "c", "").encode_to_vec().into()).await;
        let mut admin = admin;
        assert!(admin.violation().await.is_some(), "the approval service is not open to NATS publishers");
    });
    assert_eq!(sys.pending().len(), 1, "only the one submission created anything");
}

#[test]
fn a_revoked_pat_stops_working_over_nats_at_once() {
    // R-AUTH-4: revocation takes effect on the next request of a connected publisher
    let mut sys = System::start(Mode::Cluster);
    let url = sys.nats().url();
    let token = sys.token("temp", "member", "agent");
    block_on(async {
        let publisher = connect(&url, &token).await.expect("connects");
        let _: v1::DraftPage = publisher.call("drafts", &v1::ListMyDrafts { limit: 10, after: 0 }).await.expect("works");
        let mut args = vec!["tokens", "revoke", token.as_str()];
        let target = sys.target_args();
        args.extend(target.iter().map(String::as_str));
        let (code, _, err) = sys.cli(&args);
        assert_eq!(code, 0, "{err}");
        assert_eq!(publisher.call::<_, v1::DraftPage>("drafts", &v1::ListMyDrafts { limit: 10, after: 0 }).await.err().as_deref(), Some("unauthenticated"));
        assert!(connect(&url, &token).await.is_err(), "and it cannot connect again");
    });
}

#[test]
fn a_publishers_submit_with_an_idempotency_key_names_one_draft_whatever_the_retries() {
    // R-DRAFT-11: the drafts service derives a keyed draft's id from the caller and the
    // key, so a submit run again answers the draft the first run made, as it made it
    let sys = System::start(Mode::Cluster);
    let url = sys.nats_url();
    let (first, again, reuse, theirs) = block_on(async {
        let agent = connect(&url, &sys.agent).await.expect("the agent's PAT connects");
        let first: Result<(v1::SubmitDraftReply, i64), _> = agent.keyed("drafts", &submit("keyed", "p"), "k-1").await;
        let again: Result<(v1::SubmitDraftReply, i64), _> = agent.keyed("drafts", &submit("keyed", "p"), "k-1").await;
        let reuse: Result<(v1::SubmitDraftReply, i64), _> = agent.keyed("drafts", &submit("keyed", "another purpose"), "k-1").await;
        let admin = connect(&url, &sys.admin).await.expect("the admin's PAT connects");
        let theirs: Result<(v1::SubmitDraftReply, i64), _> = admin.keyed("drafts", &submit("keyed", "p"), "k-1").await;
        (first, again, reuse, theirs)
    });
    let first = first.expect("submitted");
    assert!(first.1 > 0, "a position for read-your-writes");
    assert_eq!(again, Ok(first.clone()), "the same draft, with the position of its submission");
    assert_eq!(reuse.map(|(r, _)| r.draft_id), Err("idempotency_key_reuse".to_owned()), "the key named another draft");
    let theirs = theirs.expect("another caller's key is theirs");
    assert_ne!(theirs.0.draft_id, first.0.draft_id);
    let pending = sys.eventually_pending(Duration::from_secs(20), |l| l.len() >= 2);
    assert_eq!(pending.len(), 2, "one draft per caller: {pending:?}");
}
