"""What torchrun starts on every host: ``python -m hpp.runtime.launch.rank_entry CONFIG.json OUT_DIR``.

``CONFIG.json`` holds the run's :class:`~hpp.runtime.config.RunConfig` and :class:`~hpp.runtime.config.RunFacts`
(:func:`hpp.runtime.launch.launchers.worker_config_json`). This entry point resolves what only this process knows,
its binding (:func:`hpp.runtime.launch.binding.worker_binding`): under torchrun across several hosts
(``nnodes > 1``, static rendezvous) local rank ``j`` of node rank ``R`` (torchrun's ``GROUP_RANK``) runs as the
binding's plan rank, not torchrun's ``RANK``, and a CUDA rank uses the local GPU its plan device has; then it runs
:func:`hpp.runtime.exec.worker.worker_main`. It dies with torchrun's agent (no orphan rank after a killed launcher).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

from hpp.errors import HppInputError
from hpp.plan_data import plan_from_dict
from hpp.runtime.exec.worker import worker_main
from hpp.runtime.launch.launchers import RANK_ENTRY, rank_binding, read_worker_config
from hpp.runtime.launch.processes import die_with_parent

__all__: list[str] = []          # an entry point: python -m hpp.runtime.launch.rank_entry


def _main(argv: list[str]) -> int:
    die_with_parent(signal.SIGKILL)                   # torchrun's agent gone (killed launcher): no orphan rank
    if len(argv) != 2:
        sys.stderr.write(f"usage: python -m {RANK_ENTRY} CONFIG.json OUT_DIR\n")
        return 2
    config, facts = read_worker_config(argv[0])
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    node_rank, local_rank = int(os.environ.get("GROUP_RANK", 0)), int(os.environ.get("LOCAL_RANK", rank))
    cuda_index = None
    if config.launch.nnodes > 1 or config.launch.device == "cuda":
        try:
            plan_rank, cuda_index = rank_binding(config, facts, local_rank=local_rank, node_rank=node_rank)
        except HppInputError as exc:
            sys.stderr.write(f"hpp worker: error: {exc}\n")
            return 2
        if config.launch.nnodes > 1:                  # torchrun's RANK is not the plan's rank across hosts
            rank, world_size = plan_rank, plan_from_dict(facts.plan).num_devices
    logging.basicConfig(level=os.environ.get("HPP_LOG_LEVEL", "WARNING"),
                        format=f"%(asctime)s %(name)s rank{rank}: %(message)s")
    return worker_main(config, facts, rank=rank, world_size=world_size, out_dir=Path(argv[1]),
                       node_rank=node_rank, cuda_index=cuda_index)


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
