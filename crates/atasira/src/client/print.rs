//! What the client verbs print on stdout for each answer of the API: read into the
//! gateway's API types (`atasira_gateway::api`), shown as `name value` lines or a table; or,
//! with `--json`, the API's JSON as received ([`json`]). Enum values and times are written
//! as the API's JSON has them ([`wire`]).

use std::collections::BTreeMap;

use atasira_gateway::api::{
    Approved, AuditRows, BoxDetail, BoxHistory, BoxList, ChangeRequested, DraftCreated, DraftDetail, DraftPage, DraftStatusChanged, Policy, PolicyCheck,
    PolicyOutcome, ToolRequest, ToolRequestList, VerifyResult, Webhook, WebhookDeliveryList, WebhookList, WebhookRegistered, Worker, WorkerList,
    WorkerProvenance,
};
use serde::Serialize;
use serde_json::Value;

/// The API's JSON answer, as received (`--json`).
pub(super) fn json(value: &Value) {
    println!("{}", serde_json::to_string_pretty(value).unwrap_or_default());
}

/// `workers create`: whether this request launched the Worker (201) or an earlier one with
/// the same launch_id did, then the Worker.
pub(super) fn launched(status: u16, w: &Worker) {
    println!("{}", if status == 201 { "launched" } else { "launched before (same launch_id and request)" });
    worker(w);
}

/// A Worker with its transcript.
pub(super) fn worker(w: &Worker) {
    let rows = [
        ("worker_id", w.worker_id.clone()),
        ("launch_id", w.launch_id.clone()),
        ("box", format!("{} ({})", w.box_type, w.box_id)),
        ("role", role_text(&w.role).to_owned()),
        ("labels", labels_text(&w.labels)),
        ("created_by", w.created_by.clone()),
        ("created_at", wire(w.created_at)),
        ("state", wire(w.state)),
        ("host", w.host.clone().unwrap_or_else(|| "-".to_owned())),
    ];
    for (name, value) in rows {
        println!("{name:<11} {value}");
    }
    if let Some(stop) = w.stop_requested {
        println!("{:<11} {}", "asked", wire(stop));
    }
    if let Some(code) = w.exit_code {
        println!("{:<11} {code}", "exit_code");
    }
    println!("transcript:");
    for entry in &w.transcript {
        println!("  #{} {} at {}", entry.seq, entry.author, wire(entry.at));
        for s in &entry.segments {
            println!("    {:<13} {}", wire(s.kind), s.value);
        }
    }
    if !w.log.is_empty() {
        println!("log:");
        for line in &w.log {
            println!("  {line}");
        }
    }
    if let Some(result) = &w.result {
        println!("result:");
        for line in result.lines() {
            println!("  {line}");
        }
    }
}

/// A tool-use request.
pub(super) fn tool_request(r: &ToolRequest) {
    let rows = [
        ("request_id", r.request_id.clone()),
        ("state", wire(r.state)),
        ("worker", format!("{} of {} ({})", r.worker_id, r.box_type, r.box_id)),
        ("tool", r.tool.clone()),
        ("input", r.input.to_string()),
        ("rule", r.rule.clone()),
        ("reason", r.reason.clone()),
        ("launched_by", r.launched_by.clone()),
        ("requested", wire(r.requested_at)),
        ("expires", wire(r.expires_at)),
    ];
    for (name, value) in rows {
        println!("{name:<11} {value}");
    }
    if let Some(by) = &r.decided_by {
        println!("{:<11} {by}", "decided_by");
    }
    if let Some(reason) = &r.decision_reason {
        println!("{:<11} {reason}", "why");
    }
}

/// A page of tool-use requests.
pub(super) fn tool_requests(page: &ToolRequestList) {
    if page.requests.is_empty() {
        println!("no tool-use requests");
    }
    for r in &page.requests {
        println!("{} {:<9} {} {} ({}): {}", r.request_id, wire(r.state), r.box_type, r.tool, r.rule, r.input);
    }
    next_page(page.next_cursor.as_deref());
}

