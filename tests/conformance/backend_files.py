"""Conformance registration of the files backend (filled in by its implementation)."""
