// quota-ledger operator console.
//
// Plain ES2020 scripts, no framework and no build step: index.html holds the static
// markup of every page, and this script shows the page the hash route names, calls the
// service's documented HTTP API with the bearer token, and renders answers with DOM calls
// (never innerHTML, so no string from the service is ever parsed as markup). Charts are
// SVG built here. The Content-Security-Policy forbids inline styles, so sizes are set
// through the CSSOM (`el.style.width = ...`) and everything else through classes.
//
// Pages (hash routes):
//   #/policies                          list, create, edit (If-Match), enable/disable, delete;
//                                       the editor tries a policy on the last N days unsaved
//   #/lookup?action=A&subject=S&attributes[k]=v   usage of every policy of A for S
//   #/ledger?subject=&action=&kind=&from=&to=     the ledger, newest first, cursor paging
//   #/today?hours=24&action=A           charges, denials and amounts per hour
//   #/keys                              API keys: list, create (the secret shown once), revoke
//   #/webhooks?deliveries=ID            webhook endpoints: list, create (the secret shown once),
//                                       enable/disable, rotate the secret, send a test, delete;
//                                       and one endpoint's deliveries (in webhooks.js)
//
// A page kept in a script of its own (webhooks.js, loaded after this one) registers itself
// with `registerPage`; this script starts once every script has loaded (DOMContentLoaded).
//
// Sign-in takes the admin token or an API key with `admin:read`. GET /admin/whoami says
// whether it may change anything; when it may not, the console is read-only: a marker on
// the bar, and no control that would change something (static ones carry `data-change`
// and are hidden; row buttons are not built).
'use strict';

// ---------------------------------------------------------------------------
// Constants and small helpers
// ---------------------------------------------------------------------------

/** Where the token (or API key) is kept: this tab's session storage, nothing else. */
const TOKEN_KEY = 'quota-ledger.admin-token';

/** The API's root: the path the console is served under, less `/console/...`. */
const API_BASE = window.location.pathname.replace(/\/console(\/[^/]*)?$/, '');

/** Give up on a request after this long. */
const REQUEST_TIMEOUT_MS = 20000;

/** Fields the service sets itself; a PUT or POST must not carry them. */
const SERVER_FIELDS = ['created_at', 'updated_at', 'version'];

/** The template of a new policy. */
const NEW_POLICY = {
  id: '',
  action: '',
  measure: 'count',
  limit: 10,
  window: { type: 'calendar', period: 'day', timezone: 'UTC' },
  mode: 'enforce',
  enabled: true,
  ledger_denials: false,
  record: 'entries',
};

const $ = (selector, root = document) => root.querySelector(selector);
const $$ = (selector, root = document) => Array.from(root.querySelectorAll(selector));

/**
 * Creates an HTML element. `props`: `class`, `dataset` (an object), `text`, `on<event>`
 * (a listener), or any attribute (`true` sets it empty; null, undefined and false skip
 * it). Children are nodes or strings (strings become text, never markup).
 */
function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  setProps(el, props);
  append(el, children);
  return el;
}

/** Creates an SVG element, with the same `props` and children as `h`. */
function svg(tag, props = {}, ...children) {
  const el = document.createElementNS('http://www.w3.org/2000/svg', tag);
  setProps(el, props);
  append(el, children);
  return el;
}

function setProps(el, props) {
  for (const [key, value] of Object.entries(props)) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'style') throw new Error('style attributes are blocked by the CSP; use a class');
    if (key === 'dataset') Object.assign(el.dataset, value);
    else if (key === 'text') el.textContent = value;
    else if (key.startsWith('on') && typeof value === 'function') {
      el.addEventListener(key.slice(2), value);
    } else el.setAttribute(key, value === true ? '' : String(value));
  }
}

/** Replaces an element's children (with `h`'s rules: nulls skipped, arrays flattened). */
function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

/** An integer for reading, with the browser's digit grouping. */
function fmtInt(n) {
  return typeof n === 'number' && Number.isFinite(n) ? n.toLocaleString() : String(n);
}

/** A duration in seconds as the largest whole unit: `86400` is `1 d`. */
function fmtSeconds(s) {
  // Days from two on: "any 24 h" reads better than "any 1 d".
  for (const [unit, size] of [['d', 86400], ['h', 3600], ['min', 60]]) {
    if (s >= (unit === 'd' ? 2 * size : size) && s % size === 0) return `${s / size} ${unit}`;
  }
  return `${s} s`;
}

const LOCAL_TIME = new Intl.DateTimeFormat(undefined, {
  year: 'numeric', month: 'short', day: '2-digit',
  hour: '2-digit', minute: '2-digit', second: '2-digit', timeZoneName: 'short',
});
const LOCAL_HOUR = new Intl.DateTimeFormat(undefined, { hour: '2-digit', minute: '2-digit' });

/** An RFC 3339 instant in the browser's time zone (the text itself if unparseable). */
function localTime(iso) {
  const d = new Date(iso);
  return Number.isNaN(d.getTime()) ? iso : LOCAL_TIME.format(d);
}

/** An RFC 3339 UTC instant as the service wrote it, made readable: `2026-11-26 20:00:00 UTC`. */
function utcTime(iso) {
  return String(iso).replace('T', ' ').replace(/Z$/, ' UTC');
}

/** A <time> showing local time, with UTC in its title (hover) and its datetime. */
function timeEl(iso) {
  return h('time', { datetime: iso, title: utcTime(iso) }, localTime(iso));
}

/** `2026-11-26T10:30` (a datetime-local value, local time) as RFC 3339 UTC. */
function localInputToIso(value) {
  const d = new Date(value); // a date-time without offset is local time
  if (Number.isNaN(d.getTime())) throw new Error(`"${value}" is not a date and time`);
  return d.toISOString().replace('.000Z', 'Z');
}

/** RFC 3339 as a datetime-local value in the browser's time zone ('' if unparseable). */
function isoToLocalInput(iso) {
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return '';
  const p = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())}` +
    `T${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

/** A budget (`{"subject": "u-1"}`) for reading: `subject=u-1`, or `whole action`. */
function budgetLabel(budget) {
  const entries = Object.entries(budget || {});
  return entries.length === 0 ? 'whole action' : entries.map(([k, v]) => `${k}=${v}`).join(', ');
}

/** A small status word with a symbol, so that no state is told by colour alone. */
function badge(kind, text) {
  return h('span', { class: `badge badge-${kind}` }, text);
}

/** Percent-encodes one path segment. */
const seg = encodeURIComponent;

// ---------------------------------------------------------------------------
// Messages: #message (role=alert) for errors, #status (role=status) for progress
// ---------------------------------------------------------------------------

function clearMessage() {
  $('#message').replaceChildren();
}

function setStatus(text) {
  $('#status').textContent = text || '';
}

/** Shows an error: a context line, then the problem's title, detail and fields verbatim. */
function showError(context, err) {
  const problem = err instanceof ApiError ? err.problem : null;
  const box = $('#message');
  fill(box,
    h('p', { class: 'message-head' }, '✕ ', context),
    problem
      ? h('p', {},
        h('strong', {}, problem.title || 'Error'),
        err.status ? ` (HTTP ${err.status})` : '',
        problem.detail ? `: ${problem.detail}` : '')
      : h('p', {}, err && err.message ? err.message : String(err)),
    problem && Array.isArray(problem.errors) && problem.errors.length
      ? h('ul', { class: 'field-list' },
        problem.errors.map((e) => h('li', {}, h('code', {}, e.field), `: ${e.message}`)))
      : null,
  );
  setStatus('');
}

/** Reports a failed call, unless it already ended the session (a 401). */
function report(context, err) {
  if (err instanceof ApiError && err.sessionEnded) return;
  showError(context, err);
  if (!(err instanceof ApiError)) console.error(err);
}

/**
 * Shows a 422's field errors next to the fields they name. `resolve(field)` returns the
 * error element for a field path, or null; unresolved ones go to `fallback`.
 */
function showFieldErrors(err, resolve, fallback) {
  const errors = err instanceof ApiError && err.problem && Array.isArray(err.problem.errors)
    ? err.problem.errors : [];
  const leftover = [];
  for (const e of errors) {
    const target = resolve(e.field);
    if (target) {
      target.append(h('span', { class: 'field-error-line' }, `✕ ${e.message}`));
      const control = document.querySelector(`[aria-describedby~="${target.id}"]`);
      if (control) control.setAttribute('aria-invalid', 'true');
    } else leftover.push(e);
  }
  if (fallback && leftover.length) {
    fallback.append(...leftover.map((e) =>
      h('span', { class: 'field-error-line' }, '✕ ', h('code', {}, e.field), `: ${e.message}`)));
  }
}

/** Empties the field errors inside `root` and clears aria-invalid. */
function clearFieldErrors(root) {
  for (const el of $$('.field-error', root)) el.replaceChildren();
  for (const el of $$('[aria-invalid]', root)) el.removeAttribute('aria-invalid');
}

// ---------------------------------------------------------------------------
// The API
// ---------------------------------------------------------------------------

/** A call that did not answer 2xx: `status` (0: no answer) and the problem it carried. */
class ApiError extends Error {
  constructor(status, problem) {
    super(`${problem.title}${problem.detail ? `: ${problem.detail}` : ''}`);
    this.status = status;
    this.problem = problem;
    this.sessionEnded = false;
  }
}

function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

/**
 * Calls the API: `query` (URLSearchParams), `body` (sent as JSON), `headers`, and
 * `token` to use instead of the session's (at sign-in). Resolves to `{status, data,
 * etag}`; rejects with ApiError. A 401 outside sign-in ends the session.
 */
async function api(method, path, { query, body, headers = {}, token: given } = {}) {
  const qs = query ? query.toString() : '';
  const init = {
    method,
    headers: {
      Accept: 'application/json, application/problem+json',
      Authorization: `Bearer ${given || token() || ''}`,
      ...headers,
    },
    cache: 'no-store',
    credentials: 'omit', // there are no cookies; the bearer token is the only credential
    redirect: 'error',
  };
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers['Content-Type'] = 'application/json';
  }
  const controller = new AbortController();
  const timer = setTimeout(() => controller.abort(), REQUEST_TIMEOUT_MS);
  init.signal = controller.signal;
  let res;
  let data;
  try {
    res = await fetch(`${API_BASE}${path}${qs ? `?${qs}` : ''}`, init);
    data = await readBody(res);
  } catch (e) {
    if (res && res.ok) {
      throw new ApiError(res.status, { title: 'Unreadable answer', detail: `HTTP ${res.status}: ${e.message}` });
    } else if (res) data = null; // an error whose body did not parse: judged by its status
    else {
      const detail = e.name === 'AbortError'
        ? `no answer within ${REQUEST_TIMEOUT_MS / 1000} s`
        : `the service could not be reached (${e.message})`;
      throw new ApiError(0, { title: 'Network error', detail });
    }
  } finally {
    clearTimeout(timer);
  }
  if (!res.ok) {
    const problem = data && typeof data === 'object' && data.title
      ? data
      : { title: res.statusText || `HTTP ${res.status}`, detail: typeof data === 'string' ? data : '' };
    const err = new ApiError(res.status, problem);
    if (res.status === 401 && !given) {
      err.sessionEnded = true;
      signOut('The service refused the token or key (401): it may have been revoked or have expired. Sign in again.');
    }
    throw err;
  }
  return { status: res.status, data, etag: res.headers.get('ETag') };
}

