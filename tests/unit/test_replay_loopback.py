"""The replay engine with real iperf3 processes on loopback addresses (no root).

A fake testbed runs every "host" process in this namespace and gives each
host its own 127.0.0.x address, so the agents, one-off servers, reverse-mode
clients, dependencies, gates and callbacks are all exercised for real.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import networkx as nx
import pytest

from emu import state
from traffic.flows import Flow, FlowDag
from traffic.replay import Replayer

pytestmark = pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs iperf3")
REPO = Path(__file__).resolve().parents[2]


class LoopbackBed:
    def __init__(self, hosts):
        graph = nx.Graph()
        for index, host in enumerate(hosts, start=2):
            graph.add_node(host, ip=f"127.0.0.{index}")
        self.fabric = SimpleNamespace(graph=graph)

    def popen(self, host, args, what, **kwargs):
        proc = subprocess.Popen(args, cwd=REPO, **kwargs)
        state.record_pid(proc.pid, what)
        return proc

    def check_controller(self):
        pass


@pytest.fixture(autouse=True)
def run_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(state, "RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(state, "OWNED_PATH", str(tmp_path / "run" / "owned.jsonl"))
    yield
    state.kill_owned()


def test_dag_order_bytes_and_receiver_side_end(tmp_path):
    bed = LoopbackBed(["a", "b", "c"])
    dag = FlowDag([Flow("f1", "a", "b", 200_000),
                   Flow("f2", "b", "c", 100_000, after=("f1",)),
                   Flow("f3", "a", "c", 50_000, at_s=0.3)])
    results = {r.id: r for r in Replayer(bed, dag, 1000.0, tmp_path / "flows").run()}
    assert all(r.status == "ok" for r in results.values()), results
    for flow in dag.flows:
        assert results[flow.id].bytes_received >= flow.bytes, results[flow.id]
    assert results["f2"].start >= results["f1"].end, "f2 must wait for f1's end"
    assert results["f3"].start >= min(r.start for r in results.values()) + 0.25


def test_gate_holds_flows_until_on_done_releases_credit(tmp_path):
    bed = LoopbackBed(["p1", "p2", "p3", "d"])
    running, peak, log = set(), [0], []

    def gate(flow):
        if len(running) >= 1:          # one stream into d at a time
            return False
        running.add(flow.id)
        peak[0] = max(peak[0], len(running))
        return True

    def on_done(result):
        running.discard(result.id)
        log.append(result.id)

    dag = FlowDag([Flow(f"kv{i}", f"p{i}", "d", 300_000) for i in (1, 2, 3)])
    started = time.time()
    results = Replayer(bed, dag, 1000.0, tmp_path / "flows", gate=gate, on_done=on_done).run()
    assert all(r.status == "ok" for r in results), results
    assert peak[0] == 1 and sorted(log) == ["kv1", "kv2", "kv3"]
    spans = sorted((r.start, r.end) for r in results)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        assert start >= end - 0.05, f"gated flows overlapped: {spans}"
    assert time.time() - started < 60