/// A page of a Box's Workers.
pub(super) fn workers(page: &WorkerList) {
    let workers = &page.workers;
    if workers.is_empty() {
        println!("no Workers");
    } else {
        let launch = workers.iter().map(|w| w.launch_id.len()).max().unwrap_or(0).max(9);
        let role = workers.iter().map(|w| w.role.len()).max().unwrap_or(0).max(4);
        let by = workers.iter().map(|w| w.created_by.len()).max().unwrap_or(0).max(10);
        println!("{:<36} {:<launch$} {:<role$} {:<by$} {:<30} LABELS", "WORKER_ID", "LAUNCH_ID", "ROLE", "CREATED_BY", "CREATED_AT");
        for w in workers {
            println!(
                "{:<36} {:<launch$} {:<role$} {:<by$} {:<30} {}",
                w.worker_id,
                w.launch_id,
                role_text(&w.role),
                w.created_by,
                wire(w.created_at),
                labels_text(&w.labels)
            );
        }
    }
    next_page(page.next_cursor.as_deref());
}

/// The chain from the human approval of a Worker's Box to the configuration it runs.
pub(super) fn provenance(p: &WorkerProvenance) {
    println!("worker_id   {}", p.worker_id);
    println!("box_id      {}", p.box_id);
    println!("bundle      {}", p.bundle_digest);
    let verified = if p.approval_verified { "verified now with public keys" } else { "DOES NOT VERIFY" };
    println!("approval    signed by key {} ({verified})", p.approval_key_id);
    println!();
    let width = p.steps.iter().map(|s| s.event_id.len()).max().unwrap_or(0).max(5);
    println!("{:<14} {:<width$} {:>8} {:>5}  {:<30} {:<16} DIGEST / VERSION", "STEP", "EVENT", "POSITION", "AUDIT", "AT", "ACTOR");
    for s in &p.steps {
        let audit = s.audit_seq.map_or_else(|| "-".to_owned(), |seq| seq.to_string());
        let mut what = s.digest.clone().unwrap_or_default();
        if let Some(version) = &s.manifest_version {
            what = if what.is_empty() { format!("v{version}") } else { format!("{what} v{version}") };
        }
        println!("{:<14} {:<width$} {:>8} {:>5}  {:<30} {:<16} {what}", wire(s.kind), s.event_id, s.position.to_string(), audit, wire(s.at), s.actor);
    }
}

/// A page of drafts, those over the limit marked with what makes them so.
pub(super) fn drafts(page: &DraftPage) {
    if page.drafts.is_empty() {
        println!("no drafts");
    } else {
        let rows: Vec<Vec<String>> = page
            .drafts
            .iter()
            .map(|d| {
                let limit = if d.over_limit { format!("OVER LIMIT: {}", dangerous_text(&d.over_limit_ops, &d.over_limit_tools)) } else { "-".to_owned() };
                vec![d.draft_id.clone(), d.box_type.clone(), wire(d.status), d.requested_by.clone(), wire(d.created_at), limit]
            })
            .collect();
        print_table(&["DRAFT_ID", "BOX_TYPE", "STATUS", "REQUESTED_BY", "CREATED_AT", "LIMIT"], &rows);
    }
    next_page(page.next_cursor.as_deref());
}

