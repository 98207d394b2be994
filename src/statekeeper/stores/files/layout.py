"""The file layer of the ``files://`` store: safe paths, atomic rewrites, locks, reports.

Everything the store writes goes through `Layout`, so the rules live in one place:

- **Paths.** `Layout.directory` is the only way to get a directory: every part is a
  validated id or a fixed name, and each component is checked with ``lstat`` on the way
  down from the root (which is resolved once, when the store opens). A component that is
  a symbolic link, or not a directory, is refused with `UnsafePathError`; files are
  opened with ``O_NOFOLLOW``. So nothing is ever read or written outside the root, even
  when someone plants a symlink inside it.
- **Rewrites** (`Layout.write_atomic`): a temp file in the same directory, written and
  fsynced, the current version hard-linked to ``<name>.bak``, then ``os.replace`` and an
  fsync of the directory. A reader sees the old or the new file, never a mix; after a
  crash the previous version is still there as the backup.
- **Appends** write whole lines with one ``pwrite`` and then fsync (durability
  ``power``) or not (``process``); see ``logs`` for how lines are committed.
- **Locks** (`Layout.locked`): ``fcntl.flock`` on a small file under ``<tenant>/locks``,
  one per session, record namespace or event log, so processes never interleave a
  read-modify-write and sessions never queue behind one another.
- **Quarantine and reports**: damaged files are moved to ``<tenant>/quarantine`` (never
  deleted), and every recovery is a `Recovery`, kept on the store, logged, and appended
  to ``<tenant>/recoveries.jsonl`` for a person to read.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime

from statekeeper.core.messages import utcnow
from statekeeper.errors import (
    StoreCorruptError,
    StoreError,
    StoreFullError,
    StoreReadOnlyError,
    StoreUnavailableError,
)
from statekeeper.ids import validate_id
from statekeeper.jsoncodec import encode_json
from statekeeper.stores.base import Durability

__all__ = [
    "FIXED_NAMES",
    "FORMAT_VERSION",
    "Layout",
    "Lock",
    "Recovery",
    "UnsafePathError",
    "child",
    "translate_os_error",
]

log = logging.getLogger("statekeeper.stores.files")

FORMAT_VERSION = 1
"""Version of the on-disk layout, in ``<root>/.statekeeper``."""

FIXED_NAMES = frozenset(
    {"sessions", "records", "events", "locks", "quarantine", "recoveries.jsonl"}
)
"""Names the store itself uses inside a tenant directory (ids never clash with them:
they live one level below the tenant, where only these names are created)."""

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # never wait on a FIFO planted in the root


class UnsafePathError(StoreError):
    """A path inside the store's root is a symbolic link or not what the store wrote.

    The store refuses to follow it, so nothing is read or written outside the root.
    """


@dataclass(frozen=True, slots=True)
class Recovery:
    """Something the store found damaged and what it did about it.

    ``kind`` is one of:

    - ``"head-from-backup"``: a session head could not be read; it was restored from
      ``<id>.json.bak`` (plus any whole entries written after that backup);
    - ``"recovery-session"``: head and backup were both unreadable; the transcript's
      whole lines were copied into a new session ``recovered_as`` that names the lost one
      in its metadata, and the damaged files were quarantined;
    - ``"record-from-backup"`` / ``"record-lost"``: a record file was unreadable and was
      restored from its backup, or (no usable backup) quarantined; a lost record, like a
      lost session, leaves a ``.lost`` marker that keeps it reported (``lost``);
    - ``"uncommitted-tail"``: bytes after the last committed line of a transcript or event
      log (a crash during an append that was never acknowledged) were cut off;
    - ``"log-truncated"``: a transcript is shorter than its head says (bytes were lost
      outside statekeeper); what remains is served, a cut line as a ``corrupt`` entry;
    - ``"log-missing"``: a transcript file the head refers to is gone;
    - ``"prune-completed"``: a prune was interrupted after replacing the transcript;
      the head was brought up to date;
    - ``"corrupt-header"``: the first line of a JSONL file is damaged (the lines after it
      are still served).
    """

    kind: str
    tenant: str
    subject: str
    """What was damaged: ``session <id>``, ``record <ns>/<key>``, ``events <log>``."""
    detail: str
    path: str
    """The damaged file, relative to the store's root."""
    recovered_as: str | None = None
    """The id of the recovery session, for ``"recovery-session"``."""
    quarantined: tuple[str, ...] = ()
    """Where the damaged files were moved, relative to the store's root."""
    at: datetime = field(default_factory=utcnow)

    def to_doc(self) -> dict[str, object]:
        """The report as JSON data (one line of ``recoveries.jsonl``)."""
        return {
            "at": self.at.isoformat(),
            "kind": self.kind,
            "tenant": self.tenant,
            "subject": self.subject,
            "detail": self.detail,
            "path": self.path,
            "recovered_as": self.recovered_as,
            "quarantined": list(self.quarantined),
        }


