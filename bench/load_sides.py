"""The sides of `bench.load`: chat-agent sessions over HTTP (``statekeeper serve``
subprocesses), through the library in this process, and raw psycopg; each side runs its
sessions' turns for a given time and tallies what they did (see `bench.load`)."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from statekeeper.core.messages import Message
from statekeeper.demo_app import make_runner
from statekeeper.sessions import SessionManager

SRC = Path(__file__).parents[1] / "src"
APP = "statekeeper.demo_app:make_runner"
# Each side its own tenant: GET /runs/{id} lists the tenant's whole run index (for the
# run's children), so with one tenant a side would pay for the runs the other made.
TENANT_HTTP = "load-http"
TENANT_LIB = "load-lib"
PAGE = 20
RUN_EVERY = 10  # one turn in RUN_EVERY also runs an agent that stops for approval
POLL = 0.25  # seconds between reads of a run until it waits for approval (HTTP side)
TIMEOUT = 60.0  # seconds: a request's timeout; a side waits this long past its time


class Tally:
    """What one side did: counts, latencies (seconds) and errors."""

    def __init__(self) -> None:
        self.appends: list[float] = []
        self.reads: list[float] = []
        self.runs: list[float] = []
        self.errors = 0
        self.samples: list[str] = []
        self.elapsed = 0.0
        self.cpu = 0.0  # CPU seconds of this process (the client; on the library side, all)
        self.server_cpu = 0.0  # CPU seconds of the server processes
        self.halves: list[float] = []  # appends per second of each part merged in

    def error(self, exc: BaseException) -> None:
        self.errors += 1
        if len(self.samples) < 3:
            self.samples.append(f"{exc.__class__.__name__}: {str(exc)[:200]}")

    def merge(self, other: Tally) -> None:
        self.halves.append(other.rate)
        self.appends += other.appends
        self.reads += other.reads
        self.runs += other.runs
        self.errors += other.errors
        self.samples += other.samples[: 3 - len(self.samples)]
        self.elapsed += other.elapsed
        self.cpu += other.cpu
        self.server_cpu += other.server_cpu

    @property
    def rate(self) -> float:
        return len(self.appends) / self.elapsed if self.elapsed else 0.0


class Agent:
    """One session's three operations; a side makes one per session. ``step`` names the
    call under way and ``since`` when it began (what a session that did not stop was
    doing)."""

    step = "nothing"
    since = 0.0

    def at(self, step: str) -> None:
        self.step, self.since = step, time.perf_counter()

    async def append(self, role: str, text: str) -> int:
        raise NotImplementedError

    async def read(self, seq: int) -> None:
        raise NotImplementedError

    async def approval_run(self) -> None:
        raise NotImplementedError


def _text(role: str, n: int) -> str:
    return f"{role} turn {n}: " + "lorem ipsum dolor sit amet " * 14


async def _timed(into: list[float], work: Awaitable[Any]) -> Any:
    started = time.perf_counter()
    result = await work
    into.append(time.perf_counter() - started)
    return result


async def _session(agent: Agent, number: int, deadline: float, runs: bool, tally: Tally) -> None:
    """Chat turns until the deadline; an error is counted and the next turn goes on."""
    turn = number % RUN_EVERY  # sessions start at different points of the run cycle
    while time.perf_counter() < deadline:
        turn += 1
        try:
            agent.at("append user")
            seq = await _timed(tally.appends, agent.append("user", _text("user", turn)))
            agent.at("read")
            await _timed(tally.reads, agent.read(seq))
            agent.at("append assistant")
            await _timed(tally.appends, agent.append("assistant", _text("assistant", turn)))
            if runs and turn % RUN_EVERY == 0:
                agent.at("run")
                await _timed(tally.runs, agent.approval_run())
        except Exception as exc:
            tally.error(exc)


def _call_kind(step: str) -> str:
    """A step without its run id and poll number (``GET /runs/{id} #n (was running)``)."""
    return re.sub(r"/runs/[^/ ]+", "/runs/{id}", re.sub(r"#\d+", "#n", step))


async def _drive(agents: list[Agent], seconds: float, runs: bool) -> Tally:
    tally = Tally()
    started, cpu = time.perf_counter(), time.process_time()
    deadline = started + seconds
    tasks = [
        asyncio.create_task(_session(agent, n, deadline, runs, tally))
        for n, agent in enumerate(agents)
    ]
    _, late = await asyncio.wait(tasks, timeout=seconds + TIMEOUT + 10)
    now, stuck = time.perf_counter(), Counter[str]()
    for task, agent in zip(tasks, agents, strict=True):
        if task in late:  # bounded: a session still busy long after the deadline is an error
            task.cancel()
            tally.error(
                TimeoutError(
                    f"a session did not stop: in {agent.step} for {now - agent.since:.1f} s"
                )
            )
            stuck[_call_kind(agent.step)] += 1
    if stuck:
        tally.samples.insert(0, f"sessions that did not stop, by call: {dict(stuck)}")
    tally.elapsed = time.perf_counter() - started
    tally.cpu = time.process_time() - cpu
    return tally


Side = Callable[[float], Awaitable[Tally]]


async def abba(sides: dict[str, Side], seconds: float) -> dict[str, Tally]:
    """Each side twice for half the time, in the order A B B A."""
    names = list(sides)
    tallies = {name: Tally() for name in names}
    for name in names + names[::-1]:
        tallies[name].merge(await sides[name](seconds / 2))
    return tallies


# --- the HTTP side -------------------------------------------------------------------


def _cli(store_url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "statekeeper.cli", "--store", store_url, *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def create_key(store_url: str) -> str:
    """``statekeeper keys create``: the key it prints once."""
    command = _cli(store_url, "keys", "create", "--tenant", TENANT_HTTP, "--scope", "operate")
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, check=True)
    found = re.search(r"sk_[A-Za-z0-9_\-]+", done.stdout)
    if not found:
        raise RuntimeError(f"no key in the output of keys create: {done.stdout!r}")
    return found.group(0)


class Server:
    """``statekeeper serve --app demo_app`` in a subprocess, its output in a log file."""

    def __init__(self, store_url: str, log: Path) -> None:
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        command = _cli(store_url, "serve", "--app", APP, "--host", "127.0.0.1")
        command += ["--port", str(port), "--poll-interval", "0.05"]
        with log.open("wb") as out:
            self.process = subprocess.Popen(
                command, env=_env(), stdout=out, stderr=subprocess.STDOUT
            )

    async def ready(self, key: str) -> None:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {key}"}) as client:
            for _ in range(600):
                if self.process.poll() is not None:
                    tail = self.log.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"the server exited with {self.process.returncode}:\n{tail}")
                try:
                    if (await client.get(f"{self.url}/api/v1/whoami")).status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                await asyncio.sleep(0.05)  # waiting for the server, not timing anything
        raise RuntimeError("the server did not answer within 30 s")

    def cpu(self) -> float:
        """CPU seconds the server has used (Linux ``/proc``; 0 elsewhere)."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _ok(answer: httpx.Response, status: int = 200) -> Any:
    if answer.status_code != status:
        raise RuntimeError(
            f"{answer.request.method} {answer.request.url.path}: "
            f"{answer.status_code} {answer.text[:200]}"
        )
    return answer.json()


class HttpAgent(Agent):
    def __init__(self, client: httpx.AsyncClient, session_id: str) -> None:
        self.client = client
        self.path = f"/sessions/{session_id}"

    async def append(self, role: str, text: str) -> int:
        body = {"messages": [{"role": role, "content": text}]}
        answer = await self.client.post(f"{self.path}/messages", json=body)
        return int(_ok(answer, 201)["entries"][-1]["seq"])

    async def read(self, seq: int) -> None:
        params = {"after_seq": max(0, seq - PAGE), "limit": PAGE}
        items = _ok(await self.client.get(f"{self.path}/entries", params=params))["items"]
        if len(items) != min(seq, PAGE):
            raise RuntimeError(f"read {len(items)} entries, expected {min(seq, PAGE)}")

    async def approval_run(self) -> None:
        self.at("POST /runs")
        run = _ok(
            await self.client.post("/runs", json={"agent": "support", "input": "refund?"}), 202
        )
        path = f"/runs/{run['run_id']}"
        for poll in range(int(TIMEOUT / POLL)):
            if run["status"] == "waiting_for_approval":
                break
            self.at(f"GET {path} #{poll + 1} (was {run['status']})")
            await asyncio.sleep(POLL)  # the run goes on in the server's background
            run = _ok(await self.client.get(path))
        else:
            raise RuntimeError(f"run {path} never waited for approval: {run['status']}")
        self.at(f"POST {path}/approve")
        _ok(await self.client.post(f"{path}/approve", json={"call_id": "c-refund"}))
        self.at(f"POST {path}/resume wait")
        done = _ok(await self.client.post(f"{path}/resume", json={"wait": True}))
        if done["status"] != "completed":
            raise RuntimeError(f"run {path} ended {done['status']}")


def _log_dir(tmp: Path) -> Path:
    """Where the servers' logs go: ``STATEKEEPER_BENCH_LOAD_LOGS`` (to keep them) or ``tmp``."""
    logs = Path(os.environ.get("STATEKEEPER_BENCH_LOAD_LOGS") or tmp)
    logs.mkdir(parents=True, exist_ok=True)
    return logs


