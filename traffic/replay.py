"""Replay a flow DAG on Mininet hosts with iperf3 and record every flow.

Each flow is *armed* ahead of time (an iperf3 server on the destination and a
client on the source, both started and waiting), and *fired* when its start
condition holds, by one line on the client's stdin.  Arming the next wave
while the current one runs keeps process start-up off the critical path.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Dict, List, Optional

from traffic.flows import Flow, FlowDag

BASE_PORT = 5201
MIN_FLOW_TIMEOUT_S = 30.0


@dataclass
class FlowResult:
    id: str
    src: str
    dst: str
    bytes: int
    step: Optional[int]
    group: str
    start: float = 0.0
    end: float = 0.0
    bytes_received: int = 0
    goodput_mbps: float = 0.0
    retransmits: int = 0
    status: str = "pending"
    error: str = ""

    @property
    def duration_s(self) -> float:
        return max(0.0, self.end - self.start)

    def to_dict(self) -> dict:
        return dict(asdict(self), duration_s=self.duration_s)


@dataclass
class _Armed:
    flow: Flow
    server: object
    client: object
    lines: "queue.Queue[str]" = field(default_factory=queue.Queue)
    fired_at: float = 0.0


def _pump(stream, lines: "queue.Queue[str]") -> None:
    for line in stream:
        lines.put(line)
    lines.put("")


class Replayer:
    def __init__(self, bed, dag: FlowDag, expected_mbps: float,
                 progress: Optional[Callable[[int, int], None]] = None):
        self.bed = bed
        self.dag = dag
        self.expected_mbps = expected_mbps
        self.progress = progress
        self._ports: Dict[str, int] = {}

    def _next_port(self, host: str) -> int:
        port = self._ports.get(host, BASE_PORT)
        self._ports[host] = port + 1
        return port

    def _ip(self, host: str) -> str:
        return self.bed.fabric.graph.nodes[host]["ip"]

    def _arm(self, flow: Flow) -> _Armed:
        """Server on the source, reverse-mode client on the destination.

        In reverse mode the client is the receiver and stops when it has
        *received* ``bytes``, so a flow's end is the receiver's last byte; a
        forward-mode client would stop once the bytes sat in its own socket
        buffer, before the network carried them.
        """
        port = self._next_port(flow.src)
        python = sys.executable
        server = self.bed.popen(
            flow.src, [python, "-m", "traffic.iperf_worker", "server", "--bind",
                       self._ip(flow.src), "--port", str(port)],
            f"iperf3 server {flow.id}", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        args = [python, "-m", "traffic.iperf_worker", "client", "--dst", self._ip(flow.src),
                "--port", str(port), "--bytes", str(flow.bytes), "--reverse", "--wait-go"]
        if flow.rate_mbps:
            args += ["--rate-mbps", str(flow.rate_mbps)]
        client = self.bed.popen(flow.dst, args, f"iperf3 client {flow.id}",
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True)
        armed = _Armed(flow, server, client)
        threading.Thread(target=_pump, args=(client.stdout, armed.lines), daemon=True).start()
        return armed

    def _timeout_s(self, flow: Flow) -> float:
        return max(MIN_FLOW_TIMEOUT_S, 10 * flow.bytes * 8 / (self.expected_mbps * 1e6))

    def run(self) -> List[FlowResult]:
        flows = self.dag.by_id()
        order = [f.id for f in self.dag.topological_order()]
        results = {fid: FlowResult(fid, f.src, f.dst, f.bytes, f.step, f.group)
                   for fid, f in flows.items()}
        armed: Dict[str, _Armed] = {}
        running: Dict[str, _Armed] = {}
        fired, done = set(), set()
        t0 = time.time()
        self.t0 = t0
        try:
            while len(done) < len(flows):
                self.bed.check_controller()
                # Arm every flow whose dependencies have all been fired.
                for fid in order:
                    if fid not in armed and fid not in fired and \
                            all(d in fired for d in flows[fid].after):
                        armed[fid] = self._arm(flows[fid])
                now = time.time()
                for fid in list(armed):
                    flow = flows[fid]
                    if fid in fired or not all(d in done for d in flow.after):
                        continue
                    ready_at = max([results[d].end for d in flow.after] or [t0]) + flow.at_s
                    if now >= ready_at:
                        entry = armed.pop(fid)
                        entry.client.stdin.write("go\n")
                        entry.client.stdin.flush()
                        entry.fired_at = now
                        running[fid] = entry
                        fired.add(fid)
                for fid in list(running):
                    entry = running[fid]
                    finished = self._collect(entry, results[fid])
                    if not finished and now - entry.fired_at > self._timeout_s(entry.flow):
                        results[fid].status = "timeout"
                        results[fid].error = f"no result after {self._timeout_s(entry.flow):.0f} s"
                        results[fid].start, results[fid].end = entry.fired_at, now
                        finished = True
                    if finished:
                        self._reap(entry)
                        del running[fid]
                        done.add(fid)
                        if self.progress:
                            self.progress(len(done), len(flows))
                time.sleep(0.002)  # poll period of the scheduler loop
        finally:
            for entry in list(armed.values()) + list(running.values()):
                self._reap(entry)
        return [results[fid] for fid in order]

    def _collect(self, entry: _Armed, result: FlowResult) -> bool:
        while True:
            try:
                line = entry.lines.get_nowait()
            except queue.Empty:
                return False
            if not line:
                if result.status == "pending":
                    result.status, result.error = "failed", "iperf3 worker exited without a result"
                    result.start = result.end = time.time()
                return True
            data = json.loads(line)
            if "armed" in data:
                continue
            self._fill(result, data)
            return True

    @staticmethod
    def _fill(result: FlowResult, data: dict) -> None:
        result.start, result.end = data.get("start", 0.0), data.get("end", 0.0)
        iperf = data.get("result", {})
        if "error" in iperf or "error" in data:
            result.status, result.error = "failed", iperf.get("error") or data.get("error")
            return
        end = iperf.get("end", {})
        received = end.get("sum_received", {})
        result.bytes_received = int(received.get("bytes", 0))
        result.goodput_mbps = received.get("bits_per_second", 0.0) / 1e6
        result.retransmits = int(end.get("sum_sent", {}).get("retransmits", 0))
        result.status = "ok"

    @staticmethod
    def _reap(entry: _Armed) -> None:
        for proc in (entry.client, entry.server):
            if proc.poll() is None:
                proc.terminate()
        for proc in (entry.client, entry.server):
            try:
                proc.wait(timeout=5)
            except Exception:
                proc.kill()

