"""Conversation statistics: cost and tokens summed over a session's runs."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from statekeeper.cli import app
from statekeeper.core.messages import Message
from statekeeper.core.metrics import TokenUsage
from statekeeper.errors import NotFoundError
from statekeeper.runs import Finish, ModelCall, Respond, Runner, RunStore, session_stats
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.stores import Store, open_store


def call(model: str, cost: float, tokens_in: int, tokens_out: int) -> ModelCall:
    return ModelCall(model, TokenUsage(input_tokens=tokens_in, output_tokens=tokens_out), cost)


def agents() -> list[ScriptedAgent]:
    return [
        ScriptedAgent(
            "talker",
            [
                Respond([Message.assistant("one")], call=call("model-a", 0.01, 100, 10)),
                Finish("ok", call=call("model-b", 0.5, 1000, 50)),
            ],
        ),
        ScriptedAgent("quiet", [Finish("ok", call=call("model-a", 0.02, 200, 20))]),
    ]


async def seed(store: Store) -> tuple[Runner, str]:
    runner = Runner(store, "alice", agents())
    first = await runner.start("talker", "hi")
    session_id = first.state.session_id
    await runner.start("quiet", "again", session_id=session_id)
    await runner.start("quiet", "elsewhere")  # another session: not counted
    return runner, session_id


async def test_session_stats_sum_the_runs_of_a_session(store: Store) -> None:
    runner, session_id = await seed(store)
    stats = await runner.session_stats(session_id)
    assert stats.session_id == session_id
    assert stats.cost == pytest.approx(0.53)
    assert (stats.usage.input_tokens, stats.usage.output_tokens) == (1300, 80)
    assert stats.calls == 3
    by_model = {name: (u.calls, u.usage.total, u.cost) for name, u in stats.metrics.models.items()}
    assert by_model == {"model-a": (2, 330, pytest.approx(0.03)), "model-b": (1, 1050, 0.5)}
    assert [(r.agent, r.status, r.calls) for r in stats.runs] == [
        ("talker", "completed", 2),
        ("quiet", "completed", 1),
    ]
    assert stats.to_dict()["cost"] == pytest.approx(0.53)
    assert stats.unreadable == []
    # The same through the function, on a RunStore of its own.
    again = await session_stats(RunStore(store, "alice"), session_id)
    assert again.to_dict() == stats.to_dict()


async def test_a_session_without_runs_has_zero_stats(store: Store) -> None:
    runner = Runner(store, "alice", agents())
    session = await runner.sessions.create(title="empty")
    stats = await runner.session_stats(session.id)
    assert (stats.cost, stats.calls, stats.runs) == (0.0, 0, [])


async def test_stats_of_an_unknown_session_are_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError):
        await Runner(store, "alice", agents()).session_stats("no-such-session")


def test_sessions_show_prints_the_conversation_statistics(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"

    async def main() -> str:
        store = await open_store(url)
        try:
            return (await seed(store))[1]
        finally:
            await store.close()

    session_id = asyncio.run(main())
    cli = CliRunner()
    out = cli.invoke(app, ["--store", url, "--tenant", "alice", "sessions", "show", session_id])
    assert out.exit_code == 0, out.output
    for text in ("Conversation statistics: 2 runs", "model-a", "model-b", "0.530000", "1380"):
        assert text in out.stdout, text
    shown = cli.invoke(
        app, ["--store", url, "--tenant", "alice", "--json", "sessions", "show", session_id]
    )
    stats = json.loads(shown.stdout)["stats"]
    assert stats["cost"] == pytest.approx(0.53)
    assert stats["calls"] == 3
    assert [r["agent"] for r in stats["runs"]] == ["talker", "quiet"]
