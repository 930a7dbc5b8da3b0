// The atasira ops dashboard: a plain ES module, no dependencies, no build step.
//
// Everything shown comes from the REST API under /api/v1 with the token the user pasted
// (kept in sessionStorage, for this tab only). Text from the server (drafts are written by
// agents) is only ever set as textContent: nothing here parses server text as HTML.
// Live updates come from GET /api/v1/events/stream (server-sent events, read with fetch
// because EventSource cannot send the Authorization header); while it is down, the open
// view is re-read every 5 s.
//
// The hash names a view, or one thing in it: `#boxes/<id>`, `#workers/<id>`,
// `#webhooks/<id>`; `#pending` and `#tool-requests` are what the links in announcements to
// approvers (webhooks) open; `#policy` is the operators' policy.

const TOKEN_KEY = 'atasira.token';
const NOTICE_KEY = 'atasira.notice';
const POLL_MS = 5000;
const VIEWS = ['drafts', 'boxes', 'workers', 'webhooks', 'policy', 'audit'];
// Views only admins see (the API refuses the others).
const ADMIN_VIEWS = ['webhooks', 'policy', 'audit'];
// Other names of views in a hash.
const VIEW_ALIASES = { pending: 'drafts', 'tool-requests': 'workers' };
// Which views a `changed` event's topic concerns. Webhooks change with audit events
// (registered, removed, a delivery dead-lettered); deliveries that go well are no event,
// so the open Webhooks view is also re-read every 5 s. The Policy view lists refusals,
// which are ledger rows, as is each version published.
const TOPIC_VIEWS = { drafts: ['drafts'], boxes: ['boxes', 'workers'], workers: ['workers'], audit: ['audit', 'webhooks', 'policy'] };

const state = {
  token: null,
  me: null,
  view: 'drafts',
  boxes: [],
  box: null, // the Box shown in the Boxes view
  boxFormsFor: null, // the Box whose edit forms are on the page
  boxNow: null, // the Box as it is now, beside which a past state is shown
  boxChosen: null, // the event id of the timeline entry chosen
  boxPast: null, // the entry chosen, and the Box as it was just after it, once read
  workersBox: null,
  worker: null,
  webhooks: [],
  webhook: null, // the webhook whose deliveries are shown
  webhookState: '', // which of its deliveries: '' (all), pending, delivered or dead
  webhookRemoving: null, // the webhook whose removal waits for its confirmation
  audit: { action: '', target: '' },
  policyEdited: false, // the proposal's text was typed in (a refresh leaves it alone)
};

const $ = (id) => document.getElementById(id);

// --- building the page -------------------------------------------------------------------

/** An element with properties and children; strings become text nodes, never HTML. */
function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === 'class') node.className = value;
    else if (key === 'text') node.textContent = value;
    else if (key === 'dataset') Object.assign(node.dataset, value);
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined && child !== false) node.append(child);
  }
  return node;
}

function age(iso) {
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return 'just now';
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

function when(iso) {
  return el('time', { datetime: iso, title: localTime(iso), class: 'age', text: age(iso) });
}

// Ages stay true while a view is open.
setInterval(() => { for (const t of document.querySelectorAll('time.age')) t.textContent = age(t.dateTime); }, 30000);

/** `2026-12-02 13:45:58` in the browser's time zone. */
function localTime(iso) {
  const t = new Date(iso);
  const p = (n) => String(n).padStart(2, '0');
  return `${t.getFullYear()}-${p(t.getMonth() + 1)}-${p(t.getDate())} ${p(t.getHours())}:${p(t.getMinutes())}:${p(t.getSeconds())}`;
}

function chips(items, danger = []) {
  if (!items || items.length === 0) return el('span', { class: 'muted', text: 'none' });
  return el('ul', { class: 'chips' }, items.map((item) => el('li', { class: danger.includes(item) ? 'danger' : null, text: item })));
}

function accessText(a) {
  switch (a.type) {
    case 'git_remote': return `git remote ${a.url}`;
    case 'ssh_target': return `ssh ${a.user}@${a.host}:${a.port}`;
    case 'netrc_entry': return `netrc ${a.login}@${a.machine} (vault ${a.vault}, item ${a.item})`;
    default: return JSON.stringify(a);
  }
}

/** Every capability a draft or manifest asks for; the over-limit ones marked. */
function capabilities(x, overOps = [], overTools = []) {
  const rows = [
    ['OS operations', chips(x.os_operations, overOps)],
    ['Tools', chips(x.tools, overTools)],
    ['URL allowlist', chips(x.url_allowlist)],
    ['Network', el('span', { class: x.network === 'none' ? 'muted' : null, text: x.network })],
    ['File access', chips(x.file_access)],
    ['Allowed apps', chips(x.allowed_apps)],
    ['Required access', chips((x.required_access || []).map(accessText))],
    ['Prohibited', chips(x.prohibited || x.prohibited_actions)],
  ];
  return el('dl', { class: 'caps' }, rows.flatMap(([name, value]) => [el('dt', { text: name }), el('dd', {}, value)]));
}

/** A purpose and its success criteria, which the drafts service appends under a heading. */
function splitPurpose(purpose) {
  const heading = '\n\n## Success criteria\n';
  const at = purpose.indexOf(heading);
  if (at < 0) return { purpose, criteria: [] };
  const criteria = purpose.slice(at + heading.length).split('\n').map((l) => l.replace(/^- /, '')).filter((l) => l.trim() !== '');
  return { purpose: purpose.slice(0, at), criteria };
}

function purposeBlock(text) {
  const { purpose, criteria } = splitPurpose(text);
  return el('div', { class: 'purpose' },
    el('p', { class: 'text', text: purpose }),
    criteria.length ? el('div', {}, el('h4', { text: 'Success criteria' }), el('ul', {}, criteria.map((c) => el('li', { text: c })))) : null);
}

/** Names the operations and tools that make a draft over the limit, in words. */
function dangerous(d) {
  const part = (label, items) => (items.length ? [label, ...items.flatMap((x, i) => [i ? ', ' : ' ', el('strong', { text: x })])] : []);
  const ops = part('the operations', d.over_limit_ops);
  const tools = part('the tools', d.over_limit_tools);
  if (ops.length && tools.length) return [...ops, ' and ', ...tools];
  return ops.length ? ops : tools.length ? tools : ['capabilities over the limit'];
}

function facts(pairs) {
  return el('dl', { class: 'facts' }, pairs.filter(([, v]) => v !== undefined && v !== null && v !== '').flatMap(([k, v]) => [el('dt', { text: k }), el('dd', {}, v)]));
}

function flash(text) {
  const f = $('flash');
  f.onclick = () => { f.hidden = true; };
  f.textContent = text;
  f.hidden = false;
  clearTimeout(flash.timer);
  flash.timer = setTimeout(() => { f.hidden = true; }, 8000);
}

/** Shows an error in words: the API's message and, when it names keys, each of them. */
function showError(node, error) {
  node.replaceChildren(el('span', { text: error.message }));
  const details = error.details;
  if (Array.isArray(details) && details.length) {
    node.append(el('ul', {}, details.map((d) => el('li', { text: d && d.key ? `${d.key}: ${d.message}` : JSON.stringify(d) }))));
  } else if (details && typeof details === 'object') {
    node.append(el('ul', {}, Object.entries(details).map(([k, v]) => el('li', { text: `${k}: ${typeof v === 'string' ? v : JSON.stringify(v)}` }))));
  }
  node.hidden = false;
}

function clearError(node) {
  node.hidden = true;
  node.replaceChildren();
}

// --- the API -----------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, body) {
    super((body && body.message) || `The server answered ${status}.`);
    this.status = status;
    this.details = body && body.details;
  }
}

function randomHex(bytes) {
  const b = new Uint8Array(bytes);
  crypto.getRandomValues(b);
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('');
}

const seg = encodeURIComponent;

async function api(method, path, body, contentType = 'application/json') {
  const headers = { Authorization: `Bearer ${state.token}` };
  const init = { method, headers, cache: 'no-store' };
  if (method !== 'GET') headers['Idempotency-Key'] = `web-${randomHex(16)}`;
  if (body !== undefined) {
    headers['Content-Type'] = contentType;
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(`/api/v1${path}`, init);
  } catch {
    throw new ApiError(0, { message: 'The server cannot be reached; is atasira running?' });
  }
  const text = await response.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = null; }
  if (!response.ok) {
    if (response.status === 401 && state.me) signOut('The server no longer accepts this token (unknown, revoked or expired). Sign in again.');
    throw new ApiError(response.status, data);
  }
  return data;
}

