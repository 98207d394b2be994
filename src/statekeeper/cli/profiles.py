"""``statekeeper profiles list|reset``: an agent's auth profiles (API key rotation).

Secrets never leave the store through here: a profile shows only its secret
reference's scheme (``env:…``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from statekeeper.cli._common import JsonFlag, console, fail, print_json, run, stamp, wants_json
from statekeeper.cli._runtime_common import span
from statekeeper.core.messages import utcnow
from statekeeper.runtime.profiles import AuthProfile, AuthProfiles, mask_secret
from statekeeper.stores import Store

__all__ = ["profiles_app"]

profiles_app = typer.Typer(
    help="List and reset an agent's auth profiles (API key rotation).", no_args_is_help=True
)

AgentOption = Annotated[
    str, typer.Option("--agent", metavar="AGENT", help="The agent id.", show_default=False)
]


def _profile_json(profile: AuthProfile, now: datetime) -> dict[str, Any]:
    data = profile.model_dump(mode="json", exclude={"secret_ref"})
    return {**data, "secret_ref": mask_secret(profile.secret_ref), "cooling": profile.cooling(now)}


def _cooldown(profile: AuthProfile, now: datetime) -> str:
    until = profile.cooldown_until
    if until is None:
        return ""
    if profile.cooling(now):
        return f"{stamp(until)} (in {span((until - now).total_seconds())})"
    return f"{stamp(until)} (over)"


@profiles_app.command("list")
def list_profiles(ctx: typer.Context, agent: AgentOption, json_output: JsonFlag = False) -> None:
    """List an agent's auth profiles: use, cooldown and failures (secrets show only their
    scheme, e.g. env:…)."""

    async def work(store: Store, tenant: str) -> list[AuthProfile]:
        return await AuthProfiles(store, tenant, agent).list()

    profiles = run(ctx, work)
    now = utcnow()
    if wants_json(ctx, json_output):
        print_json({"agent": agent, "items": [_profile_json(p, now) for p in profiles]})
        return
    out = console()
    if not profiles:
        out.print(Text(f"Agent {agent} has no auth profiles."))
        return
    table = Table(title=f"Auth profiles of agent {agent}")
    columns = ("id", "label", "secret", "uses", "last used (UTC)", "cooldown until (UTC)")
    for column in (*columns, "failures", "reason"):
        table.add_column(column, justify="right" if column in ("uses", "failures") else "left")
    for profile in profiles:
        table.add_row(
            Text(profile.id),
            Text(profile.label),
            Text(mask_secret(profile.secret_ref)),
            str(profile.usage_count),
            stamp(profile.last_used),
            _cooldown(profile, now),
            str(profile.failure_count),
            Text(profile.failure_reason or "", overflow="fold"),
        )
    out.print(table)


@profiles_app.command("reset")
def reset_profiles(
    ctx: typer.Context,
    agent: AgentOption,
    profile_id: Annotated[
        str | None,
        typer.Argument(help="The profile to reset (default: every profile of the agent)."),
    ] = None,
) -> None:
    """Clear cooldowns and failure streaks of an agent's profiles (one, or all)."""

    async def work(store: Store, tenant: str) -> list[AuthProfile]:
        profiles = AuthProfiles(store, tenant, agent)
        if profile_id is not None:
            before = [await profiles.get(profile_id)]
        else:
            before = await profiles.list()
            if not before:  # reset() would store an empty record for an unknown agent
                fail(f"agent {agent!r} has no auth profiles")
        await profiles.reset(profile_id)
        return before

    before = run(ctx, work)
    now = utcnow()
    cooling = sum(1 for p in before if p.cooling(now))
    failures = sum(p.failure_count for p in before)
    what = f"profile {profile_id}" if profile_id is not None else f"{len(before)} profile(s)"
    console().print(
        Text(
            f"reset {what} of agent {agent}: cleared {cooling} cooldown(s) "
            f"and {failures} failure(s) in a row"
        )
    )
