"""The ops dashboard in a real headless Chromium, driven by Playwright (R-UI-1).

Run by tests/dashboard.rs, which starts atasira, seeds drafts and passes, in the
environment:
  ATASIRA_DASHBOARD_SCENARIO approvals (the default), webhooks, timeline or policy
  ATASIRA_DASHBOARD_URL      the gateway, e.g. http://127.0.0.1:PORT
  ATASIRA_DASHBOARD_ADMIN    an admin's token (user admin: role admin, kind human)
  ATASIRA_DASHBOARD_AGENT    an agent's token (user agent: role member, kind agent)
  ATASIRA_DASHBOARD_OUT      where the screenshots go
  ATASIRA_TEST_CHROMIUM      the Chromium binary (/usr/bin/chromium)
approvals also reads:
  ATASIRA_DASHBOARD_SECOND_ADMIN  another human admin's token
  ATASIRA_DASHBOARD_DRAFTS   JSON: {"over": id, "reject": id, "live": id, "own": id,
                             "types": {name: box_type}}; over is over the limit, own was
                             drafted by the admin, the others by the agent
webhooks also reads:
  ATASIRA_DASHBOARD_WEBHOOKS JSON: {"failing": url, "ok": url}: receivers that answer
                             every delivery 500 and 204; the service gives a delivery up
                             after 2 attempts (ATASIRA_WEBHOOK_ATTEMPTS)
timeline also reads:
  ATASIRA_DASHBOARD_BOX      JSON: {"box_id": id, "box_type": type}: a Box the admin
                             approved (network none, tools Read), then changed (network
                             filtered, tools Read and Grep) with bob's approval, then
                             assigned to the agent
policy also reads:
  ATASIRA_DASHBOARD_DRAFTS   JSON: {"pending": id, "box": id}: a draft pending approval
                             whose network is filtered; a Box off the network whose
                             primary is the agent

Prints one line per step; any failed expectation ends it with a non-zero exit.
"""

import json
import os
import re
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from playwright.sync_api import expect, sync_playwright

BASE = os.environ["ATASIRA_DASHBOARD_URL"].rstrip("/")
ADMIN = os.environ["ATASIRA_DASHBOARD_ADMIN"]
SECOND_ADMIN = os.environ.get("ATASIRA_DASHBOARD_SECOND_ADMIN", "")
AGENT = os.environ["ATASIRA_DASHBOARD_AGENT"]
DRAFTS = json.loads(os.environ.get("ATASIRA_DASHBOARD_DRAFTS", '{"types": {}}'))
TYPES = DRAFTS.get("types", {})
SCENARIO = os.environ.get("ATASIRA_DASHBOARD_SCENARIO", "approvals")
OUT = Path(os.environ["ATASIRA_DASHBOARD_OUT"])
CHROMIUM = os.environ.get("ATASIRA_TEST_CHROMIUM", "/usr/bin/chromium")
# The machine's network is closed: nothing but the page and its server.
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
REASON = "Too broad: a report needs no shell"


def step(text):
    print(f"dashboard: {text}", flush=True)