async def http_side(store_url: str, servers: int, sessions: int, tmp: Path) -> Side:
    """Start the servers and create the sessions; the side drives them (``close`` stops)."""
    key = create_key(store_url)
    logs = _log_dir(tmp)
    scheme = store_url.partition(":")[0]
    procs = [Server(store_url, logs / f"server-{scheme}-{n}.log") for n in range(servers)]
    try:
        await asyncio.gather(*(p.ready(key) for p in procs))
    except BaseException:
        for p in procs:
            p.stop()
        raise
    # One client (one keep-alive connection) per session, as separate agents have; idle
    # connections are dropped before uvicorn's 5 s keep-alive timeout closes them (with
    # the same 5 s on both ends, a request can go out on a connection being closed).
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1, keepalive_expiry=2.0)
    clients = [
        httpx.AsyncClient(
            base_url=f"{procs[n % servers].url}/api/v1",
            headers={"Authorization": f"Bearer {key}"},
            timeout=TIMEOUT,
            limits=limits,
        )
        for n in range(sessions)
    ]
    agents: list[Agent] = []
    for n, client in enumerate(clients):
        session_id = f"http-{n}"
        _ok(await client.post("/sessions", json={"session_id": session_id}), 201)
        agents.append(HttpAgent(client, session_id))

    async def side(seconds: float) -> Tally:
        before = sum(p.cpu() for p in procs)
        tally = await _drive(agents, seconds, runs=True)
        tally.server_cpu = sum(p.cpu() for p in procs) - before
        return tally

    async def close() -> None:
        for c in clients:
            await c.aclose()
        for p in procs:
            p.stop()

    side.close = close  # type: ignore[attr-defined]
    return side


