"""``hpp run`` on two "hosts" of one machine: two launchers, torchrun's static rendezvous on 127.0.0.1.

The plan's two pipelines each span both nodes of a two-node cluster of two device types
(node 0: ``cpu``, node 1: ``cpu-2x``; each launcher emulates its node's type), so every
step crosses hosts (p2p) and the block-wise gradient sync too. Plan ranks are not
torchrun's (host 0 runs plan ranks 0 and 2, host 1 runs 1 and 3). Each launcher verifies
its own ranks in float64; together they cover every parameter. The checkpoint the two
hosts saved then resumes on ONE host (a different number of hosts) exactly.

Bad input is refused before any process starts: one line, exit 2.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpp.plan_data import Pipeline, Plan, Stage, write_plan_json
from hpp.runtime.cli import run_main
from hpp.runtime.launch.processes import free_port
from hpp.runtime.models.gpt import GPT, ModelConfig
from hpp.runtime.models.stage import build_stage

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parents[1]
CFG = ModelConfig("micro", num_blocks=2, hidden_size=16, num_heads=2, seq_len=8, vocab_size=64)
MODEL = "tests.test_runtime_multihost:micro"
CLUSTER = {"format": "hpp-cluster", "version": 1, "name": "two-node-cpu",
           "device_types": {"cpu": {"memory_bytes": 4 * 2**30, "gpus_per_node": 2},
                            "cpu-2x": {"memory_bytes": 4 * 2**30, "gpus_per_node": 2, "slowdown": 2.0}},
           "nodes": [{"device_type": "cpu", "num_devices": 2, "intra_node_bandwidth_bytes_per_s": 1e9},
                     {"device_type": "cpu-2x", "num_devices": 2, "intra_node_bandwidth_bytes_per_s": 1e9}],
           "inter_node_bandwidth_bytes_per_s": 1e9}
NODE_TYPES = ("cpu", "cpu-2x")
VERIFY = re.compile(r"^verify: max \|difference\| (\S+) over (\d+) parameters .*: ok$", re.M)
LAUNCH_TIMEOUT_S = 150


def micro() -> GPT:
    """The test model (``--model tests.test_runtime_multihost:micro``): 4 layers, hidden 16."""
    return GPT(CFG)


def two_node_plan(path: Path) -> str:
    """Pipeline 0: [0,2) on device 0 (node 0), [2,4) on device 2 (node 1); pipeline 1: [0,3) on 1, [3,4) on 3.

    Plan ranks: 0 = device 0, 1 = device 2, 2 = device 1, 3 = device 3 (host 0: ranks 0, 2; host 1: 1, 3).
    """
    def st(lo: int, hi: int, d: int) -> Stage:
        return Stage(lo, hi, NODE_TYPES[d // 2], 1, (d,))
    plan = Plan("micro", 4, 6, (Pipeline((st(0, 2, 0), st(2, 4, 2)), 2, 4), Pipeline((st(0, 3, 1), st(3, 4, 3)), 1, 2)),
                sequence_length=8, cluster_ref=CLUSTER)
    write_plan_json(plan, path)
    return str(path)


def host_cmd(plan: str, node_rank: int, port: int, *extra: str, steps: int = 3) -> list[str]:
    """One host's ``hpp run`` (``python -m hpp.runtime.cli run``) command line."""
    return [sys.executable, "-m", "hpp.runtime.cli", "run", plan, "--steps", str(steps), "--model", MODEL,
            "--nnodes", "2", "--node-rank", str(node_rank), "--rdzv-endpoint", f"127.0.0.1:{port}",
            "--emulate-node-type", NODE_TYPES[node_rank], "--run-timeout", str(LAUNCH_TIMEOUT_S),
            "--group-timeout", "30", "--quiet", *extra]


