"""Benchmarks for selvedge_django: runnable scripts that print their figures."""
