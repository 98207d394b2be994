"""The shipped conformance tests of `statekeeper.testing.spec.test_transcript_data`."""

from statekeeper.testing.spec.test_transcript_data import *  # noqa: F403
