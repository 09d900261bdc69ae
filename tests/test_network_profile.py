"""``hpp profile-network`` on several "hosts" of one machine: launchers on 127.0.0.1, gloo, small messages.

Three launchers play the nodes of a cluster of two device types (``cpu:2``, ``cpu:2``, ``cpu-2x:2``), as the
multi-host runtime tests do: the cluster file node rank 0 writes loads back, holds every link the cluster
needs (intra-node per type, inter-node per pair of types with the 2 -> 2 aggregate), and ``hpp estimate``
prices a plan's gradient sync on those links (a control with other links prices it otherwise). A host that
never answers, or that stops answering mid-measurement, is named in one line (exit 2), no output file is
written and no process is left. Bad input is refused in one line before anything starts.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpp.cli import main
from hpp.formulation.collectives import ring_allreduce_s
from hpp.plan_data import Pipeline, Plan, Stage, write_plan_json
from hpp.profiles.cluster_format import load_cluster
from hpp.runtime.launch.processes import free_port

ROOT = Path(__file__).resolve().parents[1]
SIZES = "64KB,256KB,1MB"
TIMEOUT_S = 240


def _cmd(out: Path, port: int, nnodes: int, node_rank: int, node_type: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hpp.cli", "profile-network", "--out", str(out), "--sizes", SIZES,
            "--repeats", "3", "--nnodes", str(nnodes), "--node-rank", str(node_rank),
            "--rdzv-endpoint", f"127.0.0.1:{port}", "--emulate-node-type", node_type,
            "--rendezvous-timeout", "90", "--run-timeout", str(TIMEOUT_S), "--group-timeout", "30", *extra]


def _start(cmds: list[list[str]]) -> list[subprocess.Popen]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return [subprocess.Popen(c, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             start_new_session=True) for c in cmds]


def _finish(procs: list[subprocess.Popen], timeout_s: float = TIMEOUT_S + 60) -> list[tuple[int, str, str]]:
    out = []
    for p in procs:
        try:
            so, se = p.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            so, se = p.communicate()
        out.append((p.returncode, so, se))
    return out


def _ranks_alive() -> list[str]:
    """Command lines of live measuring ranks (``python -m hpp.runtime.network.measure``) on this machine."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "hpp.runtime.network.measure" in cmd and "torch.distributed.run" not in cmd:
            found.append(cmd)
    return found