# --- the library side ----------------------------------------------------------------


class LibAgent(Agent):
    def __init__(self, session: Any, runner: Any) -> None:
        self.session = session
        self.runner = runner

    async def append(self, role: str, text: str) -> int:
        message = Message.user(text) if role == "user" else Message.assistant(text)
        outcome = await self.session.append(message, strict=False)
        return int(outcome.entries[-1].seq)

    async def read(self, seq: int) -> None:
        page = await self.session.entries(after_seq=max(0, seq - PAGE), limit=PAGE)
        if len(page) != min(seq, PAGE):
            raise RuntimeError(f"read {len(page)} entries, expected {min(seq, PAGE)}")

    async def approval_run(self) -> None:
        self.at("runner.start")
        started = await self.runner.start("support", "refund?")
        if started.status != "waiting_for_approval":
            raise RuntimeError(f"run {started.run_id} is {started.status}")
        self.at(f"runner.approve {started.run_id}")
        await self.runner.approve(started.run_id, "c-refund")
        self.at(f"runner.resume {started.run_id}")
        done = await self.runner.resume(started.run_id)
        if done.status != "completed":
            raise RuntimeError(f"run {started.run_id} ended {done.status}")


async def lib_side(store: Any, sessions: int, prefix: str, runs: bool = True) -> Side:
    manager = SessionManager(store, TENANT_LIB, max_messages=None, auto_continue=False)
    runner = make_runner(store, TENANT_LIB)
    agents: list[Agent] = [
        LibAgent(await manager.create(session_id=f"{prefix}-{n}"), runner) for n in range(sessions)
    ]

    async def side(seconds: float) -> Tally:
        return await _drive(agents, seconds, runs=runs)

    return side


# --- raw psycopg ---------------------------------------------------------------------


class RawAgent(Agent):
    def __init__(self, pool: Any, table: str, session_id: str) -> None:
        self.pool = pool
        self.table = table
        self.session_id = session_id
        self.seq = 0

    async def append(self, role: str, text: str) -> int:
        from psycopg.types.json import Jsonb

        self.seq += 1
        async with self.pool.connection() as conn:
            await conn.execute(
                f"INSERT INTO {self.table} (session_id, seq, payload) VALUES (%s, %s, %s)",
                (self.session_id, self.seq, Jsonb({"role": role, "content": text})),
            )
        return self.seq

    async def read(self, seq: int) -> None:
        async with self.pool.connection() as conn:
            cursor = await conn.execute(
                f"SELECT seq, payload FROM {self.table} WHERE session_id = %s"
                " ORDER BY seq DESC LIMIT %s",
                (self.session_id, PAGE),
            )
            rows = await cursor.fetchall()
        if len(rows) != min(seq, PAGE):
            raise RuntimeError(f"read {len(rows)} rows, expected {min(seq, PAGE)}")


async def raw_side(pool: Any, schema: str, sessions: int) -> Side:
    table = f'"{schema}".chat'
    async with pool.connection() as conn:
        await conn.execute(
            f"CREATE TABLE {table} (session_id text NOT NULL, seq integer NOT NULL,"
            " payload jsonb NOT NULL, PRIMARY KEY (session_id, seq))"
        )
    agents: list[Agent] = [RawAgent(pool, table, f"raw-{n}") for n in range(sessions)]

    async def side(seconds: float) -> Tally:
        return await _drive(agents, seconds, runs=False)

    return side
