"""The fake-tensor world in which the runtime's own code runs without memory
(for :mod:`hpp.runtime.profile.stage_memory`).

- :func:`fake_world`: a fake default process group (``torch.testing._internal.distributed.fake_pg``,
  backend ``"fake"``): collectives and point-to-point calls do nothing;
- :func:`build_fake_stage`: a stage module with fake parameters (FakeTensorMode), any size;
- :class:`StepTracker`: :class:`torch.distributed._tools.MemTracker` for a whole training step;
- :func:`warm_up_sharding`: fills DTensor's sharding caches before a measurement;
- :func:`isolated`: runs a measurement in a forked child, so no fake-world state (DTensor's
  caches, process-group names and counters) stays in the calling process;
  :func:`clear_dtensor_caches` for measurements run in place.
"""

from __future__ import annotations

import contextlib
import os
import pickle
from typing import Any, Callable, Iterator

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed._tools.mem_tracker import MemTracker

from hpp.errors import HppInputError
from hpp.runtime.models.api import RuntimeModel
from hpp.runtime.models.stage import build_stage, tie_within
from hpp.runtime.exec.training import TrainingConfig, autocast_context, lm_loss

__all__ = ["StepTracker", "fake_world", "isolated", "clear_dtensor_caches", "build_fake_stage", "warm_up_sharding"]


class StepTracker(MemTracker):
    """MemTracker for a whole training step: global peak only (fast), modules may run many times.

    MemTracker refuses a root module that runs forward twice (one iteration per
    tracker), but a pipeline stage runs forward once per micro-batch; the stale
    per-module statistics are dropped instead. Per-module local peaks are not
    kept (they cost a pass over every module per operator); a window peak is.
    """

    def __init__(self) -> None:
        super().__init__()
        self.window_peak = 0

    def current_bytes(self) -> int:
        return sum(snap.get("Total", 0) for snap in self._curr_mem_snap.values())

    def _update_peak_stats(self, peak_state: Any) -> None:  # noqa: ARG002 - MemTracker's signature
        total = 0
        for dev, dev_snap in self._curr_mem_snap.items():
            cur = dev_snap["Total"]
            total += cur
            if self._peak_mem.get(dev, 0) < cur:
                self._peak_mem[dev] = cur
                self._peak_mem_snap[dev] = dict(dev_snap)
        self.window_peak = max(self.window_peak, total)

    def _pre_fw_hook(self, module: torch.nn.Module, inputs: Any) -> None:
        name = self._mod_tracker.get_known_fqn(module)
        if module in self.memory_tracking and not self._mod_tracker.is_bw \
                and set(self._mod_tracker.parents) - {name} == {"Global"}:
            del self.memory_tracking[module]        # the next micro-batch of the same stage
        super()._pre_fw_hook(module, inputs)


@contextlib.contextmanager
def fake_world(world_size: int, rank: int) -> Iterator[None]:
    """A fake default process group (no communication) for the duration of the block.

    Raises
    ------
    HppInputError
        A process group is already initialised in this process.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    if dist.is_initialized():
        raise HppInputError("a process group is already initialised in this process", field="process_group",
                            fix="measure memory in a process of its own (hpp profile, not inside a running rank)")
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        clear_dtensor_caches()


def isolated(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a forked child process: its result (pickled back), or its exception re-raised.

    A fake world leaves process-wide state behind (DTensor's caches keyed by meshes,
    process-group names and counters of torch.distributed); later real process groups
    of this process, or ranks forked from it, would find it. A child takes it all
    away with it. Where ``os.fork`` is missing, ``fn`` runs here.
    """
    if not hasattr(os, "fork"):
        return fn(*args, **kwargs)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:                                        # the child: compute, send, exit without cleanup
        code = 0
        try:
            os.close(read_fd)
            torch.set_num_threads(1)
            try:
                payload = (True, fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - re-raised in the parent
                payload = (False, exc)
            try:
                data = pickle.dumps(payload)
            except Exception as exc:  # noqa: BLE001 - an exception that does not pickle
                data = pickle.dumps((False, RuntimeError(f"{type(payload[1]).__name__}: {payload[1]} ({exc})")))
            with os.fdopen(write_fd, "wb") as f:
                f.write(data)
        except BaseException:  # noqa: BLE001
            code = 1
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise RuntimeError(f"the memory measurement's child process died (wait status {status})")
    ok, value = pickle.loads(data)
    if ok:
        return value
    raise value


def clear_dtensor_caches() -> None:
    """Empty DTensor's process-wide caches (sharding propagation, redistribution plans, mesh topology).

    They are keyed by device meshes and shapes, so entries made on a fake world's meshes
    (fake tensors, fake ranks) would be found again by later real meshes of the same ranks,
    in this process or in ranks forked from it, with the fake world's sizes.
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor import _redistribute
    from torch.distributed.tensor._collective_utils import MeshTopoInfo
    from torch.distributed.tensor._sharding_prop import ShardingPropagator

    propagator = DTensor._op_dispatcher.sharding_propagator
    propagator.propagate_op_sharding.cache_clear()
    ShardingPropagator._propagate_tensor_meta_cached.cache_clear()
    _redistribute._gen_transform_infos.cache_clear()
    _redistribute.clear_redistribute_planner_cache()
    MeshTopoInfo.build_from_mesh.cache_clear()


def build_fake_stage(model: RuntimeModel, lo: int, hi: int, *, fake_mode: FakeTensorMode, seed: int = 0,
                     recompute: str = "none") -> torch.nn.Module:
    """The runtime's stage module of layers ``[lo, hi)`` with fake fp32 parameters on ``cpu``.

    Built on the meta device (initialisation draws nothing), then given fake storage
    inside ``fake_mode`` (``.to()`` of fake parameters is not supported by torch, ``to_empty``
    is, but unties tied parameters: a stage holding both ends of a pair gets them tied again).
    """
    with torch.device("meta"):
        module = build_stage(model, lo, hi, seed=seed, dtype=torch.float32, device="meta", recompute=recompute)
    with fake_mode:
        module.to_empty(device="cpu")
    tie_within({int(k): layer for k, layer in module.layers.items()}, tuple(model.tied_parameters()))
    return module


def warm_up_sharding(module: torch.nn.Module, model: RuntimeModel, *, micro_batch_size: int, is_first: bool,
                     is_last: bool, dtype: str, input_dtype: torch.dtype | None = None) -> None:
    """One forward and backward of a TP-sharded module as the step runs them, untracked, in the fake mode.

    DTensor computes each operator's sharding on its first call (per shapes and strides)
    with fake tensors of the active fake mode, which MemTracker would count as memory;
    later calls hit its cache. Warming the cache up first keeps those tensors out of the
    measurement (without it, the first backward of a TP-2 OPT-350 block shows 64 MiB more
    than the next ones). Parameter gradients are zeroed in place afterwards.
    """
    ms, tcfg = model.spec, TrainingConfig(dtype=dtype)
    b, s = micro_batch_size, ms.seq_len
    x = (torch.zeros(b, s, dtype=torch.long) if is_first else
         torch.zeros(b, s, ms.hidden_size, dtype=input_dtype or tcfg.activation_dtype, requires_grad=True))
    with autocast_context(tcfg, "cpu"):
        y = module(x)
    if is_last:
        lm_loss(y.to(tcfg.logits_dtype), torch.zeros(b, s, dtype=torch.long), denominator=b * s).backward()
    else:
        y.backward(torch.ones_like(y))
    for p in module.parameters():
        if p.grad is not None:
            p.grad.zero_()
