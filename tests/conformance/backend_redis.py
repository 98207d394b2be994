"""Conformance registration of the redis backend (filled in by its implementation)."""