async function readBody(res) {
  if (res.status === 204) return null;
  const type = res.headers.get('Content-Type') || '';
  if (type.includes('json')) return res.json();
  return res.text();
}

/** The policies, all pages (the service answers them in one today). */
async function fetchPolicies(query = new URLSearchParams()) {
  const items = [];
  let cursor = null;
  for (let pages = 0; pages < 100; pages += 1) {
    const q = new URLSearchParams(query);
    if (cursor) q.set('cursor', cursor);
    const { data } = await api('GET', '/admin/policies', { query: q });
    items.push(...data.items);
    cursor = data.next_cursor;
    if (!cursor) break;
  }
  return items;
}

// ---------------------------------------------------------------------------
// Sign in and out
// ---------------------------------------------------------------------------

/**
 * Who is signed in, from GET /admin/whoami (`kind`, `name`, `may_change`), or null while
 * signed out or not yet known. Never the token itself.
 */
let signedIn = null;

/** Whether the signed-in token may change anything (only the admin token may). */
const mayChange = () => Boolean(signedIn && signedIn.may_change);

async function signIn(event) {
  event.preventDefault();
  const input = $('#token');
  const given = input.value.trim();
  clearMessage();
  if (!given) {
    showError('Sign-in', new Error('Enter the admin token or an API key.'));
    input.focus();
    return;
  }
  const button = $('#sign-in');
  button.disabled = true;
  setStatus('Checking the token…');
  let known;
  try {
    // Asking who the token is proves it, and tells whether it may change anything.
    known = (await api('GET', '/admin/whoami', { token: given })).data;
  } catch (err) {
    if (err.status === 401) showError('Wrong token: the service refused it.', err);
    else if (err.status === 403) showError('This API key may not use the console: it needs the admin:read operation.', err);
    else showError('Could not sign in.', err);
    input.select();
    return;
  } finally {
    button.disabled = false;
  }
  sessionStorage.setItem(TOKEN_KEY, given);
  input.value = '';
  setStatus('Signed in.');
  enterConsole(known);
}

/** Forgets the token, empties every page (no data stays on screen) and shows sign-in. */
function signOut(reason) {
  sessionStorage.removeItem(TOKEN_KEY);
  signedIn = null;
  applyAccess();
  closeEditor();
  hideSecret();
  for (const sel of ['#policies-table tbody', '#ledger-table tbody', '#top-denied tbody',
    '#lookup-result', '#today', '#today-range', '#actions-list', '#lookup-attrs', '#keys-table tbody']) {
    $(sel).replaceChildren();
  }
  for (const forget of pageHooks.signOut) forget();
  policiesCache = [];
  clearMessage();
  if (reason) showError(reason, new Error('You are signed out.'));
  setStatus(reason ? '' : 'Signed out.');
  showSignIn();
}

function showSignIn() {
  $('#nav').hidden = true;
  $('#sign-out').hidden = true;
  showPage('signin');
  $('#token').focus();
}

/**
 * Opens the console for the stored token: `known` is who it is (from sign-in), else it is
 * asked first, so that a read-only key never sees a control it may not use. When the
 * answer does not come, the console is read-only: the safe side.
 */
async function enterConsole(known) {
  let failure = null;
  if (known) signedIn = known;
  else {
    setStatus('Checking who is signed in…');
    try {
      signedIn = (await api('GET', '/admin/whoami')).data;
    } catch (err) {
      if (err.sessionEnded) return; // signed out already
      signedIn = { kind: 'unknown', name: null, may_change: false };
      failure = err;
    }
  }
  applyAccess();
  $('#nav').hidden = false;
  $('#sign-out').hidden = false;
  if (!parseRoute().known) window.history.replaceState(null, '', '#/policies');
  route();
  if (failure) report('Could not tell who is signed in, so the console is read-only until it is reloaded.', failure);
}

/** Shows or hides what changes something, and the read-only marker, for `signedIn`. */
function applyAccess() {
  const readOnly = !mayChange();
  for (const el of $$('[data-change]')) el.hidden = readOnly;
  const marker = $('#read-only');
  marker.hidden = !signedIn || signedIn.may_change;
  marker.textContent = signedIn && !signedIn.may_change
    ? `Read-only: ${signedIn.kind === 'api_key' ? `API key ${signedIn.name}` : 'could not tell who is signed in'}`
    : '';
  marker.title = 'Reading only: the controls that would change something are not shown.';
  if (readOnly) closeEditor();
}

// ---------------------------------------------------------------------------
// Routing
// ---------------------------------------------------------------------------

const PAGES = {
  policies: renderPolicies,
  lookup: renderLookup,
  ledger: renderLedger,
  today: renderToday,
  keys: renderKeys,
};

/** What the pages of other scripts run when any route is shown, and on sign-out. */
const pageHooks = { leave: [], signOut: [] };

/**
 * Adds a page kept in a script of its own: `render(params)` shows it; `leave()` runs on
 * every route (so that a secret shown once never outlives its page); `signOut()` empties
 * what it showed.
 */
function registerPage(name, { render, leave, signOut: onSignOut }) {
  PAGES[name] = render;
  if (leave) pageHooks.leave.push(leave);
  if (onSignOut) pageHooks.signOut.push(onSignOut);
}

/** Bumped by every route: an answer that arrives for an older one is dropped. */
let generation = 0;
let currentPage = null;

/** The page and parameters of the current hash: `#/lookup?action=sms&subject=u-1`. */
function parseRoute() {
  const match = /^#\/([a-z]+)(?:\?(.*))?$/.exec(window.location.hash);
  if (!match || !PAGES[match[1]]) {
    return { page: 'policies', params: new URLSearchParams(), known: false };
  }
  return { page: match[1], params: new URLSearchParams(match[2] || ''), known: true };
}

/** The hash of a page with parameters (empty ones left out). */
function pageHash(page, params = new URLSearchParams()) {
  const kept = new URLSearchParams();
  for (const [k, v] of params) if (v !== '') kept.append(k, v);
  const qs = kept.toString();
  return `#/${page}${qs ? `?${qs}` : ''}`;
}

/** Goes to a page; going to the current hash again reloads it. */
function go(page, params) {
  const hash = pageHash(page, params);
  if (window.location.hash === hash) route();
  else window.location.hash = hash;
}

function route() {
  if (!token()) {
    showSignIn();
    return;
  }
  if (!signedIn) return; // enterConsole routes once it knows who is signed in
  hideSecret(); // a new key's secret never outlives its page
  for (const leave of pageHooks.leave) leave();
  const { page, params } = parseRoute();
  generation += 1;
  const changed = page !== currentPage;
  showPage(page);
  clearMessage();
  setStatus('');
  for (const link of $$('#nav a')) {
    if (link.id === `nav-${page}`) link.setAttribute('aria-current', 'page');
    else link.removeAttribute('aria-current');
  }
  // A new page moves the focus to its heading, as a page load would.
  if (changed) $(`#${page}-title`).focus();
  PAGES[page](params);
}

function showPage(page) {
  currentPage = page === 'signin' ? null : page;
  for (const section of $$('section.page')) section.hidden = section.id !== `page-${page}`;
  document.title = page === 'signin'
    ? 'Sign in · quota-ledger console'
    : `${$(`#${page}-title`).textContent} · quota-ledger console`;
}

/** True when the route that started at `gen` is no longer shown. */
const stale = (gen) => gen !== generation;

// ---------------------------------------------------------------------------
// Policies page
// ---------------------------------------------------------------------------

/** The last policy list read, for the action suggestions and the lookup's scopes. */
let policiesCache = [];

function renderPolicies() {
  loadPolicies();
}

async function loadPolicies() {
  const gen = generation;
  setStatus('Loading policies…');
  try {
    const items = await fetchPolicies();
    if (stale(gen)) return;
    rememberPolicies(items);
    fill($('#policies-table tbody'), ...items.map(policyRow));
    $('#policies-empty').hidden = items.length > 0;
    setStatus(`${items.length} ${items.length === 1 ? 'policy' : 'policies'}.`);
  } catch (err) {
    if (!stale(gen)) report('Could not load the policies.', err);
  }
}

/** Keeps the list and offers its actions in every action input. */
function rememberPolicies(items) {
  policiesCache = items;
  const actions = [...new Set(items.map((p) => p.action))].sort();
  fill($('#actions-list'), ...actions.map((a) => h('option', { value: a })));
}

const MONTHS = ['January', 'February', 'March', 'April', 'May', 'June', 'July', 'August',
  'September', 'October', 'November', 'December'];

/** `1st`, `2nd`, `3rd`, `4th`, ... `11th`, ... `21st`. */
function ordinal(n) {
  const teen = n % 100 >= 11 && n % 100 <= 13;
  return `${n}${teen ? 'th' : ({ 1: 'st', 2: 'nd', 3: 'rd' })[n % 10] || 'th'}`;
}

const capitalized = (text) => text.charAt(0).toUpperCase() + text.slice(1);

/**
 * Where a calendar period starts, in words, from its anchors (absent ones are the
 * defaults: Monday, 00:00, the 1st, January): ` from 04:00`, `, weeks from Sunday`,
 * ` from the 15th`, ` from the 15th of April at 04:00`; '' for the plain calendar.
 */
function anchorText(w) {
  const at = w.day_start && w.day_start !== '00:00' ? w.day_start : null;
  const day = w.month_day && w.month_day !== 1 ? w.month_day : null;
  const month = w.year_month && w.year_month !== 1 ? MONTHS[w.year_month - 1] || `month ${w.year_month}` : null;
  switch (w.period) {
    case 'day':
      return at ? ` from ${at}` : '';
    case 'week':
      return w.week_start || at
        ? `, weeks from ${capitalized(w.week_start || 'monday')}${at ? ` ${at}` : ''}` : '';
    case 'month':
      if (!day && !at) return '';
      return ` from the ${ordinal(day || 1)}${at ? ` at ${at}` : ''}`;
    case 'year':
      if (!day && !month && !at) return '';
      return ` from ${day ? `the ${ordinal(day)} of ` : ''}${month || 'January'}${at ? ` at ${at}` : ''}`;
    default:
      return '';
  }
}

