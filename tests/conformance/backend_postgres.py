"""Conformance registration of the postgres backend (filled in by its implementation)."""
