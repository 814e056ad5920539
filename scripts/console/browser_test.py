#!/usr/bin/env python3
"""The operator console, driven in headless Chromium against a running service.

    python3 scripts/console/browser_test.py --url http://127.0.0.1:PORT --token TOKEN \
        [--screenshots DIR]

The service must be fresh (no policies), started with QUOTA_ADMIN_TOKEN=TOKEN and no
client tokens (and QUOTA_LEDGER_RETENTION_DAYS=forever, for a lifetime policy, and
QUOTA_WEBHOOK_ALLOW_PRIVATE=true, for the webhook receiver this test runs on 127.0.0.1).
scripts/console.sh starts one and runs this. Twenty-six steps, in order, each
asserting what it shows (the API key steps come last: the first key closes the open
/quota/* endpoints that the earlier steps consume through); a step's failure is reported
and the next steps still run (they may fail in turn: the first FAIL is the cause). On a
failure the page's screenshot, its source and the browser's console log are saved in a new
temp dir, whose path is printed. The last line is `console: N passed, M failed`; the exit
status is 1 when M > 0.

Only the standard library and Selenium (Debian's python3-selenium) are used; every wait
is an explicit WebDriverWait on a condition, never a bare sleep.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import re
import sys
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable

from selenium import webdriver
from selenium.common.exceptions import (
    StaleElementReferenceException,
    TimeoutException,
    WebDriverException,
)
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import Select, WebDriverWait

CHROMEDRIVER = "/usr/bin/chromedriver"
WAIT_SECONDS = 15
# How long a webhook delivery may take to show as delivered (the dispatcher runs in the
# service, every half second; a failed attempt is retried after 5 s).
DELIVERY_WAIT_SECONDS = 30

POLICY_ID = "sms-daily"
ACTION = "sms"
SUBJECT = "user-1"
LIMIT = 3
# A rolling 24 h window: no period boundary (midnight) can reset the usage mid-test.
POLICY = {
    "id": POLICY_ID,
    "action": ACTION,
    "measure": "count",
    "limit": LIMIT,
    "window": {"type": "rolling", "seconds": 86400, "bucket_seconds": 3600},
    "ledger_denials": True,
    "description": "browser test: 3 SMS in any 24 hours",
}

# What the API key steps consume through a key: a policy of their own, with room to spare.
KEY_ACTION = "mail.send"
KEY_GLOB = "mail.*"
KEY_SUBJECT = "user-k"
KEY_POLICY = {
    "id": "mail-daily",
    "action": KEY_ACTION,
    "measure": "count",
    "limit": 100,
    "window": {"type": "rolling", "seconds": 86400, "bucket_seconds": 3600},
}
KEY_NAME = "browser mail"
READER_NAME = "browser reader"

# The velocity steps: calendar anchors, request and lifetime windows and match_not, edited
# through the form's controls (never its JSON box), on an action of their own.
CARD_ACTION = "card.spend"
CARD_SUBJECT = "card-1"
DAY_ID = "card-daily"  # a calendar day from 04:00 New York time, except in the US
REQUEST_ID = "card-max"  # a per-request maximum
REQUEST_LIMIT = 500
MONTH_ID = "card-monthly"  # made through the API as a plain month, then edited
MONTH_POLICY = {
    "id": MONTH_ID,
    "action": CARD_ACTION,
    "measure": "amount",
    "limit": 1000000,
    "window": {"type": "calendar", "period": "month", "timezone": "UTC"},
    "match": {"channel": ["online", "phone"]},
}
LIFETIME_ID = "card-lifetime"  # needs QUOTA_LEDGER_RETENTION_DAYS=forever (scripts/console.sh)
LIFETIME_POLICY = {
    "id": LIFETIME_ID,
    "action": CARD_ACTION,
    "measure": "amount",
    "limit": 1000,
    "window": {"type": "lifetime"},
}


# The alert steps: thresholds set through the policy form, then an endpoint made on the
# webhooks page that points at a receiver this test runs, on an action of their own.
ALERT_ACTION = "alert.send"
ALERT_SUBJECT = "user-a"
ALERT_ID = "alert-daily"
ALERT_POLICY = {
    "id": ALERT_ID,
    "action": ALERT_ACTION,
    "measure": "count",
    "limit": 4,
    "window": {"type": "rolling", "seconds": 86400, "bucket_seconds": 3600},
}
WEBHOOK_ID = "ops-alerts"  # made on the page; disabled at the end, kept for the read-only step
SPARE_WEBHOOK_ID = "spare-alerts"  # made through the API, deleted on the page

# The backtest step: a policy with recorded traffic (denials included), tried in its form
# with a lower limit, on an action of its own.
TRY_ACTION = "push.send"
TRY_ID = "push-daily"
TRY_POLICY = {
    "id": TRY_ID,
    "action": TRY_ACTION,
    "measure": "count",
    "limit": 5,
    "window": {"type": "rolling", "seconds": 86400, "bucket_seconds": 3600},
    "ledger_denials": True,
}
TRY_LIMIT = 2  # the limit typed into the form and tried, never saved
# The consumes, in order: user-p1 past the live limit (two denied), user-p2 within it.
TRY_TRAFFIC = ["user-p1"] * 7 + ["user-p2"] * 3


class StepFailed(AssertionError):
    """A check of a step did not hold."""


def check(condition: bool, message: str) -> None:
    if not condition:
        raise StepFailed(message)


# ---------------------------------------------------------------------------
# HTTP, for what the test does behind the console's back
# ---------------------------------------------------------------------------


class Answer:
    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


def http(
    base: str,
    method: str,
    path: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    """One request; any status is returned (urllib raises on 4xx/5xx, caught here)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return Answer(response.status, response.headers, response.read())
    except urllib.error.HTTPError as error:
        return Answer(error.code, error.headers, error.read())


# ---------------------------------------------------------------------------
# A webhook receiver, for the webhook steps
# ---------------------------------------------------------------------------


