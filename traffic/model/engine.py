"""FlowSim: an event-driven, flow-level simulator of flows over shared links.

Units: bytes for sizes, bits per second for capacities and rates, seconds of
simulated time for every time.

The model
---------
A flow is a number of bytes to move over a path (a sequence of link ids).
Between two events every transmitting flow has a constant rate: the max-min
fair share (`maxmin.max_min_rates`) of the links it crosses, on each link's
capacity x ``efficiency``, within its own optional cap.  A flow's life:

    add_flows          release                 transmit          drain       done
        |   WAITING       |   ACTIVE (startup_s)   |   ACTIVE      |  DRAINED  |  DONE
        +-----------------+------------------------+---------------+-----------+---->
        deps finish +      router(ids) gives        max-min rate    len(path) x
        delay_s             the path                 on its links    hop_latency_s

* *release*: at ``base_s`` (default: now) + ``delay_s``, or, with ``after``,
  at the end of its last dependency + ``delay_s``; never before now.  The
  engine then asks ``router(flow_ids) -> (indptr, links)`` for the paths of
  every flow released at that instant, in one call;
* it transmits from release + ``startup_s`` (connection set-up);
* *drained* when its last byte left; *done* ``len(path) x hop_latency_s``
  later (propagation: the bytes in flight use no more bandwidth).  Its end
  time ``end_s`` is when it is done, and what its dependents wait for;
* ``on_done(flow_ids, t)`` is called once per batch of flows done at ``t``.

Approximations (what a packet-level emulation would show and this does not):
no slow start and no loss (a flow gets its fair share at once), no queueing
delay (latency is per hop and fixed), TCP's goodput below line rate only as
the one factor ``efficiency``, and fairness is exact max-min (TCP is roughly
fair per flow, not per byte of RTT).

Special cases:

* a flow whose path has no links, or crosses a link of capacity 0 (a dark
  circuit), has rate 0: it waits, ACTIVE, until ``set_capacity`` or
  ``reroute`` gives it a rate;
* a dependency that is CANCELLED never releases its dependents: they stay
  WAITING (a collective whose step was cancelled does not go on);
* a flow of 0 bytes drains as soon as it transmits, whatever its rate;
* a *barrier* (``add_flows``' ``barriers``) stands for a list of flows that
  many flows wait for: waiting for it is waiting for each of them.

Events and their cost
---------------------
Timed flow events (releases, start of transmission, done after latency) sit
in a heap of one entry per flow, ``at`` callbacks in a Python heap; drains
are found by a pass over the transmitting flows: the next drain is
``min(bytes_left x 8 / rate)``.  Every flow whose drain falls within
1e-9 x now + 1e-12 s of the earliest is drained in the same event, so the
flows of a symmetric collective step end together and cost one rate
computation, not one each.  Rates are recomputed only when the set of
transmitting flows, a capacity or a path changed, and then only those of the
flows the change reaches (`rates.LiveRates`).  The loop itself is compiled
(`events.run_events`): it comes back to Python only for a due ``at``
callback, ``on_done``, a router without compiled ``tables``, or room for
paths.  Per-flow arrays grow by a quarter.

Coalescing (``coalesce`` = c > 0, off by default)
-------------------------------------------------
When flows drift out of lockstep (ECMP collisions slow some flows of a
collective step and not others), they drain one by one, and every drain
costs an event and a rate computation.  With c > 0, at a drain event at
``now + t`` (t: the smallest time to drain) every transmitting flow whose
time to drain at its current rate ``r`` is at most ``t + c x size / r``
drains too: its last bytes are taken as sent at ``now + t``.  So:

* a coalesced flow skips at most a fraction c of its bytes, and drains early
  by at most ``c x size / r``: a fraction c of its whole transfer time at
  its current rate (every flow whose drain is within a relative c of the
  earliest one, ``t x (1 + c)``, is among them);
* its dependents start that much earlier and the bandwidth it leaves is
  shared earlier: along a chain of dependent steps (a ring all-reduce) the
  early ends add up to at most a fraction c of the chain's transfer time,
  so a collective ends within about ``c x`` its duration of the exact end.
  Max-min sharing is not monotone (a flow that ends early can slow another
  through a third one) and rates change after the event, so this is no hard
  bound on every single flow; the tests check that ring all-reduces with
  ECMP collisions end within ``c x`` their exact end time;
* events: drains within ``c x`` a flow's transfer time of each other share
  one event, so the number of events per wave of a collective is at most
  about ``1 / c``, however many flows drift;
* a drained flow whose path latency is at most ``c x`` its transfer time is
  done at its drain, not a latency later: done early by at most that, as a
  coalesced drain.  At full scale a path's latency is nanoseconds and paths
  of different lengths would otherwise end one wave in as many events (on a
  ring all-reduce at 4,096 GPUs this halved the events again: 44,415 ->
  15,423, with the same iteration time to 1e-9).

With c = 0 (the default) the results are exact (the only tolerance is the
1e-9 above).  On the RL workload at 1,024 GPUs on a Clos, c = 0.01 cut the
events 3.7x and moved the iteration time by 1e-4 (relative).

Dependencies are kept, per ``add_flows`` batch, as edges sorted by source
(each source's slice of a batch linked to its slice in earlier batches), plus
a counter of unfinished dependencies per flow: finding the dependents of the
flows done at an event costs O(those flows + their edges), not O(all flows).
"""

