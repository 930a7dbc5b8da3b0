//! `CheckPolicy` (R-POLICY-1): a dry run. A proposed draft is put to the proposed policy
//! version (or the one in force); a proposed version is put, beside the one in force, to
//! every pending draft and change request (as their requesters submitted them) and to
//! every Box that is not archived (a launch by its trigger, or by its primary), and the
//! ones decided differently are listed. Nothing is recorded.

use atasira_contracts::{Reply, reply_ok, v1};
use atasira_domain::aggregates::boxes::{BoxAggregate, BoxRole, BoxState};
use atasira_domain::aggregates::draft::{Draft, DraftData, DraftStatus};
use atasira_domain::draft_request::BoxDraftCreateRequest;
use atasira_domain::org_policy::{Input, PolicyDocument, Verdict};
use atasira_domain::principal::trigger_principal;
use atasira_domain::{ErrorCode, Kind, Principal, Role};
use atasira_platform::org_policy::Active;
use atasira_platform::refusal::Refusal;
use atasira_platform::store::Db;
use sqlx::Row;

use crate::projection;

/// How many pending drafts and Boxes one check puts to the policies at most.
pub const MAX_CHECKED: usize = 2000;

/// A policy version to put requests to (`None`: no policy).
type Version<'a> = Option<(&'a PolicyDocument, u64)>;

fn verdict(version: Version, input: &Input) -> Verdict {
    version.map_or_else(Verdict::unpoliced, |(document, number)| document.evaluate(number, input))
}

pub(crate) async fn check(db: &Db, active: Option<Active>, principal: &Principal, req: v1::CheckPolicy) -> Result<Reply, Refusal> {
    if !principal.is_admin() {
        return Err(Refusal::new(ErrorCode::Forbidden, "checking policies needs role admin"));
    }
    let proposed = if req.text.is_empty() {
        None
    } else {
        Some(PolicyDocument::parse(&req.text).map_err(|e| Refusal::new(ErrorCode::InvalidRequest, format!("text: {e}")))?)
    };
    let active_version = active.as_ref().map_or(0, |a| a.version);
    let now: Version = active.as_ref().map(|a| (a.document.as_ref(), a.version));
    let next: Version = proposed.as_ref().map(|d| (d, active_version + 1));
    let draft = match req.draft {
        None => None,
        Some(request) => {
            let plan = BoxDraftCreateRequest::from(request).plan()?;
            Some(outcome(&verdict(next.or(now), &Input::draft(principal, &plan.manifest, &plan.over_limit))))
        }
    };
    let mut reply = v1::PolicyCheckReply { active_version, draft, ..Default::default() };
    if next.is_none() {
        return Ok(reply_ok(&reply));
    }
    let mut checked = 0usize;
    // Pending drafts and change requests, as their requesters submitted them.
    let mut after = 0u64;
    'pages: loop {
        let (rows, next_cursor) = projection::list_in(db, &[DraftStatus::PendingApproval], None, 200, after).await.map_err(Refusal::internal)?;
        for row in rows {
            if checked == MAX_CHECKED {
                reply.truncated = true;
                break 'pages;
            }
            checked += 1;
            let draft: Draft = db.load(&row.draft_id).await.map_err(Refusal::internal)?;
            let Some(d) = draft.data.filter(|d| d.status == DraftStatus::PendingApproval) else { continue };
            let input = draft_input(&d);
            let (before, after) = (verdict(now, &input), verdict(next, &input));
            if differs(&before, &after) {
                let kind = if d.change.is_some() { "change" } else { "draft" };
                reply.changes.push(change(kind, &d.draft_id, d.manifest.box_type.as_str(), &before, &after));
            }
        }
        if next_cursor == 0 {
            break;
        }
        after = next_cursor;
    }
    // Boxes, as their next launch would be.
    if !reply.truncated {
        let boxes = sqlx::query("SELECT box_id FROM drafts_box_types ORDER BY box_type").fetch_all(db.any()).await.map_err(Refusal::internal)?;
        for row in boxes {
            if checked == MAX_CHECKED {
                reply.truncated = true;
                break;
            }
            checked += 1;
            let box_id: String = row.try_get(0).map_err(Refusal::internal)?;
            let boxed: BoxAggregate = db.load(&box_id).await.map_err(Refusal::internal)?;
            let Some(b) = boxed.data.filter(|b| b.state != BoxState::Archived) else { continue };
            let launcher = launcher(&box_id, &b.manifest.trigger_type, &b.assignments);
            let input = Input::launch(&launcher, &b.manifest, &box_id, "policy-check", &Default::default());
            let (before, after) = (verdict(now, &input), verdict(next, &input));
            if differs(&before, &after) {
                reply.changes.push(change("box", &box_id, b.manifest.box_type.as_str(), &before, &after));
            }
        }
    }
    reply.checked = u32::try_from(checked).unwrap_or(u32::MAX);
    Ok(reply_ok(&reply))
}

fn draft_input(d: &DraftData) -> Input<'_> {
    match &d.change {
        Some(c) => Input::change(&d.requested_by, &d.manifest, &d.over_limit, &c.box_id, &c.diff.added),
        None => Input::draft(&d.requested_by, &d.manifest, &d.over_limit),
    }
}

/// Who launches a Box's Workers: its trigger, or (manual) its primary, as a member.
fn launcher(box_id: &str, trigger: &atasira_domain::manifest::TriggerType, assignments: &[(String, BoxRole)]) -> Principal {
    let primary = assignments.iter().find(|(_, role)| *role == BoxRole::Primary).map(|(user, _)| user.clone());
    match (trigger, primary) {
        (atasira_domain::manifest::TriggerType::Manual, Some(user)) => Principal::new(user, Role::Member, Kind::Human),
        _ => trigger_principal(box_id),
    }
}

/// Whether two verdicts decide differently (not merely by another version).
fn differs(before: &Verdict, after: &Verdict) -> bool {
    (before.decision, &before.rules, before.approvals_required, before.confirm) != (after.decision, &after.rules, after.approvals_required, after.confirm)
}

fn change(kind: &str, id: &str, box_type: &str, before: &Verdict, after: &Verdict) -> v1::PolicyChange {
    v1::PolicyChange { kind: kind.to_owned(), id: id.to_owned(), box_type: box_type.to_owned(), before: Some(outcome(before)), after: Some(outcome(after)) }
}

/// A verdict on the wire.
pub fn outcome(v: &Verdict) -> v1::PolicyOutcome {
    v1::PolicyOutcome {
        decision: if v.denied() { "deny" } else { "allow" }.to_owned(),
        rules: v.rules.clone(),
        approvals_required: v.approvals_required,
        confirm: v.confirm,
        reason: v.reason.clone().unwrap_or_default(),
        version: v.version,
    }
}
