"""``statekeeper runs raise-limit RUN``: give a run stopped at a limit room to go on."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.text import Text

from statekeeper.cli._common import JsonFlag, console, print_json, run, wants_json
from statekeeper.core.limits import ControlFlag, Limits
from statekeeper.runs.limiting import LIMIT_KEYWORDS
from statekeeper.runs.runner import Runner
from statekeeper.runs.state import RunState
from statekeeper.stores import Store

__all__ = ["raise_limit"]


def _shown(flag: ControlFlag | None) -> str:
    if flag is None:
        return "unlimited"
    maximum = "∞" if flag.maximum is None else f"{flag.maximum:g}"
    return f"{flag.current:g} of {maximum}"


def _changes(before: Limits, after: Limits) -> list[str]:
    lines = []
    for field, keyword in LIMIT_KEYWORDS.items():
        old, new = getattr(before, field), getattr(after, field)
        if old is not None and new is not None and old.maximum != new.maximum:
            lines.append(f"{keyword}: {_shown(old)} -> {_shown(new)}")
    return lines


def raise_limit(
    ctx: typer.Context,
    run_id: Annotated[str, typer.Argument(help="The run id.", show_default=False)],
    iterations: Annotated[
        int | None, typer.Option(min=0, help="New maximum number of steps.")
    ] = None,
    budget: Annotated[
        float | None, typer.Option(min=0, help="New maximum spend (the model prices' currency).")
    ] = None,
    tokens: Annotated[int | None, typer.Option(min=0, help="New maximum tokens.")] = None,
    seconds: Annotated[
        float | None, typer.Option(min=0, help="New maximum wall time of the run, in seconds.")
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Raise a run's limits: each option is a new maximum (above what the run used).

    Without options, every reached limit goes up by its increase amount. Then resume the
    run with `statekeeper runs resume RUN --app ...`.
    """

    async def work(store: Store, tenant: str) -> tuple[RunState, RunState]:
        runner = Runner(store, tenant, agents=[])
        before = await runner.load(run_id)
        after = await runner.raise_limits(
            run_id, iterations=iterations, budget=budget, tokens=tokens, seconds=seconds
        )
        return before, after

    before, after = run(ctx, work)
    if wants_json(ctx, json_output):
        print_json({"run_id": run_id, "status": after.status, "limits": after.limits.to_dict()})
        return
    out = console()
    out.print(Text(f"raised the limits of run {run_id} ({after.status}):"))
    for line in _changes(before.limits, after.limits):
        out.print(Text(f"  {line}"))
    out.print(Text(f"resume it with `statekeeper runs resume {run_id} --app ...`"))