def translate_os_error(exc: OSError, where: str) -> StoreError:
    """The most specific statekeeper error for an OS error."""
    code = exc.errno
    if code in (errno.ENOSPC, errno.EDQUOT):
        return StoreFullError(f"{where}: no space left ({exc}); free some space and retry")
    if code in (errno.EROFS, errno.EACCES, errno.EPERM):
        return StoreReadOnlyError(f"{where} cannot be written ({exc}); check permissions")
    if code == errno.ELOOP:
        return UnsafePathError(
            f"{where} is a symbolic link; the files store does not follow links inside its root"
        )
    if code in (errno.ENOTDIR, errno.EISDIR):
        return UnsafePathError(f"{where} is not the kind of file the store wrote ({exc})")
    if code == errno.EIO:
        return StoreCorruptError(f"{where}: I/O error ({exc})")
    return StoreError(f"{where}: {exc}")


def child(folder: str, name: str, *, internal: bool = False) -> str:
    """The path of ``name`` directly inside ``folder`` (a folder from `Layout.directory`).

    Every file path the store uses is built here: ``name`` is a validated id plus a
    suffix, so it has no separator, NUL or leading dot; ``internal`` names (temp files,
    the root's marker) may start with a dot.
    """
    if (
        not name
        or (name[0] == "." and not internal)
        or name in (".", "..")
        or "/" in name
        or "\x00" in name
        or len(name) > 250
    ):
        raise UnsafePathError(f"refusing file name {name!r}")
    return f"{folder}/{name}"


def _check_part(part: str) -> str:
    if part in FIXED_NAMES:
        return part
    return validate_id(part, "path part")


class Lock:
    """A held ``flock`` on a lock file; `remove` deletes the file while still holding it."""

    def __init__(self, fd: int, path: str) -> None:
        self.fd = fd
        self.path = path
        self.removed = False

    def remove(self) -> None:
        """Delete the lock file (its object is gone). Waiters notice and lock the new file."""
        if not self.removed:
            self.removed = True
            with suppress(FileNotFoundError):
                os.unlink(self.path)


