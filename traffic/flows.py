"""Flows and flow DAGs: what the replayer runs.

A flow moves ``bytes`` from ``src`` to ``dst``.  It starts at ``at_s``
seconds after the replay's start, or once every flow in ``after`` has
finished (plus ``at_s`` as a gap), never before.  Collectives are built as
DAGs of flows: one implementation each, shared by every scenario.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


class FlowError(ValueError):
    """A flow or a DAG is malformed; the message names the flow."""


@dataclass(frozen=True)
class Flow:
    id: str
    src: str
    dst: str
    bytes: int
    at_s: float = 0.0
    after: Tuple[str, ...] = ()
    step: Optional[int] = None      # collective step, for per-step timing
    group: str = ""                 # what the flow belongs to (e.g. "allreduce")
    rate_mbps: Optional[float] = None  # sender pacing; None = TCP's own

    def __post_init__(self):
        if self.src == self.dst:
            raise FlowError(f"flow {self.id}: source and destination are both {self.src}")
        if self.bytes <= 0:
            raise FlowError(f"flow {self.id}: bytes must be > 0, got {self.bytes}")
        if self.at_s < 0:
            raise FlowError(f"flow {self.id}: at_s must be >= 0, got {self.at_s}")


@dataclass
class FlowDag:
    """Flows and their dependencies.

    ``external`` names flows of another DAG that some flows here wait for;
    such a DAG is a building block, joined to the rest with ``merge`` before
    it is replayed (the replayer refuses a DAG with external dependencies).
    """

    flows: List[Flow] = field(default_factory=list)
    external: Tuple[str, ...] = ()

    def __post_init__(self):
        self.validate()

    @classmethod
    def merge(cls, *dags: "FlowDag") -> "FlowDag":
        """One DAG of several: every external dependency must now resolve."""
        return cls([flow for dag in dags for flow in dag.flows])

    def validate(self) -> None:
        ids = [f.id for f in self.flows]
        if len(ids) != len(set(ids)):
            dupes = sorted({i for i in ids if ids.count(i) > 1})
            raise FlowError(f"duplicate flow ids: {dupes}")
        known = set(ids) | set(self.external)
        for flow in self.flows:
            missing = [d for d in flow.after if d not in known]
            if missing:
                raise FlowError(f"flow {flow.id} waits for unknown flows {missing}")
        self.topological_order()

    def by_id(self) -> Dict[str, Flow]:
        return {f.id: f for f in self.flows}

    def topological_order(self) -> List[Flow]:
        flows = self.by_id()
        order, state = [], {}

        def visit(fid, chain):
            if state.get(fid) == "done":
                return
            if state.get(fid) == "active":
                raise FlowError(f"flow dependencies form a cycle: {' -> '.join(chain + [fid])}")
            state[fid] = "active"
            for dep in flows[fid].after:
                if dep in flows:
                    visit(dep, chain + [fid])
            state[fid] = "done"
            order.append(flows[fid])

        for flow in self.flows:
            visit(flow.id, [])
        return order

    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.flows)

    def ideal_finish_s(self, rate_bps: float, startup_s: float = 0.0) -> Dict[str, float]:
        """Finish times if each flow ran alone at rate_bps (the DAG's critical path)."""
        finish: Dict[str, float] = {}
        for flow in self.topological_order():
            ready = max((finish.get(d, 0.0) for d in flow.after), default=0.0) + flow.at_s
            finish[flow.id] = ready + startup_s + flow.bytes * 8 / rate_bps
        return finish


def ring_allreduce(hosts: Sequence[str], total_bytes: int, group: str = "allreduce",
                   start_after: Iterable[str] = ()) -> FlowDag:
    """Ring all-reduce: 2(N-1) steps, each rank sends S/N bytes to the next.

    Step k of rank i waits for step k-1 of rank i-1 (the chunk rank i
    forwards is the one it just received) and for its own step k-1 (one send
    at a time per NIC).  Reduce-scatter is steps 0..N-2, all-gather N-1..2N-3.
    """
    n = len(hosts)
    if n < 2:
        raise FlowError(f"ring all-reduce needs at least 2 hosts, got {n}")
    if len(set(hosts)) != n:
        raise FlowError(f"ring all-reduce hosts repeat: {list(hosts)}")
    chunk = max(1, total_bytes // n)
    flows = []
    for step in range(2 * (n - 1)):
        for rank in range(n):
            deps = tuple(start_after) if step == 0 else (
                f"{group}-s{step - 1}-r{(rank - 1) % n}", f"{group}-s{step - 1}-r{rank}")
            flows.append(Flow(id=f"{group}-s{step}-r{rank}", src=hosts[rank],
                              dst=hosts[(rank + 1) % n], bytes=chunk, after=deps, step=step,
                              group=group))
    return FlowDag(flows, external=tuple(start_after))


def allreduce_ideal_s(n: int, total_bytes: int, rate_bps: float) -> float:
    """Alpha-beta ideal with alpha = 0: 2(N-1)/N x S/B."""
    return 2 * (n - 1) / n * total_bytes * 8 / rate_bps
