"""The shipped conformance tests of `statekeeper.testing.spec.test_records`."""

from statekeeper.testing.spec.test_records import *  # noqa: F403
