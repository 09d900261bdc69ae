"""Count phrases for what hpp prints: ``1 pipeline``, ``2 pipelines`` (never ``1 pipelines`` or ``pipeline(s)``)."""

from __future__ import annotations

__all__ = ["count", "noun"]


def noun(n: int, singular: str, plural: str | None = None) -> str:
    """``singular`` for ``n == 1``, else ``plural`` (default ``singular + "s"``).

    >>> noun(1, "copy", "copies"), noun(0, "copy", "copies"), noun(3, "step")
    ('copy', 'copies', 'steps')
    """
    return singular if n == 1 else (plural or singular + "s")


def count(n: int, singular: str, plural: str | None = None) -> str:
    """``n`` and the noun that agrees with it.

    >>> count(1, "pipeline"), count(2, "pipeline"), count(1, "copy", "copies"), count(0, "rank")
    ('1 pipeline', '2 pipelines', '1 copy', '0 ranks')
    """
    return f"{n} {noun(n, singular, plural)}"
