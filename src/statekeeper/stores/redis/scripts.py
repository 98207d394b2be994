"""The Lua scripts of the Redis store and the entry format they read (key names: `keys`).

Every write is one Lua script, so Redis runs it atomically: nothing else runs between
its first and its last command. Each script reads and checks everything first and only
then writes, so a script that fails (a read-only replica, ``maxmemory`` reached) fails
before its first write and leaves nothing half-done: Redis refuses the first write of a
script when out of memory but never a later one, so a script that started writing ends.

Scripts return only integers, strings and arrays of them (no booleans, whose conversion
depends on the protocol version), so they behave the same over RESP2 and RESP3.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

__all__ = [
    "APPEND_EVENTS",
    "COMMIT",
    "COMMIT_EVENTS",
    "CREATE_SESSION",
    "DELETE_RECORD",
    "DELETE_SESSION",
    "GET_ENTRY",
    "LINKS",
    "LIST_RECORDS",
    "LIST_SESSIONS",
    "LOAD",
    "PRUNE",
    "PUT_RECORD",
    "READ_ENTRIES",
    "REWRITE_ENTRIES",
    "REWRITE_EVENTS",
    "SESSION_INDEX",
    "SETTLE",
    "Script",
]


@dataclass(frozen=True, slots=True)
class Script:
    """A Lua script and its SHA1 (what EVALSHA names it by, computed once)."""

    name: str
    source: str
    writes: bool = True
    """Whether it may write (a store that waits for replicas waits after these)."""
    sha: str = field(init=False)

    def __post_init__(self) -> None:
        sha = hashlib.sha1(self.source.encode(), usedforsecurity=False).hexdigest()
        object.__setattr__(self, "sha", sha)


# A transcript entry is one member of the session's entries sorted set, scored by its seq
# (see base.encode_entry): a JSON header, a newline, the payload's JSON text.

# A head is a hash: its generation ('g'), version ('v'), its document ('doc') and, when
# only the fields every append changes have moved since the document was written,
# those fields ('live': a JSON array, see `heads.LIVE`) instead of a new document.
# Readers get both as one text, "<doc>\n<live>" (compact JSON never holds a newline).
_HEAD_DOC = """
local function head_doc(key)
  local parts = redis.call('HMGET', key, 'doc', 'live')
  if parts[1] and parts[2] then return parts[1] .. '\\n' .. parts[2] end
  return parts[1]
end
"""

_CHECK_HEAD = """
local g = redis.call('HGET', KEYS[1], 'g')
if not g then return {0} end
"""

_STALE = """
if g ~= ARGV[1] or redis.call('HGET', KEYS[1], 'v') ~= ARGV[2] then
  return {2, g, head_doc(KEYS[1])}
end
"""

_SAVE_HEAD = """
redis.call('HSET', KEYS[1], 'doc', ARGV[4], 'v', ARGV[3])
redis.call('HDEL', KEYS[1], 'live')
if KEYS[4] then redis.call('ZADD', KEYS[4], ARGV[5], ARGV[6]) end
"""

CREATE_SESSION = Script(
    "create_session",
    """
-- KEYS: head, entries, entry ids, sessions index (absent on a cluster: see keys.Keys)
-- ARGV: generation, doc, score, session id
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('UNLINK', KEYS[2], KEYS[3])
redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'v', '1', 'g', ARGV[1])
if KEYS[4] then redis.call('ZADD', KEYS[4], ARGV[3], ARGV[4]) end
return 1
""",
)
"""Create a head unless one exists: 1 created, 0 taken."""

DELETE_SESSION = Script(
    "delete_session",
    """
-- KEYS: head, entries, entry ids, sessions index;  ARGV: session id
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('UNLINK', KEYS[1], KEYS[2], KEYS[3])
if KEYS[4] then redis.call('ZREM', KEYS[4], ARGV[1]) end
return 1
""",
)
"""Delete a session and its entries: 1 deleted, 0 absent."""

# The commit script is two parts, each reading its own section of ARGV: the check reads
# the head's and the ids', sets ``at`` to the first argument after them, and returns
# unless the commit may go on; the write then writes. A part that also writes in the same
# atomic step (a step's events, say) goes after the write: its keys after KEYS[4], its
# arguments from ``at`` on.

_COMMIT_CHECK = (
    _HEAD_DOC
    + """