/// One draft: what it asks for, where it is, the decision on it and its manifest.
pub(super) fn draft(detail: &DraftDetail) {
    let d = &detail.summary;
    let required_access: Vec<String> = d.required_access.iter().map(|a| serde_json::to_string(a).unwrap_or_default()).collect();
    let mut rows = vec![
        ("draft_id", d.draft_id.clone()),
        ("box_type", d.box_type.clone()),
        ("name", d.name.clone()),
        ("status", wire(d.status)),
        ("purpose", d.purpose.clone()),
        ("requested_by", d.requested_by.clone()),
        ("created_at", wire(d.created_at)),
        ("os_operations", list_text(&d.os_operations)),
        ("tools", list_text(&d.tools)),
        ("url_allowlist", list_text(&d.url_allowlist)),
        ("network", wire(d.network)),
        ("file_access", list_text(&d.file_access)),
        ("required_access", if required_access.is_empty() { "-".to_owned() } else { required_access.join(", ") }),
        ("prohibited", list_text(&d.prohibited)),
        ("box_id", d.box_id.clone().unwrap_or_else(|| "-".to_owned())),
        ("over_limit", if d.over_limit { format!("yes: {}", dangerous_text(&d.over_limit_ops, &d.over_limit_tools)) } else { "no".to_owned() }),
        ("warnings", list_text(&d.warnings)),
    ];
    if d.kind == atasira_gateway::api::DraftKind::Change {
        rows.push(("changes", format!("{} (adds: {}; removes: {})", d.box_id.as_deref().unwrap_or("-"), list_text(&d.added), list_text(&d.removed))));
    }
    if d.approvals_required > 1 {
        rows.push(("approvals", format!("{} of {} ({})", d.approvals.len(), d.approvals_required, list_text(&d.approvals))));
    }
    if let Some(p) = &d.policy {
        let confirm = if p.confirm { ", the second confirmation" } else { "" };
        rows.push(("policy", format!("version {}: {}{confirm}", p.version, list_text(&p.rules))));
    }
    if let Some(r) = &d.revision {
        rows.push(("revision", format!("version {} of {}, rejected by {}: {}", r.version, r.of, r.rejected_by, r.reason)));
        rows.push(("revision_changes", format!("adds: {}; removes: {}", list_text(&r.added), list_text(&r.removed))));
    }
    if let Some(decision) = &d.decision {
        rows.push(("decided_by", decision.by.as_deref().or(decision.withdrawn_by.as_deref()).unwrap_or("-").to_owned()));
        rows.push(("decided_at", wire(decision.at)));
        if let Some(reason) = &decision.reason {
            rows.push(("reason", reason.clone()));
        }
    }
    print_rows(&rows);
    println!("manifest:");
    println!("{}", serde_json::to_string_pretty(&detail.manifest).unwrap_or_default());
}

/// `drafts create`: the draft submitted.
pub(super) fn draft_created(d: &DraftCreated) {
    println!("submitted, waiting for a human admin's approval");
    print_rows(&[
        ("draft_id", d.draft_id.clone()),
        ("box_type", d.box_type.clone()),
        ("status", wire(d.status)),
        ("over_limit", d.over_limit.to_string()),
        ("warnings", list_text(&d.warnings)),
    ]);
}

/// `boxes change`: the change request and what it changes.
pub(super) fn change_requested(c: &ChangeRequested) {
    println!("change requested, waiting for a human admin's approval");
    print_rows(&[
        ("draft_id", c.draft_id.clone()),
        ("box", format!("{} ({})", c.box_type, c.box_id)),
        ("status", wire(c.status)),
        ("version", c.version.clone()),
        ("over_limit", c.over_limit.to_string()),
        ("adds", list_text(&c.added)),
        ("removes", list_text(&c.removed)),
    ]);
}

/// `drafts approve`: the draft's Box.
pub(super) fn approved(a: &Approved) {
    println!("approved; the Box is active");
    print_rows(&[
        ("draft_id", a.draft_id.clone()),
        ("box_id", a.box_id.clone()),
        ("box_type", a.box_type.clone()),
        ("approved_by", a.approved_by.clone()),
        ("approved_at", wire(a.approved_at)),
    ]);
}

/// `drafts reject|withdraw`: the draft's new status.
pub(super) fn draft_status(d: &DraftStatusChanged) {
    println!("draft {} is {}", d.draft_id, wire(d.status));
}

/// The operations and tools over the limit a draft asks for, in words.
pub(super) fn dangerous_text(ops: &[String], tools: &[String]) -> String {
    let ops = list_text(ops);
    let tools = list_text(tools);
    match (ops.as_str(), tools.as_str()) {
        ("-", "-") => "capabilities over the limit".to_owned(),
        (ops, "-") => format!("the operations {ops}"),
        ("-", tools) => format!("the tools {tools}"),
        (ops, tools) => format!("the operations {ops} and the tools {tools}"),
    }
}

