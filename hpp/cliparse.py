"""argparse with the project's one-line errors and defaults shown in ``--help``.

:func:`run_command` is the one error wrapper of every command (``hpp``, ``hpp run``, the
benchmark commands): bad input is one line ``PROG: error: MESSAGE`` on stderr and exit code 2.

A parse error (an unknown flag, a value of the wrong type, a missing argument) prints
``PROG: error: MESSAGE. Fix: see PROG --help`` on stderr and exits with 2, like every
other bad input of the command-line tools, instead of argparse's usage block.
Subcommands' parsers inherit it (``add_subparsers`` uses the parent's class).
An unknown option or command is refused by the parser it was given to, before argparse's own checks,
naming that parser and the closest name: ``hpp run: error: unknown option --stepz (did you mean
--steps?). Fix: see hpp run --help`` (argparse would name ``hpp``, or only a missing ``--steps``).
Abbreviated options are refused the same way (``allow_abbrev=False``): ``--step 2`` is not taken
for ``--steps 2``, nor ``--warmup`` for whichever ``--warmup-*`` flag it happens to prefix.

Every option with a default shows it in ``--help`` (``(default: 10.0)``) unless its help
text already says ``default``; flags (``store_true``) and unset (None) defaults show nothing.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import sys
from typing import Any, Callable, NoReturn

from hpp.errors import HppInputError

__all__ = ["Parser", "DefaultsFormatter", "DefaultsRawFormatter", "run_command", "comma_list"]

#: What argparse reads as a negative number rather than an option (its ``_negative_number_matcher``).
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")


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
    Options must be spelled out (``allow_abbrev=False`` unless given): an abbreviation is an
    unknown option (:meth:`check_names`).
    """

    def __init__(self, *args, help_command: str | None = None, **kwargs) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.help_command = help_command

    def error(self, message: str) -> NoReturn:
        """Print ``PROG: error: MESSAGE. Fix: see PROG --help`` (one line) on stderr and exit 2."""
        self.exit(2, f"{self.prog}: error: {message}. Fix: see {self.help_command or self.prog + ' --help'}\n")

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, after refusing an unknown option or command of this parser (:meth:`check_names`)."""
        args = list(sys.argv[1:] if args is None else args)
        self.check_names(args)
        return super().parse_known_args(args, namespace)

    def parse_args(self, args=None, namespace=None):
        """argparse's; arguments nobody took are refused by the subcommand's parser they were given to
        (``hpp plan: error: unrecognized arguments: x``, not ``hpp: error: ...``)."""
        ns, extras = self.parse_known_args(args, namespace)
        if extras:
            owner = self
            while (sub := _subcommand(owner, ns)) is not None:
                owner = sub
            owner.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns

    def check_names(self, args: list[str]) -> None:
        """Refuse (:meth:`error`) the first option of ``args`` this parser does not know, or an unknown
        command of a parser with subcommands, naming the closest name (``difflib``).

        Options are matched as argparse matches them (exact, ``--opt=value``, a unique prefix of a long
        option only with ``allow_abbrev``); what argparse reads as a value (a negative number, text with
        a space, the value after an option that takes one) is skipped; scanning stops at ``--`` and at the
        command (its own parser checks the rest).

        Examples
        --------
        >>> p = Parser(prog="demo")
        >>> _ = p.add_argument("--steps", type=int)
        >>> p.check_names(["--steps=3"])
        >>> try:                                  # stderr: demo: error: unknown option --step (did you mean
        ...     p.check_names(["--step", "3"])      # --steps?). Fix: see demo --help
        ... except SystemExit as exc:
        ...     print(exc.code)
        2
        """
        options = {o: a for a in self._actions for o in a.option_strings}
        commands = next((a for a in self._actions if isinstance(a, argparse._SubParsersAction)), None)
        it = iter(args)
        for tok in it:
            if tok == "--":
                return
            if (tok[:1] not in self.prefix_chars or tok in self.prefix_chars or " " in tok
                    or (_NEGATIVE_NUMBER.match(tok) and not self._has_negative_number_optionals)):
                if commands is None:
                    continue
                if tok not in commands.choices:
                    self.error(f"unknown command {tok}{_did_you_mean(tok, commands.choices)}; the commands: "
                               f"{', '.join(commands.choices)}")
                return
            name = tok.split("=", 1)[0] if tok[1:2] in self.prefix_chars else tok[:2]
            found = [options[name]] if name in options else [
                a for o, a in options.items() if self.allow_abbrev and len(name) > 2 and o.startswith(name)]
            if not found and name != tok and tok in options:     # a short option's whole token, e.g. -vv
                found = [options[tok]]
            if not found:
                long_names = [o for o in options if o[1:2] in self.prefix_chars] or list(options)
                self.error(f"unknown option {name}{_did_you_mean(name, long_names)}")
            if len({id(a) for a in found}) == 1 and "=" not in tok and found[0].nargs is None and len(tok) == len(name):
                next(it, None)                                    # its value, e.g. the 3 of --steps 3


def _did_you_mean(name: str, names) -> str:
    """`` (did you mean X?)`` for the one name ``name`` abbreviates, else the closest of ``names``, or ``""``.

    >>> _did_you_mean("--save-e", ["--save", "--save-every"]), _did_you_mean("--stepz", ["--steps", "--seed"])
    (' (did you mean --save-every?)', ' (did you mean --steps?)')
    """
    starts = [n for n in names if n.startswith(name)]
    close = starts if len(starts) == 1 else difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _subcommand(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser | None:
    """The parser of the subcommand ``ns`` chose under ``parser`` (None without one)."""
    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            return a.choices.get(getattr(ns, a.dest, None) or "")
    return None


def comma_list(kind: Callable[[str], Any]) -> Callable[[str], list]:
    """An argparse ``type`` for comma-separated values of ``kind`` (``int``, ``float``, ``str``): ``"8,16"`` -> [8, 16].

    Raises
    ------
    argparse.ArgumentTypeError
        A value ``kind`` refuses (argparse turns it into its one-line error naming the flag).
    """
    def parse(text: str) -> list:
        try:
            return [kind(x) for x in text.split(",") if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {kind.__name__}") from None
    return parse
