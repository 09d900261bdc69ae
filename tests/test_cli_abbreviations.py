"""hpp's parsers take no abbreviated options (``--step 2`` must not run as ``--steps 2``), and
``hpp run --warmup-steps`` says it is not LR warm-up."""

from __future__ import annotations

import pytest

from hpp.cli import main
from hpp.cliparse import Parser
from tests.test_cli_notes_and_flags import _one_line_error


@pytest.mark.parametrize("argv, expected", [
    (["run", "p.json", "--step", "2"],
     "hpp run: error: unknown option --step (did you mean --steps?). Fix: see hpp run --help"),
    (["run", "p.json", "--steps", "2", "--warmup", "1"],
     "hpp run: error: unknown option --warmup (did you mean --warmup-steps?). Fix: see hpp run --help"),
    (["run", "p.json", "--steps=2", "--lr-warmup=3"],
     "hpp run: error: unknown option --lr-warmup (did you mean --lr-warmup-steps?). Fix: see hpp run --help"),
    (["plan", "--scen", "x"], "hpp plan: error: unknown option --scen (did you mean --scenario?). "
                              "Fix: see hpp plan --help"),
])
def test_abbreviated_option_is_refused_with_the_full_name(argv, expected, capsys):
    assert _one_line_error(argv, capsys) == expected


def test_full_names_still_parse_and_abbreviation_is_only_allowed_when_asked():
    from hpp.runtime.cli import _run_parser

    ns = _run_parser().parse_args(["p.json", "--steps", "2", "--warmup-steps", "0", "--lr-warmup-steps=5"])
    assert (ns.steps, ns.warmup_steps, ns.lr_warmup_steps) == (2, 0, 5)
    p = Parser(prog="demo", allow_abbrev=True)                                   # control: argparse's prefixes
    p.add_argument("--steps", type=int)
    assert p.parse_args(["--step", "3"]).steps == 3
    assert Parser(prog="demo").allow_abbrev is False


def test_warmup_steps_help_says_it_is_not_lr_warmup(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert ("--warmup-steps WARMUP_STEPS first steps left out of the timing median (not LR warm-up: see "
            "--lr-warmup-steps; default 1)") in help_text


def test_time_profile_takes_no_abbreviations_and_errs_in_one_line(capsys, tmp_path):
    from hpp.runtime.profile import time_terms as time_profile
    with pytest.raises(SystemExit) as exc:
        time_profile.main([str(tmp_path / "p.json"), "--ou", "x.json"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip() == ("python -m hpp.runtime.profile.time_terms: error: unknown option --ou (did "
                                               "you mean --out?). Fix: see python -m hpp.runtime.profile.time_terms --help")
    assert time_profile.main([str(tmp_path / "p.json"), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"python -m hpp.runtime.profile.time_terms: error: {tmp_path / 'p.json'}: cannot read profile "
                          "file") and len(err.splitlines()) == 1, err
