"""argparse with the project's one-line errors and defaults shown in ``--help``.

:func:`run_command` is the one error wrapper of every command (``hpp``, ``hpp run``, the
benchmark commands): bad input is one line ``PROG: error: MESSAGE`` on stderr and exit code 2.

A parse error (an unknown flag, a value of the wrong type, a missing argument) prints
``PROG: error: MESSAGE. Fix: see PROG --help`` on stderr and exits with 2, like every
other bad input of the command-line tools, instead of argparse's usage block.
Subcommands' parsers inherit it (``add_subparsers`` uses the parent's class).

Every option with a default shows it in ``--help`` (``(default: 10.0)``) unless its help
text already says ``default``; flags (``store_true``) and unset (None) defaults show nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, NoReturn

from hpp.errors import HppInputError

__all__ = ["Parser", "DefaultsFormatter", "DefaultsRawFormatter", "run_command"]


def run_command(prog: str, command: Callable[[], int]) -> int:
    """Run ``command()`` and return its exit code, with the project's one-line errors.

    :class:`~hpp.errors.HppInputError` -> ``PROG: error: MESSAGE`` on stderr, exit 2;
    Ctrl-C -> ``PROG: interrupted``, exit 1; a closed stdout (``hpp plan | head``) -> quiet exit 1.
    Errors of other types propagate (a command that handles its own, e.g. ``hpp run``, catches
    them inside ``command``).

    Examples
    --------
    >>> def bad() -> int:
    ...     raise HppInputError("no such thing", field="--x", fix="give another")
    >>> run_command("hpp demo", bad)      # prints "hpp demo: error: field ..." on stderr
    2
    """
    try:
        return command()
    except HppInputError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 1
    except BrokenPipeError:   # e.g. `hpp plan | head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


class DefaultsFormatter(argparse.HelpFormatter):
    """Help formatter that appends ``(default: X)`` to options whose default is not None/False/0-count.

    Examples
    --------
    >>> p = Parser(prog="x")
    >>> _ = p.add_argument("--n", type=int, default=3, help="how many")
    >>> "how many (default: 3)" in p.format_help()
    True
    """

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        quiet = (argparse._CountAction, argparse._HelpAction, argparse._VersionAction)
        if ("default" in text or not action.option_strings or action.default is None or action.default is False
                or action.default == argparse.SUPPRESS or isinstance(action, quiet)):
            return text
        return f"{text} (default: %(default)s)" if text else "(default: %(default)s)"


class DefaultsRawFormatter(DefaultsFormatter, argparse.RawDescriptionHelpFormatter):
    """:class:`DefaultsFormatter` that keeps the description's and epilog's line breaks (formats, tables)."""


class Parser(argparse.ArgumentParser):
    """:class:`argparse.ArgumentParser` whose :meth:`error` prints one line (exit code 2).

    ``help_command``: the command the fix points to (default ``PROG --help``; a script
    gives its own, e.g. ``python experiments/search_overhead.py --help``). The help shows
    defaults (:class:`DefaultsFormatter`) unless another ``formatter_class`` is given.
    """

    def __init__(self, *args, help_command: str | None = None, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)
        self.help_command = help_command

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}. Fix: see {self.help_command or self.prog + ' --help'}\n")
