"""The shipped conformance tests of `statekeeper.testing.spec.test_handles`."""

from statekeeper.testing.spec.test_handles import *  # noqa: F403
