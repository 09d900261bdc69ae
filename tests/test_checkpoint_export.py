"""``python -m hpp.runtime.checkpoint.export``: an existing OUT is refused
without ``--force``, OUT gets the mode ``open()`` gives a new file, and a missing checkpoint is said
with this command's prefix and its own argument (``DIR``), not ``hpp run``'s ``--resume``."""

from __future__ import annotations

import os
import zipfile
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hpp.runtime.checkpoint import dcp as ck
from hpp.runtime.checkpoint import store
from hpp.runtime.checkpoint.export import main
from hpp.runtime.models.gpt import GPT, ModelConfig
from hpp.runtime.models.stage import build_stage

PROG = "python -m hpp.runtime.checkpoint.export"
_MODEL = GPT(ModelConfig("micro", num_blocks=1, hidden_size=8, num_heads=2, seq_len=4, vocab_size=16))


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    """A complete one-process checkpoint (step 1) of a 3-layer model."""
    n = _MODEL.spec.num_layers
    module = build_stage(_MODEL, 0, n, seed=0, dtype=torch.float32)
    ck.save_checkpoint(tmp_path / "ck", step=1, module=module, optimizer=None, model_name="micro", num_layers=n)
    return tmp_path / "ck"


def _err_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err.strip()


def test_existing_out_is_refused_without_force_and_replaced_with_it(saved, tmp_path, capsys):
    out = tmp_path / "m.pt"
    out.write_text("keep me")
    assert main([str(saved), str(out)]) == 2
    assert _err_line(capsys) == (f"{PROG}: error: field 'OUT': {out} exists. "
                                 "Fix: give another OUT, or --force to overwrite")
    assert out.read_text() == "keep me" and sorted(p.name for p in tmp_path.iterdir()) == ["ck", "m.pt"]
    assert main([str(saved), str(out), "--force"]) == 0                        # control: --force replaces it
    assert capsys.readouterr().err.startswith("wrote ")
    assert set(torch.load(out)) == {n for _l, n, _p in build_stage(_MODEL, 0, 3, seed=0).layer_parameters()}


@pytest.mark.parametrize("fmt, name", [("torch", "m.pt"), ("safetensors", "m.safetensors")])
def test_out_gets_the_mode_of_a_new_file_under_the_umask(saved, tmp_path, fmt, name):
    old = os.umask(0o027)
    try:
        assert main([str(saved), str(tmp_path / name), "--format", fmt]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o640             # safetensors alone gave 0o600
    assert not (tmp_path / (name + ".tmp")).exists()


def test_missing_checkpoint_names_this_commands_argument_with_its_prefix(tmp_path):
    missing = tmp_path / "nodir"
    proc = subprocess.run([sys.executable, "-m", "hpp.runtime.checkpoint.export", str(missing), str(tmp_path / "m.pt")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip() == (f"{PROG}: error: {missing}: field 'DIR': no such checkpoint directory. "
                                   "Fix: give the --save directory of an earlier run (or one of its step-K folders)")
    assert not (tmp_path / "m.pt").exists()


def test_incomplete_checkpoint_and_missing_out_folder_are_one_line(saved, tmp_path, capsys):
    (saved / "step-1" / store.COMPLETE_MARKER).unlink()
    assert main([str(saved / "step-1"), str(tmp_path / "m.pt")]) == 2
    assert _err_line(capsys) == (f"{PROG}: error: {saved / 'step-1'}: field 'DIR': incomplete checkpoint (no "
                                 f"'{store.COMPLETE_MARKER}' marker: the save did not finish). "
                                 "Fix: give the last complete one, none found")
    assert main([str(saved), str(tmp_path / "no" / "m.pt")]) == 2
    assert _err_line(capsys) == (f"{PROG}: error: field 'OUT': no folder {tmp_path / 'no'} for m.pt. "
                                 "Fix: create the folder first")
    with pytest.raises(SystemExit) as exc:                                    # no abbreviations
        main([str(saved), str(tmp_path / "m.pt"), "--forc"])
    assert exc.value.code == 2
    assert _err_line(capsys) == (f"{PROG}: error: unknown option --forc (did you mean --force?). "
                                 f"Fix: see {PROG} --help")


def test_format_follows_the_suffix_unless_given(saved, tmp_path):
    """``OUT.safetensors`` without ``--format`` is a safetensors file (a torch zip under that name would be
    unreadable by safetensors): the suffix decides, and ``--format`` still overrides it (the control)."""
    from safetensors.torch import load_file
    names = {n for _l, n, _p in build_stage(_MODEL, 0, 3, seed=0).layer_parameters()}
    assert main([str(saved), str(tmp_path / "m.safetensors")]) == 0
    assert set(load_file(str(tmp_path / "m.safetensors"))) == names
    assert main([str(saved), str(tmp_path / "t.safetensors"), "--format", "torch"]) == 0
    assert zipfile.is_zipfile(tmp_path / "t.safetensors")                     # a torch.save file, as asked
    with pytest.raises(Exception, match="header"):
        load_file(str(tmp_path / "t.safetensors"))


def test_out_that_is_a_folder_is_one_line(saved, tmp_path, capsys):
    assert main([str(saved), str(tmp_path)]) == 2
    assert _err_line(capsys) == (f"{PROG}: error: field 'OUT': {tmp_path} is a folder. "
                                 "Fix: give a file name, e.g. model.safetensors")