function windowText(w) {
  if (!w || typeof w !== 'object') return '?';
  switch (w.type) {
    case 'calendar':
      return `per calendar ${w.period}${anchorText(w)} (${w.timezone || 'UTC'}` +
        `${w.timezone_attribute ? `, or the zone in attribute ${w.timezone_attribute}` : ''})`;
    case 'rolling':
      return `any ${fmtSeconds(w.seconds)} (rolling, ${fmtSeconds(w.bucket_seconds)} buckets)`;
    case 'token_bucket':
      return `per ${fmtSeconds(w.seconds)}, refilled smoothly (token bucket)`;
    case 'request':
      return 'per request (a maximum per request)';
    case 'lifetime':
      return 'lifetime (never resets)';
    default:
      return JSON.stringify(w);
  }
}

function scopeText(p) {
  const scope = p.scope || ['subject'];
  const parts = [scope.length ? `one per ${scope.join(' + ')}` : 'one for the whole action'];
  for (const [key, values] of Object.entries(p.match || {})) {
    parts.push(`only ${key} in ${[].concat(values).join(', ')}`);
  }
  for (const [key, values] of Object.entries(p.match_not || {})) {
    parts.push(`only ${key} not in ${[].concat(values).join(', ')}`);
  }
  return parts.join('; ');
}

function policyRow(p) {
  const button = (action, text, label, onclick, cls = 'secondary') => h('button', {
    type: 'button', class: `small ${cls}`, dataset: { action }, 'aria-label': label, onclick,
  }, text);
  return h('tr', { dataset: { policyId: p.id, enabled: String(p.enabled) } },
    h('th', { scope: 'row' },
      h('span', { class: 'mono' }, p.id),
      p.description ? h('div', { class: 'muted small' }, p.description) : null),
    h('td', {}, h('span', { class: 'mono' }, p.action)),
    h('td', { class: 'num' }, fmtInt(p.limit),
      h('div', { class: 'muted small' }, p.unit ? `${p.measure} · ${p.unit}` : p.measure),
      alertsText(p.alert_thresholds)
        ? h('div', { class: 'small', dataset: { alerts: p.alert_thresholds.join(',') } }, alertsText(p.alert_thresholds))
        : null),
    h('td', {}, windowText(p.window)),
    h('td', {}, scopeText(p)),
    h('td', {},
      p.mode === 'shadow' ? badge('warn', '◐ Shadow: never denies') : 'Enforce',
      p.ledger_denials ? h('div', { class: 'muted small' }, 'records denials') : null,
      p.record === 'totals' ? h('div', { class: 'muted small' }, 'records totals') : null),
    h('td', { dataset: { status: p.enabled ? 'enabled' : 'disabled' } },
      p.enabled ? badge('ok', '● Enabled') : badge('off', '○ Disabled')),
    // Read-only: the buttons that change the policy are not built at all.
    h('td', { class: 'row-actions' },
      mayChange() ? button('edit', 'Edit', `Edit ${p.id}`, () => openEditor(p.id)) : null,
      mayChange() ? button('toggle', p.enabled ? 'Disable' : 'Enable',
        `${p.enabled ? 'Disable' : 'Enable'} ${p.id}`, (e) => toggleEnabled(p.id, e.currentTarget)) : null,
      h('a', {
        class: 'button small secondary', 'aria-label': `Activity of ${p.action}`,
        href: pageHash('today', new URLSearchParams({ action: p.action })),
      }, 'Activity'),
      mayChange() ? button('delete', 'Delete', `Delete ${p.id}`, () => deletePolicy(p), 'danger') : null));
}

/** A policy as it can be sent back: without the fields the service sets. */
function editable(policy) {
  const copy = { ...policy };
  for (const f of SERVER_FIELDS) delete copy[f];
  return copy;
}

/** An ETag for a version when an answer carried none (the version is the ETag). */
const etagOf = (res, version) => res.etag || `"${version}"`;

/** Flips `enabled` with a fresh read and If-Match, so no one else's change is undone. */
async function toggleEnabled(id, button) {
  button.disabled = true;
  clearMessage();
  try {
    const current = await api('GET', `/admin/policies/${seg(id)}`);
    const body = editable(current.data);
    body.enabled = !current.data.enabled;
    const saved = await api('PUT', `/admin/policies/${seg(id)}`, {
      body, headers: { 'If-Match': etagOf(current, current.data.version) },
    });
    setStatus(`${saved.data.enabled ? 'Enabled' : 'Disabled'} ${id} (version ${saved.data.version}).`);
  } catch (err) {
    if (err.status === 412) report(`${id} changed while it was being toggled; the list is reloaded, try again.`, err);
    else report(`Could not ${button.textContent.toLowerCase()} ${id}.`, err);
  } finally {
    button.disabled = false;
  }
  await loadPolicies();
}

async function deletePolicy(p) {
  const ok = await confirmDialog('Delete policy?',
    `Delete ${p.id} (action ${p.action}) and its overrides? Consumes stop being checked ` +
    'against it at once. This cannot be undone.', 'Delete');
  if (!ok) return;
  clearMessage();
  try {
    // The version shown in the list: a policy changed since is not deleted unseen.
    await api('DELETE', `/admin/policies/${seg(p.id)}`, { headers: { 'If-Match': `"${p.version}"` } });
    setStatus(`Deleted ${p.id}.`);
  } catch (err) {
    if (err.status === 412) report(`${p.id} changed since the list was loaded; review it and delete again.`, err);
    else report(`Could not delete ${p.id}.`, err);
  }
  await loadPolicies();
}

/** A modal yes/no question; resolves true when confirmed. Escape or Cancel: false. */
function confirmDialog(title, text, okLabel) {
  const dialog = $('#confirm-dialog');
  $('#confirm-title').textContent = title;
  $('#confirm-text').textContent = text;
  $('#confirm-ok').textContent = okLabel;
  return new Promise((resolve) => {
    dialog.returnValue = '';
    dialog.addEventListener('close', () => resolve(dialog.returnValue === 'ok'), { once: true });
    dialog.showModal();
    $('#confirm-cancel').focus(); // the safe choice first
  });
}

// ----- The policy editor -----------------------------------------------------
//
// The JSON textarea is the policy that is sent. Each form control with `data-path`
// edits one field of it (and is refilled when the JSON is edited and parses). On a 412
// the editor keeps the user's JSON, reads the current policy and shows the fields that
// differ, with a choice to save the user's version over it or to start from it.

const editor = {
  mode: 'new', // 'new' (POST) or 'edit' (PUT)
  id: null, // the policy edited
  etag: null, // If-Match for the PUT
  base: null, // the policy as it was read (without server fields)
  version: null, // its version
  theirs: null, // on a conflict: {policy, etag, version} read after the 412
};

const controls = () => $$('#policy-form [data-path]');

function readJson() {
  try {
    return { value: JSON.parse($('#policy-json').value) };
  } catch (e) {
    return { error: e.message };
  }
}

function writeJson(obj) {
  $('#policy-json').value = JSON.stringify(obj, null, 2);
}

function getPath(obj, path) {
  return path.split('.').reduce((o, k) => (o && typeof o === 'object' ? o[k] : undefined), obj);
}

/** Sets a dotted path (creating objects on the way); `undefined` deletes the field. */
function setPath(obj, path, value) {
  const keys = path.split('.');
  let o = obj;
  for (const k of keys.slice(0, -1)) {
    if (!o[k] || typeof o[k] !== 'object' || Array.isArray(o[k])) o[k] = {};
    o = o[k];
  }
  const last = keys[keys.length - 1];
  if (value === undefined) delete o[last];
  else o[last] = value;
}

/**
 * A `match`-style map (`{key: [value, ...]}`) from its text, one key per line:
 * `country = NG, GH`. Blank lines are skipped; a line without `=` is a key with no value
 * (the service answers which); empty, undefined (the field is left out).
 */
function mapFromText(text) {
  const map = {};
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    const eq = line.indexOf('=');
    const key = (eq < 0 ? line : line.slice(0, eq)).trim();
    const values = eq < 0 ? [] : line.slice(eq + 1).split(',').map((v) => v.trim()).filter((v) => v !== '');
    map[key] = (map[key] || []).concat(values);
  }
  return Object.keys(map).length ? map : undefined;
}

/** The text of a `match`-style map: `country = NG, GH`, one line per key. */
function mapText(map) {
  if (!map || typeof map !== 'object') return '';
  return Object.entries(map).map(([key, values]) => `${key} = ${[].concat(values).join(', ')}`).join('\n');
}

/**
 * Percents (`alert_thresholds`) from their text, comma-separated: `80, 100` (a `%` after
 * a number is allowed). Whole numbers become numbers; anything else is sent as written,
 * for the service to name (`alert_thresholds[1]`). Empty: undefined (the field is left out).
 */
function percentsFromText(text) {
  const items = text.split(',').map((t) => t.trim().replace(/\s*%$/, '')).filter((t) => t !== '');
  return items.length ? items.map((t) => (/^\d+$/.test(t) ? Number(t) : t)) : undefined;
}

/** The text of percents: `80, 100`. */
function percentsText(percents) {
  return Array.isArray(percents) ? percents.join(', ') : '';
}

/** `alerts at 80%, 100%` for a policy's thresholds; '' when it has none. */
function alertsText(percents) {
  return Array.isArray(percents) && percents.length ? `alerts at ${percents.map((p) => `${p}%`).join(', ')}` : '';
}

/** A control's value for the JSON: a number for whole numbers, undefined when empty. */
function controlValue(el) {
  if (el.dataset.type === 'bool') return el.checked;
  const text = el.value.trim();
  if (text === '') return undefined;
  if (el.dataset.type === 'int') return /^\d+$/.test(text) ? Number(text) : text;
  if (el.dataset.type === 'map') return mapFromText(text);
  if (el.dataset.type === 'percents') return percentsFromText(text);
  return text;
}

/** Refills every control from the policy JSON, and shows the window type's fields. */
function fillControls(obj) {
  for (const el of controls()) {
    const value = getPath(obj, el.dataset.path);
    if (el.dataset.type === 'bool') el.checked = value === undefined ? el.dataset.default === 'true' : Boolean(value);
    else if (el.dataset.type === 'map') el.value = mapText(value);
    else if (el.dataset.type === 'percents') el.value = percentsText(value);
    else if (el.tagName === 'SELECT') {
      // Absent: the service's default if it has one (`data-default=""`: the empty choice
      // that stands for it), else no choice shown (it is required).
      if (value !== undefined && value !== null) el.value = String(value);
      else if ('default' in el.dataset) el.value = el.dataset.default;
      else el.selectedIndex = -1;
    }
    else el.value = value === undefined || value === null ? '' : String(value);
  }
  showWindowFields();
}

/** One line on each window type, under its select. */
const WINDOW_HINTS = {
  calendar: 'Usage resets when each period starts, in the time zone.',
  rolling: 'The total in any trailing window stays within the limit.',
  token_bucket: 'The limit refills smoothly over the window.',
  request: 'A maximum per request: one over the limit is denied; nothing accumulates (usage shows 0).',
  lifetime: 'Usage never resets; the service must keep its ledger for ever (QUOTA_LEDGER_RETENTION_DAYS=forever).',
};

