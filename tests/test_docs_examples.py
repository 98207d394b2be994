"""Every ```python block of README.md and docs/**/*.md runs, as written.

Each block runs in a fresh namespace (``__name__ == "__main__"``) in an empty temporary
working directory, so a relative ``sqlite:///agent.db`` is a new file. Top-level
``await`` is allowed: a block is compiled with ``ast.PyCF_ALLOW_TOP_LEVEL_AWAIT`` and,
when it awaits, run on an event loop of its own; a block that calls ``asyncio.run``
itself runs as it is. The block fails the test if it raises (its own ``assert``s
included); tracebacks name the markdown file and line.

An HTML comment on the line before the fence changes that:

- ``<!-- not-run: reason -->``: the block is not run (a fragment, files of a user's
  project, a live LLM, ...). The reason is required and shows as the skip reason.
- ``<!-- continues -->``: the block runs after the page's previous block, in its
  namespace and on its event loop (a page's setup first, then examples using it).

Afterwards, stores a block left open in its namespace are closed, and the registries a
block may extend (``register_backend``, the conformance kit's schemes and backends)
are restored, and a global OpenTelemetry tracer provider it set is forgotten, so
examples cannot leak into other tests.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import re
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import statekeeper.stores
import statekeeper.testing
from statekeeper.stores import Store

ROOT = Path(__file__).parents[1]
PYTHON = {"python", "py", "python3"}

NOT_RUN_HERE: dict[tuple[str, str], str] = {}
"""Blocks of pages others are changing (docs/runtime.md, docs/architecture.md) that do
not run, marked here instead of in the page: ``(page, first line of the block) ->
reason``. Each entry must still match a block."""

MIN_RUNNABLE = 10
"""How many blocks run at least (README 2, sessions 3, stores 2, testing 2, runs 1).
Fewer means examples were dropped or marked not-run: fix them rather than lower this."""

FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
MARK = re.compile(r"^\s*<!--\s*(?P<kind>not-run|continues)\b(?P<rest>.*?)-->\s*$")
ANY_MARK = re.compile(r"<!--\s*(not[- ]?run|continues)", re.IGNORECASE)


@dataclass(frozen=True)
class Block:
    """One fenced python block of a page."""

    page: str
    line: int
    """The line of the opening fence (1-based); the code starts on the next line."""
    code: str
    not_run: str | None
    """The reason when the block is marked not-run ("" if marked without one)."""
    continues: bool

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def first_line(self) -> str:
        return next((line.strip() for line in self.code.splitlines() if line.strip()), "")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def parse(path: Path) -> tuple[list[Block], list[int]]:
    """The page's python blocks, and the lines of markers attached to no python block."""
    page = path.relative_to(ROOT).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    used: set[int] = set()
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence = opening["fence"]
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if closing.match(lines[j])), None)
        assert end is not None, f"{page}:{i + 1}: a code fence that is never closed"
        info = opening["info"].split()
        if info and info[0].lower() in PYTHON:
            before = next((j for j in range(i - 1, -1, -1) if lines[j].strip()), None)
            mark = MARK.match(lines[before]) if before is not None else None
            if mark is not None and before is not None:
                used.add(before)
            reason = None
            if mark is not None and mark["kind"] == "not-run":
                reason = mark["rest"].strip().removeprefix(":").strip()
            code = textwrap.dedent("\n".join(lines[i + 1 : end]))
            continues = mark is not None and mark["kind"] == "continues"
            block = Block(page, i + 1, code, reason, continues)
            if reason is None:
                reason = NOT_RUN_HERE.get((page, block.first_line))
                block = Block(page, i + 1, code, reason, continues)
            blocks.append(block)
        i = end + 1
    stray = [n + 1 for n, line in enumerate(lines) if ANY_MARK.search(line) and n not in used]
    return blocks, stray


def all_blocks() -> list[Block]:
    return [block for path in pages() for block in parse(path)[0]]


def chains(blocks: list[Block]) -> list[list[Block]]:
    """Runnable blocks, each with the ones that continue it."""
    out: list[list[Block]] = []
    for block in blocks:
        if block.not_run is not None:
            continue
        if block.continues and out and out[-1][-1].page == block.page:
            out[-1].append(block)
        else:
            out.append([block])
    return out


def cases() -> list[object]:
    params: list[object] = []
    blocks = all_blocks()
    for chain in chains(blocks):
        # The first block's page and line, then the lines of those that continue it.
        ident = ",".join([chain[0].where, *(str(block.line) for block in chain[1:])])
        params.append(pytest.param(chain, id=ident))
    for block in blocks:
        if block.not_run is not None:
            reason = f"{block.where}: not-run: {block.not_run}"
            params.append(pytest.param([block], id=block.where, marks=pytest.mark.skip(reason)))
    return params


