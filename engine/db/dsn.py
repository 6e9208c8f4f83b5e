"""Small helpers for PostgreSQL URLs."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["redact", "replace_database"]


def redact(url: str) -> str:
    """The URL with any password replaced by ``***``, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def replace_database(url: str, database: str) -> str:
    """The same server URL pointing at another database."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + database))