/** Whether a field marked `data-period` is one the calendar `period` takes. */
const takesPeriod = (el, period) => el.dataset.period.split(' ').includes(period);

/** Shows the window type's fields, and of a calendar's anchors those its period takes. */
function showWindowFields() {
  const type = $('#policy-window-type').value;
  const period = $('#policy-window-period').value;
  for (const el of $$('#policy-form [data-window]')) {
    el.hidden = !el.dataset.window.split(' ').includes(type) ||
      (el.dataset.period !== undefined && !takesPeriod(el, period));
  }
  $('#policy-window-type-hint').textContent = WINDOW_HINTS[type] || '';
}

/** The anchor controls (`window.day_start`, ...) with whether `period` takes each. */
function anchorControls(period) {
  return $$('#policy-form [data-period]').map((field) => ({
    control: $('[data-path]', field), taken: takesPeriod(field, period),
  }));
}

/** A new window of `type`, from the window fields (with defaults where empty). */
function windowFromControls(type) {
  const v = (id, fallback) => controlValue($(id)) ?? fallback;
  if (type === 'calendar') {
    const w = { type, period: v('#policy-window-period', 'day'), timezone: v('#policy-window-timezone', 'UTC') };
    for (const { control, taken } of anchorControls(w.period)) {
      if (taken) setPath(w, control.dataset.path.replace(/^window\./, ''), controlValue(control));
    }
    return w;
  }
  if (type === 'rolling') {
    return { type, seconds: v('#policy-window-seconds', 86400), bucket_seconds: v('#policy-window-bucket-seconds', 3600) };
  }
  if (type === 'token_bucket') return { type, seconds: v('#policy-window-seconds', 3600) };
  return { type }; // request, lifetime: nothing more
}

/** A control changed: write it into the JSON. */
function onControlInput(event) {
  const el = event.target;
  if (!el.dataset || !el.dataset.path) return;
  const parsed = readJson();
  const error = $('#policy-json-error');
  if (parsed.error || !parsed.value || typeof parsed.value !== 'object') {
    fill(error, h('span', { class: 'field-error-line' },
      '✕ The JSON is not valid, so the fields cannot change it: fix the JSON first.'));
    return;
  }
  const obj = parsed.value;
  if (el.dataset.path === 'window.type') {
    obj.window = windowFromControls(el.value);
    writeJson(obj);
    fillControls(obj);
  } else if (el.dataset.path === 'window.period') {
    // The anchors the new period does not take would be a 422: they go.
    setPath(obj, 'window.period', controlValue(el));
    for (const { control, taken } of anchorControls(el.value)) {
      if (!taken) setPath(obj, control.dataset.path, undefined);
    }
    writeJson(obj);
    fillControls(obj);
  } else {
    setPath(obj, el.dataset.path, controlValue(el));
    writeJson(obj);
  }
  error.replaceChildren();
}

/** The JSON changed: refill the controls when it parses. */
function onJsonInput() {
  const parsed = readJson();
  if (!parsed.error && parsed.value && typeof parsed.value === 'object') {
    fillControls(parsed.value);
    $('#policy-json-error').replaceChildren();
  }
}

function openNewEditor() {
  Object.assign(editor, { mode: 'new', id: null, etag: null, base: null, version: null, theirs: null });
  showEditor(structuredClone(NEW_POLICY), 'New policy',
    'Fill in the fields, or paste a whole policy as JSON below.');
  $('#policy-id').focus();
}

async function openEditor(id) {
  clearMessage();
  setStatus(`Reading ${id}…`);
  try {
    const res = await api('GET', `/admin/policies/${seg(id)}`);
    const policy = editable(res.data);
    Object.assign(editor, {
      mode: 'edit', id, etag: etagOf(res, res.data.version), base: policy,
      version: res.data.version, theirs: null,
    });
    showEditor(policy, `Edit ${id}`,
      `Version ${res.data.version}, last changed ${localTime(res.data.updated_at)}. ` +
      'Saving fails safely if someone else changes it meanwhile.');
    setStatus('');
    $('#policy-action').focus();
  } catch (err) {
    report(`Could not read ${id}.`, err);
  }
}

function showEditor(policy, title, hint) {
  const form = $('#policy-form');
  clearFieldErrors(form);
  hideConflict();
  writeJson(policy);
  fillControls(policy);
  $('#policy-id').readOnly = editor.mode === 'edit';
  $('#editor-title').textContent = title;
  $('#editor-hint').textContent = hint;
  $('#policy-save').textContent = editor.mode === 'edit' ? 'Save changes' : 'Create policy';
  resetBacktest();
  $('#policy-editor').hidden = false;
}

function closeEditor() {
  $('#policy-editor').hidden = true;
  hideConflict();
  resetBacktest();
  editor.theirs = null;
}

/**
 * Which error element shows a server error about `field` (e.g. `window.timezone`; a map's
 * key or value, `match_not.country[0]`, at the map's control; a list's entry,
 * `alert_thresholds[1]`, at the list's).
 */
