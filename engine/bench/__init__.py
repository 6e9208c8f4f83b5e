"""Benchmarks: ``python -m engine bench <scenario> [--json FILE]`` prints a table of figures."""
