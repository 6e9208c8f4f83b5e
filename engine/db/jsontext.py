"""Compact JSON text for the values the engine writes (``jsonb`` parameters, payloads, events).

``json.dumps`` with options builds a new encoder on every call; these are built once. The
strict one refuses NaN and infinities, which PostgreSQL's ``jsonb`` does not accept.
"""

from __future__ import annotations

import json

__all__ = ["compact", "compact_strict"]

#: ``json.dumps(value, separators=(",", ":"))``.
compact = json.JSONEncoder(separators=(",", ":")).encode
#: The same, raising ``ValueError`` on NaN or an infinity; every character beyond ASCII is
#: escaped (``\uXXXX``), so a NUL or a lone surrogate shows in the text as an escape.
compact_strict = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=True).encode
