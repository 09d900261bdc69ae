"""Reading a checkpoint that is damaged or was crafted: a damaged shard is one line naming the file (exit 2, before
any rank starts), and DCP's ``.metadata`` is read with only DCP's metadata classes admitted, so a pickle that would
run code is refused and runs nothing."""

from __future__ import annotations

import builtins
import json
import pickle
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hpp.errors import HppInputError                                          # noqa: E402
from hpp.runtime.checkpoint import dcp as ck                                      # noqa: E402
from hpp.runtime.checkpoint import store
from hpp.runtime.checkpoint.reader import (DCP_METADATA_FILE, check_files, file_manifest,     # noqa: E402
                                           read_dcp_metadata)
from hpp.runtime.cli import run_main                                          # noqa: E402
from hpp.runtime.models.stage import build_stage                                     # noqa: E402
from hpp.runtime.exec.training import TrainingConfig, make_optimizer               # noqa: E402
from hpp.runtime.models.zoo import load_runtime_model                                # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class _OpensAFile:
    """Unpickling this calls ``open(path, "w")``: it creates the file (the marker that code ran)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (builtins.open, (self.path, "w"))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A gpt-tiny checkpoint of step 1 saved in this process (every layer, AdamW with state), and a plan of it."""
    rt = load_runtime_model("gpt-tiny")
    module = build_stage(rt, 0, rt.spec.num_layers, seed=0)
    opt = make_optimizer(module.parameters(), TrainingConfig())
    module(torch.zeros(1, rt.spec.seq_len, dtype=torch.long)).float().sum().backward()
    opt.step()
    root = tmp_path_factory.mktemp("ck")
    ck.save_checkpoint(root / "save", step=1, module=module, optimizer=opt, model_name="gpt-tiny",
                       num_layers=rt.spec.num_layers)
    plan = root / "p.json"
    from hpp.cli import main
    assert main(["plan", "--scenario", "cpu-hetero-4", "--no-baselines", "--quiet", "--out", str(plan)]) == 0
    return root / "save", plan


def _copy(src: Path, dst: Path) -> Path:
    import shutil
    shutil.copytree(src, dst)
    return dst / "step-1"


def _resume(plan: Path, save: Path, tmp_path: Path, capsys) -> tuple[int, str]:
    rc = run_main([str(plan), "--steps", "1", "--launcher", "fork", "--resume", str(save), "--dry-run",
                   str(tmp_path / "dry")])
    return rc, capsys.readouterr().err.strip()


