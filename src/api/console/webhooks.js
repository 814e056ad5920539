// quota-ledger operator console: the webhooks page.
//
//   #/webhooks                  the endpoints (GET /admin/webhooks); with the admin token also
//                               create (the signing secret shown once), enable/disable (PUT),
//                               rotate the secret (the new one shown once), send a test, delete
//   #/webhooks?deliveries=ID    the same, with endpoint ID's deliveries below the list
//
// Loaded after app.js and built on its helpers (h, fill, api, report, showFieldErrors,
// confirmDialog, timeEl, badge, mayChange, stale, go, pageHash); it registers its page
// with registerPage before the console starts. As on the keys page, a signing secret is
// in one answer only: it goes from that answer into the panel's DOM (no variable or
// storage keeps it), and the panel is emptied when dismissed, on any route and on
// sign-out. A read-only session (an admin:read key) reads everything: the change buttons
// of a row are not built, and "New endpoint" (data-change) is hidden.
'use strict';

/** How many deliveries the deliveries view lists (the API allows 1 to 500). */
const DELIVERIES_LIMIT = 100;

/**
 * While a delivery is pending and due within POLL_WITHIN_MS, the deliveries view reads
 * them again every DELIVERIES_POLL_MS: a test sent shows as delivered without a click,
 * and an endpoint retrying hourly is not polled for an hour.
 */
const DELIVERIES_POLL_MS = 2000;
const POLL_WITHIN_MS = 60000;

/** The deliveries view's next read, while it polls. */
let deliveriesTimer = null;

/**
 * A status to show once the page has loaded, after a change that moved to another route
 * (routing clears #status).
 */
let webhooksNote = '';

const webhookPath = (id, rest = '') => `/admin/webhooks/${seg(id)}${rest}`;

function renderWebhooks(params) {
  clearFieldErrors($('#webhook-form'));
  const shown = params.get('deliveries') || '';
  loadWebhooks(shown);
  if (shown) loadDeliveries(shown);
  else hideDeliveries();
}

/** Lists the endpoints; `shown` is the one whose deliveries are open ('' for none). */
async function loadWebhooks(shown = parseRoute().params.get('deliveries') || '') {
  const gen = generation;
  setStatus('Loading webhook endpoints…');
  try {
    const { data } = await api('GET', '/admin/webhooks');
    if (stale(gen)) return;
    fill($('#webhooks-table tbody'), ...data.items.map((w) => webhookRow(w, shown)));
    $('#webhooks-empty').hidden = data.items.length > 0;
    const count = `${data.items.length} ${data.items.length === 1 ? 'endpoint' : 'endpoints'}.`;
    setStatus(webhooksNote || count);
    webhooksNote = '';
  } catch (err) {
    if (!stale(gen)) report('Could not load the webhook endpoints.', err);
  }
}

/** `[]` means all: a list, or the words for all. */
function listOrAll(items, all) {
  return items.length
    ? h('ul', { class: 'plain' }, items.map((item) => h('li', { class: 'mono small' }, item)))
    : h('span', { class: 'muted' }, all);
}

/** An endpoint's state: its name (for data-status) and its badges, in words and symbols. */
function webhookState(w) {
  if (!w.enabled && w.disabled_at) {
    return ['auto-disabled', [badge('full', '✕ Disabled after a day of failures'),
      h('div', { class: 'muted small' }, timeEl(w.disabled_at))]];
  }
  if (!w.enabled) return ['disabled', [badge('off', '○ Disabled')]];
  if (w.failing_since) {
    return ['failing', [badge('warn', '! Failing'),
      h('div', { class: 'muted small' }, 'since ', timeEl(w.failing_since))]];
  }
  return ['enabled', [badge('ok', '● Enabled')]];
}