from __future__ import annotations

import heapq
import itertools
import time
from typing import Callable, Optional, Tuple

import numpy as np
from numba import njit

from traffic.model import events
# Flow states (values of FlowSim.state):
#   WAITING    added, not released: waits for its dependencies or its time
#   ACTIVE     released: has a path; transmits (maybe at rate 0) after startup_s
#   DRAINED    every byte sent; the last ones are still propagating
#   DONE       every byte arrived: end_s is set
#   CANCELLED  stopped by cancel(); its dependents never start
from traffic.model.events import ACTIVE, CANCELLED, DONE, DRAINED, WAITING  # noqa: F401
from traffic.model.rates import LiveRates

STATE_NAMES = ("WAITING", "ACTIVE", "DRAINED", "DONE", "CANCELLED")

# A flow blocked by a cancelled dependency never counts down to zero.
_NEVER = np.iinfo(np.int64).max // 2

# How often, in wall-clock seconds, progress(sim) is called during run(),
# looked at every PROGRESS_EVENTS events.
PROGRESS_PERIOD_S = 1.0
PROGRESS_EVENTS = 500

# What FlowSim routes with when it has no compiled tables (events.run_events
# then returns at each release and FlowSim calls its router): empty, of the
# types of `network.ModelNetwork.route_tables`, so that one compiled loop
# serves both.
_NO_TABLES = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
              np.zeros(0, dtype=np.uint64), np.zeros((0, 2), dtype=np.int64),
              np.zeros((0, 2), dtype=np.int64), np.zeros((0, 0), dtype=np.int32),
              np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
              np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64),
              np.zeros(0, dtype=np.int64), np.uint64(0), 0, False,
              np.zeros(0, dtype=np.bool_))

Router = Callable[[np.ndarray], Tuple[np.ndarray, np.ndarray]]


def _grown_size(size: int) -> int:
    """What an array of ``size`` grows to when it is full: a quarter more.
    At full scale the per-flow and per-path arrays are most of the memory,
    and doubling them left up to half unused (an RL iteration's small last
    phases, added after its DP phase, doubled every one)."""
    return size + size // 4 + 16


