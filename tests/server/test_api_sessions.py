"""The sessions and runtime API through HTTP against a running server."""

from __future__ import annotations

import json
from collections.abc import Sequence

import httpx
import pytest

from statekeeper.core.messages import Message, stored_message
from statekeeper.longterm import LongTermStore
from statekeeper.runtime.profiles import AuthProfiles
from statekeeper.server import routes_sessions
from statekeeper.sessions import SessionManager
from statekeeper.stores import Store

from .conftest import Live


async def _summary(messages: Sequence[Message]) -> Message:
    return Message.assistant(f"summary of {len(messages)} messages")


async def test_sessions_create_append_read_fork_export_import_delete(live: Live) -> None:
    async with live.client("operate") as client, live.client("admin") as admin:
        made = await client.post("/api/v1/sessions", json={"session_id": "ses-a", "title": "A"})
        appended = await client.post(
            "/api/v1/sessions/ses-a/messages",
            json={
                "messages": [
                    {"role": "user", "content": "hello"},
                    {"role": "assistant", "content": "hi there"},
                ]
            },
        )
        listed = (await client.get("/api/v1/sessions")).json()
        later = await client.get(
            "/api/v1/sessions", params={"active_after": "2999-01-01T00:00:00+00:00"}
        )
        naive = await client.get("/api/v1/sessions", params={"active_after": "2000-01-01T00:00"})
        shown = (await client.get("/api/v1/sessions/ses-a")).json()
        entries = (await client.get("/api/v1/sessions/ses-a/entries")).json()
        forked = await client.post("/api/v1/sessions/ses-a/fork", json={"at": 1})
        exported = (await client.get("/api/v1/sessions/ses-a/export")).json()
        imported = await client.post(
            "/api/v1/sessions/import", params={"session_id": "ses-copy"}, json=exported
        )
        refused = await client.delete("/api/v1/sessions/ses-a")
        deleted = await admin.delete("/api/v1/sessions/ses-a")
        gone = await client.get("/api/v1/sessions/ses-a")
        taken = await client.post("/api/v1/sessions", json={"session_id": "ses-copy"})
        bad = await client.post("/api/v1/sessions/ses-copy/messages", json={"messages": [{}]})
    assert made.status_code == 201, made.text
    assert appended.status_code == 201
    assert [e["message"]["content"] for e in appended.json()["entries"]] == ["hello", "hi there"]
    assert {s["session_id"] for s in listed["items"]} == {"ses-a"}
    assert later.json()["items"] == []
    assert naive.status_code == 422
    assert shown["message_count"] == 2
    assert shown["runs"] == []
    assert [(e["seq"], e["parent_seq"], e["category"]) for e in entries["items"]] == [
        (1, None, "dialog"),
        (2, 1, "dialog"),
    ]
    assert all(e["on_branch"] for e in entries["items"])
    assert forked.status_code == 201
    assert forked.json()["forked_from"] == {"session_id": "ses-a", "seq": 1}
    assert imported.status_code == 201
    assert imported.json()["session_id"] == "ses-copy"
    assert imported.json()["message_count"] == 2
    assert refused.status_code == 403
    assert deleted.status_code == 204
    assert gone.status_code == 404
    assert taken.status_code == 409
    assert taken.json()["error"]["type"] == "AlreadyExistsError"
    assert bad.status_code == 422


