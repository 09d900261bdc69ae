#!/usr/bin/env bash
# The closed loop on one CUDA GPU for real architectures, and the runtime's update there against one process.
#
#   experiments/gpu_check.sh OUT_DIR                 (torch with CUDA and this package installed)
#   HPP_GPU_CHECK_DEVICE=cpu experiments/gpu_check.sh OUT_DIR   (smoke test of this script on a CPU: tiny models)
#
# For each model (opt-350 and gpt-neo-2.7 at their real architecture, Hugging Face classes; on the CPU smoke test
# opt-tiny and llama-tiny):
# 1. hpp profile --dtype bfloat16: the layers timed on the device under bf16 autocast, and the runtime step's
#    memory per layer (FakeTensor + MemTracker);
# 2. hpp plan: a one-device cluster of that type (one pipeline, one stage, TP 1);
# 3. hpp run --dtype bfloat16 (NCCL, torchrun): measured vs predicted iteration time, tokens/s, MFU, and the
#    measured peak memory (torch.cuda.max_memory_allocated; max_memory_reserved too) vs the predicted peak.
# Then hpp run --verify (float64, 3 steps) of gpt-tiny's and llama-tiny's plans on the device against single-process
# training. Writes profile-*.json, cluster.json, plan-*.json, run-*.json, verify-*.txt and summary.txt under OUT_DIR.
set -euo pipefail
out=${1:?usage: experiments/gpu_check.sh OUT_DIR}
device=${HPP_GPU_CHECK_DEVICE:-cuda}
if [ "$device" = cuda ]; then
    if ! python3 -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
        echo "gpu_check: error: no CUDA GPU visible to torch (torch.cuda.is_available() is False). Fix: run on a host with a CUDA GPU and a CUDA build of torch" >&2
        exit 2
    fi
    # the device type as hpp run's binding names this GPU (bundled rules, or $HPP_DEVICE_TYPES_FILE's)
    read -r name mem < <(python3 -c "import torch; from hpp.runtime.launch.binding import detect_node_devices; \
print(detect_node_devices().types[0], torch.cuda.get_device_properties(0).total_memory)")
    if [ "$name" = None ]; then
        echo "gpu_check: error: no device-type rule names this GPU ($(python3 -c "import torch; print(torch.cuda.get_device_name(0))")). Fix: add one in a JSON file named by HPP_DEVICE_TYPES_FILE (docs/RUNTIME.md)" >&2
        exit 2
    fi
    models=${HPP_GPU_CHECK_MODELS:-"opt-350 gpt-neo-2.7"}   # llama-3-8 with AdamW needs > 1 H200 (216 GiB in bf16)
    sizes=1,2,4; gbs=16; steps=6; warm=2
else
    name=cpu; mem=$((8 * 2**30)); models=${HPP_GPU_CHECK_MODELS:-"opt-tiny llama-tiny"}
    sizes=1,2; gbs=4; steps=3; warm=1
fi
mkdir -p "$out"
echo "device: $name, $mem bytes" | tee "$out/summary.txt"
cat > "$out/cluster.json" <<EOF
{"format": "hpp-cluster", "version": 1, "name": "one-$name",
 "device_types": {"$name": {"memory_bytes": $mem, "gpus_per_node": 1}},
 "nodes": [{"device_type": "$name", "num_devices": 1,
            "intra_node_bandwidth_bytes_per_s": {"max_bytes_per_s": 4.5e11, "latency_s": 5e-06}}],
 "inter_node_bandwidth_bytes_per_s": {"max_bytes_per_s": 5e10, "latency_s": 1e-05}}
EOF
for m in $models; do
    hpp profile --model "$m" --device "$device" --dtype bfloat16 --micro-batch-sizes "$sizes" --device-type "$name" \
        --repeats 5 --warmup 2 --out "$out/profile-$m.json"
    hpp plan --cluster "$out/cluster.json" --profile "$out/profile-$m.json" --gbs "$gbs" --max-tp 1 --no-baselines \
        --quiet --out "$out/plan-$m.json"
    hpp run "$out/plan-$m.json" --device "$device" --dtype bfloat16 --steps "$steps" --warmup-steps "$warm" \
        --quiet --json > "$out/run-$m.json"
    python3 - "$m" "$out/run-$m.json" <<'EOF' | tee -a "$out/summary.txt"
import json, sys
model, rep = sys.argv[1], json.load(open(sys.argv[2]))
m, p = rep["measured"], rep["predicted"]
t, tp = m["iteration_time_s"], p.get("iteration_time_s")
ranks = rep["ranks"]
alloc = max(r["peak_memory_bytes"] for r in ranks)
reserved = max((r.get("peak_memory_reserved_bytes") or 0) for r in ranks)
pred_mem = p.get("peak_memory_bytes")
mfu = m.get("mfu")
print(f"{model}: iteration measured {t:.4f} s, predicted {tp:.4f} s (measured / predicted {t / tp:.3f}); "
      f"{m['throughput_tokens_per_s']:.0f} tokens/s; MFU {'n/a' if mfu is None else f'{mfu:.3f}'}; "
      f"peak memory allocated {alloc / 2**30:.2f} GiB vs predicted {pred_mem / 2**30:.2f} GiB "
      f"(measured / predicted {alloc / pred_mem:.3f}), reserved {reserved / 2**30:.2f} GiB")
EOF
done

# the update on the device equals single-process training (float64; tiny models: the real ones do not fit twice).
# gpt-tiny is float64 throughout; llama-tiny's RMSNorm (HF's code) computes in float32 even in a float64 run, so its
# reference step runs on the same device (rank 0's) to compare like with like.
for m in gpt-tiny llama-tiny; do
    hpp profile --model "$m" --device "$device" --micro-batch-sizes 1,2 --device-type "$name" --repeats 2 --warmup 1 \
        --no-memory-terms --no-time-terms --out "$out/profile-verify-$m.json" > /dev/null
    hpp plan --cluster "$out/cluster.json" --profile "$out/profile-verify-$m.json" --gbs 4 --max-tp 1 --no-baselines \
        --quiet --out "$out/plan-verify-$m.json"
    hpp run "$out/plan-verify-$m.json" --device "$device" --steps 3 --verify --quiet > "$out/verify-$m.txt" 2>&1 \
        || { cat "$out/verify-$m.txt" >&2; exit 1; }
    grep "^verify" "$out/verify-$m.txt" | sed "s/^/$m: /" | tee -a "$out/summary.txt"
done