/** The items of a listing, following `next_cursor` for at most `max` pages. */
async function pages(path, key, max = 5) {
  const items = [];
  let cursor = null;
  for (let i = 0; i < max; i++) {
    const sep = path.includes('?') ? '&' : '?';
    const page = await api('GET', cursor ? `${path}${sep}cursor=${seg(cursor)}` : path);
    items.push(...page[key]);
    cursor = page.next_cursor;
    if (!cursor) return { items, more: false };
  }
  return { items, more: true };
}

const isAdmin = () => state.me && state.me.role === 'admin';
const isHumanAdmin = () => isAdmin() && state.me.kind === 'human';

// --- views and refreshing ----------------------------------------------------------------

const loaders = { drafts: loadDrafts, boxes: loadBoxes, workers: loadWorkers, webhooks: loadWebhooks, policy: loadPolicy, audit: loadAudit };
const stale = new Set(VIEWS);
const running = new Map();
const again = new Set();
let flushTimer = null;

/** Marks views as out of date; the open one is read again at once (coalesced). */
function invalidate(views) {
  for (const v of views) stale.add(v);
  if (!flushTimer) flushTimer = setTimeout(() => { flushTimer = null; if (stale.has(state.view)) load(state.view); }, 150);
}

function load(view) {
  if (running.has(view)) {
    again.add(view);
    return running.get(view);
  }
  stale.delete(view);
  const done = loaders[view]()
    .catch((e) => showError($(`${view}-error`), e))
    .finally(() => {
      running.delete(view);
      if (again.delete(view)) load(view);
    });
  running.set(view, done);
  return done;
}

function show(view) {
  if (!VIEWS.includes(view) || (ADMIN_VIEWS.includes(view) && !isAdmin())) view = 'drafts';
  state.view = view;
  for (const v of VIEWS) $(`view-${v}`).hidden = v !== view;
  for (const a of document.querySelectorAll('#tabs a')) a.classList.toggle('current', a.dataset.view === view);
  if (stale.has(view)) load(view);
}

/** Opens what a hash names: a view (`drafts`, `pending`, `tool-requests`, ...) or one
 * thing in it (`boxes/<id>`, `workers/<id>`, `webhooks/<id>`). */
async function navigate(hash) {
  const slash = hash.indexOf('/');
  const head = slash < 0 ? hash : hash.slice(0, slash);
  let id = null;
  try {
    id = slash < 0 ? null : decodeURIComponent(hash.slice(slash + 1)) || null;
  } catch {
    id = null;
  }
  const view = VIEW_ALIASES[head] || head;
  if (id && view === 'boxes') {
    state.box = id;
    stale.add('boxes');
  } else if (id && view === 'webhooks') {
    state.webhook = id;
    stale.add('webhooks');
  } else if (id && view === 'workers') {
    // The Workers view lists one Box's Workers: the Worker's.
    try {
      const w = await api('GET', `/workers/${seg(id)}`);
      state.workersBox = w.box_id;
      state.worker = w.worker_id;
      if (state.boxes.length) fillWorkersBoxes();
      stale.add('workers');
    } catch (e) {
      show('workers');
      showError($('workers-error'), e);
      return;
    }
  }
  show(view);
  if (head === 'tool-requests') {
    await running.get('workers');
    const requests = $('tool-requests');
    if (!requests.hidden) requests.scrollIntoView();
  }
}

// --- pending drafts ----------------------------------------------------------------------

async function loadDrafts() {
  const list = $('drafts-list');
  const admin = isAdmin();
  $('drafts-title').textContent = admin ? 'Pending drafts' : 'Your drafts';
  const { items, more } = admin
    ? await pages('/boxes/box-drafts/pending?limit=200', 'drafts')
    : await pages('/boxes/box-drafts?mine=true&limit=200', 'drafts');
  clearError($('drafts-error'));
  // Over the limit first; otherwise oldest first, as the API lists them.
  const drafts = admin ? [...items.filter((d) => d.over_limit), ...items.filter((d) => !d.over_limit)] : items.reverse();
  $('drafts-count').textContent = `${drafts.length}${more ? '+' : ''} ${admin ? 'pending' : 'drafts'}`;
  const note = $('drafts-note');
  note.hidden = !(admin && !isHumanAdmin());
  note.textContent = 'Approving and rejecting need a human admin; this token is an agent\u2019s.';
  if (drafts.length === 0) {
    list.replaceChildren(el('p', { class: 'muted empty', text: admin ? 'Nothing is waiting for approval.' : 'You have not drafted a Box yet.' }));
    return;
  }
  // Cards are kept while their draft is unchanged, so an open confirmation or a reason
  // being typed survives a refresh.
  const key = (d) => `${d.draft_id}:${d.status}:${(d.approvals || []).length}`;
  const wanted = new Set(drafts.map(key));
  for (const card of [...list.children]) if (!wanted.has(card.dataset.key)) card.remove();
  let at = list.firstElementChild;
  for (const d of drafts) {
    const existing = [...list.children].find((c) => c.dataset.key === key(d));
    if (existing && existing === at) {
      at = at.nextElementSibling;
      continue;
    }
    list.insertBefore(existing || draftCard(d, key(d)), at);
  }
}

function draftCard(d, key) {
  const card = el('article', { class: `card draft${d.over_limit ? ' over-limit' : ''}`, dataset: { key, draftId: d.draft_id } },
    el('header', {},
      el('h3', {}, el('span', { text: d.box_type }), d.name && d.name !== d.box_type ? el('span', { class: 'muted', text: ` ${d.name}` }) : null),
      d.over_limit ? el('span', { class: 'badge danger', text: 'OVER LIMIT' }) : null,
      d.kind === 'change' ? el('span', { class: 'badge change', title: `A change of Box ${d.box_id}`, text: `CHANGE \u2192 v${d.version}` }) : null,
      d.approvals_required > 1 ? el('span', { class: 'badge approvals', title: d.approvals.length ? `Approved by ${d.approvals.join(', ')}` : 'No approval yet',
        text: `${d.approvals.length} of ${d.approvals_required} approvals` }) : null,
      d.status !== 'pending_approval' ? el('span', { class: `badge state-${d.status}`, text: d.status.replace('_', ' ') }) : null),
    el('p', { class: 'meta' }, 'requested by ', el('strong', { text: d.requested_by }), ' \u00b7 ', when(d.created_at), ' \u00b7 ', el('code', { text: d.draft_id })),
    purposeBlock(d.purpose),
    d.kind === 'change' ? changeDiff(d) : null,
    capabilities(d, d.over_limit_ops, d.over_limit_tools),
    d.warnings.length ? el('ul', { class: 'warnings' }, d.warnings.map((w) => el('li', { text: w }))) : null,
    d.decision ? decisionText(d) : null);
  if (d.status === 'pending_approval' && isHumanAdmin()) card.append(decisionControls(d, card));
  return card;
}

/** What a change request adds and removes, against the Box's approved manifest. */
function changeDiff(d) {
  const line = (sign, text) => el('li', { class: sign === '+' ? 'added' : 'removed', text: `${sign} ${text}` });
  const lines = [...d.added.map((a) => line('+', a)), ...d.removed.map((r) => line('-', r))];
  return el('div', { class: 'diff' },
    el('p', { class: 'meta' }, 'Changes Box ', el('code', { text: d.box_id }), ':'),
    lines.length ? el('ul', { class: 'diff-lines' }, lines) : el('p', { class: 'muted', text: 'no capability changes' }));
}

function decisionText(d) {
  const x = d.decision;
  const text = x.withdrawn_by ? `Withdrawn by ${x.withdrawn_by}` : x.approved === true ? `Approved by ${x.by}` : x.approved === false ? `Rejected by ${x.by}` : 'Expired';
  return el('p', { class: 'decision' }, text, ' ', when(x.at), x.reason ? el('q', { text: x.reason }) : null, d.box_id ? el('span', { text: ` \u00b7 Box ${d.box_id}` }) : null);
}