function webhookRow(w, shown) {
  const button = (action, text, label, onclick, cls = 'secondary') => h('button', {
    type: 'button', class: `small ${cls}`, dataset: { action }, 'aria-label': label, onclick,
  }, text);
  const [state, badges] = webhookState(w);
  const change = mayChange(); // read-only: the buttons that change it are not built
  return h('tr', { dataset: { webhookId: w.id, enabled: String(w.enabled) } },
    h('th', { scope: 'row' },
      h('span', { class: 'mono' }, w.id),
      h('div', { class: 'muted small mono url' }, w.url)),
    h('td', {}, listOrAll(w.events, 'all types')),
    h('td', {}, listOrAll(w.actions, 'all actions')),
    h('td', { dataset: { status: state } }, badges),
    h('td', {}, timeEl(w.created_at)),
    h('td', { class: 'row-actions' },
      h('a', {
        class: 'button small secondary', dataset: { link: 'deliveries' },
        href: pageHash('webhooks', new URLSearchParams({ deliveries: w.id })),
        'aria-label': `Deliveries of ${w.id}`, 'aria-current': w.id === shown ? 'true' : null,
      }, 'Deliveries'),
      change ? button('test', 'Send test', `Send ${w.id} a test event`, (e) => sendTest(w, e.currentTarget)) : null,
      change ? button('toggle', w.enabled ? 'Disable' : 'Enable', `${w.enabled ? 'Disable' : 'Enable'} ${w.id}`,
        (e) => toggleWebhook(w.id, e.currentTarget)) : null,
      change ? button('rotate', 'Rotate secret', `Rotate the signing secret of ${w.id}`, () => rotateWebhookSecret(w)) : null,
      change ? button('delete', 'Delete', `Delete ${w.id}`, () => deleteWebhook(w), 'danger') : null));
}

// ----- Create --------------------------------------------------------------------

function openWebhookForm() {
  const form = $('#webhook-form');
  form.reset();
  clearFieldErrors(form);
  form.hidden = false;
  $('#new-webhook').setAttribute('aria-expanded', 'true');
  $('#webhook-id').focus();
}

function closeWebhookForm() {
  const form = $('#webhook-form');
  form.hidden = true;
  form.reset();
  clearFieldErrors(form);
  $('#new-webhook').setAttribute('aria-expanded', 'false');
}

/**
 * The form as a request body: `actions` split at commas (left out when empty: all),
 * `events` left out when every type is checked (all, also types added later). Throws
 * when no type is checked: an empty list would mean all of them.
 */
function webhookBody() {
  const body = {
    id: $('#webhook-id').value.trim(),
    url: $('#webhook-url').value.trim(),
    enabled: $('#webhook-enabled').checked,
  };
  const actions = $('#webhook-actions').value.split(',').map((a) => a.trim()).filter((a) => a !== '');
  if (actions.length) body.actions = actions;
  const boxes = $$('#webhook-events input[type=checkbox]');
  const events = boxes.filter((el) => el.checked).map((el) => el.value);
  if (events.length === 0) throw new Error('Check at least one event type.');
  if (events.length < boxes.length) body.events = events;
  return body;
}

/** Which error element shows a server error about `field`: `events[1]` is the events group's. */
function webhookFieldError(field) {
  const name = field.replace(/\[\d+\]$/, '');
  return ['id', 'url', 'events', 'actions', 'enabled'].includes(name) ? $(`#webhook-${name}-error`) : null;
}

/** Focuses the first control marked invalid in the form (a group: its first box). */
function focusFirstInvalid() {
  const first = $('#webhook-form [aria-invalid="true"]');
  if (first) (first.tagName === 'FIELDSET' ? $('input', first) : first).focus();
}

