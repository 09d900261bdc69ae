"""Live metrics of ``hpp run``: one line per step on stderr and ``--metrics-jsonl``, and MFU.

While the launcher waits, :class:`StepMonitor` reads every rank's
``OUT_DIR/rank<r>.steps.jsonl`` (one JSON line per step, written by the worker:
``step``, ``time_s``, ``loss``, ``target_tokens``, ``flops``, ``peak_memory_bytes``,
``lr``) and, once every rank has reported a step, folds the ranks' lines into one
:class:`StepMetrics`:

- step = the 1-based global step (the ranks' lines count from 0): the number of optimizer
  steps done after it, as in the progress line ``step 3/20``, the summary's ``steps 4..8`` of a
  resumed run and the checkpoint ``step-K`` saved after it;
- step time [s] = the slowest rank's ``time_s`` (the step ends when the last rank's
  optimizer step does);
- loss = the sum of the ranks' non-null losses (each last-stage rank reports its
  pipeline's summed loss over the global batch's target-token count, so the sum is
  the global batch's mean loss per target token);
- samples/s = G / step time, tokens/s = G x seq_len / step time (input tokens,
  padding included, as torchtitan counts them);
- MFU = sum of the ranks' model FLOPs / step time / sum of the peak FLOP/s of the
  plan's devices (:func:`plan_peak_flops_per_s`); ``None`` (printed ``n/a``) when a
  device type has no entry in :data:`PEAK_FLOPS_PER_S` (CPUs, emulated types);
- peak memory = the largest ``peak_memory_bytes`` over the ranks (each rank's too).
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence, TextIO

from hpp.wording import count

__all__ = ["PEAK_FLOPS_PER_S", "peak_flops_per_s", "plan_peak_flops_per_s", "StepMetrics", "aggregate_step",
           "format_step", "StepMonitor"]

logger = logging.getLogger(__name__)

_T = 1e12
#: Dense peak FLOP/s per device type and training dtype (no sparsity). ``float32`` is the
#: non-tensor-core FP32 rate: PyTorch's default matmul precision ("highest") does not use TF32.
#: ``float64`` is the FP64 tensor-core rate where cuBLAS uses it (A100, Hopper). ``bfloat16``
#: (autocast) is the BF16 tensor-core rate with FP32 accumulation; on GPUs without BF16 units
#: (Volta, Turing) BF16 math runs on the FP32 units, so their FP32 rate is the peak.
PEAK_FLOPS_PER_S: dict[str, dict[str, float]] = {
    # NVIDIA A100 Tensor Core GPU datasheet (2021), SXM and PCIe alike: FP64 TC 19.5, FP32 19.5, BF16 TC 312 TFLOPS
    "a100-40": {"float64": 19.5 * _T, "float32": 19.5 * _T, "bfloat16": 312 * _T},
    "a100-80": {"float64": 19.5 * _T, "float32": 19.5 * _T, "bfloat16": 312 * _T},
    # NVIDIA V100 Tensor Core GPU datasheet (SXM2): FP64 7.8, FP32 15.7 TFLOPS; no BF16 units
    "v100-16": {"float64": 7.8 * _T, "float32": 15.7 * _T, "bfloat16": 15.7 * _T},
    # NVIDIA GH200 Grace Hopper Superchip datasheet (96 GB HBM3): FP64 TC 67, FP32 67, BF16 TC 989 TFLOPS (dense)
    "gh-96": {"float64": 67 * _T, "float32": 67 * _T, "bfloat16": 989 * _T},
    # NVIDIA H100 Tensor Core GPU datasheet (SXM5): FP64 TC 67, FP32 67, BF16 TC 989 TFLOPS (dense)
    "h100": {"float64": 67 * _T, "float32": 67 * _T, "bfloat16": 989 * _T},
    # NVIDIA H200 Tensor Core GPU datasheet (SXM): same compute as H100 SXM5
    "h200": {"float64": 67 * _T, "float32": 67 * _T, "bfloat16": 989 * _T},
    # NVIDIA Ampere GA102 whitepaper, appendix A (GeForce RTX 3090): FP32 35.6, BF16 TC with FP32 accumulate
    # 71 TFLOPS (dense); FP64 at 1/64 of FP32
    "rtx-3090": {"float64": 35.6 / 64 * _T, "float32": 35.6 * _T, "bfloat16": 71 * _T},
    # NVIDIA Turing TU104 whitepaper, appendix A (GeForce RTX 2080, reference clocks): FP32 10.1 TFLOPS, FP64 at
    # 1/32 of FP32; no BF16 units
    "rtx-2080": {"float64": 10.1 / 32 * _T, "float32": 10.1 * _T, "bfloat16": 10.1 * _T},
    # NVIDIA TITAN RTX specifications (Turing TU102): FP32 16.3 TFLOPS, FP64 at 1/32 of FP32; no BF16 units
    "titan-rtx": {"float64": 16.3 / 32 * _T, "float32": 16.3 * _T, "bfloat16": 16.3 * _T},
}


#: torch's device names (``torch.cuda.get_device_name``, spaces as ``-``), normalised, -> a table key
#: (H100 PCIe has other peaks than the SXM5 part of the table: it stays unknown).
_NAME_PATTERNS = ((re.compile(r"^gh200"), "gh-96"), (re.compile(r"^h200"), "h200"), (re.compile(r"^h100(?!.*pcie)"), "h100"),
                  (re.compile(r"^a100.*80"), "a100-80"), (re.compile(r"^a100"), "a100-40"),
                  (re.compile(r"^v100"), "v100-16"), (re.compile(r"^(geforce-)?rtx-3090$"), "rtx-3090"),
                  (re.compile(r"^(geforce-)?rtx-2080$"), "rtx-2080"), (re.compile(r"^titan-rtx$"), "titan-rtx"))


def _table_key(device_type: str) -> str | None:
    key = re.sub(r"[\s_]+", "-", device_type.strip().lower())
    if key in PEAK_FLOPS_PER_S:
        return key
    key = key.removeprefix("nvidia-").removeprefix("tesla-")
    if key in PEAK_FLOPS_PER_S:
        return key
    return next((k for pat, k in _NAME_PATTERNS if pat.search(key)), None)


def peak_flops_per_s(device_type: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of one device of ``device_type`` training in ``dtype``; ``None`` if unknown.

    ``device_type`` is a bundled type name (``A100-40``, case-insensitive) or torch's
    device name with spaces as dashes (``NVIDIA-H200``, ``NVIDIA-A100-SXM4-80GB``), as a
    cluster file written by hand may name its types.

    >>> peak_flops_per_s("A100-80", "bfloat16")
    312000000000000.0
    >>> peak_flops_per_s("NVIDIA-H200", "bfloat16")
    989000000000000.0
    >>> peak_flops_per_s("cpu", "float32") is None
    True
    """
    key = _table_key(device_type)
    return None if key is None else PEAK_FLOPS_PER_S[key].get(dtype)