function decisionControls(d, card) {
  const error = el('p', { class: 'error', role: 'alert', hidden: true });
  const buttons = el('div', { class: 'actions' });
  const confirm = el('div', { class: 'confirm', hidden: true });
  const reject = el('form', { class: 'reject', hidden: true });
  const busy = (on) => card.querySelectorAll('button, textarea').forEach((b) => { b.disabled = on; });
  const reset = () => { confirm.hidden = true; reject.hidden = true; buttons.hidden = false; };

  const approve = async (confirmed) => {
    clearError(error);
    busy(true);
    try {
      const a = await api('POST', `/boxes/box-drafts/${seg(d.draft_id)}/approve`, { confirm_over_limit: confirmed });
      if (a.status === 'pending_approval') {
        // Still pending: the card comes back with its progress.
        flash(`Your approval of ${a.box_type} is recorded: ${a.approvals.length} of ${a.approvals_required}; another human admin must approve too.`);
      } else {
        flash(`Approved ${a.box_type}: Box ${a.box_id} is ${a.status}.`);
        card.remove();
      }
      invalidate(['drafts', 'boxes', 'workers', 'audit']);
    } catch (e) {
      showError(error, e);
      busy(false);
      reset();
    }
  };

  buttons.append(
    el('button', { type: 'button', class: 'approve', dataset: { action: 'approve' }, text: 'Approve', onclick: () => {
      if (!d.over_limit) return approve(false);
      buttons.hidden = true;
      confirm.hidden = false;
      confirm.querySelector('[data-action="confirm-over-limit"]').focus();
    } }),
    el('button', { type: 'button', class: 'reject', dataset: { action: 'reject' }, text: 'Reject', onclick: () => {
      buttons.hidden = true;
      reject.hidden = false;
      reject.querySelector('textarea').focus();
    } }));

  confirm.append(
    el('p', {}, el('strong', { text: 'This draft is over the limit. ' }), 'Approving it lets the Box use ', ...dangerous(d), '. Approve it anyway?'),
    el('div', { class: 'actions' },
      el('button', { type: 'button', class: 'danger', dataset: { action: 'confirm-over-limit' }, text: 'Yes, approve over the limit', onclick: () => approve(true) }),
      el('button', { type: 'button', text: 'Cancel', onclick: reset })));

  const reason = el('textarea', { name: 'reason', rows: 2, maxlength: 2000, required: true, placeholder: 'Why? The requester sees this.' });
  reject.append(
    el('label', { text: 'Reason for rejecting' }, reason),
    el('div', { class: 'actions' },
      el('button', { type: 'submit', class: 'danger', dataset: { action: 'confirm-reject' }, text: 'Reject draft' }),
      el('button', { type: 'button', text: 'Cancel', onclick: reset })));
  reject.addEventListener('submit', async (event) => {
    event.preventDefault();
    clearError(error);
    busy(true);
    try {
      await api('POST', `/boxes/box-drafts/${seg(d.draft_id)}/reject`, { reason: reason.value });
      flash(`Rejected the draft of ${d.box_type}.`);
      card.remove();
      invalidate(['drafts', 'audit']);
    } catch (e) {
      showError(error, e);
      busy(false);
    }
  });
  return el('footer', {}, buttons, confirm, reject, error);
}

// --- Boxes -------------------------------------------------------------------------------

async function loadBoxes() {
  const { items, more } = await pages('/boxes?state=all&limit=200', 'boxes');
  clearError($('boxes-error'));
  state.boxes = items;
  $('boxes-count').textContent = `${items.length}${more ? '+' : ''} in all`;
  const groups = [['idle', 'Active'], ['stopped', 'Stopped'], ['archived', 'Archived']].map(([s, title]) => {
    const boxes = items.filter((b) => b.state === s).reverse();
    if (boxes.length === 0) return null;
    return el('div', { class: 'group' },
      el('h3', { text: `${title} (${boxes.length})` }),
      el('ul', {}, boxes.map((b) => el('li', {},
        el('button', { type: 'button', class: `row${b.box_id === state.box ? ' current' : ''}`, dataset: { boxId: b.box_id, boxType: b.box_type }, onclick: () => selectBox(b.box_id) },
          el('strong', { text: b.box_type }), el('span', { class: 'muted', text: ` v${b.manifest_version}` }), el('span', { class: 'right muted' }, when(b.created_at)))))));
  });
  $('boxes-list').replaceChildren(...(items.length ? groups.filter(Boolean) : [el('p', { class: 'muted empty', text: 'No Box yet: approve a draft to activate one.' })]));
  fillWorkersBoxes();
  if (state.box) await loadBox();
}

function selectBox(id) {
  state.box = id;
  for (const b of document.querySelectorAll('#boxes-list button.row')) b.classList.toggle('current', b.dataset.boxId === id);
  loadBox().catch((e) => showError($('boxes-error'), e));
}

async function loadBox() {
  const id = state.box;
  const [b, history] = await Promise.all([api('GET', `/boxes/${seg(id)}`), boxHistory(id)]);
  if (state.box !== id) return;
  const detail = $('box-detail');
  let info = $('box-info');
  let forms = $('box-forms');
  // The timeline (with the past state chosen) is drawn once per Box, the edit forms once
  // per Box and state, so a refresh keeps what is typed and what is chosen.
  if (!info || state.boxNow === null || state.boxNow.box_id !== id) {
    info = el('div', { id: 'box-info' });
    forms = el('div', { id: 'box-forms' });
    detail.replaceChildren(info, timelineSection(), forms);
    state.boxFormsFor = null;
    state.boxChosen = null;
    state.boxPast = null;
  }
  if (state.boxFormsFor !== `${id}:${b.state}`) {
    forms.replaceChildren();
    state.boxFormsFor = `${id}:${b.state}`;
    renderBoxForms(forms, b);
  }
  state.boxNow = b;
  info.replaceChildren(...boxInfo(b).filter(Boolean));
  renderTimeline(history);
  renderPast();
}

function boxInfo(b) {
  const out = [
    el('header', {}, el('h3', { text: b.box_type }), el('span', { class: `badge state-${b.state}`, text: b.state })),
    b.manifest_drift ? el('p', { class: 'error', text: 'Drift: the manifest file on disk differs from what atasira wrote (or is missing).' }) : null,
    facts([['Box id', el('code', { text: b.box_id })], ['Name', b.name], ['Version', b.manifest_version], ['Activated', when(b.created_at)],
      ['Approved by', b.approved_by], ['Draft', el('code', { text: b.draft_id })]]),
  ];
  if (isHumanAdmin() && b.state !== 'archived') out.push(boxActions(b));
  out.push(
    el('h4', { text: 'Purpose' }), purposeBlock(b.manifest.purpose),
    el('h4', { text: 'Capabilities' }), capabilities(b.manifest),
    el('h4', { text: 'Assignments' }),
    assignmentsOf(b),
    el('h4', { text: 'Provisioning' }),
    b.provisioning.length
      ? table(['#', 'access', 'outcome', 'attempts', 'when'], b.provisioning.map((p) => [String(p.index), p.access,
        el('span', { class: p.status === 'failed' ? 'bad' : 'ok', text: p.status === 'failed' ? `failed: ${p.reason || ''}` : `provisioned ${p.detail || ''}` }),
        String(p.attempts), when(p.at)]))
      : el('p', { class: 'muted', text: 'Nothing to provision.' }),
    el('details', {}, el('summary', { text: 'Whole manifest (JSON)' }), el('pre', { text: JSON.stringify(b.manifest, null, 2) })));
  return out;
}

function assignmentsOf(b) {
  return b.assignments.length
    ? table(['user', 'role in Box'], b.assignments.map((a) => [a.user_id, a.role_in_box]))
    : el('p', { class: 'muted', text: 'Nobody is assigned.' });
}

// --- a Box's timeline --------------------------------------------------------------------

// The most pages of a Box's history read (200 entries each).
const HISTORY_PAGES = 10;

/** A Box's history, oldest first, following its cursor. */
async function boxHistory(id) {
  const items = [];
  let cursor = null;
  for (let i = 0; i < HISTORY_PAGES; i++) {
    const page = await api('GET', `/boxes/${seg(id)}/history?limit=200${cursor ? `&cursor=${seg(cursor)}` : ''}`);
    page.entries.forEach((entry) => items.push({ entry }));
    cursor = page.next_cursor;
    if (!cursor) return { items, more: false };
  }
  return { items, more: true };
}

function timelineSection() {
  return el('section', { id: 'box-timeline', class: 'timeline' },
    el('h4', { text: 'Timeline' }),
    el('p', { class: 'muted', text: 'Oldest first. Choose an entry to see the Box as it was just after it.' }),
    el('div', { class: 'timeline-split' },
      el('div', {}, el('ol', { id: 'timeline-entries' }), el('p', { id: 'timeline-more', class: 'muted', hidden: true })),
      el('div', { id: 'box-past', class: 'past', hidden: true })));
}

function renderTimeline({ items, more }) {
  $('timeline-entries').replaceChildren(...items.map((item) => {
    const h = item.entry;
    return el('li', {}, el('button', { type: 'button', class: `row entry${h.event_id === state.boxChosen ? ' current' : ''}`,
      dataset: { eventId: h.event_id, kind: h.kind }, title: 'Show the Box as it was just after this', onclick: () => choosePast(item) },
    el('span', { class: 'when' }, el('time', { datetime: h.at, title: h.at, text: localTime(h.at) })),
    el('span', { class: 'what' }, el('strong', { text: h.kind.replaceAll('_', ' ') }), el('span', { class: 'muted', text: ` by ${h.actor}` })),
    el('span', { class: 'how muted', text: historyText(h) })));
  }));
  const note = $('timeline-more');
  note.hidden = !more;
  note.textContent = `The first ${items.length} entries; later ones are not shown.`;
}