async def test_the_tree_shows_branches_and_what_a_compaction_stands_for(
    live: Live, db: tuple[str, Store]
) -> None:
    manager = SessionManager(db[1], "acme")
    session = await manager.create(session_id="ses-tree")
    for n in range(6):
        await session.append(Message.user(f"question {n}"), Message.assistant(f"answer {n}"))
    await session.checkout(2)  # a branch from entry 2
    await session.append(Message.user("another way"))
    await session.checkout(12)
    result = await session.compact(_summary, keep_last=2)
    assert result.entry is not None
    async with live.client("read") as client:
        tree = (await client.get("/api/v1/sessions/ses-tree/tree")).json()
        page = await client.get("/api/v1/sessions/ses-tree/entries?after_seq=10&limit=3")
    nodes = {n["seq"]: n for n in tree["nodes"]}
    branch = {e.seq for e in await session.branch()}
    assert [(e["seq"], e["on_branch"]) for e in page.json()["items"]] == [
        (seq, seq in branch) for seq in (11, 12, 13)
    ]
    assert [n["on_branch"] for n in nodes.values()] == [seq in branch for seq in nodes]
    stored = {e.seq: e for e in await session.entries(after_seq=10, limit=3)}
    for item in page.json()["items"]:  # the message as the library writes it
        entry = stored[item["seq"]]
        assert (
            item["message"] == stored_message(entry.payload, entry.id, entry.created_at).to_dict()
        )
    assert tree["head_seq"] == result.entry.seq
    branch_point = [e for e in tree["edges"] if e["type"] == "parent" and e["from"] == 2]
    assert sorted(e["to"] for e in branch_point) == [3, 13]
    assert nodes[13]["on_branch"] is False
    compaction = nodes[result.entry.seq]
    assert compaction["kind"] == "compaction"
    assert compaction["message"]["content"] == f"summary of {result.replaced} messages"
    assert len(compaction["covers"]) == result.replaced
    summarized = {e["to"] for e in tree["edges"] if e["type"] == "summarizes"}
    assert summarized == set(compaction["covers"])
    assert 13 not in summarized


async def test_a_compaction_in_a_page_covers_its_nearest_ancestors(
    live: Live, db: tuple[str, Store], monkeypatch: pytest.MonkeyPatch
) -> None:
    session = await SessionManager(db[1], "acme").create(session_id="ses-twice")
    for round_ in range(2):
        for n in range(5):
            await session.append(Message.user(f"q{round_}.{n}"), Message.assistant("a"))
        await session.compact(_summary, keep_last=2)
    head = session.record.head_seq
    url = f"/api/v1/sessions/ses-twice/entries?after_seq={head - 1}&limit=1"
    async with live.client("read") as client:
        whole = (await client.get(url)).json()["items"][0]
        covers = whole["covers"]
        # Read no more than reaches back to what the second compaction stands for.
        monkeypatch.setattr(routes_sessions, "_TREE_LIMIT", head - min(covers) + 1)
        near = (await client.get(url)).json()["items"][0]
    assert whole["kind"] == "compaction"
    assert min(covers) > 1
    assert near["covers"] == covers


async def test_records_profiles_lanes_and_subagents(live: Live, db: tuple[str, Store]) -> None:
    await AuthProfiles(db[1], "acme", "support").add("env:OPENAI_KEY_SECRET", label="main")
    async with live.client("operate") as client, live.client("admin") as admin:
        put = await client.put("/api/v1/records/notes/k1", json={"value": {"a": 1}})
        stale = await client.put(
            "/api/v1/records/notes/k1", json={"value": 2, "expected_version": 9}
        )
        listed = (await client.get("/api/v1/records/notes")).json()
        got = (await client.get("/api/v1/records/notes/k1")).json()
        library = await client.get("/api/v1/records/auth_profiles")
        deleted = await admin.delete("/api/v1/records/notes/k1")
        profiles = await client.get("/api/v1/profiles", params={"agent": "support"})
        reset = await client.post("/api/v1/profiles/reset", json={"agent": "support"})
        lanes = (await client.get("/api/v1/lanes")).json()
        subagents = (await client.get("/api/v1/subagents")).json()
        kill = await client.post("/api/v1/subagents/run-none/kill")
    assert put.json()["version"] == 1
    assert stale.status_code == 409
    assert stale.json()["error"]["type"] == "ConflictError"
    assert [r["key"] for r in listed["items"]] == ["k1"]
    assert got["value"] == {"a": 1}
    assert library.status_code == 422
    assert deleted.status_code == 204
    [profile] = profiles.json()["items"]
    assert profile["secret_ref"] == "env:…"
    assert "OPENAI_KEY_SECRET" not in profiles.text
    assert "OPENAI_KEY_SECRET" not in reset.text
    assert lanes == {"lanes": [], "expired_leases": []}
    assert subagents == {"items": []}
    assert kill.status_code == 404