/// A page of Boxes.
pub(super) fn boxes(page: &BoxList) {
    if page.boxes.is_empty() {
        println!("no Boxes");
    } else {
        let rows: Vec<Vec<String>> = page
            .boxes
            .iter()
            .map(|b| vec![b.box_id.clone(), b.box_type.clone(), wire(b.state), b.manifest_version.clone(), wire(b.created_at), b.name.clone()])
            .collect();
        print_table(&["BOX_ID", "BOX_TYPE", "STATE", "VERSION", "CREATED_AT", "NAME"], &rows);
    }
    next_page(page.next_cursor.as_deref());
}

/// `boxes stop|resume|archive`: the Box's new state.
pub(super) fn box_state(b: &BoxDetail) {
    println!("Box {} ({}) is {}", b.box_id, b.box_type, wire(b.state));
}

/// One Box: what it is, who is assigned to it, whether its manifest drifted, and how its
/// access was set up.
pub(super) fn box_detail(b: &BoxDetail) {
    let assignments: Vec<String> = b.assignments.iter().map(|a| format!("{} ({})", a.user_id, wire(a.role_in_box))).collect();
    print_rows(&[
        ("box_id", b.box_id.clone()),
        ("box_type", b.box_type.clone()),
        ("name", b.name.clone()),
        ("state", wire(b.state)),
        ("manifest_version", b.manifest_version.clone()),
        ("created_at", wire(b.created_at)),
        ("draft_id", b.draft_id.clone()),
        ("approved_by", b.approved_by.clone()),
        ("assignments", if assignments.is_empty() { "-".to_owned() } else { assignments.join(", ") }),
        ("manifest_drift", if b.manifest_drift { "yes: the manifest file differs from the approved one" } else { "no" }.to_owned()),
    ]);
    if !b.provisioning.is_empty() {
        println!("access setup:");
        for p in &b.provisioning {
            let error = p.reason.as_deref().or(p.detail.as_deref()).map(|e| format!(": {e}")).unwrap_or_default();
            println!("  #{} {} {}{error}", p.index, p.access, wire(p.status));
        }
    }
}

/// A page of a Box's history: each event with the keys its kind has.
pub(super) fn history(h: &BoxHistory) {
    if h.entries.is_empty() {
        println!("no history");
    } else {
        let rows: Vec<Vec<String>> = h
            .entries
            .iter()
            .map(|e| {
                let details = [
                    ("user_id", e.user_id.clone()),
                    ("role_in_box", e.role_in_box.map(wire)),
                    ("approved_by", e.approved_by.clone()),
                    ("manifest_version", e.manifest_version.clone()),
                    ("changed_keys", e.changed_keys.as_ref().map(|keys| serde_json::to_string(keys).unwrap_or_default())),
                    ("state", e.state.map(wire)),
                    ("access", e.access.clone()),
                    ("reason", e.reason.clone()),
                ];
                let what: Vec<String> = details.into_iter().filter_map(|(key, value)| value.map(|v| format!("{key}={v}"))).collect();
                vec![wire(e.at), wire(e.kind), e.actor.clone(), what.join(" ")]
            })
            .collect();
        print_table(&["AT", "WHAT", "BY", "DETAILS"], &rows);
    }
    next_page(h.next_cursor.as_deref());
}

/// A page of audit ledger rows.
pub(super) fn audit_rows(page: &AuditRows) {
    if page.rows.is_empty() {
        println!("no audit rows");
    } else {
        let rows: Vec<Vec<String>> =
            page.rows.iter().map(|r| vec![r.seq.to_string(), r.time.clone(), r.action.clone(), r.actor.clone(), r.target.clone(), r.detail.clone()]).collect();
        print_table(&["SEQ", "TIME", "ACTION", "ACTOR", "TARGET", "DETAIL"], &rows);
    }
    next_page(page.next_cursor.as_deref());
}