function historyText(h) {
  const parts = [];
  if (h.manifest_version) parts.push(`version ${h.manifest_version}`);
  if (h.changed_keys) parts.push(`changed ${h.changed_keys.join(', ')}`);
  if (h.added && h.added.length) parts.push(`added ${h.added.join(', ')}`);
  if (h.removed && h.removed.length) parts.push(`removed ${h.removed.join(', ')}`);
  if (h.user_id) parts.push(`${h.user_id}${h.role_in_box ? ` (${h.role_in_box})` : ''}`);
  if (h.access) parts.push(h.access);
  if (h.reason) parts.push(h.reason);
  if (h.detail) parts.push(h.detail);
  if (h.approved_by) parts.push(`approved by ${h.approved_by}`);
  return parts.join(' \u00b7 ');
}

/** Reads the Box as it was just after a timeline entry (`?at=<position>`) and shows it. */
async function choosePast(item) {
  const id = state.box;
  const asked = (choosePast.asked = (choosePast.asked || 0) + 1);
  state.boxChosen = item.entry.event_id;
  markChosen();
  const past = $('box-past');
  try {
    // The Box as it was just after the entry: its own position in the store.
    const position = item.entry.position;
    const box = await api('GET', `/boxes/${seg(id)}?at=${position}`);
    // A later choice (another entry, another Box, back to now) wins.
    if (asked !== choosePast.asked || state.box !== id) return;
    state.boxPast = { item, position, box };
    renderPast();
    past.scrollIntoView({ block: 'nearest' });
  } catch (e) {
    if (asked !== choosePast.asked) return;
    state.boxPast = null;
    state.boxChosen = null;
    markChosen();
    past.replaceChildren(el('p', { class: 'error', role: 'alert', text: e.message }));
    past.hidden = false;
  }
}

function backToNow() {
  choosePast.asked = (choosePast.asked || 0) + 1;
  state.boxChosen = null;
  state.boxPast = null;
  renderPast();
  markChosen();
  $('box-info').scrollIntoView({ block: 'nearest' });
}

function markChosen() {
  for (const b of document.querySelectorAll('#timeline-entries button.entry')) b.classList.toggle('current', b.dataset.eventId === state.boxChosen);
}

/** The Box as it was: what it might do, who approved that, who was assigned, its state;
 * each value that differs now says what it is now. */
function renderPast() {
  const past = $('box-past');
  if (!state.boxPast) {
    past.hidden = true;
    past.replaceChildren();
    return;
  }
  const { item, position, box: then } = state.boxPast;
  const now = state.boxNow;
  const h = item.entry;
  const title = `As of position ${position}, ${localTime(h.at)}`;
  const assigned = (b) => b.assignments.map((a) => `${a.user_id} (${a.role_in_box})`);
  const rows = [
    ['version', 'Version', then.manifest_version, now.manifest_version],
    ['state', 'State', then.state, now.state],
    ['approved_by', 'Approved by', then.approved_by, now.approved_by],
    ['network', 'Network', then.manifest.network, now.manifest.network],
    ['os_operations', 'OS operations', then.manifest.os_operations, now.manifest.os_operations],
    ['tools', 'Tools', then.manifest.tools, now.manifest.tools],
    ['url_allowlist', 'URL allowlist', then.manifest.url_allowlist, now.manifest.url_allowlist],
    ['assignments', 'Assignments', assigned(then), assigned(now)],
  ];
  past.replaceChildren(
    el('header', {},
      el('span', { class: 'badge was', text: 'PAST' }),
      el('h3', { text: title }),
      el('button', { type: 'button', dataset: { action: 'timeline-now' }, text: 'Back to now', onclick: backToNow })),
    el('p', { class: 'meta' }, 'Just after: ', el('strong', { text: h.kind.replaceAll('_', ' ') }), ` by ${h.actor} \u00b7 `, when(h.at)),
    el('dl', { class: 'facts' }, rows.flatMap(([key, name, was, is]) => [
      el('dt', { text: name }),
      el('dd', { dataset: { key } }, el('span', { class: 'then' }, Array.isArray(was) ? chips(was) : was),
        JSON.stringify(was) === JSON.stringify(is) ? null : el('span', { class: 'now', text: `now: ${Array.isArray(is) ? is.join(', ') || 'none' : is}` }))])),
    el('details', {}, el('summary', { text: 'Whole manifest then (JSON)' }), el('pre', { text: JSON.stringify(then.manifest, null, 2) })));
  past.hidden = false;
}

function table(heads, rows) {
  return el('table', { class: 'rows' },
    el('thead', {}, el('tr', {}, heads.map((h) => el('th', { text: h })))),
    el('tbody', {}, rows.map((r) => el('tr', {}, r.map((c) => el('td', {}, c))))));
}

function boxActions(b) {
  const error = el('p', { class: 'error', role: 'alert', hidden: true });
  const act = async (verb) => {
    clearError(error);
    try {
      const after = await api('POST', `/boxes/${seg(b.box_id)}/${verb}`, {});
      flash(`Box ${after.box_type} is ${after.state}.`);
      invalidate(['boxes', 'workers', 'audit']);
    } catch (e) {
      showError(error, e);
    }
  };
  const confirmArchive = el('span', { class: 'confirm', hidden: true },
    'Archiving is final. ',
    el('button', { type: 'button', class: 'danger', dataset: { action: 'confirm-archive' }, text: 'Archive for good', onclick: () => act('archive') }));
  return el('div', { class: 'actions' },
    b.state === 'idle' ? el('button', { type: 'button', dataset: { action: 'stop' }, text: 'Stop', onclick: () => act('stop') }) : null,
    b.state === 'stopped' ? el('button', { type: 'button', dataset: { action: 'resume' }, text: 'Resume', onclick: () => act('resume') }) : null,
    el('button', { type: 'button', dataset: { action: 'archive' }, text: 'Archive\u2026', onclick: () => { confirmArchive.hidden = false; } }),
    confirmArchive, error);
}

const lines = (text) => text.split('\n').map((l) => l.trim()).filter((l) => l !== '');

function renderBoxForms(forms, b) {
  if (b.state === 'archived') return;
  const primary = b.assignments.some((a) => a.user_id === state.me.user_id && a.role_in_box === 'primary');
  if (isHumanAdmin()) forms.append(mentorForm(b));
  if (isHumanAdmin() || primary) forms.append(configForm(b));
}

/** A field with its own place for the server's refusal of it. */
function field(label, input, key) {
  return el('div', { class: 'field', dataset: { key } }, el('label', { text: label }, input), el('p', { class: 'error field-error', role: 'alert', hidden: true }));
}

/** Shows a refusal: each entry of details next to the field it names, the message above. */
function showFormError(form, general, e) {
  for (const p of form.querySelectorAll('.field-error')) clearError(p);
  showError(general, e);
  if (!Array.isArray(e.details)) return;
  for (const d of e.details) {
    const f = [...form.querySelectorAll('.field')].find((x) => d && d.key && (d.key === x.dataset.key || d.key.startsWith(`${x.dataset.key}[`) || d.key.startsWith(`${x.dataset.key}.`)));
    if (f) showError(f.querySelector('.field-error'), { message: `${d.key}: ${d.message}` });
  }
}

function mentorForm(b) {
  const { purpose, criteria } = splitPurpose(b.manifest.purpose);
  const before = { purpose, success_criteria: criteria, prohibited_actions: b.manifest.prohibited_actions };
  const p = el('textarea', { name: 'purpose', rows: 3, required: true, text: purpose });
  const c = el('textarea', { name: 'success_criteria', rows: 3, text: criteria.join('\n') });
  const x = el('textarea', { name: 'prohibited_actions', rows: 2, text: b.manifest.prohibited_actions.join('\n') });
  const general = el('p', { class: 'error form-error', role: 'alert', hidden: true });
  const form = el('form', { class: 'panel edit', id: 'mentor-form' },
    el('h3', { text: 'Mentor edit' }),
    el('p', { class: 'muted', text: 'The wording only: purpose, success criteria, prohibited actions. Capabilities need a new draft.' }),
    field('Purpose', p, 'purpose'), field('Success criteria (one per line)', c, 'success_criteria'), field('Prohibited actions (one per line)', x, 'prohibited_actions'),
    general, el('button', { type: 'submit', text: 'Save wording' }));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clearError(general);
    const now = { purpose: p.value, success_criteria: lines(c.value), prohibited_actions: lines(x.value) };
    const edit = Object.fromEntries(Object.entries(now).filter(([k, v]) => JSON.stringify(v) !== JSON.stringify(before[k])));
    if (Object.keys(edit).length === 0) return showError(general, { message: 'Nothing changed.' });
    try {
      const after = await api('PUT', `/boxes/${seg(b.box_id)}/manifest`, edit);
      flash(`Saved: ${after.box_type} is at version ${after.manifest_version}.`);
      Object.assign(before, edit);
      for (const f of form.querySelectorAll('.field-error')) clearError(f);
      invalidate(['boxes', 'audit']);
    } catch (e) {
      showFormError(form, general, e);
    }
  });
  return form;
}