def plan_peak_flops_per_s(device_types: Iterable[str], dtype: str) -> float | None:
    """Sum of :func:`peak_flops_per_s` over the plan's devices (one entry per device); ``None`` if any is unknown."""
    total = 0.0
    for t in device_types:
        peak = peak_flops_per_s(t, dtype)
        if peak is None:
            return None
        total += peak
    return total


@dataclass(frozen=True)
class StepMetrics:
    """One step of a run, over all ranks (see the module docstring); what ``--metrics-jsonl`` holds per line.

    ``step`` is the 1-based global step (the ranks' ``steps.jsonl`` lines count from 0).
    """

    step: int
    step_time_s: float
    loss: float | None
    samples_per_s: float
    tokens_per_s: float
    mfu: float | None
    flops: float | None
    peak_memory_bytes: int
    peak_memory_bytes_per_rank: list[int]
    target_tokens: int | None
    lr: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def aggregate_step(rows: Sequence[Mapping[str, Any]], *, global_batch_size: int, seq_len: int,
                   peak_flops_per_s: float | None) -> StepMetrics:
    """Fold every rank's line of one step (in rank order) into :class:`StepMetrics`.

    The rows' 0-based ``step`` becomes the 1-based global step (``step`` 0 is the first step).

    >>> rows = [{"step": 0, "time_s": 0.5, "loss": None, "flops": 1e9, "peak_memory_bytes": 10},
    ...         {"step": 0, "time_s": 1.0, "loss": 2.5, "flops": 3e9, "peak_memory_bytes": 30}]
    >>> m = aggregate_step(rows, global_batch_size=4, seq_len=8, peak_flops_per_s=8e9)
    >>> (m.step, m.step_time_s, m.loss, m.samples_per_s, m.tokens_per_s, m.mfu, m.peak_memory_bytes)
    (1, 1.0, 2.5, 4.0, 32.0, 0.5, 30)
    """
    time_s = max(float(r["time_s"]) for r in rows)
    losses = [float(r["loss"]) for r in rows if r.get("loss") is not None]
    flops_rows = [r.get("flops") for r in rows]
    flops = None if any(f is None for f in flops_rows) else float(sum(flops_rows))  # type: ignore[arg-type]
    mfu = (flops / time_s / peak_flops_per_s if flops is not None and peak_flops_per_s and time_s > 0 else None)
    mem = [int(r.get("peak_memory_bytes") or 0) for r in rows]
    tokens = [r.get("target_tokens") for r in rows if r.get("target_tokens") is not None]
    lrs = [r.get("lr") for r in rows if r.get("lr") is not None]
    rate = 1.0 / time_s if time_s > 0 else math.inf
    return StepMetrics(step=int(rows[0]["step"]) + 1, step_time_s=time_s, loss=sum(losses) if losses else None,
                       samples_per_s=global_batch_size * rate, tokens_per_s=global_batch_size * seq_len * rate,
                       mfu=mfu, flops=flops, peak_memory_bytes=max(mem), peak_memory_bytes_per_rank=mem,
                       target_tokens=int(tokens[0]) if tokens else None, lr=float(lrs[0]) if lrs else None)


