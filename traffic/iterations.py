"""What one RL iteration measured, phase by phase, whoever replayed it.

`emu.live.rlreplay` (iperf3 on a testbed) and `traffic.model.rl` (the
flow-level model) fill the same records, so `emu.experiments.rfabric`
summarises both alike.  Times are seconds on the replayer's clock (epoch
seconds live, model seconds in the model).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Dict, Iterable, List

from traffic.results import FlowResult


@dataclass
class PhaseRun:
    iteration: int
    name: str
    kind: str
    ready: float = 0.0            # deps done and compute over (epoch s)
    start: float = 0.0            # flows released (after any wait for circuits)
    end: float = 0.0
    flows: List[FlowResult] = field(default_factory=list)
    flows_count: int = 0          # flows replayed (kept even where `flows` is not)

    @property
    def stall_s(self) -> float:
        return max(0.0, self.start - self.ready)

    @property
    def duration_s(self) -> float:
        return max(0.0, self.end - self.start)


@dataclass
class IterationRun:
    iteration: int
    start: float
    end: float = 0.0
    phases: List[PhaseRun] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    @property
    def exposed_s(self) -> float:
        """Wall time phases waited for circuits, summed over the phases."""
        return sum(p.stall_s for p in self.phases)


def steady_time(times: List[float]) -> float:
    """The steady iteration time: the mean from iteration 2 on (iteration 1
    profiles the proxy and warms the replayer), iteration 1 alone if it is all."""
    later = times[1:] or times
    return sum(later) / len(later)


def ready_time(phase, t0: float, ends: Dict[str, float], optimizer_s: float) -> float:
    """When a phase may start: its planned offset, its dependencies' ends (plus
    the compute it owes after each, ``Phase.gaps``), and for the weight sync the
    optimizer step after the DP all-reduce."""
    ready = t0 + phase.start_s
    gaps = dict(phase.gaps)
    for name in phase.after:
        ready = max(ready, ends[name] + gaps.get(name, 0.0))
    if phase.kind == "weight-sync" and "train-dp" in ends:
        ready = max(ready, ends["train-dp"] + optimizer_s)
    return ready


def named_flows(iterations: Iterable[IterationRun], prefix: str) -> List[FlowResult]:
    """Every flow of the iterations, its id made unique across them:
    ``{prefix}-i{n}-{id}``."""
    return [dataclasses.replace(f, id=f"{prefix}-i{p.iteration}-{f.id}")
            for it in iterations for p in it.phases for f in p.flows]


def dark_windows(replies) -> List[dict]:
    """Each reconfiguration's dark time, torn to lit, from replies that carry the
    OCS, the six steps' timestamps and the dark time (live or modelled)."""
    return [{"ocs": r.ocs, "torn": r.stamps["torn"], "lit": r.stamps["lit"],
             "start": r.stamps["start"], "ready": r.stamps["routes_restored"],
             "dark_s": r.dark_s} for r in replies]