/// `audit verify` through a gateway: verified with the number of rows, or the first row
/// that does not verify and why.
pub(super) fn verify_result(v: &VerifyResult) {
    let number = |n: Option<String>| n.unwrap_or_else(|| "-".to_owned());
    if v.ok {
        println!("verified: the hash chain and every signed checkpoint hold ({} rows)", number(v.rows.map(|n| n.to_string())));
    } else {
        println!("DOES NOT VERIFY: row {} is the first bad row: {}", number(v.first_bad_seq.map(|n| n.to_string())), v.reason.as_deref().unwrap_or_default());
    }
}

/// A webhook, as `name value` lines.
fn webhook_rows(w: &Webhook) -> Vec<(&'static str, String)> {
    vec![
        ("webhook_id", w.webhook_id.clone()),
        ("url", w.url.clone()),
        ("format", wire(w.format)),
        ("kinds", kinds_text(&w.kinds)),
        ("registered_by", w.registered_by.clone()),
        ("registered_at", wire(w.registered_at)),
        ("deliveries", format!("{} delivered, {} pending, {} dead", w.delivered, w.pending, w.dead)),
    ]
}

/// `webhooks add`: the webhook, and its secret this once.
pub(super) fn webhook_registered(r: &WebhookRegistered) {
    println!("registered");
    let mut rows = webhook_rows(&r.webhook);
    rows.push(("secret", r.secret.clone()));
    print_rows(&rows);
    println!();
    println!("Keep the secret now: it is not shown again. It signs every delivery in the X-Atasira-Signature");
    println!("header (t=<unix seconds>,v1=<hex HMAC-SHA256 of \"<t>.<body>\">); check it before trusting one.");
}

/// `webhooks remove`: the webhook removed.
pub(super) fn webhook_removed(w: &Webhook) {
    println!("removed webhook {} ({})", w.webhook_id, w.url);
}

/// The webhooks, with how their deliveries went.
pub(super) fn webhooks(list: &WebhookList) {
    if list.webhooks.is_empty() {
        println!("no webhooks");
        return;
    }
    let rows: Vec<Vec<String>> = list
        .webhooks
        .iter()
        .map(|w| {
            vec![
                w.webhook_id.clone(),
                wire(w.format),
                kinds_text(&w.kinds),
                w.delivered.to_string(),
                w.pending.to_string(),
                w.dead.to_string(),
                w.registered_by.clone(),
                w.url.clone(),
            ]
        })
        .collect();
    print_table(&["WEBHOOK_ID", "FORMAT", "KINDS", "DELIVERED", "PENDING", "DEAD", "REGISTERED_BY", "URL"], &rows);
}

/// A webhook's deliveries.
pub(super) fn webhook_deliveries(page: &WebhookDeliveryList) {
    if page.deliveries.is_empty() {
        println!("no deliveries");
        return;
    }
    let rows: Vec<Vec<String>> = page
        .deliveries
        .iter()
        .map(|d| {
            let answered = d.last_status.map_or_else(|| "-".to_owned(), |s| s.to_string());
            let next = d.next_attempt_at.map_or_else(|| "-".to_owned(), wire);
            let error = if d.last_error.is_empty() { "-".to_owned() } else { d.last_error.clone() };
            vec![d.delivery_id.clone(), wire(d.state), d.kind.clone(), d.attempts.to_string(), answered, wire(d.updated_at), next, d.event_id.clone(), error]
        })
        .collect();
    print_table(&["DELIVERY_ID", "STATE", "KIND", "ATTEMPTS", "LAST_STATUS", "UPDATED_AT", "NEXT_ATTEMPT", "EVENT", "LAST_ERROR"], &rows);
}

/// A webhook's kinds, or `all` when it takes every kind.
fn kinds_text(kinds: &[String]) -> String {
    if kinds.is_empty() { "all".to_owned() } else { kinds.join(",") }
}

