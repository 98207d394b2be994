"""What makes a validation report OK, and importing the kit without pytest."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import statekeeper
from statekeeper.testing import BASE, PROCESSES, SHARED, CaseResult, Report


def report(*outcomes: tuple[str, str]) -> Report:
    results = [CaseResult(f"t{i}", cap, outcome) for i, (cap, outcome) in enumerate(outcomes)]
    return Report("x", "x://", frozenset({SHARED}), results)


@pytest.mark.parametrize(
    ("outcomes", "ok"),
    [
        ([(BASE, "passed"), (BASE, "xfailed"), (SHARED, "skipped")], True),
        ([(BASE, "passed"), (SHARED, "failed")], False),
        ([(BASE, "passed"), (BASE, "error")], False),
        ([(BASE, "passed"), (BASE, "xpassed")], False),
        ([(BASE, "passed"), (BASE, "skipped")], False),
        ([(SHARED, "passed"), (PROCESSES, "passed")], False),
        ([], False),
    ],
)
def test_a_report_is_ok_only_when_every_base_test_ran_and_nothing_failed(
    outcomes: list[tuple[str, str]], ok: bool
) -> None:
    assert report(*outcomes).ok is ok


def test_an_error_outside_the_tests_fails_the_report() -> None:
    made = report((BASE, "passed"))
    made.errors.append("collecting test_x.py: SyntaxError")
    assert not made.ok
    assert "ERROR collecting test_x.py: SyntaxError" in made.render()


def test_importing_statekeeper_and_its_kit_does_not_import_pytest() -> None:
    code = (
        "import sys, statekeeper, statekeeper.testing; "
        "assert not {'pytest', 'hypothesis'} & set(sys.modules), sorted(sys.modules)"
    )
    root = str(Path(statekeeper.__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": root},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
