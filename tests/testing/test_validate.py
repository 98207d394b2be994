"""``python -m statekeeper.testing`` end to end, as a third party runs it: real processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import statekeeper

PACKAGE_ROOT = str(Path(statekeeper.__file__).resolve().parents[1])
WAIT = 300
"""Seconds a whole validation may take before the test fails instead of hanging."""


def run_kit(cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run ``python -m statekeeper.testing`` in ``cwd`` (CI and service variables unset)."""
    environ = {
        k: v for k, v in os.environ.items() if k not in {"CI", "STATEKEEPER_REQUIRE_SERVICES"}
    }
    paths = [PACKAGE_ROOT, str(cwd), environ.get("PYTHONPATH", "")]
    environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return subprocess.run(
        [sys.executable, "-m", "statekeeper.testing", *args],
        cwd=cwd,
        env={**environ, **env},
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )


def counts(output: str, capability: str) -> dict[str, int]:
    """The outcome counts the report prints for one capability."""
    line = re.search(rf"^  {capability} +(.*)$", output, re.MULTILINE)
    assert line is not None, output
    return {o: int(n) for n, o in re.findall(r"(\d+) (\w+)", line.group(1))}


@pytest.mark.slow
def test_memory_passes_every_base_test_and_skips_what_it_lacks(tmp_path: Path) -> None:
    done = run_kit(tmp_path, "--store", "memory://")
    assert done.returncode == 0, done.stdout + done.stderr
    base = counts(done.stdout, "base")
    assert base.keys() == {"passed"}, done.stdout
    assert base["passed"] > 250  # the whole suite ran
    assert counts(done.stdout, "shared").keys() == {"skipped"}
    assert counts(done.stdout, "processes").keys() == {"skipped"}
    assert done.stdout.strip().endswith(f"OK: all {base['passed']} base tests passed")


SQLITE_SELECTION = (
    "test_handles or test_processes or test_concurrency"
    " or integers_beyond_64_bits or strings_with_a_nul_exactly"
)
"""Base, shared and processes tests, and SQLite's known-bug tests. The memory test above
shows a URL runs the whole suite; tests/conformance runs all of it on this URL's backend
(``sqlite-process``), so a whole second run here would only repeat those tests."""


@pytest.mark.slow
def test_a_sqlite_url_passes_everything_but_its_known_bugs(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db?durability=process"
    done = run_kit(tmp_path, "--store", url, "-k", SQLITE_SELECTION)
    assert done.returncode == 0, done.stdout + done.stderr
    base = counts(done.stdout, "base")
    assert base.keys() == {"passed", "xfailed"}, done.stdout  # xfailed: strict known bugs
    assert base["passed"] >= 9, done.stdout
    assert base["xfailed"] == 2, done.stdout
    assert counts(done.stdout, "shared").keys() == {"passed"}
    assert counts(done.stdout, "processes") == {"passed": 1}
    assert f"OK: all {base['passed']} base tests passed ({base['xfailed']} known bugs)" in (
        done.stdout
    )
    assert not (tmp_path / "state.db").exists()  # every test had a fresh store of its own


BROKEN = """
    from collections.abc import AsyncIterator

    from statekeeper.stores import Store, open_store
    from statekeeper.testing import BackendContext, backend


    @backend("lossy")
    async def lossy(ctx: BackendContext) -> AsyncIterator[Store]:
        store = await open_store("memory://", **ctx.options)
        read = store.read_entries

        async def read_entries(*args, **kwargs):  # forgets the newest entry
            return (await read(*args, **kwargs))[:-1]

        store.read_entries = read_entries
        try:
            yield store
        finally:
            await store.close()
"""


def test_a_broken_third_party_backend_fails_with_the_test_named(tmp_path: Path) -> None:
    (tmp_path / "lossy_backend.py").write_text(textwrap.dedent(BROKEN))
    done = run_kit(
        tmp_path,
        *("--import", "lossy_backend", "--backend", "lossy"),
        *("-k", "test_concurrent_appends_all_land_in_one_valid_chain"),
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "FAILED test_concurrency.py::test_concurrent_appends_all_land_in_one_valid_chain[lossy]"
        in done.stdout
    )
    assert counts(done.stdout, "base") == {"failed": 1}
    assert done.stdout.strip().endswith("FAILED: 1 problem(s)")


def test_a_server_that_is_down_is_not_validated(tmp_path: Path) -> None:
    url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    selected = ("-k", "test_concurrent_appends_all_land_in_one_valid_chain")
    done = run_kit(tmp_path, "--store", url, *selected)
    assert done.returncode == 1, done.stdout + done.stderr
    assert counts(done.stdout, "base") == {"skipped": 1}
    assert "NOT VALIDATED: 1 base tests skipped, 0 passed" in done.stdout
    required = run_kit(tmp_path, "--store", url, *selected, STATEKEEPER_REQUIRE_SERVICES="1")
    assert required.returncode == 1
    assert counts(required.stdout, "base") == {"error": 1}  # the store fixture failed
    assert "redis backend unavailable: no Redis server reachable" in required.stdout


def test_bad_usage_exits_2_with_the_reason(tmp_path: Path) -> None:
    done = run_kit(tmp_path, "--store", "nope://x")
    assert done.returncode == 2
    assert "no conformance scheme for 'nope'" in done.stderr
    listed = run_kit(tmp_path, "--list")
    assert listed.returncode == 0
    assert re.search(
        r"^  sqlite +base, damage, joint, processes, rewrite, shared, threads$",
        listed.stdout,
        re.MULTILINE,
    )
    assert re.search(r"^  memory +base, joint, rewrite, threads$", listed.stdout, re.MULTILINE)


THIRD_PARTY = {
    "pyproject.toml": """
        [tool.pytest.ini_options]
        asyncio_mode = "auto"
        asyncio_default_fixture_loop_scope = "function"
        addopts = "--strict-markers -p no:cacheprovider -rs"
        filterwarnings = ["error"]
    """,
    "conftest.py": """
        import my_backends  # noqa: F401

        pytest_plugins = ["statekeeper.testing.plugin"]
    """,
    "my_backends.py": """
        from statekeeper.testing import url_backend

        url_backend("mine", "sqlite:///mine.db?durability=process")
    """,
    "test_conformance.py": """
        from statekeeper.testing.spec.test_concurrency import *  # noqa: F403
        from statekeeper.testing.spec.test_handles import *  # noqa: F403
        from statekeeper.testing.spec.test_processes import *  # noqa: F403
    """,
}


@pytest.mark.slow
def test_a_project_runs_the_spec_in_its_own_pytest_on_the_backends_it_names(
    tmp_path: Path,
) -> None:
    for name, text in THIRD_PARTY.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    chosen = ("--statekeeper-backend", "mine", "--statekeeper-backend", "memory")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", *chosen],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([PACKAGE_ROOT, str(tmp_path)])},
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # memory runs the base tests and skips the extended ones; mine runs everything.
    assert re.search(r"^28 passed, 10 skipped", done.stdout, re.MULTILINE), done.stdout
    assert "SKIPPED [9] " in done.stdout
    assert "memory lacks the 'shared' capability" in done.stdout
    assert "memory lacks the 'processes' capability" in done.stdout
    assert "[sqlite" not in done.stdout  # only the backends it named
