"""Run the shipped conformance suite's tests here, once per registered backend.

The fixtures and hooks are those of `statekeeper.testing.plugin` (``store``,
``other_handle``, ``store_url``, the ``backend_bug`` and capability marks), scoped to
this folder: the feature suites have their own ``store`` fixture (tests/conftest.py).
"""

from statekeeper.testing.plugin import (
    open_test_store,
    other_handle,
    pytest_collection_modifyitems,
    pytest_configure,
    pytest_generate_tests,
    store,
    store_backend,
    store_url,
)

__all__ = [
    "open_test_store",
    "other_handle",
    "pytest_collection_modifyitems",
    "pytest_configure",
    "pytest_generate_tests",
    "store",
    "store_backend",
    "store_url",
]
