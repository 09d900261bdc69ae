"""Small file helpers shared by every loader and experiment: JSON in, CSV out (and back in for the results).

Every read error is an :class:`~hpp.errors.HppInputError` naming the file and the fix;
every write goes through a temporary file and a rename, so no file is left half-written.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import os
import secrets
from dataclasses import asdict, fields
from os import PathLike
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from hpp.errors import HppInputError

__all__ = ["read_json", "check_header", "check_keys", "write_atomic", "write_rows_csv", "write_dataclass_csv",
           "read_dataclass_csv", "process_umask", "folder_writable"]


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


def check_header(d: Any, *, fmt: str, version: int, what: str, source: str, format_fix: str,
                 shape_fix: str) -> None:
    """Refuse a JSON document that is not an object, or whose ``format`` / ``version`` are not ``fmt`` / ``version``.

    The one header check of every versioned file (plans, profiles, benchmark instances).

    Parameters
    ----------
    d : the parsed JSON document.
    fmt, version : the expected ``"format"`` and ``"version"`` values.
    what : the article and noun of the error for a non-object (``"a plan"``).
    source : the file (or object) the document came from.
    format_fix, shape_fix : the fix named for a wrong format and for a non-object.

    Raises
    ------
    HppInputError
        Naming ``source`` and the field (``format`` or ``version``).

    Examples
    --------
    >>> check_header({"format": "x", "version": 2}, fmt="x", version=1, what="an x", source="f.json",
    ...              format_fix="-", shape_fix="-")
    Traceback (most recent call last):
    ...
    hpp.errors.HppInputError: f.json: field 'version': version 2 is not supported. Fix: use version 1
    """
    if not isinstance(d, Mapping):
        raise HppInputError(f"{what} must be a JSON object", source=source, fix=shape_fix)
    if d.get("format") != fmt:
        raise HppInputError(f"format is {d.get('format')!r}, expected {fmt!r}", source=source, field="format",
                            fix=format_fix)
    if d.get("version") != version:
        raise HppInputError(f"version {d.get('version')!r} is not supported", source=source, field="version",
                            fix=f"use version {version}")


def write_atomic(path: str | PathLike, data: str | bytes | Callable[[Path], None]) -> None:
    """Write ``path`` through a temporary file beside it and a rename: a reader never sees it half-written, and a
    failed write leaves neither the temporary file nor a changed ``path`` behind.

    ``data``: the text or bytes, or a function that writes the file at the temporary path it is given
    (``torch.save``, a figure's ``savefig`` with an explicit format).

    Raises
    ------
    OSError
        The folder is missing or not writable, or the disk is full (``path`` is then unchanged).
    """
    path = Path(path)
    # a unique name opened with "x" (not mkstemp's 0600): the file gets the mode open() gives a new file
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        if callable(data):
            data(tmp)
        elif isinstance(data, bytes):
            with open(tmp, "xb") as f:
                f.write(data)
        else:
            with open(tmp, "x", newline="") as f:
                f.write(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_rows_csv(rows: Iterable[Mapping[str, Any]], path: str | PathLike, *, columns: Sequence[str]) -> None:
    """Write ``rows`` (mappings with the keys ``columns``) as CSV, header ``columns``, via a temporary file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=list(columns))
    w.writeheader()
    for r in rows:
        w.writerow(r)
    write_atomic(path, buf.getvalue())


def write_dataclass_csv(rows: Sequence[Any], path: str | PathLike, *, row_type: type | None = None) -> None:
    """Write dataclass ``rows`` as CSV (header from the dataclass fields) via a temporary file.

    ``row_type`` gives the header when ``rows`` may be empty.
    """
    kind = row_type or type(rows[0])
    write_rows_csv((asdict(r) for r in rows), path, columns=[fl.name for fl in fields(kind)])


def read_dataclass_csv(path: str | PathLike, row_type: type) -> list[Any]:
    """Rows of ``row_type`` (a dataclass of int, float and str fields) from a CSV that
    :func:`write_dataclass_csv` wrote ([] if the file does not exist); columns the dataclass lacks are refused
    (ValueError), missing ones take their defaults."""
    path = Path(path)
    if not path.exists():
        return []
    kinds = {fl.name: fl.type for fl in fields(row_type)}
    conv = {"int": int, "float": float, "str": str, int: int, float: float, str: str}
    with path.open() as f:
        rows = list(csv.DictReader(f))
    unknown = sorted({k for row in rows for k in row} - set(kinds))
    if unknown:
        raise ValueError(f"{path}: unknown column(s) {', '.join(unknown)}")
    return [row_type(**{k: conv[kinds[k]](v) for k, v in row.items()}) for row in rows]


def process_umask() -> int:
    """The process umask (read by setting it and setting it back): new files get ``0o666 & ~process_umask()``."""
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def folder_writable(path: str | PathLike) -> bool:
    """Whether the folder ``path`` would be written into exists and is writable (an output flag's check, before
    any work is done)."""
    parent = Path(path).resolve().parent
    return parent.is_dir() and os.access(parent, os.W_OK)


#: difflib similarity below which no valid key is suggested (``colour`` is not a typo of ``format``).
_SUGGEST_RATIO = 0.5


def _closest(key: str, valid: tuple[str, ...], aliases: Mapping[str, str] | None = None) -> str | None:
    """The valid key most like ``key`` (an alias first, then difflib's best ratio), None if none is close."""
    if aliases and key.lower() in aliases:
        return aliases[key.lower()]
    best = max(valid, key=lambda v: difflib.SequenceMatcher(None, key.lower(), v).ratio())
    return best if difflib.SequenceMatcher(None, key.lower(), best).ratio() >= _SUGGEST_RATIO else None


def check_keys(d: Mapping[str, Any], valid: tuple[str, ...], *, source: str, where: str,
               aliases: Mapping[str, str] | None = None) -> None:
    """Refuse the first key of ``d`` not in ``valid``, naming the closest valid one (one line): :class:`HppInputError`
    with field ``where + key`` and the fix ``did you mean ...? valid keys here: ...``."""
    unknown = [k for k in d if k not in valid]
    if not unknown:
        return
    key = str(unknown[0])
    more = f" (and {len(unknown) - 1} more: {', '.join(map(repr, unknown[1:4]))})" if len(unknown) > 1 else ""
    raise HppInputError(f"unknown key {key!r}{more}", source=source, field=f"{where}{key}",
                        fix=(f"did you mean {near!r}? " if (near := _closest(key, valid, aliases)) else "remove it; ")
                        + f"valid keys here: {', '.join(valid)}")