function policyFieldError(field) {
  const el = controls().find((c) => c.dataset.path === field) ||
    controls().find((c) => ['map', 'percents'].includes(c.dataset.type) &&
      /^[.[]/.test(field.slice(c.dataset.path.length)) && field.startsWith(c.dataset.path)) ||
    (field === 'window' ? $('#policy-window-type') : null);
  return el && !el.closest('[hidden]') ? $(`#${el.id}-error`) : null;
}

/**
 * The policy the editor holds, without the server's fields; null (the error shown at the
 * JSON editor) when its text is not a JSON object. Saving and trying read it alike.
 */
function formPolicy() {
  const parsed = readJson();
  if (parsed.error || !parsed.value || typeof parsed.value !== 'object' || Array.isArray(parsed.value)) {
    $('#policy-json-error').append(h('span', { class: 'field-error-line' },
      `✕ Not a JSON object: ${parsed.error || 'expected { ... }'}`));
    $('#policy-json').setAttribute('aria-invalid', 'true');
    $('#policy-json').focus();
    return null;
  }
  return editable(parsed.value);
}

async function savePolicy(event) {
  if (event) event.preventDefault();
  const form = $('#policy-form');
  clearFieldErrors(form);
  clearMessage();
  const body = formPolicy();
  if (!body) return;
  const button = $('#policy-save');
  button.disabled = true;
  try {
    if (editor.mode === 'new') {
      const res = await api('POST', '/admin/policies', { body });
      setStatus(`Created ${res.data.id}.`);
    } else {
      const res = await api('PUT', `/admin/policies/${seg(editor.id)}`, {
        body, headers: { 'If-Match': editor.etag },
      });
      setStatus(`Saved ${res.data.id} (version ${res.data.version}).`);
    }
    closeEditor();
    await loadPolicies();
  } catch (err) {
    if (err.status === 412 && editor.mode === 'edit') {
      await showConflict(body, err);
    } else {
      report(editor.mode === 'new' ? 'The policy was not created.' : `${editor.id} was not saved.`, err);
      showFieldErrors(err, policyFieldError, $('#policy-json-error'));
      const first = $('#policy-form [aria-invalid="true"]');
      if (first) first.focus();
    }
  } finally {
    button.disabled = false;
  }
}

/** Every leaf of a policy by dotted path, as JSON text (arrays and `{}` are leaves). */
function flatten(obj, prefix = '', out = {}) {
  for (const [k, v] of Object.entries(obj || {})) {
    const path = prefix ? `${prefix}.${k}` : k;
    if (v && typeof v === 'object' && !Array.isArray(v) && Object.keys(v).length) flatten(v, path, out);
    else out[path] = JSON.stringify(v);
  }
  return out;
}

/** A 412: read the policy as it is now and show how it differs from the user's. */
async function showConflict(mine, err) {
  let current;
  try {
    current = await api('GET', `/admin/policies/${seg(editor.id)}`);
  } catch (readErr) {
    report(`${editor.id} was changed by someone else, and reading it again failed.`, readErr);
    return;
  }
  editor.theirs = {
    policy: editable(current.data), etag: etagOf(current, current.data.version),
    version: current.data.version,
  };
  showError(`${editor.id} was not saved: someone else changed it meanwhile.`, err);

  const base = flatten(editor.base);
  const theirs = flatten(editor.theirs.policy);
  const yours = flatten(mine);
  const paths = [...new Set([...Object.keys(theirs), ...Object.keys(yours)])].sort();
  const shown = (v) => (v === undefined ? '(not set)' : v);
  const rows = paths.filter((p) => theirs[p] !== yours[p]).map((p) => {
    const byThem = base[p] !== theirs[p];
    const byYou = base[p] !== yours[p];
    const who = byThem && byYou ? 'both of you' : byThem ? 'them' : 'you';
    return h('tr', { dataset: { field: p } },
      h('th', { scope: 'row' }, h('code', {}, p)),
      h('td', { dataset: { side: 'base' } }, h('code', {}, shown(base[p]))),
      h('td', { dataset: { side: 'theirs' } }, h('code', {}, shown(theirs[p]))),
      h('td', { dataset: { side: 'yours' } }, h('code', {}, shown(yours[p]))),
      h('td', {}, who));
  });

  const panel = $('#policy-conflict');
  fill(panel,
    h('h3', { id: 'conflict-title', tabindex: '-1' }, '⚠ Someone else changed this policy'),
    h('p', {}, `You started from version ${editor.version}; the service now has version ` +
      `${editor.theirs.version}. Nothing of yours was saved. ` +
      (rows.length ? 'The fields where their version and yours differ:' : 'Their version and yours are now the same.')),
    rows.length ? h('div', { class: 'table-wrap' }, h('table', { class: 'diff' },
      h('thead', {}, h('tr', {},
        h('th', { scope: 'col' }, 'Field'),
        h('th', { scope: 'col' }, `You started from (v${editor.version})`),
        h('th', { scope: 'col' }, `Now on the service (v${editor.theirs.version})`),
        h('th', { scope: 'col' }, 'Yours (not saved)'),
        h('th', { scope: 'col' }, 'Changed by'))),
      h('tbody', {}, rows))) : null,
    h('div', { class: 'form-actions' },
      h('button', { id: 'conflict-reapply', type: 'button', onclick: reapplyMine },
        `Save mine over version ${editor.theirs.version}`),
      h('button', { id: 'conflict-load-theirs', type: 'button', class: 'secondary', onclick: loadTheirs },
        'Discard mine, edit theirs')));
  panel.hidden = false;
  $('#conflict-title').focus();
  loadPolicies(); // the list shows the new version too
}

function hideConflict() {
  const panel = $('#policy-conflict');
  panel.hidden = true;
  panel.replaceChildren();
}

/** Saves the user's JSON again, now over the version read after the conflict. */
function reapplyMine() {
  const { policy, etag, version } = editor.theirs;
  Object.assign(editor, { etag, base: policy, version, theirs: null });
  hideConflict();
  savePolicy();
}

/** Drops the user's changes and edits the current version instead. */
function loadTheirs() {
  const { policy, etag, version } = editor.theirs;
  Object.assign(editor, { etag, base: policy, version, theirs: null });
  showEditor(policy, `Edit ${editor.id}`, `Version ${version}, as the service has it now.`);
  clearMessage();
  $('#policy-action').focus();
}

// ----- Trying the policy on the recorded past ----------------------------------
//
// "Try" sends the policy as it is in the form (the JSON, as a save would send it) to
// POST /admin/backtest with the last N days, and shows what it would have done to the
// ledger's recorded requests of its action. Nothing is saved. An answer that arrives after
// the editor was opened again, closed or tried again is dropped.

/** Bumped by every try and every editor open or close: older answers are dropped. */
let backtestRun = 0;

/** Field errors of the backtest that the days control shows (`from` follows from it). */
const BACKTEST_FIELDS = ['days', 'from', 'to'];

/** Empties and hides the result (a new policy in the editor, or the editor closed). */
function resetBacktest() {
  backtestRun += 1;
  const result = $('#backtest-result');
  result.hidden = true;
  result.replaceChildren();
  $('#backtest-days-error').replaceChildren();
  $('#backtest-days').removeAttribute('aria-invalid');
  $('#backtest-run').disabled = false;
}

/** The form changed after a try: the result shown is no longer the form's. */
function markBacktestStale() {
  const result = $('#backtest-result');
  if (result.hidden || $('#backtest-stale', result)) return;
  result.prepend(h('p', { id: 'backtest-stale', class: 'notice' },
    '⚠ The policy changed in the form since it was tried: Try again for its answer.'));
}

async function runBacktest() {
  const form = $('#policy-form');
  clearFieldErrors(form);
  clearMessage();
  const daysInput = $('#backtest-days');
  const daysText = daysInput.value.trim();
  if (!/^\d+$/.test(daysText) || Number(daysText) < 1 || Number(daysText) > 31) {
    $('#backtest-days-error').append(h('span', { class: 'field-error-line' }, '✕ A whole number of days, 1 to 31.'));
    daysInput.setAttribute('aria-invalid', 'true');
    daysInput.focus();
    return;
  }
  const days = Number(daysText);
  const policy = formPolicy();
  if (!policy) return;
  backtestRun += 1;
  const run = backtestRun;
  const button = $('#backtest-run');
  const result = $('#backtest-result');
  button.disabled = true;
  result.setAttribute('aria-busy', 'true');
  setStatus(`Trying ${policy.id || 'the policy'} on the last ${days} ${days === 1 ? 'day' : 'days'}…`);
  try {
    const { data } = await api('POST', '/admin/backtest', { body: { policies: [policy], days } });
    if (run !== backtestRun) return;
    const outcome = data.policies[0];
    fill(result, backtestResult(outcome, data, days, policy));
    result.hidden = false;
    setStatus(`Tried ${outcome.policy_id} on the last ${days} ${days === 1 ? 'day' : 'days'}: ` +
      `${outcome.denied} denied, ${outcome.newly_denied} newly. Nothing was saved.`);
  } catch (err) {
    if (run !== backtestRun) return;
    result.hidden = true;
    result.replaceChildren();
    report(err.status === 409
      ? 'Another backtest is running on this instance: try again when it is done.'
      : 'The policy could not be tried (nothing was saved).', err);
    if (err instanceof ApiError && Array.isArray(err.problem.errors)) {
      // `policies[0].limit` is the form's `limit`; `days` (and `from`, which it sets) the days'.
      const renamed = new ApiError(err.status, {
        ...err.problem,
        errors: err.problem.errors.map((e) => ({ ...e, field: String(e.field).replace(/^policies\[0\]\./, '') })),
      });
      showFieldErrors(renamed,
        (field) => (BACKTEST_FIELDS.includes(field) ? $('#backtest-days-error') : policyFieldError(field)),
        $('#policy-json-error'));
    }
    const first = $('#policy-form [aria-invalid="true"]');
    if (first) first.focus();
  } finally {
    if (run === backtestRun) {
      button.disabled = false;
      result.removeAttribute('aria-busy');
    }
  }
}

/** One figure of a backtest: a term, its number, and a note under it. */
function backtestFigure(key, term, value, note) {
  return h('div', { class: 'figure', dataset: { figure: key } },
    h('dt', {}, term),
    h('dd', {}, h('span', { class: 'figure-value' }, fmtInt(value)), note ? h('span', { class: 'muted small figure-note' }, note) : null));
}

/** The answer for the one policy tried: its figures, its peak and the budgets it denied most. */
function backtestResult(o, data, days, policy) {
  const shadow = policy.mode === 'shadow';
  const unit = policy.unit ? ` ${policy.unit}` : '';
  return [
    h('h4', { id: 'backtest-result-title' },
      `${o.policy_id}${typeof policy.limit === 'number' ? ` with limit ${fmtInt(policy.limit)}${unit}` : ''}` +
      ` on the last ${days} ${days === 1 ? 'day' : 'days'}`),
    h('p', { class: 'muted small' },
      timeEl(data.from), ' to ', timeEl(data.to), ` · ${fmtInt(data.entries)} ledger ` +
      `${data.entries === 1 ? 'entry' : 'entries'} replayed · not saved`),
    o.requests === 0
      ? h('p', { class: 'empty' }, `No recorded request of ${policy.action || 'this action'} ` +
        'in this span that the policy applies to.')
      : null,
    o.in_totals > 0
      ? h('p', { class: 'muted', id: 'backtest-in-totals' }, `${fmtInt(o.in_totals)} ` +
        `${o.in_totals === 1 ? 'request' : 'requests'} of this action were recorded in the ledger's totals ` +
        '(policies with record: totals), not as entries: a backtest cannot replay them.')
      : null,
    h('dl', { class: 'figures', 'aria-labelledby': 'backtest-result-title' },
      backtestFigure('requests', 'Requests', o.requests, 'it applied to'),
      backtestFigure('denied', shadow ? 'Would deny (shadow)' : 'Denied', o.denied, null),
      backtestFigure('newly_denied', 'Newly denied', o.newly_denied, 'allowed when made'),
      backtestFigure('newly_allowed', 'Newly allowed', o.newly_allowed, [
        'denied when made. Only policies with ', h('code', {}, 'ledger_denials'),
        ' record their denials: a request denied by one without it left no trace, so it is not counted here.'])),
    o.peak
      ? h('p', { dataset: { peak: budgetLabel(o.peak.budget) } }, h('strong', {}, 'Peak: '),
        `budget ${budgetLabel(o.peak.budget)}, `,
        h('span', { class: 'mono' }, `${fmtInt(o.peak.used)} of ${fmtInt(o.peak.limit)}`), `${unit} used`)
      : h('p', { dataset: { peak: '' } }, h('strong', {}, 'Peak: '), 'nothing was charged.'),
    o.top_denied.length
      ? h('div', { class: 'table-wrap' }, h('table', { id: 'backtest-top-denied', class: 'compact' },
        h('caption', {}, `Budgets ${shadow ? 'it would deny' : 'denied'} most (at most 10)`),
        h('thead', {}, h('tr', {},
          h('th', { scope: 'col' }, 'Budget'), h('th', { scope: 'col', class: 'num' }, 'Denied'))),
        h('tbody', {}, o.top_denied.map((d) => h('tr', { dataset: { budget: budgetLabel(d.budget) } },
          h('td', {}, budgetLabel(d.budget)), h('td', { class: 'num' }, fmtInt(d.denied)))))))
      : h('p', { class: 'muted' }, 'No budget denied.'),
  ];
}

// ---------------------------------------------------------------------------
// Budget lookup page
// ---------------------------------------------------------------------------

let attrRowCount = 0;

/** Adds a key/value row to the lookup's attributes. */
function addAttrRow(key = '', value = '') {
  attrRowCount += 1;
  const n = attrRowCount;
  const row = h('div', { class: 'attr-row' },
    h('div', { class: 'field' },
      h('label', { for: `attr-key-${n}` }, 'Key'),
      h('input', { id: `attr-key-${n}`, class: 'attr-key', value: key, spellcheck: 'false', placeholder: 'country' })),
    h('div', { class: 'field' },
      h('label', { for: `attr-value-${n}` }, 'Value'),
      h('input', { id: `attr-value-${n}`, class: 'attr-value', value, spellcheck: 'false', placeholder: 'NG' })));
  row.append(h('button', {
    type: 'button', class: 'small secondary', 'aria-label': `Remove attribute row ${n}`,
    onclick: () => { row.remove(); $('#lookup-add-attr').focus(); },
  }, 'Remove'));
  $('#lookup-attrs').append(row);
  return row;
}

/** The attributes in the form: [[key, value], ...], rows with both empty left out. */
function formAttrs() {
  return $$('#lookup-attrs .attr-row')
    .map((row) => [$('.attr-key', row).value.trim(), $('.attr-value', row).value])
    .filter(([k, v]) => k !== '' || v !== '');
}

/** Attributes in a query: `attributes[country]=NG` parameters. */
function attrsOf(params) {
  const out = [];
  for (const [k, v] of params) {
    const m = /^attributes\[(.*)\]$/.exec(k);
    if (m) out.push([m[1], v]);
  }
  return out;
}

function lookupParams(action, subject, attrs = []) {
  const q = new URLSearchParams({ action, subject });
  for (const [k, v] of attrs) q.append(`attributes[${k}]`, v);
  return q;
}

function submitLookup(event) {
  event.preventDefault();
  go('lookup', lookupParams($('#lookup-action').value.trim(), $('#lookup-subject').value, formAttrs()));
}

function renderLookup(params) {
  const action = params.get('action') || '';
  const subject = params.get('subject') || '';
  const attrs = attrsOf(params);
  $('#lookup-action').value = action;
  $('#lookup-subject').value = subject;
  $('#lookup-attrs').replaceChildren();
  for (const [k, v] of attrs) addAttrRow(k, v);
  clearFieldErrors($('#lookup-form'));
  if (!policiesCache.length) fetchPolicies().then(rememberPolicies, () => {});
  if (!action || !subject) {
    fill($('#lookup-result'), h('p', { class: 'empty' },
      'Enter an action and a subject to see their usage of every policy.'));
    return;
  }
  runLookup(action, subject, attrs);
}

/** The override segment that names a budget (README: "Overrides name a budget"). */
function budgetKey(budget, scope) {
  if (!scope.length) return '*';
  const values = scope.map((k) => String(budget[k] ?? ''));
  if (values.length === 1) return values[0];
  return values.map((v) => v.replace(/%/g, '%25').replace(/,/g, '%2C')).join(',');
}

async function runLookup(action, subject, attrs) {
  const gen = generation;
  const result = $('#lookup-result');
  result.setAttribute('aria-busy', 'true');
  setStatus(`Looking up ${action} for ${subject}…`);
  try {
    const [usage, policies] = await Promise.all([
      api('GET', '/quota/usage', { query: lookupParams(action, subject, attrs) }),
      fetchPolicies(new URLSearchParams({ action })).catch(() => []),
    ]);
    // Each policy's overrides; a failure shows in its card, not instead of the usage.
    const overrides = await Promise.all(usage.data.policies.map((u) =>
      api('GET', `/admin/policies/${seg(u.policy_id)}/overrides`).then((r) => r.data.items, (e) => e)));
    if (stale(gen)) return;
    const byId = new Map(policies.map((p) => [p.id, p]));
    const ledgerLink = h('a', {
      id: 'lookup-ledger-link', class: 'button secondary',
      href: pageHash('ledger', new URLSearchParams({ subject, action })),
    }, 'Ledger for this subject');
    const cards = usage.data.policies.map((u, i) => usageCard(u, byId.get(u.policy_id), overrides[i]));
    fill(result,
      h('div', { class: 'result-head' },
        h('h2', {}, h('span', { class: 'mono' }, usage.data.action), ' for ',
          h('span', { class: 'mono' }, usage.data.subject)),
        ledgerLink),
      h('p', { class: 'muted' }, 'As of ', timeEl(new Date().toISOString()),
        attrs.length ? ` · attributes ${attrs.map(([k, v]) => `${k}=${v}`).join(', ')}` : ''),
      ...(cards.length ? cards : [h('p', { class: 'empty' },
        `No enabled policy of ${action} applies to this request: it is allowed without limit.`)]));
    setStatus(`${cards.length} ${cards.length === 1 ? 'policy' : 'policies'} for ${action}.`);
  } catch (err) {
    if (stale(gen)) return;
    const notFound = err.status === 404;
    fill(result, h('p', { class: 'empty' },
      notFound ? `✕ Not found: ${err.problem.detail || `no policies for action ${action}`}`
        : '✕ The lookup failed; see the message above.'));
    report(notFound ? `Unknown action ${action}.` : `The lookup of ${action} for ${subject} failed.`, err);
    showFieldErrors(err, (field) => {
      if (field === 'action' || field === 'subject') return $(`#lookup-${field}-error`);
      return field.startsWith('attributes') ? $('#lookup-attrs-error') : null;
    });
  } finally {
    result.removeAttribute('aria-busy');
  }
}

/** One policy's usage: a bar, the numbers, when it resets, and its overrides. */
function usageCard(u, policy, overrides) {
  if (policy && policy.window && policy.window.type === 'request') return requestCard(u, policy, overrides);
  const pct = u.limit > 0 ? Math.min(100, (u.used / u.limit) * 100) : 100;
  let state = ['ok', '✓ Within the limit'];
  if (u.remaining === 0) state = ['full', u.mode === 'shadow' ? '✕ Exhausted (shadow: not enforced)' : '✕ Exhausted'];
  else if (pct >= 80) state = ['near', '! Near the limit'];
  const fill = h('div', { class: `meter-fill meter-${state[0]}` });
  fill.style.width = `${pct.toFixed(2)}%`; // CSSOM, allowed by the CSP (an attribute is not)
  const unit = policy && policy.unit ? ` ${policy.unit}` : '';
  const scope = policy ? policy.scope : Object.keys(u.budget || {});
  const key = budgetKey(u.budget || {}, scope);

  return h('article', { class: 'card usage', dataset: { usagePolicy: u.policy_id } },
    h('div', { class: 'usage-head' },
      h('h3', {}, h('span', { class: 'mono' }, u.policy_id)),
      u.mode === 'shadow' ? badge('warn', '◐ Shadow') : null,
      badge(state[0], state[1])),
    h('p', { class: 'muted small' },
      `${u.measure} · budget ${budgetLabel(u.budget)}`,
      policy ? ` · ${windowText(policy.window)}` : ''),
    h('div', {
      class: 'meter', role: 'progressbar', 'aria-label': `${u.policy_id} usage`,
      'aria-valuemin': 0, 'aria-valuemax': u.limit, 'aria-valuenow': u.used,
      'aria-valuetext': `${u.used} of ${u.limit} used, ${u.remaining} remaining`,
    }, fill),
    h('p', { class: 'usage-numbers' },
      h('strong', {}, `${fmtInt(u.used)} / ${fmtInt(u.limit)}`),
      ` (${fmtInt(u.remaining)} remaining)${unit}`),
    u.resets_at
      ? h('p', { class: 'small', dataset: { resets: 'at' } }, 'Resets ', timeEl(u.resets_at),
        h('span', { class: 'muted' }, ` · ${utcTime(u.resets_at)}`))
      : h('p', { class: 'small', dataset: { resets: 'never' } }, 'Never resets (a lifetime window).'),
    overridesBlock(u, overrides, key));
}

/**
 * A per-request maximum's card: nothing accumulates, so no meter and no reset, only the
 * largest request allowed.
 */
function requestCard(u, policy, overrides) {
  const unit = policy.unit ? ` ${policy.unit}` : '';
  return h('article', { class: 'card usage', dataset: { usagePolicy: u.policy_id, window: 'request' } },
    h('div', { class: 'usage-head' },
      h('h3', {}, h('span', { class: 'mono' }, u.policy_id)),
      u.mode === 'shadow' ? badge('warn', '◐ Shadow') : null,
      badge('ok', '↦ Per-request maximum')),
    h('p', { class: 'muted small' },
      `${u.measure} · budget ${budgetLabel(u.budget)} · ${windowText(policy.window)}`),
    h('p', { class: 'usage-numbers' },
      'Each request may use at most ', h('strong', {}, fmtInt(u.limit)), unit,
      '; a larger one is denied. Nothing accumulates, so there is no usage to show.'),
    overridesBlock(u, overrides, budgetKey(u.budget || {}, policy.scope || Object.keys(u.budget || {}))));
}

function overridesBlock(u, overrides, key) {
  if (overrides instanceof Error) {
    return h('p', { class: 'small' }, `✕ Overrides could not be read: ${overrides.message}`);
  }
  if (!overrides || !overrides.length) return h('p', { class: 'muted small' }, 'Overrides: none.');
  const now = Date.now();
  return h('details', { class: 'overrides', open: overrides.some((o) => o.subject === key) },
    h('summary', {}, `Overrides (${overrides.length})`),
    h('table', {},
      h('thead', {}, h('tr', {},
        ['Budget', 'Limit', 'Expires', 'Note', 'Here'].map((t) => h('th', { scope: 'col' }, t)))),
      h('tbody', {}, overrides.map((o) => {
        const expired = o.expires_at && new Date(o.expires_at).getTime() <= now;
        const here = o.subject === key;
        return h('tr', { dataset: { overrideBudget: o.subject } },
          h('td', {}, h('code', {}, o.subject)),
          h('td', { class: 'num' }, fmtInt(o.limit)),
          h('td', {}, o.expires_at ? [timeEl(o.expires_at), expired ? ' (expired)' : ''] : 'never'),
          h('td', {}, o.note || ''),
          h('td', {}, here ? (expired ? '○ this budget, expired' : '✓ applies to this budget') : ''));
      }))));
}

// ---------------------------------------------------------------------------
// Ledger page
// ---------------------------------------------------------------------------

/** Cursor paging: `cursors[i]` fetches page i (null: the newest); `next` is older. */
const ledgerPaging = { key: null, cursors: [null], page: 0, next: null };

const LEDGER_FILTERS = ['subject', 'action', 'kind', 'from', 'to', 'limit'];

function submitLedger(event) {
  event.preventDefault();
  clearFieldErrors($('#ledger-form'));
  const params = new URLSearchParams();
  for (const name of ['subject', 'action', 'kind', 'limit']) {
    const value = $(`#ledger-${name}`).value;
    params.set(name, name === 'subject' ? value : value.trim());
  }
  for (const name of ['from', 'to']) {
    const value = $(`#ledger-${name}`).value;
    if (!value) continue;
    try {
      params.set(name, localInputToIso(value));
    } catch (e) {
      $(`#ledger-${name}-error`).append(h('span', { class: 'field-error-line' }, `✕ ${e.message}`));
      return;
    }
  }
  ledgerPaging.key = null; // the same filters again: back to the newest page
  go('ledger', params);
}

function renderLedger(params) {
  $('#ledger-subject').value = params.get('subject') || '';
  $('#ledger-action').value = params.get('action') || '';
  $('#ledger-kind').value = params.get('kind') || '';
  const limit = $('#ledger-limit');
  const size = params.get('limit') || '50';
  if (![...limit.options].some((o) => o.value === size)) limit.append(h('option', { value: size }, size));
  limit.value = size;
  $('#ledger-from').value = params.get('from') ? isoToLocalInput(params.get('from')) : '';
  $('#ledger-to').value = params.get('to') ? isoToLocalInput(params.get('to')) : '';
  clearFieldErrors($('#ledger-form'));
  const key = params.toString();
  if (ledgerPaging.key !== key) Object.assign(ledgerPaging, { key, cursors: [null], page: 0, next: null });
  loadLedger(params);
}

async function loadLedger(params) {
  const gen = generation;
  const query = new URLSearchParams();
  for (const name of LEDGER_FILTERS) if (params.get(name)) query.set(name, params.get(name));
  if (!query.has('limit')) query.set('limit', '50');
  const cursor = ledgerPaging.cursors[ledgerPaging.page];
  if (cursor) query.set('cursor', cursor);
  const table = $('#ledger-table');
  table.setAttribute('aria-busy', 'true');
  setStatus('Loading the ledger…');
  try {
    const { data } = await api('GET', '/quota/ledger', { query });
    if (stale(gen)) return;
    fill($('#ledger-table tbody'), ...data.items.map(ledgerRow));
    $('#ledger-empty').hidden = data.items.length > 0;
    const totals = data.policies_recording_totals || [];
    $('#ledger-totals').hidden = totals.length === 0;
    $('#ledger-totals').textContent = totals.length === 0 ? '' :
      `Not listed one by one: consumes charging only ${totals.join(', ')} (record: totals), ` +
      "which are kept in the ledger's totals.";
    ledgerPaging.next = data.next_cursor;
    setStatus(`${data.items.length} ${data.items.length === 1 ? 'entry' : 'entries'} on page ${ledgerPaging.page + 1}.`);
  } catch (err) {
    if (stale(gen)) return;
    $('#ledger-table tbody').replaceChildren();
    ledgerPaging.next = null;
    report('Could not read the ledger.', err);
    showFieldErrors(err, (field) => $(`#ledger-${field}-error`));
  } finally {
    table.removeAttribute('aria-busy');
  }
  $('#ledger-older').disabled = !ledgerPaging.next;
  $('#ledger-newer').disabled = ledgerPaging.page === 0;
  $('#ledger-page').textContent = `Page ${ledgerPaging.page + 1}`;
}

function ledgerPage(step) {
  if (step > 0) {
    if (!ledgerPaging.next) return;
    ledgerPaging.cursors[ledgerPaging.page + 1] = ledgerPaging.next;
  } else if (ledgerPaging.page === 0) return;
  ledgerPaging.page += step;
  generation += 1;
  loadLedger(parseRoute().params);
}

const KIND_BADGES = {
  charge: ['ok', '+ charge'],
  refund: ['info', '− refund'],
  hold: ['warn', '⏸ hold'],
  commit: ['ok', '✓ commit'],
  release: ['info', '↺ release'],
  expire: ['info', '⌛ expire'],
  deny: ['full', '✕ deny'],
};

function ledgerRow(e) {
  const [cls, text] = KIND_BADGES[e.kind] || ['off', e.kind];
  const attrs = Object.entries(e.attributes || {});
  return h('tr', { dataset: { entryId: e.id, kind: e.kind, consumptionId: e.consumption_id || '' } },
    h('td', {}, timeEl(e.at)),
    h('td', {}, badge(cls, text)),
    h('td', {}, h('span', { class: 'mono' }, e.action)),
    h('td', {},
      h('a', { href: pageHash('lookup', lookupParams(e.action, e.subject, attrs)), title: 'Budget lookup' }, e.subject),
      attrs.length ? h('div', { class: 'muted small' }, attrs.map(([k, v]) => `${k}=${v}`).join(', ')) : null),
    h('td', { class: 'num' }, fmtInt(e.amount)),
    h('td', { class: 'mono small' },
      e.consumption_id || (e.hold_id ? '' : '—'),
      e.hold_id ? h('div', {}, `hold ${e.hold_id}`) : null,
      e.idempotency_key ? h('div', { class: 'muted' }, `key ${e.idempotency_key}`) : null),
    h('td', {}, h('ul', { class: 'plain' }, (e.policies || []).map((p) =>
      h('li', { title: `budget ${budgetLabel(p.budget)}` }, h('span', { class: 'mono' }, p.policy_id), `: ${fmtInt(p.amount)}`)))));
}

// ---------------------------------------------------------------------------
// Today page: activity per hour, as SVG charts
// ---------------------------------------------------------------------------

function submitToday(event) {
  event.preventDefault();
  go('today', new URLSearchParams({ hours: $('#today-hours').value, action: $('#today-action').value.trim() }));
}

async function renderToday(params) {
  const gen = generation;
  const hours = params.get('hours') || '24';
  const action = params.get('action') || '';
  $('#today-hours').value = hours;
  $('#today-action').value = action;
  const query = new URLSearchParams({ hours });
  if (action) query.set('action', action);
  const container = $('#today');
  container.setAttribute('aria-busy', 'true');
  setStatus('Loading activity…');
  try {
    const { data } = await api('GET', '/admin/activity', { query });
    if (stale(gen)) return;
    $('#today-range').textContent =
      `${data.hours} hours from ${localTime(data.from)} to ${localTime(data.to)} ` +
      `(${utcTime(data.from)} to ${utcTime(data.to)}).`;
    fill(container, ...(data.actions.length
      ? data.actions.map((a, i) => activitySection(a, i))
      : [h('p', { class: 'empty' }, 'No activity in this span.')]));
    const top = data.top_denied || [];
    fill($('#top-denied tbody'), ...top.map((d) => h('tr', {},
      h('td', {}, h('span', { class: 'mono' }, d.action)),
      h('td', {}, d.subject),
      h('td', { class: 'num' }, fmtInt(d.denials)),
      h('td', {},
        h('a', { href: pageHash('lookup', lookupParams(d.action, d.subject)) }, 'Budget lookup'), ' · ',
        h('a', { href: pageHash('ledger', new URLSearchParams({ subject: d.subject, action: d.action, kind: 'deny' })) },
          'Denials in the ledger')))));
    $('#top-denied-empty').hidden = top.length > 0;
    setStatus(`Activity of ${data.actions.length} ${data.actions.length === 1 ? 'action' : 'actions'}.`);
  } catch (err) {
    if (stale(gen)) return;
    container.replaceChildren();
    $('#top-denied tbody').replaceChildren();
    report('Could not read the activity.', err);
  } finally {
    container.removeAttribute('aria-busy');
  }
}

const sum = (items, key) => items.reduce((total, item) => total + (item[key] || 0), 0);

/** One action: totals, a charges/denials chart, an amount chart and the numbers as a table. */
function activitySection(activity, index) {
  const hours = activity.hours || [];
  const totals = { charges: sum(hours, 'charges'), denials: sum(hours, 'denials'), amount: sum(hours, 'amount') };
  const total = (key) => h('span', { class: 'total', dataset: { total: key } }, String(totals[key]));
  return h('section', { class: 'card activity', dataset: { activityAction: activity.action } },
    h('h2', {}, h('span', { class: 'mono' }, activity.action)),
    h('p', { class: 'totals' }, 'charges ', total('charges'), ' · denials ', total('denials'),
      ' · amount ', total('amount')),
    barChart({
      id: `chart-${index}-events`,
      title: `${activity.action}: charges and denials per hour`,
      hours,
      series: [
        { key: 'charges', label: 'Charges (solid)', noun: ['charge', 'charges'], cls: 'bar-charges' },
        { key: 'denials', label: 'Denials (hatched)', noun: ['denial', 'denials'], cls: 'bar-denials', hatch: true },
      ],
    }),
    barChart({
      id: `chart-${index}-amount`,
      title: `${activity.action}: amount per hour (units; minor units for money)`,
      hours,
      series: [{ key: 'amount', label: 'Amount (units)', noun: ['unit', 'units'], cls: 'bar-amount' }],
    }),
    h('details', { class: 'chart-data' },
      h('summary', {}, 'The numbers per hour'),
      h('div', { class: 'table-wrap' }, h('table', {},
        h('thead', {}, h('tr', {},
          ['Hour (local)', 'Hour (UTC)', 'Charges', 'Denials', 'Amount'].map((t) => h('th', { scope: 'col' }, t)))),
        h('tbody', {}, hours.map((hr) => h('tr', {},
          h('td', {}, localTime(hr.hour)),
          h('td', {}, utcTime(hr.hour)),
          h('td', { class: 'num' }, fmtInt(hr.charges)),
          h('td', { class: 'num' }, fmtInt(hr.denials)),
          h('td', { class: 'num' }, fmtInt(hr.amount)))))))));
}

/** The smallest "round" number (1, 2 or 5 times a power of ten) at least `n`, at least 1. */
function niceCeil(n) {
  if (n <= 1) return 1;
  const power = 10 ** Math.floor(Math.log10(n));
  for (const step of [1, 2, 5, 10]) if (step * power >= n) return step * power;
  return 10 * power;
}

/** `20:00–21:00` for an hour starting at `iso`, in local time and in UTC. */
function hourRange(iso) {
  const start = new Date(iso);
  const end = new Date(start.getTime() + 3600 * 1000);
  const utc = (d) => d.toISOString().slice(11, 16);
  return {
    local: `${LOCAL_HOUR.format(start)}–${LOCAL_HOUR.format(end)} local`,
    utc: `${iso.slice(0, 10)} ${utc(start)}–${utc(end)} UTC`,
  };
}

/**
 * A bar chart of `series` (each `{key, label, noun, cls, hatch}`) over `hours`: one group
 * of bars per hour, a y axis from 0 to a round maximum, x labels in local time, a legend
 * naming each series (they differ by fill pattern too, not by colour alone), and a
 * <title> on every bar and every hour with the exact numbers.
 */
function barChart({ id, title, hours, series }) {
  const W = 760;
  const H = 210;
  const m = { left: 52, right: 12, top: 34, bottom: 30 };
  const plotW = W - m.left - m.right;
  const plotH = H - m.top - m.bottom;
  const n = Math.max(hours.length, 1);
  const slot = plotW / n;
  const groupW = slot * 0.8;
  const barW = groupW / series.length;
  const max = niceCeil(Math.max(0, ...hours.flatMap((hr) => series.map((s) => hr[s.key] || 0))));
  const y = (v) => m.top + plotH - (v / max) * plotH;
  const hatchId = `${id}-hatch`;

  const totalsText = series.map((s) => `${sum(hours, s.key)} ${s.noun[1]}`).join(', ');
  const root = svg('svg', {
    class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-labelledby': `${id}-title ${id}-desc`,
  },
  svg('title', { id: `${id}-title` }, title),
  svg('desc', { id: `${id}-desc` }, `${hours.length} hourly bars; in all ${totalsText}. ` +
    'Hover a bar for its numbers, or open "The numbers per hour" below.'),
  svg('defs', {}, svg('pattern', {
    id: hatchId, width: 6, height: 6, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)',
  }, svg('rect', { width: 6, height: 6, class: 'hatch-bg' }), svg('line', { x1: 0, y1: 0, x2: 0, y2: 6, class: 'hatch-line' }))));

  // Grid lines and y labels at 0, half and the maximum.
  for (const v of [0, max / 2, max]) {
    if (!Number.isInteger(v)) continue;
    root.append(
      svg('line', { x1: m.left, x2: W - m.right, y1: y(v), y2: y(v), class: v === 0 ? 'axis' : 'grid' }),
      svg('text', { x: m.left - 6, y: y(v) + 4, class: 'tick', 'text-anchor': 'end' }, fmtInt(v)));
  }

  // Bars, one group per hour.
  const labelEvery = Math.max(1, Math.ceil(n / 8));
  hours.forEach((hr, i) => {
    const range = hourRange(hr.hour);
    const x0 = m.left + i * slot + (slot - groupW) / 2;
    const numbers = series.map((s) => `${hr[s.key] || 0} ${(hr[s.key] || 0) === 1 ? s.noun[0] : s.noun[1]}`).join(', ');
    const group = svg('g', { class: 'hour' },
      // Under the bars: the whole hour answers hover with every number.
      svg('rect', { x: m.left + i * slot, y: m.top, width: slot, height: plotH, class: 'hit' },
        svg('title', {}, `${range.utc} (${range.local}): ${numbers}`)));
    series.forEach((s, j) => {
      const v = hr[s.key] || 0;
      if (v === 0) return;
      const height = Math.max(1.5, (v / max) * plotH); // a small value stays visible
      group.append(svg('rect', {
        x: x0 + j * barW, y: m.top + plotH - height, width: Math.max(1, barW - 1), height,
        class: s.cls, fill: s.hatch ? `url(#${hatchId})` : null,
      }, svg('title', {}, `${range.utc} (${range.local}): ${v} ${v === 1 ? s.noun[0] : s.noun[1]}`)));
    });
    root.append(group);
    if (i % labelEvery === 0) {
      root.append(svg('text', { x: m.left + (i + 0.5) * slot, y: H - m.bottom + 16, class: 'tick', 'text-anchor': 'middle' },
        LOCAL_HOUR.format(new Date(hr.hour))));
    }
  });

  // Legend, top left: a swatch in the series' own fill, and its name.
  let lx = m.left;
  for (const s of series) {
    root.append(
      svg('rect', { x: lx, y: 10, width: 14, height: 14, class: s.cls, fill: s.hatch ? `url(#${hatchId})` : null }),
      svg('text', { x: lx + 20, y: 22, class: 'legend' }, s.label));
    lx += 30 + s.label.length * 7.5;
  }
  return h('figure', { class: 'chart-figure' }, root,
    h('figcaption', { class: 'muted small' }, `${title}. Hours start at the times shown (local time).`));
}

