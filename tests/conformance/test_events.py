"""The shipped conformance tests of `statekeeper.testing.spec.test_events`."""

from statekeeper.testing.spec.test_events import *  # noqa: F403