def rest(method, path, token, body=None):
    """One REST call beside the browser; the parsed answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{BASE}/api/v1{path}", data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as answer:
        return json.loads(answer.read())


def rest_status(method, path, token, body=None):
    """One REST call beside the browser that may be refused: (status, parsed answer)."""
    try:
        return 200, rest(method, path, token, body)
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read() or b"null")


def card(page, draft_id):
    return page.locator(f'#drafts-list article[data-draft-id="{draft_id}"]')


def sign_in(page, token):
    page.fill("#token", token)
    page.click("#sign-in-form button[type=submit]")
    expect(page.locator("#sign-in")).to_be_hidden()


def shot(page, name):
    # Without the passing notice over the view.
    page.evaluate("document.getElementById('flash').hidden = true")
    path = OUT / f"dashboard-{name}.png"
    page.screenshot(path=str(path), full_page=True)
    step(f"screenshot {path}")


def go(page, hash_):
    """Follows a link to `/#...` as from an announcement, without reloading the page."""
    page.evaluate("h => { location.hash = h; }", hash_)


def approving(page):
    """Drafts approved (over the limit after a second confirmation) and rejected, Boxes,
    edits, a Worker, the audit ledger, the links in announcements; an agent cannot approve."""
    approvals = []
    page.on("request", lambda r: approvals.append(r) if r.method == "POST" and r.url.endswith("/approve") else None)

    page.goto(f"{BASE}/")
    expect(page.locator("#sign-in-form")).to_be_visible()
    step("a wrong token is refused in words")
    page.fill("#token", "atasira_pat_wrong")
    page.click("#sign-in-form button[type=submit]")
    expect(page.locator("#sign-in-error")).to_contain_text("not accepted")

    step("sign in as admin: who and which role")
    sign_in(page, ADMIN)
    expect(page.locator("#whoami")).to_contain_text("Signed in as admin")
    expect(page.locator("#whoami")).to_contain_text("admin · human")
    assert page.evaluate("sessionStorage.getItem('atasira.token')") == ADMIN
    assert page.evaluate("localStorage.length") == 0, "the token is not kept in localStorage"
    # Set once: a reload would lose it.
    page.evaluate("window.atasiraNotReloaded = true")

    step("the over-limit draft is first and highlighted, with every capability")
    over = card(page, DRAFTS["over"])
    expect(over).to_have_class("card draft over-limit")
    expect(page.locator("#drafts-list article").first).to_have_attribute("data-draft-id", DRAFTS["over"])
    expect(over.locator(".badge.danger")).to_have_text("OVER LIMIT")
    expect(over.locator("ul.chips li.danger", has_text="shell:exec")).to_be_visible()
    for text in ["https://reports.example", "git remote https://git.example/sales.git", "/srv/reports", "Success criteria", "every Monday", "agent"]:
        expect(over).to_contain_text(text)
    expect(card(page, DRAFTS["reject"])).not_to_have_class("card draft over-limit")
    shot(page, "pending")

    step("approve asks a second time, naming the dangerous operations")
    over.locator('[data-action="approve"]').click()
    confirm = over.locator(".confirm")
    expect(confirm).to_be_visible()
    expect(confirm).to_contain_text("over the limit")
    expect(confirm.locator("strong", has_text="shell:exec")).to_be_visible()
    expect(confirm.locator("strong", has_text="Bash")).to_be_visible()
    assert approvals == [], "nothing is approved before the second confirmation"
    shot(page, "confirm")
    confirm.locator('[data-action="confirm-over-limit"]').click()
    assert_one = lambda: len(approvals) == 1 and approvals[0].post_data_json == {"confirm_over_limit": True}
    step("over the limit needs a second human admin: the card shows the progress")
    expect(page.locator("#flash")).to_contain_text("1 of 2")
    expect(over.locator(".badge.approvals")).to_have_text("1 of 2 approvals")
    assert assert_one(), approvals
    assert rest("GET", f"/boxes/box-drafts/{DRAFTS['over']}", ADMIN)["status"] == "pending_approval"
    shot(page, "approvals")
    second = rest("POST", f"/boxes/box-drafts/{DRAFTS['over']}/approve", SECOND_ADMIN, {"confirm_over_limit": True})
    assert second["status"] == "active" and second["approvals"] == ["admin"], second
    expect(over).to_have_count(0)
    assert rest("GET", f"/boxes/box-drafts/{DRAFTS['over']}", ADMIN)["status"] == "active"

    step("a refusal is shown in words: approving one's own draft")
    own = card(page, DRAFTS["own"])
    own.locator('[data-action="approve"]').click()
    expect(own.locator(".error")).to_have_text("nobody may approve or reject a draft they submitted")
    expect(own).to_be_visible()

    step("reject with a reason")
    rejected = card(page, DRAFTS["reject"])
    rejected.locator('[data-action="reject"]').click()
    rejected.locator("textarea[name=reason]").fill(REASON)
    rejected.locator('[data-action="confirm-reject"]').click()
    expect(rejected).to_have_count(0)
    decided = rest("GET", f"/boxes/box-drafts/{DRAFTS['reject']}", ADMIN)
    assert decided["status"] == "rejected" and decided["decision"]["reason"] == REASON, decided

    step("the approved Box is in the Boxes view")
    page.click('#tabs a[data-view="boxes"]')
    box_row = page.locator(f'#boxes-list button[data-box-type="{TYPES["over"]}"]')
    expect(box_row).to_be_visible()
    # The event stream is up: what follows arrives by it, not by the 5 s fallback.
    expect(page.locator("#live")).to_have_class("live on")

    step("a Box approved elsewhere appears without reloading")
    live_row = page.locator(f'#boxes-list button[data-box-type="{TYPES["live"]}"]')
    expect(live_row).to_have_count(0)
    approved = rest("POST", f"/boxes/box-drafts/{DRAFTS['live']}/approve", ADMIN, {"confirm_over_limit": False})
    expect(live_row).to_be_visible()
    assert page.evaluate("window.atasiraNotReloaded") is True, "the page was reloaded"
    assert approved["box_type"] == TYPES["live"]

    step("a Box's manifest, assignments, provisioning, history and edit forms")
    box_row.click()
    detail = page.locator("#box-detail")
    expect(detail.locator("h3").first).to_have_text(TYPES["over"])
    for text in ["Assignments", "Provisioning", "Timeline", "activated", "git remote https://git.example/sales.git"]:
        expect(detail).to_contain_text(text)
    expect(detail.locator('[data-action="stop"]')).to_be_visible()
    expect(page.locator("#mentor-form")).to_be_visible()
    step("a config edit the server refuses shows why, next to the form")
    page.locator("#config-form textarea").fill('{"network": "full"}')
    page.locator("#config-form button[type=submit]").click()
    refusal = page.locator("#config-form .form-error")
    expect(refusal).to_be_visible()
    expect(refusal).to_contain_text("change-requests")
    step("a mentor edit is saved")
    page.locator("#mentor-form textarea[name=prohibited_actions]").fill("delete reports")
    page.locator("#mentor-form button[type=submit]").click()
    expect(page.locator("#flash")).to_contain_text("version 1.1.0")
    expect(detail).to_contain_text("manifest edited")
    shot(page, "boxes")

    step("a change request waits in the pending list with what it adds and removes")
    over_box = rest("GET", f"/boxes/box-drafts/{DRAFTS['over']}", ADMIN)["box_id"]
    change = rest("POST", f"/boxes/{over_box}/change-requests", ADMIN, {"trigger_type": "schedule", "trigger_schedule": "0 9 * * 1"})
    page.click('#tabs a[data-view="drafts"]')
    changed = card(page, change["draft_id"])
    expect(changed.locator(".badge.change")).to_have_text("CHANGE \u2192 v2.0.0")
    expect(changed.locator(".diff-lines li.added", has_text="trigger_type: schedule")).to_be_visible()
    expect(changed.locator(".diff-lines li.removed", has_text="trigger_type: manual")).to_be_visible()
    shot(page, "change-request")
    rest("POST", f"/boxes/box-drafts/{change['draft_id']}/withdraw", ADMIN, {})
    expect(changed).to_have_count(0)
    page.click('#tabs a[data-view="boxes"]')

    step("launch a Worker and read its provenance")
    page.click('#tabs a[data-view="workers"]')
    page.select_option("#workers-box", label=f"{TYPES['over']} (idle)")
    expect(page.locator("#launch-form")).to_be_visible()
    page.fill("#launch-role", "weekly report")
    page.fill("#launch-input", "Write this week's sales report.")
    page.click("#launch-form button[type=submit]")
    worker_row = page.locator("#workers-list button.row", has_text="weekly report")
    expect(worker_row).to_be_visible()
    worker_row.click()
    worker = page.locator("#worker-detail")
    expect(worker).to_contain_text("Write this week's sales report.")
    expect(worker).to_contain_text("The approval verifies with the public key")
    expect(worker.locator("table")).to_contain_text("approval")
    shot(page, "workers")

    step("the audit ledger verifies, and filters")
    page.click('#tabs a[data-view="audit"]')
    expect(page.locator("#audit-verify")).to_contain_text("verified")
    expect(page.locator("#audit-verify")).to_have_class("badge ok")
    expect(page.locator("#audit-rows tr.violation")).not_to_have_count(0)
    shot(page, "audit")
    page.fill("#audit-action", "box_draft.reject")
    page.click("#audit-filter button[type=submit]")
    expect(page.locator("#audit-rows tr")).to_have_count(1)
    expect(page.locator("#audit-rows")).to_contain_text(DRAFTS["reject"])
    page.locator("#audit-filter button[type=reset]").click()
    expect(page.locator("#audit-rows tr")).not_to_have_count(1)
    assert page.evaluate("window.atasiraNotReloaded") is True, "the page was reloaded"

    step("the links in announcements open their views: #pending, #boxes/<id>, #workers/<id>, #tool-requests")
    go(page, "#pending")
    expect(page.locator("#view-drafts")).to_be_visible()
    expect(page.locator('#tabs a[data-view="drafts"]')).to_have_class("current")
    go(page, f"#boxes/{approved['box_id']}")
    expect(page.locator("#view-boxes")).to_be_visible()
    expect(page.locator("#box-detail h3").first).to_have_text(TYPES["live"])
    page.click('#tabs a[data-view="workers"]')
    page.select_option("#workers-box", label=f"{TYPES['live']} (idle)")
    expect(page.locator("#worker-detail")).not_to_contain_text("Provenance")
    launched = rest("GET", f"/boxes/{over_box}/workers", ADMIN)["workers"][0]["worker_id"]
    go(page, f"#workers/{launched}")
    expect(page.locator("#workers-box")).to_have_value(over_box)
    expect(page.locator("#worker-detail")).to_contain_text(launched)
    expect(page.locator("#worker-detail")).to_contain_text("Provenance")
    go(page, "#tool-requests")
    expect(page.locator("#view-workers")).to_be_visible()
    assert page.evaluate("window.atasiraNotReloaded") is True, "the page was reloaded"

    step("sign in as an agent: no approve or reject control, no audit, no webhooks")
    page.click("#sign-out")
    expect(page.locator("#sign-in-form")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('atasira.token')") is None
    sign_in(page, AGENT)
    expect(page.locator("#whoami")).to_contain_text("Signed in as agent")
    expect(page.locator("#whoami")).to_contain_text("member · agent")
    expect(page.locator("#drafts-title")).to_have_text("Your drafts")
    expect(page.locator("#drafts-list article").first).to_be_visible()
    expect(page.locator('[data-action="approve"]')).to_have_count(0)
    expect(page.locator('[data-action="reject"]')).to_have_count(0)
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    expect(page.locator('#tabs a[data-view="audit"]')).to_be_hidden()
    expect(page.locator('#tabs a[data-view="webhooks"]')).to_be_hidden()
    shot(page, "agent")
    page.click('#tabs a[data-view="boxes"]')
    page.locator(f'#boxes-list button[data-box-type="{TYPES["over"]}"]').click()
    expect(page.locator("#box-detail")).to_contain_text("Timeline")
    for action in ["stop", "resume", "archive"]:
        expect(page.locator(f'[data-action="{action}"]')).to_have_count(0)
    expect(page.locator("#mentor-form")).to_have_count(0)
    step("what the API refuses an agent is said in words")
    page.click('#tabs a[data-view="workers"]')
    page.select_option("#workers-box", label=f"{TYPES['over']} (idle)")
    expect(page.locator("#workers-error")).to_be_visible()
    expect(page.locator("#workers-error")).to_contain_text("assign")


def webhook_row(page, url):
    return page.locator("#webhooks-rows tr", has=page.locator("button.link", has_text=url))


def webhooks(page):
    """Register webhooks (a refusal named next to its field, the secret shown once), see a
    delivery dead-lettered and another delivered, a webhook's deliveries and their filter,
    remove after a confirmation; an agent sees no Webhooks view."""
    hooks = json.loads(os.environ["ATASIRA_DASHBOARD_WEBHOOKS"])
    step("sign in from a link to the Webhooks view: nothing registered yet")
    page.goto(f"{BASE}/#webhooks")
    sign_in(page, ADMIN)
    page.evaluate("window.atasiraNotReloaded = true")
    expect(page.locator("#view-webhooks")).to_be_visible()
    expect(page.locator('#tabs a[data-view="webhooks"]')).to_have_class("current")
    expect(page.locator("#webhooks-empty")).to_be_visible()
    expect(page.locator("#webhooks-table")).to_be_hidden()

    step("a URL the API refuses is named next to its field")
    form = page.locator("#webhook-form")
    form.locator("#webhook-url").fill("ftp://files.example/hooks")
    form.locator("button[type=submit]").click()
    expect(form.locator(".form-error")).to_be_visible()
    url_error = form.locator('.field[data-key="url"] .field-error')
    expect(url_error).to_be_visible()
    expect(url_error).to_contain_text("url: ")
    expect(page.locator("#webhook-secret")).to_be_hidden()
    assert rest("GET", "/webhooks", ADMIN)["webhooks"] == []

    step("register a webhook for pending drafts: its secret is shown once")
    form.locator("#webhook-url").fill(hooks["failing"])
    form.locator('input[name=kinds][value="draft.pending"]').check()
    form.locator("button[type=submit]").click()
    secret = page.locator("#webhook-secret")
    expect(secret).to_be_visible()
    expect(secret).to_contain_text("shown this once")
    expect(secret).to_contain_text(hooks["failing"])
    kept = page.locator("#webhook-secret-value").input_value()
    assert kept.startswith("whsec_"), kept
    expect(url_error).to_be_hidden()
    expect(form.locator(".form-error")).to_be_hidden()
    expect(form.locator("#webhook-url")).to_have_value("")
    failing = webhook_row(page, hooks["failing"])
    expect(failing.locator("td").nth(1)).to_have_text("json")
    expect(failing.locator("td").nth(2)).to_have_text("draft.pending")
    listed = rest("GET", "/webhooks", ADMIN)["webhooks"]
    assert [w["url"] for w in listed] == [hooks["failing"]] and "secret" not in listed[0], listed
    page.locator('[data-action="secret-kept"]').click()
    expect(secret).to_be_hidden()
    assert kept not in page.content(), "the secret stays on the page"

    step("register a second one, in Slack's format, for every kind")
    form.locator("#webhook-url").fill(hooks["ok"])
    form.locator("#webhook-format").select_option("slack")
    form.locator("button[type=submit]").click()
    expect(secret).to_be_visible()
    page.locator('[data-action="secret-kept"]').click()
    ok = webhook_row(page, hooks["ok"])
    expect(ok.locator("td").nth(1)).to_have_text("slack")
    expect(ok.locator("td").nth(2)).to_have_text("every kind")
    ids = {w["url"]: w["webhook_id"] for w in rest("GET", "/webhooks", ADMIN)["webhooks"]}

    step("a draft is announced: the 500 receiver's delivery is dead, the other delivered")
    draft = rest("POST", "/boxes/box-drafts", AGENT, {"box_type": "dash-hooks", "purpose": "Announce me to the approvers"})["draft_id"]
    expect(failing.locator("td.dead")).to_have_text("1")
    expect(failing).to_have_class(re.compile(r"\bfailing\b"))
    expect(failing.locator("td.dead .badge.danger")).to_be_visible()
    expect(failing.locator("td.delivered")).to_have_text("0")
    expect(failing.locator("td.pending")).to_have_text("0")
    expect(ok.locator("td.delivered")).to_have_text("1")
    expect(ok.locator("td.dead")).to_have_text("0")
    expect(ok).not_to_have_class(re.compile(r"\bfailing\b"))
    expect(page.locator("#webhooks-count")).to_have_text("2 registered \u00b7 1 failed delivery")

    step("the failed deliveries of a webhook: the receiver's 500, after 2 attempts")
    failing.locator("td.dead button").click()
    expect(page.locator("#deliveries-url")).to_have_text(hooks["failing"])
    expect(page.locator("#deliveries-state")).to_have_value("dead")
    rows = page.locator("#deliveries-rows tr")
    expect(rows).to_have_count(1)
    dead = rows.first
    expect(dead).to_have_class("failed")
    expect(dead.locator("td.kind")).to_have_text("draft.pending")
    expect(dead.locator("td.state")).to_have_text("dead")
    expect(dead.locator("td.attempts")).to_have_text("2")
    expect(dead.locator("td.status")).to_have_text("500")
    expect(dead.locator("td.last-error")).to_contain_text("500")
    event = rest("GET", f"/webhooks/{ids[hooks['failing']]}/deliveries?state=dead", ADMIN)["deliveries"][0]["event_id"]
    expect(dead).to_contain_text(event)
    shot(page, "webhooks")
    page.select_option("#deliveries-state", "delivered")
    expect(rows).to_have_count(0)
    expect(page.locator("#deliveries-count")).to_have_text("No delivery was accepted yet.")
    page.select_option("#deliveries-state", "")
    expect(rows).to_have_count(1)

    step("the other webhook's delivery was accepted at once")
    ok.locator("button.link").click()
    expect(page.locator("#deliveries-url")).to_have_text(hooks["ok"])
    expect(rows).to_have_count(1)
    expect(rows.first.locator("td.state")).to_have_text("delivered")
    expect(rows.first.locator("td.status")).to_have_text("204")
    expect(rows.first.locator("td.attempts")).to_have_text("1")
    expect(rows.first.locator("td.last-error")).to_have_text("")

    step("the announcement's link opens the pending draft; a webhook's link its deliveries")
    go(page, "#pending")
    expect(page.locator("#view-drafts")).to_be_visible()
    expect(page.locator(f'#drafts-list article[data-draft-id="{draft}"]')).to_be_visible()
    go(page, f"#webhooks/{ids[hooks['failing']]}")
    expect(page.locator("#view-webhooks")).to_be_visible()
    expect(page.locator("#deliveries-url")).to_have_text(hooks["failing"])

    step("remove asks first")
    ok.locator('[data-action="remove"]').click()
    confirm = ok.locator('[data-action="confirm-remove"]')
    expect(confirm).to_be_visible()
    assert len(rest("GET", "/webhooks", ADMIN)["webhooks"]) == 2, "removed before the confirmation"
    confirm.click()
    expect(ok).to_have_count(0)
    expect(page.locator("#webhooks-count")).to_have_text("1 registered \u00b7 1 failed delivery")
    assert [w["url"] for w in rest("GET", "/webhooks", ADMIN)["webhooks"]] == [hooks["failing"]]
    assert page.evaluate("window.atasiraNotReloaded") is True, "the page was reloaded"

    step("an agent sees no Webhooks view, even by its link")
    page.click("#sign-out")
    expect(page.locator("#sign-in-form")).to_be_visible()
    sign_in(page, AGENT)
    expect(page.locator('#tabs a[data-view="webhooks"]')).to_be_hidden()
    go(page, "#webhooks")
    expect(page.locator("#view-drafts")).to_be_visible()
    expect(page.locator("#view-webhooks")).to_be_hidden()


def past_value(page, key):
    """What the past state chosen in a Box's timeline says of `key`, then and now."""
    dd = page.locator(f'#box-past dd[data-key="{key}"]')
    return dd.locator(".then"), dd.locator(".now")


