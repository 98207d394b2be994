"""The SQLite store's connection: opening, migrations, transactions, checkpoints, errors.

One connection per store. Short transactions run inline on the event loop when the
connection is free (busy timeout 0, so they never wait); anything else runs on the
store's worker thread, which waits for locks with backoff until ``busy_timeout``. WAL
journal; every write is one ``BEGIN IMMEDIATE`` transaction, so concurrent writers
(threads or processes) queue instead of failing with "database is locked".

Durability: ``power`` (default) fsyncs the WAL on every commit (``synchronous=FULL``) and
survives a power loss; ``process`` (``synchronous=NORMAL``) survives a process crash only.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Self, TypeVar

from statekeeper.errors import (
    InvalidInputError,
    SchemaVersionError,
    StoreCorruptError,
    StoreError,
    StoreFullError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from statekeeper.jsoncodec import DEFAULT_MAX_PAYLOAD_BYTES
from statekeeper.stores.base import ClosingStore, Durability
from statekeeper.stores.sqlite.group import GroupCommit, Queued
from statekeeper.stores.sqlite.schema import MIGRATIONS, SCHEMA_VERSION
from statekeeper.stores.worker import Worker

__all__ = ["SQLiteConnection"]

T = TypeVar("T")
_BUSY = {5, 6}  # SQLITE_BUSY, SQLITE_LOCKED
_CHECKPOINT_PAGES = 1000  # WAL growth between checkpoints, in pages (SQLite's default)
_PAGE_SIZES = (1024, 2048, 4096, 8192, 16384, 32768, 65536)
_PAGES_PER_COMMIT = 4  # a commit also rewrites a few index and head pages
# How long an inline transaction waits for another thread's to end before it goes to the
# worker instead (an inline transaction takes well under a millisecond; the hop costs more).
_INLINE_WAIT = 0.002


class SQLiteConnection(ClosingStore):
    """The connection and transactions of a SQLite store (the base of `SQLiteStore`)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = Durability.POWER,
        busy_timeout: float = 30.0,
        read_only: bool = False,
        inline_writes: bool = True,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        page_size: int = 8192,
    ) -> None:
        if page_size not in _PAGE_SIZES:
            raise InvalidInputError(
                f"page_size={page_size} is not one of: {', '.join(map(str, _PAGE_SIZES))}"
            )
        self.page_size = page_size
        self.path = Path(path)
        self.url = f"sqlite:///{self.path}"
        self.durability = Durability(durability)
        self.busy_timeout = busy_timeout
        self.read_only = read_only
        self.max_payload_bytes = max_payload_bytes
        self.inline_writes = inline_writes
        self._worker = Worker("statekeeper-sqlite")
        self._lock = threading.Lock()  # one user of the connection at a time
        self._wal_bytes = 0
        self._checkpoint: concurrent.futures.Future[None] | None = None
        self._conn: sqlite3.Connection | None = None
        self._checkpointer: sqlite3.Connection | None = None  # used on the worker only
        # One for every thread and loop: a batch takes all their writes (one fsync).
        self._group = GroupCommit(
            self._worker, self._commit_batch, enabled=self.durability is Durability.POWER
        )

    @classmethod
    async def open(cls, path: str | os.PathLike[str], **options: Any) -> Self:
        """Open (creating if needed) the database at ``path`` and migrate its schema."""
        store = cls(path, **options)
        try:
            await store._worker.run(store._connect)
        except BaseException:
            store._worker.shutdown()
            raise
        return store

    def __del__(self) -> None:
        if getattr(self, "_conn", None) is not None:  # (None too if __init__ refused)
            warnings.warn(
                f"SQLiteStore({self.path}) was not closed; call await store.close()",
                ResourceWarning,
                stacklevel=1,
            )

    async def close(self) -> None:
        """Close the connection and stop the worker thread. Idempotent."""
        if self._conn is None:
            return
        if self._checkpoint is not None:
            await asyncio.wrap_future(self._checkpoint)
        conn, self._conn = self._conn, None

        def close() -> None:
            with self._lock:  # after a transaction another thread runs inline
                conn.close()

        self._worker.run_blocking(close)
        if self._checkpointer is not None:
            self._worker.run_blocking(self._checkpointer.close)
            self._checkpointer = None
        self._worker.shutdown()

    # -- plumbing ------------------------------------------------------------------------

    def _connect(self) -> None:
        if self.read_only:
            if not self.path.exists():
                raise StoreUnavailableError(f"no database at {self.path} to open read-only")
            target, uri = f"file:{self.path}?mode=ro", True
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            target, uri = str(self.path), False
        try:
            conn = sqlite3.connect(
                target,
                isolation_level=None,
                check_same_thread=False,
                timeout=0,
                uri=uri,
            )
        except sqlite3.Error as exc:
            raise _translate(exc, f"cannot open {self.path}") from exc
        try:
            self._retry(lambda: self._setup(conn))
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _setup(self, conn: sqlite3.Connection) -> None:
        sync = "FULL" if self.durability is Durability.POWER else "NORMAL"
        if not self.read_only and conn.execute("PRAGMA page_count").fetchone()[0] == 0:
            conn.execute(f"PRAGMA page_size={self.page_size}")  # only a new file takes it
        # An existing file keeps the page size it was made with.
        self.page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute(f"PRAGMA synchronous={sync}")
        if not self.read_only:
            conn.execute("PRAGMA journal_mode=WAL").fetchall()
            conn.execute("PRAGMA wal_autocheckpoint=0")  # see _note_write
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.path} has schema version {version}, but this statekeeper knows "
                f"versions up to {SCHEMA_VERSION}; upgrade statekeeper to open it"
            )
        if version == SCHEMA_VERSION:
            return
        if self.read_only:
            raise StoreUnavailableError(
                f"{self.path} is at schema version {version} and needs migrating to "
                f"{SCHEMA_VERSION}; open it once without read_only"
            )
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = conn.execute("PRAGMA user_version").fetchone()[0]  # another process?
            for number in range(version, SCHEMA_VERSION):
                for statement in MIGRATIONS[number].split(";"):
                    if statement.strip():
                        conn.execute(statement)
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreUnavailableError("the store is closed; open a new one")
        return self._conn

    def _retry(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the worker, retrying while another connection holds the lock."""
        deadline = time.monotonic() + self.busy_timeout
        delay = 0.0005
        while True:
            try:
                with self._lock:
                    return fn()
            except sqlite3.Error as exc:
                if _is_busy(exc) and time.monotonic() < deadline:
                    time.sleep(delay)
                    delay = min(delay * 2, 0.05)
                    continue
                raise _translate(exc, str(self.path)) from exc

    async def _run(self, call: Callable[[], T], *, inline: bool) -> T:
        """Run a transaction: inline when it cannot wait, else on the worker thread.

        The connection never waits for a lock (busy timeout 0). A short transaction is
        tried right here on the event loop, which costs less than the hop to a thread
        (about 0.1 ms); if another connection holds the lock, or the worker is busy, it
        goes to the worker, which waits and retries without blocking the loop.
        """
        if inline and self.inline_writes and self._lock.acquire(timeout=_INLINE_WAIT):
            try:
                result = call()
            except sqlite3.Error as exc:
                if not _is_busy(exc):
                    raise _translate(exc, str(self.path)) from exc
            else:
                return result
            finally:
                self._lock.release()
        return await self._worker.run(lambda: self._retry(call))

    def _note_write(self, size: int, *, commits: int = 1) -> None:
        # Checkpoints copy the WAL into the database file (and fsync it): slow work that
        # belongs on the worker, not inside an inline commit. SQLite's own automatic
        # checkpoint would run inside whichever commit crosses the threshold, so it is
        # off, and this one starts in the background after about as much WAL growth.
        self._wal_bytes += size + commits * _PAGES_PER_COMMIT * self.page_size
        if self._wal_bytes >= _CHECKPOINT_PAGES * self.page_size and self._checkpoint is None:
            self._wal_bytes = 0
            # Submitted to the worker at once: a loop that never yields (appends that all
            # complete inline) would never start a task.
            self._checkpoint = self._worker.submit(self._checkpoint_now)

    async def checkpoint(self, *, truncate: bool = False) -> None:
        """Copy the WAL into the database file now (and empty the WAL if ``truncate``).

        Normally not needed: checkpoints run in the background as the WAL grows.
        """
        if self._checkpoint is not None:
            await asyncio.wrap_future(self._checkpoint)
        mode = "TRUNCATE" if truncate else "PASSIVE"
        await self._worker.run(
            lambda: self._retry(
                lambda: self._db.execute(f"PRAGMA wal_checkpoint({mode})").fetchall()
            )
        )
        self._wal_bytes = 0

    def _checkpoint_now(self) -> None:
        # On a connection of its own, without the store's lock: a PASSIVE checkpoint never
        # blocks writers, so inline commits go on meanwhile instead of queueing on the
        # worker behind it (sqlite3 releases the GIL while SQLite works).
        try:
            if self._checkpointer is None:
                self._checkpointer = sqlite3.connect(
                    self.path, isolation_level=None, check_same_thread=False, timeout=0
                )
            # fetchall: an unfinished PRAGMA statement would hold a read transaction open.
            self._checkpointer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:
            pass  # a later checkpoint will catch up; the WAL stays valid meanwhile
        finally:
            self._checkpoint = None

    async def _read(
        self,
        fn: Callable[[sqlite3.Connection], T],
        *,
        inline: bool = False,
        snapshot: bool = True,
    ) -> T:
        """Run ``fn`` in a read transaction: one snapshot for all its statements. Without
        ``snapshot``, each statement reads on its own (autocommit), which spares two
        statements for reads whose every statement stands alone (one row's lookup)."""

        def call() -> T:
            db = self._db
            if not snapshot:
                return fn(db)
            db.execute("BEGIN")
            try:
                return fn(db)
            finally:
                db.execute("COMMIT")

        return await self._run(call, inline=inline)

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self.read_only:
            raise StoreReadOnlyError(f"{self.path} was opened read-only")
        if self._group.wanted():
            grouped = await self._group.submit(fn)
            self._note_write(0)
            return grouped

        def call() -> T:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                result = fn(db)
                db.execute("COMMIT")
            except BaseException:
                self._write_failed()
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            return result

        result = await self._run(call, inline=True)
        self._group.wrote()
        self._note_write(0)
        return result

    def _commit_batch(self, batch: list[Queued]) -> None:
        """Run queued writes in one transaction (one fsync), each in a savepoint of its own.

        Runs on the worker. A write that raises is rolled back alone and gets its error;
        if the transaction itself fails, every write in it gets that error.
        """

        def run() -> None:
            db = self._db
            db.execute("BEGIN IMMEDIATE")
            try:
                for item in batch:
                    db.execute("SAVEPOINT w")
                    try:
                        item.result = item.fn(db)
                    except Exception as exc:
                        if not db.in_transaction:
                            raise  # SQLite gave up the whole transaction
                        db.execute("ROLLBACK TO w")
                        item.error = (
                            _translate(exc, str(self.path))
                            if isinstance(exc, sqlite3.Error)
                            else exc
                        )
                    db.execute("RELEASE w")
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise

        try:
            self._retry(run)
        except Exception as exc:
            for item in batch:
                item.result, item.error = None, exc
        if any(item.error is not None for item in batch):
            self._write_failed()

    def _write_failed(self) -> None:
        """Called after a write transaction rolled back (caches may be ahead of the disk)."""


def _is_busy(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF in _BUSY


def _translate(exc: sqlite3.Error, where: str) -> StoreError:
    """The most specific statekeeper error for a sqlite3 error."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code in _BUSY:
        return StoreUnavailableError(
            f"{where} is locked by another writer for longer than the busy timeout; "
            "retry, or raise busy_timeout"
        )
    if code == 8:  # SQLITE_READONLY
        return StoreReadOnlyError(f"{where} is read-only: {exc}; check the file's permissions")
    if code == 13:  # SQLITE_FULL
        return StoreFullError(f"{where}: the disk or database is full ({exc}); free space")
    if code in (11, 26):  # SQLITE_CORRUPT, SQLITE_NOTADB
        return StoreCorruptError(f"{where} is not a valid statekeeper database: {exc}")
    if code == 14:  # SQLITE_CANTOPEN
        return StoreUnavailableError(f"cannot open {where}: {exc}")
    if isinstance(exc, sqlite3.ProgrammingError):
        return StoreUnavailableError(f"{where}: {exc}")
    return StoreError(f"{where}: {exc}")