async def test_keys_are_stored_hashed(live: Live, db: tuple[str, Store]) -> None:
    from statekeeper.server.keys import KEYS_NAMESPACE, KEYS_TENANT

    stored = await db[1].list_records(KEYS_TENANT, KEYS_NAMESPACE)
    text = str([r.value for r in stored])
    assert len(stored) == 4
    for key in [*live.keys.values(), live.other_key]:
        assert key.split("_", 2)[2] not in text
    async with httpx.AsyncClient(base_url=live.url) as client:
        answer = await client.get("/api/v1/records/api_keys", headers=live.headers("admin"))
    assert answer.json()["items"] == []  # the key records are not in any tenant's reach


async def test_cors_is_closed_by_default(live: Live) -> None:
    async with httpx.AsyncClient(base_url=live.url) as client:
        answer = await client.options(
            "/api/v1/runs",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "GET"},
        )
    assert "access-control-allow-origin" not in answer.headers


async def test_memories_of_the_long_term_store(live: Live, db: tuple[str, Store]) -> None:
    memories = LongTermStore(db[1], tenant="acme")
    await memories.put(("users", "ann"), "theme", {"value": "dark"})
    await memories.put(("users", "bob"), "theme", {"value": "light"}, ttl=60)
    await LongTermStore(db[1], tenant="other").put(("users", "eve"), "theme", {"value": "x"})
    ann = [("namespace", "users"), ("namespace", "ann")]
    async with live.client("operate") as client, live.client("admin") as admin:
        spaces = (await client.get("/api/v1/memories/namespaces", params={"max_depth": 2})).json()
        dark = await client.get(
            "/api/v1/memories", params={"prefix": "users", "filter": '{"value": "dark"}'}
        )
        got = await client.get("/api/v1/memories/item", params=[*ann, ("key", "theme")])
        put = await client.put(
            "/api/v1/memories/item",
            json={"namespace": ["users", "ann"], "key": "lang", "value": {"value": "fr"}},
        )
        bad = await client.get("/api/v1/memories", params={"filter": "[1]"})
        raw = await client.get("/api/v1/records/ltm.default")
        refused = await client.delete("/api/v1/memories/item", params=[*ann, ("key", "lang")])
        deleted = await admin.delete("/api/v1/memories/item", params=[*ann, ("key", "lang")])
        again = await admin.delete("/api/v1/memories/item", params=[*ann, ("key", "lang")])
    assert spaces["items"] == [["users", "ann"], ["users", "bob"]]  # not tenant other's
    [item] = dark.json()["items"]
    assert (item["namespace"], item["key"], item["value"]) == (
        ["users", "ann"],
        "theme",
        {"value": "dark"},
    )
    assert got.json()["expires_at"] is None
    assert put.json()["value"] == {"value": "fr"}
    assert bad.status_code == 422
    assert raw.status_code == 422
    assert refused.status_code == 403
    assert deleted.status_code == 204
    assert again.status_code == 404


async def test_reading_a_memory_over_http_does_not_refresh_its_ttl(
    live: Live, db: tuple[str, Store]
) -> None:
    memories = LongTermStore(db[1], tenant="acme")
    await memories.put(("users", "bob"), "theme", {"value": "light"}, ttl=60)
    before = await memories.get(("users", "bob"), "theme", refresh_ttl=False)
    params = [("namespace", "users"), ("namespace", "bob"), ("key", "theme")]
    async with live.client("read") as client:
        shown = (await client.get("/api/v1/memories/item", params=params)).json()
        listed = (await client.get("/api/v1/memories", params={"prefix": "users"})).json()
    after = await memories.get(("users", "bob"), "theme", refresh_ttl=False)
    assert before is not None
    assert after is not None
    assert after.expires_at == before.expires_at
    assert shown["expires_at"] == before.expires_at.isoformat()
    assert [i["key"] for i in listed["items"]] == ["theme"]


