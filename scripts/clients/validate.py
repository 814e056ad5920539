"""Checks real HTTP answers against the OpenAPI 3.1 document that describes them.

    validator = Validator(document, base_url)
    client = Client(base_url=..., httpx_args={"event_hooks": {"response": [validator.record]}})
    ...                                  # every answer the client receives is recorded and checked
    validator.problems                   # what did not match, one message per problem
    validator.summary()                  # "validated N responses of M operations against the document"

For each answer: the operation is found from the method and the request path, matched
against the document's `paths` templates (a literal segment beats a `{parameter}`); its
status must be declared (exactly, as `4XX`, or by `default`); its Content-Type must match one
of that response's media types (parameters the document names must be equal), or the body
must be empty when the response declares no content; a JSON body must validate against that
media type's schema with JSON Schema Draft 2020-12 (OpenAPI 3.1's dialect), every `$ref`
resolved against the whole document, the formats the document uses checked (`date-time` as
RFC 3339, `int32`/`int64` as ranges); and every header the response declares must be present,
except those the document describes as conditional (CONDITIONAL_HEADERS).

Used by walkthrough.py (scripts/clients.sh type-checks both with mypy --strict).
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import httpx
from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError
from referencing import Registry
from referencing.jsonschema import DRAFT202012

# The document's own URI in the schema registry: schemas are referenced by a JSON pointer
# into the document, so their `#/components/schemas/...` refs resolve against all of it.
DOCUMENT_URI = "urn:quota-ledger:openapi"

HTTP_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

# Headers that a response declares but the service sends only sometimes, each with the test
# (on the JSON body) that says when it must be there; every other declared header (and any
# with `required: true`) must always be. Retry-After on a 429: "absent if it never can",
# which the body tells as `retry_after_seconds: null`.
CONDITIONAL_HEADERS: dict[tuple[str, str], Callable[[Any], bool]] = {
    ("429", "retry-after"): lambda body: not isinstance(body, dict) or body.get("retry_after_seconds") is not None,
}

RFC3339_DATE_TIME = re.compile(
    r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})",
    re.ASCII,
)


def _is_date_time(instance: object) -> bool:
    if not isinstance(instance, str):
        return True
    if not RFC3339_DATE_TIME.fullmatch(instance):
        return False
    try:
        datetime.datetime.fromisoformat(instance.upper().replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _integer_range(bits: int) -> Callable[[object], bool]:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def check(instance: object) -> bool:
        if isinstance(instance, bool) or not isinstance(instance, int):
            return True
        return low <= instance <= high

    return check


def format_checker() -> FormatChecker:
    """A checker of exactly the formats OpenAPI 3.1 documents use here."""
    checker = FormatChecker(formats=())
    checker.checks("date-time")(_is_date_time)
    checker.checks("int32")(_integer_range(32))
    checker.checks("int64")(_integer_range(64))
    return checker


@dataclass(frozen=True)
class Answer:
    """One recorded HTTP answer."""

    method: str  # upper case
    path: str  # as sent, percent-encoded, without the query and the base URL's path
    status: int
    headers: Mapping[str, str]  # names in lower case
    body: bytes

    @property
    def content_type(self) -> str | None:
        return self.headers.get("content-type")


def _media_type(value: str) -> tuple[str, dict[str, str]]:
    """`type/subtype` in lower case, and the parameters (names in lower case, unquoted)."""
    essence, *parts = value.split(";")
    params: dict[str, str] = {}
    for part in parts:
        name, _, param = part.partition("=")
        if name.strip():
            params[name.strip().lower()] = param.strip().strip('"')
    return essence.strip().lower(), params


def _media_matches(declared: str, actual: str) -> int:
    """How well the declared media type (a range like `application/*` or `*/*` too) covers
    the actual one: 0 when not at all, higher when more specific."""
    want, want_params = _media_type(declared)
    have, have_params = _media_type(actual)
    want_type, _, want_sub = want.partition("/")
    have_type, _, have_sub = have.partition("/")
    if want == have:
        score = 3
    elif want_type == have_type and want_sub == "*":
        score = 2
    elif want == "*/*":
        score = 1
    else:
        return 0
    for name, param in want_params.items():
        if have_params.get(name, "").lower() != param.lower():
            return 0
    return score


def _is_json(media: str) -> bool:
    essence, _ = _media_type(media)
    return essence == "application/json" or essence.endswith("+json")


def _pointer(*segments: str) -> str:
    return "".join("/" + s.replace("~", "~0").replace("/", "~1") for s in segments)


class Validator:
    """Checks answers against `document`; `record` is an httpx response event hook."""

    def __init__(self, document: Mapping[str, Any], base_url: str) -> None:
        self.document = document
        self.base_path = httpx.URL(base_url).raw_path.decode("ascii").split("?")[0].rstrip("/")
        self.registry: Registry[Any] = Registry().with_resource(DOCUMENT_URI, DRAFT202012.create_resource(document))
        self.formats = format_checker()
        self.templates = [
            (template, template.strip("/").split("/")) for template in document.get("paths", {})
        ]
        self.answers: list[Answer] = []
        self.operations: set[str] = set()
        self.problems: list[str] = []
        self.on_problem: Callable[[str], None] | None = None

    # -- recording -------------------------------------------------------------------
    def record(self, response: httpx.Response) -> None:
        """The httpx response hook: reads the body, records the answer and checks it."""
        response.read()
        path = response.request.url.raw_path.decode("ascii").split("?")[0]
        if self.base_path and path.startswith(self.base_path):
            path = path[len(self.base_path) :] or "/"
        answer = Answer(
            method=response.request.method.upper(),
            path=path,
            status=response.status_code,
            headers={name.lower(): value for name, value in response.headers.items()},
            body=response.content,
        )
        self.answers.append(answer)
        operation, problems = self.check(answer)
        if operation is not None:
            self.operations.add(operation)
        for problem in problems:
            self.problems.append(problem)
            if self.on_problem is not None:
                self.on_problem(problem)

    def summary(self) -> str:
        return f"validated {len(self.answers)} responses of {len(self.operations)} operations against the document"

    # -- checking --------------------------------------------------------------------
    def resolve(self, node: Any) -> Any:
        """`node`, or what its local `$ref` (`#/components/responses/...`) points at."""
        seen = 0
        while isinstance(node, dict) and isinstance(node.get("$ref"), str) and node["$ref"].startswith("#/"):
            seen += 1
            if seen > 20:
                raise ValueError(f"a $ref cycle at {node['$ref']}")
            target: Any = self.document
            for segment in node["$ref"][2:].split("/"):
                target = target[segment.replace("~1", "/").replace("~0", "~")]
            node = target
        return node

    def find_path(self, path: str) -> str | None:
        """The `paths` template that `path` (percent-encoded) matches: of several, the one
        with the most literal segments."""
        segments = path.strip("/").split("/")
        best: tuple[int, str] | None = None
        for template, parts in self.templates:
            if len(parts) != len(segments):
                continue
            literals = 0
            for part, segment in zip(parts, segments):
                if part.startswith("{") and part.endswith("}"):
                    if not segment:
                        break
                elif part == segment:
                    literals += 1
                else:
                    break
            else:
                if best is None or literals > best[0]:
                    best = (literals, template)
        return None if best is None else best[1]

    def check(self, answer: Answer) -> tuple[str | None, list[str]]:
        """The operation (`METHOD /template (operationId)`) and every mismatch found."""
        where = f"{answer.method} {answer.path}"
        template = self.find_path(answer.path)
        if template is None:
            return None, [f"{where} -> {answer.status}: no path of the document matches {answer.path}"]
        item = self.resolve(self.document["paths"][template])
        method = answer.method.lower()
        operation_object = self.resolve(item.get(method)) if method in HTTP_METHODS else None
        if not isinstance(operation_object, dict):
            return None, [f"{where} -> {answer.status}: the document has no {answer.method} operation on {template}"]
        operation = f"{answer.method} {template}"
        if isinstance(operation_object.get("operationId"), str):
            operation += f" ({operation_object['operationId']})"
        named = f"{operation} -> {answer.status}"

        responses = operation_object.get("responses", {})
        status = str(answer.status)
        for key in (status, f"{status[0]}XX", f"{status[0]}xx", "default"):
            if key in responses:
                break
        else:
            declared = ", ".join(sorted(responses))
            return operation, [f"{named}: status {status} is not declared (declared: {declared})"]
        response_object = self.resolve(responses[key])
        pointer = ["paths", template, method, "responses", key]

        problems: list[str] = []
        content: Mapping[str, Any] = response_object.get("content") or {}
        body: Any = None
        if not content:
            if answer.body:
                problems.append(f"{named}: declares no content, got {len(answer.body)} bytes ({answer.content_type})")
        elif answer.content_type is None:
            problems.append(f"{named}: no Content-Type (declared: {', '.join(content)})")
        else:
            scored = [(_media_matches(media, answer.content_type), media) for media in content]
            score, media = max(scored)
            if score == 0:
                problems.append(
                    f"{named}: Content-Type {answer.content_type!r} is not declared (declared: {', '.join(content)})"
                )
            else:
                media_object = self.resolve(content[media])
                if _is_json(media):
                    try:
                        body = json.loads(answer.body)
                    except ValueError as not_json:
                        problems.append(f"{named}: the {media} body is not JSON ({not_json}): {answer.body[:200]!r}")
                        media_object = {}
                else:
                    body = answer.body.decode("utf-8", errors="replace")
                schema = media_object.get("schema")
                if isinstance(schema, dict):
                    schema_name = schema.get("$ref", "(inline)")
                    schema_pointer = _pointer(*pointer, "content", media, "schema")
                    for message in self.schema_errors(schema_pointer, body):
                        problems.append(f"{named}: the {media} body does not match its schema {schema_name}: {message}")

        for name, header in (response_object.get("headers") or {}).items():
            header = self.resolve(header)
            value = answer.headers.get(name.lower())
            if value is None:
                condition = CONDITIONAL_HEADERS.get((key, name.lower()))
                must = header.get("required") is True or condition is None or condition(body)
                if must:
                    problems.append(f"{named}: the declared header {name} is missing")
                continue
            if "schema" in header:
                header_pointer = _pointer(*pointer, "headers", name, "schema")
                for message in self.schema_errors(header_pointer, value):
                    problems.append(f"{named}: the header {name}: {value!r} does not match its schema: {message}")
        return operation, problems

    def schema_errors(self, pointer: str, instance: Any) -> Iterable[str]:
        """Every way `instance` fails the schema at `pointer` in the document."""
        schema = {"$ref": DOCUMENT_URI + "#" + quote(pointer, safe="/~")}
        validator = Draft202012Validator(schema, registry=self.registry, format_checker=self.formats)
        errors: list[ValidationError] = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
        for error in errors:
            yield f"{error.message} at {error.json_path}"
