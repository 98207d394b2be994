"""``make demo`` (``python -m statekeeper.demo``) runs, twice, on a fresh database."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import statekeeper
from statekeeper.cli import app


@pytest.mark.slow
def test_the_demo_runs_twice_and_finds_its_first_run(tmp_path: Path) -> None:
    # The child imports the same statekeeper as this process, wherever it runs from.
    source = str(Path(statekeeper.__file__).parents[1])
    path = os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "COLUMNS": "200"}  # no wrapped lines
    env["STATEKEEPER_DEMO_DB"] = str(tmp_path / "demo.db")

    def demo() -> str:
        done = subprocess.run(
            [sys.executable, "-m", "statekeeper.demo"],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,  # the demo writes nothing but its database
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    first = demo()
    assert "First run: creating" in first
    assert "(demo run 1)" in first
    assert "Run finished: completed" in first
    assert "waiting_for_approval -> running -> completed" in first

    second = demo()
    assert "from earlier runs" in second
    assert "(demo run 2)" in second  # the approval run's session carries no run number
    assert "(demo run 3)" not in second

    # The demo says how to look at its data, and the commands work as printed: they find
    # the conversations, a run waiting for a decision, one paused at a limit, and a parent
    # with delegated children; the key they create is for the demo's tenant.
    commands = [
        shlex.split(li.strip().removeprefix("$ "))
        for li in second.splitlines()
        if li.strip().startswith("$ ")
    ]
    assert [c[-2:] for c in commands][-1] == ["--app", "statekeeper.demo_app:make_runner"]
    for command in commands:
        assert Path(command[0]).name == "statekeeper"

    def cli(command: list[str]) -> dict[str, Any]:
        done = CliRunner().invoke(app, ["--json", *command[1:]])
        assert done.exit_code == 0, done.output
        found: dict[str, Any] = json.loads(done.stdout)
        return found

    sessions, runs, shown, key = (cli(c) for c in commands[:4])
    titles = [item["title"] for item in sessions["items"]]
    assert "Order 1042 (demo run 2)" in titles
    statuses = {(r["agent"], r["status"]) for r in runs["items"]}
    assert {("support", "waiting_for_approval"), ("support", "paused")} <= statuses
    parents = {r["parent_run_id"] for r in runs["items"] if r["agent"] == "carrier"}
    triage = {r["run_id"] for r in runs["items"] if r["agent"] == "triage"}
    assert parents
    assert parents <= triage
    assert shown["index"]["status"] == "waiting_for_approval"
    assert key["tenant"] == "demo-user"
