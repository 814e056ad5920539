// The README walkthrough, through the TypeScript client that @hey-api/openapi-ts generates
// from the service's own OpenAPI document (default plugins and fetch client), used as
// generated.
//
//     node walkthrough.js [BASE_URL [ADMIN_TOKEN]]     (or env BASE_URL, ADMIN_TOKEN)
//
// scripts/clients.sh copies this file next to the generated client (./client), compiles
// both with `tsc --strict` and runs it against a fresh service (empty database, no client
// tokens). Every call goes through a generated SDK function and every field read is a typed
// property of a generated type (no raw HTTP, no casts). Exits 1, naming the step, on the
// first answer that is not the expected one.

import { createClient, createConfig } from './client/client';
import {
  check,
  commitHold,
  consume,
  createHold,
  createPolicy,
  getPolicy,
  listLedger,
  listPolicies,
  refund,
  releaseHold,
  usage,
} from './client';
import type { ConsumeAnswer, ConsumeInput, EntryKindDto, PolicyOut, Problem } from './client';

// The walkthrough's names: the README's, with a limit small enough to reach.
const SMS_POLICY = 'sms-per-day';
const SMS = 'sms';
const TRANSFER_POLICY = 'transfer-usd-daily';
const TRANSFER = 'transfer';
const SUBJECT = 'user-42';
const SMS_LIMIT = 3;
const TRANSFER_LIMIT = 200_000;

let step = 'start';

function fail(message: string): never {
  console.error(`walkthrough.ts: step '${step}': ${message}`);
  process.exit(1);
}

function checkThat(condition: boolean, message: string): asserts condition {
  if (!condition) fail(message);
}

// What every generated SDK function resolves to (throwOnError: false, responseStyle: fields).
type Result<D, E> = ({ data: D; error: undefined } | { data: undefined; error: E }) & {
  response: Response;
};

function show(value: unknown): string {
  return JSON.stringify(value);
}

/** The typed body of a success answer, which must have `status`. */
function ok<D, E>(result: Result<D, E>, status: number): D {
  if (result.response.status !== status || result.data === undefined) {
    fail(`expected ${status}, got ${result.response.status}: ${show(result.data ?? result.error)}`);
  }
  return result.data;
}

/** The typed body of an error answer, which must have `status`. */
function err<D, E>(result: Result<D, E>, status: number): E {
  if (result.response.status !== status || result.error === undefined) {
    fail(`expected ${status}, got ${result.response.status}: ${show(result.data ?? result.error)}`);
  }
  return result.error;
}

function isProblem(body: Problem | ConsumeAnswer): body is Problem {
  return 'title' in body && 'detail' in body;
}

