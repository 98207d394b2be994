"""The shipped conformance tests of `statekeeper.testing.spec.test_pruning`."""

from statekeeper.testing.spec.test_pruning import *  # noqa: F403