def format_step(m: StepMetrics, *, steps: int) -> str:
    """The stderr line of one step.

    >>> m = StepMetrics(3, 0.25, 5.5, 64.0, 8192.0, None, None, 3 * 2**20, [2**20, 3 * 2**20], 8000, 1e-3)
    >>> format_step(m, steps=5)
    'step 3/5  loss 5.5000  time 0.2500 s  64.0 samples/s  8192 tokens/s  MFU n/a  peak mem 3.0 MiB (max of 2 ranks)'
    """
    loss = f"{m.loss:.4f}" if m.loss is not None else "n/a"
    mfu = f"{100 * m.mfu:.2f}%" if m.mfu is not None else "n/a"
    return (f"step {m.step}/{steps}  loss {loss}  time {m.step_time_s:.4f} s  {m.samples_per_s:.1f} samples/s  "
            f"{m.tokens_per_s:.0f} tokens/s  MFU {mfu}  peak mem {m.peak_memory_bytes / 2**20:.1f} MiB "
            f"(max of {count(len(m.peak_memory_bytes_per_rank), 'rank')})")


class StepMonitor:
    """Follow the ranks' ``rank<r>.steps.jsonl`` in ``out_dir``; report each step once every rank has it.

    Call :meth:`poll` while the ranks run (the launchers do, a few times a second) and
    :meth:`close` at the end. Each complete step is printed as one line on ``stream``
    (through tqdm's ``write``, above a progress bar when ``stream`` is a terminal) and
    appended to ``jsonl`` (opened for writing, truncated, at construction).

    Parameters
    ----------
    out_dir : Path
    world_size, steps, global_batch_size, seq_len : int
    peak_flops_per_s : float or None
        Sum over the plan's devices (:func:`plan_peak_flops_per_s`).
    jsonl : Path, optional
        ``--metrics-jsonl``.
    stream : text stream, optional
        Default ``sys.stderr``; ``quiet`` prints nothing.
    ranks : sequence of int, optional
        The plan ranks whose files are read (default ``range(world_size)``; one host of a
        multi-host run reads its own); ``world_size`` is then ``len(ranks)``.
    first_step : int
        The first global step of this run (a resumed run continues the numbering); a row of
        global step ``k`` is kept as ``k - first_step``, and ``steps`` counts this run's steps.
    """

    def __init__(self, out_dir: Path, *, world_size: int | None = None, steps: int, global_batch_size: int,
                 seq_len: int, peak_flops_per_s: float | None, jsonl: Path | None = None,
                 stream: TextIO | None = None, quiet: bool = False, ranks: Sequence[int] | None = None,
                 first_step: int = 0) -> None:
        self.ranks = tuple(range(world_size or 0) if ranks is None else ranks)
        self.first_step = int(first_step)
        world_size = len(self.ranks)
        steps = self.first_step + steps
        self.out_dir, self.world_size, self.steps = Path(out_dir), world_size, steps
        self._agg = dict(global_batch_size=global_batch_size, seq_len=seq_len, peak_flops_per_s=peak_flops_per_s)
        self._offsets = [0] * world_size
        self._partial = [""] * world_size
        self._rows: list[dict[int, dict[str, Any]]] = [{} for _ in range(world_size)]
        self.metrics: list[StepMetrics] = []
        self._stream = stream or sys.stderr
        self._quiet = quiet
        self._jsonl = open(jsonl, "w") if jsonl is not None else None     # noqa: SIM115 - closed in close()
        self._bar = None
        if not quiet:
            from tqdm import tqdm
            # disable=None: a bar only on a terminal; tqdm.write still prints the step lines elsewhere
            self._bar = tqdm(total=steps, unit="step", file=self._stream, disable=None, leave=False,
                             dynamic_ncols=True)
            if self.first_step:
                self._bar.update(self.first_step)

    def _read_new(self, index: int) -> None:
        """Read ``rank<ranks[index]>.steps.jsonl`` from where the last call stopped (complete lines only)."""
        path = self.out_dir / f"rank{self.ranks[index]}.steps.jsonl"
        try:
            with open(path) as fh:
                fh.seek(self._offsets[index])
                chunk = fh.read()
                self._offsets[index] = fh.tell()
        except FileNotFoundError:
            return
        text = self._partial[index] + chunk
        complete, _, self._partial[index] = text.rpartition("\n")
        for line in complete.splitlines():
            if line.strip():
                row = json.loads(line)
                self._rows[index][int(row["step"]) - self.first_step] = row

    def poll(self) -> list[StepMetrics]:
        """Read what the ranks wrote since the last call; report and return the steps now complete."""
        for r in range(self.world_size):
            self._read_new(r)
        done = []
        while True:
            k = len(self.metrics)
            if not all(k in rows for rows in self._rows):
                break
            m = aggregate_step([rows.pop(k) for rows in self._rows], **self._agg)
            self.metrics.append(m)
            done.append(m)
            self._emit(m)
        return done

    def _emit(self, m: StepMetrics) -> None:
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(m.to_dict()) + "\n")
            self._jsonl.flush()
        if self._quiet:
            return
        from tqdm import tqdm
        tqdm.write(format_step(m, steps=self.steps), file=self._stream)
        if self._bar is not None:
            self._bar.update(1)

    def close(self) -> None:
        """A last :meth:`poll`, then close the bar and the jsonl file."""
        try:
            self.poll()
        finally:
            if self._bar is not None:
                self._bar.close()
            if self._jsonl is not None:
                self._jsonl.close()

    def __enter__(self) -> "StepMonitor":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
