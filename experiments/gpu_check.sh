#!/usr/bin/env bash
# The closed loop on one CUDA GPU, and the runtime's update on it against single-process training.
#
#   experiments/gpu_check.sh OUT_DIR        (torch with CUDA and this package installed; about 3 min on an H200)
#
# 1. hpp profile: OPT-350's layers (runtime model opt-350, float32) measured on the GPU at micro-batch 1-8;
# 2. hpp plan: a one-GPU cluster of that type, planned with that profile (one pipeline, one stage);
# 3. hpp run --device cuda: the plan executed (NCCL, torchrun): measured vs predicted iteration time;
# 4. the update check: a micro model trained 3 steps by one CUDA rank (float64) against train_reference
#    (one CPU process, float64), max |parameter difference| (the CPU tests check multi-rank plans).
# Writes profile.json, cluster.json, plan.json, run.json and update.json under OUT_DIR.
set -euo pipefail
out=${1:?usage: experiments/gpu_check.sh OUT_DIR}
if ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu_check: error: no CUDA GPU visible to torch (torch.cuda.is_available() is False). Fix: run on a host with a CUDA GPU and a CUDA build of torch" >&2
    exit 2
fi
mkdir -p "$out"
read -r name mem < <(python3 -c "import torch; p = torch.cuda.get_device_properties(0); print(p.name.replace(' ', '-'), p.total_memory)")
echo "GPU: $name, $mem bytes"

hpp profile --model opt-350 --device cuda --micro-batch-sizes 1,2,4,8 --device-type "$name" --out "$out/profile.json"

cat > "$out/cluster.json" <<EOF
{"format": "hpp-cluster", "version": 1, "name": "one-$name",
 "device_types": {"$name": {"memory_bytes": $mem, "gpus_per_node": 1}},
 "nodes": [{"device_type": "$name", "num_devices": 1,
            "intra_node_bandwidth_bytes_per_s": {"max_bytes_per_s": 4.5e11, "latency_s": 5e-06}}],
 "inter_node_bandwidth_bytes_per_s": {"max_bytes_per_s": 5e10, "latency_s": 1e-05}}
EOF
hpp plan --cluster "$out/cluster.json" --profile "$out/profile.json" --gbs 32 --max-tp 1 --no-baselines \
    --out "$out/plan.json"
hpp run "$out/plan.json" --device cuda --steps 6 --warmup-steps 2 --json > "$out/run.json"
python3 - "$out/run.json" <<'EOF'
import json, sys
rep = json.load(open(sys.argv[1]))
m, p = rep["measured"]["iteration_time_s"], rep["predicted"].get("iteration_time_s")
print(f"hpp run on the GPU: measured {m:.4f} s per iteration, predicted {p:.4f} s "
      f"(measured / predicted {m / p:.3f}); {rep['measured']['throughput_samples_per_s']:.1f} samples/s")
EOF

python3 - "$out" <<'EOF'
import json, sys
from dataclasses import asdict
from pathlib import Path
import torch
from hpp.plan import Pipeline, Plan, Stage, plan_to_dict
from hpp.runtime.launch import launch_forked
from hpp.runtime.models import ModelConfig
from hpp.runtime.reference import max_param_difference, train_reference
from hpp.runtime.worker import WorkerConfig

out = Path(sys.argv[1])
cfg_m = ModelConfig("micro", num_blocks=4, hidden_size=32, num_heads=2, seq_len=16, vocab_size=64)
plan = Plan("micro", 6, 13, (Pipeline((Stage(0, 6, "cuda", 1, (0,), "none"),), 3, 13, "1F1B"),))
cfg = WorkerConfig(plan=plan_to_dict(plan), model=asdict(cfg_m), steps=3, dtype="float64", save_params=True,
                   timeout_s=60, lr=0.5, device="cuda")
res = launch_forked(cfg, world_size=1, out_dir=out, timeout_s=180)
assert res.ok, res.failure_message()
params = [torch.load(out / "rank0.pt", map_location="cpu")]
ref = train_reference(cfg_m, global_batch_size=13, steps=3, dtype=torch.float64, lr=0.5)
worst, nan, n = max_param_difference(params, ref)
json.dump({"max_abs_difference": worst, "nan": nan, "parameters": n}, open(out / "update.json", "w"))
print(f"update check: {n} parameters after 3 steps on the GPU vs one CPU process: max |difference| {worst:.3g}"
      f"{' (NaN!)' if nan else ''}")
EOF