async function main(): Promise<void> {
  const baseUrl = process.argv[2] ?? process.env['BASE_URL'] ?? '';
  const token = process.argv[3] ?? process.env['ADMIN_TOKEN'] ?? '';
  if (baseUrl === '' || token === '') {
    fail('usage: walkthrough.js BASE_URL ADMIN_TOKEN (or env BASE_URL, ADMIN_TOKEN)');
  }

  // /admin/* takes the admin token; /quota/* is open when no client tokens are configured.
  const admin = createClient(createConfig({ baseUrl, auth: token }));
  const quota = createClient(createConfig({ baseUrl }));

  // 1. Policies: 3 SMS per calendar day in New York; $2,000.00 in any rolling 24 hours.
  step = '1. create policies';
  const smsPolicy: PolicyOut = ok(
    await createPolicy({
      client: admin,
      body: {
        id: SMS_POLICY,
        action: SMS,
        measure: 'count',
        limit: SMS_LIMIT,
        window: { type: 'calendar', period: 'day', timezone: 'America/New_York' },
        description: 'walkthrough',
      },
    }),
    201,
  );
  checkThat(smsPolicy.id === SMS_POLICY, `created id ${smsPolicy.id}`);
  checkThat(smsPolicy.limit === SMS_LIMIT, `created limit ${smsPolicy.limit}`);
  checkThat(smsPolicy.mode === 'enforce', `default mode ${smsPolicy.mode}`);
  checkThat(smsPolicy.enabled, 'a new policy is enabled by default');
  checkThat(smsPolicy.version === 1, `a new policy has version ${smsPolicy.version}`);
  checkThat(smsPolicy.window.type === 'calendar', `window ${show(smsPolicy.window)}`);

  const transferPolicy = ok(
    await createPolicy({
      client: admin,
      body: {
        id: TRANSFER_POLICY,
        action: TRANSFER,
        measure: 'amount',
        unit: 'USD cents',
        limit: TRANSFER_LIMIT,
        window: { type: 'rolling', seconds: 86_400, bucket_seconds: 3_600 },
      },
    }),
    201,
  );
  checkThat(transferPolicy.unit === 'USD cents', `unit ${transferPolicy.unit}`);
  const rolling = transferPolicy.window;
  checkThat(
    rolling.type === 'rolling' && rolling.seconds === 86_400 && rolling.bucket_seconds === 3_600,
    `rolling window read back as ${show(rolling)}`,
  );

  // 2. Three SMS: allowed, each charged once.
  step = '2. consume within the limit';
  const sms: ConsumeInput = { action: SMS, subject: SUBJECT };
  const consumptionIds: string[] = [];
  for (let n = 1; n <= SMS_LIMIT; n++) {
    const allowed = ok(await consume({ client: quota, body: sms }), 200);
    checkThat(allowed.allowed, `consume ${n}: allowed is false`);
    checkThat(!allowed.replayed && !allowed.degraded, `consume ${n}: replayed/degraded`);
    checkThat(allowed.amount === 1, `consume ${n}: amount ${allowed.amount}`);
    checkThat(allowed.retry_after_seconds === null, `consume ${n}: retry_after_seconds set`);
    const id: string | null = allowed.consumption_id;
    if (id === null) fail(`consume ${n}: no consumption_id`);
    consumptionIds.push(id);
    checkThat(allowed.policies.length === 1, `consume ${n}: ${allowed.policies.length} policies`);
    const entry = allowed.policies[0];
    checkThat(entry !== undefined && entry.policy_id === SMS_POLICY, `consume ${n}: ${show(entry)}`);
    checkThat(entry.used === n, `consume ${n}: used ${entry.used}, expected ${n}`);
    checkThat(entry.remaining === SMS_LIMIT - n, `consume ${n}: remaining ${entry.remaining}`);
    checkThat(entry.limit === SMS_LIMIT && entry.allowed, `consume ${n}: ${show(entry)}`);
    // A calendar day resets (only a lifetime window has no reset time: null).
    checkThat(
      entry.resets_at !== null && Date.parse(entry.resets_at) > Date.now(),
      `resets_at ${entry.resets_at} is null or past`,
    );
  }
  checkThat(new Set(consumptionIds).size === SMS_LIMIT, `ids repeat: ${show(consumptionIds)}`);

  // 3. The fourth: 429, and the body is the same typed answer.
  step = '3. consume over the limit (429)';
  const deniedResult = await consume({ client: quota, body: sms });
  const deniedBody = err(deniedResult, 429);
  if (isProblem(deniedBody)) fail(`a problem, not a consume answer: ${show(deniedBody)}`);
  const denied: ConsumeAnswer = deniedBody;
  checkThat(!denied.allowed, 'allowed is true on a 429');
  const retryAfter: number | null = denied.retry_after_seconds;
  if (retryAfter === null) fail('no retry_after_seconds on a 429 that can pass tomorrow');
  // Until the next midnight in New York: at most 25 hours on a DST day.
  checkThat(retryAfter > 0 && retryAfter <= 25 * 3600, `retry_after_seconds ${retryAfter}`);
  // The generated client does not type response headers: Retry-After is read from the
  // fetch Response.
  const header = deniedResult.response.headers.get('retry-after');
  checkThat(header === String(retryAfter), `Retry-After ${header}, retry_after_seconds ${retryAfter}`);
  const denying = denied.policies[0];
  checkThat(denying !== undefined && !denying.allowed, 'the denying policy says allowed');
  checkThat(denying.used === SMS_LIMIT, `a denial charged: used ${denying.used}`);
  checkThat(denying.remaining === 0, `remaining ${denying.remaining}`);

  // /quota/check answers the same way and charges nothing.
  const would = err(await check({ client: quota, body: sms }), 429);
  checkThat(!isProblem(would) && !would.allowed && would.consumption_id === null, `check: ${show(would)}`);

  // 4. Usage.
  step = '4. usage';
  // Attributes as the generated client sends them (the policy's scope does not read them).
  const current = ok(
    await usage({ client: quota, query: { action: SMS, subject: SUBJECT, attributes: { country: 'NG' } } }),
    200,
  );
  checkThat(current.policies[0]?.budget['subject'] === SUBJECT, `budget ${show(current.policies)}`);
  checkThat(current.action === SMS && current.subject === SUBJECT, `usage of ${show(current)}`);
  checkThat(current.policies.length === 1, `usage lists ${current.policies.length} policies`);
  checkThat(current.policies[0]?.used === SMS_LIMIT, `usage ${show(current.policies)}`);
  checkThat(current.policies[0]?.remaining === 0, `usage ${show(current.policies)}`);

  // 5. An idempotent consume, retried: answered again, charged once.
  step = '5. idempotent retry';
  const payment: ConsumeInput = {
    action: TRANSFER,
    subject: SUBJECT,
    amount: 20_000,
    idempotency_key: 'payment-981',
  };
  const first = ok(await consume({ client: quota, body: payment }), 200);
  const again = ok(await consume({ client: quota, body: payment }), 200);
  checkThat(first.allowed && !first.replayed, `first answer ${show(first)}`);
  checkThat(again.allowed && again.replayed, `retry not replayed: ${show(again)}`);
  checkThat(again.consumption_id === first.consumption_id, 'the retry has another consumption_id');
  checkThat(again.policies[0]?.used === 20_000, `the retry charged again: ${show(again.policies)}`);
  const transferId: string | null = first.consumption_id;
  if (transferId === null) fail('no consumption_id');

  // 6. Refunds: one SMS in full, and $50.00 of the transfer.
  step = '6. refund';
  const firstSms = consumptionIds[0];
  checkThat(firstSms !== undefined, 'no SMS consumption');
  const refunded = ok(await refund({ client: quota, body: { consumption_id: firstSms } }), 200);
  const refundKind: EntryKindDto = refunded.entry.kind;
  checkThat(refundKind === 'refund', `entry kind ${refundKind}`);
  checkThat(refunded.entry.amount === 1, `refunded ${refunded.entry.amount}`);
  checkThat(refunded.entry.consumption_id === firstSms, 'refund names another consumption');
  checkThat(refunded.policies[0]?.used === SMS_LIMIT - 1, `after refund ${show(refunded.policies)}`);
  const partial = ok(
    await refund({ client: quota, body: { consumption_id: transferId, amount: 5_000 } }),
    200,
  );
  checkThat(partial.entry.amount === 5_000, `partial refund of ${partial.entry.amount}`);
  checkThat(partial.policies[0]?.used === 15_000, `after partial refund ${show(partial.policies)}`);

  // 7. Holds: authorize $500.00 and capture all of it (commit with no body); hold $100.00
  // more and give it back.
  step = '7. holds';
  const hold = ok(
    await createHold({
      client: quota,
      body: { action: TRANSFER, subject: SUBJECT, amount: 50_000, ttl_seconds: 900 },
    }),
    200,
  );
  checkThat(hold.allowed, `hold denied: ${show(hold)}`);
  const holdId: string | null = hold.hold_id;
  const expiresAt: string | null = hold.expires_at;
  if (holdId === null || expiresAt === null) fail(`an allowed hold without id or expiry: ${show(hold)}`);
  checkThat(Date.parse(expiresAt) > Date.now(), `hold expires at ${expiresAt}`);
  checkThat(hold.policies[0]?.used === 65_000, `used with the hold ${show(hold.policies)}`);
  const committed = ok(await commitHold({ client: quota, path: { id: holdId } }), 200);
  checkThat(committed.entry.kind === 'commit', `entry kind ${committed.entry.kind}`);
  checkThat(committed.entry.hold_id === holdId, 'commit names another hold');
  checkThat(committed.policies[0]?.used === 65_000, `after commit ${show(committed.policies)}`);
  const twice = err(await commitHold({ client: quota, path: { id: holdId } }), 409);
  checkThat(twice.status === 409, `second commit: ${show(twice)}`);

  const other = ok(
    await createHold({
      client: quota,
      body: { action: TRANSFER, subject: SUBJECT, amount: 10_000, ttl_seconds: 60 },
    }),
    200,
  );
  const otherId: string | null = other.hold_id;
  if (otherId === null) fail(`an allowed hold without hold_id: ${show(other)}`);
  checkThat(other.policies[0]?.used === 75_000, `used with the second hold ${show(other.policies)}`);
  const released = ok(await releaseHold({ client: quota, path: { id: otherId } }), 200);
  checkThat(released.entry.kind === 'release', `entry kind ${released.entry.kind}`);
  checkThat(released.policies[0]?.used === 65_000, `after release ${show(released.policies)}`);

  // 8. The ledger, newest first, one page at a time.
  step = '8. ledger';
  // 3 SMS charges, 1 transfer charge (the replay is not another one), 2 refunds,
  // hold + commit, hold + release.
  const expected: EntryKindDto[] = [
    'release',
    'hold',
    'commit',
    'hold',
    'refund',
    'refund',
    'charge',
    'charge',
    'charge',
    'charge',
  ];
  const kinds: EntryKindDto[] = [];
  let cursor: string | undefined;
  let pages = 0;
  for (;;) {
    const page = ok(
      await listLedger({ client: quota, query: { subject: SUBJECT, limit: 4, cursor } }),
      200,
    );
    pages++;
    checkThat(page.items.length <= 4, `a page of limit 4 has ${page.items.length} items`);
    for (const item of page.items) {
      checkThat(item.subject === SUBJECT, `ledger entry of subject ${item.subject}`);
      kinds.push(item.kind);
    }
    const next: string | null = page.next_cursor;
    if (next === null) break;
    checkThat(pages < 10, 'the ledger pages never end');
    cursor = next;
  }
  checkThat(show(kinds) === show(expected), `ledger kinds ${show(kinds)}`);
  checkThat(pages === 3, `10 entries in pages of 4 took ${pages} pages`);

  // 9. Policies: list, get one, and a 422 on a bad create.
  step = '9. policies';
  const policies = ok(await listPolicies({ client: admin }), 200);
  checkThat(
    show(policies.items.map((p) => p.id)) === show([SMS_POLICY, TRANSFER_POLICY]),
    `listed ${show(policies.items)}`,
  );
  checkThat(policies.next_cursor === null, `next_cursor ${show(policies.next_cursor)}`);
  const got = ok(await getPolicy({ client: admin, path: { id: SMS_POLICY } }), 200);
  const calendar = got.window;
  checkThat(
    calendar.type === 'calendar' &&
      calendar.period === 'day' &&
      calendar.timezone === 'America/New_York',
    `window read back as ${show(calendar)}`,
  );
  checkThat(got.description === 'walkthrough', `description ${show(got.description)}`);
  const invalid: Problem = err(
    await createPolicy({
      client: admin,
      body: {
        id: 'bad-limit',
        action: SMS,
        measure: 'count',
        limit: -1,
        window: { type: 'calendar', period: 'day' },
      },
    }),
    422,
  );
  checkThat(invalid.status === 422, `problem status ${invalid.status}`);
  checkThat(invalid.type === 'urn:quota-ledger:problem:validation', `problem type ${invalid.type}`);
  const fields = (invalid.errors ?? []).map((e) => e.field);
  checkThat(fields.includes('limit'), `invalid fields ${show(fields)}`);
  const missing = err(await getPolicy({ client: admin, path: { id: 'bad-limit' } }), 404);
  checkThat(missing.status === 404, `the invalid policy was created: ${show(missing)}`);

  console.log('walkthrough.ts: all steps passed');
}

main().catch((e: unknown) => fail(`unexpected exception: ${e instanceof Error ? e.stack : String(e)}`));
