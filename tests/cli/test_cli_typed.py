"""CLI arguments that used to end in a traceback: a clear error and a non-zero exit."""

from __future__ import annotations

import asyncio
import importlib
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer
from cli_harness import Cli

from statekeeper.cli._common import parse_when
from statekeeper.stores import open_store

HERE = Path(__file__).parent


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(f"sqlite:///{tmp_path / 'state.db'}")


@pytest.fixture
def cli_app(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(HERE))
    return importlib.import_module("cli_app")


def start_run(cli: Cli, cli_app: ModuleType, agent: str) -> str:
    async def main() -> str:
        store = await open_store(cli.url)
        try:
            result = await cli_app.make_runner(store, "default").start(agent, "hello")
            return str(result.run_id)
        finally:
            await store.close()

    return asyncio.run(main())


def status(cli: Cli, run_id: str) -> Any:
    import json

    return json.loads(cli("--json", "runs", "show", run_id).stdout)["state"]["status"]


@pytest.mark.parametrize("value", ["99999999999d", "999999999999999w", "9" * 30 + "s"])
def test_an_age_too_far_back_is_a_bad_parameter(value: str) -> None:
    with pytest.raises(typer.BadParameter, match="too far back"):
        parse_when(value, now=datetime(2030, 1, 1, tzinfo=UTC))


def test_gc_before_an_age_too_far_back_exits_2_without_a_traceback(cli: Cli) -> None:
    bad = cli("gc", "--before", "99999999999d", code=2)
    assert isinstance(bad.exception, SystemExit)
    assert "too far back" in bad.output
    assert "ISO 8601" in bad.output  # says what to pass instead


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("os:system", "must take (store, tenant)"),
        ("cli_app:support", "must take (store, tenant)"),
        ("cli_app:boom_factory", "--app cli_app:boom_factory failed: RuntimeError: no config"),
        ("cli_app:not_a_runner", "returned str, not a statekeeper Runner"),
    ],
)
def test_resume_with_an_app_that_is_not_a_runner_factory_is_a_clear_error(
    cli: Cli, cli_app: ModuleType, spec: str, problem: str
) -> None:
    run_id = start_run(cli, cli_app, "support")
    cli("runs", "approve", run_id, "c1")
    bad = cli("runs", "resume", run_id, "--app", spec, code=1)
    assert isinstance(bad.exception, SystemExit)
    assert problem in bad.output
    assert status(cli, run_id) == "waiting_for_approval"


def test_fork_with_an_app_that_is_not_a_runner_factory_is_a_clear_error(
    cli: Cli, cli_app: ModuleType
) -> None:
    run_id = start_run(cli, cli_app, "support")
    bad = cli("runs", "fork", run_id, "--at", "1", "--app", "os:system", code=1)
    assert isinstance(bad.exception, SystemExit)
    assert "must take (store, tenant)" in bad.output


def test_importing_a_file_nested_thousands_deep_is_a_clear_error(cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 5000 + "]" * 5000)
    bad = cli("sessions", "import", str(path), code=1)
    assert isinstance(bad.exception, SystemExit)
    assert "nested too deeply; the limit is 100 levels" in bad.output


def test_fork_with_a_state_nested_thousands_deep_is_a_bad_parameter(
    cli: Cli, cli_app: ModuleType
) -> None:
    run_id = start_run(cli, cli_app, "support")
    deep = '{"metadata": {"x": ' + "[" * 5000 + "]" * 5000 + "}}"
    bad = cli("runs", "fork", run_id, "--at", "1", "--state", deep, code=2)
    assert "nests deeper than 100 levels" in bad.output
