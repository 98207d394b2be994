"""One runner step is one write: its messages, its checkpoint and its events in one append
(write mode ``step``), with the events in the order the other modes publish them; and
loading a run whose index lags far behind reads only the session's last entries."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from statekeeper.core.messages import Message, ToolCallBlock
from statekeeper.runs import CheckpointOptions, Coordination, Finish, Respond, Runner, Tool
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.runs.state import RunState
from statekeeper.runs.store import RunStore
from statekeeper.runtime.events import EventBus
from statekeeper.stores import Store, open_store
from statekeeper.stores.base import EntryDraft, EventBatch, EventDraft, WrappingStore
from statekeeper.testing import open_backend

TENANT = "alice"


class Recording(WrappingStore):
    """A store that notes each append: (how, event kinds, checkpoint ids), and reads."""

    def __init__(self, store: Store) -> None:
        self.wrapped = store
        self.writes: list[tuple[str, list[str], list[str]]] = []
        self.read: list[int] = []

    async def append_entries(
        self, tenant: str, session_id: str, drafts: Sequence[EntryDraft], **kw: Any
    ) -> Any:
        batch: EventBatch | None = kw.get("events")
        kinds = [f"{e.stream}/{e.kind}" for e in batch.events] if batch else []
        checkpoints = [d.id for d in drafts if d.kind == "checkpoint"]
        self.writes.append(("entries", kinds, checkpoints))
        return await self.wrapped.append_entries(tenant, session_id, drafts, **kw)

    async def append_events(self, tenant: str, log_id: str, events: Sequence[EventDraft]) -> Any:
        self.writes.append(("events", [f"{e.stream}/{e.kind}" for e in events], []))
        return await self.wrapped.append_events(tenant, log_id, events)

    async def read_entries(self, tenant: str, session_id: str, **kw: Any) -> Any:
        found = await self.wrapped.read_entries(tenant, session_id, **kw)
        self.read.append(len(found))
        return found


@pytest.fixture(params=["sqlite", "memory"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    url = f"sqlite:///{tmp_path / 's.db'}" if request.param == "sqlite" else "memory://"
    async with open_store(url) as opened:
        yield opened


def agent() -> ScriptedAgent:
    said = [Respond([Message.assistant(f"step {n}")]) for n in range(1, 4)]
    return ScriptedAgent("worker", [*said, Finish("done", message=Message.assistant("bye"))])


async def run_logged(store: Store, mode: str) -> tuple[Recording, list[str]]:
    recording = Recording(store)
    runner = Runner(recording, TENANT, [agent()], checkpoints=CheckpointOptions(write_mode=mode))  # type: ignore[arg-type]
    result = await runner.start("worker", "go")
    assert result.status == "completed"
    logged = await store.read_events(TENANT, result.run_id)
    return recording, [f"{e.stream}/{e.kind}" for e in logged]


async def test_each_step_writes_its_messages_checkpoint_and_events_in_one_append(
    store: Store,
) -> None:
    recording, logged = await run_logged(store, "step")
    steps = [w for w in recording.writes if w[0] == "entries"]
    # The input (the "running" status went before it), three steps, the finishing step.
    assert [kinds for _, kinds, _ in steps] == [
        [],
        ["assistant/complete"],
        ["assistant/complete"],
        ["assistant/complete"],
        ["assistant/complete", "lifecycle/status"],  # what it said, then "completed"
    ]
    assert all(len(checkpoints) == 1 for _, _, checkpoints in steps)
    alone = [kinds for how, kinds, _ in recording.writes if how == "events"]
    assert "assistant/complete" not in {k for kinds in alone for k in kinds}
    assert logged.count("assistant/complete") == 4


@pytest.mark.parametrize("mode", ["background", "exit"])
async def test_subscribers_see_the_events_in_the_order_the_other_modes_publish_them(
    store: Store, mode: str
) -> None:
    _, joint = await run_logged(store, "step")
    recording, separate = await run_logged(store, mode)
    assert joint == separate
    assert all(how == "events" or not kinds for how, kinds, _ in recording.writes)


async def test_a_bus_on_another_store_gets_the_events_and_the_append_carries_none(
    store: Store,
) -> None:
    async with open_store("memory://") as elsewhere:
        recording = Recording(store)
        bus = EventBus(elsewhere, TENANT)
        runner = Runner(recording, TENANT, [agent()], coordination=Coordination(events=bus))  # type: ignore[arg-type]
        result = await runner.start("worker", "go")
        assert all(not kinds for _, kinds, _ in recording.writes)
        assert await store.read_events(TENANT, result.run_id) == []
        logged = [e.kind for e in await elsewhere.read_events(TENANT, result.run_id)]
        assert logged.count("complete") == 4


async def test_loading_a_run_whose_index_lags_far_behind_reads_only_the_last_entries(
    store: Store,
) -> None:
    recording = Recording(store)
    runs = RunStore(recording, TENANT)  # type: ignore[arg-type]
    session = await Runner(store, TENANT, []).sessions.create()
    state = RunState(run_id="run-1", tenant=TENANT, session_id=session.id, agent="worker")
    version = await runs.create(state)
    for n in range(300):  # as a running runner writes: no index write per checkpoint
        state.turn = n + 1
        await runs.save(state, [Message.assistant(f"step {n}")], index_version=version,
                        update_index=False)  # fmt: skip
    recording.read.clear()
    loaded = await runs.load_latest("run-1")
    assert (loaded.state.turn, loaded.state.revision) == (300, 300)
    assert sum(recording.read) <= 64  # one page back from the end, not 600 entries
    assert loaded.index.revision == 300  # rolled forward


# -- steps that call a tool ---------------------------------------------------------------


async def look_up(args: dict[str, Any], ctx: Any) -> str:
    return "in transit " * 50


def calling_agent() -> ScriptedAgent:
    def asks(n: int) -> Respond:
        call = ToolCallBlock(id=f"c{n}", name="look_up", arguments="{}")
        return Respond([Message.assistant(f"checking {n}", tool_calls=[call])])

    return ScriptedAgent("worker", [asks(1), asks(2), Finish("done")])


async def test_a_step_that_calls_a_tool_is_one_append_with_its_tool_events(store: Store) -> None:
    recording = Recording(store)
    runner = Runner(recording, TENANT, [calling_agent()], [Tool("look_up", look_up)])  # type: ignore[arg-type]
    result = await runner.start("worker", "go")
    assert result.status == "completed"
    steps = [kinds for how, kinds, _ in recording.writes if how == "entries"]
    said = ["assistant/complete", "tool/call_start", "tool/result"]
    assert steps[1:3] == [said, said]
    alone = [kinds for how, kinds, _ in recording.writes if how == "events"]
    assert not {"tool/call_start", "tool/result"} & {k for kinds in alone for k in kinds}


async def test_the_events_name_the_messages_instead_of_repeating_them(store: Store) -> None:
    runner = Runner(store, TENANT, [calling_agent()], [Tool("look_up", look_up)])
    result = await runner.start("worker", "go")
    logged = await store.read_events(TENANT, result.run_id)
    said = next(e for e in logged if e.kind == "complete")
    output = next(e for e in logged if e.kind == "result")
    assert "text" not in said.payload
    assert said.payload["tool_calls"] == [{"id": "c1", "name": "look_up"}]
    assert "output" not in output.payload
    messages = {m.id: m for m in result.new_messages}
    assert messages[said.payload["id"]].text == "checking 1"
    assert messages[output.payload["message"]].text == "in transit " * 50
    resolved = await runner.runs.events(result.run_id)
    texts = [(e.kind, e.payload.get("text") or e.payload.get("output")) for e in resolved]
    assert ("complete", "checking 1") in texts
    assert ("result", "in transit " * 50) in texts


async def test_subscribers_here_see_the_call_start_before_the_tool_runs(store: Store) -> None:
    seen: list[tuple[str, str]] = []
    logged_then: list[list[str]] = []

    async def watched(args: dict[str, Any], ctx: Any) -> str:
        if not seen:  # what a subscriber here has got by the time the tool runs
            seen.extend([(e.stream, e.kind) for e in [await anext(sub) for _ in range(4)]])
            logged = await store.read_events(TENANT, ctx.run.run_id)
            logged_then.append([e.kind for e in logged])
        return "ok"

    recording = Recording(store)
    runner = Runner(recording, TENANT, [calling_agent()], [Tool("look_up", watched)])  # type: ignore[arg-type]
    bus = runner.events
    assert isinstance(bus, EventBus)
    with bus.subscribe("run-watched") as sub:
        await runner.start("worker", "go", run_id="run-watched")
    # A live listener costs no write: each tool step is still one append, events and all.
    steps = [kinds for how, kinds, _ in recording.writes if how == "entries"]
    said = ["assistant/complete", "tool/call_start", "tool/result"]
    assert steps[1:3] == [said, said]
    alone = [kinds for how, kinds, _ in recording.writes if how == "events"]
    assert not {"tool/call_start", "tool/result"} & {k for kinds in alone for k in kinds}
    assert seen == [
        ("lifecycle", "start"),
        ("lifecycle", "status"),
        ("assistant", "complete"),
        ("tool", "call_start"),
    ]
    # The log had neither yet: they are logged with the step's checkpoint.
    assert logged_then == [["start", "status"]]


@pytest.mark.parametrize("backend", ["memory", "sqlite", "files", "redis", "postgres"])
async def test_on_every_backend_a_tool_step_is_one_append_and_logs_its_events(
    backend: str, tmp_path: Path
) -> None:
    async with open_backend(backend, tmp_path) as opened:
        recording = Recording(opened)
        runner = Runner(recording, TENANT, [calling_agent()], [Tool("look_up", look_up)])  # type: ignore[arg-type]
        result = await runner.start("worker", "go")
        steps = [kinds for how, kinds, _ in recording.writes if how == "entries"]
        said = ["assistant/complete", "tool/call_start", "tool/result"]
        assert steps[1:3] == [said, said]
        logged = [f"{e.stream}/{e.kind}" for e in await opened.read_events(TENANT, result.run_id)]
        assert logged[2:8] == said + said
