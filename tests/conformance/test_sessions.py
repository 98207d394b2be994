"""The shipped conformance tests of `statekeeper.testing.spec.test_sessions`."""

from statekeeper.testing.spec.test_sessions import *  # noqa: F403