def timeline(page):
    """A Box's timeline, oldest first: the entry before a change shows the Box as it was
    (the old network, tools, version and approver, nobody assigned), the one after it the
    new values; the position shown is one the API answers the same for; back to now."""
    box = json.loads(os.environ["ATASIRA_DASHBOARD_BOX"])
    step("sign in from a link to the Box: its timeline lists its history, oldest first")
    page.goto(f"{BASE}/#boxes/{box['box_id']}")
    sign_in(page, ADMIN)
    page.evaluate("window.atasiraNotReloaded = true")
    detail = page.locator("#box-detail")
    expect(detail.locator("h3").first).to_have_text(box["box_type"])
    expect(page.locator("#box-info")).to_contain_text("filtered")
    entries = page.locator("#timeline-entries button.entry")
    expect(entries).to_have_count(3)
    for i, kind in enumerate(["activated", "manifest_changed", "user_assigned"]):
        expect(entries.nth(i)).to_have_attribute("data-kind", kind)
    expect(entries.nth(1)).to_contain_text("by bob")
    expect(entries.nth(1)).to_contain_text("network: filtered")
    past = page.locator("#box-past")
    expect(past).to_be_hidden()

    step("the entry before the change: the Box as it was, said to be the past")
    entries.nth(0).click()
    expect(past).to_be_visible()
    expect(entries.nth(0)).to_have_class(re.compile(r"\bcurrent\b"))
    title = past.locator("h3")
    expect(title).to_have_text(re.compile(r"^As of position \d+, \d{4}-\d\d-\d\d \d\d:\d\d:\d\d$"))
    expect(past.locator(".badge.was")).to_have_text("PAST")
    then, now = past_value(page, "network")
    expect(then).to_have_text("none")
    expect(now).to_have_text("now: filtered")
    then, now = past_value(page, "tools")
    expect(then).to_have_text("Read")
    expect(now).to_have_text("now: Read, Grep")
    then, _ = past_value(page, "version")
    expect(then).to_have_text("1.0.0")
    then, now = past_value(page, "approved_by")
    expect(then).to_have_text("admin")
    expect(now).to_have_text("now: bob")
    then, now = past_value(page, "assignments")
    expect(then).to_have_text("none")
    expect(now).to_have_text("now: agent (member)")
    then, now = past_value(page, "state")
    expect(then).to_have_text("idle")
    expect(now).to_have_count(0)
    # The position shown is one the API answers the same Box for.
    position = re.match(r"As of position (\d+)", title.text_content()).group(1)
    was = rest("GET", f"/boxes/{box['box_id']}?at={position}", ADMIN)
    assert (was["manifest"]["network"], was["approved_by"], was["assignments"]) == ("none", "admin", []), was
    # The Box now is unchanged above it.
    expect(page.locator("#box-info")).to_contain_text("bob")
    shot(page, "timeline")

    step("the entry of the change: the new network, tools, version and approver")
    entries.nth(1).click()
    expect(entries.nth(1)).to_have_class(re.compile(r"\bcurrent\b"))
    expect(entries.nth(0)).not_to_have_class(re.compile(r"\bcurrent\b"))
    then, now = past_value(page, "network")
    expect(then).to_have_text("filtered")
    expect(now).to_have_count(0)
    then, _ = past_value(page, "tools")
    expect(then).to_have_text("ReadGrep")
    then, _ = past_value(page, "version")
    expect(then).to_have_text("2.0.0")
    then, _ = past_value(page, "approved_by")
    expect(then).to_have_text("bob")
    then, now = past_value(page, "assignments")
    expect(then).to_have_text("none")
    expect(now).to_have_text("now: agent (member)")
    position = re.match(r"As of position (\d+)", title.text_content()).group(1)
    was = rest("GET", f"/boxes/{box['box_id']}?at={position}", ADMIN)
    assert (was["manifest"]["network"], was["approved_by"], was["assignments"]) == ("filtered", "bob", []), was

    step("the newest entry: the agent assigned, as now")
    entries.nth(2).click()
    then, now = past_value(page, "assignments")
    expect(then).to_have_text("agent (member)")
    expect(now).to_have_count(0)

    step("back to now")
    past.locator('[data-action="timeline-now"]').click()
    expect(past).to_be_hidden()
    expect(page.locator("#timeline-entries button.entry.current")).to_have_count(0)
    assert page.evaluate("window.atasiraNotReloaded") is True, "the page was reloaded"