// ---------------------------------------------------------------------------
// API keys page
// ---------------------------------------------------------------------------
//
// A new key's secret is in one answer only. It goes straight from that answer into the
// panel's DOM (no variable, no storage keeps it), and the panel is emptied when it is
// dismissed, on any route (another page, or this one again) and on sign-out.

const KEY_STATES = {
  active: ['ok', '● Active'],
  expired: ['off', '⌛ Expired'],
  revoked: ['full', '✕ Revoked'],
};

function renderKeys() {
  clearFieldErrors($('#key-form'));
  loadKeys();
}

async function loadKeys() {
  const gen = generation;
  setStatus('Loading keys…');
  try {
    const { data } = await api('GET', '/admin/keys');
    if (stale(gen)) return;
    fill($('#keys-table tbody'), ...data.items.map(keyRow));
    $('#keys-empty').hidden = data.items.length > 0;
    setStatus(`${data.items.length} ${data.items.length === 1 ? 'key' : 'keys'}.`);
  } catch (err) {
    if (!stale(gen)) report('Could not load the keys.', err);
  }
}

/** One key as listed: never its secret (the list has none), only its prefix. */
function keyRow(k) {
  const [cls, text] = KEY_STATES[k.state] || ['off', k.state];
  return h('tr', { dataset: { keyId: k.id, state: k.state } },
    h('th', { scope: 'row' }, k.name, h('div', { class: 'muted small mono' }, k.id)),
    h('td', {}, h('span', { class: 'mono' }, `${k.prefix}…`)),
    h('td', {}, h('ul', { class: 'plain' }, k.actions.map((a) => h('li', { class: 'mono' }, a)))),
    h('td', {}, h('ul', { class: 'plain' }, k.operations.map((op) => h('li', { class: 'mono small' }, op)))),
    h('td', { dataset: { status: k.state } }, badge(cls, text),
      k.revoked_at ? h('div', { class: 'muted small' }, timeEl(k.revoked_at)) : null),
    h('td', {}, k.expires_at ? timeEl(k.expires_at) : 'never'),
    h('td', {}, k.last_used_at ? timeEl(k.last_used_at) : 'never'),
    h('td', {}, timeEl(k.created_at)),
    // Read-only: no Revoke button is built.
    h('td', { class: 'row-actions' }, k.state === 'active' && mayChange()
      ? h('button', {
        type: 'button', class: 'small danger', dataset: { action: 'revoke' },
        'aria-label': `Revoke ${k.name}`, onclick: () => revokeKey(k),
      }, 'Revoke')
      : null));
}

