"""The README walkthrough, through the Python client that openapi-python-client generates
from the service's own OpenAPI document (package `quota_ledger_client`), used as generated.

    python walkthrough.py [BASE_URL [ADMIN_TOKEN [OPENAPI_JSON]]]
                                        (or env BASE_URL, ADMIN_TOKEN, OPENAPI_JSON)

Run by scripts/clients.sh against a fresh service (empty database, no client tokens): it
type-checks this file with `mypy --strict` first, so every field read below is a typed
attribute of a generated model, and every call goes through a generated API function (no
raw HTTP). Exits non-zero, naming the step, on the first answer that is not the expected one.

Every answer the generated client receives is also recorded (an httpx response hook) and
checked against the OpenAPI document by validate.py: a declared status, a declared
Content-Type, the body valid against the declared schema (JSON Schema 2020-12), the declared
headers present. The document is OPENAPI_JSON, the one the client was generated from (without
it, the one the service serves). Each mismatch is reported with its step as it happens, and
fails the run at the end; then altered copies of real answers must be rejected, so that the
check is seen to be able to fail.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
from collections.abc import Callable
from http import HTTPStatus
from typing import Any, NoReturn, TypeVar

import httpx

from quota_ledger_client import AuthenticatedClient, Client
from quota_ledger_client.api.admin import create_policy, get_policy, list_policies
from quota_ledger_client.api.quota import (
    check,
    commit_hold,
    consume,
    create_hold,
    list_ledger,
    refund,
    release_hold,
    usage,
)
from quota_ledger_client.models import (
    Attributes,
    CalendarWindow,
    CalendarWindowType,
    ConsumeAnswer,
    ConsumeInput,
    EntryKindDto,
    HoldAnswer,
    HoldInput,
    LedgerList,
    MeasureDto,
    ModeDto,
    NewPolicyInput,
    PeriodDto,
    PolicyList,
    PolicyOut,
    Problem,
    RefundInput,
    SettleAnswer,
    RollingWindow,
    RollingWindowType,
    UsageAnswer,
)
from quota_ledger_client.types import UNSET, Response
from validate import Answer, Validator

# The walkthrough's names: the README's, with a limit small enough to reach.
SMS_POLICY = "sms-per-day"
SMS = "sms"
TRANSFER_POLICY = "transfer-usd-daily"
TRANSFER = "transfer"
SUBJECT = "user-42"
SMS_LIMIT = 3
TRANSFER_LIMIT = 200_000

T = TypeVar("T")
U = TypeVar("U")

step = "start"


def fail(message: str) -> NoReturn:
    print(f"walkthrough.py: step '{step}': {message}", file=sys.stderr)
    sys.exit(1)


def check_that(condition: bool, message: str) -> None:
    if not condition:
        fail(message)


def answer(response: Response[U], status: HTTPStatus, kind: type[T]) -> T:
    """The parsed body of `response`, which must have `status` and parse as `kind`."""
    if response.status_code != status:
        fail(f"expected {status.value}, got {response.status_code.value}: {response.content!r}")
    parsed = response.parsed
    if not isinstance(parsed, kind):
        fail(f"expected a {kind.__name__} body, got {type(parsed).__name__}: {response.content!r}")
    return parsed


def report(problem: str) -> None:
    print(f"walkthrough.py: step '{step}': answer not as documented: {problem}", file=sys.stderr)


def load_document(base_url: str, path: str) -> dict[str, Any]:
    """The OpenAPI document: the file at `path`, or else the one the service serves."""
    if path:
        with open(path, encoding="utf-8") as file:
            document = json.load(file)
    else:
        document = httpx.get(base_url.rstrip("/") + "/api-docs/openapi.json").raise_for_status().json()
    if not isinstance(document, dict) or not isinstance(document.get("paths"), dict):
        fail(f"not an OpenAPI document: {path or base_url}")
    return document


def altered(answer: Answer, change: Callable[[Any], None]) -> Answer:
    """A copy of `answer` whose JSON body `change` edited in place."""
    body = json.loads(answer.body)
    change(body)
    return dataclasses.replace(answer, body=json.dumps(body).encode())


def rejects_altered_answers(validator: Validator) -> None:
    """Altered copies of real answers must each fail the check, with the expected message."""

    def first(path: str, status: int) -> Answer:
        for recorded in validator.answers:
            if recorded.path == path and recorded.status == status:
                return recorded
        fail(f"no {status} answer to {path} was recorded")

    allowed = first("/quota/consume", 200)
    denied = first("/quota/consume", 429)
    committed = next((a for a in validator.answers if a.path.endswith("/commit") and a.status == 200), None)
    if committed is None:
        fail("no 200 answer to a commit was recorded")

    def without(name: str) -> Callable[[Any], None]:
        return lambda body: body.pop(name)

    def setting(name: str, value: object) -> Callable[[Any], None]:
        return lambda body: body.__setitem__(name, value)

    def entry_at(value: str) -> Callable[[Any], None]:
        return lambda body: body["entry"].__setitem__("at", value)

    def headers_without(answer: Answer, name: str) -> Answer:
        return dataclasses.replace(answer, headers={k: v for k, v in answer.headers.items() if k != name})

    cases: list[tuple[str, Answer, str]] = [
        ("a consume answer without policies", altered(allowed, without("policies")), "'policies' is a required property"),
        ("a consume answer with a string amount", altered(allowed, setting("amount", "1")), "is not of type 'integer'"),
        ("a consume answer with an unknown mode", altered(allowed, lambda b: b["policies"][0].__setitem__("mode", "x")), "is not one of"),
        ("a settle answer with a bad date-time", altered(committed, entry_at("yesterday")), "is not a 'date-time'"),
        ("a 429 without Retry-After", headers_without(denied, "retry-after"), "header Retry-After is missing"),
        ("a 200 without RateLimit", headers_without(allowed, "ratelimit"), "header RateLimit is missing"),
        ("a consume answer as a 418", dataclasses.replace(allowed, status=418), "status 418 is not declared"),
        (
            "a consume answer as text/html",
            dataclasses.replace(allowed, headers={**allowed.headers, "content-type": "text/html"}),
            "Content-Type 'text/html' is not declared",
        ),
        ("an answer to an undocumented path", dataclasses.replace(allowed, path="/quota/consumed"), "no path of the document"),
    ]
    for what, answer_, expected in cases:
        _, problems = validator.check(answer_)
        if not any(expected in problem for problem in problems):
            fail(f"the check accepted {what} (expected {expected!r}, got {problems})")


def main() -> None:
    global step
    base_url = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("BASE_URL", "")
    token = sys.argv[2] if len(sys.argv) > 2 else os.environ.get("ADMIN_TOKEN", "")
    document_path = sys.argv[3] if len(sys.argv) > 3 else os.environ.get("OPENAPI_JSON", "")
    if not base_url or not token:
        fail("usage: walkthrough.py BASE_URL ADMIN_TOKEN [OPENAPI_JSON] (or env BASE_URL, ADMIN_TOKEN, OPENAPI_JSON)")

    # Every answer either client receives is checked against the document as it arrives.
    validator = Validator(load_document(base_url, document_path), base_url)
    validator.on_problem = report
    hooks: dict[str, Any] = {"event_hooks": {"response": [validator.record]}}

    # /admin/* takes the admin token; /quota/* is open when no client tokens are configured.
    admin = AuthenticatedClient(base_url=base_url, token=token, raise_on_unexpected_status=True, httpx_args=hooks)
    quota = Client(base_url=base_url, raise_on_unexpected_status=True, httpx_args=hooks)

    # 1. Policies: 3 SMS per calendar day in New York; $2,000.00 in any rolling 24 hours.
    step = "1. create policies"
    sms_policy = answer(
        create_policy.sync_detailed(
            client=admin,
            body=NewPolicyInput(
                id=SMS_POLICY,
                action=SMS,
                measure=MeasureDto.COUNT,
                limit=SMS_LIMIT,
                window=CalendarWindow(
                    type_=CalendarWindowType.CALENDAR,
                    period=PeriodDto.DAY,
                    timezone="America/New_York",
                ),
                description="walkthrough",
            ),
        ),
        HTTPStatus.CREATED,
        PolicyOut,
    )
    check_that(sms_policy.id == SMS_POLICY, f"created id {sms_policy.id!r}")
    check_that(sms_policy.limit == SMS_LIMIT, f"created limit {sms_policy.limit}")
    check_that(sms_policy.mode == ModeDto.ENFORCE, f"default mode {sms_policy.mode}")
    check_that(sms_policy.enabled, "a new policy is enabled by default")
    check_that(sms_policy.version == 1, f"a new policy has version {sms_policy.version}")
    check_that(isinstance(sms_policy.window, CalendarWindow), f"window {sms_policy.window!r}")

    transfer_policy = answer(
        create_policy.sync_detailed(
            client=admin,
            body=NewPolicyInput(
                id=TRANSFER_POLICY,
                action=TRANSFER,
                measure=MeasureDto.AMOUNT,
                unit="USD cents",
                limit=TRANSFER_LIMIT,
                window=RollingWindow(type_=RollingWindowType.ROLLING, seconds=86_400, bucket_seconds=3_600),
            ),
        ),
        HTTPStatus.CREATED,
        PolicyOut,
    )
    check_that(transfer_policy.unit == "USD cents", f"unit {transfer_policy.unit!r}")
    window = transfer_policy.window
    check_that(
        isinstance(window, RollingWindow) and window.seconds == 86_400 and window.bucket_seconds == 3_600,
        f"rolling window read back as {window!r}",
    )

    # 2. Three SMS: allowed, each charged once.
    step = "2. consume within the limit"
    consumption_ids: list[str] = []
    for n in range(1, SMS_LIMIT + 1):
        allowed = answer(
            consume.sync_detailed(client=quota, body=ConsumeInput(action=SMS, subject=SUBJECT)),
            HTTPStatus.OK,
            ConsumeAnswer,
        )
        check_that(allowed.allowed, f"consume {n}: allowed is false")
        check_that(not allowed.replayed and not allowed.degraded, f"consume {n}: replayed/degraded")
        check_that(allowed.amount == 1, f"consume {n}: amount {allowed.amount}")
        check_that(allowed.retry_after_seconds is None, f"consume {n}: retry_after_seconds set")
        if allowed.consumption_id is None:
            fail(f"consume {n}: no consumption_id")
        consumption_ids.append(allowed.consumption_id)
        check_that(len(allowed.policies) == 1, f"consume {n}: {len(allowed.policies)} policies")
        entry = allowed.policies[0]
        check_that(entry.policy_id == SMS_POLICY, f"consume {n}: policy {entry.policy_id}")
        check_that(entry.used == n, f"consume {n}: used {entry.used}, expected {n}")
        check_that(entry.remaining == SMS_LIMIT - n, f"consume {n}: remaining {entry.remaining}")
        check_that(entry.limit == SMS_LIMIT and entry.allowed, f"consume {n}: limit/allowed {entry!r}")
        # A calendar day resets (only a lifetime window has no reset time: null).
        check_that(
            entry.resets_at is not None
            and entry.resets_at > datetime.datetime.now(datetime.timezone.utc),
            f"resets_at {entry.resets_at} is null or past",
        )
    check_that(len(set(consumption_ids)) == SMS_LIMIT, f"consumption ids repeat: {consumption_ids}")

    # 3. The fourth: 429, and the body is the same typed answer.
    step = "3. consume over the limit (429)"
    denied_response = consume.sync_detailed(client=quota, body=ConsumeInput(action=SMS, subject=SUBJECT))
    denied = answer(denied_response, HTTPStatus.TOO_MANY_REQUESTS, ConsumeAnswer)
    check_that(not denied.allowed, "allowed is true on a 429")
    retry_after: int | None = denied.retry_after_seconds
    if retry_after is None:
        fail("no retry_after_seconds on a 429 that can pass tomorrow")
    # Until the next midnight in New York: at most 25 hours on a DST day.
    check_that(0 < retry_after <= 25 * 3600, f"retry_after_seconds {retry_after}")
    # The generated client does not type response headers: Retry-After is read from the
    # response's header map (case-insensitive at run time).
    header = denied_response.headers.get("retry-after")
    check_that(header == str(retry_after), f"Retry-After {header!r}, retry_after_seconds {retry_after}")
    check_that(not denied.policies[0].allowed, "the denying policy says allowed")
    check_that(denied.policies[0].used == SMS_LIMIT, f"a denial charged: used {denied.policies[0].used}")
    check_that(denied.policies[0].remaining == 0, f"remaining {denied.policies[0].remaining}")

    # /quota/check answers the same way and charges nothing.
    would = answer(
        check.sync_detailed(client=quota, body=ConsumeInput(action=SMS, subject=SUBJECT)),
        HTTPStatus.TOO_MANY_REQUESTS,
        ConsumeAnswer,
    )
    check_that(not would.allowed and would.consumption_id is None, f"check answered {would!r}")

    # 4. Usage.
    step = "4. usage"
    # Attributes as the generated client sends them (the policy's scope does not read them).
    current = answer(
        usage.sync_detailed(
            client=quota, action=SMS, subject=SUBJECT, attributes=Attributes.from_dict({"country": "NG"})
        ),
        HTTPStatus.OK,
        UsageAnswer,
    )
    check_that(
        current.policies[0].budget.to_dict() == {"subject": SUBJECT}, f"budget {current.policies[0].budget!r}"
    )
    check_that(current.action == SMS and current.subject == SUBJECT, f"usage of {current.action}/{current.subject}")
    check_that(len(current.policies) == 1, f"usage lists {len(current.policies)} policies")
    check_that(current.policies[0].used == SMS_LIMIT, f"usage used {current.policies[0].used}")
    check_that(current.policies[0].remaining == 0, f"usage remaining {current.policies[0].remaining}")

    # 5. An idempotent consume, retried: answered again, charged once.
    step = "5. idempotent retry"
    request = ConsumeInput(action=TRANSFER, subject=SUBJECT, amount=20_000, idempotency_key="payment-981")
    first = answer(consume.sync_detailed(client=quota, body=request), HTTPStatus.OK, ConsumeAnswer)
    again = answer(consume.sync_detailed(client=quota, body=request), HTTPStatus.OK, ConsumeAnswer)
    check_that(first.allowed and not first.replayed, f"first answer {first!r}")
    check_that(again.allowed and again.replayed, f"retry not replayed: {again!r}")
    check_that(again.consumption_id == first.consumption_id, "the retry has another consumption_id")
    check_that(again.policies[0].used == 20_000, f"the retry charged again: used {again.policies[0].used}")
    if first.consumption_id is None:
        fail("no consumption_id")
    transfer_id: str = first.consumption_id

    # 6. Refunds: one SMS in full, and $50.00 of the transfer.
    step = "6. refund"
    refunded = answer(
        refund.sync_detailed(client=quota, body=RefundInput(consumption_id=consumption_ids[0])),
        HTTPStatus.OK,
        SettleAnswer,
    )
    check_that(refunded.entry.kind == EntryKindDto.REFUND, f"entry kind {refunded.entry.kind}")
    check_that(refunded.entry.amount == 1, f"refunded {refunded.entry.amount}")
    check_that(refunded.entry.consumption_id == consumption_ids[0], "refund names another consumption")
    check_that(refunded.policies[0].used == SMS_LIMIT - 1, f"used after refund {refunded.policies[0].used}")
    partial = answer(
        refund.sync_detailed(client=quota, body=RefundInput(consumption_id=transfer_id, amount=5_000)),
        HTTPStatus.OK,
        SettleAnswer,
    )
    check_that(partial.entry.amount == 5_000, f"partial refund of {partial.entry.amount}")
    check_that(partial.policies[0].used == 15_000, f"used after partial refund {partial.policies[0].used}")

    # 7. Holds: authorize $500.00 and capture all of it (commit with no body); hold $100.00
    # more and give it back.
    step = "7. holds"
    hold = answer(
        create_hold.sync_detailed(
            client=quota,
            body=HoldInput(action=TRANSFER, subject=SUBJECT, amount=50_000, ttl_seconds=900),
        ),
        HTTPStatus.OK,
        HoldAnswer,
    )
    check_that(hold.allowed, f"hold denied: {hold!r}")
    if hold.hold_id is None or hold.expires_at is None:
        fail(f"an allowed hold without hold_id or expires_at: {hold!r}")
    hold_id: str = hold.hold_id
    expires_at: datetime.datetime = hold.expires_at
    check_that(expires_at > datetime.datetime.now(datetime.timezone.utc), f"hold expires at {expires_at}")
    check_that(hold.policies[0].used == 65_000, f"used with the hold {hold.policies[0].used}")
    committed = answer(commit_hold.sync_detailed(hold_id, client=quota), HTTPStatus.OK, SettleAnswer)
    check_that(committed.entry.kind == EntryKindDto.COMMIT, f"entry kind {committed.entry.kind}")
    check_that(committed.entry.hold_id == hold_id, "commit names another hold")
    check_that(committed.policies[0].used == 65_000, f"used after commit {committed.policies[0].used}")
    again_commit = answer(commit_hold.sync_detailed(hold_id, client=quota), HTTPStatus.CONFLICT, Problem)
    check_that(again_commit.status == 409, f"second commit: {again_commit!r}")

    other = answer(
        create_hold.sync_detailed(
            client=quota,
            body=HoldInput(action=TRANSFER, subject=SUBJECT, amount=10_000, ttl_seconds=60),
        ),
        HTTPStatus.OK,
        HoldAnswer,
    )
    if other.hold_id is None:
        fail(f"an allowed hold without hold_id: {other!r}")
    check_that(other.policies[0].used == 75_000, f"used with the second hold {other.policies[0].used}")
    released = answer(release_hold.sync_detailed(other.hold_id, client=quota), HTTPStatus.OK, SettleAnswer)
    check_that(released.entry.kind == EntryKindDto.RELEASE, f"entry kind {released.entry.kind}")
    check_that(released.policies[0].used == 65_000, f"used after release {released.policies[0].used}")

    # 8. The ledger, newest first, one page at a time.
    step = "8. ledger"
    # 3 SMS charges, 1 transfer charge (the replay is not another one), 2 refunds,
    # hold + commit, hold + release.
    expected = [
        EntryKindDto.RELEASE,
        EntryKindDto.HOLD,
        EntryKindDto.COMMIT,
        EntryKindDto.HOLD,
        EntryKindDto.REFUND,
        EntryKindDto.REFUND,
        EntryKindDto.CHARGE,
        EntryKindDto.CHARGE,
        EntryKindDto.CHARGE,
        EntryKindDto.CHARGE,
    ]
    kinds: list[EntryKindDto] = []
    cursor: str | None = None
    pages = 0
    while True:
        page = answer(
            list_ledger.sync_detailed(
                client=quota, subject=SUBJECT, limit=4, cursor=UNSET if cursor is None else cursor
            ),
            HTTPStatus.OK,
            LedgerList,
        )
        pages += 1
        check_that(len(page.items) <= 4, f"a page of limit 4 has {len(page.items)} items")
        for item in page.items:
            check_that(item.subject == SUBJECT, f"ledger entry of subject {item.subject}")
            kinds.append(item.kind)
        next_cursor: str | None = page.next_cursor
        if next_cursor is None:
            break
        check_that(pages < 10, "the ledger pages never end")
        cursor = next_cursor
    check_that(kinds == expected, f"ledger kinds {[k.value for k in kinds]}")
    check_that(pages == 3, f"10 entries in pages of 4 took {pages} pages")

    # 9. Policies: list, get one, and a 422 on a bad create.
    step = "9. policies"
    policies = answer(list_policies.sync_detailed(client=admin), HTTPStatus.OK, PolicyList)
    check_that([p.id for p in policies.items] == [SMS_POLICY, TRANSFER_POLICY], f"listed {policies.items!r}")
    check_that(policies.next_cursor is None, f"next_cursor {policies.next_cursor!r}")
    got = answer(get_policy.sync_detailed(SMS_POLICY, client=admin), HTTPStatus.OK, PolicyOut)
    calendar = got.window
    check_that(
        isinstance(calendar, CalendarWindow)
        and calendar.period == PeriodDto.DAY
        and calendar.timezone == "America/New_York",
        f"window read back as {calendar!r}",
    )
    check_that(got.description == "walkthrough", f"description {got.description!r}")
    invalid = answer(
        create_policy.sync_detailed(
            client=admin,
            body=NewPolicyInput(
                id="bad-limit",
                action=SMS,
                measure=MeasureDto.COUNT,
                limit=-1,
                window=CalendarWindow(type_=CalendarWindowType.CALENDAR, period=PeriodDto.DAY),
            ),
        ),
        HTTPStatus.UNPROCESSABLE_ENTITY,
        Problem,
    )
    check_that(invalid.status == 422, f"problem status {invalid.status}")
    check_that(invalid.type_ == "urn:quota-ledger:problem:validation", f"problem type {invalid.type_}")
    fields = [e.field for e in invalid.errors or []]
    check_that("limit" in fields, f"invalid fields {fields}")
    missing = answer(get_policy.sync_detailed("bad-limit", client=admin), HTTPStatus.NOT_FOUND, Problem)
    check_that(missing.status == 404, f"the invalid policy was created: {missing!r}")

    # 10. Every answer above, against the document; and the check can fail.
    step = "10. answers against the document"
    if validator.problems:
        fail(f"{len(validator.problems)} mismatches with the document (each reported above)")
    # The hook saw the answers of every operation called above.
    called = {
        "POST /admin/policies (create_policy)",
        "GET /admin/policies (list_policies)",
        "GET /admin/policies/{id} (get_policy)",
        "POST /quota/consume (consume)",
        "POST /quota/check (check)",
        "GET /quota/usage (usage)",
        "POST /quota/refund (refund)",
        "POST /quota/holds (create_hold)",
        "POST /quota/holds/{id}/commit (commit_hold)",
        "POST /quota/holds/{id}/release (release_hold)",
        "GET /quota/ledger (list_ledger)",
    }
    check_that(validator.operations == called, f"answers recorded of {sorted(validator.operations)}")
    rejects_altered_answers(validator)

    print(f"walkthrough.py: {validator.summary()}")
    print("walkthrough.py: all steps passed")


if __name__ == "__main__":
    main()
