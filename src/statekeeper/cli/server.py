"""``statekeeper serve`` and ``statekeeper keys create|list|revoke`` (extra ``server``)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import typer
from rich.table import Table
from rich.text import Text

from statekeeper.cli._common import (
    JsonFlag,
    console,
    fail,
    ids_whole,
    print_json,
    run,
    settings,
    stamp,
    wants_json,
)
from statekeeper.cli.runs import load_app
from statekeeper.errors import MissingExtraError, StatekeeperError
from statekeeper.stores import Store

__all__ = ["keys_app", "serve"]

keys_app = typer.Typer(
    help="API keys of the server: create (printed once), list, revoke.", no_args_is_help=True
)


_Grace = Annotated[
    float,
    typer.Option(
        min=0,
        help="On SIGTERM, seconds to let the runs this server drives finish; then they "
        "stop with their leases released, for another server to resume at once.",
    ),
]

_Poll = Annotated[
    float, typer.Option(min=0.01, help="Seconds between log reads when the store has no feed.")
]
_MaxBody = Annotated[
    int, typer.Option(min=1024, help="The largest request body taken; larger ones get a 413.")
]
_TakeOver = Annotated[
    float | None,
    typer.Option(
        min=0.1,
        metavar="SECONDS",
        help="Every SECONDS, resume the runs whose server went away (still 'running', "
        "their lease expired). Needs --app. Off by default.",
        show_default=False,
    ),
]


def _server() -> None:
    try:
        import statekeeper.server  # noqa: F401
    except MissingExtraError as exc:
        fail(str(exc))


def serve(
    ctx: typer.Context,
    app_spec: Annotated[
        str | None,
        typer.Option(
            "--app",
            envvar="STATEKEEPER_APP",
            metavar="MODULE:ATTR",
            help="A function (store, tenant) -> Runner: lets the server resume and fork runs.",
            show_default=False,
        ),
    ] = None,
    host: Annotated[str, typer.Option(help="Address to bind.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=0, max=65535, help="Port to bind.")] = 8321,
    dev_anonymous: Annotated[
        bool,
        typer.Option(
            "--dev-anonymous",
            help="No API keys: every request is tenant 'default' with scope admin. "
            "Loopback hosts only.",
        ),
    ] = False,
    cors_origin: Annotated[
        list[str] | None,
        typer.Option("--cors-origin", metavar="ORIGIN", help="Allow this origin (repeat)."),
    ] = None,
    poll_interval: _Poll = 0.25,
    max_body_bytes: _MaxBody = 32 * 1024 * 1024,
    shutdown_grace: _Grace = 10.0,
    take_over: _TakeOver = None,
) -> None:
    """Serve the HTTP API, live events and the control UI over the store."""
    _server()
    from statekeeper.server import ServerConfig

    if take_over is not None and app_spec is None:
        fail("--take-over needs --app: the agents the server resumes runs with")
    factory = load_app(app_spec) if app_spec is not None else None

    async def reachable(store: Store, _: str) -> None:
        return None  # opened and closed: an unreachable store is one error line, now

    run(ctx, reachable, create=True)
    config = ServerConfig(
        store=settings(ctx).store,
        app=app_spec,
        factory=factory,
        dev_anonymous=dev_anonymous,
        cors_origins=tuple(cors_origin or ()),
        poll_interval=poll_interval,
        max_body_bytes=max_body_bytes,
        shutdown_grace=shutdown_grace,
        take_over=take_over,
    )
    _run_server(config, host, port)


def _run_server(config: Any, host: str, port: int) -> None:
    import uvicorn

    from statekeeper.server import check_host, create_app

    try:
        check_host(host, config.dev_anonymous)
    except StatekeeperError as exc:
        fail(str(exc))
    console(stderr=True).print(
        Text(f"statekeeper serving {_shown(config.store)} on http://{host}:{port} (UI at /ui)")
    )
    uvicorn.run(
        create_app(config),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,  # a stream URL may carry ?key=: never log request lines
        timeout_graceful_shutdown=2,  # open requests and streams; then runs get their grace
    )


def _shown(url: str) -> str:
    """The store URL without credentials or options (a password must not reach a log)."""
    parts = urlsplit(url)
    if not parts.netloc:  # sqlite:///path, memory://: nothing secret
        return url.partition("?")[0]
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


@keys_app.command("create")
def create_key(
    ctx: typer.Context,
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant the key acts for.")],
    scope: Annotated[str, typer.Option("--scope", help="read, operate or admin.")] = "read",
    label: Annotated[str | None, typer.Option(help="A note to recognise the key by.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """Create an API key; it is printed once and never stored (only its hash is)."""
    _server()
    from statekeeper.server import ApiKeys

    if settings(ctx).store.startswith("memory:"):
        fail(
            "a memory:// store ends with this command, and the key with it: create keys "
            "in the store the server serves (--store sqlite:///..., postgresql://...), "
            "or serve a memory:// store with --dev-anonymous"
        )

    async def work(store: Store, _: str) -> tuple[str, str]:
        record, key = await ApiKeys(store).create(tenant, scope, label=label)
        return record.key_id, key

    key_id, key = run(ctx, work, create=True)
    if wants_json(ctx, json_output):
        print_json({"key_id": key_id, "tenant": tenant, "scope": scope, "key": key})
        return
    out = console()
    out.print(Text(key))
    console(stderr=True).print(
        Text(f"key {key_id} for tenant {tenant} ({scope}); it is shown only now: keep it")
    )


@keys_app.command("list")
def list_keys(
    ctx: typer.Context,
    tenant: Annotated[str | None, typer.Option(help="Only keys of this tenant.")] = None,
    json_output: JsonFlag = False,
) -> None:
    """List API keys (never the keys themselves)."""
    _server()
    from statekeeper.server import ApiKeyList, ApiKeys

    async def work(store: Store, _: str) -> ApiKeyList:
        return await ApiKeys(store).list(tenant)

    found = run(ctx, work, read_only=True)
    if wants_json(ctx, json_output):
        corrupt = [item.model_dump(mode="json") for item in found.corrupt]
        print_json({"items": [key.public() for key in found], "corrupt": corrupt})
        return
    for item in found.corrupt:
        console(stderr=True).print(Text(f"damaged key record {item.id}: {item.error}"))
    if not found:
        console().print("No API keys.")
        return
    table = Table()
    for column in ("id", "tenant", "scope", "label", "created (UTC)", "revoked (UTC)"):
        table.add_column(column)
    for key in found:
        table.add_row(
            Text(key.key_id),
            Text(key.tenant),
            key.scope,
            Text(key.label or ""),
            stamp(key.created_at),
            stamp(key.revoked_at),
        )
    console().print(ids_whole(table))


@keys_app.command("revoke")
def revoke_key(
    ctx: typer.Context,
    key_id: Annotated[str, typer.Argument(help="The key's id (see keys list).")],
) -> None:
    """Revoke an API key: the server refuses it from the next request on."""
    _server()
    from statekeeper.server import ApiKeys

    async def work(store: Store, _: str) -> None:
        await ApiKeys(store).revoke(key_id)

    run(ctx, work)
    console().print(Text(f"revoked key {key_id}"))
