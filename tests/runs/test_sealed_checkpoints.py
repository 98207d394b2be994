"""Stored checkpoints sealed with a codec: compressed, encrypted, tamper-evident."""

from __future__ import annotations

import base64

import pytest

from statekeeper.codec import StateCodec, StateTamperedError
from statekeeper.core.messages import Message
from statekeeper.errors import InvalidInputError
from statekeeper.runs import AskInput, CheckpointOptions, Finish, Runner
from statekeeper.runs.scripted import ScriptedAgent
from statekeeper.runs.store import CHECKPOINT_KIND
from statekeeper.stores import Store

KEY = bytes(range(32))


def agent() -> ScriptedAgent:
    return ScriptedAgent("a", [AskInput("name?"), Finish("ok", Message.assistant("bye"))])


async def test_sealed_checkpoints_round_trip_and_hide_the_state(store: Store) -> None:
    options = CheckpointOptions(codec=StateCodec(compress=True, key=KEY))
    runner = Runner(store, "alice", [agent()], checkpoints=options)
    asked = await runner.start("a", "hi", metadata={"secret": "s3cr3t"})
    entries = await store.read_entries("alice", asked.state.session_id)
    sealed = [e.payload for e in entries if e.kind == CHECKPOINT_KIND]
    assert sealed
    assert all(set(p) == {"run_id", "sealed"} for p in sealed)
    assert all("s3cr3t" not in p["sealed"] for p in sealed)

    done = await Runner(store, "alice", [agent()], checkpoints=options).resume(asked.run_id, "Ada")
    assert done.status == "completed"
    with pytest.raises(InvalidInputError, match="codec"):
        await Runner(store, "alice", [agent()]).load(asked.run_id)
    other_key = CheckpointOptions(codec=StateCodec(key=bytes(32)))
    with pytest.raises(StateTamperedError):
        await Runner(store, "alice", [agent()], checkpoints=other_key).load(asked.run_id)


async def test_a_tampered_sealed_checkpoint_is_refused(store: Store) -> None:
    codec = StateCodec(key=KEY)
    runner = Runner(store, "alice", [agent()], checkpoints=CheckpointOptions(codec=codec))
    asked = await runner.start("a", "hi")
    state = await runner.load(asked.run_id)
    # Write a checkpoint whose sealed bytes were flipped, as an attacker with the file would.
    blob = bytearray(base64.b64decode(runner.runs.seal.seal(state)["sealed"]))
    blob[-1] ^= 0x01
    bad = {"run_id": state.run_id, "sealed": base64.b64encode(bytes(blob)).decode()}
    from statekeeper.stores.base import EntryDraft

    written = await store.append_entries(
        "alice",
        state.session_id,
        [EntryDraft(id=f"{state.run_id}.c999", kind=CHECKPOINT_KIND, payload=bad, side=True)],
    )
    entries = written.entries
    # Refused, reported, and the run goes on from the newest authentic checkpoint.
    loaded = await runner.runs.load_latest(asked.run_id)
    assert [s.id for s in loaded.skipped] == [f"{state.run_id}.c999"]
    assert loaded.state.revision == 999  # its id is never reused
    assert loaded.state.status == "waiting_for_input"
    events = await store.read_events("alice", asked.run_id)
    assert any(e.payload.get("checkpoint") == f"{state.run_id}.c999" for e in events)
    with pytest.raises(StateTamperedError):  # the seal itself refuses the bytes
        runner.runs.decode(entries[-1], state.run_id)