function configForm(b) {
  const current = { config_defaults: b.manifest.config_defaults, trigger_schedule: b.manifest.trigger_schedule };
  const patch = el('textarea', { name: 'patch', rows: 8, spellcheck: 'false', text: JSON.stringify(current, null, 2) });
  const general = el('p', { class: 'error form-error', role: 'alert', hidden: true });
  const form = el('form', { class: 'panel edit', id: 'config-form' },
    el('h3', { text: 'Config edit' }),
    el('p', { class: 'muted', text: 'A JSON merge patch of config_defaults, trigger_schedule, notify, credentials, shell or browser: objects merge key by key, null deletes a key.' }),
    field('Merge patch', patch, ''), general, el('button', { type: 'submit', text: 'Apply patch' }));
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clearError(general);
    let body;
    try {
      body = JSON.parse(patch.value);
    } catch (e) {
      return showError(general, { message: `This is not JSON: ${e.message}` });
    }
    try {
      const after = await api('PATCH', `/boxes/${seg(b.box_id)}/config`, body, 'application/merge-patch+json');
      flash(`Applied: ${after.box_type} is at version ${after.manifest_version}.`);
      invalidate(['boxes', 'audit']);
    } catch (e) {
      showFormError(form, general, e);
    }
  });
  return form;
}

// --- Workers -----------------------------------------------------------------------------

function fillWorkersBoxes() {
  const select = $('workers-box');
  const boxes = state.boxes.filter((b) => b.state !== 'archived');
  if (!boxes.some((b) => b.box_id === state.workersBox)) state.workersBox = boxes.length ? boxes[boxes.length - 1].box_id : null;
  select.replaceChildren(...boxes.map((b) => el('option', { value: b.box_id, selected: b.box_id === state.workersBox, text: `${b.box_type} (${b.state})` })));
}

async function loadWorkers() {
  if (stale.has('boxes') || state.boxes.length === 0) {
    const { items } = await pages('/boxes?state=all&limit=200', 'boxes');
    state.boxes = items;
    fillWorkersBoxes();
  }
  const id = state.workersBox;
  const form = $('launch-form');
  const box = state.boxes.find((b) => b.box_id === id);
  form.hidden = !box || !['idle', 'running'].includes(box.state);
  if (isAdmin()) await loadToolRequests();
  if (!id) {
    $('workers-list').replaceChildren(el('p', { class: 'muted empty', text: 'No active Box.' }));
    return;
  }
  let workers;
  try {
    ({ items: workers } = await pages(`/boxes/${seg(id)}/workers?limit=200`, 'workers'));
  } catch (e) {
    $('workers-list').replaceChildren();
    form.hidden = true;
    throw e;
  }
  if (state.workersBox !== id) return;
  clearError($('workers-error'));
  $('workers-list').replaceChildren(workers.length
    ? el('ul', {}, workers.slice().reverse().map((w) => el('li', {},
      el('button', { type: 'button', class: `row${w.worker_id === state.worker ? ' current' : ''}`, dataset: { workerId: w.worker_id }, onclick: () => selectWorker(w.worker_id) },
        el('code', { text: w.worker_id.slice(0, 12) }), ' ', el('span', { class: `badge state-${w.state}`, text: w.state }), ' ', el('strong', { text: w.role || 'no role' }),
        el('span', { class: 'muted', text: ` by ${w.created_by}` }), el('span', { class: 'right muted' }, when(w.created_at))))))
    : el('p', { class: 'muted empty', text: 'No Worker of this Box yet.' }));
  if (state.worker) await loadWorker();
}

function selectWorker(id) {
  state.worker = id;
  for (const b of document.querySelectorAll('#workers-list button.row')) b.classList.toggle('current', b.dataset.workerId === id);
  loadWorker().catch((e) => showError($('workers-error'), e));
}

async function loadWorker() {
  const id = state.worker;
  const [w, p] = await Promise.all([api('GET', `/workers/${seg(id)}`), api('GET', `/workers/${seg(id)}/provenance`)]);
  if (state.worker !== id) return;
  $('worker-detail').replaceChildren(
    el('header', {}, el('h3', { text: w.role || 'Worker' }), el('code', { text: w.worker_id })),
    facts([['Box', w.box_type], ['State', el('span', { class: `badge state-${w.state}`, text: w.stop_requested ? `${w.state} (${w.stop_requested} asked)` : w.state })],
      ['Host', w.host], ['Launch id', w.launch_id], ['Launched by', w.created_by], ['When', when(w.created_at)],
      ['Exit code', w.exit_code === null ? null : String(w.exit_code)],
      ['Labels', Object.keys(w.labels).length ? chips(Object.entries(w.labels).map(([k, v]) => `${k}=${v}`)) : null]]),
    workerActions(w),
    w.log.length ? el('h4', { text: 'Log' }) : null,
    w.log.length ? el('pre', { class: 'log', text: w.log.join('\n') }) : null,
    w.result === null ? null : el('h4', { text: 'Result' }),
    w.result === null ? null : el('pre', { class: 'log', text: w.result }),
    el('h4', { text: 'Transcript' }),
    el('ol', { class: 'transcript' }, w.transcript.map((t) => el('li', {},
      el('p', { class: 'meta' }, el('strong', { text: t.author }), ' \u00b7 ', when(t.at)),
      t.segments.map((s) => el('p', { class: `segment ${s.kind}` }, s.kind === 'text' ? null : el('span', { class: 'badge', text: s.kind.replace('_', ' ') }), el('span', { class: 'text', text: s.value })))))),
    el('h4', { text: 'Provenance' }),
    el('p', { class: p.approval_verified ? 'ok' : 'bad', text: p.approval_verified
      ? `The approval verifies with the public key ${p.approval_key_id}.`
      : `The approval does NOT verify with the public key ${p.approval_key_id}.` }),
    facts([['Bundle', el('code', { text: p.bundle_digest })]]),
    table(['step', 'who', 'when', 'version', 'digest', 'audit row'], p.steps.map((s) => [s.kind.replace('_', ' '), s.actor, when(s.at), s.manifest_version || '',
      s.digest ? el('code', { title: s.digest, text: s.digest.slice(0, 19) }) : '', s.audit_seq === null ? 'not yet' : String(s.audit_seq)])));
}

/** Stop, kill, pause and resume, for a Worker that has not ended (the API says who may). */
function workerActions(w) {
  if (!['created', 'starting', 'running', 'paused'].includes(w.state)) return null;
  const label = { stop: 'Stop', kill: 'Kill', pause: 'Pause', resume: 'Resume' };
  const act = (verb) => el('button', { type: 'button', text: label[verb], onclick: async () => {
    try {
      await api('POST', `/workers/${seg(w.worker_id)}/${verb}`, {});
      flash(`Asked Worker ${w.worker_id} to ${verb}.`);
      invalidate(['workers', 'boxes', 'audit']);
    } catch (e) {
      showError($('workers-error'), e);
    }
  } });
  const pause = w.state === 'running' ? act('pause') : w.state === 'paused' ? act('resume') : null;
  return el('p', { class: 'actions' }, act('stop'), ' ', act('kill'), pause ? ' ' : null, pause);
}

/** The tool calls Workers wait to make until a human admin decides (admins see them). */
async function loadToolRequests() {
  const box = $('tool-requests');
  const { items } = await pages('/tool-requests?limit=200', 'requests');
  box.hidden = items.length === 0;
  box.replaceChildren(el('h3', { text: `Tool calls waiting for a human admin (${items.length})` }), el('ul', {}, items.map((r) => {
    const reason = el('input', { placeholder: 'reason (for a rejection)', maxlength: 500 });
    const decide = (verb) => el('button', { type: 'button', text: verb === 'approve' ? 'Allow' : 'Refuse', onclick: async () => {
      try {
        await api('POST', `/tool-requests/${seg(r.request_id)}/${verb}`, verb === 'reject' && reason.value.trim() ? { reason: reason.value.trim() } : {});
        flash(`${verb === 'approve' ? 'Allowed' : 'Refused'} ${r.tool} for Worker ${r.worker_id}.`);
        invalidate(['workers', 'audit']);
      } catch (e) {
        showError($('workers-error'), e);
      }
    } });
    return el('li', { class: 'panel' },
      el('p', {}, el('strong', { text: r.tool }), ' ', el('span', { class: 'muted', text: `${r.box_type} \u00b7 Worker ${r.worker_id.slice(0, 12)} launched by ${r.launched_by}` })),
      el('pre', { class: 'log', text: JSON.stringify(r.input, null, 2) }),
      el('p', { class: 'muted', text: `${r.rule}: ${r.reason} \u00b7 denied at ${localTime(r.expires_at)} unless decided` }),
      isHumanAdmin() && state.me.user_id !== r.launched_by ? el('p', { class: 'actions' }, decide('approve'), ' ', reason, ' ', decide('reject')) : null);
  })));
}

