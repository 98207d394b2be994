"""Benchmarks: ``make bench`` (or ``python -m bench``) runs them all in one process."""
