"""The shipped conformance tests of `statekeeper.testing.spec.test_rewriting`."""

from statekeeper.testing.spec.test_rewriting import *  # noqa: F403