class FlowSim:
    """Flows over links with max-min fair rates; see the module docstring.

    ``capacity_bps``: one capacity per link (bits per second; 0 dark).
    ``router(flow_ids) -> (indptr, links)``: the path of each flow, as CSR.
    ``efficiency``: the fraction of a link's capacity that flows get.
    ``hop_latency_s``: propagation per link of a path, after the drain.
    ``startup_s``: from release to the first byte (connection set-up).
    ``on_done(flow_ids, t)``: called once per batch of flows done at ``t``.
    ``on_tag_done(tags, t)``: called with the tags (``add_flows``' ``tag``)
    whose last flow was done at ``t``; cheaper than ``on_done``, which
    stops the compiled event loop at every event that ends flows.
    ``tables()``: the router's compiled tables
    (`network.ModelNetwork.route_tables`), asked for before each run of
    the compiled loop, which then routes the flows it releases itself;
    without them it stops at every release and calls ``router``.
    ``progress(sim)``: called about once per wall-clock second of ``run``.
    ``coalesce``: 0 (default) is exact; c > 0 drains, in one event, every
    flow that would drain within c x its transfer time of the earliest drain
    (see "Coalescing" in the module docstring for the error it introduces).
    """

    def __init__(self, capacity_bps, router: Router, *, efficiency: float = 1.0,
                 hop_latency_s: float = 0.0, startup_s: float = 0.0,
                 on_done: Optional[Callable[[np.ndarray, float], None]] = None,
                 on_tag_done: Optional[Callable[[np.ndarray, float], None]] = None,
                 tables: Optional[Callable[[], tuple]] = None,
                 progress: Optional[Callable[["FlowSim"], None]] = None,
                 coalesce: float = 0.0):
        if not 0.0 < efficiency:
            raise ValueError(f"efficiency must be > 0, got {efficiency}")
        if hop_latency_s < 0 or startup_s < 0:
            raise ValueError("hop_latency_s and startup_s must be >= 0")
        self.router = router
        self.efficiency = float(efficiency)
        self.hop_latency_s = float(hop_latency_s)
        self.startup_s = float(startup_s)
        self.on_done = on_done
        self.on_tag_done = on_tag_done
        self.tables = tables
        self.progress = progress
        if not 0.0 <= coalesce < 1.0:
            raise ValueError(f"coalesce must be in [0, 1), got {coalesce}")
        self.coalesce = float(coalesce)
        self.n_flows = 0
        # The compiled loop's counters and clock (see `events`).
        self._box = np.zeros(events.BOX_SIZE, dtype=np.int64)
        self._clock = np.array([0.0, np.inf, np.inf])
        self._params = np.array([self.hop_latency_s, self.startup_s, self.coalesce])
        self._flags = np.zeros(4, dtype=np.int64)         # set by run()

        self._capacity = np.array(capacity_bps, dtype=np.float64).reshape(-1)
        self._check_capacity(self._capacity)
        self._effective_capacity = self._capacity * self.efficiency
        # The transmitting flows' max-min rates, kept up to date between
        # events (only the flows a change reaches are computed again).
        self._live = LiveRates(len(self._capacity))

        # Per-flow arrays, allocated with room to grow; the public views are
        # sliced to n_flows.
        self._room = 0
        self._bytes_total = np.zeros(0)
        self._bytes_left = np.zeros(0)
        self._released = np.zeros(0)
        self._drained = np.zeros(0)
        self._end = np.zeros(0)
        self._state = np.zeros(0, dtype=np.int8)
        self._delay = np.zeros(0)
        self._cap = np.zeros(0)
        self._tag = np.zeros(0, dtype=np.int64)
        self._deps_left = np.zeros(0, dtype=np.int64)
        self._deps_end = np.zeros(0)
        self._path_start = np.zeros(0, dtype=np.int64)
        self._path_len = np.zeros(0, dtype=np.int64)
        self._transmitting = np.zeros(0, dtype=bool)
        # The transmitting flows (those stopped since the last rates update
        # too) and their rates; scratch of the compiled loop.
        self._tx_ids = np.zeros(0, dtype=np.int64)
        self._tx_rate = np.zeros(0)
        self._time_left = np.zeros(0)
        self._fin_buf = np.zeros(0, dtype=np.int64)
        self._rel_buf = np.zeros(0, dtype=np.int64)
        self._txm_buf = np.zeros(0, dtype=np.int64)
        # Per tag: its flows not done yet; the tags done at an event.
        self._tag_left = np.zeros(0, dtype=np.int64)
        self._tags_done = np.zeros(0, dtype=np.int64)

        # Every path ever given, appended: a flow's path is a slice of it.
        self._path_links = np.zeros(1024, dtype=np.int64)

        # Pending dependency edges (src -> dst), appended per add_flows batch
        # sorted by src: a *run* is the slice of one batch's edges out of one
        # src (start, length), and a flow's runs form a linked list from
        # _first_run[flow] through _run_next (-1 ends it).  Finding the
        # dependents of k flows then costs O(k + their edges), whatever the
        # number of flows and edges in the simulation.
        self._edge_dst = np.zeros(1024, dtype=np.int64)
        self._edges_used = 0
        self._run_start = np.zeros(1024, dtype=np.int64)
        self._run_len = np.zeros(1024, dtype=np.int64)
        self._run_next = np.zeros(1024, dtype=np.int64)
        self._runs_used = 0
        self._first_run = np.zeros(0, dtype=np.int64)
        # Barriers (add_flows' ``barriers``): per barrier, its members not
        # done yet, when the last one was, and its runs of edges to the flows
        # that wait for it.  A member's edge to barrier b is stored as -(b + 1).
        self._bar_left = np.zeros(0, dtype=np.int64)
        self._bar_end = np.zeros(0)
        self._bar_first_run = np.zeros(0, dtype=np.int64)
        self._n_barriers = 0

        # Flow events (one entry per flow: time, order, kind, flow) in the
        # compiled loop's heap, with room for every flow and every cancelled
        # one's stale entry; `at` callbacks in a Python heap.
        self._heap = (np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int8),
                      np.zeros(0, dtype=np.int64))
        self._cancelled = 0
        self._calls: list = []
        self._sequence = itertools.count()   # FIFO order among equal times
        self._last_progress = time.monotonic()

    # ------------------------------------------------------------------ clock

    @property
    def now(self) -> float:
        """Simulated time (seconds)."""
        return float(self._clock[events.NOW])

    @property
    def events_processed(self) -> int:
        return int(self._box[events.EVENTS])

    @property
    def rate_computations(self) -> int:
        return int(self._box[events.RATE_UPDATES])

    # ------------------------------------------------------------------ views

    @property
    def released_s(self) -> np.ndarray:
        """Release time of each flow (NaN while WAITING)."""
        return self._released[:self.n_flows]

    @property
    def drained_s(self) -> np.ndarray:
        """When each flow's last byte left (NaN before)."""
        return self._drained[:self.n_flows]

    @property
    def end_s(self) -> np.ndarray:
        """When each flow was DONE: its last byte arrived (NaN before)."""
        return self._end[:self.n_flows]

    @property
    def bytes_total(self) -> np.ndarray:
        return self._bytes_total[:self.n_flows]

    @property
    def bytes_left(self) -> np.ndarray:
        """Bytes not yet sent, as of ``now``."""
        return self._bytes_left[:self.n_flows]

    @property
    def state(self) -> np.ndarray:
        """One of WAITING, ACTIVE, DRAINED, DONE, CANCELLED per flow."""
        return self._state[:self.n_flows]

    @property
    def tag(self) -> np.ndarray:
        """The caller's integer label of each flow (-1: none)."""
        return self._tag[:self.n_flows]

    @property
    def capacity_bps(self) -> np.ndarray:
        return self._capacity

    @property
    def n_links(self) -> int:
        return len(self._capacity)

    def path_of(self, flow: int) -> np.ndarray:
        """Link ids of a flow's current path (empty before its release)."""
        start = self._path_start[flow]
        return self._path_links[start:start + self._path_len[flow]].copy()

    def rate_update_stats(self) -> dict:
        """How much each recomputation of the rates did (`LiveRates.stats`)."""
        return self._live.stats()

    def rates_bps(self) -> Tuple[np.ndarray, np.ndarray]:
        """(flow ids, rates in bits per second) of the transmitting flows now."""
        events.refresh_rates(self._flow_arrays(), self._live.arrays(), self._buffers(),
                             self._box, self._effective_capacity)
        count = self._box[events.TX_N]
        return self._tx_ids[:count].copy(), self._tx_rate[:count].copy()

    # ------------------------------------------------------------------ links

    @staticmethod
    def _check_capacity(capacity: np.ndarray) -> None:
        if np.any(np.isnan(capacity)) or np.any(capacity < 0):
            raise ValueError("link capacities must be >= 0 bits per second")

    def set_capacity(self, links, bps) -> None:
        """Set links' capacities from now on; rates follow at the next step."""
        links = np.asarray(links, dtype=np.int64)
        values = np.broadcast_to(np.asarray(bps, dtype=np.float64), links.shape)
        self._check_capacity(values)
        changed = links[self._capacity[links] != values]
        self._capacity[links] = values
        self._effective_capacity[links] = self._capacity[links] * self.efficiency
        if len(changed):
            self._live.capacity_changed(changed)
            self._box[events.STALE] = 1

    def add_links(self, capacity_bps) -> np.ndarray:
        """Append links; returns their ids."""
        extra = np.array(capacity_bps, dtype=np.float64).reshape(-1)
        self._check_capacity(extra)
        first = len(self._capacity)
        self._capacity = np.concatenate([self._capacity, extra])
        self._effective_capacity = self._capacity * self.efficiency
        self._live.grow_links(len(self._capacity))
        return np.arange(first, first + len(extra), dtype=np.int64)

    # ------------------------------------------------------------------ flows

    def _grow_flows(self, needed: int) -> None:
        if needed <= self._room:
            return
        room = max(needed, _grown_size(self._room), 1024)
        fills = {"_bytes_total": 0.0, "_bytes_left": 0.0, "_released": np.nan,
                 "_drained": np.nan, "_end": np.nan, "_state": WAITING, "_delay": 0.0,
                 "_cap": np.inf, "_tag": -1, "_deps_left": 0, "_deps_end": -np.inf,
                 "_path_start": 0, "_path_len": 0, "_transmitting": False,
                 "_first_run": -1}
        for name, fill in fills.items():
            old = getattr(self, name)
            new = np.full(room, fill, dtype=old.dtype)
            new[:self.n_flows] = old[:self.n_flows]
            setattr(self, name, new)
        # The compiled loop's buffers, whole: add_flows may run from on_done,
        # in the middle of an event.
        for name in ("_tx_ids", "_tx_rate", "_time_left", "_fin_buf", "_rel_buf",
                     "_txm_buf"):
            old = getattr(self, name)
            new = np.zeros(room, dtype=old.dtype)
            new[:len(old)] = old
            setattr(self, name, new)
        self._room = room
        self._live.grow_flows(room)
        self._grow_heap()

    def _grow_heap(self) -> None:
        """Room for an entry per flow and per cancelled flow (events' docstring)."""
        needed = self._room + self._cancelled
        if needed <= len(self._heap[0]):
            return
        size = max(needed, _grown_size(len(self._heap[0])))
        grown = []
        for old in self._heap:
            new = np.zeros(size, dtype=old.dtype)
            new[:len(old)] = old
            grown.append(new)
        self._heap = tuple(grown)

    def _flow_arrays(self) -> tuple:
        return (self._state, self._bytes_total, self._bytes_left, self._released,
                self._drained, self._end, self._delay, self._cap, self._deps_left,
                self._deps_end, self._path_start, self._path_len, self._transmitting,
                self._tag, self._tag_left)

    def _buffers(self) -> tuple:
        return (self._tx_ids, self._tx_rate, self._time_left, self._fin_buf, self._rel_buf,
                self._txm_buf, self._tags_done)

    @staticmethod
    def _append(array: np.ndarray, used: int, values: np.ndarray) -> np.ndarray:
        """``array`` with ``values`` written at ``used``, grown first if full."""
        needed = used + len(values)
        if needed > len(array):
            grown = np.empty(max(needed, _grown_size(len(array))), dtype=array.dtype)
            grown[:used] = array[:used]
            array = grown
        array[used:needed] = values
        return array

    def add_flows(self, nbytes, *, delay_s=0.0, after=None, barriers=None, base_s=None,
                  cap_bps=None, tag=None) -> np.ndarray:
        """Add flows; returns their ids (``n_flows`` .. ``n_flows + n - 1``).

        ``nbytes``: size of each flow in bytes (its length sets n).
        ``delay_s``, ``base_s``, ``cap_bps`` (bits per second), ``tag`` (int):
        one for all or one per flow.  Without ``after`` a flow is released at
        ``(base_s or now) + delay_s``.  ``after``: per flow, the ids of the
        flows it waits for (earlier batches or this one), either a sequence of
        sequences or, faster, a 2-D int array padded with -1 or a CSR tuple
        ``(indptr, ids)`` (flow i waits for ``ids[indptr[i]:indptr[i + 1]]``); the flow is
        released at the end of the last of them + ``delay_s`` (an empty list
        means no dependency).  A release time in the past becomes now.
        ``barriers``: ``(indptr, members, waits)``: barrier j is the flows
        ``members[indptr[j]:indptr[j + 1]]`` (ids, as in ``after``) and flow
        i also waits for every one of them when ``waits[i]`` is j (-1: no
        barrier).  The same as listing them in each flow's ``after``, but
        many flows that wait for the same long list (an all-to-all's steps)
        cost one edge each, not one per member.
        """
        nbytes = np.array(nbytes, dtype=np.float64).reshape(-1)
        count = len(nbytes)
        if np.any(nbytes < 0) or np.any(np.isnan(nbytes)):
            raise ValueError("flow sizes must be >= 0 bytes")
        first = self.n_flows
        ids = np.arange(first, first + count, dtype=np.int64)
        if count == 0:
            return ids

        def per_flow(value, name, default):
            value = default if value is None else value
            array = np.broadcast_to(np.asarray(value, dtype=np.float64), (count,))
            if np.any(np.isnan(array)):
                raise ValueError(f"{name} must not be NaN")
            return array

        delay = per_flow(delay_s, "delay_s", 0.0)
        if np.any(delay < 0):
            raise ValueError("delay_s must be >= 0")
        base = per_flow(base_s, "base_s", self.now)
        cap = per_flow(cap_bps, "cap_bps", np.inf)
        if np.any(cap < 0):
            raise ValueError("cap_bps must be >= 0")
        dep_src, dep_dst = self._dependency_edges(after, ids)

        self._grow_flows(first + count)
        self.n_flows = first + count
        self._bytes_total[ids] = nbytes
        self._bytes_left[ids] = nbytes
        self._delay[ids] = delay
        self._cap[ids] = cap
        self._tag[ids] = np.broadcast_to(np.asarray(-1 if tag is None else tag,
                                                    dtype=np.int64), (count,))
        tags = self._tag[ids]
        tags = tags[tags >= 0]
        if len(tags):
            top = int(tags.max()) + 1
            if top > len(self._tag_left):
                grown = np.zeros(max(top, _grown_size(len(self._tag_left))), dtype=np.int64)
                grown[:len(self._tag_left)] = self._tag_left
                self._tag_left = grown
                self._tags_done = np.zeros(len(grown), dtype=np.int64)
            np.add.at(self._tag_left, tags, 1)

        # Dependencies already met count at once; cancelled ones block forever.
        src_state = self._state[dep_src]
        met = src_state == DONE
        np.maximum.at(self._deps_end, dep_dst[met], self._end[dep_src[met]])
        self._deps_left[dep_dst[src_state == CANCELLED]] = _NEVER
        pending = (src_state != DONE) & (src_state != CANCELLED)
        np.add.at(self._deps_left, dep_dst[pending], 1)
        self._add_dependency_edges(dep_src[pending], dep_dst[pending], self._first_run)

        has_deps = np.zeros(count, dtype=bool)
        has_deps[dep_dst - first] = True
        if barriers is not None:
            has_deps[self._add_barriers(barriers, ids) - first] = True
        release = np.where(has_deps, self._deps_end[ids], base) + delay
        ready = self._deps_left[ids] == 0
        self._schedule_releases(ids[ready], np.maximum(release[ready], self.now))
        return ids

    def _add_barriers(self, barriers, ids: np.ndarray) -> np.ndarray:
        """The barriers of an add_flows batch; returns the flows that wait."""
        indptr, members, waits = (np.asarray(a, dtype=np.int64) for a in barriers)
        count = len(indptr) - 1
        if len(waits) != len(ids):
            raise ValueError(f"barriers' waits has {len(waits)} entries for {len(ids)} flows")
        if len(waits) and (waits.min() < -1 or waits.max() >= count):
            raise ValueError(f"barriers' waits must be -1 or in [0, {count})")
        members = members[indptr[0]:indptr[-1]]
        if len(members) and (members.min() < 0 or members.max() > ids[-1]):
            raise ValueError(f"barriers name flows outside [0, {ids[-1] + 1})")
        first = self._n_barriers
        needed = first + count
        if needed > len(self._bar_left):
            room = max(needed, _grown_size(len(self._bar_left)), 64)
            for name, fill in (("_bar_left", 0), ("_bar_end", -np.inf), ("_bar_first_run", -1)):
                old = getattr(self, name)
                new = np.full(room, fill, dtype=old.dtype)
                new[:first] = old[:first]
                setattr(self, name, new)
        self._n_barriers = needed
        # Members: done ones count at once, a cancelled one blocks it forever.
        of = np.repeat(np.arange(first, needed, dtype=np.int64), np.diff(indptr))
        state = self._state[members]
        met = state == DONE
        np.maximum.at(self._bar_end, of[met], self._end[members[met]])
        self._bar_left[of[state == CANCELLED]] = _NEVER
        pending = ~met & (state != CANCELLED)
        np.add.at(self._bar_left, of[pending], 1)
        self._add_dependency_edges(members[pending], -(of[pending] + 1), self._first_run)
        # The flows that wait: as for a dependency on a flow.
        waiting = ids[waits >= 0]
        barrier = first + waits[waits >= 0]
        left = self._bar_left[barrier]
        done = left == 0
        np.maximum.at(self._deps_end, waiting[done], self._bar_end[barrier[done]])
        self._deps_left[waiting[left >= _NEVER]] = _NEVER
        later = ~done & (left < _NEVER)
        np.add.at(self._deps_left, waiting[later], 1)
        self._add_dependency_edges(barrier[later], waiting[later], self._bar_first_run)
        return waiting

    def _dependency_edges(self, after, ids: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        """(src, dst) arrays of the edges ``after`` describes for flows ``ids``."""
        empty = np.zeros(0, dtype=np.int64)
        if after is None:
            return empty, empty
        count = len(ids)
        if isinstance(after, tuple):
            indptr, src = (np.asarray(a, dtype=np.int64) for a in after)
            if len(indptr) != count + 1:
                raise ValueError(f"after's indptr has {len(indptr)} entries for {count} flows")
            dst = np.repeat(ids, np.diff(indptr))
            src = src[indptr[0]:indptr[-1]]
        elif isinstance(after, np.ndarray) and after.ndim == 2:
            if after.shape[0] != count:
                raise ValueError(f"after has {after.shape[0]} rows for {count} flows")
            src = after.astype(np.int64).reshape(-1)
            dst = np.repeat(ids, after.shape[1])
            keep = src >= 0
            src, dst = src[keep], dst[keep]
        else:
            after = list(after)
            if len(after) != count:
                raise ValueError(f"after has {len(after)} entries for {count} flows")
            lengths = np.fromiter(map(len, after), dtype=np.int64, count=count)
            src = np.fromiter(itertools.chain.from_iterable(after), dtype=np.int64,
                              count=int(lengths.sum()))
            dst = np.repeat(ids, lengths)
        limit = ids[-1] + 1
        if len(src) and (src.min() < 0 or src.max() >= limit):
            raise ValueError(f"after names flows outside [0, {limit})")
        return src, dst

    def _schedule_releases(self, ids: np.ndarray, times: np.ndarray) -> None:
        # In time order, so that flows released together keep their order.
        order = np.argsort(times, kind="stable")
        events.heap_push_many(self._heap, self._box,
                              np.ascontiguousarray(times[order], dtype=np.float64),
                              events.RELEASE, np.ascontiguousarray(ids[order]))

    def reroute(self, flows=None) -> None:
        """Ask the router again for the paths of these ACTIVE flows (None: all)."""
        if flows is None:
            flows = np.flatnonzero(self.state == ACTIVE)
        else:
            flows = np.asarray(flows, dtype=np.int64).reshape(-1)
            flows = flows[self._state[flows] == ACTIVE]
        if len(flows):
            moving = flows[self._transmitting[flows]]
            self._live.remove(moving)
            self._route(flows)
            self._live.insert(moving, self._path_start, self._path_len, self._path_links,
                              self._cap, self._effective_capacity)
            self._box[events.STALE] = 1

    def cancel(self, flows) -> np.ndarray:
        """Stop flows now; returns the bytes each had sent (all, if DONE)."""
        flows = np.asarray(flows, dtype=np.int64).reshape(-1)
        delivered = self._bytes_total[flows] - self._bytes_left[flows]
        stopping = flows[(self._state[flows] != DONE) & (self._state[flows] != CANCELLED)]
        if len(stopping):
            self._state[stopping] = CANCELLED
            self._cancelled += len(stopping)
            self._grow_heap()
            if self._transmitting[stopping].any():
                self._live.remove(stopping)
                self._transmitting[stopping] = False
                self._box[events.STALE] = 1
        return delivered

    def at(self, t: float, callback: Callable[["FlowSim"], None]) -> None:
        """Run ``callback(sim)`` at simulated time ``t`` (>= now)."""
        if not t >= self.now:
            raise ValueError(f"at({t}): time is before now ({self.now})")
        heapq.heappush(self._calls, (float(t), next(self._sequence), callback))

    # ------------------------------------------------------------------ internals

    def _route(self, flows: np.ndarray) -> None:
        indptr, links = self.router(flows)
        indptr = np.asarray(indptr, dtype=np.int64)
        links = np.asarray(links, dtype=np.int64)
        if len(indptr) != len(flows) + 1:
            raise ValueError(f"router returned {len(indptr) - 1} paths for {len(flows)} flows")
        if len(links) and (links.min() < 0 or links.max() >= self.n_links):
            raise ValueError("router returned unknown link ids")
        links = links[indptr[0]:indptr[-1]]
        indptr = indptr - indptr[0]
        used = int(self._box[events.PATH_USED])
        self._path_start[flows] = used + indptr[:-1]
        self._path_len[flows] = np.diff(indptr)
        self._path_links = self._append(self._path_links, used, links)
        self._box[events.PATH_USED] = used + len(links)

    def _grow_paths(self, needed: int) -> None:
        if needed > len(self._path_links):
            grown = np.zeros(max(needed, _grown_size(len(self._path_links))), dtype=np.int64)
            grown[:len(self._path_links)] = self._path_links
            self._path_links = grown

    def _add_dependency_edges(self, src: np.ndarray, dst: np.ndarray,
                              heads: np.ndarray) -> None:
        """Store pending edges src -> dst: one run per distinct src, in front
        of its list (``heads``: `_first_run` for flows, `_bar_first_run` for
        barriers)."""
        if len(src) == 0:
            return
        if src.max() - src.min() <= 4 * len(src) + 1024:
            run_src, bounds, dst = _group_by_source(src, dst)
        else:       # few edges from far-apart flows: a counting sort would scan the gap
            order = np.argsort(src, kind="stable")
            src, dst = src[order], dst[order]
            bounds = np.concatenate(([0], np.flatnonzero(src[1:] != src[:-1]) + 1,
                                     [len(src)]))
            run_src = src[bounds[:-1]]
        first_edge = self._edges_used
        self._edge_dst = self._append(self._edge_dst, first_edge, dst)
        self._edges_used += len(dst)
        runs = np.arange(self._runs_used, self._runs_used + len(run_src), dtype=np.int64)
        used = self._runs_used
        self._run_start = self._append(self._run_start, used, first_edge + bounds[:-1])
        self._run_len = self._append(self._run_len, used, np.diff(bounds))
        self._run_next = self._append(self._run_next, used, heads[run_src])
        self._runs_used += len(run_src)
        heads[run_src] = runs

    # ------------------------------------------------------------------ run

    def run(self, until: Optional[float] = None) -> None:
        """Process events until none is left, or up to simulated time ``until``."""
        box, clock = self._box, self._clock
        clock[events.UNTIL] = np.inf if until is None else float(until)
        flags = self._flags
        flags[events.NOTIFY_EACH] = self.on_done is not None
        flags[events.TAGS] = self.on_tag_done is not None
        flags[events.COMPILED_ROUTER] = self.tables is not None
        flags[events.PROGRESS_EVERY] = PROGRESS_EVENTS if self.progress else 0
        while True:
            clock[events.CALL_AT] = self._calls[0][0] if self._calls else np.inf
            code = events.run_events(
                self._flow_arrays(),
                (self._first_run, self._run_start, self._run_len, self._run_next,
                 self._edge_dst, self._bar_left, self._bar_end, self._bar_first_run),
                self._live.arrays(), self._path_links, self._heap, self._buffers(), box,
                clock, self._params, self._flags, self._effective_capacity,
                self.tables() if self.tables is not None else _NO_TABLES)
            if code == events.IDLE:
                return
            if code == events.CALLS:
                limit = self.now + events.tolerance(self.now)
                due = []
                while self._calls and self._calls[0][0] <= limit:
                    due.append(heapq.heappop(self._calls)[2])
                for callback in due:
                    callback(self)
            elif code == events.NOTIFY:
                # Both read before either callback runs: a callback may add
                # flows, and with them grow these buffers.
                done = self._fin_buf[:box[events.FIN_N]].copy()
                tags = self._tags_done[:box[events.TAGS_N]].copy()
                box[events.TAGS_N] = 0
                if self.on_done is not None and len(done):
                    self.on_done(done, self.now)
                if self.on_tag_done is not None and len(tags):
                    self.on_tag_done(tags, self.now)
            elif code == events.ROUTE:
                self._route(self._rel_buf[:box[events.REL_N]].copy())
                box[events.STAGE] = events.STARTING
            elif code == events.GROW:
                self._grow_paths(int(box[events.NEEDED]))
            elif code == events.ROOM:
                self._live.reserve(int(box[events.NEEDED]), int(box[events.LONGEST]))
            elif code == events.PROGRESS and self.progress is not None:
                wall = time.monotonic()
                if wall - self._last_progress >= PROGRESS_PERIOD_S:
                    self._last_progress = wall
                    self.progress(self)


# ---------------------------------------------------------------- compiled steps
# (The event loop's own are in `events`.)

@njit(cache=True)
def _group_by_source(src, dst):
    """Edges src -> dst grouped by source, each group in its given order: the
    distinct sources ascending, the group bounds (CSR) and the destinations
    in that order.  A counting sort over the sources' range: an edge batch of
    a phase at 4,096 GPUs (1.3 million) took 0.3 s with numpy's stable
    argsort."""
    low, high = src.min(), src.max()
    count = np.zeros(high - low + 2, dtype=np.int64)
    for s in src:
        count[s - low + 1] += 1
    distinct = 0
    for k in range(1, len(count)):
        if count[k]:
            distinct += 1
        count[k] += count[k - 1]
    grouped = np.empty(len(dst), dtype=np.int64)
    fill = count[:-1].copy()
    for e in range(len(src)):
        k = src[e] - low
        grouped[fill[k]] = dst[e]
        fill[k] += 1
    sources = np.empty(distinct, dtype=np.int64)
    bounds = np.empty(distinct + 1, dtype=np.int64)
    run = 0
    for k in range(len(count) - 1):
        if count[k + 1] > count[k]:
            sources[run] = low + k
            bounds[run] = count[k]
            run += 1
    bounds[distinct] = len(src)
    return sources, bounds, grouped


