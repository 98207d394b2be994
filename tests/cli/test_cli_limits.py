"""``statekeeper runs raise-limit`` and ``runs resume`` of a run stopped at a limit."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest
from cli_harness import Cli
from test_cli import HERE, run_status

from statekeeper.core.limits import BudgetFlag, IterationFlag, Limits, TimeFlag
from statekeeper.errors import LimitReachedError
from statekeeper.stores import Store


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    return Cli(f"sqlite:///{tmp_path / 'state.db'}")


@pytest.fixture
def cli_app(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(HERE))
    return importlib.import_module("cli_app")


def start_spender(cli: Cli, cli_app: ModuleType, limits: Limits, *, headless: bool) -> str:
    async def work(store: Store) -> str:
        runner = cli_app.make_runner(store, "default")
        try:
            result = await runner.start("spender", "go", headless=headless, limits=limits)
        except LimitReachedError as exc:  # a headless run raises at its limit
            return str(exc.state.run_id)
        return str(result.run_id)

    return cli.api(work)


RESUME = ("--app", "cli_app:make_runner")


def test_resume_at_a_limit_fails_until_the_limit_is_raised(cli: Cli, cli_app: ModuleType) -> None:
    limits = Limits(budget=BudgetFlag(maximum=1.0), time=TimeFlag(maximum=3600))
    run_id = start_spender(cli, cli_app, limits, headless=False)
    assert run_status(cli, run_id) == "paused"
    shown = cli("runs", "show", run_id).stdout
    assert "budget 1.2/1" in shown
    assert "time " in shown
    assert "limit reached" in shown
    # Why it stopped, by how much, in one line (statekeeper.runs.why).
    why = next(line for line in shown.splitlines() if line.startswith("why stopped"))
    assert "budget limit reached: $1.2000 of $1.0000, over by $0.2000" in why

    refused = cli("runs", "resume", run_id, *RESUME, code=1)
    assert refused.stderr.startswith("error: budget limit reached: 1.2 of 1;")
    assert f"statekeeper runs raise-limit {run_id} --budget N" in refused.stderr
    assert "paused -> paused" not in refused.stdout
    assert run_status(cli, run_id) == "paused"
    assert cli.json("runs", "show", run_id)["state"]["turn"] == 3  # no step ran

    too_low = cli("runs", "raise-limit", run_id, "--budget", "1.1", code=1)
    assert "leaves no room, 1.2 is used already" in too_low.stderr
    out = cli("runs", "raise-limit", run_id, "--budget", "5").stdout
    assert f"raised the limits of run {run_id} (paused)" in out
    assert "budget: 1.2 of 1 -> 1.2 of 5" in out
    assert f"statekeeper runs resume {run_id}" in out

    data = cli.json("runs", "resume", run_id, *RESUME)
    assert (data["previous_status"], data["status"]) == ("paused", "completed")
    assert data["output"] == {"spent": 1.2}


def test_a_headless_run_at_its_limit_is_raised_and_resumed(cli: Cli, cli_app: ModuleType) -> None:
    run_id = start_spender(cli, cli_app, Limits(iterations=IterationFlag(maximum=2)), headless=True)
    assert run_status(cli, run_id) == "paused"
    cli("runs", "resume", run_id, *RESUME, code=1)

    data = cli.json("runs", "raise-limit", run_id, "--iterations", "10")
    assert data["limits"]["iterations"]["maximum"] == 10
    assert data["status"] == "paused"
    out = cli("runs", "resume", run_id, *RESUME).stdout
    assert f"run {run_id}: paused -> completed" in out


def test_raise_limit_errors(cli: Cli, cli_app: ModuleType) -> None:
    limits = Limits(budget=BudgetFlag(maximum=1.0))
    run_id = start_spender(cli, cli_app, limits, headless=False)
    nothing = cli("runs", "raise-limit", run_id, code=1)
    assert "no reached limit with an increase_amount" in nothing.stderr
    assert "--budget X" in nothing.stderr
    unlimited = cli("runs", "raise-limit", run_id, "--tokens", "1000", code=1)
    assert "has no tokens limit to raise" in unlimited.stderr
    cli("runs", "raise-limit", run_id, "--budget", "-1", code=2)  # a usage error
    missing = cli("runs", "raise-limit", "run-nope", "--budget", "2", code=1)
    assert "run-nope" in missing.stderr
    cli("runs", "cancel", run_id)
    finished = cli("runs", "raise-limit", run_id, "--budget", "2", code=1)
    assert "is cancelled" in finished.stderr


def test_show_gives_a_delegated_runs_own_cost_and_a_parents_delegated_share(
    cli: Cli, cli_app: ModuleType
) -> None:
    async def work(store: Store) -> tuple[str, str]:
        runner = cli_app.make_runner(store, "default")
        limits = Limits(iterations=IterationFlag(maximum=1), budget=BudgetFlag(maximum=5.0))
        parent = await runner.start("spender", "go", headless=False, limits=limits)
        child = await runner.delegate(parent.state, "spender", "help", limits=limits)
        return str(parent.run_id), str(child.run_id)

    parent_id, child_id = cli.api(work)
    child = cli("runs", "show", child_id).stdout
    assert "0.400000" in child  # its own spend: not the parent's 0.4 before it
    assert "0.800000" not in child
    parent = cli("runs", "show", parent_id).stdout
    assert "Cost and tokens per model (with delegated runs)" in parent
    assert "of which delegated" in parent
    assert "0.800000" in parent
