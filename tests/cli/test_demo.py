"""``make demo`` (``python -m statekeeper.demo``) runs, twice, on a fresh database."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

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

    # The demo says how to look at its data with the CLI, and the command works as printed.
    line = next(li for li in second.splitlines() if li.startswith("Inspect it: "))
    command = shlex.split(line.removeprefix("Inspect it: "))
    assert command[:1] == ["statekeeper"]
    listed = CliRunner().invoke(app, ["--json", *command[1:]])
    assert listed.exit_code == 0, listed.output
    titles = [item["title"] for item in json.loads(listed.stdout)["items"]]
    assert "Order 1042 (demo run 2)" in titles
