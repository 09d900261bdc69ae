"""``--data FILE``: byte-level text and .npy token ids, window order, padding, refusals; the step metrics."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from hpp.errors import HppInputError
from hpp.runtime.exec.data import data_spec, make_batch_source
from hpp.runtime.metrics import StepMonitor, aggregate_step, peak_flops_per_s, plan_peak_flops_per_s
from hpp.runtime.models.api import IGNORE_INDEX, ModelSpec


class _Model:
    """Just enough of a runtime model for the batch source: its spec."""

    def __init__(self, *, seq_len: int = 4, vocab_size: int = 300) -> None:
        self.spec = ModelSpec("toy", num_layers=3, seq_len=seq_len, vocab_size=vocab_size, hidden_size=8,
                              num_heads=2, num_kv_heads=2, ffn_size=16)


def test_text_is_read_byte_level_in_stride_seq_len_windows_and_wraps(tmp_path):
    text = bytes(range(65, 65 + 21))                       # 21 tokens -> (21 - 1) // 4 = 5 windows
    (tmp_path / "t.txt").write_bytes(text)
    src = make_batch_source(data_spec(tmp_path / "t.txt"), _Model(), seed=0, global_batch_size=2)
    assert src.num_windows == 5 and not src.wraps(2) and src.wraps(3)
    x, y = src.batch(1)                                    # windows 2 and 3
    assert x.dtype == torch.int64 and x.shape == (2, 4)
    assert x.tolist() == [list(text[8:12]), list(text[12:16])]
    assert y.tolist() == [list(text[9:13]), list(text[13:17])]
    x2, _ = src.batch(2)                                   # windows 4 and 0: wraps around
    assert x2.tolist() == [list(text[16:20]), list(text[0:4])]
    again, _ = make_batch_source(data_spec(tmp_path / "t.txt"), _Model(), seed=9, global_batch_size=2).batch(1)
    assert torch.equal(again, x)                           # the order depends on the file only


def test_npy_rows_with_padding_give_ignore_index_targets(tmp_path):
    rows = np.array([[5, 6, 7, -1, -1], [1, 2, 3, 4, 5], [9, 8, -1, -1, -1]], dtype=np.int32)
    np.save(tmp_path / "r.npy", rows)
    src = make_batch_source(data_spec(tmp_path / "r.npy"), _Model(), seed=0, global_batch_size=2)
    assert src.num_windows == 3
    x, y = src.batch(1)                                    # rows 2 and 0 (wrapped)
    assert x.tolist() == [[9, 8, 0, 0], [5, 6, 7, 0]]
    assert y.tolist() == [[8, IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX], [6, 7, IGNORE_INDEX, IGNORE_INDEX]]


def test_npy_stream_equals_text_of_the_same_ids(tmp_path):
    ids = np.arange(40, dtype=np.int64) % 256
    np.save(tmp_path / "s.npy", ids)
    (tmp_path / "s.txt").write_bytes(bytes(ids.tolist()))
    a = make_batch_source(data_spec(tmp_path / "s.npy"), _Model(), seed=0, global_batch_size=3).batch(2)
    b = make_batch_source(data_spec(tmp_path / "s.txt"), _Model(), seed=0, global_batch_size=3).batch(2)
    assert all(torch.equal(u, v) for u, v in zip(a, b))


@pytest.mark.parametrize("case,needle", [
    ("missing", "--data file"),
    ("short", "is too short for one global batch: 8 tokens = 1 windows of 4 + 1, the plan's global batch needs 2 "
              "samples"),
    ("vocab", "is read byte-level (256 token ids) but the model's vocabulary has 100 ids"),
    ("big-id", "has token id 300 but the model's vocabulary has 300 ids"),
    ("row-length", "has rows of 3 tokens but toy takes samples of seq_len + 1 = 5"),
    ("no-target", "row 1 has no target token"),
    ("float", "holds a 1-D array of float64"),
])
def test_bad_data_files_are_refused_naming_the_numbers(tmp_path, case, needle):
    path, model = tmp_path / "d.txt", _Model()
    if case == "short":
        path.write_bytes(b"12345678")
    elif case == "vocab":
        path.write_bytes(b"x" * 100)
        model = _Model(vocab_size=100)
    elif case in ("big-id", "row-length", "no-target", "float"):
        path = tmp_path / "d.npy"
        arr = {"big-id": np.array([1, 2, 300, 4, 5, 6, 7, 8, 9, 10]),
               "row-length": np.ones((4, 3), dtype=np.int64),
               "no-target": np.array([[1, 2, 3, 4, 5], [7, -1, -1, -1, -1]]),
               "float": np.ones(20)}[case]
        np.save(path, arr)
    with pytest.raises(HppInputError) as err:
        make_batch_source(data_spec(path), model, seed=0, global_batch_size=2)
    msg = str(err.value)
    assert needle in msg and "\n" not in msg and msg.startswith("field 'data'"), msg


def test_synthetic_default_is_the_models_batches():
    src = make_batch_source(None, _Model(), seed=3, global_batch_size=5)
    x, y = src.batch(4)
    assert x.shape == y.shape == (5, 4) and src.num_windows is None and not src.wraps(10**6)
    assert torch.equal(x[:, 1:], y[:, :-1]) and torch.equal(make_batch_source(None, _Model(), seed=3,
                                                                              global_batch_size=5).batch(4)[0], x)


def test_peak_flops_table_and_mfu():
    assert peak_flops_per_s("A100-40", "bfloat16") == 312e12 and peak_flops_per_s("h200", "float32") == 67e12
    assert peak_flops_per_s("cpu", "float32") is None and peak_flops_per_s("V100-16", "float16") is None
    assert peak_flops_per_s("NVIDIA-H200", "bfloat16") == 989e12                 # gpu_check.sh's type name
    assert peak_flops_per_s("NVIDIA A100-SXM4-80GB", "float64") == 19.5e12
    assert peak_flops_per_s("NVIDIA H100 PCIe", "float32") is None               # other peaks than SXM5
    assert plan_peak_flops_per_s(["A100-40", "V100-16"], "float32") == pytest.approx(35.2e12)
    assert plan_peak_flops_per_s(["A100-40", "cpu"], "float32") is None
    rows = [{"step": 4, "time_s": 0.5, "loss": None, "flops": 2e12, "peak_memory_bytes": 7, "target_tokens": 64},
            {"step": 4, "time_s": 2.0, "loss": 1.25, "flops": 6e12, "peak_memory_bytes": 9, "lr": 1e-3},
            {"step": 4, "time_s": 1.0, "loss": 0.75, "flops": 0.0, "peak_memory_bytes": 3}]
    m = aggregate_step(rows, global_batch_size=8, seq_len=16, peak_flops_per_s=20e12)
    assert (m.step, m.step_time_s, m.loss, m.samples_per_s, m.tokens_per_s) == (5, 2.0, 2.0, 4.0, 64.0)
    assert m.mfu == pytest.approx(8e12 / 2.0 / 20e12) and m.peak_memory_bytes == 9
    assert m.peak_memory_bytes_per_rank == [7, 9, 3] and m.target_tokens == 64 and m.lr == 1e-3
    assert aggregate_step(rows, global_batch_size=8, seq_len=16, peak_flops_per_s=None).mfu is None


def test_monitor_reports_a_step_once_every_rank_has_written_it(tmp_path, capsys):
    out = tmp_path / "metrics.jsonl"
    mon = StepMonitor(tmp_path, world_size=2, steps=2, global_batch_size=4, seq_len=8, peak_flops_per_s=None,
                      jsonl=out, stream=None)
    line = lambda step, loss: json.dumps({"step": step, "time_s": 0.5, "loss": loss, "flops": 1.0,  # noqa: E731
                                          "peak_memory_bytes": 2**20, "target_tokens": 32, "lr": 0.1}) + "\n"
    (tmp_path / "rank0.steps.jsonl").write_text(line(0, None) + line(1, None)[:10])      # a half-written line
    assert mon.poll() == []
    with open(tmp_path / "rank1.steps.jsonl", "w") as fh:
        fh.write(line(0, 3.5))
    assert [m.loss for m in mon.poll()] == [3.5]
    with open(tmp_path / "rank0.steps.jsonl", "a") as fh:
        fh.write(line(1, None)[10:])
    with open(tmp_path / "rank1.steps.jsonl", "a") as fh:
        fh.write(line(1, 2.5))
    mon.close()
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and [r["loss"] for r in rows] == [3.5, 2.5]
    assert set(rows[0]) >= {"step", "step_time_s", "loss", "samples_per_s", "tokens_per_s", "mfu",
                            "peak_memory_bytes", "peak_memory_bytes_per_rank"}
    err = capsys.readouterr().err.splitlines()
    assert [x.split("  ")[0] for x in err if x.startswith("step ")] == ["step 1/2", "step 2/2"]
    assert "loss 3.5000" in err[0] and "8.0 samples/s" in err[0] and "64 tokens/s" in err[0] and "MFU n/a" in err[0]
