"""The store conformance suite: one set of behaviour tests run against every backend.

A backend joins by registering a factory in ``backends.py``; every test that takes the
``store`` fixture then runs once per registered backend.
"""
