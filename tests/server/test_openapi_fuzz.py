"""A property-based fuzz of the OpenAPI description (schemathesis) against a running
server: every operation alone, valid and invalid input, then chains of calls through the
description's links (a created session's id read, appended to and deleted, a run's id
approved, forked, cancelled, ...). No request gets a server error, and every answer has a
status and a body the description declares.

`make test` runs a short fuzz; ``STATEKEEPER_FUZZ_CASES=N`` (or the hypothesis profile
``thorough``, which `make thorough` loads: `THOROUGH_CASES`) runs at least N requests in
all, counted and printed.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from hypothesis import given as given_
from hypothesis.errors import Flaky
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi import stateful as openapi_stateful
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from statekeeper.demo_app import make_runner
from statekeeper.stores import Store

from .conftest import Live

EXAMPLES = 10  # per operation and mode in the short fuzz: some seconds in all
THOROUGH_CASES = 10_000
"""The requests of the fuzz under the ``thorough`` profile (`make thorough`)."""
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
_classify_roots = openapi_stateful.classify_root_transitions
MODES = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)


def _budget() -> int:
    """The requests wanted in all: 0 for the short fuzz."""
    given = os.environ.get("STATEKEEPER_FUZZ_CASES")
    if given:
        return int(given)
    return THOROUGH_CASES if settings.get_current_profile_name() == "thorough" else 0


def _settings(examples: int, **extra: Any) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        **extra,
    )


@dataclass
class Fuzz:
    """Sends the cases to the live server, counts them and keeps the first example of
    each distinct failure (an operation, a status, a check) instead of stopping at one."""

    url: str
    headers: dict[str, str]
    count: int = 0
    failures: dict[tuple[str, ...], str] = field(default_factory=dict)
    answers: Counter[str] = field(default_factory=Counter)
    flaky: int = 0
    """The state machine runs ended early by a chain that went otherwise when replayed."""
    """The answers by status class (``2xx``, ``4xx``, ...)."""

    def send(self, case: Any) -> Any:
        self.count += 1
        if self.count % 1000 == 0:  # progress, for a long run (shown with -s)
            print(f"fuzz: {self.count} cases, {len(self.failures)} failures", flush=True)
        try:
            return case.call(base_url=self.url, headers=self.headers, timeout=60)
        except Exception as exc:  # a dropped connection is a failure too: keep going
            self.failures.setdefault((case.operation.label, type(exc).__name__), repr(exc))
            return None

    def check(self, case: Any, response: Any) -> None:
        if response is None:
            return
        self.answers[f"{response.status_code // 100}xx"] += 1
        try:
            case.validate_response(response, checks=CHECKS, headers=self.headers)
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup is Base
            problems = getattr(exc, "exceptions", [exc])
            titles = sorted({getattr(p, "title", type(p).__name__) for p in problems})
            key = (case.operation.label, str(response.status_code), *titles)
            curl = case.as_curl_command(headers=self.headers)
            detail = f"{curl}\n  -> {response.status_code} {response.text[:400]}\n  {exc}"
            self.failures.setdefault(key, detail)

    def report(self) -> str:
        return "\n\n".join(f"{' '.join(key)}:\n{text}" for key, text in self.failures.items())


def _schema(description: dict[str, Any]) -> Any:
    # The stream is endless by design; it has its own tests. The probes take no input at
    # all (nothing to fuzz; schemathesis cannot make an invalid request): test_health.py.
    excluded = "/stream$|/healthz$|/readyz$"
    return schemathesis.openapi.from_dict(description).exclude(path_regex=excluded)


def _operations(schema: Any) -> list[Any]:
    return [result.ok() for result in schema.get_all_operations()]


def _stateless(fuzz: Fuzz, operation: Any, mode: Any, examples: int, fixed: bool) -> None:
    @_settings(examples, derandomize=fixed)
    @given_(case=operation.as_strategy(generation_mode=mode))
    def run(case: Any) -> None:
        fuzz.check(case, fuzz.send(case))

    run()


def _every_root(*args: Any) -> Any:
    """schemathesis' roots (where a chain starts), the fallback ones too: it guesses that
    an ``agent_id`` names a resource no operation makes, and would never start a chain by
    creating a session (or listing them, or writing a record or a memory)."""
    roots = _classify_roots(*args)
    roots.reliable |= roots.fallback
    return roots


def _stateful(fuzz: Fuzz, schema: Any, examples: int, steps: int, fixed: bool) -> None:
    with mock.patch.object(openapi_stateful, "classify_root_transitions", _every_root):
        machine = schema.as_state_machine()

    class Linked(machine):  # type: ignore[misc, valid-type]
        def call(self, case: Any, **kwargs: Any) -> Any:
            return fuzz.send(case)

        def after_call(self, response: Any, case: Any) -> None:
            if response is not None:
                super().after_call(response, case)

        def validate_response(self, response: Any, case: Any, *args: Any, **kwargs: Any) -> None:
            fuzz.check(case, response)

    try:
        Linked.run(settings=_settings(examples, stateful_step_count=steps, derandomize=fixed))
    except Flaky:
        # The server is the state: a chain replayed can go otherwise (a session id made
        # again is a 409, so there is no id to follow), which hypothesis calls flaky. The
        # requests sent are counted and checked; the next run goes on.
        fuzz.flaky += 1


def _fuzz(fuzz: Fuzz, description: dict[str, Any], budget: int) -> None:
    schema = _schema(description)
    operations = _operations(schema)
    assert len(operations) > 30
    assert schema.statistic.transitions.total > 50, "the description lost its links"
    fixed = budget == 0  # the short fuzz is the same every time
    per = EXAMPLES if fixed else math.ceil(budget / 2 / (len(operations) * len(MODES)))
    for operation in operations:
        for mode in MODES:
            _stateless(fuzz, operation, mode, per, fixed)
    stateless = fuzz.count
    _stateful(fuzz, schema, 10, 6, fixed)
    while fuzz.count < budget:  # sequences of links until the budget is spent
        before = fuzz.count
        _stateful(fuzz, schema, 100, 10, fixed)
        assert fuzz.count > before, "a run of the state machine sent nothing"
    linked = fuzz.count - stateless
    answers = ", ".join(f"{n} {status}" for status, n in sorted(fuzz.answers.items()))
    print(f"\nfuzz: {fuzz.count} cases ({stateless} alone, {linked} linked); answers: {answers}")
    print(f"fuzz: {fuzz.flaky} state machine runs ended early (the server's state changed)")


@pytest.mark.slow
async def test_no_request_gets_a_server_error(live: Live, db: tuple[str, Store]) -> None:
    runner = make_runner(db[1], "acme")
    await runner.start("support", "Order 1042?")  # something to find, approve, fork
    await runner.start("support", "Refund order 1042, please")
    async with httpx.AsyncClient(base_url=live.url) as client:
        description = (await client.get("/api/v1/openapi.json")).json()
    fuzz = Fuzz(live.url, live.headers("admin"))
    budget = _budget()
    started = time.monotonic()
    await asyncio.to_thread(_fuzz, fuzz, description, budget)
    print(f"fuzz: {time.monotonic() - started:.0f}s")
    assert not fuzz.failures, f"{len(fuzz.failures)} failures:\n{fuzz.report()}"
    assert fuzz.count >= budget
