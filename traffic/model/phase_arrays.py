"""A schedule's flows as flat arrays for the engine, built once and shared.

An RL iteration at 4,096 GPUs has 1.36 million flows.  Turning each phase's
`traffic.flows.Flow` objects into the engine's arrays (sizes, release
offsets, dependencies, ECMP keys) is per-flow Python, and it cost more than
the max-min computations once the events were coalesced.  The flows are the
same in every iteration and on every fabric, so this is done once per
schedule:

* per phase, once: sizes, release offsets, rate caps, the two ends as
  indices into the phase's hosts, and the dependencies as CSR (each flow's
  dependencies by their position in the phase).  A long dependency list
  that many flows share (every entry flow of an all-to-all waits for the
  ends of the operation before it: 2,048 of them at 4,096 GPUs) becomes one
  *barrier*, given once, that those flows wait for (`FlowSim.add_flows`'
  ``barriers``): the EP phases at 4,096 GPUs had 38 million dependency
  edges as lists, and have 0.1 million this way;
* per (iteration, phase): the ECMP keys, which name the iteration
  (``key_of("i{iteration}/{phase}/{flow id}")``, as the runner always has;
  `keys_of` computes them compiled).

`rfabric_scale` builds one before it forks a process per fabric, so that the
arrays and the keys of the iterations it will run are shared copy-on-write.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, compress
from operator import attrgetter
from typing import Dict, List, Tuple

import numpy as np

from traffic.model.network import keys_of

_ID, _SRC, _DST, _BYTES, _AT, _AFTER, _RATE = map(
    attrgetter, ("id", "src", "dst", "bytes", "at_s", "after", "rate_mbps"))

# Dependency lists longer than this become barriers (one per distinct list
# object: the DAG builders share one tuple among the flows that wait alike).
BARRIER_LENGTH = 8


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
    waits: np.ndarray               # per flow, the barrier it waits for too (-1: none)
    barrier_ptr: np.ndarray         # CSR: barrier j is the ends of these flows:
    barrier_members: np.ndarray     # barrier_members[barrier_ptr[j]:barrier_ptr[j + 1]]

    def waits_for(self, flow: int) -> np.ndarray:
        """Positions of every flow that flow ``flow`` waits for (direct and
        through its barrier), as the DAG's ``Flow.after`` lists them."""
        direct = self.after[self.after_ptr[flow]:self.after_ptr[flow + 1]]
        j = self.waits[flow]
        if j < 0:
            return direct
        return np.concatenate([direct, self.barrier_members[
            self.barrier_ptr[j]:self.barrier_ptr[j + 1]]])

    def pairs(self) -> List[Tuple[str, str, int]]:
        """(src, dst, bytes) summed per host pair, in the order each pair first
        appears: ``Phase.pairs()``."""
        width = len(self.hosts)
        pair = self.src * width + self.dst
        keys, first, inverse = np.unique(pair, return_index=True, return_inverse=True)
        total = np.bincount(inverse.reshape(-1), weights=self.nbytes, minlength=len(keys))
        hosts = self.hosts
        return [(hosts[keys[k] // width], hosts[keys[k] % width], int(total[k]))
                for k in np.argsort(first, kind="stable").tolist()]

    @classmethod
    def of(cls, phase) -> "PhaseArrays":
        # Each field read by a C-level map over the flows, not a Python loop
        # per field: 1.4 million flows took 7 s, and this is serial work
        # before the fabrics run.
        flows = phase.dag.flows
        count = len(flows)
        position = dict(zip(map(_ID, flows), range(count)))
        srcs, dsts = list(map(_SRC, flows)), list(map(_DST, flows))
        hosts = dict.fromkeys(srcs)
        hosts.update(dict.fromkeys(dsts))
        index = {host: i for i, host in enumerate(hosts)}
        afters = list(map(_AFTER, flows))
        lengths = np.fromiter(map(len, afters), dtype=np.int64, count=count)
        waits = np.full(count, -1, dtype=np.int64)
        barrier_of: Dict[int, int] = {}
        barriers: List[tuple] = []
        for i in np.flatnonzero(lengths > BARRIER_LENGTH).tolist():
            after = afters[i]
            j = barrier_of.setdefault(id(after), len(barriers))
            if j == len(barriers):
                barriers.append(after)
            waits[i] = j
        short = waits < 0
        lengths[~short] = 0
        after_ptr = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(lengths, out=after_ptr[1:])
        barrier_ptr = np.zeros(len(barriers) + 1, dtype=np.int64)
        np.cumsum([len(b) for b in barriers], out=barrier_ptr[1:])
        rates = list(map(_RATE, flows))
        if any(rates):
            cap_bps = np.array([r * 1e6 if r else np.inf for r in rates], dtype=np.float64)
        else:
            cap_bps = np.full(count, np.inf)
        return cls(hosts=tuple(hosts),
                   src=np.fromiter(map(index.__getitem__, srcs), dtype=np.int64, count=count),
                   dst=np.fromiter(map(index.__getitem__, dsts), dtype=np.int64, count=count),
                   nbytes=np.fromiter(map(_BYTES, flows), dtype=np.float64, count=count),
                   at_s=np.fromiter(map(_AT, flows), dtype=np.float64, count=count),
                   cap_bps=cap_bps, after_ptr=after_ptr,
                   after=np.fromiter(map(position.__getitem__,
                                         chain.from_iterable(compress(afters, short))),
                                     dtype=np.int64, count=int(after_ptr[-1])),
                   waits=waits, barrier_ptr=barrier_ptr,
                   barrier_members=np.fromiter(
                       map(position.__getitem__, chain.from_iterable(barriers)),
                       dtype=np.int64, count=int(barrier_ptr[-1])))


class ScheduleArrays:
    """`PhaseArrays` of every phase of a schedule, and the ECMP keys of each
    (iteration, phase), made on first use and kept."""

    def __init__(self, schedule):
        self.schedule = schedule
        self.phases: List[PhaseArrays] = [PhaseArrays.of(p) for p in schedule.phases]
        self._keys: Dict[Tuple[int, int], np.ndarray] = {}
        self._pairs: Dict[int, List[Tuple[str, str, int]]] = {}

    def keys(self, iteration: int, position: int) -> np.ndarray:
        """The ECMP keys of the flows of phase ``position`` in ``iteration``."""
        if (iteration, position) not in self._keys:
            phase = self.schedule.phases[position]
            self._keys[iteration, position] = keys_of(f"i{iteration}/{phase.name}/",
                                                      list(map(_ID, phase.dag.flows)))
        return self._keys[iteration, position]

    def pairs(self, position: int) -> List[Tuple[str, str, int]]:
        """``Phase.pairs()`` of phase ``position`` (what the control proxy sizes
        its circuits by), made once for every fabric and iteration, from the
        arrays: reading the 1.3 million `Flow` objects of a DP phase at 4,096
        GPUs took 0.9 s, and in a forked worker it also copied every page
        that holds one (their reference counts are written)."""
        if position not in self._pairs:
            self._pairs[position] = self.phases[position].pairs()
        return self._pairs[position]

    def prepare(self, iterations: int) -> "ScheduleArrays":
        """Make the keys of iterations 1..``iterations`` now (before a fork:
        every fabric needs them).  The pairs are made where first asked for:
        only a fabric with a control proxy needs them."""
        for position in range(len(self.phases)):
            for iteration in range(1, iterations + 1):
                self.keys(iteration, position)
        return self