class Layout:
    """Safe file operations under one root directory."""

    def __init__(self, root: str, durability: Durability, lock_timeout: float) -> None:
        self.root = root
        self.durability = durability
        self.lock_timeout = lock_timeout
        self.sync = durability is Durability.POWER
        self.recoveries: list[Recovery] = []
        self._reported: set[tuple[object, ...]] = set()

    # -- paths ---------------------------------------------------------------------------

    def directory(self, *parts: str, create: bool = False) -> str | None:
        """The directory ``root/parts...`` (None if missing and not ``create``).

        Every part must be a valid id or a fixed name, and every component on the way
        must be a real directory: a symbolic link anywhere is refused (`UnsafePathError`).
        """
        path = self.root
        for part in parts:
            _check_part(part)
            parent, path = path, child(path, part)
            try:
                info = os.lstat(path)
            except FileNotFoundError:
                if not create:
                    return None
                try:
                    os.mkdir(path, 0o755)
                except FileExistsError:
                    pass
                else:
                    if self.sync:
                        self.fsync_dir(parent)
                info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                raise UnsafePathError(
                    f"{self.relative(path)} is a symbolic link inside the store's root "
                    f"({self.root}); refusing to follow it. Replace it with a directory."
                )
            if not stat.S_ISDIR(info.st_mode):
                raise UnsafePathError(
                    f"{self.relative(path)} is not a directory; the files store did not "
                    "write it. Move it out of the store's root."
                )
        # Defence in depth: the lexical path must still be under the root.
        if os.path.commonpath([self.root, os.path.normpath(path)]) != self.root:
            raise UnsafePathError(f"{path} is outside the store's root {self.root}")
        return path

    def file(self, directory: str, name: str) -> str:
        """A file directly inside ``directory`` (a checked directory from `directory`)."""
        return child(directory, name)

    def relative(self, path: str) -> str:
        """``path`` relative to the root, for messages and reports."""
        prefix = self.root + "/"
        return path[len(prefix) :] if path.startswith(prefix) else path

    # -- reading and writing ---------------------------------------------------------------

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        """``os.open`` of a regular file that never follows a symbolic link at ``path``.

        Anything else planted there (a link, a folder, a FIFO that would block) is
        refused with `UnsafePathError`.
        """
        try:
            fd = os.open(path, flags | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK, mode)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePathError(
                    f"{self.relative(path)} is a symbolic link inside the store's root; "
                    "refusing to follow it"
                ) from exc
            if exc.errno in (errno.EISDIR, errno.ENXIO):
                raise UnsafePathError(
                    f"{self.relative(path)} is not a regular file; the files store did not "
                    "write it. Move it out of the store's root."
                ) from exc
            raise
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise UnsafePathError(
                f"{self.relative(path)} is not a regular file; the files store did not write "
                "it. Move it out of the store's root."
            )
        return fd

    def read_bytes(self, path: str) -> bytes | None:
        """The whole file, or None if it does not exist."""
        try:
            fd = self.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            chunks = []
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists (a symlink counts, so it is refused when opened)."""
        try:
            os.lstat(path)
        except FileNotFoundError:
            return False
        return True

    def write_atomic(self, path: str, data: bytes, *, backup: bool = True) -> None:
        """Replace ``path`` with ``data``: temp file, fsync, backup link, rename, dir fsync.

        With ``backup`` the current file (if any) is kept as ``<name>.bak``.
        """
        folder, name = os.path.split(path)
        temp = child(folder, f".{name}.{os.urandom(4).hex()}.tmp", internal=True)
        fd = self.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            try:
                write_all(fd, data, 0)
                if self.sync:
                    os.fdatasync(fd)
            finally:
                os.close(fd)
            if backup:
                self.link_backup(path)
            os.replace(temp, path)
        except BaseException:
            with suppress(OSError):
                os.unlink(temp)
            raise
        if self.sync:
            self.fsync_dir(folder)

    def link_backup(self, path: str) -> None:
        """Make ``<name>.bak`` another name of the current ``path`` (if it exists)."""
        backup = path + ".bak"
        with suppress(FileNotFoundError):
            os.unlink(backup)
        with suppress(FileNotFoundError):
            os.link(path, backup, follow_symlinks=False)

    def fsync_dir(self, path: str) -> None:
        """Make a directory's entries (new, renamed or removed files) durable."""
        fd = os.open(path, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def unlink(self, path: str) -> bool:
        """Remove a file; False if it was not there."""
        try:
            os.unlink(path)
        except FileNotFoundError:
            return False
        return True

    # -- locks -----------------------------------------------------------------------------

    @contextmanager
    def locked(self, tenant: str, kind: str, name: str) -> Iterator[Lock]:
        """Hold the exclusive lock ``<tenant>/locks/<kind>/<name>`` (across processes).

        Waits up to ``lock_timeout`` seconds, then raises `StoreUnavailableError`. The
        lock file may be removed by its holder (`Lock.remove`): a waiter that then gets
        the lock on the removed file sees that and locks the current file instead.
        """
        folder = self.directory(tenant, "locks", kind, create=True)
        assert folder is not None
        path = self.file(folder, name)
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.0002
        while True:
            fd = self.open(path, os.O_RDWR | os.O_CREAT)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        if time.monotonic() >= deadline:
                            raise StoreUnavailableError(
                                f"{self.relative(path)} has been locked by another writer "
                                f"for more than {self.lock_timeout:g}s; retry, or raise "
                                "lock_timeout"
                            ) from None
                        time.sleep(delay)
                        delay = min(delay * 2, 0.005)
                held = os.fstat(fd)
                try:
                    current = os.lstat(path)
                    same = (held.st_dev, held.st_ino) == (current.st_dev, current.st_ino)
                except FileNotFoundError:
                    same = False
            except BaseException:
                os.close(fd)
                raise
            if same:
                break
            os.close(fd)  # the holder removed this lock file: lock the new one
        lock = Lock(fd, path)
        try:
            yield lock
        finally:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    # -- quarantine and reports ---------------------------------------------------------

    def quarantine(self, tenant: str, path: str) -> str | None:
        """Move a damaged file to ``<tenant>/quarantine``; its new relative path."""
        if not self.exists(path):
            return None
        folder = self.directory(tenant, "quarantine", create=True)
        assert folder is not None
        stamp = utcnow().strftime("%Y%m%dT%H%M%S%fZ")
        target = child(folder, f"{stamp}-{os.urandom(2).hex()}-{os.path.basename(path)}")
        os.replace(path, target)
        if self.sync:
            self.fsync_dir(folder)
            self.fsync_dir(os.path.dirname(path))
        return self.relative(target)

    def report_once(self, token: tuple[object, ...], recovery: Recovery) -> None:
        """`report`, unless a report with the same ``token`` was made by this handle."""
        if token not in self._reported:
            self._reported.add(token)
            self.report(recovery)

    def report(self, recovery: Recovery) -> Recovery:
        """Record a recovery: on the store, in the log, and in ``recoveries.jsonl``."""
        self.recoveries.append(recovery)
        log.warning(
            "files store %s: %s %s (%s): %s%s",
            self.root,
            recovery.kind,
            recovery.subject,
            recovery.path,
            recovery.detail,
            f"; recovered as {recovery.recovered_as}" if recovery.recovered_as else "",
        )
        try:
            folder = self.directory(recovery.tenant, create=True)
            assert folder is not None
            line = (encode_json(recovery.to_doc()) + "\n").encode()
            fd = self.open(
                self.file(folder, "recoveries.jsonl"), os.O_WRONLY | os.O_CREAT | os.O_APPEND
            )
            try:
                os.write(fd, line)
                if self.sync:
                    os.fdatasync(fd)
            finally:
                os.close(fd)
        except (OSError, StoreError) as exc:  # the report must never fail the operation
            log.error("could not append to recoveries.jsonl: %s", exc)
        return recovery


def write_all(fd: int, data: bytes, offset: int) -> None:
    """``pwrite`` all of ``data`` at ``offset`` (one call unless the OS writes less)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def read_at(fd: int, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` (fewer only at the end of the file)."""
    chunks = []
    while size > 0:
        chunk = os.pread(fd, size, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
        size -= len(chunk)
    return b"".join(chunks)
