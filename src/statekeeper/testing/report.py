"""What a validation found: each test's outcome, grouped by the capability it checks."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from statekeeper.testing.registry import BASE, Backend

if TYPE_CHECKING:  # only validations run pytest; importing the kit must not need it
    import pytest

__all__ = ["OUTCOMES", "CaseResult", "Collector", "Report"]

OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")
"""Every outcome a test can have, in the order a report shows them."""
BAD = frozenset({"failed", "error", "xpassed"})
"""Outcomes that fail a validation (an xpass means a known-bug mark is out of date)."""


@dataclass(frozen=True)
class CaseResult:
    """The outcome of one test."""

    nodeid: str
    capability: str
    """`BASE`, or the extended capabilities it checks joined by ``+``."""
    outcome: str
    """One of `OUTCOMES`."""
    detail: str = ""
    """Why it failed or was skipped."""


@dataclass
class Report:
    """The result of running the conformance suite against one backend."""

    backend: str
    target: str
    """What was validated (a URL or a backend's name)."""
    capabilities: frozenset[str]
    """The extended capabilities the backend declared."""
    results: list[CaseResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """Problems outside any one test (collection errors, a pytest usage error)."""

    def counts(self) -> dict[str, Counter[str]]:
        """Outcome counts per capability, `BASE` first."""
        counts: dict[str, Counter[str]] = {BASE: Counter()}
        for result in self.results:
            counts.setdefault(result.capability, Counter())[result.outcome] += 1
        return counts

    @property
    def ok(self) -> bool:
        """True when nothing failed and every base test ran (none was skipped)."""
        base = self.counts()[BASE]
        return (
            not self.errors
            and not any(r.outcome in BAD for r in self.results)
            and base["passed"] > 0
            and base["skipped"] == 0
        )

    def render(self, *, details: int = 20) -> str:
        """A text report: the first ``details`` problems, then counts per capability."""
        lines: list[str] = []
        problems = [r for r in self.results if r.outcome in BAD]
        for result in problems[:details]:
            lines.append(f"{result.outcome.upper()} {result.nodeid} ({result.capability})")
            lines.extend(f"    {line}" for line in _tail(result.detail))
        if len(problems) > details:
            lines.append(f"... and {len(problems) - details} more")
        lines.extend(f"ERROR {error}" for error in self.errors)
        # The summary comes last, where a terminal leaves it in view.
        declared = ", ".join([BASE, *sorted(self.capabilities)])
        lines.append(f"statekeeper conformance: {self.backend} ({self.target})")
        lines.append(f"declared capabilities: {declared}")
        for capability, counts in self.counts().items():
            shown = ", ".join(f"{counts[o]} {o}" for o in OUTCOMES if counts[o])
            lines.append(f"  {capability:<12} {shown or 'no tests'}")
        lines.append(self._verdict())
        return "\n".join(lines)

    def _verdict(self) -> str:
        base = self.counts()[BASE]
        if self.ok:
            return f"OK: all {base['passed']} base tests passed" + (
                f" ({base['xfailed']} known bugs)" if base["xfailed"] else ""
            )
        bad = sum(1 for r in self.results if r.outcome in BAD) + len(self.errors)
        if bad:
            return f"FAILED: {bad} problem(s)"
        return f"NOT VALIDATED: {base['skipped']} base tests skipped, {base['passed']} passed"


def _tail(text: str, lines: int = 12) -> list[str]:
    return text.strip().splitlines()[-lines:]


class Collector:
    """A pytest plugin object that selects the backend and records every outcome."""

    def __init__(self, chosen: Backend, target: str) -> None:
        self.report = Report(chosen.name, target, chosen.capabilities)
        self._chosen = chosen
        self._results: dict[str, CaseResult] = {}

    def pytest_configure(self, config: pytest.Config) -> None:
        # Imported here, once pytest has loaded the plugin itself (-p), so that pytest
        # can still rewrite its asserts.
        from statekeeper.testing.plugin import SELECTED

        config.stash[SELECTED] = [self._chosen]

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            self.report.errors.append(f"collecting {report.nodeid}: {report.longreprtext}")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = _outcome(report)
        if outcome is None:
            return
        from statekeeper.testing.plugin import CAPABILITY_PROPERTY

        capability = str(dict(report.user_properties).get(CAPABILITY_PROPERTY, BASE))
        detail = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        if outcome in BAD:
            detail = report.longreprtext
        # A teardown error replaces the call's outcome; nothing else comes twice.
        self._results[report.nodeid] = CaseResult(report.nodeid, capability, outcome, detail)

    def pytest_sessionfinish(self) -> None:
        self.report.results = list(self._results.values())


def _outcome(report: pytest.TestReport) -> str | None:
    """The outcome a test report settles, or None when it settles nothing."""
    xfail = hasattr(report, "wasxfail")
    if report.when == "call":
        if xfail:
            return "xfailed" if report.skipped else "xpassed"
        return str(report.outcome)
    if report.failed:
        return "error"
    if report.when == "setup" and report.skipped:
        return "xfailed" if xfail else "skipped"
    return None
