"""What PostgreSQL's text and jsonb refuse, found before a statement is sent: NUL characters
and lone surrogates, and nesting deeper than a limit. Walked without recursion, so a value
nested 5,000 deep is an answer, not a RecursionError."""

from __future__ import annotations

__all__ = ["bad_character", "json_problem"]


def bad_character(text: str) -> str | None:
    """What PostgreSQL cannot store in ``text`` (a NUL, a lone surrogate), or None."""
    if "\x00" in text:
        return "a NUL character"
    if text.isascii():
        return None
    try:
        text.encode("utf-8")  # fails on a lone surrogate, at C speed
        return None
    except UnicodeEncodeError:
        pass
    for ch in text:
        if "\ud800" <= ch <= "\udfff":
            return f"a lone surrogate (U+{ord(ch):04X})"
    return None


def json_problem(value: object, max_depth: int | None = None) -> str | None:
    """Why ``value`` could not be stored as jsonb (depth beyond ``max_depth``, a key or text
    holding :func:`bad_character`), or None. Whether it encodes at all is json.dumps's to say."""
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if max_depth is not None and depth > max_depth:
                return f"is nested deeper than {max_depth} levels"
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, inner in pairs:
                if isinstance(key, str) and (bad := bad_character(key)):
                    return f"has a key {key[:40]!r} holding {bad}"
                stack.append((inner, depth + 1))
        elif isinstance(item, str) and (bad := bad_character(item)):
            return f"has text holding {bad}"
    return None
