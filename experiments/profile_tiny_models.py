"""Regenerate the bundled CPU profiles of the tiny runtime models (opt-tiny, gpt-neo-tiny, llama-tiny).

    python experiments/profile_tiny_models.py [--models llama-tiny,...] [--repeats 20] [--warmup 5]

Per model: ``hpp profile``'s measurement (:func:`hpp.runtime.profiler.profile_model`) on
one CPU thread at micro-batch sizes 1, 2, 4 (device type ``cpu``), the emulated 2x
slower type ``cpu-2x`` (:func:`~hpp.runtime.profiler.scale_profile`, as cpu-hetero-4's
gpt-tiny profile), and TP degree 2 entries DERIVED from the TP 1 ones (not measured):

- forward, backward and optimizer seconds = TP 1 / 2 (perfect split; the TP
  all-reduces are not priced, so TP 2 is optimistic);
- param_bytes = the bytes one TP rank holds under the model's ``tp_plan(layer, 2)``
  (colwise weight and bias, rowwise weight, vocabulary tables halved; norms,
  position tables and rowwise biases whole);
- activation_bytes = TP 1's (an upper bound), output_bytes = TP 1's (a stage sends the
  whole hidden state).

Each derived entry says so in its note. Writes ``hpp/profiles/data/profile-<model>.json``
(``--out-dir`` to write elsewhere) and prints one JSON line per model.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import sys
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hpp.profiles.model_profile import LayerProfile, ModelProfile, save_profile  # noqa: E402
from hpp.runtime.profiler import profile_model, scale_profile  # noqa: E402
from hpp.runtime.zoo import load_runtime_model  # noqa: E402

log = logging.getLogger("profile_tiny_models")
TINY_MODELS = ("opt-tiny", "gpt-neo-tiny", "llama-tiny")
DERIVED_TP = 2


def tp_param_bytes(model, index: int, tp_degree: int, *, dtype: torch.dtype = torch.float32) -> int:
    """Bytes of layer ``index``'s parameters on ONE rank under ``model.tp_plan(index, tp_degree)``."""
    layer = model.build_layer(index, seed=0, dtype=dtype)
    plan = model.tp_plan(index, tp_degree)
    total = 0
    for name, p in layer.named_parameters():
        owner, _, leaf = name.rpartition(".")
        style = plan.get(owner)
        sharded = style is not None and not (leaf == "bias" and style in ("rowwise", "embedding"))
        total += p.numel() * p.element_size() // (tp_degree if sharded else 1)
    return total


def derive_tp(profile: ModelProfile, model, tp_degree: int) -> ModelProfile:
    """Add TP ``tp_degree`` entries derived from every TP 1 entry (module docstring)."""
    params = tuple(tp_param_bytes(model, l, tp_degree) for l in range(profile.num_layers))
    entries = dict(profile.entries)
    for e in [e for e in profile.entries.values() if e.tp_degree == 1]:
        d = replace(e, tp_degree=tp_degree, forward_s=tuple(t / tp_degree for t in e.forward_s),
                    backward_s=tuple(t / tp_degree for t in e.backward_s),
                    optimizer_s=tuple(t / tp_degree for t in e.optimizer_s), param_bytes=params,
                    note=f"derived, not measured: TP {tp_degree} = TP 1 ({e.device_type}) forward, backward and "
                         f"optimizer seconds / {tp_degree} (TP all-reduces not priced), param_bytes = one rank's "
                         f"share under the model's tp_plan, activation_bytes and output_bytes = TP 1's "
                         f"(experiments/profile_tiny_models.py)")
        entries[d.key] = d
    return replace(profile, entries=entries,
                   meta=dict(profile.meta, derived_tp={"degree": tp_degree, "rule": "seconds / TP; param_bytes "
                             "from tp_plan; activation and output bytes as TP 1"}))


def make_profile(name: str, *, sizes: Sequence[int], repeats: int, warmup: int) -> ModelProfile:
    model = load_runtime_model(name)
    prof = profile_model(name, device="cpu", micro_batch_sizes=sizes, warmup=warmup, repeats=repeats,
                         num_threads=1)
    prof = scale_profile(prof, {"cpu-2x": 2.0}, base_device_type="cpu")
    prof = derive_tp(prof, model, DERIVED_TP)
    load = prof.meta["load_average"]
    source = (f"measured on this project's CPU host by experiments/profile_tiny_models.py (hpp.runtime.profiler, "
              f"{repeats} repeats after {warmup} warm-up): machine {platform.node()!r} ({platform.machine()}, "
              f"{load['cores']} cores, 1-minute load {load['before']} before and {load['after']} after, other jobs "
              f"running), torch {torch.__version__}, {prof.meta['date']}; CPU time of one compute thread; cpu-2x = "
              f"cpu x 2 (emulated); TP {DERIVED_TP} entries derived from TP 1 (see their notes). The bundled CPU "
              f"profile of {name} (hpp.runtime.hf_models).")
    return replace(prof, source=source, licence="MIT (this project)")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="profile_tiny_models", description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(TINY_MODELS))
    p.add_argument("--micro-batch-sizes", default="1,2,4")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out-dir", type=Path, default=ROOT / "hpp" / "profiles" / "data")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    sizes = tuple(int(x) for x in args.micro_batch_sizes.split(","))
    for name in args.models.split(","):
        prof = make_profile(name, sizes=sizes, repeats=args.repeats, warmup=args.warmup)
        out = args.out_dir / f"profile-{name}.json"
        save_profile(prof, out)
        e: LayerProfile = prof.entries[("cpu", 1, 1)]
        print(json.dumps({"model": name, "out": str(out), "num_layers": prof.num_layers,
                          "entries": len(prof.entries), "cpu_mb1_fwd_bwd_ms": round(
                              1e3 * (sum(e.forward_s) + sum(e.backward_s)), 3)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