function setupLaunch() {
  const form = $('launch-form');
  $('launch-id').value = `web-${randomHex(6)}`;
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const error = $('launch-error');
    clearError(error);
    const box = state.workersBox;
    const body = { launch_id: $('launch-id').value.trim(), role: $('launch-role').value.trim() || null, input: [{ kind: 'text', value: $('launch-input').value }] };
    try {
      const w = await api('POST', `/boxes/${seg(box)}/workers`, body);
      flash(`Launched Worker ${w.worker_id}.`);
      $('launch-id').value = `web-${randomHex(6)}`;
      $('launch-input').value = '';
      state.worker = w.worker_id;
      invalidate(['workers', 'audit']);
    } catch (e) {
      showError(error, e);
    }
  });
  $('workers-box').addEventListener('change', (event) => {
    state.workersBox = event.target.value;
    state.worker = null;
    $('worker-detail').replaceChildren(el('p', { class: 'muted', text: 'Choose a Worker to see its transcript and provenance.' }));
    load('workers');
  });
}

// --- webhooks ----------------------------------------------------------------------------

// What a webhook may be told about (README: "Webhooks for approvers").
const WEBHOOK_KINDS = [
  ['draft.pending', 'a draft waits for approval'],
  ['change.pending', 'a change request waits for approval'],
  ['tool_request.pending', 'a tool call waits for a human admin'],
  ['provisioning.failed', 'access setup failed'],
  ['worker.escalated', 'a failed Worker escalates'],
];
// The newest deliveries shown (the API gives at most 200).
const DELIVERIES_SHOWN = 100;

async function loadWebhooks() {
  const { webhooks } = await api('GET', '/webhooks');
  clearError($('webhooks-error'));
  state.webhooks = webhooks;
  const human = isHumanAdmin();
  $('webhook-side').hidden = !human;
  $('webhooks-split').classList.toggle('single', !human);
  const note = $('webhooks-note');
  note.hidden = human;
  note.textContent = 'Registering and removing webhooks need a human admin; this token is an agent\u2019s.';
  const dead = webhooks.reduce((n, w) => n + w.dead, 0);
  $('webhooks-count').textContent = `${webhooks.length} registered${dead ? ` \u00b7 ${dead} failed ${dead === 1 ? 'delivery' : 'deliveries'}` : ''}`;
  $('webhooks-table').hidden = webhooks.length === 0;
  $('webhooks-empty').hidden = webhooks.length > 0;
  if (!webhooks.some((w) => w.webhook_id === state.webhook)) state.webhook = null;
  // Drawn again only when something changed: the view is re-read every 5 s.
  const drawn = JSON.stringify([webhooks, state.webhook, human]);
  if (drawn !== loadWebhooks.drawn) {
    loadWebhooks.drawn = drawn;
    $('webhooks-rows').replaceChildren(...webhooks.map(webhookRow));
  }
  await loadDeliveries();
}

function webhookRow(w) {
  const classes = [w.dead ? 'failing' : '', w.webhook_id === state.webhook ? 'current' : ''].join(' ').trim();
  return el('tr', { class: classes || null, dataset: { webhookId: w.webhook_id } },
    el('td', {}, el('button', { type: 'button', class: 'link', title: 'Show its deliveries', text: w.url, onclick: () => selectWebhook(w.webhook_id) })),
    el('td', { text: w.format }),
    el('td', {}, w.kinds.length ? chips(w.kinds) : el('span', { class: 'muted', text: 'every kind' })),
    el('td', { class: 'count delivered', text: String(w.delivered) }),
    el('td', { class: 'count pending', text: String(w.pending) }),
    el('td', { class: 'count dead' }, w.dead
      ? el('button', { type: 'button', class: 'badge danger', title: 'Show the failed (dead) deliveries', text: String(w.dead), onclick: () => selectWebhook(w.webhook_id, 'dead') })
      : '0'),
    el('td', {}, w.registered_by, ' \u00b7 ', when(w.registered_at)),
    el('td', { class: 'nowrap' }, isHumanAdmin() ? removeWebhook(w) : null));
}

/** Remove, after a confirmation (which a refresh of the list keeps open). */
function removeWebhook(w) {
  const open = state.webhookRemoving === w.webhook_id;
  const ask = el('button', { type: 'button', dataset: { action: 'remove' }, hidden: open, text: 'Remove\u2026' });
  const confirm = el('span', { class: 'confirm', hidden: !open },
    'Nothing more is sent to it. ',
    el('button', { type: 'button', class: 'danger', dataset: { action: 'confirm-remove' }, text: 'Remove for good', onclick: async (event) => {
      event.target.disabled = true;
      try {
        await api('DELETE', `/webhooks/${seg(w.webhook_id)}`);
        flash(`Removed the webhook to ${w.url}: nothing more is sent to it.`);
        if (state.webhook === w.webhook_id) state.webhook = null;
        state.webhookRemoving = null;
        invalidate(['webhooks', 'audit']);
      } catch (e) {
        event.target.disabled = false;
        showError($('webhooks-error'), e);
      }
    } }),
    ' ',
    el('button', { type: 'button', text: 'Cancel', onclick: () => { state.webhookRemoving = null; confirm.hidden = true; ask.hidden = false; } }));
  ask.addEventListener('click', () => { state.webhookRemoving = w.webhook_id; ask.hidden = true; confirm.hidden = false; });
  return el('span', {}, ask, confirm);
}

/** Shows a webhook's deliveries; `only` picks which (`dead`: the failed ones). */
function selectWebhook(id, only) {
  state.webhook = id;
  if (only !== undefined) {
    state.webhookState = only;
    $('deliveries-state').value = only;
  }
  for (const tr of document.querySelectorAll('#webhooks-rows tr')) tr.classList.toggle('current', tr.dataset.webhookId === id);
  loadDeliveries().catch((e) => showError($('webhooks-error'), e));
}

async function loadDeliveries() {
  const id = state.webhook;
  const only = state.webhookState;
  const asked = (loadDeliveries.asked = (loadDeliveries.asked || 0) + 1);
  const w = state.webhooks.find((x) => x.webhook_id === id);
  $('webhook-choose').hidden = !!w || state.webhooks.length === 0;
  $('webhook-detail').hidden = !w;
  if (!w) return;
  const query = new URLSearchParams({ limit: String(DELIVERIES_SHOWN) });
  if (only) query.set('state', only);
  const { deliveries } = await api('GET', `/webhooks/${seg(id)}/deliveries?${query}`);
  // A later choice (another webhook, another filter) wins.
  if (asked !== loadDeliveries.asked) return;
  const drawn = JSON.stringify([id, only, deliveries]);
  if (drawn === loadDeliveries.drawn) return;
  loadDeliveries.drawn = drawn;
  $('deliveries-url').textContent = w.url;
  const n = deliveries.length;
  const none = { '': 'No delivery yet: nothing it hears of has happened since it was registered.', dead: 'No failed (dead) delivery.',
    pending: 'No delivery is being tried.', delivered: 'No delivery was accepted yet.' };
  $('deliveries-count').textContent = n === 0
    ? none[only]
    : `${n === DELIVERIES_SHOWN ? 'The newest ' : ''}${n} ${only === 'dead' ? 'failed (dead) ' : only ? `${only} ` : ''}${n === 1 ? 'delivery' : 'deliveries'}, newest first.`;
  $('deliveries-table').hidden = deliveries.length === 0;
  $('deliveries-rows').replaceChildren(...deliveries.map((d) => el('tr', { class: d.state === 'dead' ? 'failed' : null, dataset: { deliveryId: d.delivery_id, state: d.state } },
    el('td', { class: 'nowrap' }, when(d.created_at)),
    el('td', { class: 'kind', text: d.kind }),
    el('td', {}, el('code', { title: 'The event announced (the audit ledger\u2019s event column)', text: d.event_id })),
    el('td', { class: 'state' }, el('span', { class: `badge state-${d.state}`, text: d.state })),
    el('td', { class: 'count attempts', text: String(d.attempts) }),
    el('td', { class: `status${d.last_status && (d.last_status < 200 || d.last_status > 299) ? ' bad' : ''}`, text: d.last_status ? String(d.last_status) : d.attempts ? 'no answer' : '\u2014' }),
    el('td', { class: 'last-error', text: d.last_error }),
    el('td', { class: 'nowrap' }, d.attempts ? when(d.updated_at) : '\u2014'),
    el('td', { class: 'nowrap' }, d.next_attempt_at ? el('time', { datetime: d.next_attempt_at, text: localTime(d.next_attempt_at) }) : '\u2014'))));
}