def _no_ranks_left(within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while _ranks_alive() and time.monotonic() < deadline:
        time.sleep(0.5)
    return not _ranks_alive()


@pytest.fixture(scope="module")
def three_hosts(tmp_path_factory):
    """Three launchers (``cpu:2``, ``cpu:2``, ``cpu-2x:2``); node rank 0 with ``--json``."""
    tmp = tmp_path_factory.mktemp("netprof")
    out, port = tmp / "cluster.json", free_port()
    t0 = time.perf_counter()
    res = _finish(_start([_cmd(out, port, 3, 0, "cpu:2", "--json"), _cmd(out, port, 3, 1, "cpu:2"),
                          _cmd(out, port, 3, 2, "cpu-2x:2", "--quiet")]))
    print(f"three hosts: {time.perf_counter() - t0:.1f} s")
    return res, out


pytestmark = pytest.mark.distributed


def test_three_hosts_write_a_cluster_file_that_loads_back(three_hosts):
    res, out = three_hosts
    for node_rank, (code, _so, se) in enumerate(res):
        assert code == 0, (node_rank, se[-3000:])
    summary = json.loads(res[0][1])
    assert summary["out"] == str(out) and not list(out.parent.glob("*.tmp"))
    c = load_cluster(out)
    assert [(n.device_type, n.num_devices) for n in c.nodes] == [("cpu", 2), ("cpu", 2), ("cpu-2x", 2)]
    d = json.loads(out.read_text())
    assert d["version"] == 2 and sorted(d["links"]["intra_node"]) == ["cpu", "cpu-2x"]
    assert sorted(tuple(e["between"]) for e in d["links"]["inter_node"]) == [("cpu", "cpu"), ("cpu", "cpu-2x")]
    for i, j in ((0, 1), (0, 2), (1, 2)):                  # two nodes of 2 devices: one flow and 2 -> 2
        link = c.node_link(i, j)
        assert link.fit_gb_per_s is not None and link.max_bytes_per_s > 0 and link.latency_s >= 0
        assert [a.flows for a in link.aggregate] == [2] and link.aggregate[0].max_bytes_per_s > 0
    for t, n in (("cpu", 0), ("cpu-2x", 2)):
        assert c.nodes[n].intra_node.fit_gb_per_s is not None and not c.nodes[n].intra_node.aggregate
    # the summary is what the file says, and every host printed it
    by_pair = {tuple(lk["between"]): lk for lk in summary["links"]}
    assert by_pair[("cpu", "cpu-2x")]["max_bytes_per_s"] == c.node_link(0, 2).max_bytes_per_s
    assert by_pair[("cpu", "cpu-2x")]["aggregate"][0]["fit_gb_per_s"] == list(c.node_link(0, 2).aggregate[0].fit_gb_per_s)
    assert all(a["measured_s"] > 0 and a["predicted_s"] > 0 for lk in summary["links"] for a in lk["allreduce"])
    assert f"hpp profile-network: wrote {out} (3 hosts: cpu:2, cpu:2, cpu-2x:2; gloo;" in res[1][1]
    assert res[1][2].startswith("[hpp profile-network] node rank 1 (") and res[2][2] == ""      # node 2: --quiet


def _capture(argv: list[str]) -> tuple[int, str]:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(argv)
    return code, buf.getvalue()


def test_estimate_prices_the_sync_on_the_measured_links(three_hosts, tmp_path):
    """Two one-stage pipelines on node 0 (cpu) and node 2 (cpu-2x): their gradients cross the measured
    cpu - cpu-2x link, a ring of two, and ``hpp estimate`` prices it there; the same plan on the same cluster with
    that link replaced by 1 GB/s is priced otherwise (control)."""
    _res, out = three_hosts
    d = json.loads(out.read_text())
    pipes = (Pipeline((Stage(0, 6, "cpu", 1, (0,)),), 2, 8), Pipeline((Stage(0, 6, "cpu-2x", 1, (4,)),), 2, 8))
    plan = tmp_path / "plan.json"
    write_plan_json(Plan("gpt-tiny", 6, 16, pipes, sequence_length=128, profile_ref={"name": "gpt-tiny"},
                         cluster_ref=d), plan)
    code, text = _capture(["estimate", str(plan), "--json"])
    assert code == 0
    pred = json.loads(text)["predicted"]
    (block,) = pred["blocks"]
    link = load_cluster(out).node_link(0, 2)
    assert block["allreduce_s"] == pytest.approx(ring_allreduce_s(block["bytes"], 2, link), rel=1e-12)
    assert pred["grad_sync_s"] == pytest.approx(block["allreduce_s"], rel=1e-12)
    other = dict(d, links=dict(d["links"], inter_node=[{"between": e["between"], "link": 1e9}
                                                       for e in d["links"]["inter_node"]]))
    (tmp_path / "other.json").write_text(json.dumps(other))
    code, text = _capture(["estimate", str(plan), "--cluster", str(tmp_path / "other.json"), "--json"])
    assert code == 0
    assert json.loads(text)["predicted"]["grad_sync_s"] != pytest.approx(pred["grad_sync_s"], rel=1e-3)
    code, text = _capture(["estimate", str(plan), "--cluster", str(out), "--json"])
    assert code == 0 and json.loads(text)["predicted"]["grad_sync_s"] == pytest.approx(pred["grad_sync_s"])
    code, text = _capture(["plan", "--cluster", str(out), "--model", "gpt-tiny", "--gbs", "16", "--no-baselines",
                           "--json", "--quiet"])
    assert code == 0 and json.loads(text)["predicted"]["iteration_time_s"] > 0


def test_a_host_that_never_answers_is_named_in_one_line(tmp_path):
    """Node rank 1 of 2 never starts: node rank 0 says so after the rendezvous timeout, exit 2, one line; no file,
    no rank started. Alone, node rank 1 names node rank 0."""
    out, port = tmp_path / "c.json", free_port()
    ((code, so, se),) = _finish(_start([_cmd(out, port, 2, 0, "cpu:2", "--quiet", "--rendezvous-timeout", "2")]))
    assert code == 2 and so == "" and len(se.strip().splitlines()) == 1, se
    assert se.startswith(f"hpp profile-network: error: node rank 1 did not answer within 2 s at 127.0.0.1:{port} "
                         "(rendezvous; 1 host of 2 answered). Fix: start hpp profile-network on that host"), se
    ((code, so, se),) = _finish(_start([_cmd(out, free_port(), 2, 1, "cpu:2", "--quiet", "--rendezvous-timeout", "2")]))
    assert code == 2 and len(se.strip().splitlines()) == 1 and "node rank 0 did not answer within 2 s" in se, se
    assert not out.exists() and os.listdir(tmp_path) == [] and _no_ranks_left()


def test_hosts_given_different_flags_are_refused_by_the_roll_call(tmp_path):
    out, port = tmp_path / "c.json", free_port()
    res = _finish(_start([_cmd(out, port, 2, 0, "cpu:2", "--quiet"),
                          _cmd(out, port, 2, 1, "cpu:1", "--quiet", "--repeats", "4")]))
    for code, _so, se in res:
        assert code == 2 and len(se.strip().splitlines()) == 1, se
        assert "node rank 1 (" in se and "was started with --repeats 4, node rank 0 (" in se and "with 3" in se, se
    assert not out.exists()


def test_a_host_that_stops_answering_mid_measurement_is_named(tmp_path):
    """Node rank 1's launcher is killed (SIGKILL) while the ranks measure: node rank 0 ends within seconds, exit 2,
    one line naming node rank 1; no file, no rank left on either host."""
    out, port = tmp_path / "c.json", free_port()
    procs = _start([_cmd(out, port, 2, 0, "cpu:2", "--quiet", "--repeats", "400"),
                    _cmd(out, port, 2, 1, "cpu:2", "--quiet", "--repeats", "400")])
    deadline = time.monotonic() + 180
    while len(_ranks_alive()) < 4 and time.monotonic() < deadline and procs[0].poll() is None:
        time.sleep(0.5)
    time.sleep(3.0)                                         # the ranks measure
    os.kill(procs[1].pid, signal.SIGKILL)
    t0 = time.monotonic()
    (code, so, se), _ = _finish(procs)
    assert code == 2 and time.monotonic() - t0 < 20 and so == "", se          # not the 30 s group timeout
    assert len(se.strip().splitlines()) == 1, se
    assert se.startswith("hpp profile-network: error: node rank 1 (") and \
        "stopped answering during the measurements (its launcher went away)" in se, se
    assert not out.exists() and _no_ranks_left()


@pytest.mark.parametrize("flags, expected", [
    (["--sizes", "1MB"], "--sizes '1MB' gives 1 size"),
    (["--sizes", "64XB,1MB"], "'64XB' is not a message size"),
    (["--sizes", "0,1MB"], "'0' is not a message size"),
    (["--sizez", "1MB"], "unknown option --sizez (did you mean --sizes?)"),
    (["--nnodes", "2"], "--nnodes 2 without --rdzv-endpoint"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "127.0.0.1:1"], "--node-rank 2 of --nnodes 2"),
    (["--rdzv-endpoint", "nowhere"], "is not HOST:PORT"),
    (["--emulate-node-type", "cpu"], "gives no device count"),
    (["--emulate-node-type", "cpu:2", "--device", "cuda"], "plays a CPU node (gloo), but --device cuda"),
    (["--emulate-node-type", "cpu:1"], "the cluster has 1 device: nothing to measure"),
    (["--repeats", "0"], "--repeats 0"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, capsys, flags, expected):
    argv = ["profile-network", "--out", str(tmp_path / "c.json"), "--sizes", SIZES, "--emulate-node-type", "cpu:2",
            "--quiet"]
    for i in range(0, len(flags), 2):                      # the case's flags replace the defaults above
        if flags[i] in argv:
            del argv[argv.index(flags[i]):argv.index(flags[i]) + 2]
    try:
        code = main(argv + flags)
    except SystemExit as exc:                              # a parse error exits from argparse, with its one line
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith("hpp profile-network: error: "), err
    assert expected in err, err
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("device, expected", [
    ("cpu", "--device cpu without an emulated node. Fix: give --emulate-node-type TYPE:COUNT"),
    ("auto", "this host has no CUDA device and no emulated node. Fix: give --emulate-node-type TYPE:COUNT"),
])
def test_a_cpu_host_must_say_which_node_it_plays(tmp_path, capsys, monkeypatch, device, expected):
    monkeypatch.delenv("HPP_EMULATE_NODE_TYPE", raising=False)
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    assert main(["profile-network", "--out", str(tmp_path / "c.json"), "--sizes", SIZES, "--device", device]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


def test_an_existing_output_needs_force(tmp_path, capsys):
    out = tmp_path / "c.json"
    out.write_text("{}")
    assert main(["profile-network", "--out", str(out), "--sizes", SIZES, "--emulate-node-type", "cpu:2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"hpp profile-network: error: {out}: field '--out': exists. Fix: give a new path, or --force to "
                   "replace it") and out.read_text() == "{}"
