"""A schedule's flows as flat arrays for the engine, built once and shared.

An RL iteration at 4,096 GPUs has 1.36 million flows.  Turning each phase's
`traffic.flows.Flow` objects into the engine's arrays (sizes, release
offsets, dependencies, ECMP keys) is per-flow Python, and it cost more than
the max-min computations once the events were coalesced.  The flows are the
same in every iteration and on every fabric, so this is done once per
schedule:

* per phase, once: sizes, release offsets, rate caps, the two ends as
  indices into the phase's hosts, and the dependencies as CSR (each flow's
  dependencies by their position in the phase);
* per (iteration, phase): the ECMP keys, which name the iteration
  (``key_of("i{iteration}/{phase}/{flow id}")``, as the runner always has).

`rfabric_scale` builds one before it forks a process per fabric, so that the
arrays and the keys of the iterations it will run are shared copy-on-write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np

from traffic.model.network import key_of


@dataclass(frozen=True)
class PhaseArrays:
    """One phase's flows, in DAG order (see the module docstring)."""

    hosts: Tuple[str, ...]          # the hosts the flows name
    src: np.ndarray                 # index into hosts, per flow
    dst: np.ndarray
    nbytes: np.ndarray
    at_s: np.ndarray
    cap_bps: np.ndarray             # inf: no cap
    after_ptr: np.ndarray           # CSR: flow i waits for after[after_ptr[i]:after_ptr[i+1]]
    after: np.ndarray               # positions in the phase

    @classmethod
    def of(cls, phase) -> "PhaseArrays":
        flows = phase.dag.flows
        position = {f.id: i for i, f in enumerate(flows)}
        hosts: Dict[str, int] = {}
        src = np.fromiter((hosts.setdefault(f.src, len(hosts)) for f in flows),
                          dtype=np.int64, count=len(flows))
        dst = np.fromiter((hosts.setdefault(f.dst, len(hosts)) for f in flows),
                          dtype=np.int64, count=len(flows))
        counts = np.fromiter((len(f.after) for f in flows), dtype=np.int64, count=len(flows))
        after_ptr = np.zeros(len(flows) + 1, dtype=np.int64)
        np.cumsum(counts, out=after_ptr[1:])
        after = np.fromiter((position[d] for f in flows for d in f.after), dtype=np.int64,
                            count=int(after_ptr[-1]))
        return cls(hosts=tuple(hosts), src=src, dst=dst,
                   nbytes=np.fromiter((f.bytes for f in flows), dtype=np.float64,
                                      count=len(flows)),
                   at_s=np.fromiter((f.at_s for f in flows), dtype=np.float64,
                                    count=len(flows)),
                   cap_bps=np.fromiter((f.rate_mbps * 1e6 if f.rate_mbps else np.inf
                                        for f in flows), dtype=np.float64, count=len(flows)),
                   after_ptr=after_ptr, after=after)


class ScheduleArrays:
    """`PhaseArrays` of every phase of a schedule, and the ECMP keys of each
    (iteration, phase), made on first use and kept."""

    def __init__(self, schedule):
        self.schedule = schedule
        self.phases: List[PhaseArrays] = [PhaseArrays.of(p) for p in schedule.phases]
        self._keys: Dict[Tuple[int, int], np.ndarray] = {}

    def keys(self, iteration: int, position: int) -> np.ndarray:
        """The ECMP keys of the flows of phase ``position`` in ``iteration``."""
        if (iteration, position) not in self._keys:
            phase = self.schedule.phases[position]
            prefix = f"i{iteration}/{phase.name}/"
            self._keys[iteration, position] = np.fromiter(
                (key_of(prefix + f.id) for f in phase.dag.flows), dtype=np.uint64,
                count=len(phase.dag.flows))
        return self._keys[iteration, position]

    def prepare(self, iterations: int) -> "ScheduleArrays":
        """Make the keys of iterations 1..``iterations`` now (before a fork)."""
        for iteration in range(1, iterations + 1):
            for position in range(len(self.phases)):
                self.keys(iteration, position)
        return self