/** The secret of a webhook just registered: shown this once, until the admin says it is kept. */
function showSecret(w) {
  const value = el('input', { id: 'webhook-secret-value', readonly: true, spellcheck: 'false', value: w.secret, onfocus: (event) => event.target.select() });
  const said = el('span', { class: 'muted' });
  const copy = el('button', { type: 'button', text: 'Copy', onclick: async () => {
    try {
      await navigator.clipboard.writeText(w.secret);
      said.textContent = ' Copied.';
    } catch {
      value.select();
      said.textContent = ' Selected: copy it with your keyboard.';
    }
  } });
  const box = $('webhook-secret');
  box.replaceChildren(
    el('h3', { text: 'Keep this secret now' }),
    el('p', {}, 'The webhook to ', el('code', { text: w.url }), ' signs every delivery with it (', el('code', { text: 'X-Atasira-Signature' }),
      '). It is shown this once and cannot be read again: put it where the receiver can read it.'),
    el('p', { class: 'actions' }, value, copy, said),
    el('button', { type: 'button', dataset: { action: 'secret-kept' }, text: 'I have kept it', onclick: () => { box.replaceChildren(); box.hidden = true; } }));
  box.hidden = false;
}

/** The registration form (human admins): built once, so a refresh keeps what is typed. */
function setupWebhooks() {
  const url = el('input', { type: 'url', name: 'url', id: 'webhook-url', required: true, maxlength: 2048, spellcheck: 'false', autocomplete: 'off',
    placeholder: 'https://chat.example.com/hooks/approvers' });
  const format = el('select', { name: 'format', id: 'webhook-format' },
    el('option', { value: 'json', text: 'json: the announcement as JSON' }),
    el('option', { value: 'slack', text: 'slack: {"text": \u2026} (Slack, Mattermost, Rocket.Chat)' }));
  const kinds = el('fieldset', { class: 'field kinds', dataset: { key: 'kinds' } },
    el('legend', { text: 'Kinds (none checked: every kind)' }),
    WEBHOOK_KINDS.map(([kind, what]) => el('label', { class: 'check' },
      el('input', { type: 'checkbox', name: 'kinds', value: kind }), el('span', {}, el('code', { text: kind }), el('span', { class: 'muted', text: ` ${what}` })))),
    el('p', { class: 'error field-error', role: 'alert', hidden: true }));
  const general = el('p', { class: 'error form-error', role: 'alert', hidden: true });
  const submit = el('button', { type: 'submit', text: 'Register webhook' });
  const form = el('form', { class: 'panel edit', id: 'webhook-form', autocomplete: 'off' },
    el('h3', { text: 'Register a webhook' }),
    el('p', { class: 'muted', text: 'Approvers hear of every decision waiting for them: each announcement is POSTed to the URL, signed with a secret shown once.' }),
    field('URL', url, 'url'), field('Format', format, 'format'), kinds, general, submit);
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clearError(general);
    const body = { url: url.value.trim(), format: format.value, kinds: [...form.querySelectorAll('input[name=kinds]:checked')].map((c) => c.value) };
    submit.disabled = true;
    try {
      const w = await api('POST', '/webhooks', body);
      for (const f of form.querySelectorAll('.field-error')) clearError(f);
      form.reset();
      showSecret(w);
      flash(`Registered the webhook to ${w.url}.`);
      invalidate(['webhooks', 'audit']);
    } catch (e) {
      showFormError(form, general, e);
    } finally {
      submit.disabled = false;
    }
  });
  $('webhook-side').append(form);
  $('deliveries-state').addEventListener('change', (event) => {
    state.webhookState = event.target.value;
    loadDeliveries().catch((e) => showError($('webhooks-error'), e));
  });
  // Deliveries that go well are no event: the open view is read again now and then.
  setInterval(() => { if (state.me && state.view === 'webhooks' && !document.hidden) invalidate(['webhooks']); }, POLL_MS);
}

// --- policy ------------------------------------------------------------------------------

// How the ledger's detail of a refusal by the policy starts; then `policy version N, rule
// <id>: <reason>`.
const POLICY_DENIED = 'refused (policy_denied):';

async function loadPolicy() {
  const [p, { items, more }] = await Promise.all([api('GET', '/policies'), pages('/audit?action=security_violation&limit=500', 'rows', 10)]);
  clearError($('policy-error'));
  const human = isHumanAdmin();
  $('policy-publish').hidden = !human;
  const note = $('policy-note');
  note.hidden = human;
  note.textContent = 'Publishing a policy needs a human admin; this token is an agent\u2019s. Check still shows what a proposal would change.';
  renderPolicy(p);
  renderRefusals(items.filter((r) => (r.detail || '').startsWith(POLICY_DENIED)), more);
}

function renderPolicy(p) {
  const version = $('policy-version');
  version.className = `badge${p.version ? ' ok' : ''}`;
  version.textContent = p.version ? `version ${p.version}` : 'none published';
  $('policy-published').replaceChildren(...(p.published_by
    ? ['published by ', el('strong', { text: p.published_by }), p.published_at ? ' \u00b7 ' : null, p.published_at ? when(p.published_at) : null].filter(Boolean)
    : []));
  $('policy-empty').hidden = p.version > 0;
  $('policy-active').hidden = !(p.version > 0);
  $('policy-digest').textContent = p.digest ? `${p.digest.slice(0, 19)}\u2026` : '';
  $('policy-digest').title = p.digest || '';
  $('policy-rules-rows').replaceChildren(...p.rules.map((r) => el('tr', { dataset: { rule: r.id, effect: r.effect } },
    el('td', {}, el('code', { text: r.id })),
    el('td', {}, el('span', { class: `badge ${r.effect === 'forbid' ? 'danger' : 'ok'}`, text: r.effect })),
    el('td', { class: 'reason', text: r.reason || '' }),
    el('td', { class: 'count approvals', text: r.approvals ? String(r.approvals) : '\u2014' }),
    el('td', { class: 'confirmation', text: r.confirm ? 'asked' : '\u2014' }))));
  $('policy-rules').hidden = p.rules.length === 0;
  $('policy-text').textContent = p.text;
  if (!state.policyEdited) $('policy-proposal').value = p.text;
}

/** A refusal's detail in parts: the version and rule named, and why. */
function policyRefusal(detail) {
  const rest = detail.slice(POLICY_DENIED.length).trim();
  const m = /^policy version (\d+), rule ([^:]+?)(?::\s*([\s\S]*))?$/.exec(rest);
  return m ? { version: m[1], rule: m[2].trim(), reason: m[3] || '' } : { version: '', rule: '', reason: rest };
}

function renderRefusals(rows, more) {
  const n = rows.length;
  $('policy-refusals-count').textContent = n === 0 ? 'The policy has refused nothing yet.'
    : `${more ? 'Among the first rows read: ' : ''}${n} ${n === 1 ? 'refusal' : 'refusals'}, newest first.`;
  $('policy-refusals').hidden = n === 0;
  $('policy-refusals-rows').replaceChildren(...rows.slice().reverse().map((r) => {
    const x = policyRefusal(r.detail);
    return el('tr', { class: 'violation', dataset: { rule: x.rule, seq: String(r.seq) } },
      el('td', { class: 'nowrap' }, el('time', { datetime: r.time, title: r.time, text: localTime(r.time) })),
      el('td', { text: r.actor }),
      el('td', {}, el('code', { text: r.target })),
      el('td', { class: 'version', text: x.version }),
      el('td', { class: 'rule' }, x.rule ? el('code', { text: x.rule }) : null),
      el('td', { class: 'detail', text: x.reason }));
  }));
}

/** One verdict of a check: allowed or denied, by which rules, with what approval. */
function verdict(v) {
  const parts = [v.decision === 'deny' ? 'denied' : 'allowed'];
  if (v.rules.length) parts.push(`by ${v.rules.join(', ')}`);
  if (v.approvals_required > 1) parts.push(`${v.approvals_required} approvals`);
  if (v.confirm) parts.push('confirmation asked');
  return parts.join(' \u00b7 ');
}

const CHECKED_KINDS = { draft: 'draft', change: 'change request', box: 'Box' };

