"""A bound on request bodies, checked before anything reads them (authentication too):
without it a client, even one with no key, makes the server buffer a body of any size."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

from statekeeper.server.errors import error_body

__all__ = ["DEFAULT_MAX_BODY_BYTES", "BodyLimit"]

DEFAULT_MAX_BODY_BYTES: Final = 32 * 1024 * 1024
"""32 MiB: twice the stores' default ``max_payload_bytes``, room for a session import."""

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: a body over ``limit`` bytes is a 413 `PayloadTooLargeError`.

    A declared ``Content-Length`` over the limit is refused before any byte is read; a
    body without one (chunked) is read up to the limit, then refused. A body within the
    limit is handed on whole, and later messages (a disconnect) pass through.
    """

    def __init__(self, app: App, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await self._refuse(send, declared)
            return
        buffered: list[Message] = []
        size = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break  # a disconnect: let the app see it
            size += len(message.get("body", b""))
            if size > self.limit:
                await self._refuse(send, size)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, size: int) -> None:
        message = (
            f"the request body is larger than {self.limit} bytes ({size} seen), this "
            "server's limit: send less, or start the server with a larger --max-body-bytes"
        )
        body = json.dumps(error_body("PayloadTooLargeError", message)).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