async function createWebhook(event) {
  event.preventDefault();
  const form = $('#webhook-form');
  clearFieldErrors(form);
  clearMessage();
  hideWebhookSecret();
  let body;
  try {
    body = webhookBody();
  } catch (e) {
    $('#webhook-events-error').append(h('span', { class: 'field-error-line' }, `✕ ${e.message}`));
    $('#webhook-events').setAttribute('aria-invalid', 'true');
    focusFirstInvalid();
    return;
  }
  const button = $('#webhook-create');
  button.disabled = true;
  try {
    // The answer goes straight to the panel: nothing else keeps the secret.
    const { data } = await api('POST', '/admin/webhooks', { body });
    showWebhookSecret({ id: data.id, secret: data.secret });
  } catch (err) {
    report('The endpoint was not created.', err);
    if (err.status === 409) {
      $('#webhook-id-error').append(h('span', { class: 'field-error-line' }, '✕ An endpoint with this id exists.'));
      $('#webhook-id').setAttribute('aria-invalid', 'true');
    }
    showFieldErrors(err, webhookFieldError);
    focusFirstInvalid();
    return;
  } finally {
    button.disabled = false;
  }
  closeWebhookForm();
  await loadWebhooks();
  setStatus(`Created the endpoint ${body.id}.`);
}

// ----- The signing secret, shown once ----------------------------------------------

/**
 * Shows a signing secret, the one time the service gives it: after a create, or after a
 * rotation (`until`: when the previous secret stops signing).
 */
function showWebhookSecret({ id, secret, until }) {
  const panel = $('#webhook-secret');
  fill(panel,
    h('h2', { id: 'webhook-secret-title', tabindex: '-1' },
      `⚠ ${until ? 'New signing secret' : 'Signing secret'} of ${id}: shown once`),
    h('p', { class: 'notice' },
      'Copy it into the receiver now: neither the service nor this console shows it again ' +
      '(a lost secret needs a rotation).'),
    h('div', { class: 'field' },
      h('label', { for: 'webhook-secret-value' }, 'Signing secret'),
      h('input', {
        id: 'webhook-secret-value', class: 'mono', value: secret, readonly: true,
        autocomplete: 'off', spellcheck: 'false', onfocus: (e) => e.target.select(),
      })),
    until
      ? h('p', { id: 'webhook-secret-until' }, 'The previous secret also signs until ', timeEl(until),
        ` (${utcTime(until)}): until then each delivery carries both signatures.`)
      : null,
    h('p', { class: 'hint' }, 'A receiver verifies each delivery: the HMAC-SHA256 of ',
      h('code', {}, '<webhook-id>.<webhook-timestamp>.<body>'), ' under the base64-decoded part after ',
      h('code', {}, 'whsec_'), ' is one of the ', h('code', {}, 'v1,…'), ' values in ',
      h('code', {}, 'webhook-signature'), '.'),
    h('div', { class: 'form-actions' },
      h('button', { id: 'webhook-secret-copy', type: 'button', onclick: copyWebhookSecret }, 'Copy'),
      h('button', { id: 'webhook-secret-dismiss', type: 'button', class: 'secondary', onclick: dismissWebhookSecret },
        'I have copied it: hide it')));
  panel.hidden = false;
  $('#webhook-secret-title').focus();
}

/** Copies the shown secret, read from the panel, to the clipboard (or leaves it selected). */
async function copyWebhookSecret() {
  const input = $('#webhook-secret-value');
  input.select();
  try {
    await navigator.clipboard.writeText(input.value);
    setStatus('The signing secret is on the clipboard.');
  } catch (e) {
    setStatus('The browser did not allow the clipboard: the secret is selected, copy it with Ctrl+C.');
  }
}

function dismissWebhookSecret() {
  hideWebhookSecret();
  setStatus('The signing secret is hidden; it cannot be shown again.');
  $('#webhooks-title').focus();
}

/** Empties and hides the secret's panel: no copy of the secret is left in the page. */
function hideWebhookSecret() {
  const panel = $('#webhook-secret');
  panel.hidden = true;
  panel.replaceChildren();
}

// ----- Row actions -------------------------------------------------------------------