@contextlib.contextmanager
def registries_restored() -> Iterator[None]:
    """Put back the registries examples may extend (``register_backend`` and the like)."""
    registries: list[dict[str, Any]] = [
        statekeeper.stores.BACKENDS,
        statekeeper.testing.SCHEMES,
        statekeeper.testing.BACKENDS,
    ]
    saved = [dict(registry) for registry in registries]
    try:
        yield
    finally:
        for registry, items in zip(registries, saved, strict=True):
            registry.clear()
            registry.update(items)
        trace = sys.modules.get("opentelemetry.trace")
        if trace is not None:  # docs/tracing.md sets the API's global tracer provider
            from opentelemetry.util._once import Once

            trace._TRACER_PROVIDER_SET_ONCE = Once()  # type: ignore[attr-defined]
            trace._TRACER_PROVIDER = None  # type: ignore[attr-defined]


async def close_stores(namespace: dict[str, object]) -> None:
    """Close the stores an example left open (closing is idempotent)."""
    for value in list(namespace.values()):
        if isinstance(value, Store) and not isinstance(value, type):
            await value.close()


def run(chain: list[Block]) -> None:
    namespace: dict[str, object] = {"__name__": "__main__"}
    with registries_restored(), asyncio.Runner() as loop:
        try:
            for block in chain:
                code = compile(
                    "\n" * block.line + block.code,  # tracebacks give the page's lines
                    str(ROOT / block.page),
                    "exec",
                    flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
                    dont_inherit=True,
                )
                result = eval(code, namespace)  # a coroutine when the block awaits
                if inspect.iscoroutine(result):
                    loop.run(result)
        finally:
            loop.run(close_stores(namespace))


@pytest.mark.parametrize("chain", cases())
def test_the_example_runs(
    chain: list[Block], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    run(chain)


def test_every_mark_is_well_formed() -> None:
    problems: list[str] = []
    for path in pages():
        blocks, stray = parse(path)
        page = path.relative_to(ROOT).as_posix()
        problems += [f"{page}:{n}: a marker not right before a python block" for n in stray]
        for before, block in zip([None, *blocks], blocks, strict=False):
            if block.not_run is not None and not block.not_run.strip():
                problems.append(f"{block.where}: not-run without a reason")
            if block.continues and (before is None or before.not_run is not None):
                problems.append(f"{block.where}: continues, but no block before it runs")
    known = {(block.page, block.first_line) for block in all_blocks()}
    problems += [f"NOT_RUN_HERE: no block {key}" for key in NOT_RUN_HERE if key not in known]
    assert not problems, "\n".join(problems)


def test_the_examples_are_counted() -> None:
    blocks = all_blocks()
    runnable = [block for block in blocks if block.not_run is None]
    fences = sum(
        len(re.findall(r"^[ \t]*```[ \t]*(?:python|py|python3)\b", p.read_text(), re.MULTILINE))
        for p in pages()
    )
    assert len(blocks) == fences  # the parser sees every python block
    assert [b for chain in chains(blocks) for b in chain] == runnable  # each runs once
    assert len(runnable) >= MIN_RUNNABLE, [b.where for b in blocks if b.not_run is not None]


def test_the_harness_runs_what_it_should(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```python\nx = 1\n```\n\n<!-- continues -->\n```python\nassert x == 1\n```\n\n"
        "<!-- not-run: needs a live LLM -->\n```python\nraise SystemExit\n```\n"
        "<!-- continues -->\ntext\n\n~~~py\nawait asyncio.sleep(0)\n~~~\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    blocks, stray = parse(page)
    assert [(b.line, b.continues, b.not_run) for b in blocks] == [
        (1, False, None),
        (6, True, None),
        (11, False, "needs a live LLM"),
        (17, False, None),
    ]
    assert stray == [14]  # the second "continues" is not before a block
    assert [[b.line for b in chain] for chain in chains(blocks)] == [[1, 6], [17]]
    run(chains(blocks)[0])
    with pytest.raises(NameError):  # a block without "continues" starts afresh
        run([Block("page.md", 6, "assert x == 1", None, False)])
    with pytest.raises(AssertionError) as failed:
        run([Block("page.md", 6, "import asyncio\nawait asyncio.sleep(0)\nassert 0", None, False)])
    assert failed.traceback[-1].lineno + 1 == 9  # the page's line of the failing assert


def test_every_readme_block_runs_as_pasted_into_a_file() -> None:
    """The README's blocks are what a new user copies into a script: no top-level
    ``await`` (a SyntaxError outside a notebook or the asyncio REPL), no block that
    leans on an earlier one."""
    blocks, _ = parse(ROOT / "README.md")
    for block in blocks:
        if block.not_run is None:
            assert not block.continues, block.where
            compile(block.code, block.where, "exec")  # SyntaxError on a top-level await
