"""The shipped conformance tests of listing sessions, paging and filters."""

from statekeeper.testing.spec.test_session_filters import *  # noqa: F403
from statekeeper.testing.spec.test_session_listing import *  # noqa: F403