/** Flips `enabled` with a fresh read, so the PUT carries the URL and filters as they are. */
async function toggleWebhook(id, button) {
  button.disabled = true;
  clearMessage();
  let saved = null;
  try {
    const { data: w } = await api('GET', webhookPath(id));
    const body = { url: w.url, events: w.events, actions: w.actions, enabled: !w.enabled };
    saved = (await api('PUT', webhookPath(id), { body })).data;
  } catch (err) {
    report(`Could not ${button.textContent.toLowerCase()} ${id}.`, err);
  } finally {
    button.disabled = false;
  }
  await loadWebhooks();
  if (saved) {
    setStatus(saved.enabled
      ? `Enabled ${id}: its pending deliveries resume.`
      : `Disabled ${id}: its deliveries wait, pending, until it is enabled again.`);
  }
}

async function rotateWebhookSecret(w) {
  const ok = await confirmDialog('Rotate the signing secret?',
    `A new signing secret for ${w.id}, shown once. The current one still signs for 24 hours ` +
    '(each delivery then carries both signatures): time to give the receiver the new one.', 'Rotate');
  if (!ok) return;
  clearMessage();
  hideWebhookSecret();
  try {
    const { data } = await api('POST', webhookPath(w.id, '/rotate-secret'));
    showWebhookSecret({ id: w.id, secret: data.secret, until: data.previous_valid_until });
    setStatus(`Rotated the signing secret of ${w.id}.`);
  } catch (err) {
    report(`Could not rotate the secret of ${w.id}.`, err);
  }
}

/** Sends a `webhook.test` event, then shows the endpoint's deliveries (they refresh themselves). */
async function sendTest(w, button) {
  button.disabled = true;
  clearMessage();
  let sent = null;
  try {
    sent = (await api('POST', webhookPath(w.id, '/test'))).data;
  } catch (err) {
    report(`Could not send ${w.id} a test event.`, err);
  } finally {
    button.disabled = false;
  }
  if (!sent) return;
  webhooksNote = `Sent ${w.id} a test event (${sent.event_id})` +
    (w.enabled ? '.' : ': the endpoint is disabled, so it waits until it is enabled.');
  go('webhooks', new URLSearchParams({ deliveries: w.id }));
}

async function deleteWebhook(w) {
  const ok = await confirmDialog('Delete endpoint?',
    `Delete ${w.id} (${w.url}) and its deliveries? Events are no longer sent to it, and ` +
    'its pending deliveries are dropped. This cannot be undone.', 'Delete');
  if (!ok) return;
  clearMessage();
  try {
    await api('DELETE', webhookPath(w.id));
  } catch (err) {
    report(`Could not delete ${w.id}.`, err);
    await loadWebhooks();
    return;
  }
  webhooksNote = `Deleted ${w.id}.`;
  if (parseRoute().params.get('deliveries') === w.id) go('webhooks'); // its deliveries are gone too
  else await loadWebhooks();
}

// ----- Deliveries --------------------------------------------------------------------

const DELIVERY_STATES = {
  delivered: ['ok', '✓ Delivered'],
  pending: ['warn', '… Pending'],
};

/** Whether a delivery is pending and due soon enough to poll for. */
function dueSoon(d) {
  return d.state === 'pending' &&
    (!d.next_attempt_at || new Date(d.next_attempt_at).getTime() - Date.now() < POLL_WITHIN_MS);
}

