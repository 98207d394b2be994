"""The shipped conformance tests of `statekeeper.testing.spec.test_processes`."""

from statekeeper.testing.spec.test_processes import *  # noqa: F403