def start_hosts(plan: str, *extra: str, steps: int = 3, per_host=lambda node_rank: ()) -> list[subprocess.Popen]:
    """Both hosts' launchers, started at once (own sessions, so a test can signal one alone);
    ``per_host(node_rank)``: that host's own extra flags."""
    port = free_port()
    return [subprocess.Popen(host_cmd(plan, r, port, *extra, *per_host(r), steps=steps), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
            for r in (0, 1)]


def finish(procs: list[subprocess.Popen], timeout_s: float = LAUNCH_TIMEOUT_S + 30) -> list[tuple[int, str, str]]:
    """Wait for every launcher: ``(exit code, stdout, stderr)`` each; kills them past the timeout."""
    out = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            p.kill()
            so, se = p.communicate()
        out.append((p.returncode, so, se))
    return out


@pytest.fixture(scope="module")
def two_host_run(tmp_path_factory):
    """Two launchers, 3 steps, --verify, --save: ``(results, checkpoint dir, plan path, wall s)``."""
    tmp = tmp_path_factory.mktemp("twohosts")
    plan = two_node_plan(tmp / "plan.json")
    t0 = time.perf_counter()
    res = finish(start_hosts(plan, "--verify", "--save", str(tmp / "ck"), "--log-dir", str(tmp / "logs")))
    return res, tmp / "ck", plan, time.perf_counter() - t0, tmp / "logs"


def test_two_hosts_run_a_plan_spanning_both_and_verify(two_host_run):
    res, ck, _plan, wall_s, logs = two_host_run
    print(f"two hosts: {wall_s:.1f} s wall")
    names = set()
    for node_rank, (code, out, err) in enumerate(res):
        assert code == 0, (node_rank, err[-2000:])
        m = VERIFY.search(out)
        assert m is not None and float(m.group(1)) <= 1e-9, out
        ranks = [int(line.split()[0]) for line in out.splitlines() if re.match(r"^\s+\d+\s+\d+\s+\d+\s", line)]
        assert ranks == ([0, 2] if node_rank == 0 else [1, 3]), out
        assert f"host {node_rank} of 2 (plan node {node_rank}) runs ranks" in out
        assert f"(last step; host {node_rank} of 2: this host's ranks' share of the global loss)" in out, out
        # ranks 0, 1 = pipeline 0 ([0, 2), [2, 4)), ranks 2, 3 = pipeline 1 ([0, 3), [3, 4)); blocks [0, 2) on
        # ranks 0+2 (host 0), [2, 3) on 1+2 (both hosts), [3, 4) on 1+3 (host 1): each host's ranks join two, whichever
        # host's rank leads them (led by the smallest rank, host 0 would count 1)
        assert "grad all-reduce  2 per step" in out and "those this host's ranks joined" in out, out
        names.add(int(m.group(2)))
    # host 0 holds layers 0-2 (26 tensors), host 1 layers 2-3 (15): together every parameter, layer 2 on both
    total = len(list(build_stage(micro(), 0, 4, seed=0).layer_parameters()))
    per_layer = [len(list(build_stage(micro(), lo, lo + 1, seed=0).layer_parameters())) for lo in range(4)]
    assert names == {sum(per_layer[:3]), sum(per_layer[2:])} and sum(per_layer) == total
    assert (ck / "step-3" / "complete").is_file() and not list(ck.glob(".tmp-*"))
    assert sorted(p.name for p in logs.glob("rank*.log")) == [f"rank{r}.log" for r in range(4)]
    assert "checkpoint of step 3 saved" in (logs / "rank0.log").read_text()      # the worker's INFO log kept


def test_a_host_that_dies_is_named_by_the_other_in_one_line(tmp_path):
    """SIGKILL of host 1's launcher mid-run: host 0 stops within seconds, exit 1, and says in one line (no torchrun
    stack) that node rank 1's ranks stopped (it used to blame its own rank 2 after 30 lines of torchrun's traceback)."""
    plan = two_node_plan(tmp_path / "plan.json")
    jsonl = tmp_path / "m.jsonl"
    procs = start_hosts(plan, steps=400, per_host=lambda r: ("--metrics-jsonl", str(jsonl)) if r == 0 else ())
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while not (jsonl.exists() and jsonl.read_text().strip()) and time.monotonic() < deadline \
            and procs[0].poll() is None:
        time.sleep(0.2)                                    # until host 0 finished a step: both hosts train
    os.killpg(procs[1].pid, 9)
    t0 = time.monotonic()
    (code, _out, err), _ = finish(procs)
    assert code == 1 and time.monotonic() - t0 < 60, err
    assert err.startswith("hpp run: error: run failed: the ranks of node rank 1 stopped: this host's ranks [0, 2] "
                          "lost their connection to them (") and len(err.strip().splitlines()) == 1, err


def test_two_host_checkpoint_resumes_on_one_host(two_host_run, tmp_path, capsys):
    """A different number of hosts: the 2-host checkpoint continues on one host (4 ranks), 2 more steps."""
    _res, ck, plan, _wall, _logs = two_host_run
    t0 = time.perf_counter()
    code = run_main([plan, "--steps", "2", "--model", MODEL, "--launcher", "fork", "--resume", str(ck), "--verify",
                     "--run-timeout", "120", "--group-timeout", "30", "--quiet"])
    out, err = capsys.readouterr()
    print(f"resume on one host: {time.perf_counter() - t0:.1f} s")
    assert code == 0, err
    m = VERIFY.search(out)
    total = len(list(build_stage(micro(), 0, 4, seed=0).layer_parameters()))
    assert m is not None and float(m.group(1)) <= 1e-9 and int(m.group(2)) == total, out
    assert "resumed          from" in out and "(steps 4..5)" in out


def test_raw_torchrun_lines_from_dry_run_run_both_hosts(tmp_path, capsys):
    """``--dry-run DIR`` checks the host, writes DIR/worker_config.json and prints the raw torchrun line; the two
    printed lines, run as they are, run the plan (each host's ranks write their results into its DIR)."""
    plan = two_node_plan(tmp_path / "plan.json")
    port = free_port()
    cmds = []
    for r in (0, 1):
        code = run_main([plan, "--steps", "2", "--model", MODEL, "--nnodes", "2", "--node-rank", str(r),
                         "--rdzv-endpoint", f"127.0.0.1:{port}", "--emulate-node-type", NODE_TYPES[r],
                         "--group-timeout", "30", "--dry-run", str(tmp_path / f"host{r}")])
        out = capsys.readouterr().out.splitlines()[0]
        assert code == 0 and f"-m torch.distributed.run --nnodes=2 --node-rank={r} --rdzv-backend=static " \
            f"--rdzv-endpoint=127.0.0.1:{port} --nproc-per-node=2 --max-restarts=0 -m hpp.runtime.launch.rank_entry " \
            f"{tmp_path / f'host{r}' / 'worker_config.json'} {tmp_path / f'host{r}'}" in out, out
        cmds.append(shlex.split(out))
    t0 = time.perf_counter()
    procs = [subprocess.Popen(c, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in cmds]
    res = finish(procs, timeout_s=LAUNCH_TIMEOUT_S)
    print(f"raw torchrun, two hosts: {time.perf_counter() - t0:.1f} s")
    assert [c for c, _o, _e in res] == [0, 0], [e[-1500:] for _c, _o, e in res]
    for r, ranks in ((0, (0, 2)), (1, (1, 3))):
        assert sorted(p.name for p in (tmp_path / f"host{r}").glob("rank*.json")) == [f"rank{k}.json" for k in ranks]
        steps = [json.loads(x)["step"] for x in (tmp_path / f"host{r}" / f"rank{ranks[1]}.steps.jsonl").read_text()
                 .splitlines()]
        assert steps == [0, 1]


def _refused(capsys, argv: list[str]) -> str:
    code = run_main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("hpp run: error: "), (code, err)
    return err


@pytest.mark.parametrize("flags, expected", [
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:29999", "--emulate-node-type", "cpu-2x"],
     "node 0 should have cpu devices (the plan's cluster) but this host has cpu-2x"),
    (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:29999", "--emulate-node-type", "cpu-2x:1"],
     "node 1 needs 2 cpu-2x devices (local GPU indices up to 1) but this host has 1"),
    (["--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", "127.0.0.1:29999", "--node-map", "1,0",
      "--emulate-node-type", "cpu-2x"], "node 0 should have cpu devices (the plan's cluster) but this host has cpu-2x"),
    (["--nnodes", "3", "--node-rank", "0", "--rdzv-endpoint", "127.0.0.1:29999"], "--nnodes 3, but the plan runs on 2"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:29999"], "node rank 2, but the plan runs on 2"),
    (["--nnodes", "2"], "--nnodes 2 without --rdzv-endpoint"),
    (["--nnodes", "2", "--rdzv-endpoint", "localhost"], "is not HOST:PORT"),
    (["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:29999", "--launcher", "fork"], "need the torchrun launcher"),
    (["--node-map", "1,0"], "--node-map needs several hosts"),
    (["--emulate-node-type", "cpu:2"], "this host (plan nodes 0,1) needs 4 cpu/cpu-2x devices"),
])
def test_bad_host_input_is_one_line_exit_2(tmp_path, capsys, flags, expected):
    plan = two_node_plan(tmp_path / "plan.json")
    err = _refused(capsys, [plan, "--steps", "1", "--model", MODEL, *flags])
    assert expected in err, err
    assert os.listdir(tmp_path) == ["plan.json"]


def test_hosts_started_with_different_flags_all_fail_naming_the_flag(tmp_path):
    """``--save DIR`` given to node rank 0 only: the ranks compare the flags that must agree at the rendezvous;
    every host prints one line naming the flag, exit 2, and no checkpoint is written (before: node rank 1 exited 0
    and node rank 0 failed, blaming a lost connection)."""
    plan = two_node_plan(tmp_path / "plan.json")
    t0 = time.monotonic()
    res = finish(start_hosts(plan, per_host=lambda r: ("--save", str(tmp_path / "ck")) if r == 0 else ()))
    assert time.monotonic() - t0 < LAUNCH_TIMEOUT_S
    for node_rank, (code, _out, err) in enumerate(res):
        lines = err.strip().splitlines()
        assert code == 2 and len(lines) == 1, (node_rank, code, err[-2000:])
        assert lines[0].startswith("hpp run: error: the hosts of this run were started with different flags: "
                                   f"--save differs (node rank 0: '{tmp_path / 'ck'}'; node rank 1: not given). "
                                   "Fix: start hpp run on every host with the same plan"), lines[0]
    assert not list((tmp_path / "ck").glob("step-*"))
