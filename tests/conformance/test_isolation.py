"""The shipped conformance tests of `statekeeper.testing.spec.test_isolation`."""

from statekeeper.testing.spec.test_isolation import *  # noqa: F403
