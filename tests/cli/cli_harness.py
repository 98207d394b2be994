"""The CLI test harness: the app run against one store URL, and the Python API against
the same store (imported by the CLI test modules)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from typer.testing import CliRunner, Result

from statekeeper.cli import app
from statekeeper.stores import Store, open_store

T = TypeVar("T")


class Cli:
    """Runs the app against one store URL, and the Python API against the same store."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.runner = CliRunner()

    def __call__(self, *args: str, input: str | None = None, code: int | None = 0) -> Result:
        """Run ``statekeeper --store URL *args``; check the exit ``code`` (None: any) and
        that no traceback was printed."""
        result = self.runner.invoke(app, ["--store", self.url, *args], input=input)
        if code is not None:
            assert result.exit_code == code, (result.exit_code, result.output, result.exception)
        assert "Traceback" not in result.output
        return result

    def json(self, *args: str, input: str | None = None) -> Any:
        return json.loads(self("--json", *args, input=input).stdout)

    def json_lines(self, *args: str) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self("--json", *args).stdout.splitlines()]

    def api(self, work: Callable[[Store], Awaitable[T]]) -> T:
        async def main() -> T:
            async with await open_store(self.url) as store:
                return await work(store)

        return asyncio.run(main())