/** The create form as a request body (`actions` split at commas); throws on a bad expiry. */
function keyBody() {
  const body = {
    name: $('#key-name').value.trim(),
    actions: $('#key-actions').value.split(',').map((a) => a.trim()).filter((a) => a !== ''),
    operations: $$('#key-operations input:checked').map((el) => el.value),
  };
  const expires = $('#key-expires').value;
  if (expires) body.expires_at = localInputToIso(expires);
  return body;
}

/** Which error element shows a server error about `field`: `actions[1]` is the actions field's. */
function keyFieldError(field) {
  const ids = { name: 'key-name', actions: 'key-actions', operations: 'key-operations', expires_at: 'key-expires' };
  const id = ids[field.replace(/\[\d+\]$/, '')];
  return id ? $(`#${id}-error`) : null;
}

async function createKey(event) {
  event.preventDefault();
  const form = $('#key-form');
  clearFieldErrors(form);
  clearMessage();
  hideSecret();
  let body;
  try {
    body = keyBody();
  } catch (e) {
    $('#key-expires-error').append(h('span', { class: 'field-error-line' }, `✕ ${e.message}`));
    $('#key-expires').setAttribute('aria-invalid', 'true');
    $('#key-expires').focus();
    return;
  }
  const button = $('#key-create');
  button.disabled = true;
  let label;
  try {
    // The answer goes straight to the panel: only a label without the secret is kept.
    label = showSecret((await api('POST', '/admin/keys', { body })).data);
  } catch (err) {
    report('The key was not created.', err);
    showFieldErrors(err, keyFieldError);
    const first = $('#key-form [aria-invalid="true"]');
    if (first) (first.tagName === 'FIELDSET' ? $('input', first) : first).focus();
    return;
  } finally {
    button.disabled = false;
  }
  form.reset();
  await loadKeys();
  setStatus(`Created the key ${label}.`);
}