class Receiver:
    """A webhook receiver on 127.0.0.1 (a free port), in a thread: it answers every POST
    204 and records its headers (names lower-cased) and body."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with receiver.lock:
                    receiver.requests.append({
                        "path": self.path,
                        "headers": {k.lower(): v for k, v in self.headers.items()},
                        "body": body,
                    })
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/quota"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def received(self, event_id: str) -> list[dict[str, Any]]:
        """The requests that carried `webhook-id: event_id` (a retry repeats the id)."""
        with self.lock:
            return [r for r in self.requests if r["headers"].get("webhook-id") == event_id]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def signed_by(secret: str, request: dict[str, Any]) -> bool:
    """Whether one of the request's `webhook-signature` values (`v1,<base64>`, separated
    by spaces) is the HMAC-SHA256 of `id.timestamp.body` under `secret` (Standard Webhooks:
    the key is the base64 after `whsec_`)."""
    headers = request["headers"]
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers.get('webhook-id')}.{headers.get('webhook-timestamp')}.".encode() + request["body"]
    expected = "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(hmac.compare_digest(expected, s) for s in headers.get("webhook-signature", "").split())


# ---------------------------------------------------------------------------
# The browser
# ---------------------------------------------------------------------------


def start_browser() -> WebDriver:
    options = Options()
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--window-size=1280,900",
        "--disable-dev-shm-usage",
        "--no-first-run",
        "--lang=en-US",
    ):
        options.add_argument(argument)
    # The browser's console log (JavaScript errors, CSP violations) is saved on a failure.
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


class Console:
    """The browser on the console, with the waits the steps share."""

    def __init__(self, driver: WebDriver) -> None:
        self.driver = driver

    def wait(self, what: str, condition: Callable[[WebDriver], Any], seconds: float = WAIT_SECONDS) -> Any:
        """Waits for a truthy `condition(driver)`; fails the step naming `what`."""
        try:
            # A re-rendered element goes stale under a check: the next poll finds the new one.
            return WebDriverWait(
                self.driver, seconds, ignored_exceptions=(StaleElementReferenceException,)
            ).until(condition)
        except TimeoutException:
            message = self.message()
            raise StepFailed(
                f"timed out after {seconds} s waiting for {what}"
                + (f" (#message: {message!r})" if message else "")
            ) from None

    def find(self, css: str) -> WebElement | None:
        found = self.driver.find_elements(By.CSS_SELECTOR, css)
        return found[0] if found else None

    def visible(self, css: str) -> WebElement:
        def shown(driver: WebDriver) -> WebElement | None:
            element = self.find(css)
            return element if element is not None and element.is_displayed() else None

        return self.wait(f"{css} to be visible", shown)

    def click(self, css: str) -> None:
        self.visible(css).click()

    def type(self, css: str, text: str) -> None:
        element = self.visible(css)
        element.clear()
        element.send_keys(text)

    def message(self) -> str:
        element = self.find("#message")
        return element.text.strip() if element is not None else ""

    def go(self, nav_id: str, page_id: str) -> None:
        """Follows a navigation link and waits for its page."""
        self.click(f"#{nav_id}")
        self.visible(f"#{page_id}")

    def no_script_errors(self) -> None:
        """No JavaScript error or CSP violation was logged since the last call (a failed
        request, such as the wrong token's 401, is logged too and is fine)."""
        bad = [
            entry["message"]
            for entry in self.driver.get_log("browser")
            if any(s in entry["message"] for s in ("Content Security Policy", "Refused to", "Uncaught"))
        ]
        check(not bad, f"the browser logged: {bad}")

    def shot(self, directory: str | None, name: str) -> None:
        if directory:
            self.driver.save_screenshot(os.path.join(directory, name))


# ---------------------------------------------------------------------------
# The steps
# ---------------------------------------------------------------------------


class Run:
    """State carried from step to step."""

    def __init__(self, console: Console, base: str, token: str, shots: str | None) -> None:
        self.console = console
        self.base = base
        self.token = token
        self.shots = shots
        self.consumption_ids: list[str] = []
        self.key_secret = ""  # the key created through the console, read from its panel
        self.key_id = ""
        self.receiver: Receiver | None = None  # started by the first webhook step
        self.webhook_secret = ""  # the endpoint's signing secret, read from its panel
        self.previous_secret = ""  # the one before the rotation, still signing

    def key_consume(self, key: str | None, action: str = KEY_ACTION) -> Answer:
        """A consume with `key` as the bearer (none: no Authorization header)."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return http(self.base, "POST", "/quota/consume", {"action": action, "subject": KEY_SUBJECT}, headers)

    def listed_key(self, name: str) -> dict[str, Any]:
        answer = http(self.base, "GET", "/admin/keys", headers=self.admin())
        check(answer.status == 200, f"GET /admin/keys answered {answer.status}")
        found = [k for k in answer.json()["items"] if k["name"] == name]
        check(len(found) == 1, f"not one key named {name!r} in {answer.json()['items']}")
        return found[0]

    def admin(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def consume(self) -> Answer:
        return http(self.base, "POST", "/quota/consume", {"action": ACTION, "subject": SUBJECT})

    def allowed_consume(self, used: int) -> None:
        answer = self.consume()
        check(answer.status == 200, f"consume answered {answer.status}: {answer.body[:300]!r}")
        body = answer.json()
        check(body["allowed"] is True, f"consume not allowed: {body}")
        check(bool(body["consumption_id"]), f"consume has no consumption_id: {body}")
        usage = [p for p in body["policies"] if p["policy_id"] == POLICY_ID]
        check(len(usage) == 1 and usage[0]["used"] == used,
              f"expected {POLICY_ID} used={used} after the consume, got {body['policies']}")
        self.consumption_ids.append(body["consumption_id"])

    def policy(self, policy_id: str) -> dict[str, Any]:
        """The policy as the service has it (GET /admin/policies/{id})."""
        answer = http(self.base, "GET", f"/admin/policies/{policy_id}", headers=self.admin())
        check(answer.status == 200, f"GET /admin/policies/{policy_id} answered {answer.status}")
        return answer.json()

    def progressbar(self) -> WebElement | None:
        return self.console.find(
            f'#lookup-result [data-usage-policy="{POLICY_ID}"] [role="progressbar"]')


def step_served_with_csp(run: Run) -> None:
    """GET /console/ carries the CSP; app.js and app.css are served with their types."""
    page = http(run.base, "GET", "/console/")
    check(page.status == 200, f"GET /console/ answered {page.status}")
    csp = page.headers.get("Content-Security-Policy") or ""
    check("script-src 'self'" in csp, f"Content-Security-Policy lacks script-src 'self': {csp!r}")
    check("default-src 'none'" in csp, f"Content-Security-Policy lacks default-src 'none': {csp!r}")
    check("text/html" in (page.headers.get("Content-Type") or ""), "/console/ is not text/html")
    html = re.sub(r"<!--.*?-->", "", page.body.decode(), flags=re.S)  # comments aside
    scripts = re.findall(r"<script\b[^>]*>", html)
    check(scripts == ['<script src="app.js" defer>', '<script src="webhooks.js" defer>'],
          f"the page must load app.js and webhooks.js only, no inline script: {scripts}")
    for name in ("app.js", "webhooks.js"):
        script = http(run.base, "GET", f"/console/{name}")
        check(script.status == 200, f"GET /console/{name} answered {script.status}")
        check("javascript" in (script.headers.get("Content-Type") or ""),
              f"{name} has Content-Type {script.headers.get('Content-Type')!r}")
        check("script-src 'self'" in (script.headers.get("Content-Security-Policy") or ""),
              f"{name} is served without the Content-Security-Policy")
    style = http(run.base, "GET", "/console/app.css")
    check(style.status == 200 and "text/css" in (style.headers.get("Content-Type") or ""),
          f"app.css answered {style.status} {style.headers.get('Content-Type')!r}")


def step_sign_in(run: Run) -> None:
    """A wrong token is refused with a message; the right one opens the policies page."""
    c = run.console
    c.driver.get(run.base + "/console/")
    c.type("#token", "wrong-" + run.token)
    c.click("#sign-in")
    c.wait("the wrong-token message", lambda d: "wrong token" in c.message().lower())
    check(c.driver.execute_script("return sessionStorage.length") == 0,
          "a refused token was kept in sessionStorage")
    check(not c.find("#nav").is_displayed(), "the navigation shows before sign-in")

    c.type("#token", run.token)
    c.click("#sign-in")
    c.visible("#policies-table")
    c.visible("#nav-policies")
    c.visible("#sign-out")
    check(c.driver.current_url.endswith("#/policies"), f"not on #/policies: {c.driver.current_url}")
    check(run.token not in c.driver.current_url, "the token is in the URL")
    check(c.driver.execute_script("return document.cookie") == "", "the console set a cookie")
    stored = c.driver.execute_script("return Object.values(sessionStorage)")
    check(stored == [run.token], "the token is not (only) in sessionStorage")
    c.no_script_errors()


def step_create_policy(run: Run) -> None:
    """A policy created through the form's JSON shows in the table and in the API."""
    c = run.console
    c.click("#new-policy")
    c.visible("#policy-form")
    c.type("#policy-json", json.dumps(POLICY))
    # The form fields follow the JSON.
    c.wait("#policy-id to follow the JSON",
           lambda d: c.find("#policy-id").get_attribute("value") == POLICY_ID)
    c.click("#policy-save")
    row = c.wait(f"the row of {POLICY_ID}",
                 lambda d: c.find(f'#policies-table tr[data-policy-id="{POLICY_ID}"]'))
    check(row.get_attribute("data-enabled") == "true", "the new policy is not shown enabled")
    c.wait("the editor to close", lambda d: not c.find("#policy-editor").is_displayed())
    answer = http(run.base, "GET", f"/admin/policies/{POLICY_ID}", headers=run.admin())
    check(answer.status == 200, f"GET /admin/policies/{POLICY_ID} answered {answer.status}")
    stored = answer.json()
    check(stored["limit"] == LIMIT and stored["ledger_denials"] is True, f"stored policy differs: {stored}")
    c.shot(run.shots, "policies.png")
    c.no_script_errors()


def step_consume_twice(run: Run) -> None:
    """Two consumes through the API are allowed and counted."""
    run.allowed_consume(used=1)
    run.allowed_consume(used=2)


def step_lookup(run: Run) -> None:
    """The lookup's bar shows 2 of 3, and 3 after one more consume and a refresh."""
    c = run.console
    c.go("nav-lookup", "page-lookup")
    c.type("#lookup-action", ACTION)
    c.type("#lookup-subject", SUBJECT)
    c.click("#lookup-go")

    def bar_at(value: int) -> Callable[[WebDriver], Any]:
        def at(driver: WebDriver) -> WebElement | None:
            bar = run.progressbar()
            return bar if bar is not None and bar.get_attribute("aria-valuenow") == str(value) else None
        return at

    bar = c.wait("the progressbar at 2", bar_at(2))
    check(bar.get_attribute("aria-valuemax") == str(LIMIT), f"aria-valuemax is not {LIMIT}")
    check(bar.get_attribute("aria-valuemin") == "0", "aria-valuemin is not 0")
    check(bar.get_attribute("aria-label") == f"{POLICY_ID} usage", "the progressbar's label differs")
    card = c.find(f'#lookup-result [data-usage-policy="{POLICY_ID}"]')
    check("2 / 3" in card.text and "1 remaining" in card.text, f"usage numbers not shown: {card.text!r}")
    check("UTC" in card.text, "resets_at is not shown in UTC")
    width_before = bar.find_element(By.CSS_SELECTOR, ".meter-fill").size["width"]
    c.shot(run.shots, "lookup.png")

    run.allowed_consume(used=3)
    c.click("#lookup-go")  # the same lookup again
    bar = c.wait("the progressbar at 3", bar_at(3))
    width_after = bar.find_element(By.CSS_SELECTOR, ".meter-fill").size["width"]
    check(width_after > width_before, f"the bar did not grow ({width_before} -> {width_after} px)")
    card = c.find(f'#lookup-result [data-usage-policy="{POLICY_ID}"]')
    check("exhausted" in card.text.lower(), "a used-up budget is not called exhausted in words")
    c.no_script_errors()


def step_ledger(run: Run) -> None:
    """'Ledger for this subject' lists the subject's charges, with their consumption ids."""
    c = run.console
    c.click("#lookup-ledger-link")
    c.visible("#page-ledger")
    rows = c.wait("charge rows in #ledger-table", lambda d: d.find_elements(
        By.CSS_SELECTOR, '#ledger-table tbody tr[data-kind="charge"]'))
    check(c.find("#ledger-subject").get_attribute("value") == SUBJECT, "#ledger-subject is not the subject")
    check(c.find("#ledger-action").get_attribute("value") == ACTION, "#ledger-action is not the action")
    all_rows = c.driver.find_elements(By.CSS_SELECTOR, "#ledger-table tbody tr")
    check(all(r.get_attribute("data-entry-id") for r in all_rows), "a ledger row has no data-entry-id")
    ids = {r.get_attribute("data-consumption-id") for r in rows}
    missing = [i for i in run.consumption_ids if i not in ids]
    check(not missing, f"consumption ids {missing} are not among the rows ({sorted(ids)})")
    check(all(SUBJECT in r.text for r in all_rows), "a row of another subject is listed")
    check(c.find("#ledger-newer").get_attribute("disabled") is not None, "Newer is enabled on the first page")
    c.shot(run.shots, "ledger.png")
    c.no_script_errors()


def step_denied(run: Run) -> None:
    """The fourth consume is denied (429), and the denial is in the ledger."""
    answer = run.consume()
    check(answer.status == 429, f"the 4th consume answered {answer.status}, not 429")
    check(answer.json()["allowed"] is False, "the 429 says allowed")
    c = run.console
    Select(c.visible("#ledger-kind")).select_by_value("deny")
    c.click("#ledger-go")
    c.wait("a deny row in #ledger-table", lambda d: d.find_elements(
        By.CSS_SELECTOR, '#ledger-table tbody tr[data-kind="deny"]'))
    kinds = {r.get_attribute("data-kind") for r in c.driver.find_elements(By.CSS_SELECTOR, "#ledger-table tbody tr")}
    check(kinds == {"deny"}, f"kind=deny lists other kinds too: {kinds}")
    check("kind=deny" in c.driver.current_url, "the kind filter is not in the URL")
    c.no_script_errors()


def step_today(run: Run) -> None:
    """Today's sms section counts 3 charges and 1 denial; the denied subject is listed."""
    c = run.console
    c.go("nav-today", "page-today")
    section = f'#today [data-activity-action="{ACTION}"]'

    def total(name: str) -> str:
        element = c.find(f'{section} [data-total="{name}"]')
        return element.text.strip() if element is not None else ""

    c.wait("the sms denials total to be 1", lambda d: total("denials") == "1")
    check(total("charges") == "3", f"charges total is {total('charges')!r}, not 3")
    check(total("amount") == "3", f"amount total is {total('amount')!r}, not 3")
    titles = c.driver.execute_script(
        "return Array.from(document.querySelectorAll(arguments[0] + ' svg rect > title'))"
        ".map(t => t.textContent)", section)
    check(any("1 denial" in t for t in titles), f"no bar's <title> tells the denial: {titles[:5]}")
    check(any("charge" in t for t in titles), "no bar's <title> tells the charges")
    row = c.wait("user-1 in #top-denied", lambda d: next(
        (r for r in d.find_elements(By.CSS_SELECTOR, "#top-denied tbody tr") if SUBJECT in r.text), None))
    link = row.find_element(By.PARTIAL_LINK_TEXT, "Budget lookup")
    check(f"subject={SUBJECT}" in (link.get_attribute("href") or ""), "the top-denied link does not name the subject")
    c.shot(run.shots, "today.png")
    c.no_script_errors()


def step_conflict_and_toggle(run: Run) -> None:
    """A save over someone else's change shows the conflict; re-apply; then disable."""
    c = run.console
    c.go("nav-policies", "page-policies")
    c.click(f'#policies-table tr[data-policy-id="{POLICY_ID}"] button[data-action="edit"]')
    c.wait("the editor on the policy", lambda d: '"sms-daily"' in (c.find("#policy-json").get_attribute("value") or ""))

    # Someone else changes the limit to 5 through the API.
    read = http(run.base, "GET", f"/admin/policies/{POLICY_ID}", headers=run.admin())
    check(read.status == 200, f"GET answered {read.status}")
    theirs = {k: v for k, v in read.json().items() if k not in ("created_at", "updated_at", "version")}
    theirs["limit"] = 5
    put = http(run.base, "PUT", f"/admin/policies/{POLICY_ID}", theirs,
               {**run.admin(), "If-Match": read.headers["ETag"]})
    check(put.status == 200, f"the PUT behind the console's back answered {put.status}: {put.body[:300]!r}")

    # The console still edits the old version: set the limit to 10 and save.
    c.type("#policy-limit", "10")
    c.wait("the JSON to follow the limit field",
           lambda d: json.loads(c.find("#policy-json").get_attribute("value")).get("limit") == 10)
    c.click("#policy-save")
    c.visible("#policy-conflict")
    row = c.wait("the limit row of the conflict", lambda d: c.find('#policy-conflict tr[data-field="limit"]'))
    theirs_cell = row.find_element(By.CSS_SELECTOR, '[data-side="theirs"]').text.strip()
    yours_cell = row.find_element(By.CSS_SELECTOR, '[data-side="yours"]').text.strip()
    check(theirs_cell == "5" and yours_cell == "10", f"conflict shows theirs={theirs_cell!r} yours={yours_cell!r}")
    check("412" in c.message(), f"the 412 is not shown: {c.message()!r}")
    check(http(run.base, "GET", f"/admin/policies/{POLICY_ID}", headers=run.admin()).json()["limit"] == 5,
          "the conflicting save changed the policy")
    c.shot(run.shots, "conflict.png")

    # Re-apply: the user's version is saved over theirs.
    c.click("#conflict-reapply")
    c.wait("the editor to close after re-applying", lambda d: not c.find("#policy-editor").is_displayed())
    now = http(run.base, "GET", f"/admin/policies/{POLICY_ID}", headers=run.admin()).json()
    check(now["limit"] == 10, f"re-applying did not save limit 10: {now['limit']}")

    # Disable through the toggle.
    c.click(f'#policies-table tr[data-policy-id="{POLICY_ID}"] button[data-action="toggle"]')
    row = c.wait("the row marked disabled", lambda d: next(
        (r for r in d.find_elements(By.CSS_SELECTOR, f'#policies-table tr[data-policy-id="{POLICY_ID}"]')
         if r.get_attribute("data-enabled") == "false"), None))
    check("Disabled" in row.find_element(By.CSS_SELECTOR, "[data-status]").text, "the row does not say Disabled")
    now = http(run.base, "GET", f"/admin/policies/{POLICY_ID}", headers=run.admin()).json()
    check(now["enabled"] is False and now["limit"] == 10, f"the stored policy is not disabled at limit 10: {now}")
    c.no_script_errors()



# Every form control of the page, with whether it has an accessible name: a <label for>,
# an enclosing <label>, aria-label or aria-labelledby. Hidden controls count too (each
# page is hidden until shown), so one pass checks every page.
UNLABELLED_CONTROLS = """
return Array.from(document.querySelectorAll('input, select, textarea'))
  .filter((el) => el.type !== 'hidden')
  .filter((el) => !(el.id && document.querySelector('label[for="' + CSS.escape(el.id) + '"]'))
    && !el.closest('label') && !el.getAttribute('aria-label')
    && !el.getAttribute('aria-labelledby'))
  .map((el) => el.outerHTML.slice(0, 120));
"""


def step_accessibility(run: Run) -> None:
    c = run.console
    unlabelled = c.driver.execute_script(UNLABELLED_CONTROLS)
    check(not unlabelled, f"form controls without a label: {unlabelled}")
    # The keyboard alone: from the page's start, Tab reaches the "Today" link, Enter
    # follows it, and the page's own controls are reached by Tab in turn.
    c.driver.get(f"{run.base}/console/#/policies")
    c.visible("#page-policies")
    body = c.driver.find_element(By.TAG_NAME, "body")
    body.click()
    reached = None
    for _ in range(40):
        c.driver.switch_to.active_element.send_keys(Keys.TAB)
        active = c.driver.switch_to.active_element
        if active.get_attribute("id") == "nav-today":
            reached = active
            break
    check(reached is not None, "Tab never reached the Today link")
    reached.send_keys(Keys.ENTER)
    c.visible("#page-today")
    visited = set()
    for _ in range(15):
        c.driver.switch_to.active_element.send_keys(Keys.TAB)
        visited.add(c.driver.switch_to.active_element.get_attribute("id"))
    check("today-refresh" in visited, f"Tab on the Today page never reached its Refresh button: {visited}")
    # Statuses are words, not colours alone: the policy row says what state it is in.
    c.go("nav-policies", "page-policies")
    row = c.visible(f'#policies-table tr[data-policy-id="{POLICY_ID}"]')
    status = row.find_element(By.CSS_SELECTOR, "[data-status]").text
    check(status.strip() != "", "the policy's status cell has no words")
    c.no_script_errors()


# ----- Velocity controls in the policy form ------------------------------------------------


def editor_json(c: Console) -> Any:
    """The policy in the editor's JSON box (None while it does not parse)."""
    try:
        return json.loads(c.find("#policy-json").get_attribute("value") or "")
    except ValueError:
        return None


def wait_json(c: Console, what: str, condition: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Waits until the editor's JSON (a dict) satisfies `condition`; returns it."""
    def holds(driver: WebDriver) -> dict[str, Any] | None:
        obj = editor_json(c)
        return obj if isinstance(obj, dict) and condition(obj) else None
    return c.wait(f"the JSON to have {what}", holds)


def text_of(c: Console, css: str) -> str:
    """The element's text, stripped ('' when there is no such element)."""
    element = c.find(css)
    return element.text.strip() if element is not None else ""


def shown(c: Console, css: str) -> bool:
    element = c.find(css)
    return element is not None and element.is_displayed()


def check_shown(c: Console, expected: dict[str, bool]) -> None:
    """Each control in `expected` is shown (True) or hidden (False)."""
    wrong = {css: want for css, want in expected.items() if shown(c, css) != want}
    check(not wrong, f"controls shown/hidden wrongly (expected): {wrong}")


def select(c: Console, css: str, value: str) -> None:
    Select(c.visible(css)).select_by_value(value)


def open_new_policy(c: Console) -> None:
    c.go("nav-policies", "page-policies")
    c.click("#new-policy")
    c.visible("#policy-form")
    c.wait("the editor to start from the template", lambda d: (editor_json(c) or {}).get("id") == "")


def open_policy(c: Console, policy_id: str) -> None:
    c.go("nav-policies", "page-policies")
    c.click(f'#policies-table tr[data-policy-id="{policy_id}"] button[data-action="edit"]')
    c.wait(f"the editor on {policy_id}", lambda d: (editor_json(c) or {}).get("id") == policy_id)


def save_policy(c: Console) -> None:
    c.click("#policy-save")
    c.wait("the editor to close after saving", lambda d: not c.find("#policy-editor").is_displayed())


def row_text(c: Console, policy_id: str, words: str) -> str:
    """Waits for the policy's row in the table to say `words`; returns its text."""
    css = f'#policies-table tr[data-policy-id="{policy_id}"]'
    row = c.wait(f"the row of {policy_id} to say {words!r}",
                 lambda d: next((r for r in d.find_elements(By.CSS_SELECTOR, css) if words in r.text), None))
    return row.text


ANCHORS = {
    "week_start": "#policy-window-week-start",
    "day_start": "#policy-window-day-start",
    "month_day": "#policy-window-month-day",
    "year_month": "#policy-window-year-month",
}


def anchors_shown(c: Console, *names: str) -> None:
    """Of the four anchor controls, exactly `names` are shown."""
    check_shown(c, {css: name in names for name, css in ANCHORS.items()})


def step_form_day_start(run: Run) -> None:
    """Through the form's controls alone: a calendar day from 04:00 New York time, except in
    the US (match_not); the service stores day_start "04:00", and the row says so in words."""
    c = run.console
    open_new_policy(c)
    c.type("#policy-id", DAY_ID)
    c.type("#policy-action", CARD_ACTION)
    select(c, "#policy-measure", "amount")
    c.type("#policy-limit", "100000")
    select(c, "#policy-window-type", "calendar")
    select(c, "#policy-window-period", "day")
    anchors_shown(c, "day_start")
    c.type("#policy-window-timezone", "America/New_York")
    c.type("#policy-window-day-start", "04:00")
    c.type("#policy-match-not", "country = US")
    wait_json(c, 'window.day_start "04:00" and match_not country US',
              lambda p: p["window"].get("day_start") == "04:00" and p.get("match_not") == {"country": ["US"]})
    save_policy(c)
    stored = run.policy(DAY_ID)
    window = stored["window"]
    check(window.get("day_start") == "04:00", f"the saved window has no day_start 04:00: {window}")
    check(window.get("period") == "day" and window.get("timezone") == "America/New_York",
          f"the saved window is not a New York day: {window}")
    check(stored.get("match_not") == {"country": ["US"]}, f"match_not was not saved: {stored.get('match_not')}")
    check(stored["measure"] == "amount" and stored["limit"] == 100000, f"the saved policy differs: {stored}")
    text = row_text(c, DAY_ID, "per calendar day from 04:00 (America/New_York)")
    check("country not in US" in text, f"the row does not tell match_not: {text!r}")
    c.no_script_errors()


def step_form_request(run: Run) -> None:
    """The form makes a per-request maximum: the window type alone, with its hint; no period,
    zone, anchor or seconds control shows; saved as {"type": "request"}."""
    c = run.console
    open_new_policy(c)
    c.type("#policy-id", REQUEST_ID)
    c.type("#policy-action", CARD_ACTION)
    select(c, "#policy-measure", "amount")
    c.type("#policy-limit", str(REQUEST_LIMIT))
    select(c, "#policy-window-type", "request")
    hint = c.visible("#policy-window-type-hint").text
    check("maximum per request" in hint and "nothing accumulates" in hint,
          f"the request window's hint is not shown: {hint!r}")
    check_shown(c, {"#policy-window-period": False, "#policy-window-timezone": False,
                    "#policy-window-seconds": False, "#policy-window-bucket-seconds": False})
    anchors_shown(c)
    wait_json(c, 'window {"type": "request"}', lambda p: p["window"] == {"type": "request"})
    save_policy(c)
    stored = run.policy(REQUEST_ID)
    check(stored["window"] == {"type": "request"}, f"the saved window is not a request: {stored['window']}")
    check(stored["limit"] == REQUEST_LIMIT, f"the saved limit is {stored['limit']}")
    row_text(c, REQUEST_ID, "per request (a maximum per request)")
    c.no_script_errors()


def step_form_month_day(run: Run) -> None:
    """A month policy (made through the API, with a match) edited in the form to start on the
    15th: the match shows as `key = values`, the month's anchors show, month_day 15 is saved."""
    created = http(run.base, "POST", "/admin/policies", MONTH_POLICY, run.admin())
    check(created.status == 201, f"creating {MONTH_ID} answered {created.status}: {created.body[:300]!r}")
    c = run.console
    c.go("nav-policies", "page-policies")
    c.click("#policies-refresh")
    open_policy(c, MONTH_ID)
    match = c.visible("#policy-match").get_attribute("value")
    check(match == "channel = online, phone", f"the match control shows {match!r}")
    anchors_shown(c, "day_start", "month_day")
    c.type("#policy-window-month-day", "15")
    wait_json(c, "window.month_day 15", lambda p: p["window"].get("month_day") == 15)
    save_policy(c)
    stored = run.policy(MONTH_ID)
    check(stored["window"].get("month_day") == 15 and stored["window"]["period"] == "month",
          f"the saved window is not a month from the 15th: {stored['window']}")
    check(stored.get("match") == MONTH_POLICY["match"], f"the match changed: {stored.get('match')}")
    row_text(c, MONTH_ID, "per calendar month from the 15th (UTC)")
    c.no_script_errors()


def step_form_period_change(run: Run) -> None:
    """A period change keeps the anchors the new period takes and drops the others: the month
    from the 15th becomes a year from the 15th of April, then weeks from Sunday (month_day
    and year_month gone), each saved valid."""
    c = run.console
    open_policy(c, MONTH_ID)
    select(c, "#policy-window-period", "year")
    anchors_shown(c, "day_start", "month_day", "year_month")
    check(c.find("#policy-window-month-day").get_attribute("value") == "15", "the year lost month_day 15")
    c.type("#policy-window-year-month", "4")
    wait_json(c, "a year from the 15th of April",
              lambda p: p["window"].get("period") == "year" and p["window"].get("month_day") == 15
              and p["window"].get("year_month") == 4)
    save_policy(c)
    window = run.policy(MONTH_ID)["window"]
    check(window.get("period") == "year" and window.get("month_day") == 15 and window.get("year_month") == 4,
          f"the saved window is not a year from the 15th of April: {window}")
    row_text(c, MONTH_ID, "per calendar year from the 15th of April")

    open_policy(c, MONTH_ID)
    select(c, "#policy-window-period", "week")
    anchors_shown(c, "week_start", "day_start")
    wait_json(c, "a week without month_day and year_month",
              lambda p: p["window"].get("period") == "week"
              and "month_day" not in p["window"] and "year_month" not in p["window"])
    week_start = Select(c.find("#policy-window-week-start"))
    check(week_start.first_selected_option.get_attribute("value") == "",
          "week_start does not show its default choice")
    select(c, "#policy-window-week-start", "sunday")
    wait_json(c, "week_start sunday", lambda p: p["window"].get("week_start") == "sunday")
    save_policy(c)
    window = run.policy(MONTH_ID)["window"]
    check(window.get("period") == "week" and window.get("week_start") == "sunday"
          and "month_day" not in window and "year_month" not in window,
          f"the saved window is not weeks from Sunday alone: {window}")
    row_text(c, MONTH_ID, "weeks from Sunday")

    # The default choice leaves week_start out again (not saved).
    open_policy(c, MONTH_ID)
    select(c, "#policy-window-week-start", "")
    wait_json(c, "no week_start", lambda p: "week_start" not in p["window"])
    c.click("#policy-cancel")
    c.no_script_errors()


def step_form_field_errors(run: Run) -> None:
    """A 422's field errors show at their controls: day_start 25:00 under the day-start
    field (window.day_start), a key with no value under match_not (match_not.country)."""
    c = run.console
    open_policy(c, DAY_ID)
    c.type("#policy-window-day-start", "25:00")
    c.type("#policy-match-not", "country =")
    wait_json(c, "day_start 25:00 and an empty country",
              lambda p: p["window"].get("day_start") == "25:00" and p.get("match_not") == {"country": []})
    c.click("#policy-save")
    c.wait("the 422 to be shown", lambda d: "422" in c.message())
    check("day_start" in text_of(c, "#message"), f"the 422 does not name window.day_start: {c.message()!r}")
    check(text_of(c, "#policy-window-day-start-error") != "", "the day-start field shows no error")
    check(shown(c, "#policy-window-day-start-error"), "the day-start error is not shown")
    check(c.find("#policy-window-day-start").get_attribute("aria-invalid") == "true",
          "the day-start field is not marked invalid")
    check(text_of(c, "#policy-match-not-error") != "", "the match_not field shows no error")
    check(c.find("#policy-match-not").get_attribute("aria-invalid") == "true", "match_not is not marked invalid")
    beside = c.driver.execute_script(
        "return ['policy-window-day-start', 'policy-match-not'].every((id) =>"
        " document.getElementById(id + '-error').parentElement === document.getElementById(id).parentElement)")
    check(beside, "a field error is not in its control's field")
    leftover = text_of(c, "#policy-json-error")
    check(not leftover, f"field errors were left under the JSON, not at their controls: {leftover!r}")
    check(c.find("#policy-editor").is_displayed(), "the editor closed on a 422")
    stored = run.policy(DAY_ID)
    check(stored["window"].get("day_start") == "04:00" and stored.get("match_not") == {"country": ["US"]},
          f"the refused edit changed the policy: {stored}")
    c.click("#policy-cancel")
    c.no_script_errors()


def step_usage_cards(run: Run) -> None:
    """A lifetime policy (made through the admin API) shows its meter and "Never resets" in
    the lookup; the per-request maximum's card says so instead of a meter."""
    created = http(run.base, "POST", "/admin/policies", LIFETIME_POLICY, run.admin())
    check(created.status == 201, f"creating {LIFETIME_ID} answered {created.status}: {created.body[:300]!r}")
    answer = http(run.base, "POST", "/quota/consume", {"action": CARD_ACTION, "subject": CARD_SUBJECT, "amount": 30})
    check(answer.status == 200 and answer.json()["allowed"] is True,
          f"a consume of {CARD_ACTION} answered {answer.status}: {answer.body[:300]!r}")
    lifetime = [p for p in answer.json()["policies"] if p["policy_id"] == LIFETIME_ID]
    check(len(lifetime) == 1 and lifetime[0]["resets_at"] is None,
          f"the lifetime policy's usage is not one that never resets: {answer.json()['policies']}")
    c = run.console
    c.go("nav-lookup", "page-lookup")
    c.type("#lookup-action", CARD_ACTION)
    c.type("#lookup-subject", CARD_SUBJECT)
    c.click("#lookup-go")
    bar = c.visible(f'#lookup-result [data-usage-policy="{LIFETIME_ID}"] [role="progressbar"]')
    check(bar.get_attribute("aria-valuenow") == "30", f"the lifetime bar is at {bar.get_attribute('aria-valuenow')}")
    card = c.find(f'#lookup-result [data-usage-policy="{LIFETIME_ID}"]')
    check("Never resets" in card.text, f"the lifetime card does not say Never resets: {card.text!r}")
    check("1970" not in card.text and "Invalid" not in card.text, f"the lifetime card shows a date: {card.text!r}")
    check("lifetime (never resets)" in card.text, f"the card does not name the window: {card.text!r}")

    card = c.visible(f'#lookup-result [data-usage-policy="{REQUEST_ID}"]')
    check(not card.find_elements(By.CSS_SELECTOR, '[role="progressbar"]'), "the per-request card has a meter")
    check("Per-request maximum" in card.text and f"at most {REQUEST_LIMIT}" in card.text,
          f"the per-request card does not say it is a maximum per request: {card.text!r}")
    check("Resets" not in card.text, f"the per-request card shows a reset: {card.text!r}")
    c.shot(run.shots, "velocity.png")
    c.go("nav-policies", "page-policies")
    row_text(c, LIFETIME_ID, "lifetime (never resets)")
    c.no_script_errors()


# ----- Alerts: thresholds in the policy form, and the webhooks page ------------------------


def step_form_alert_thresholds(run: Run) -> None:
    """Thresholds typed as `50, 100` in the policy form are saved as [50, 100] and told in the
    row; 150 is refused with the error at the thresholds control (alert_thresholds[1]);
    emptied, the field is left out."""
    created = http(run.base, "POST", "/admin/policies", ALERT_POLICY, run.admin())
    check(created.status == 201, f"creating {ALERT_ID} answered {created.status}: {created.body[:300]!r}")
    c = run.console
    c.go("nav-policies", "page-policies")
    c.click("#policies-refresh")
    open_policy(c, ALERT_ID)
    check(c.visible("#policy-alert-thresholds").get_attribute("value") == "",
          "a policy without thresholds shows some")
    c.type("#policy-alert-thresholds", "50, 100")
    wait_json(c, "alert_thresholds [50, 100]", lambda p: p.get("alert_thresholds") == [50, 100])
    save_policy(c)
    stored = run.policy(ALERT_ID)
    check(stored["alert_thresholds"] == [50, 100], f"the saved thresholds are {stored['alert_thresholds']}")
    row_text(c, ALERT_ID, "alerts at 50%, 100%")

    open_policy(c, ALERT_ID)
    shown_value = c.visible("#policy-alert-thresholds").get_attribute("value")
    check(shown_value == "50, 100", f"the thresholds control shows {shown_value!r}")
    c.type("#policy-alert-thresholds", "50, 150")
    wait_json(c, "alert_thresholds [50, 150]", lambda p: p.get("alert_thresholds") == [50, 150])
    c.click("#policy-save")
    c.wait("the 422 to be shown", lambda d: "422" in c.message())
    error = text_of(c, "#policy-alert-thresholds-error")
    check("150" in error, f"the thresholds control does not show the error about 150: {error!r}")
    check(c.find("#policy-alert-thresholds").get_attribute("aria-invalid") == "true",
          "the thresholds control is not marked invalid")
    leftover = text_of(c, "#policy-json-error")
    check(not leftover, f"the error was left under the JSON, not at the control: {leftover!r}")
    check(run.policy(ALERT_ID)["alert_thresholds"] == [50, 100], "the refused edit changed the thresholds")

    control = c.visible("#policy-alert-thresholds")
    control.send_keys(Keys.CONTROL, "a")
    control.send_keys(Keys.BACKSPACE)  # as a user empties it (an input event, unlike clear())
    wait_json(c, "no alert_thresholds", lambda p: "alert_thresholds" not in p)
    c.click("#policy-cancel")
    c.no_script_errors()


def endpoint_row(c: Console, webhook_id: str, enabled: str | None = None) -> Callable[[WebDriver], WebElement | None]:
    """A wait condition: the webhooks table's row of `webhook_id` (with data-enabled `enabled`)."""
    def row(driver: WebDriver) -> WebElement | None:
        for r in driver.find_elements(By.CSS_SELECTOR, f'#webhooks-table tr[data-webhook-id="{webhook_id}"]'):
            if enabled is None or r.get_attribute("data-enabled") == enabled:
                return r
        return None
    return row


def delivery_row(c: Console, what: str, css: str, refresh: bool) -> WebElement:
    """Waits up to DELIVERY_WAIT_SECONDS for a delivered row matching `css` in the deliveries
    table; with `refresh`, clicks its Refresh every 2 s, else counts on the view's own polling."""
    clicked = [time.monotonic()]

    def delivered(driver: WebDriver) -> WebElement | None:
        for r in driver.find_elements(By.CSS_SELECTOR, f"#deliveries-table tbody {css}"):
            if r.get_attribute("data-state") == "delivered":
                return r
        if refresh and time.monotonic() - clicked[0] >= 2:
            clicked[0] = time.monotonic()
            c.click("#deliveries-refresh")
        return None
    return c.wait(what, delivered, DELIVERY_WAIT_SECONDS)


def one_request(run: Run, event_id: str) -> dict[str, Any]:
    """The request the receiver got for `event_id` (at least once: the first of them)."""
    got = run.receiver.received(event_id) if run.receiver else []
    check(len(got) >= 1, f"the receiver got no request with webhook-id {event_id}")
    return got[0]


def step_webhook_create(run: Run) -> None:
    """Webhooks page: a 422 names its fields; an endpoint created at the test's receiver
    shows its signing secret once; the same id again is a 409 at the id field."""
    run.receiver = Receiver()
    c = run.console
    c.go("nav-webhooks", "page-webhooks")
    check(c.find("#nav-webhooks").get_attribute("aria-current") == "page", "the nav link is not aria-current")
    c.wait("the empty endpoint list", lambda d: c.find("#webhooks-empty").is_displayed())
    check(not c.find("#webhook-form").is_displayed(), "the form shows before New endpoint")
    c.click("#new-webhook")
    c.visible("#webhook-form")
    check(c.driver.switch_to.active_element.get_attribute("id") == "webhook-id", "the focus is not on the id field")

    # A bad id, then a URL that is not http(s): each error at its own field.
    c.type("#webhook-id", "Ops alerts!")
    c.type("#webhook-url", run.receiver.url)
    c.click("#webhook-create")
    c.wait("the id field's error", lambda d: text_of(c, "#webhook-id-error") != "")
    check(c.find("#webhook-id").get_attribute("aria-invalid") == "true", "the id field is not marked invalid")
    check("422" in c.message(), f"the 422 is not shown: {c.message()!r}")
    c.type("#webhook-id", WEBHOOK_ID)
    c.type("#webhook-url", "ftp://127.0.0.1/hooks")
    c.click("#webhook-create")
    c.wait("the url field's error", lambda d: text_of(c, "#webhook-url-error") != "")
    check(text_of(c, "#webhook-id-error") == "", "the id field still shows an error")
    check(c.find("#webhook-url").get_attribute("aria-invalid") == "true", "the url field is not marked invalid")
    check(http(run.base, "GET", "/admin/webhooks", headers=run.admin()).json()["items"] == [],
          "the refused endpoint was created")

    # No resolved events; alert.* only.
    c.type("#webhook-id", WEBHOOK_ID)
    c.type("#webhook-url", run.receiver.url)
    c.type("#webhook-actions", "alert.*")
    c.click("#webhook-event-resolved")
    c.click("#webhook-create")
    panel = c.visible("#webhook-secret")
    secret = c.visible("#webhook-secret-value").get_attribute("value") or ""
    check(secret.startswith("whsec_"), f"the panel shows no signing secret: {panel.text!r}")
    check("shown once" in panel.text, f"the panel does not say the secret is shown once: {panel.text!r}")
    run.webhook_secret = secret
    c.wait("the form to close", lambda d: not c.find("#webhook-form").is_displayed())
    row = c.wait(f"the row of {WEBHOOK_ID}", endpoint_row(c, WEBHOOK_ID, "true"))
    check(run.receiver.url in row.text and "alert.*" in row.text, f"the row lacks the url or actions: {row.text!r}")
    check("webhook.test" in row.text and "budget.threshold.resolved" not in row.text,
          f"the row does not list the event types chosen: {row.text!r}")
    check("Enabled" in row.find_element(By.CSS_SELECTOR, "[data-status]").text, "the row does not say Enabled")
    check(secret not in c.find("#webhooks-table").text, "the list shows the secret")
    answer = http(run.base, "GET", f"/admin/webhooks/{WEBHOOK_ID}", headers=run.admin())
    check(answer.status == 200, f"GET /admin/webhooks/{WEBHOOK_ID} answered {answer.status}")
    stored = answer.json()
    check(stored["events"] == ["budget.threshold", "webhook.test"] and stored["actions"] == ["alert.*"]
          and stored["url"] == run.receiver.url and "secret" not in stored, f"the stored endpoint differs: {stored}")

    # The same id again: 409, at the id field; the panel (and the secret) are gone.
    c.click("#new-webhook")
    c.type("#webhook-id", WEBHOOK_ID)
    c.type("#webhook-url", run.receiver.url)
    c.click("#webhook-create")
    c.wait("the 409 at the id field", lambda d: "exists" in text_of(c, "#webhook-id-error"))
    check("409" in c.message(), f"the 409 is not shown: {c.message()!r}")
    check(not secret_kept(c, secret), "the secret is still in the page after the panel went")
    c.click("#webhook-cancel")
    c.no_script_errors()


def step_webhook_test(run: Run) -> None:
    """"Send test" opens the endpoint's deliveries, which refresh themselves until the
    webhook.test delivery is delivered; the receiver got it once, signed with the secret."""
    c = run.console
    c.click(f'#webhooks-table tr[data-webhook-id="{WEBHOOK_ID}"] button[data-action="test"]')
    c.wait("the deliveries route", lambda d: f"deliveries={WEBHOOK_ID}" in d.current_url)
    title = c.visible("#deliveries-title").text
    check(WEBHOOK_ID in title, f"the deliveries' heading does not name the endpoint: {title!r}")
    row = delivery_row(c, "the webhook.test delivery to be delivered (no click)",
                       'tr[data-event-type="webhook.test"]', refresh=False)
    event_id = row.get_attribute("data-event-id") or ""
    check(event_id.startswith("test."), f"the delivery's event id is {event_id!r}")
    check("HTTP 204" in row.text, f"the row does not show the receiver's 204: {row.text!r}")
    check(event_id in text_of(c, "#status"), f"the status does not name the test event: {text_of(c, '#status')!r}")
    link = c.find(f'#webhooks-table tr[data-webhook-id="{WEBHOOK_ID}"] a[data-link="deliveries"]')
    check(link is not None and link.get_attribute("aria-current") == "true",
          "the endpoint's Deliveries link is not marked current")
    request = one_request(run, event_id)
    check(request["path"] == "/hooks/quota", f"the receiver was called at {request['path']}")
    check(signed_by(run.webhook_secret, request),
          f"the webhook-signature does not verify with the secret: {request['headers'].get('webhook-signature')!r}")
    body = json.loads(request["body"])
    check(body.get("type") == "webhook.test" and body.get("webhook_id") == WEBHOOK_ID,
          f"the receiver got another event: {body}")
    c.no_script_errors()


def step_webhook_rotate(run: Run) -> None:
    """Rotate secret asks first, then shows the new secret once and until when the old one
    signs; the next delivery carries both signatures."""
    c = run.console
    c.click(f'#webhooks-table tr[data-webhook-id="{WEBHOOK_ID}"] button[data-action="rotate"]')
    c.visible("#confirm-dialog")
    check("24 hours" in c.find("#confirm-text").text, f"the question does not say how long: {c.find('#confirm-text').text!r}")
    c.click("#confirm-ok")
    panel = c.visible("#webhook-secret")
    secret = c.visible("#webhook-secret-value").get_attribute("value") or ""
    check(secret.startswith("whsec_") and secret != run.webhook_secret,
          f"the panel shows no new secret: {panel.text!r}")
    until = c.visible("#webhook-secret-until").text
    check("UTC" in until and "both signatures" in until, f"the panel does not say until when the old one signs: {until!r}")
    run.previous_secret, run.webhook_secret = run.webhook_secret, secret
    c.click("#webhook-secret-dismiss")
    c.wait("the panel to close", lambda d: not c.find("#webhook-secret").is_displayed())
    check(not secret_kept(c, secret), "the new secret is still in the page after it was dismissed")

    sent = http(run.base, "POST", f"/admin/webhooks/{WEBHOOK_ID}/test", headers=run.admin())
    check(sent.status == 202, f"a test through the API answered {sent.status}")
    event_id = sent.json()["event_id"]
    delivery_row(c, f"the delivery of {event_id}", f'tr[data-event-id="{event_id}"]', refresh=True)
    request = one_request(run, event_id)
    signatures = request["headers"].get("webhook-signature", "").split()
    check(len(signatures) == 2, f"a delivery during the rotation carries {len(signatures)} signatures")
    check(signed_by(run.webhook_secret, request) and signed_by(run.previous_secret, request),
          "the delivery is not signed by both the new and the previous secret")
    c.no_script_errors()


def step_webhook_threshold(run: Run) -> None:
    """Two consumes of a limit of 4 reach the policy's 50%: a budget.threshold delivery shows
    in the deliveries (after Refresh), told in words, and the receiver got it signed."""
    for used in (1, 2):
        answer = http(run.base, "POST", "/quota/consume", {"action": ALERT_ACTION, "subject": ALERT_SUBJECT})
        check(answer.status == 200 and answer.json()["allowed"] is True,
              f"consume {used} of {ALERT_ACTION} answered {answer.status}: {answer.body[:300]!r}")
    c = run.console
    row = delivery_row(c, "the budget.threshold delivery", 'tr[data-event-type="budget.threshold"]', refresh=True)
    check(f"{ALERT_ID} reached 50% (2 of 4)" in row.text, f"the row does not tell the crossing: {row.text!r}")
    check(f"subject={ALERT_SUBJECT}" in row.text, f"the row does not name the budget: {row.text!r}")
    rows = c.driver.find_elements(By.CSS_SELECTOR, '#deliveries-table tbody tr[data-event-type="budget.threshold"]')
    check(len(rows) == 1, f"{len(rows)} budget.threshold deliveries, not 1 (100% is not reached)")
    request = one_request(run, row.get_attribute("data-event-id") or "")
    check(signed_by(run.webhook_secret, request), "the threshold's delivery does not verify with the secret")
    body = json.loads(request["body"])
    check(body.get("type") == "budget.threshold" and body.get("threshold") == 50 and body.get("used") == 2
          and body.get("policy_id") == ALERT_ID, f"the receiver got another event: {body}")
    c.shot(run.shots, "webhooks.png")
    c.no_script_errors()


def step_webhook_disable_delete(run: Run) -> None:
    """Disable marks the endpoint disabled (PUT); Delete asks first (Cancel keeps it), then
    removes the endpoint."""
    c = run.console
    c.click(f'#webhooks-table tr[data-webhook-id="{WEBHOOK_ID}"] button[data-action="toggle"]')
    row = c.wait(f"{WEBHOOK_ID} marked disabled", endpoint_row(c, WEBHOOK_ID, "false"))
    check("Disabled" in row.find_element(By.CSS_SELECTOR, "[data-status]").text, "the row does not say Disabled")
    stored = http(run.base, "GET", f"/admin/webhooks/{WEBHOOK_ID}", headers=run.admin()).json()
    check(stored["enabled"] is False and stored["actions"] == ["alert.*"],
          f"the stored endpoint is not disabled with its filters kept: {stored}")

    created = http(run.base, "POST", "/admin/webhooks",
                   {"id": SPARE_WEBHOOK_ID, "url": run.receiver.url if run.receiver else "http://127.0.0.1:9/"},
                   run.admin())
    check(created.status == 201, f"creating {SPARE_WEBHOOK_ID} answered {created.status}: {created.body[:300]!r}")
    c.click("#webhooks-refresh")
    delete = f'#webhooks-table tr[data-webhook-id="{SPARE_WEBHOOK_ID}"] button[data-action="delete"]'
    c.click(delete)
    c.visible("#confirm-dialog")
    check(SPARE_WEBHOOK_ID in c.find("#confirm-text").text, "the question does not name the endpoint")
    c.click("#confirm-cancel")
    c.wait("the dialog to close", lambda d: not c.find("#confirm-dialog").is_displayed())
    check(http(run.base, "GET", f"/admin/webhooks/{SPARE_WEBHOOK_ID}", headers=run.admin()).status == 200,
          "Cancel deleted the endpoint")
    c.click(delete)
    c.visible("#confirm-dialog")
    c.click("#confirm-ok")
    c.wait(f"the row of {SPARE_WEBHOOK_ID} to go", lambda d: endpoint_row(c, SPARE_WEBHOOK_ID)(d) is None)
    check(http(run.base, "GET", f"/admin/webhooks/{SPARE_WEBHOOK_ID}", headers=run.admin()).status == 404,
          "the deleted endpoint is still there")
    check(endpoint_row(c, WEBHOOK_ID)(c.driver) is not None, "the other endpoint went too")
    c.no_script_errors()


# ----- Trying a policy on the recorded past (backtest) --------------------------------------


def replayed(history: list[tuple[str, bool]], limit: int) -> dict[str, int]:
    """What a count policy of `limit` per subject (no window boundary within the history)
    does to `history`, (subject, allowed when made) in the order made, replayed from empty
    counters as the backtest replays it: a request it denies charges nothing."""
    used: dict[str, int] = {}
    figures = {"requests": 0, "denied": 0, "newly_denied": 0, "newly_allowed": 0}
    for subject, allowed_live in history:
        figures["requests"] += 1
        if used.get(subject, 0) + 1 <= limit:
            used[subject] = used.get(subject, 0) + 1
            figures["newly_allowed"] += 0 if allowed_live else 1
        else:
            figures["denied"] += 1
            figures["newly_denied"] += 1 if allowed_live else 0
    return figures


def figure(c: Console, key: str) -> str:
    """A figure of the backtest's result panel ('' when it is not shown)."""
    return text_of(c, f'#backtest-result [data-figure="{key}"] .figure-value')


def step_backtest(run: Run) -> None:
    """A policy with recorded traffic (some denied, ledger_denials) gets a lower limit in its
    form, and Try shows what it would have done to the last 7 days: the newly denied count
    computed here, the figures, the peak and the budgets denied most; nothing is saved. A
    limit out of range is refused at the limit control (policies[0].limit); days outside
    1-31 at the days control; Enter in the days field tries, it does not save."""
    created = http(run.base, "POST", "/admin/policies", TRY_POLICY, run.admin())
    check(created.status == 201, f"creating {TRY_ID} answered {created.status}: {created.body[:300]!r}")
    version = created.json()["version"]
    history: list[tuple[str, bool]] = []
    for subject in TRY_TRAFFIC:
        answer = http(run.base, "POST", "/quota/consume", {"action": TRY_ACTION, "subject": subject})
        check(answer.status in (200, 429), f"a consume of {TRY_ACTION} answered {answer.status}: {answer.body[:300]!r}")
        history.append((subject, answer.status == 200))
    # The model agrees with what the service decided live, so its figures below can be trusted.
    live = replayed(history, TRY_POLICY["limit"])
    check(live["denied"] == sum(1 for _, allowed in history if not allowed) == 2 and live["newly_denied"] == 0,
          f"the service's live decisions {history} are not the model's under limit {TRY_POLICY['limit']}")
    expected = replayed(history, TRY_LIMIT)
    check(expected["newly_denied"] > 0, f"the tried limit denies nothing new: {expected}")

    def recorded(driver: WebDriver) -> bool:
        answer = http(run.base, "GET", f"/quota/ledger?action={TRY_ACTION}&limit=100", headers=run.admin())
        return answer.status == 200 and len(answer.json()["items"]) == len(TRY_TRAFFIC)

    run.console.wait(f"the {len(TRY_TRAFFIC)} requests in the ledger", recorded)

    c = run.console
    c.go("nav-policies", "page-policies")
    c.click("#policies-refresh")
    open_policy(c, TRY_ID)
    check(c.visible("#backtest-days").get_attribute("value") == "7", "the days field does not start at 7")
    check(not shown(c, "#backtest-result"), "a result shows before any try")
    c.type("#policy-limit", str(TRY_LIMIT))
    wait_json(c, f"limit {TRY_LIMIT}", lambda p: p["limit"] == TRY_LIMIT)
    c.click("#backtest-run")
    c.wait(f"newly denied {expected['newly_denied']} in the result",
           lambda d: figure(c, "newly_denied") == str(expected["newly_denied"]))
    for key in ("requests", "denied", "newly_allowed"):
        check(figure(c, key) == str(expected[key]), f"{key} shows {figure(c, key)!r}, not {expected[key]}")
    note = text_of(c, '#backtest-result [data-figure="newly_allowed"]')
    check("ledger_denials" in note, f"newly allowed does not say denials need ledger_denials: {note!r}")
    peak = text_of(c, "#backtest-result [data-peak]")
    check(f"{TRY_LIMIT} of {TRY_LIMIT}" in peak, f"the peak is not the tried limit used up: {peak!r}")
    rows = [r.text for r in c.driver.find_elements(By.CSS_SELECTOR, "#backtest-top-denied tbody tr")]
    denied_most = TRY_TRAFFIC[0]
    top = len([s for s in TRY_TRAFFIC if s == denied_most]) - TRY_LIMIT
    check(bool(rows) and f"subject={denied_most}" in rows[0] and rows[0].endswith(str(top)),
          f"the budget denied most is not subject={denied_most}, {top}: {rows}")
    check(c.find("#policy-editor").is_displayed(), "the editor closed on a try")
    stored = run.policy(TRY_ID)
    check(stored["limit"] == TRY_POLICY["limit"] and stored["version"] == version,
          f"trying saved the policy: {stored}")
    c.driver.execute_script("arguments[0].scrollIntoView()", c.find("#policy-backtest"))
    c.shot(run.shots, "backtest.png")

    # A limit the service refuses: the error at the limit control, not under the JSON.
    c.type("#policy-limit", "9007199254740992")
    wait_json(c, "limit 2^53", lambda p: p["limit"] == 9007199254740992)
    c.visible("#backtest-stale")  # the answer shown is no longer the form's
    c.click("#backtest-run")
    c.wait("the 422 to be shown", lambda d: "422" in c.message())
    error = text_of(c, "#policy-limit-error")
    check("9007199254740991" in error, f"the limit control does not show the error: {error!r}")
    check(c.find("#policy-limit").get_attribute("aria-invalid") == "true", "the limit is not marked invalid")
    leftover = text_of(c, "#policy-json-error")
    check(not leftover, f"the error was left under the JSON, not at the limit: {leftover!r}")
    check(not shown(c, "#backtest-result"), "the previous result still shows after the 422")

    # Days outside 1-31 are refused at the days control; Enter there tries, never saves.
    c.type("#policy-limit", str(TRY_LIMIT))
    c.type("#backtest-days", "40")
    c.find("#backtest-days").send_keys(Keys.ENTER)
    c.wait("the days error", lambda d: "1 to 31" in text_of(c, "#backtest-days-error"))
    check(c.find("#backtest-days").get_attribute("aria-invalid") == "true", "the days field is not marked invalid")
    c.type("#backtest-days", "7")
    c.find("#backtest-days").send_keys(Keys.ENTER)
    c.wait("the result again after Enter",
           lambda d: figure(c, "newly_denied") == str(expected["newly_denied"]) and not shown(c, "#backtest-stale"))
    check(c.find("#policy-editor").is_displayed(), "Enter in the days field closed the editor")
    stored = run.policy(TRY_ID)
    check(stored["limit"] == TRY_POLICY["limit"] and stored["version"] == version,
          f"Enter in the days field saved the policy: {stored}")
    c.click("#policy-cancel")
    check(not shown(c, "#backtest-result"), "the result outlives the editor")
    c.no_script_errors()


# The secret anywhere in the page (attributes and input values too) or in the tab's storage.
SECRET_KEPT = """
const secret = arguments[0];
const values = Array.from(document.querySelectorAll('input, textarea')).map((el) => el.value);
const stored = [sessionStorage, localStorage].flatMap((s) => Object.values(s));
return document.documentElement.outerHTML.includes(secret) || values.concat(stored).some((v) => v.includes(secret));
"""

# The texts of the buttons a user can see and the visible controls marked as changing something.
VISIBLE_CHANGE_CONTROLS = """
const shown = (el) => el.getClientRects().length > 0;
const words = /^(new policy|edit|enable|disable|delete|revoke|create key|save|create policy|new endpoint|create endpoint|send test|rotate)/i;
return Array.from(document.querySelectorAll('button, [data-change], [data-action]')).filter(shown)
  .filter((el) => el.hasAttribute('data-change') || el.hasAttribute('data-action') || words.test(el.textContent.trim()))
  .map((el) => el.id || el.textContent.trim());
"""


def secret_kept(c: Console, secret: str) -> bool:
    return bool(c.driver.execute_script(SECRET_KEPT, secret))


def key_row(c: Console, name: str, state: str) -> Callable[[WebDriver], WebElement | None]:
    """A wait condition: the keys table's row of `name`, once it is in `state`."""
    def row(driver: WebDriver) -> WebElement | None:
        for r in driver.find_elements(By.CSS_SELECTOR, "#keys-table tbody tr"):
            if r.find_element(By.CSS_SELECTOR, "th").text.startswith(name) and r.get_attribute("data-state") == state:
                return r
        return None
    return row


def create_key_in_console(c: Console, name: str, actions: str) -> str:
    """Fills and sends the key form; returns the secret read from the panel."""
    c.type("#key-name", name)
    c.type("#key-actions", actions)
    c.click("#key-create")
    panel = c.visible("#key-secret")
    secret = c.visible("#key-secret-value").get_attribute("value") or ""
    check(secret.startswith("qlk_"), f"the panel shows no key: {panel.text!r}")
    check("shown once" in panel.text and "only its hash is kept" in panel.text,
          f"the panel does not say the key is shown once: {panel.text!r}")
    return secret


def step_key_create(run: Run) -> None:
    """Keys page: a 422 names its fields; a key created shows its secret once, and works."""
    created = http(run.base, "POST", "/admin/policies", KEY_POLICY, run.admin())
    check(created.status == 201, f"creating {KEY_POLICY['id']} answered {created.status}: {created.body[:300]!r}")
    c = run.console
    c.go("nav-keys", "page-keys")
    c.wait("the empty key list", lambda d: c.find("#keys-empty").is_displayed())

    # The defaults: every operation but admin:read.
    ops = {e.get_attribute("value"): e.is_selected()
           for e in c.driver.find_elements(By.CSS_SELECTOR, "#key-operations input[type=checkbox]")}
    check(ops == {"consume": True, "check": True, "usage": True, "refund": True, "holds": True,
                  "ledger": True, "admin:read": False}, f"the operations' defaults differ: {ops}")

    # A bad glob (actions[1]) and no operation: each error shows at its own field.
    c.type("#key-name", KEY_NAME)
    c.type("#key-actions", f"{KEY_GLOB}, SMS")
    for e in c.driver.find_elements(By.CSS_SELECTOR, "#key-operations input:checked"):
        e.click()
    c.click("#key-create")
    c.wait("the actions field's error", lambda d: "SMS" in c.find("#key-actions-error").text)
    check(c.find("#key-actions").get_attribute("aria-invalid") == "true", "the actions field is not marked invalid")
    check("operation" in c.find("#key-operations-error").text,
          f"the operations group shows no error: {c.find('#key-operations-error').text!r}")
    check("422" in c.message(), f"the 422 is not shown: {c.message()!r}")
    check(http(run.base, "GET", "/admin/keys", headers=run.admin()).json()["items"] == [],
          "the refused key was created")
    for op in ("consume", "usage", "ledger"):
        c.click(f'#key-operations input[value="{op}"]')

    secret = create_key_in_console(c, KEY_NAME, KEY_GLOB)
    run.key_secret = secret
    check(c.find("#key-closed-notice") is not None and c.find("#key-closed-notice").is_displayed(),
          "the first key's panel does not say it closed the quota endpoints")
    check(not c.find("#key-actions-error").text, "an old field error is still shown")
    row = c.wait(f"{KEY_NAME} listed active", key_row(c, KEY_NAME, "active"))
    table = c.find("#keys-table").text
    check(secret not in table, "the key list shows the secret")
    check(f"{secret[:12]}…" in row.text, f"the row does not show the key's prefix: {row.text!r}")
    stored = c.driver.execute_script(
        "return [sessionStorage, localStorage].flatMap((s) => Object.values(s)).join(' ')")
    check(secret not in stored, "the secret is in the tab's storage")
    listed = run.listed_key(KEY_NAME)
    run.key_id = listed["id"]
    check(listed["operations"] == ["consume", "usage", "ledger"] and listed["actions"] == [KEY_GLOB],
          f"the key was created with other operations or actions: {listed}")

    # The key works, on its actions only; the quota endpoints are closed without one.
    answer = run.key_consume(secret)
    check(answer.status == 200 and answer.json()["allowed"] is True,
          f"a consume with the new key answered {answer.status}: {answer.body[:300]!r}")
    check(run.key_consume(secret, ACTION).status == 403, "the key consumed an action it does not cover")
    check(run.key_consume(None).status == 401, "the quota endpoints are still open after the first key")

    # Dismissed: the secret is gone from the page.
    c.click("#key-secret-dismiss")
    c.wait("the panel to close", lambda d: not c.find("#key-secret").is_displayed())
    check(not secret_kept(c, secret), "the secret is still in the page after the panel was dismissed")

    # A second key: no closing notice; leaving the page empties its panel too.
    spare = create_key_in_console(c, "browser spare", KEY_GLOB)
    check(c.find("#key-closed-notice") is None, "a second key says it closed the quota endpoints")
    c.go("nav-policies", "page-policies")
    check(not secret_kept(c, spare), "the secret is still in the page after the page changed")
    c.go("nav-keys", "page-keys")
    c.wait("browser spare listed active", key_row(c, "browser spare", "active"))
    check(not c.find("#key-secret").is_displayed(), "the secret's panel is back")
    c.no_script_errors()


def step_key_revoke(run: Run) -> None:
    """Revoke asks first (Cancel keeps the key); confirmed, the key is listed revoked and refused."""
    c = run.console
    revoke = f'#keys-table tr[data-key-id="{run.key_id}"] button[data-action="revoke"]'
    c.click(revoke)
    c.visible("#confirm-dialog")
    question = c.find("#confirm-text").text
    check(KEY_NAME in question, f"the question does not name the key: {question!r}")
    c.click("#confirm-cancel")
    c.wait("the dialog to close", lambda d: not c.find("#confirm-dialog").is_displayed())
    check(run.listed_key(KEY_NAME)["state"] == "active", "Cancel revoked the key")

    c.click(revoke)
    c.visible("#confirm-dialog")
    c.click("#confirm-ok")
    row = c.wait(f"{KEY_NAME} listed revoked", key_row(c, KEY_NAME, "revoked"))
    check("Revoked" in row.find_element(By.CSS_SELECTOR, "[data-status]").text, "the row does not say Revoked")
    check(not row.find_elements(By.CSS_SELECTOR, 'button[data-action="revoke"]'), "a revoked key can be revoked again")
    check(run.listed_key(KEY_NAME)["state"] == "revoked", "the service does not list the key revoked")
    answer = run.key_consume(run.key_secret)
    check(answer.status == 401, f"a consume with the revoked key answered {answer.status}, not 401")
    c.no_script_errors()


def step_read_only(run: Run) -> None:
    """An admin:read key signs in read-only: it reads every page, and sees nothing that changes."""
    created = http(run.base, "POST", "/admin/keys", {
        "name": READER_NAME, "actions": [KEY_GLOB], "operations": ["admin:read", "usage", "ledger"],
    }, run.admin())
    check(created.status == 201, f"creating the admin:read key answered {created.status}: {created.body[:300]!r}")
    reader = created.json()["key"]
    c = run.console
    c.click("#sign-out")
    c.visible("#page-signin")
    check(not c.find("#read-only").is_displayed(), "the read-only marker shows while signed out")
    c.type("#token", reader)
    c.click("#sign-in")
    marker = c.visible("#read-only")
    c.go("nav-policies", "page-policies")  # sign-in stays on the page it was on (#/keys)
    c.visible(f'#policies-table tr[data-policy-id="{POLICY_ID}"]')
    check("read-only" in marker.text.lower() and READER_NAME in marker.text,
          f"the read-only marker does not name the key: {marker.text!r}")
    check(c.find("#new-policy") is not None and not c.find("#new-policy").is_displayed(), "New policy is shown")
    check(not c.driver.find_elements(By.CSS_SELECTOR, "#policies-table button"),
          "the policy rows have buttons (edit, enable/disable, delete)")
    shown = c.driver.execute_script(VISIBLE_CHANGE_CONTROLS)
    check(not shown, f"controls that change something are shown on the policies page: {shown}")

    c.go("nav-keys", "page-keys")
    c.wait("the reader listed", key_row(c, READER_NAME, "active"))
    check(not c.find("#key-form").is_displayed(), "the key form is shown")
    check(not c.driver.find_elements(By.CSS_SELECTOR, 'button[data-action="revoke"]'), "a Revoke button is built")
    shown = c.driver.execute_script(VISIBLE_CHANGE_CONTROLS)
    check(not shown, f"controls that change something are shown on the keys page: {shown}")
    # A reload asks who is signed in again: still read-only.
    c.driver.refresh()
    c.wait("the reader listed after a reload", key_row(c, READER_NAME, "active"))
    check(READER_NAME in c.visible("#read-only").text, "the read-only marker does not name the key after a reload")
    shown = c.driver.execute_script(VISIBLE_CHANGE_CONTROLS)
    check(not shown, f"controls that change something are shown after a reload: {shown}")

    # The webhooks page reads, endpoints and deliveries, with no control that changes them.
    c.go("nav-webhooks", "page-webhooks")
    c.wait(f"{WEBHOOK_ID} listed", endpoint_row(c, WEBHOOK_ID))
    check(not c.find("#new-webhook").is_displayed(), "New endpoint is shown")
    check(not c.driver.find_elements(By.CSS_SELECTOR, "#webhooks-table button"),
          "the endpoint rows have buttons (send test, disable, rotate, delete)")
    c.click(f'#webhooks-table tr[data-webhook-id="{WEBHOOK_ID}"] a[data-link="deliveries"]')
    c.wait("the deliveries listed", lambda d: d.find_elements(
        By.CSS_SELECTOR, '#deliveries-table tbody tr[data-event-type="webhook.test"]'))
    shown = c.driver.execute_script(VISIBLE_CHANGE_CONTROLS)
    check(not shown, f"controls that change something are shown on the webhooks page: {shown}")

    # Reads work: the lookup (usage), the ledger and today; another action is a 403, shown.
    c.go("nav-lookup", "page-lookup")
    c.type("#lookup-action", KEY_ACTION)
    c.type("#lookup-subject", KEY_SUBJECT)
    c.click("#lookup-go")
    c.visible(f'#lookup-result [data-usage-policy="{KEY_POLICY["id"]}"] [role="progressbar"]')
    c.click("#lookup-ledger-link")
    c.wait("the key's charge in the ledger", lambda d: d.find_elements(
        By.CSS_SELECTOR, '#ledger-table tbody tr[data-kind="charge"]'))
    c.go("nav-today", "page-today")
    c.visible(f'#today [data-activity-action="{KEY_ACTION}"]')
    c.go("nav-lookup", "page-lookup")
    c.type("#lookup-action", ACTION)
    c.type("#lookup-subject", SUBJECT)
    c.click("#lookup-go")
    c.wait("the 403's detail", lambda d: "403" in c.message() and f"'{ACTION}'" in c.message())

    # The admin token again: the marker goes and the controls come back.
    c.click("#sign-out")
    c.type("#token", run.token)
    c.click("#sign-in")
    c.go("nav-policies", "page-policies")
    c.visible(f'#policies-table tr[data-policy-id="{POLICY_ID}"] button[data-action="edit"]')
    c.visible("#new-policy")
    check(not c.find("#read-only").is_displayed(), "the read-only marker stays for the admin token")
    c.no_script_errors()


STEPS: list[tuple[str, Callable[[Run], None]]] = [
    ("served with a Content-Security-Policy", step_served_with_csp),
    ("sign in: wrong token refused, right token accepted", step_sign_in),
    ("create a policy through the form", step_create_policy),
    ("two consumes through the API", step_consume_twice),
    ("budget lookup: bar at 2, then 3", step_lookup),
    ("ledger for the subject lists its charges", step_ledger),
    ("a denied consume is recorded", step_denied),
    ("today: totals per action, top denied", step_today),
    ("edit conflict shown, re-applied; disable", step_conflict_and_toggle),
    ("accessibility: labelled controls, the keyboard alone", step_accessibility),
    ("form: a calendar day from 04:00, match_not", step_form_day_start),
    ("form: a per-request maximum", step_form_request),
    ("form: a month policy edited to the 15th", step_form_month_day),
    ("form: a period change drops the anchors it does not take", step_form_period_change),
    ("form: day_start 25:00 and match_not errors at their controls", step_form_field_errors),
    ("lookup: a lifetime never resets; a per-request card", step_usage_cards),
    ("form: alert thresholds 50, 100 saved; 150 refused at the control", step_form_alert_thresholds),
    ("webhooks: 422 fields, create, the secret shown once, 409", step_webhook_create),
    ("webhooks: send test, delivered and signed", step_webhook_test),
    ("webhooks: rotate the secret, both signatures", step_webhook_rotate),
    ("webhooks: a threshold crossing is delivered", step_webhook_threshold),
    ("webhooks: disable, delete after a confirmation", step_webhook_disable_delete),
    ("form: try a lower limit on the last 7 days, not saved", step_backtest),
    # The first key closes the open /quota/* endpoints the steps above consume through.
    ("keys: 422 fields, create, the secret shown once", step_key_create),
    ("keys: revoke after a confirmation", step_key_revoke),
    ("an admin:read key signs in read-only", step_read_only),
]


def save_failure(console: Console, directory: str | None, number: int) -> str | None:
    """Screenshot, page source and browser log of a failed step; returns the dir."""
    try:
        directory = directory or tempfile.mkdtemp(prefix="quota-ledger-console-failure.")
        stem = os.path.join(directory, f"step-{number}")
        console.driver.save_screenshot(stem + ".png")
        with open(stem + ".html", "w", encoding="utf-8") as f:
            f.write(console.driver.page_source)
        with open(stem + ".browser-log.txt", "w", encoding="utf-8") as f:
            for entry in console.driver.get_log("browser"):
                f.write(f"{entry.get('level')} {entry.get('message')}\n")
        return directory
    except (OSError, WebDriverException) as error:
        print(f"  (could not save the failure's artifacts: {error})")
        return directory


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the service, e.g. http://127.0.0.1:8080")
    parser.add_argument("--token", required=True, help="its admin token")
    parser.add_argument("--screenshots", help="save policies.png, lookup.png, ... here")
    args = parser.parse_args()
    base = args.url.rstrip("/")
    if args.screenshots:
        os.makedirs(args.screenshots, exist_ok=True)

    driver = start_browser()
    passed = failed = 0
    failures_dir: str | None = None
    console = Console(driver)
    run = Run(console, base, args.token, args.screenshots)
    try:
        for number, (name, step) in enumerate(STEPS, start=1):
            try:
                step(run)
            except Exception as error:  # noqa: BLE001 - every failure is reported the same way
                failed += 1
                detail = str(error) if isinstance(error, StepFailed) else traceback.format_exc(limit=3)
                print(f"console: FAIL {number}. {name}: {detail}".rstrip(), flush=True)
                failures_dir = save_failure(console, failures_dir, number)
                if failures_dir:
                    print(f"console:   screenshot, page source and browser log: {failures_dir}/step-{number}.*",
                          flush=True)
            else:
                passed += 1
                print(f"console: ok   {number}. {name}", flush=True)
    finally:
        driver.quit()
        if run.receiver is not None:
            run.receiver.close()
    print(f"console: {passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
