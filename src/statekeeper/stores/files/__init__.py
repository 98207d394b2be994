"""The plain-files store (``files:///dir``): JSON and JSONL files a person can read.

Layout under the root (every name below the root is a validated id or a fixed name)::

    <root>/.statekeeper                          {"format": "statekeeper-files", "version": 1}
    <root>/<tenant>/sessions/<id>.json           the session head (+ <id>.json.bak)
    <root>/<tenant>/sessions/<id>.jsonl          the transcript, one entry per line
    <root>/<tenant>/records/<namespace>/<key>.json   a versioned record (+ .bak)
    <root>/<tenant>/events/<log>.jsonl           an event log, one event per line
    <root>/<tenant>/locks/{sessions,records,events}/<name>   flock files
    <root>/<tenant>/sessions/<id>.lost, records/<namespace>/<key>.lost   lost to damage
    <root>/<tenant>/quarantine/                  damaged files, moved aside, never deleted
    <root>/<tenant>/recoveries.jsonl             what was recovered, when and how

A head file holds the `SessionRecord` and where its transcript ends::

    {"log": {"gen": "9f2c0a41b7d3", "bytes": 1234},
     "session": {"id": "s1", "tenant": "alice", ..., "version": 7}}

**Writes.** JSON files are rewritten atomically (temp file, fsync, the old version kept as
``.bak`` by a hard link, ``os.replace``, fsync of the folder). An append writes the new
entry lines after the committed end of the transcript in one ``pwrite`` (fsynced with
durability ``power``, the default; not with ``process``), then replaces the head, whose
``bytes`` is the commit point (see ``logs``). So an append costs the same at any
history length, and a crash at any moment leaves every batch whole or absent.

**Concurrency.** Within a process one worker thread does all the file I/O; across
processes, every session operation (reads too) and every record or event write holds an
``flock`` on a per-session (per record namespace, per event log) lock file, so writers
never interleave or lose updates and different sessions never wait for each other.
Record and event reads take no lock: files are replaced whole, and only finished event
batches count.

**Paths.** Every path comes from `Layout.directory` (``layout``): validated ids only,
each folder checked on the way down; a symbolic link (or a FIFO, a folder where a file
belongs) inside the root is refused with `UnsafePathError`, never followed.

**Damage and recovery.** Nothing is dropped silently: every case below is a `Recovery`,
kept on `FileStore.recoveries`, logged (``statekeeper.stores.files``) and appended to
``<tenant>/recoveries.jsonl``; damaged files are moved to ``quarantine/``, not deleted.

- bytes after the committed end (a crash mid-append, never acknowledged) are ignored, and
  cut off by the next append; a line that cannot be decoded inside the committed part is
  served as a ``corrupt`` entry in its place, with the valid entries around it;
- an unreadable head falls back to ``<id>.json.bak`` (the version just before), and the
  whole entries written after that backup are kept; the version jumps by 2 so a writer
  holding the lost version gets a `ConflictError`, never a blind overwrite;
- if the backup is unreadable too, the transcript's whole lines are copied into a new
  session ``recovered-<id>`` whose metadata names the lost session (``recovered_from``)
  and what happened (``recovery``);
- an unreadable record falls back to its backup; without one it is quarantined;
- a session or record lost that way leaves a ``<id>.lost`` marker (``lost``), so it
  stays reported as the other backends report a damaged row, on every handle: listings
  have it in ``corrupt`` and reads raise `StoreCorruptError` naming it, its quarantined
  files (and the recovery session), until it is deleted or written again (a new session
  with the id, a put, which starts the key again at version 1);
- a prune that replaced the transcript but died before its head write is completed.

POSIX only (``fcntl.flock``, ``O_NOFOLLOW``), on a case-sensitive file system: the store
refuses a root where "Alice" and "alice" would be the same folder.
"""

from statekeeper.stores.files.layout import Recovery, UnsafePathError
from statekeeper.stores.files.store import FileStore, open_files

__all__ = ["FileStore", "Recovery", "UnsafePathError", "open_files"]