-- KEYS: head, entries, entry ids, sessions index
-- ARGV: generation, base version, new version, new doc, score, session id,
--       c, then c ids that must not be stored yet (besides the entries' own),
--       n, then (seq, id, member) per entry to write
-- Returns 1 written (an integer: the cheapest reply); {0} no such session;
-- {2, generation, doc, id, seq, member, ...}
-- when the head is not (generation, base version) or one of the ids is stored (with
-- those entries): plan again from that state. A generation of '' only reads.
local head = redis.call('HMGET', KEYS[1], 'g', 'v')
local g = head[1]
if not g then return {0} end
local c = tonumber(ARGV[7])
local first = 9 + c
local at = first + 3 * tonumber(ARGV[8 + c])
local out = {2, g, false}
local function check(id)
  local seq = redis.call('HGET', KEYS[3], id)
  if seq then
    local rows = redis.call('ZRANGEBYSCORE', KEYS[2], seq, seq)
    out[#out + 1] = id
    out[#out + 1] = seq
    out[#out + 1] = rows[1] or ''
  end
end
for i = 8, 7 + c do check(ARGV[i]) end
for i = first + 1, at - 1, 3 do check(ARGV[i]) end
if #out > 3 or g ~= ARGV[1] or head[2] ~= ARGV[2] then
  out[3] = head_doc(KEYS[1])
  return out
end
"""
)

_COMMIT_WRITE = """
for i = first, at - 1, 3 do
  redis.call('ZADD', KEYS[2], ARGV[i], ARGV[i + 2])
  redis.call('HSET', KEYS[3], ARGV[i + 1], ARGV[i])
end
if string.byte(ARGV[4]) == 123 then  -- '{': a whole new document
  redis.call('HSET', KEYS[1], 'doc', ARGV[4], 'v', ARGV[3])
  redis.call('HDEL', KEYS[1], 'live')
else  -- '[': only the live fields moved; the stored document stays
  redis.call('HSET', KEYS[1], 'live', ARGV[4], 'v', ARGV[3])
end
if KEYS[4] then redis.call('ZADD', KEYS[4], ARGV[5], ARGV[6]) end
"""

COMMIT = Script("commit", _COMMIT_CHECK + _COMMIT_WRITE + "return 1\n")
"""Compare-and-set a head (generation and version) and append entries with it."""
LOAD = Script("commit", COMMIT.source, writes=False)
"""`COMMIT` called with a generation of '' to read the head and stored ids (no write)."""

_LOG_EVENTS = """
local function log_events(key, notices, log, kept, from, to)
  local last = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)
  local seq = 0
  if last[1] then seq = tonumber(string.match(last[1][1], '^(%d+)')) end
  local first = seq + 1
  for i = from, to, 4 do
    seq = seq + 1
    redis.call('XADD', key, seq .. '-0', 's', ARGV[i], 'k', ARGV[i + 1],
               't', ARGV[i + 2], 'p', ARGV[i + 3])
  end
  redis.call('XADD', notices, 'MAXLEN', '~', kept, '*', 'log', log, 'first', first,
             'last', seq)
  return first
end
"""

COMMIT_EVENTS = Script(
    "commit_events",
    _LOG_EVENTS
    + _COMMIT_CHECK
    + _COMMIT_WRITE
    + """
-- Then the events: KEYS[5] the tenant's notice stream, KEYS[6..] the event stream of each
-- log; from ARGV[at] on, per log: log id, notices kept, k and (stream, kind, ts_us,
-- payload) per event. Returns {1, first seq of each log} when written.
local firsts = {1}
for key = 6, #KEYS do
  local k = tonumber(ARGV[at + 2])
  firsts[#firsts + 1] = log_events(KEYS[key], KEYS[5], ARGV[at], ARGV[at + 1], at + 3,
                                   at + 2 + 4 * k)
  at = at + 3 + 4 * k
end
return firsts
""",
)
"""`COMMIT` that also appends events (`append_entries(events=...)`), in the same script."""

LINKS = Script(
    "links",
    _HEAD_DOC
    + """
-- KEYS: head, entries;  ARGV: -
-- Returns {0} no such session, else {generation, doc, seq, header, seq, header, ...}.
local g = redis.call('HGET', KEYS[1], 'g')
if not g then return {0} end
local out = {g, head_doc(KEYS[1])}
local rows = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
for i = 1, #rows, 2 do
  local m = rows[i]
  local cut = string.find(m, '\\n', 1, true)
  out[#out + 1] = rows[i + 1]
  out[#out + 1] = cut and string.sub(m, 1, cut - 1) or m
end
return out
""",
    writes=False,
)
"""The head and every entry's header (no payloads): what pruning decides on."""

PRUNE = Script(
    "prune",
    f"""
-- KEYS: head, entries, entry ids, sessions index
-- ARGV: generation, base version, new version, new doc, score, session id, then
--       (seq, entry id) pairs to delete
-- Returns {{1}} deleted; {{0}} no such session; {{2, generation, doc}} stale head.
{_HEAD_DOC}
{_CHECK_HEAD}
{_STALE}
for i = 7, #ARGV, 2 do
  redis.call('ZREMRANGEBYSCORE', KEYS[2], ARGV[i], ARGV[i])
  redis.call('HDEL', KEYS[3], ARGV[i + 1])
end
{_SAVE_HEAD}
return {{1}}
""",
)
"""Delete chosen entries with a compare-and-set of the head."""

READ_ENTRIES = Script(
    "read_entries",
    """
-- KEYS: head, entries;  ARGV: min, max, limit ('' for none)
-- Returns {0} no such session, else {1, member, seq, member, seq, ...}.
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local rows
if ARGV[3] == '' then
  rows = redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[1], ARGV[2], 'WITHSCORES')
else
  rows = redis.call('ZRANGEBYSCORE', KEYS[2], ARGV[1], ARGV[2], 'WITHSCORES',
                    'LIMIT', 0, ARGV[3])
end
table.insert(rows, 1, 1)
return rows
""",
    writes=False,
)
"""A window of entries, with a check that the session exists (one snapshot)."""

GET_ENTRY = Script(
    "get_entry",
    """
-- KEYS: head, entries, entry ids;  ARGV: entry id
-- Returns {0} no such session, {1} no such entry, {2, member, seq} found.
if redis.call('EXISTS', KEYS[1]) == 0 then return {0} end
local seq = redis.call('HGET', KEYS[3], ARGV[1])
if not seq then return {1} end
local rows = redis.call('ZRANGEBYSCORE', KEYS[2], seq, seq)
if not rows[1] then return {1} end
return {2, rows[1], seq}
""",
    writes=False,
)
"""One entry by id."""

LIST_SESSIONS = Script(
    "list_sessions",
    _HEAD_DOC
    + """
-- KEYS: sessions index;  ARGV: head key prefix, max score, min score, offset, count
-- Returns {scanned, "<score> <id>\\n<head>", ...} for index rows offset.. newest first
-- (heads deleted meanwhile are left out): one reply element per row, as parsing each
-- element costs the client more than the bytes. Head keys are the prefix plus a
-- member: they carry the same hash tag as the index, so they live in its slot.
local rows = redis.call('ZREVRANGEBYSCORE', KEYS[1], ARGV[2], ARGV[3],
                        'WITHSCORES', 'LIMIT', ARGV[4], ARGV[5])
local out = {#rows / 2}
for i = 1, #rows, 2 do
  local doc = head_doc(ARGV[1] .. rows[i])
  if doc then out[#out + 1] = rows[i + 1] .. ' ' .. rows[i] .. '\\n' .. doc end
end
return out
""",
    writes=False,
)
"""One batch of session heads in list order, read in one snapshot."""

PUT_RECORD = Script(
    "put_record",
    """
-- KEYS: record, namespace index
-- ARGV: now_us, expected version ('' for any), value, updated_us, expires_us (''),
--       record key, expire-at ms for Redis ('' for never)
-- Returns {1, version} written; {0, live version} the expected version was wrong.
local cur = redis.call('HMGET', KEYS[1], 'v', 'x')
local version = 0
if cur[1] and (not cur[2] or cur[2] == '' or tonumber(cur[2]) > tonumber(ARGV[1])) then
  version = tonumber(cur[1])
end
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= version then return {0, version} end
version = version + 1
redis.call('HSET', KEYS[1], 'v', version, 'u', ARGV[4], 'x', ARGV[5], 'd', ARGV[3])
if ARGV[7] == '' then
  redis.call('PERSIST', KEYS[1])
else
  redis.call('PEXPIREAT', KEYS[1], ARGV[7])
end
redis.call('ZADD', KEYS[2], 0, ARGV[6])
return {1, version}
""",
)
"""Compare-and-set one record (a record past its expiry counts as absent: version 0)."""

DELETE_RECORD = Script(
    "delete_record",
    """
-- KEYS: record, namespace index;  ARGV: now_us, expected version (''), record key
-- Returns {2} deleted; {0, 0} not live; {1, version} the expected version was wrong.
local cur = redis.call('HMGET', KEYS[1], 'v', 'x')
if not cur[1] or (cur[2] and cur[2] ~= '' and tonumber(cur[2]) <= tonumber(ARGV[1])) then
  return {0, 0}
end
local version = tonumber(cur[1])
if ARGV[2] ~= '' and tonumber(ARGV[2]) ~= version then return {1, version} end
redis.call('UNLINK', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[3])
return {2}
""",
)
"""Delete a live record, with an optional compare-and-set."""

LIST_RECORDS = Script(
    "list_records",
    """
-- KEYS: namespace index;  ARGV: record key prefix, lex min, lex max, count
-- Returns {scanned, last key scanned, key, version, updated_us, expires_us, value, ...}.
-- Index members whose record is gone (expired by Redis) are removed on the way.
local keys = redis.call('ZRANGEBYLEX', KEYS[1], ARGV[2], ARGV[3], 'LIMIT', 0, ARGV[4])
local out = {#keys, keys[#keys] or ''}
for _, key in ipairs(keys) do
  local row = redis.call('HMGET', ARGV[1] .. key, 'v', 'u', 'x', 'd')
  if row[1] then
    out[#out + 1] = key
    out[#out + 1] = row[1]
    out[#out + 1] = row[2]
    out[#out + 1] = row[3]
    out[#out + 1] = row[4]
  else
    redis.call('ZREM', KEYS[1], key)
  end
end
return out
""",
    writes=False,
)
"""One batch of a namespace's records in key order."""

APPEND_EVENTS = Script(
    "append_events",
    f"""
-- KEYS: event stream, tenant's notice stream;  ARGV: log id, notices kept, then
--       (stream, kind, ts_us, payload) per event
-- Events are stream entries with the id '<seq>-0'; a notice (log, first, last) tells
-- followers of the whole tenant which log grew. Returns the first new seq.
{_LOG_EVENTS}
return log_events(KEYS[1], KEYS[2], ARGV[1], ARGV[2], 3, #ARGV)
""",
)
"""Append events with the next gap-free sequence numbers, and note it tenant-wide."""

# Payload rewrites in place (docs/stores.md; what reseal uses). The caller read each row
# and passes it back as the compare-and-set: a row changed or gone meanwhile is skipped.

REWRITE_ENTRIES = Script(
    "rewrite_entries",
    """
-- KEYS: head, entries;  ARGV: (seq, member as read, new member) per entry
-- Returns how many were rewritten (0 if the session is gone).
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
local n = 0
for i = 1, #ARGV, 3 do
  if redis.call('ZSCORE', KEYS[2], ARGV[i + 1]) then
    redis.call('ZREM', KEYS[2], ARGV[i + 1])
    redis.call('ZADD', KEYS[2], ARGV[i], ARGV[i + 2])
    n = n + 1
  end
end
return n
""",
)
"""Replace entries' members (same seq, same header) if they are still as read."""

REWRITE_EVENTS = Script(
    "rewrite_events",
    """
-- KEYS: event stream;  ARGV: (seq, payload as read, new payload) per event
-- Stream entries cannot change: the stream is written again, same ids, same last id.
-- Returns how many were rewritten.
local want = {}
for i = 1, #ARGV, 3 do want[ARGV[i] .. '-0'] = {ARGV[i + 1], ARGV[i + 2]} end
local rows = redis.call('XRANGE', KEYS[1], '-', '+')
local n = 0
for _, row in ipairs(rows) do
  local w = want[row[1]]
  local f = row[2]
  for j = 1, #f, 2 do
    if w and f[j] == 'p' and f[j + 1] == w[1] then f[j + 1] = w[2]; n = n + 1 end
  end
end
if n == 0 then return 0 end
local info = redis.call('XINFO', 'STREAM', KEYS[1])
local last
for j = 1, #info, 2 do if info[j] == 'last-generated-id' then last = info[j + 1] end end
redis.call('DEL', KEYS[1])
for _, row in ipairs(rows) do redis.call('XADD', KEYS[1], row[1], unpack(row[2])) end
redis.call('XSETID', KEYS[1], last)
return n
""",
)
"""Replace events' payloads (same seq, stream, kind, ts) if they are still as read."""

SESSION_INDEX = Script(
    "session_index",
    """
-- KEYS: a tenant's sessions index;  ARGV: 'add' | 'touch' | 'drop', score, session id
-- On a cluster the session scripts leave the index (another slot) to this one: 'add'
-- before a session is created (never moves an existing member), 'touch' after a write
-- (only a member still there, only to a later time), 'drop' after a delete.
if ARGV[1] == 'add' then return redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[3]) end
if ARGV[1] == 'touch' then
  return redis.call('ZADD', KEYS[1], 'XX', 'GT', ARGV[2], ARGV[3])
end
return redis.call('ZREM', KEYS[1], ARGV[3])
""",
)
"""Keep a cluster store's session index (see `statekeeper.stores.redis.cluster`)."""

SETTLE = Script(
    "settle",
    """
-- KEYS: the session's settle key (keys.Keys.settled)
-- A write whose WAIT covers everything its master wrote before it (replication is in
-- order): what an append answered as a replay waits on under wait_replicas, as the
-- write it repeats may never have reached a replica.
redis.call('SET', KEYS[1], '1', 'PX', 60000)
return 1
""",
)
"""A replicated write of no meaning in the session's slot (see `keys.Keys.settled`)."""
