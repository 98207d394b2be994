"""The shipped conformance tests of `statekeeper.testing.spec.test_transcripts`."""

from statekeeper.testing.spec.test_transcripts import *  # noqa: F403
