"""Through ADK's own runtime: a real `Runner` with an `LlmAgent` (a scripted model, no
network) and a function tool that writes state, over `StatekeeperSessionService`; then a
new Runner in another process continues the same session from the SQLite file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import adk_app
import pytest
from google.adk.errors import StaleSessionError

from statekeeper.integrations.adk import StatekeeperSessionService
from statekeeper.stores import Store

HERE = Path(__file__).parent


async def test_a_runner_keeps_its_conversation_and_state_on_every_backend(store: Store) -> None:
    service = StatekeeperSessionService(store, tenant="acme")
    await service.create_session(app_name=adk_app.APP, user_id=adk_app.USER, session_id="s1")
    runner = adk_app.make_runner(service)
    assert await adk_app.send(runner, "s1", "remember apples") == [
        "noted apples; user turns so far: 1"
    ]
    assert await adk_app.send(runner, "s1", "remember pears") == [
        "noted pears; user turns so far: 2"
    ]
    session = await service.get_session(app_name=adk_app.APP, user_id=adk_app.USER, session_id="s1")
    assert session is not None
    assert session.state == {
        "items": ["apples", "pears"],
        "user:remembered": 2,
        "app:last_item": "pears",
    }  # temp:scratch was used by the tool and never stored
    # Per turn: the user's message, the model's call, the tool's result, the reply.
    assert [e.author for e in session.events] == ["user", "keeper", "keeper", "keeper"] * 2
    # The user's state follows them to a new session; the app's is everyone's.
    other = await service.create_session(app_name=adk_app.APP, user_id="bob")
    assert other.state == {"app:last_item": "pears"}
    again = await service.create_session(app_name=adk_app.APP, user_id=adk_app.USER)
    assert again.state == {"user:remembered": 2, "app:last_item": "pears"}


def run_turn(db: Path, session_id: str, text: str) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": f"{HERE}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, str(HERE / "adk_app.py"), f"sqlite:///{db}", "acme", session_id, text],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


@pytest.mark.slow
async def test_another_process_continues_the_session(tmp_path: Path) -> None:
    db = tmp_path / "adk.db"
    url = f"sqlite:///{db}"
    async with StatekeeperSessionService.from_url(url, tenant="acme") as service:
        await service.create_session(app_name=adk_app.APP, user_id=adk_app.USER, session_id="s1")
        first = await adk_app.send(adk_app.make_runner(service), "s1", "remember apples")
        assert first == ["noted apples; user turns so far: 1"]
        before = await service.get_session(
            app_name=adk_app.APP, user_id=adk_app.USER, session_id="s1"
        )
        assert before is not None

    elsewhere = run_turn(db, "s1", "remember pears")
    # The other process's model saw this process's turn: the history was reloaded.
    assert elsewhere["replies"] == ["noted pears; user turns so far: 2"]
    assert elsewhere["state"] == {
        "items": ["apples", "pears"],
        "user:remembered": 2,
        "app:last_item": "pears",
    }

    async with StatekeeperSessionService.from_url(url, tenant="acme") as service:
        after = await service.get_session(
            app_name=adk_app.APP, user_id=adk_app.USER, session_id="s1"
        )
        assert after is not None
        assert [e.model_dump(mode="json") for e in after.events] == elsewhere["events"]
        # This process's events came back unchanged from the other process's reads.
        assert [e.model_dump() for e in after.events[:4]] == [e.model_dump() for e in before.events]
        # Back here, the session continues on top of what the other process wrote.
        third = await adk_app.send(adk_app.make_runner(service), "s1", "remember plums")
        assert third == ["noted plums; user turns so far: 3"]
        # A session object loaded before the other process wrote is stale now.
        with pytest.raises(StaleSessionError):
            await service.append_event(before, before.events[-1].model_copy(update={"id": "x"}))
