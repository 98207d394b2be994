"""The store conformance kit: one behaviour suite every backend must pass, shipped.

Validate a backend from the command line (needs the ``testing`` extra)::

    python -m statekeeper.testing --store sqlite:///state.db
    python -m statekeeper.testing --import mypkg.conformance --backend mydb

or from Python, with `validate`, which returns a `Report`. A backend joins the registry
with `url_backend` (a URL whose scheme knows how to make fresh stores, see
`register_scheme`) or with the `backend` decorator (an async generator yielding a fresh
store). Tests check `BASE` behaviour, which every backend must have, or an extended
capability (`SHARED`, `PROCESSES`, `DAMAGE`, `REWRITE`, `THREADS`, `JOINT`), skipped with the
reason on backends without it.

Importing this package does not import pytest; running the suite does. See
``docs/testing.md``.
"""

from statekeeper.testing import schemes as _schemes  # noqa: F401  (registers the built-ins)
from statekeeper.testing.registry import (
    BACKENDS,
    BASE,
    CAPABILITIES,
    DAMAGE,
    EXTENDED,
    JOINT,
    PROCESSES,
    REWRITE,
    SCHEMES,
    SHARED,
    THREADS,
    Backend,
    BackendContext,
    Scheme,
    backend,
    backend_bug,
    needs,
    open_backend,
    register_scheme,
    url_backend,
)
from statekeeper.testing.report import CaseResult, Report
from statekeeper.testing.services import require_service, services_required, tcp_reachable
from statekeeper.testing.validate import validate

__all__ = [
    "BACKENDS",
    "BASE",
    "CAPABILITIES",
    "DAMAGE",
    "EXTENDED",
    "JOINT",
    "PROCESSES",
    "REWRITE",
    "SCHEMES",
    "SHARED",
    "THREADS",
    "Backend",
    "BackendContext",
    "CaseResult",
    "Report",
    "Scheme",
    "backend",
    "backend_bug",
    "needs",
    "open_backend",
    "register_scheme",
    "require_service",
    "services_required",
    "tcp_reachable",
    "url_backend",
    "validate",
]