/// The text the API's JSON has for a value: an enum's name (`pending_approval`, `idle`), a
/// time (RFC 3339 in UTC, as precise as it is: `2026-12-01T11:27:26.695Z`).
fn wire(value: impl Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(text)) => text,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// A Worker's role, or `-` when it has none.
fn role_text(role: &str) -> &str {
    if role.is_empty() { "-" } else { role }
}

/// Labels as `k=v, k2=v2`, or `-` when there are none.
fn labels_text(labels: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if pairs.is_empty() { "-".to_owned() } else { pairs.join(", ") }
}

/// `name value` lines, names aligned.
fn print_rows(rows: &[(&str, String)]) {
    let width = rows.iter().map(|(name, _)| name.len()).max().unwrap_or(0);
    for (name, value) in rows {
        println!("{name:<width$} {value}");
    }
}

/// A table: headers over rows, columns as wide as their widest cell (the last one free).
pub(crate) fn print_table(headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let last = cells.len().saturating_sub(1);
        let parts: Vec<String> = cells.iter().enumerate().map(|(i, c)| if i == last { (*c).to_owned() } else { format!("{c:<w$}", w = widths[i]) }).collect();
        println!("{}", parts.join("  "));
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
}

/// A list of strings as `a, b`, or `-` when empty.
fn list_text(list: &[String]) -> String {
    if list.is_empty() { "-".to_owned() } else { list.join(", ") }
}

/// The cursor of the next page, when there is one.
fn next_page(next_cursor: Option<&str>) {
    if let Some(next) = next_cursor {
        println!("next page: --cursor {next}");
    }
}

/// The organisation's policy in force.
pub(super) fn policy(p: &Policy) {
    if p.version == 0 {
        println!("no policy published: only the built-in rules apply");
        return;
    }
    println!("version {}", p.version);
    println!("digest {}", p.digest);
    println!("published_by {}", p.published_by.clone().unwrap_or_default());
    println!("published_at {}", p.published_at.map(|t| t.to_rfc3339()).unwrap_or_default());
    let rows: Vec<Vec<String>> = p
        .rules
        .iter()
        .map(|r| {
            vec![
                r.id.clone(),
                wire(r.effect),
                r.approvals.map_or_else(|| "-".to_owned(), |n| n.to_string()),
                if r.confirm { "yes" } else { "-" }.to_owned(),
                r.reason.clone().unwrap_or_default(),
            ]
        })
        .collect();
    print_table(&["RULE", "EFFECT", "APPROVALS", "CONFIRM", "REASON"], &rows);
}

fn outcome_text(o: &PolicyOutcome) -> String {
    let mut text = wire(o.decision);
    if !o.rules.is_empty() {
        text.push_str(&format!(" ({})", o.rules.join(", ")));
    }
    if o.approvals_required > 1 {
        text.push_str(&format!(", {} approvers", o.approvals_required));
    }
    if o.confirm {
        text.push_str(", confirmation");
    }
    text
}

/// A policy dry run.
pub(super) fn policy_check(c: &PolicyCheck) {
    println!("active_version {}", c.active_version);
    if let Some(draft) = &c.draft {
        println!("draft {}", outcome_text(draft));
    }
    println!("checked {}{}", c.checked, if c.truncated { " (more were not checked)" } else { "" });
    if c.changes.is_empty() {
        println!("no pending draft, change request or Box would be decided differently");
        return;
    }
    let rows: Vec<Vec<String>> =
        c.changes.iter().map(|ch| vec![wire(ch.kind), ch.id.clone(), ch.box_type.clone(), outcome_text(&ch.before), outcome_text(&ch.after)]).collect();
    print_table(&["KIND", "ID", "BOX_TYPE", "BEFORE", "AFTER"], &rows);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn r_cli_over_limit_is_named_in_words() {
        let strings = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(dangerous_text(&strings(&["shell:exec"]), &strings(&["Bash"])), "the operations shell:exec and the tools Bash");
        assert_eq!(dangerous_text(&[], &strings(&["Bash"])), "the tools Bash");
    }
}
