"""Replay a flow DAG over kept connections between per-host agents.

The transport a collective library uses (`emu.live.peer_agent`): one agent
per host, one TCP connection per pair of hosts, opened before the first
flow is due and kept; a flow goes the moment what it waits for has arrived.
Where the flow it waits for arrived at its own source, or was sent by its
source to the same peer just before it (the two dependencies of every step
of a ring collective), the source's agent starts it by itself; otherwise the
runner tells that agent when the flow arrived.

`PeerReplayer.run` returns the same `emu.live.replay.FlowResult` rows as the
iperf3 replayer: start is the sender's first write, end the receiver's last
byte (so its time includes any wait behind the flow before it on its
connection), retransmissions are the sending socket's (``TCP_INFO``) while
the flow was written.  It takes no gate and no events: the P/D scenarios, which
hold flows back by credit and move them on failures, use the iperf3
replayer.
"""

from __future__ import annotations

import queue
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

from traffic.ports import PortBook
from emu.live.agents import AgentProcess
from emu.live.replay import MIN_FLOW_TIMEOUT_S, FlowResult
from traffic.flows import FlowDag

AGENT_PORT = 5600
AGENT_START_TIMEOUT_S = 30.0


class PeerAgent(AgentProcess):
    """The ``emu.live.peer_agent`` process of one host, listening on its address."""

    def __init__(self, bed, host: str, congestion: str, events: "queue.Queue"):
        self.ip = bed.fabric.graph.nodes[host]["ip"]
        args = [sys.executable, "-m", "emu.live.peer_agent", "--bind", self.ip,
                "--port", str(AGENT_PORT)]
        if congestion:
            args += ["--congestion", congestion]
        super().__init__(bed, host, args, f"peer agent {host}", events)


class PeerReplayer:
    """Replay a DAG with one `PeerAgent` per host that sends or receives."""

    def __init__(self, bed, dag: FlowDag, expected_mbps: float,
                 progress: Optional[Callable[[int, int], None]] = None):
        if dag.external:
            raise ValueError(f"the DAG waits for flows outside it: {list(dag.external)}")
        paced = [f.id for f in dag.flows if f.rate_mbps]
        if paced:
            raise ValueError(f"flows {paced[:3]} are paced (rate_mbps): the kept-connection "
                             "transport sends at TCP's own rate; use the iperf3 replayer")
        self.bed = bed
        self.dag = dag
        self.expected_mbps = expected_mbps
        self.progress = progress
        self.t0 = 0.0

    def _stall_s(self) -> float:
        """How long the replay may go without a flow arriving before it gives up:
        the iperf3 replayer's per-flow timeout for the largest flow, plus the
        longest delay a flow waits after the ones before it."""
        flows = self.dag.flows
        largest = max(f.bytes for f in flows)
        return max(MIN_FLOW_TIMEOUT_S, 10 * largest * 8 / (self.expected_mbps * 1e6)) + \
            max(f.at_s for f in flows)

    def listeners(self) -> Dict[str, set]:
        """Who must hear from the runner that a flow arrived: the source of every
        flow waiting for it, unless that source received it itself, or sent it
        on the same connection and follows it at once."""
        flows = self.dag.by_id()
        listeners: Dict[str, set] = {fid: set() for fid in flows}
        for flow in flows.values():
            for dep in map(flows.get, flow.after):
                received = dep.dst == flow.src
                queued = (dep.src, dep.dst) == (flow.src, flow.dst) and flow.at_s == 0
                if not (received or queued):
                    listeners[dep.id].add(flow.src)
        return listeners

    def source_ports(self, order: List[str]) -> Dict[Tuple[str, str], int]:
        """The local port of each kept connection (source, destination): drawn
        from the testbed's ECMP seed by the pair, in plan order, so that a pair's
        connection takes the same ECMP path in every run of one seed
        (`traffic.ports`); 0, the kernel's pick, for seed 0."""
        book, flows, sports = PortBook(self.bed.ecmp_seed), self.dag.by_id(), {}
        for fid in order:
            pair = (flows[fid].src, flows[fid].dst)
            if pair not in sports:
                sports[pair] = book.client(pair[0], f"peer/{pair[0]}>{pair[1]}")
        return sports

    def run(self) -> List[FlowResult]:
        flows = self.dag.by_id()
        order = [f.id for f in self.dag.topological_order()]
        results = {fid: FlowResult(fid, f.src, f.dst, f.bytes, f.step, f.group)
                   for fid, f in flows.items()}
        listeners = self.listeners()
        events: "queue.Queue" = queue.Queue()
        hosts = sorted({f.src for f in flows.values()} | {f.dst for f in flows.values()})
        agents: Dict[str, PeerAgent] = {}
        written, received, done = set(), set(), set()
        try:
            for host in hosts:
                agents[host] = PeerAgent(self.bed, host, self.bed.congestion, events)
            for agent in agents.values():
                if not agent.ready.wait(AGENT_START_TIMEOUT_S):
                    raise RuntimeError(f"peer agent on {agent.host} did not start")
            sports = self.source_ports(order)
            self.t0 = time.time()
            for fid in order:
                flow = flows[fid]
                agents[flow.src].send({"op": "flow", "id": fid, "dst": agents[flow.dst].ip,
                                       "port": AGENT_PORT, "sport": sports[flow.src, flow.dst],
                                       "bytes": flow.bytes,
                                       "after": list(flow.after), "delay_s": flow.at_s,
                                       "t0": self.t0})
            stall_s = self._stall_s()
            deadline = self.t0 + stall_s
            failed = None
            while len(done) < len(flows) and failed is None:
                self.bed.check_controller()
                try:
                    event = events.get(timeout=max(0.0, min(1.0, deadline - time.time())))
                except queue.Empty:
                    if time.time() >= deadline:
                        break
                    continue
                kind, fid = event["event"], event.get("id")
                if kind == "agent-exit":
                    raise RuntimeError(f"peer agent on {event['host']} exited during the replay")
                result = results[fid]
                if kind == "started":
                    result.start = event["start"]
                    result.sport, result.dport = event["sport"], event["dport"]
                elif kind == "written":
                    result.retransmits = event["retransmits"]
                    written.add(fid)
                elif kind == "received":
                    result.end, result.bytes_received = event["end"], event["bytes"]
                    received.add(fid)
                    for host in listeners[fid]:
                        agents[host].send({"op": "done", "id": fid, "end": event["end"]})
                elif kind == "error":
                    # What waits for it would wait for ever: the replay stops here.
                    result.status, result.error = "failed", event["error"]
                    done.add(fid)
                    failed = fid
                if fid in written and fid in received and fid not in done:
                    result.status = "ok"
                    result.goodput_mbps = result.bytes_received * 8 / 1e6 / \
                        max(result.duration_s, 1e-9)
                    done.add(fid)
                    deadline = time.time() + stall_s
                if self.progress:
                    self.progress(len(done), len(flows))
            for fid in set(flows) - done:
                if failed is not None:
                    results[fid].status = "failed"
                    results[fid].error = f"not run: the replay stopped when {failed} failed"
                else:
                    results[fid].status = "timeout"
                    results[fid].error = f"no flow arrived for {stall_s:.0f} s"
        finally:
            for agent in agents.values():
                agent.stop()
        return [results[fid] for fid in order]
