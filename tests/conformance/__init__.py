"""statekeeper's own run of the shipped conformance suite (`statekeeper.testing.spec`).

Each module here imports one spec module's tests, so they keep their ids
(``tests/conformance/test_x.py::test_y[sqlite]``) and run once per built-in backend.
"""
