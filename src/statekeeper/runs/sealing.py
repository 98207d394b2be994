"""A `StateCodec` applied to run states: sealed checkpoints, and whole-state blobs.

`statekeeper.codec` turns text into bytes and back and knows nothing of runs; this
module is where the two meet (so ``codec`` never imports ``runs``).

- `CheckpointSeal` seals the checkpoint payloads a `RunStore` writes (compressed and/or
  encrypted, bound to tenant and run) and opens them again.
- `dump_state` / `load_state` encode a whole `RunState` (``to_json``, items included)
  for moving it between stores or machines.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from statekeeper.codec import StateCodec, StateTamperedError
from statekeeper.core.messages import Message
from statekeeper.errors import InvalidInputError, InvalidPayloadError
from statekeeper.jsoncodec import loads
from statekeeper.runs.state import RunState

__all__ = ["CheckpointSeal", "dump_state", "load_state"]

_PLAIN = StateCodec()
_LEFT_OUT: dict[str, Any] = {
    "group_id": None,
    "guardrails": [],
    "interruptions": [],
    "decisions": [],
    "always": {},
    "error": None,
    "context": None,
    "delegation": None,
    "child_usage": {},
    "pending_input": [],
    "output": None,
    "metadata": {},
    "cancel_requested": False,
}
"""Fields a stored checkpoint leaves out while they hold these values (their defaults:
reading the checkpoint gives them back). Most of a step's checkpoints have most of them
empty; left in, they were a third of its bytes."""


class CheckpointSeal:
    """Seals a tenant's checkpoint payloads with ``codec`` (None: stored as plain JSON)."""

    def __init__(self, tenant: str, codec: StateCodec | None = None) -> None:
        self.tenant = tenant
        self.codec = codec

    def seal(self, state: RunState) -> dict[str, Any]:
        """The checkpoint payload of ``state``: its data, sealed if the codec does anything."""
        data = {
            key: value
            for key, value in state.checkpoint_data().items()
            if key not in _LEFT_OUT or value != _LEFT_OUT[key]
        }
        # Limits not set, and a trace without a traceparent, read back as None too.
        data["limits"] = {k: v for k, v in data["limits"].items() if v is not None}
        data["trace"] = {k: v for k, v in data["trace"].items() if v is not None}
        if self.codec is None or not (self.codec.compress or self.codec.encrypted):
            return data
        text = json.dumps(data, ensure_ascii=False, allow_nan=False)
        blob = self.codec.encode(text, associated_data=self._bound_to(state.run_id))
        # run_id stays readable: loading finds a run's checkpoints by it.
        return {"run_id": state.run_id, "sealed": base64.b64encode(blob).decode()}

    def open(self, payload: dict[str, Any], run_id: str) -> dict[str, Any]:
        """The checkpoint data in ``payload``.

        Raises:
            StateTamperedError: a plain payload while the codec encrypts (it may have
                been swapped in), or a sealed one that fails authentication.
            InvalidInputError: a sealed payload and no codec to open it.
        """
        if "sealed" not in payload:
            if self.codec is not None and self.codec.encrypted:
                raise StateTamperedError(
                    f"checkpoint of run {run_id!r} is not encrypted, but this store seals "
                    "checkpoints: refusing it (it may have been replaced)"
                )
            return payload
        if self.codec is None:
            raise InvalidInputError(
                f"checkpoint of run {run_id!r} is sealed; open the RunStore with its codec"
            )
        blob = base64.b64decode(str(payload["sealed"]))
        return dict(loads(self.codec.decode(blob, associated_data=self._bound_to(run_id))))

    def _bound_to(self, run_id: str) -> bytes:
        # Binds a sealed checkpoint to its tenant and run: it cannot be moved to another.
        return f"{self.tenant}/{run_id}".encode()


def dump_state(
    state: RunState,
    items: list[Message] | None = None,
    codec: StateCodec | None = None,
) -> bytes:
    """`RunState.to_json` (with ``items`` if given), encoded by ``codec`` (plain UTF-8 if None)."""
    try:
        text = state.to_json(items)
    except ValueError as exc:  # NaN or infinity somewhere in the state
        raise InvalidPayloadError(f"run state is not plain JSON: {exc}") from exc
    return (codec or _PLAIN).encode(text)


def load_state(blob: bytes | str, codec: StateCodec | None = None) -> RunState:
    """Decode ``blob`` with ``codec`` (plain or compressed if None), then `RunState.from_json`.

    Text is never an envelope, so a codec with a key refuses it (`StateTamperedError`).
    Older schema versions are migrated; see `RunState.from_json` for the errors.
    """
    if isinstance(blob, str):
        try:
            blob = blob.encode()
        except UnicodeEncodeError as exc:
            raise InvalidPayloadError(f"run state text is not valid UTF-8: {exc.reason}") from None
    return RunState.from_json((codec or _PLAIN).decode(blob))