def test_the_save_records_every_file_it_wrote(saved):
    step = saved[0] / "step-1"
    meta = json.loads((step / store.META_FILE).read_text())
    names = {f.name for f in step.iterdir() if f.suffix == ".distcp" and f.stat().st_size} | {DCP_METADATA_FILE}
    assert set(meta["files"]) == names
    assert meta["files"] == file_manifest(step, names)
    check_files(step, meta["files"])                                           # the untouched checkpoint passes


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_shard_is_one_line_naming_it_exit_2(saved, tmp_path, capsys, damage):
    save, plan = saved
    assert _resume(plan, save, tmp_path, capsys)[0] == 0                       # control: the checkpoint resumes
    step = _copy(save, tmp_path / "save")
    shard = max(step.glob("*.distcp"), key=lambda f: f.stat().st_size)
    data = bytearray(shard.read_bytes())
    shard.write_bytes(bytes(data[: len(data) // 2]) if damage == "truncate" else
                      bytes(data[:1000]) + bytes(b ^ 0xFF for b in data[1000:1010]) + bytes(data[1010:]))
    rc, err = _resume(plan, tmp_path / "save", tmp_path, capsys)
    assert rc == 2 and "\n" not in err and f"{shard}: field '--resume'" in err
    assert ("bytes, saved with" in err) if damage == "truncate" else ("SHA-256 differs" in err)


def test_a_damaged_shard_without_a_file_list_is_named_by_the_reader(saved, tmp_path):
    """A checkpoint saved without the file list (or whose list was removed) fails where DCP reads the shard, with
    the file's name instead of DCP's rank-wrapped error."""
    step = _copy(saved[0], tmp_path / "save")
    meta = json.loads((step / store.META_FILE).read_text())
    del meta["files"]
    (step / store.META_FILE).write_text(json.dumps(meta))
    shard = max(step.glob("*.distcp"), key=lambda f: f.stat().st_size)
    shard.write_bytes(shard.read_bytes()[:100])
    rt = load_runtime_model("gpt-tiny")
    module = build_stage(rt, 0, rt.spec.num_layers, seed=1)
    with pytest.raises(HppInputError, match="cannot read this checkpoint file") as info:
        ck.load_checkpoint(step, module=module)
    assert str(shard) in str(info.value) and "\n" not in str(info.value)


def _crafted(step: Path, payload) -> None:
    """Replace the checkpoint's ``.metadata`` by DCP's own metadata with ``payload`` inside it, keeping the file
    list consistent (whoever crafts a checkpoint writes the list too: the list detects damage, not malice)."""
    md = read_dcp_metadata(step / DCP_METADATA_FILE)
    md.planner_data = payload
    (step / DCP_METADATA_FILE).write_bytes(pickle.dumps(md))
    meta = json.loads((step / store.META_FILE).read_text())
    meta["files"].update(file_manifest(step, [DCP_METADATA_FILE]))
    (step / store.META_FILE).write_text(json.dumps(meta))


def test_metadata_that_would_run_code_is_refused_and_runs_nothing(saved, tmp_path, capsys):
    save, plan = saved
    marker = tmp_path / "code-ran"
    step = _copy(save, tmp_path / "save")
    _crafted(step, _OpensAFile(marker))
    with open(step / DCP_METADATA_FILE, "rb") as f:                           # control: plain pickle runs it
        pickle.load(f)
    assert marker.exists()
    marker.unlink()
    with pytest.raises(HppInputError, match=r"names (builtins|io)\.open"):
        read_dcp_metadata(step / DCP_METADATA_FILE)
    rc, err = _resume(plan, tmp_path / "save", tmp_path, capsys)
    assert rc == 2 and "\n" not in err and "refused to read DCP metadata that names" in err and ".open (" in err
    rt = load_runtime_model("gpt-tiny")
    with pytest.raises(HppInputError, match=r"names (builtins|io)\.open"):    # the ranks' loader refuses it too
        ck.load_checkpoint(step, module=build_stage(rt, 0, rt.spec.num_layers, seed=1))
    assert not marker.exists()


def test_metadata_declaring_byte_entries_is_refused(saved, tmp_path):
    """DCP loads a byte entry with torch.load(weights_only=False): metadata that declares one is refused."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata
    step = _copy(saved[0], tmp_path / "save")
    md = read_dcp_metadata(step / DCP_METADATA_FILE)
    key = next(iter(md.state_dict_metadata))
    md.state_dict_metadata[key] = BytesStorageMetadata()
    (step / DCP_METADATA_FILE).write_bytes(pickle.dumps(md))
    with pytest.raises(HppInputError, match=rf"declares 1 byte entry \(e.g. '{key}'\)"):
        read_dcp_metadata(step / DCP_METADATA_FILE)


def test_metadata_pointing_outside_its_folder_is_refused(saved, tmp_path):
    step = _copy(saved[0], tmp_path / "save")
    md = read_dcp_metadata(step / DCP_METADATA_FILE)
    first = next(iter(md.storage_data))
    md.storage_data[first].relative_path = "../../elsewhere.distcp"
    (step / DCP_METADATA_FILE).write_bytes(pickle.dumps(md))
    with pytest.raises(HppInputError, match="not a file of the checkpoint's folder"):
        read_dcp_metadata(step / DCP_METADATA_FILE)