/** Shows a new key's secret, the one time the service gives it; returns `name (prefix…)`. */
function showSecret(key) {
  const panel = $('#key-secret');
  fill(panel,
    h('h2', { id: 'key-secret-title', tabindex: '-1' }, `⚠ New key ${key.name}: shown once`),
    h('p', { class: 'notice' },
      'Copy it now: only its hash is kept, so neither the service nor this console can show it again.'),
    h('div', { class: 'field' },
      h('label', { for: 'key-secret-value' }, `The API key (${key.prefix}…)`),
      h('input', {
        id: 'key-secret-value', class: 'mono', value: key.key, readonly: true,
        autocomplete: 'off', spellcheck: 'false', onfocus: (e) => e.target.select(),
      })),
    h('p', { class: 'hint' }, 'Send it as ', h('code', {}, 'Authorization: Bearer <key>'), '.'),
    key.closed_quota_endpoints
      ? h('p', { id: 'key-closed-notice', class: 'notice' },
        '⚠ This first key closed the quota endpoints: from now on every /quota/* call needs ' +
        'a client token or an API key.')
      : null,
    h('div', { class: 'form-actions' },
      h('button', { id: 'key-secret-copy', type: 'button', onclick: copySecret }, 'Copy'),
      h('button', { id: 'key-secret-dismiss', type: 'button', class: 'secondary', onclick: dismissSecret },
        'I have copied it: hide it')));
  panel.hidden = false;
  $('#key-secret-title').focus();
  return `${key.name} (${key.prefix}…)`;
}

/** Copies the shown secret, read from the panel, to the clipboard (or leaves it selected). */
async function copySecret() {
  const input = $('#key-secret-value');
  input.select();
  try {
    await navigator.clipboard.writeText(input.value);
    setStatus('The key is on the clipboard.');
  } catch (e) {
    setStatus('The browser did not allow the clipboard: the key is selected, copy it with Ctrl+C.');
  }
}

function dismissSecret() {
  hideSecret();
  setStatus('The key is hidden; it cannot be shown again.');
  $('#key-name').focus();
}

/** Empties and hides the secret's panel: no copy of the secret is left in the page. */
function hideSecret() {
  const panel = $('#key-secret');
  panel.hidden = true;
  panel.replaceChildren();
}

async function revokeKey(k) {
  const ok = await confirmDialog('Revoke key?',
    `Revoke ${k.name} (${k.prefix}…)? Every request with it is refused (401) at once, and ` +
    'by every instance within a second. This cannot be undone: create a new key to replace it.', 'Revoke');
  if (!ok) return;
  clearMessage();
  let revoked = false;
  try {
    await api('DELETE', `/admin/keys/${seg(k.id)}`);
    revoked = true;
  } catch (err) {
    report(`Could not revoke ${k.name}.`, err);
  }
  await loadKeys();
  if (revoked) setStatus(`Revoked ${k.name} (${k.prefix}…).`);
}

// ---------------------------------------------------------------------------
// Start
// ---------------------------------------------------------------------------

function start() {
  $('#signin-form').addEventListener('submit', signIn);
  $('#sign-out').addEventListener('click', () => signOut());
  window.addEventListener('hashchange', route);

  $('#new-policy').addEventListener('click', openNewEditor);
  $('#policies-refresh').addEventListener('click', () => { clearMessage(); loadPolicies(); });
  $('#policy-form').addEventListener('submit', savePolicy);
  $('#policy-form').addEventListener('input', (e) => { if (e.target.id !== 'policy-json') onControlInput(e); });
  $('#policy-form').addEventListener('change', (e) => {
    if (e.target.id !== 'policy-json' && (e.target.tagName === 'SELECT' || e.target.type === 'checkbox')) onControlInput(e);
  });
  $('#policy-json').addEventListener('input', onJsonInput);
  // A change to the policy after a try leaves its answer marked as no longer the form's.
  $('#policy-form').addEventListener('input', (e) => { if (e.target.id !== 'backtest-days') markBacktestStale(); });
  $('#policy-form').addEventListener('change', (e) => { if (e.target.id !== 'backtest-days') markBacktestStale(); });
  $('#backtest-run').addEventListener('click', runBacktest);
  // Enter in the days field tries the policy: it must not submit (save) the form.
  $('#backtest-days').addEventListener('keydown', (e) => {
    if (e.key === 'Enter') { e.preventDefault(); runBacktest(); }
  });
  $('#policy-cancel').addEventListener('click', () => { closeEditor(); clearMessage(); $('#new-policy').focus(); });

  $('#lookup-form').addEventListener('submit', submitLookup);
  $('#lookup-add-attr').addEventListener('click', () => $('.attr-key', addAttrRow()).focus());

  $('#ledger-form').addEventListener('submit', submitLedger);
  $('#ledger-older').addEventListener('click', () => ledgerPage(1));
  $('#ledger-newer').addEventListener('click', () => ledgerPage(-1));

  $('#today-form').addEventListener('submit', submitToday);

  $('#key-form').addEventListener('submit', createKey);
  $('#keys-refresh').addEventListener('click', () => { clearMessage(); loadKeys(); });

  $('#confirm-ok').addEventListener('click', () => $('#confirm-dialog').close('ok'));
  $('#confirm-cancel').addEventListener('click', () => $('#confirm-dialog').close('cancel'));

  // A bug shows on the page, not only in the developer tools.
  window.addEventListener('unhandledrejection', (e) => report('Unexpected error.', e.reason));

  if (token()) enterConsole();
  else showSignIn();
}

// After every deferred script (webhooks.js too) has run and registered its page.
document.addEventListener('DOMContentLoaded', start);