async def test_lists_report_damaged_rows_and_show_the_rest(
    live: Live, db: tuple[str, Store]
) -> None:
    from statekeeper.runs.store import RUNS_NAMESPACE
    from statekeeper.testing.damage import damage_record, damage_session

    from .test_api_runs import start_waiting_run

    store = db[1]
    manager = SessionManager(store, "acme")
    await manager.create(session_id="ses-good")
    await manager.create(session_id="ses-bad")
    await damage_session(store, "acme", "ses-bad")
    await store.put_record("acme", "notes", "a", 1)
    await store.put_record("acme", "notes", "b", 2)
    await damage_record(store, "acme", "notes", "b")
    good = await start_waiting_run(store)
    bad = await start_waiting_run(store)
    await damage_record(store, "acme", RUNS_NAMESPACE, bad)
    async with live.client("read") as client:
        sessions = (await client.get("/api/v1/sessions")).json()
        records = (await client.get("/api/v1/records/notes")).json()
        runs = (await client.get("/api/v1/runs")).json()
        broken = await client.get("/api/v1/sessions/ses-bad")
    assert "ses-good" in {s["session_id"] for s in sessions["items"]}
    assert [c["id"] for c in sessions["corrupt"]] == ["ses-bad"]
    assert [r["key"] for r in records["items"]] == ["a"]
    assert [c["id"] for c in records["corrupt"]] == ["b"]
    assert [r["run_id"] for r in runs["items"]] == [good]
    assert [c["id"] for c in runs["corrupt"]] == [bad]
    assert broken.status_code == 500
    assert broken.json()["error"]["type"] == "StoreCorruptError"
    assert "ses-bad" in broken.json()["error"]["message"]
    where = db[0].removeprefix("sqlite:///")  # clients learn what is damaged, not where
    for body in (sessions, records, runs, broken.json()):
        assert where not in json.dumps(body)


async def test_a_run_whose_session_was_deleted_is_reported_not_hidden(
    live: Live, db: tuple[str, Store]
) -> None:
    from .test_api_runs import start_waiting_run

    store = db[1]
    kept = await start_waiting_run(store)
    orphan = await start_waiting_run(store)
    index = await store.get_record("acme", "runs", orphan)
    await store.delete_session("acme", index.value["session_id"])
    async with live.client("read") as client:
        runs = (await client.get("/api/v1/runs")).json()
        shown = await client.get(f"/api/v1/runs/{orphan}")
    assert [r["run_id"] for r in runs["items"]] == [kept]
    [reported] = runs["corrupt"]
    assert reported["id"] == orphan
    assert "was deleted" in reported["error"]
    assert shown.status_code == 404
    assert "was deleted" in shown.json()["error"]["message"]


async def test_a_session_a_waiting_run_uses_is_kept_unless_forced(
    live: Live, db: tuple[str, Store]
) -> None:
    from .test_api_runs import start_waiting_run

    store = db[1]
    run_id = await start_waiting_run(store)
    session_id = (await store.get_record("acme", "runs", run_id)).value["session_id"]
    async with live.client("admin") as admin:
        refused = await admin.delete(f"/api/v1/sessions/{session_id}")
        kept = await admin.get(f"/api/v1/sessions/{session_id}")
        forced = await admin.delete(f"/api/v1/sessions/{session_id}", params={"force": "true"})
        gone = await admin.get(f"/api/v1/sessions/{session_id}")
    assert refused.status_code == 409
    assert refused.json()["error"]["type"] == "ConflictError"
    assert run_id in refused.json()["error"]["message"]
    assert kept.status_code == 200
    assert forced.status_code == 204
    assert gone.status_code == 404
