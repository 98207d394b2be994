"""The shipped conformance tests of `statekeeper.testing.spec.test_concurrency`."""

from statekeeper.testing.spec.test_concurrency import *  # noqa: F403
