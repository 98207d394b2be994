"""Retention (`statekeeper.runs.retention.sweep`): what goes, what stays, and why."""

from __future__ import annotations

from datetime import datetime, timedelta

from statekeeper.core.messages import Message, utcnow
from statekeeper.errors import NotFoundError
from statekeeper.runs.retention import Sweep, _deleted, sweep
from statekeeper.runs.store import RunIndex, RunStore
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store

TENANT = "alice"


async def seed(store: Store) -> datetime:
    """Sessions and runs on both sides of a cutoff; returns the cutoff."""
    manager = SessionManager(store, TENANT)
    talk = [Message.user("hi"), Message.assistant("hello")]
    await manager.create(session_id="lonely", title="Order 1042", messages=talk)
    parent = await manager.create(session_id="parent", messages=talk)
    fork = await parent.fork(session_id="fork")
    grand = await manager.create(session_id="grand", messages=talk)
    mid = await grand.fork(session_id="mid")
    await mid.append(Message.user("more"))
    for session_id in ("busy", "gone", "home"):
        await manager.create(session_id=session_id)
    cutoff = utcnow()  # everything above is older, everything below newer

    await fork.append(Message.user("still talking"))  # the fork is active again
    leaf = await mid.fork(session_id="leaf")
    await leaf.append(Message.user("a new branch of an old talk"))
    runs = RunStore(store, TENANT)
    day = timedelta(days=1)
    for run_id, session_id, updated, parent_run in [
        ("r-old", "gone", cutoff - day, None),
        ("r-live", "busy", cutoff + day, None),
        ("r-parent", "home", cutoff - day, None),
        ("r-child", "home", cutoff + day, "r-parent"),
    ]:
        index = RunIndex(
            run_id=run_id,
            session_id=session_id,
            agent="a",
            status="completed",
            parent_run_id=parent_run,
            updated_at=updated,
        )
        await runs.put_index(index, expected_version=0)
    return cutoff


def ids(report: Sweep) -> dict[str, set[str]]:
    return {
        "runs": {s.id for s in report.runs},
        "sessions": {s.id for s in report.sessions},
        "kept_runs": {s.id for s in report.kept_runs},
        "kept_sessions": {s.id for s in report.kept_sessions},
    }


async def exists(store: Store) -> tuple[set[str], set[str]]:
    runs = {index.run_id for index in await RunStore(store, TENANT).list()}
    sessions = {record.id async for record in SessionManager(store, TENANT).iter()}
    return runs, sessions


async def test_sweep_keeps_what_newer_runs_and_sessions_depend_on(store: Store) -> None:
    cutoff = await seed(store)
    before = await exists(store)

    planned = await sweep(store, TENANT, cutoff, dry_run=True)
    expected = {
        "runs": {"r-old"},
        "sessions": {"lonely", "gone"},
        "kept_runs": {"r-parent"},  # r-child reports back to it
        "kept_sessions": {"parent", "grand", "mid", "busy", "home"},
    }
    assert ids(planned) == expected
    assert planned.dry_run
    assert await exists(store) == before  # a dry run deletes nothing

    done = await sweep(store, TENANT, cutoff)
    assert ids(done) == expected
    runs, sessions = await exists(store)
    assert runs == {"r-live", "r-parent", "r-child"}
    assert sessions == before[1] - {"lonely", "gone"}
    # The forks still read the history they share with their (old) parents.
    manager = SessionManager(store, TENANT)
    assert [m.text for m in await (await manager.get("fork")).messages()] == [
        "hi",
        "hello",
        "still talking",
    ]
    leaf = await (await manager.get("leaf")).messages()
    assert [m.text for m in leaf] == ["hi", "hello", "more", "a new branch of an old talk"]

    again = await sweep(store, TENANT, cutoff)  # nothing left to delete
    assert ids(again)["runs"] == ids(again)["sessions"] == set()


async def test_sweep_only_runs_or_only_sessions(store: Store) -> None:
    cutoff = await seed(store)

    only_sessions = await sweep(store, TENANT, cutoff, runs=False)
    assert ids(only_sessions)["runs"] == set()
    assert ids(only_sessions)["sessions"] == {"lonely"}  # "gone" still has r-old
    assert "gone" in ids(only_sessions)["kept_sessions"]

    only_runs = await sweep(store, TENANT, cutoff, sessions=False)
    assert ids(only_runs)["runs"] == {"r-old"}
    assert only_runs.sessions == only_runs.kept_sessions == []
    runs, sessions = await exists(store)
    assert "r-old" not in runs
    assert "gone" in sessions


async def test_sweep_before_everything_and_before_nothing(store: Store) -> None:
    cutoff = await seed(store)
    assert ids(await sweep(store, TENANT, cutoff - timedelta(days=2), dry_run=True)) == {
        "runs": set(),
        "sessions": set(),
        "kept_runs": set(),
        "kept_sessions": set(),
    }
    everything = await sweep(store, TENANT, utcnow() + timedelta(days=2))
    assert ids(everything)["runs"] == {"r-old", "r-live", "r-parent", "r-child"}
    assert ids(everything)["kept_sessions"] == set()
    assert await exists(store) == (set(), set())


async def test_an_item_deleted_meanwhile_is_not_reported() -> None:
    async def gone(item_id: str) -> None:
        raise NotFoundError(f"{item_id} is gone")

    async def there(item_id: str) -> None:
        return None

    assert await _deleted(gone, "x") is False
    assert await _deleted(there, "x") is True


async def test_stale_items_carry_their_age_and_label(store: Store) -> None:
    cutoff = await seed(store)
    report = await sweep(store, TENANT, cutoff, dry_run=True)
    stale = [*report.runs, *report.kept_runs, *report.sessions, *report.kept_sessions]
    assert all(item.changed_at < cutoff for item in stale)
    labels = {item.id: item.label for item in stale}
    assert labels["r-old"] == labels["r-parent"] == "completed"  # a run's status
    assert labels["lonely"] == "Order 1042"  # a session's title
    assert labels["gone"] == ""
