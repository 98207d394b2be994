"""The conformance suite's behaviour tests (pytest modules; run by ``validate``).

Each test takes the ``store`` fixture of `statekeeper.testing.plugin` and so runs once
per backend. They test behaviour through the store protocol only.
"""
