"""The messages a run's events name, for readers that show their text.

A runner's events do not repeat what the step's messages hold: ``assistant/complete``
names its assistant message (``id``) and ``tool/result`` the call's result message
(``message``), entries of the run's session written in the same commit as the events.
`resolve_events` gives events back with that text filled in: ``text`` of an
``assistant/complete``, ``output`` of a ``tool/result``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from statekeeper.errors import NotFoundError
from statekeeper.sessions.view import message_of
from statekeeper.stores.base import Event, Store

__all__ = ["message_ref", "resolve_events"]


def message_ref(event: Event) -> tuple[str, str] | None:
    """(the entry id the event names, the payload key its text fills), or None."""
    payload = event.payload
    if event.stream == "assistant" and event.kind == "complete" and "text" not in payload:
        ref, key = payload.get("id"), "text"
    elif event.stream == "tool" and event.kind == "result" and "output" not in payload:
        ref, key = payload.get("message"), "output"
    else:
        return None
    return (ref, key) if isinstance(ref, str) else None


async def resolve_events(
    store: Store, tenant: str, session_id: str, events: Sequence[Event]
) -> list[Event]:
    """``events`` of a run over ``session_id``, each that names a message with its text
    filled in (read from the session; an event whose message is gone stays as it is)."""
    out: list[Event] = []
    for event in events:
        found = message_ref(event)
        if found is not None:
            ref, key = found
            try:
                entry = await store.get_entry(tenant, session_id, ref)
            except NotFoundError:
                out.append(event)
                continue
            event = replace(event, payload={**event.payload, key: message_of(entry).text})
        out.append(event)
    return out
