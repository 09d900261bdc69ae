"""Small file helpers shared by every loader and experiment: JSON in, CSV out.

Every read error is an :class:`~hpp.errors.HppInputError` naming the file and the fix;
every write goes through a temporary file and a rename, so no file is left half-written.
"""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, fields
from os import PathLike
from pathlib import Path
from typing import Any, Sequence

from hpp.errors import HppInputError

__all__ = ["read_json", "write_dataclass_csv"]


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise _DuplicateKey(k)
        out[k] = v
    return out


class _DuplicateKey(Exception):
    pass


def read_json(path: str | PathLike, *, what: str) -> Any:
    """Read a JSON file, refusing duplicate keys (``json`` would silently keep the last one).

    Raises
    ------
    HppInputError
        The file is missing or unreadable, is not JSON, or repeats a key.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise HppInputError(f"cannot read {what} ({exc.strerror})", source=str(p),
                            fix=f"check the path of the {what}") from None
    try:
        return json.loads(text, object_pairs_hook=_reject_duplicates)
    except json.JSONDecodeError as exc:
        raise HppInputError(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                            source=str(p), fix="fix the JSON syntax") from None
    except _DuplicateKey as exc:
        raise HppInputError(f"duplicate key {exc.args[0]!r}", source=str(p), field=str(exc.args[0]),
                            fix="give each entry once") from None


def write_dataclass_csv(rows: Sequence[Any], path: str | PathLike, *, row_type: type | None = None) -> None:
    """Write dataclass ``rows`` as CSV (header from the dataclass fields) via a temporary file.

    ``row_type`` gives the header when ``rows`` may be empty.
    """
    path = Path(path)
    kind = row_type or type(rows[0])
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[fl.name for fl in fields(kind)])
        w.writeheader()
        for r in rows:
            w.writerow(asdict(r))
    tmp.replace(path)
