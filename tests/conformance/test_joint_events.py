"""The shipped conformance tests of `statekeeper.testing.spec.test_joint_events`."""

from statekeeper.testing.spec.test_joint_events import *  # noqa: F403
