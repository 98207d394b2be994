"""The shipped conformance tests of damaged session heads and records."""

from statekeeper.testing.spec.test_damaged_rows import *  # noqa: F403