function showCheck(c) {
  const n = c.changes.length;
  const out = $('policy-changes');
  out.replaceChildren(el('div', {},
    el('h4', { text: 'What the proposal changes' }),
    el('p', { id: 'policy-changes-count', class: 'muted', text: `Of the pending drafts, change requests and Boxes (${c.checked} checked), `
      + `${n === 0 ? 'none' : n} would be judged differently than ${c.active_version ? `under version ${c.active_version}` : 'with no policy'}.` }),
    c.truncated ? el('p', { class: 'note', text: 'More are pending than one check covers: the rest were not checked.' }) : null,
    n ? el('ul', { class: 'policy-changes' }, c.changes.map((x) => el('li', { class: x.after.decision === 'deny' ? 'denied' : null, dataset: { id: x.id, kind: x.kind } },
      el('p', {}, el('span', { class: 'badge', text: CHECKED_KINDS[x.kind] || x.kind }), ' ', el('strong', { text: x.box_type }), ' ', el('code', { text: x.id })),
      el('p', { class: 'verdict' }, el('span', { class: 'before', text: verdict(x.before) }), ' \u2192 ', el('span', { class: `after ${x.after.decision}`, text: verdict(x.after) })),
      x.after.reason ? el('p', { class: 'muted reason', text: x.after.reason }) : null))) : null));
  out.hidden = false;
}

/** Check and Publish (built in the page; a refresh keeps what is typed). */
function setupPolicy() {
  const form = $('policy-form');
  const text = $('policy-proposal');
  const error = $('policy-form-error');
  const busy = (on) => form.querySelectorAll('button').forEach((b) => { b.disabled = on; });
  text.addEventListener('input', () => { state.policyEdited = true; });
  $('policy-check').addEventListener('click', async () => {
    clearError(error);
    busy(true);
    try {
      showCheck(await api('POST', '/policies/check', { text: text.value }));
    } catch (e) {
      $('policy-changes').hidden = true;
      showError(error, e);
    } finally {
      busy(false);
    }
  });
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    clearError(error);
    busy(true);
    try {
      const p = await api('PUT', '/policies', { text: text.value });
      flash(`Published policy version ${p.version}.`);
      state.policyEdited = false;
      $('policy-changes').hidden = true;
      renderPolicy(p);
      invalidate(['policy', 'drafts', 'audit']);
    } catch (e) {
      showError(error, e);
    } finally {
      busy(false);
    }
  });
}

// --- audit -------------------------------------------------------------------------------

async function loadAudit() {
  const query = new URLSearchParams({ limit: '500' });
  if (state.audit.action) query.set('action', state.audit.action);
  if (state.audit.target) query.set('target', state.audit.target);
  const [verify, { items, more }] = await Promise.all([api('GET', '/audit/verify'), pages(`/audit?${query}`, 'rows', 4)]);
  clearError($('audit-error'));
  const badge = $('audit-verify');
  badge.className = `badge ${verify.ok ? 'ok' : 'danger'}`;
  badge.textContent = verify.ok ? `verified \u00b7 ${verify.rows} rows` : `NOT verified: row ${verify.first_bad_seq} ${verify.reason || ''}`;
  $('audit-count').textContent = more ? `The first ${items.length} rows that match, newest first; narrow the filters to see later ones.` : `${items.length} rows, newest first.`;
  const actions = new Set([...$('audit-actions').children].map((o) => o.value));
  for (const r of items) if (!actions.has(r.action)) { actions.add(r.action); $('audit-actions').append(el('option', { value: r.action })); }
  $('audit-rows').replaceChildren(...items.slice().reverse().map((r) => el('tr', { class: r.action === 'security_violation' ? 'violation' : null },
    el('td', { text: String(r.seq) }),
    el('td', { class: 'nowrap' }, el('time', { datetime: r.time, title: r.time, text: localTime(r.time) })),
    el('td', { text: r.action }),
    el('td', { text: r.actor }),
    el('td', {}, el('button', { type: 'button', class: 'link', title: 'Show only this target', text: r.target, onclick: () => { $('audit-target').value = r.target; filterAudit(); } })),
    el('td', { class: 'detail', text: r.detail || '' }),
    el('td', {}, el('code', { text: r.event_id })))));
}

function filterAudit() {
  state.audit = { action: $('audit-action').value.trim(), target: $('audit-target').value.trim() };
  load('audit');
}

// --- live updates ------------------------------------------------------------------------

const live = { controller: null, retries: 0, retry: null, poll: null };

function setLive(on) {
  const badge = $('live');
  badge.hidden = false;
  badge.className = `live ${on ? 'on' : 'off'}`;
  badge.textContent = on ? 'live' : 'reconnecting; refreshing every 5 s';
  badge.title = on ? 'Views refresh as events arrive.' : 'The event stream is down; the open view is read again every 5 seconds.';
  if (on && live.poll) {
    clearInterval(live.poll);
    live.poll = null;
  } else if (!on && !live.poll) {
    live.poll = setInterval(() => invalidate([state.view]), POLL_MS);
  }
}

function dispatch(event, data) {
  let body = {};
  try { body = JSON.parse(data); } catch { body = {}; }
  if (event === 'ready') {
    live.retries = 0;
    setLive(true);
    // Whatever happened while the stream was down.
    invalidate(VIEWS);
  } else if (event === 'changed') {
    invalidate((body.topics || VIEWS).flatMap((t) => TOPIC_VIEWS[t] || []));
  }
}

async function connect() {
  const controller = new AbortController();
  live.controller = controller;
  const opened = Date.now();
  let ended = false;
  try {
    const response = await fetch('/api/v1/events/stream', {
      headers: { Authorization: `Bearer ${state.token}`, Accept: 'text/event-stream' }, cache: 'no-store', signal: controller.signal,
    });
    if (response.status === 401) return signOut('The server no longer accepts this token (unknown, revoked or expired). Sign in again.');
    if (!response.ok || !response.body) throw new Error(`the event stream answered ${response.status}`);
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = '';
    let event = 'message';
    let data = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done) {
        ended = true;
        break;
      }
      buffer += value;
      const got = buffer.split(/\r?\n/);
      buffer = got.pop();
      for (const line of got) {
        if (line === '') {
          if (data.length) dispatch(event, data.join('\n'));
          event = 'message';
          data = [];
        } else if (!line.startsWith(':')) {
          const colon = line.indexOf(':');
          const name = colon < 0 ? line : line.slice(0, colon);
          const text = colon < 0 ? '' : line.slice(colon + 1).replace(/^ /, '');
          if (name === 'event') event = text;
          else if (name === 'data') data.push(text);
        }
      }
    }
  } catch (e) {
    if (controller.signal.aborted) return;
  }
  if (controller.signal.aborted) return;
  // The server ends a stream after a while (to check the token again): go on at once.
  if (ended && live.retries === 0 && Date.now() - opened > 30000) {
    connect();
    return;
  }
  // Down: refresh by polling, and try again later, waiting longer each time.
  setLive(false);
  const wait = Math.min(30000, 1000 * 2 ** live.retries) * (0.75 + Math.random() / 2);
  live.retries = Math.min(live.retries + 1, 5);
  live.retry = setTimeout(connect, wait);
}

// --- signing in and out ------------------------------------------------------------------

async function signIn(token) {
  state.token = token;
  const me = await api('GET', '/auth/whoami');
  state.me = me;
  sessionStorage.setItem(TOKEN_KEY, token);
  $('sign-in').hidden = true;
  $('tabs').hidden = false;
  for (const a of document.querySelectorAll('[data-admin-only]')) a.hidden = !isAdmin();
  const who = $('whoami');
  who.replaceChildren('Signed in as ', el('strong', { text: me.user_id }), ' ', el('span', { class: 'badge role', text: `${me.role} \u00b7 ${me.kind}` }));
  who.hidden = false;
  $('sign-out').hidden = false;
  navigate(location.hash.slice(1));
  connect();
}

function signOut(notice) {
  sessionStorage.removeItem(TOKEN_KEY);
  if (notice) sessionStorage.setItem(NOTICE_KEY, notice);
  if (live.controller) live.controller.abort();
  // A fresh page: nothing of the last user's data stays behind.
  location.replace('/');
}

function start() {
  $('sign-in-form').addEventListener('submit', async (event) => {
    event.preventDefault();
    const error = $('sign-in-error');
    clearError(error);
    const input = $('token');
    try {
      await signIn(input.value.trim());
      input.value = '';
    } catch (e) {
      state.token = null;
      state.me = null;
      showError(error, e.status === 401 ? { message: 'This token is not accepted: unknown, revoked or expired.' } : e);
    }
  });
  $('sign-out').addEventListener('click', () => signOut());
  window.addEventListener('hashchange', () => { if (state.me) navigate(location.hash.slice(1)); });
  $('audit-filter').addEventListener('submit', (event) => { event.preventDefault(); filterAudit(); });
  $('audit-filter').addEventListener('reset', () => setTimeout(filterAudit));
  setupLaunch();
  setupWebhooks();
  setupPolicy();
  const notice = sessionStorage.getItem(NOTICE_KEY);
  if (notice) {
    sessionStorage.removeItem(NOTICE_KEY);
    showError($('sign-in-error'), { message: notice });
  }
  const saved = sessionStorage.getItem(TOKEN_KEY);
  if (saved) signIn(saved).catch(() => { state.token = null; state.me = null; sessionStorage.removeItem(TOKEN_KEY); });
}

start();
