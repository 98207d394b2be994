"""A bounded property-based fuzz of the OpenAPI description (schemathesis) against a
running server: no request, valid or not, gets a server error, and every answer has a
status and a body the description declares."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from statekeeper.demo_app import make_runner
from statekeeper.stores import Store

from .conftest import Live

EXAMPLES = 10  # per operation and mode: about 45 operations, some seconds in all
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


def _operations(description: dict[str, Any]) -> list[Any]:
    schema = schemathesis.openapi.from_dict(description)
    found = []
    for result in schema.get_all_operations():
        operation = result.ok()
        if not operation.path.endswith("/stream"):  # endless by design; tested on its own
            found.append(operation)
    return found


@pytest.mark.slow
async def test_no_request_gets_a_server_error(live: Live, db: tuple[str, Store]) -> None:
    await make_runner(db[1], "acme").start("support", "Order 1042?")  # something to find
    async with httpx.AsyncClient(base_url=live.url) as client:
        description = (await client.get("/api/v1/openapi.json")).json()
    headers = live.headers("admin")
    operations = _operations(description)
    assert len(operations) > 30

    def fuzz(operation: Any, mode: schemathesis.GenerationMode) -> None:
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def check(case: Any) -> None:
            response = case.call(base_url=live.url, headers=headers, timeout=30)
            case.validate_response(response, checks=CHECKS, headers=headers)

        check()

    for operation in operations:
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            await asyncio.to_thread(fuzz, operation, mode)
