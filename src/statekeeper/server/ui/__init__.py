"""The browser control UI: static pages the server serves at ``/ui``.

Plain HTML, CSS and JavaScript modules shipped in the package (``static/``): no CDN, no
build step, no external fonts, so the UI works offline. The pages talk to the server's
JSON API (``/api/v1``) and its event stream with the API key the user pastes into the
login form (kept in the tab's ``sessionStorage``). See docs/ui.md.

Only the files present in ``static/`` when `mount_ui` runs are served, looked up by exact
name, so no request path can reach outside the folder.
"""

from __future__ import annotations

from importlib import resources
from typing import TYPE_CHECKING

from statekeeper.errors import MissingExtraError

if TYPE_CHECKING:
    from starlette.applications import Starlette

__all__ = ["STATIC_FILES", "UI_PATH", "mount_ui"]

UI_PATH = "/ui"
"""Where the UI is served."""

_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
# Everything the pages load comes from this server; nothing inline, nothing framed.
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _static_files() -> dict[str, bytes]:
    folder = resources.files(__name__) / "static"
    return {
        item.name: item.read_bytes()
        for item in folder.iterdir()
        if item.is_file() and any(item.name.endswith(ext) for ext in _TYPES)
    }


STATIC_FILES: frozenset[str] = frozenset(_static_files())
"""The names of the files the UI serves (``index.html``, ``app.js``, ...)."""


def mount_ui(app: Starlette) -> None:
    """Serve the control UI at ``/ui`` on ``app`` (a FastAPI or Starlette application).

    ``/ui`` redirects to ``/ui/``, which is the single page; ``/ui/<name>`` serves the
    shipped asset ``<name>``. Unknown names get a 404. The routes stay out of the
    OpenAPI description (they are not part of the JSON API).
    """
    try:
        from starlette.requests import Request
        from starlette.responses import RedirectResponse, Response
    except ImportError as exc:  # pragma: no cover - the server extra brings starlette
        raise MissingExtraError("the control UI", "server") from exc

    files = _static_files()

    async def redirect(request: Request) -> Response:
        return RedirectResponse(f"{UI_PATH}/", status_code=307)

    async def serve(request: Request) -> Response:
        name = request.path_params["name"] or "index.html"
        body = files.get(name)
        if body is None:
            return Response("not found", status_code=404, media_type="text/plain")
        suffix = name[name.rfind(".") :]
        return Response(body, media_type=_TYPES[suffix], headers=_HEADERS)

    app.add_route(UI_PATH, redirect, methods=["GET"], include_in_schema=False)
    app.add_route(f"{UI_PATH}/{{name:path}}", serve, methods=["GET"], include_in_schema=False)