async function loadDeliveries(id) {
  const gen = generation;
  clearTimeout(deliveriesTimer);
  const panel = $('#webhook-deliveries');
  panel.hidden = false;
  $('#deliveries-title').textContent = `Deliveries of ${id}`;
  const table = $('#deliveries-table');
  table.setAttribute('aria-busy', 'true');
  try {
    const query = new URLSearchParams({ limit: String(DELIVERIES_LIMIT) });
    const { data } = await api('GET', webhookPath(id, '/deliveries'), { query });
    if (stale(gen)) return;
    fill($('#deliveries-table tbody'), ...data.items.map(deliveryRow));
    $('#deliveries-empty').hidden = data.items.length > 0;
    if (data.items.some(dueSoon)) {
      deliveriesTimer = setTimeout(() => { if (!stale(gen)) loadDeliveries(id); }, DELIVERIES_POLL_MS);
    }
  } catch (err) {
    if (stale(gen)) return;
    $('#deliveries-table tbody').replaceChildren();
    $('#deliveries-empty').hidden = true;
    report(err.status === 404 ? `There is no endpoint ${id}.` : `Could not read the deliveries of ${id}.`, err);
  } finally {
    table.removeAttribute('aria-busy');
  }
}

function hideDeliveries() {
  clearTimeout(deliveriesTimer);
  $('#webhook-deliveries').hidden = true;
  $('#deliveries-table tbody').replaceChildren();
}

/** What an event says, in a line: `sms-daily reached 80% (8 of 10), subject=u-1`. */
function eventSummary(e) {
  if (!e || typeof e !== 'object' || !e.policy_id) return null;
  const verb = e.type === 'budget.threshold.resolved' ? 'back below' : 'reached';
  return h('div', { class: 'muted small' },
    `${e.policy_id} ${verb} ${e.threshold}% (${fmtInt(e.used)} of ${fmtInt(e.limit)}), ${budgetLabel(e.budget)}`);
}

function deliveryRow(d) {
  const [cls, text] = DELIVERY_STATES[d.state] || ['off', d.state];
  let last = '—';
  if (d.last_status !== null && d.last_status !== undefined) last = `HTTP ${d.last_status}`;
  else if (d.attempts > 0) last = 'no answer';
  return h('tr', { dataset: { eventId: d.event_id, eventType: d.event_type, state: d.state } },
    h('td', {},
      h('span', { class: 'mono small' }, d.event_id),
      d.event ? h('details', { class: 'event' },
        h('summary', { class: 'small' }, 'The event'),
        h('pre', { class: 'mono small' }, JSON.stringify(d.event, null, 2))) : null),
    h('td', {}, h('span', { class: 'mono' }, d.event_type), eventSummary(d.event)),
    h('td', { dataset: { status: d.state } }, badge(cls, text)),
    h('td', { class: 'num' }, fmtInt(d.attempts)),
    h('td', {}, last,
      d.last_error ? h('div', { class: 'muted small' }, d.last_error) : null),
    h('td', {}, d.next_attempt_at ? timeEl(d.next_attempt_at) : '—'),
    h('td', {}, timeEl(d.created_at)),
    h('td', {}, d.delivered_at ? timeEl(d.delivered_at) : '—'));
}

// ----- Start -------------------------------------------------------------------------

/** Leaving any route: no secret outlives its page, and no poll its view. */
function leaveWebhooks() {
  hideWebhookSecret();
  clearTimeout(deliveriesTimer);
}

/** Signed out: nothing the page showed stays. */
function forgetWebhooks() {
  leaveWebhooks();
  closeWebhookForm();
  hideDeliveries();
  $('#webhooks-table tbody').replaceChildren();
  webhooksNote = '';
}

function startWebhooks() {
  registerPage('webhooks', { render: renderWebhooks, leave: leaveWebhooks, signOut: forgetWebhooks });
  $('#new-webhook').addEventListener('click', openWebhookForm);
  $('#webhook-cancel').addEventListener('click', () => { closeWebhookForm(); clearMessage(); $('#new-webhook').focus(); });
  $('#webhook-form').addEventListener('submit', createWebhook);
  $('#webhooks-refresh').addEventListener('click', () => { clearMessage(); loadWebhooks(); });
  $('#deliveries-refresh').addEventListener('click', () => {
    const id = parseRoute().params.get('deliveries');
    clearMessage();
    if (id) loadDeliveries(id);
  });
}

startWebhooks();
