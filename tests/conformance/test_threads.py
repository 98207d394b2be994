"""The shipped conformance tests of `statekeeper.testing.spec.test_threads`."""

from statekeeper.testing.spec.test_threads import *  # noqa: F403
