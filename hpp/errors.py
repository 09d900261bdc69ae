"""Errors raised for bad input.

Every error a user can trigger with a file or a flag is an :class:`HppInputError`:
it names the file (``source``), the field and what would fix it, and the CLI turns
it into one line on stderr with exit code 2 (see ``docs/CONTRACT.md``).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

__all__ = ["HppInputError", "InfeasibleError", "reading_fields"]


class HppInputError(ValueError):
    """Bad input: a file, a field or a flag that cannot be used as given.

    Parameters
    ----------
    message : str
        What is wrong, with the offending value.
    source : str, optional
        The file (path) or object the value came from.
    field : str, optional
        The field inside ``source`` (dotted path, e.g. ``pipelines[1].stages[0].layers``).
    fix : str, optional
        What the user should change.
    """

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None,
                 fix: str | None = None) -> None:
        self.message = message
        self.source = source
        self.field = field
        self.fix = fix
        super().__init__(self._render())

    def _render(self) -> str:
        where = ""
        if self.source and self.field:
            where = f"{self.source}: field '{self.field}': "
        elif self.source:
            where = f"{self.source}: "
        elif self.field:
            where = f"field '{self.field}': "
        tail = f" Fix: {self.fix}" if self.fix else ""
        return f"{where}{self.message}.{tail}" if not self.message.endswith(".") else f"{where}{self.message}{tail}"

    def __reduce__(self) -> tuple:
        """Pickle with the fields (an error raised in one rank crosses to another: DCP gathers them)."""
        return (_rebuild, (type(self), self.message, self.source, self.field, self.fix))

    def with_source(self, source: str) -> "HppInputError":
        """Return a copy of this error that names ``source`` (e.g. a file path) if it named none."""
        if self.source:
            return self
        return type(self)(self.message, source=source, field=self.field, fix=self.fix)


def _rebuild(cls: type, message: str, source: str | None, field: str | None, fix: str | None) -> HppInputError:
    return cls(message, source=source, field=field, fix=fix)


class InfeasibleError(HppInputError):
    """The input is valid but no plan fits (e.g. the model does not fit in memory).

    The message says by how much memory the best shape falls short, and where.
    """


@contextlib.contextmanager
def reading_fields(source: str | None, where: str, *, missing_fix: str, bad_fix: str) -> Iterator[None]:
    """Read the fields of the record ``where`` of file ``source`` inside this block: a ``KeyError`` becomes
    "missing field 'k'" (field ``where.k``, fix ``missing_fix``), a ``TypeError`` / ``ValueError`` "bad value (...)"
    (field ``where``, fix ``bad_fix``), each one :class:`HppInputError`; an :class:`HppInputError` passes unchanged.

    >>> with reading_fields("p.json", "entries[0]", missing_fix="add it", bad_fix="use numbers"):
    ...     float({"a": "x"}["a"])
    Traceback (most recent call last):
    hpp.errors.HppInputError: p.json: field 'entries[0]': bad value (could not convert string to float: 'x'). Fix: use numbers
    """
    try:
        yield
    except HppInputError:
        raise
    except KeyError as exc:
        raise HppInputError(f"missing field {exc.args[0]!r}", source=source, field=f"{where}.{exc.args[0]}",
                            fix=missing_fix) from None
    except (TypeError, ValueError) as exc:
        raise HppInputError(f"bad value ({exc})", source=source, field=where, fix=bad_fix) from None

