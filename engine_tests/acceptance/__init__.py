"""Acceptance tests: the real ``python -m engine`` in subprocesses."""
