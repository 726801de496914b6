"""A fake testbed for real agent processes on loopback addresses (no root).

Every "host" process runs in this namespace, and each host has its own
127.0.0.x address, so the agents, servers, clients and connections the
replayers start are all real; `owned_processes` kills what a test left.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import networkx as nx
import pytest

from emu.live import state

REPO = Path(__file__).resolve().parents[2]


class LoopbackBed:
    def __init__(self, hosts, ecmp_seed: int = 1):
        graph = nx.Graph()
        for index, host in enumerate(hosts, start=2):
            graph.add_node(host, ip=f"127.0.0.{index}")
        self.fabric = SimpleNamespace(graph=graph)
        self.congestion = "cubic"
        self.ecmp_seed = ecmp_seed
        self.started = []           # (host, args) of every process, in order

    def popen(self, host, args, what, **kwargs):
        self.started.append((host, list(args)))
        proc = subprocess.Popen(args, cwd=REPO, **kwargs)
        state.record_pid(proc.pid, what)
        return proc

    def check_controller(self):
        pass


@pytest.fixture(autouse=True)
def owned_processes(tmp_path, monkeypatch):
    """Record the test's processes under its own directory, and kill them after."""
    monkeypatch.setattr(state, "RUN_DIR", str(tmp_path / "run"))
    monkeypatch.setattr(state, "OWNED_PATH", str(tmp_path / "run" / "owned.jsonl"))
    yield
    state.kill_owned()