FULL_NETWORK = (
    '@id("no-full-network")\n'
    '@reason("Boxes may not reach the whole network")\n'
    'forbid(principal, action, resource) when { resource.network == "full" };\n'
)
NO_NETWORK = (
    FULL_NETWORK + '\n@id("no-network")\n@reason("Boxes stay off the network")\n'
    'forbid(principal, action, resource) when { resource.network != "none" };\n'
)


def policy(page):
    """Publish a policy (a text that does not parse refused in words), see its version, rule
    and text; a change it refuses is listed under Refusals naming the rule; a Check of a
    stricter proposal lists the pending draft it would deny; an agent sees no Policy view."""
    seeded = json.loads(os.environ["ATASIRA_DASHBOARD_DRAFTS"])
    pending = seeded["pending"]
    step("sign in from a link to the Policy view: no policy yet")
    page.goto(f"{BASE}/#policy")
    sign_in(page, ADMIN)
    page.evaluate("window.atasiraNotReloaded = true")
    expect(page.locator("#view-policy")).to_be_visible()
    expect(page.locator('#tabs a[data-view="policy"]')).to_have_class("current")
    expect(page.locator("#policy-version")).to_have_text("none published")
    expect(page.locator("#policy-empty")).to_be_visible()
    expect(page.locator("#policy-refusals-count")).to_have_text("The policy has refused nothing yet.")

    step("a text that does not parse is refused in words; nothing is published")
    form = page.locator("#policy-form")
    form.locator("#policy-proposal").fill("forbid(principal, action")
    form.locator('[data-action="publish"]').click()
    expect(form.locator(".form-error")).to_be_visible()
    expect(form.locator(".form-error")).to_contain_text("parse")
    assert rest("GET", "/policies", ADMIN)["version"] == 0

    step("publish version 1: its version, publisher, rule and text")
    form.locator("#policy-proposal").fill(FULL_NETWORK)
    form.locator('[data-action="publish"]').click()
    expect(page.locator("#policy-version")).to_have_text("version 1")
    expect(form.locator(".form-error")).to_be_hidden()
    expect(page.locator("#policy-published")).to_contain_text("published by admin")
    rule = page.locator('#policy-rules-rows tr[data-rule="no-full-network"]')
    expect(rule).to_be_visible()
    expect(rule.locator("td").nth(1)).to_have_text("forbid")
    expect(rule.locator("td.reason")).to_have_text("Boxes may not reach the whole network")
    expect(page.locator("#policy-text")).to_contain_text('resource.network == "full"')
    expect(form.locator("#policy-proposal")).to_have_value(FULL_NETWORK)
    assert rest("GET", "/policies", ADMIN)["version"] == 1

    step("the agent's change request for the whole network is refused, naming the rule")
    # (A draft cannot ask for the whole network: allow_network gives a filtered one.)
    status, refused = rest_status("POST", f"/boxes/{seeded['box']}/change-requests", AGENT, {"network": "full"})
    assert (status, refused["error"]) == (403, "policy_denied"), (status, refused)
    assert "rule no-full-network" in refused["message"], refused
    row = page.locator('#policy-refusals-rows tr[data-rule="no-full-network"]')
    expect(row).to_have_count(1)
    expect(row.locator("td.version")).to_have_text("1")
    expect(row.locator("td.detail")).to_have_text("Boxes may not reach the whole network")
    expect(row).to_contain_text("agent")
    expect(page.locator("#policy-refusals-count")).to_have_text("1 refusal, newest first.")

    step("a Check of a stricter proposal lists the pending draft it would deny")
    form.locator("#policy-proposal").fill(NO_NETWORK)
    form.locator('[data-action="check"]').click()
    changes = page.locator("#policy-changes")
    expect(changes).to_be_visible()
    affected = changes.locator(f'li[data-id="{pending}"]')
    expect(affected).to_be_visible()
    expect(affected).to_have_attribute("data-kind", "draft")
    expect(affected).to_have_class("denied")
    expect(affected.locator(".before")).to_have_text("allowed")
    expect(affected.locator(".after")).to_have_text("denied · by no-network")
    expect(affected.locator(".reason")).to_have_text("Boxes stay off the network")
    expect(page.locator("#policy-changes-count")).to_contain_text("would be judged differently than under version 1")
    expect(changes).not_to_contain_text("null")
    shot(page, "policy")
    assert rest("GET", "/policies", ADMIN)["version"] == 1, "a check publishes nothing"
    # A refresh keeps the proposal being typed.
    page.evaluate("location.hash = '#drafts'")
    expect(page.locator("#view-drafts")).to_be_visible()
    page.click('#tabs a[data-view="policy"]')
    expect(form.locator("#policy-proposal")).to_have_value(NO_NETWORK)
    assert page.evaluate("window.atasiraNotReloaded") is True, "the page was reloaded"

    step("an agent sees no Policy view, even by its link")
    page.click("#sign-out")
    expect(page.locator("#sign-in-form")).to_be_visible()
    sign_in(page, AGENT)
    expect(page.locator('#tabs a[data-view="policy"]')).to_be_hidden()
    go(page, "#policy")
    expect(page.locator("#view-drafts")).to_be_visible()
    expect(page.locator("#view-policy")).to_be_hidden()


SCENARIOS = {"approvals": approving, "webhooks": webhooks, "timeline": timeline, "policy": policy}


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    expect.set_options(timeout=20_000)
    failures = []
    with tempfile.TemporaryDirectory(prefix="atasira-chromium-") as profile, sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            profile, executable_path=CHROMIUM, headless=True, args=ARGS, viewport={"width": 1360, "height": 900}
        )
        page = browser.pages[0] if browser.pages else browser.new_page()
        # Uncaught script errors and anything the Content-Security-Policy refused.
        page.on("pageerror", lambda e: failures.append(f"script error: {e}"))
        page.on("console", lambda m: failures.append(f"console: {m.text}") if "Content Security Policy" in m.text else None)
        SCENARIOS[SCENARIO](page)
        browser.close()
    if failures:
        print("\n".join(failures), file=sys.stderr)
        sys.exit(1)
    step("all scenarios passed")


if __name__ == "__main__":
    main()
