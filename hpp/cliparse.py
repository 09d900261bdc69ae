"""argparse with the project's one-line errors.

A parse error (an unknown flag, a value of the wrong type, a missing argument) prints
``PROG: error: MESSAGE. Fix: see PROG --help`` on stderr and exits with 2, like every
other bad input of the command-line tools, instead of argparse's usage block.
Subcommands' parsers inherit it (``add_subparsers`` uses the parent's class).
"""

from __future__ import annotations

import argparse
from typing import NoReturn

__all__ = ["Parser"]


class Parser(argparse.ArgumentParser):
    """:class:`argparse.ArgumentParser` whose :meth:`error` prints one line (exit code 2).

    ``help_command``: the command the fix points to (default ``PROG --help``; a script
    gives its own, e.g. ``python experiments/search_overhead.py --help``).
    """

    def __init__(self, *args, help_command: str | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.help_command = help_command

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}. Fix: see {self.help_command or self.prog + ' --help'}\n")
