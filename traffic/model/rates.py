"""Max-min fair rates kept up to date as flows start, stop and move.

`maxmin.max_min_rates` computes every flow's rate from nothing.  The engine
needs them after every event, and an event changes few flows: in the DP
all-reduce of an RL iteration at 4,096 GPUs a drain event stops about 25 of
3,300 transmitting flows and starts as many.  Computing the 3,300 again each
time was two thirds of a run.  `LiveRates` keeps the answer instead, and
after a change computes again only the flows whose rates must change.

When is an allocation the max-min one?  When it is feasible and every flow
has a *bottleneck*: its own cap, or a saturated link on which no flow gets
more than it does.  That condition is local: a flow's depends only on its
own rate and, on each link it crosses, the link's capacity, its total rate
and its largest rate.  So after a change only the flows crossing a link
whose capacity, members or rates changed can have lost their bottleneck.
The update:

    A := the flows that started or moved            (the flows to compute)
    loop:
        take A's rates off its links' totals
        fill A (progressive filling) on what the other flows leave:
            residual = capacity - total of the flows not in A
        put A's new rates on its links' totals
        check every flow crossing a link that changed (a dirty link, or
            one of A's): overloaded link, or no bottleneck -> a violator
        no violator: done (the allocation is max-min again)
        A += each violator and every flow sharing a link with it

    dirty link ----> flows on it checked ----> violator?
        ^                                          |
        +---- A's links, after the next fill <-----+  A grows by its links' flows

A flow on a changed link is checked only when its bottleneck may have gone:
each flow's bottleneck found at its last check is kept, and still holds while
neither the flow's rate (it is not in A) nor that link (it is not among the
changed ones) changed.

A only grows, so the loop ends; once A holds over half the transmitting
flows (or stops growing while a violator remains, which rounding alone could
cause) every rate is computed anew from nothing, as `max_min_rates` does.

The rates are those of `max_min_rates` to within a relative 1e-7 (the
check's tolerance) rather than bit for bit: a flow keeps the rate it was
given several events ago, computed with other flows.

What it keeps, per link: the transmitting flows crossing it (a doubly linked
list through their path entries: the engine's paths are slices of one array,
so entry ``e`` of that array is the *slot* of its flow on link
``links[e]``), their number and their total rate.  Per flow: its rate.
Everything else is scratch, read only where the same call wrote it (stamps
tell a pass's marks from older ones).  The linked lists cost three integers
per path entry ever given (about 90 MB for an RL iteration at 4,096 GPUs).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from traffic.model.maxmin import RELATIVE_TOLERANCE, _progressive_filling

# A flow has a bottleneck when its link is full, and its rate the largest
# there, to within this: looser than the filling's own tolerance, so that
# what one filling froze in one round (links within 1e-9 of each other's
# share) is not taken for a violation after rounding.
CHECK_TOLERANCE = 1e-7

# A flow's bottleneck, besides a link id: its own cap, or none known.
CAP, UNKNOWN = -2, -1

# Above this share of the transmitting flows to compute again, computing
# every rate anew is as cheap and starts from exact totals.
FULL_RECOMPUTE_SHARE = 0.5


class LiveRates:
    """The max-min rates of the transmitting flows, kept up to date.

    The caller (`engine.FlowSim`) owns the paths: flow f crosses
    ``path_links[path_start[f]:path_start[f] + path_len[f]]``.  It calls
    `insert` when flows start transmitting (their rate is 0 until the next
    `update`), `remove` when they stop and before their path changes,
    `capacity_changed` with the links whose capacity changed, and
    `update(tx)` before it reads ``rate``.  ``grow_*`` keep the arrays as
    large as the caller's.
    """

    def __init__(self, n_links: int):
        self.rate = np.zeros(0)                     # bits per second, per flow
        self._in_lists = np.zeros(0, dtype=np.bool_)
        self._in_set = np.zeros(0, dtype=np.bool_)  # scratch: flow in A
        self._flow_stamp = np.zeros(0, dtype=np.int64)
        self._slot_next = np.zeros(0, dtype=np.int64)
        self._slot_prev = np.zeros(0, dtype=np.int64)
        self._slot_flow = np.zeros(0, dtype=np.int64)
        self._link_head = np.zeros(0, dtype=np.int64)
        self._link_count = np.zeros(0, dtype=np.int64)
        self._link_total = np.zeros(0)
        self._link_stamp = np.zeros(0, dtype=np.int64)
        self._link_max_stamp = np.zeros(0, dtype=np.int64)
        self._link_max = np.zeros(0)
        self._residual = np.zeros(0)
        self._local_id = np.zeros(0, dtype=np.int64)
        self._stamp = np.zeros(1, dtype=np.int64)   # the last check pass's number
        # The changes since the last update, each once: the flows that
        # started or moved (seeds) and the links that changed (dirty).
        self._seeds = np.zeros(0, dtype=np.int64)
        self._seeded = np.zeros(0, dtype=np.bool_)
        self._dirty = np.zeros(0, dtype=np.int64)
        self._dirty_flag = np.zeros(0, dtype=np.bool_)
        # Per flow, its bottleneck when last checked (a link, CAP, or
        # UNKNOWN); per link, the check pass that marked it.
        self._bottleneck = np.zeros(0, dtype=np.int64)
        self._link_mark = np.zeros(0, dtype=np.int64)
        # Counters, read and written by the compiled functions (see _COUNTS).
        self._counts = np.zeros(len(_COUNTS), dtype=np.int64)
        self._arrays = None
        self.grow_links(n_links)

    updates = property(lambda self: int(self._counts[UPDATES]))
    full_recomputes = property(lambda self: int(self._counts[FULL]))
    flows_computed = property(lambda self: int(self._counts[COMPUTED]))   # in A, summed
    fills = property(lambda self: int(self._counts[FILLS]))               # fillings of A
    flows_checked = property(lambda self: int(self._counts[CHECKED]))     # bottleneck checks

    def arrays(self) -> tuple:
        """Every array, as the compiled functions take them (`live_insert`,
        `live_remove`, `live_dirty`, `live_update`); made again after growth."""
        if self._arrays is None:
            self._arrays = (self.rate, self._in_lists, self._in_set, self._flow_stamp,
                            self._slot_next, self._slot_prev, self._slot_flow,
                            self._link_head, self._link_count, self._link_total,
                            self._link_stamp, self._link_max_stamp, self._link_max,
                            self._residual, self._local_id, self._stamp, self._seeds,
                            self._seeded, self._dirty, self._dirty_flag, self._counts,
                            self._bottleneck, self._link_mark)
        return self._arrays

    # ------------------------------------------------------------------ sizes
    @staticmethod
    def _grown(array: np.ndarray, size: int, fill) -> np.ndarray:
        if size <= len(array):
            return array
        new = np.full(size, fill, dtype=array.dtype)      # the caller's size: it grows them
        new[:len(array)] = array
        return new

    def grow_flows(self, n_flows: int) -> None:
        if n_flows <= len(self.rate):
            return
        self.rate = self._grown(self.rate, n_flows, 0.0)
        self._in_lists = self._grown(self._in_lists, n_flows, False)
        self._in_set = self._grown(self._in_set, n_flows, False)
        self._flow_stamp = self._grown(self._flow_stamp, n_flows, 0)
        self._seeds = self._grown(self._seeds, n_flows, 0)
        self._seeded = self._grown(self._seeded, n_flows, False)
        self._bottleneck = self._grown(self._bottleneck, n_flows, UNKNOWN)
        self._arrays = None

    def grow_slots(self, n_slots: int) -> None:
        if n_slots <= len(self._slot_next):
            return
        self._slot_next = self._grown(self._slot_next, n_slots, -1)
        self._slot_prev = self._grown(self._slot_prev, n_slots, -1)
        self._slot_flow = self._grown(self._slot_flow, n_slots, -1)
        self._arrays = None

    def grow_links(self, n_links: int) -> None:
        if n_links <= len(self._link_head):
            return
        self._arrays = None
        self._dirty = self._grown(self._dirty, n_links, 0)
        self._dirty_flag = self._grown(self._dirty_flag, n_links, False)
        self._link_mark = self._grown(self._link_mark, n_links, 0)
        self._link_head = self._grown(self._link_head, n_links, -1)
        self._link_count = self._grown(self._link_count, n_links, 0)
        self._link_total = self._grown(self._link_total, n_links, 0.0)
        self._link_stamp = self._grown(self._link_stamp, n_links, 0)
        self._link_max_stamp = self._grown(self._link_max_stamp, n_links, 0)
        self._link_max = self._grown(self._link_max, n_links, 0.0)
        self._residual = self._grown(self._residual, n_links, 0.0)
        self._local_id = self._grown(self._local_id, n_links, -1)

    # ------------------------------------------------------------------ changes
    def insert(self, flows, path_start, path_len, path_links) -> None:
        """Flows that start transmitting on their current paths."""
        live_insert(self.arrays(), np.asarray(flows, dtype=np.int64), path_start, path_len,
                    path_links)

    def remove(self, flows, path_start, path_len, path_links) -> None:
        """Flows that stop transmitting, or whose path is about to change."""
        live_remove(self.arrays(), np.asarray(flows, dtype=np.int64), path_start, path_len,
                    path_links)

    def capacity_changed(self, links) -> None:
        live_dirty(self.arrays(), np.asarray(links, dtype=np.int64))

    def stats(self) -> dict:
        """Per update, on average: the flows filled, the fillings and the
        bottleneck checks; and the share of updates that filled every flow."""
        per = max(self.updates, 1)
        return {"updates": self.updates, "filled_per_update": self.flows_computed / per,
                "fills_per_update": self.fills / per,
                "checks_per_update": self.flows_checked / per,
                "full_share": self.full_recomputes / per}

    # ------------------------------------------------------------------ rates
    def update(self, tx, path_start, path_len, path_links, capacity, caps) -> None:
        """Make ``rate`` the max-min rates of the transmitting flows ``tx``
        (those with a path; the others' rate stays 0) on ``capacity`` (one
        per link, already times the efficiency) within ``caps`` (per flow)."""
        tx = np.asarray(tx, dtype=np.int64)
        live_update(self.arrays(), tx, len(tx), path_start, path_len, path_links, capacity,
                    caps)


# Indices of LiveRates._counts.
_COUNTS = (N_SEEDS, N_DIRTY, UPDATES, FULL, COMPUTED, FILLS, CHECKED) = range(7)


@njit(cache=True)
def live_insert(live, flows, path_start, path_len, links):
    """`LiveRates.insert` on its arrays (``live``: `LiveRates.arrays`)."""
    rate, in_lists, slot_next, slot_prev, slot_flow = live[0], live[1], live[4], live[5], live[6]
    link_head, link_count, seeds, seeded, counts = live[7], live[8], live[16], live[17], live[20]
    _insert(flows, path_start, path_len, links, slot_next, slot_prev, slot_flow, link_head,
            link_count, rate, in_lists)
    for f in flows:
        if not seeded[f]:
            seeded[f] = True
            seeds[counts[N_SEEDS]] = f
            counts[N_SEEDS] += 1


@njit(cache=True)
def live_remove(live, flows, path_start, path_len, links):
    """`LiveRates.remove` on its arrays."""
    rate, in_lists, slot_next, slot_prev = live[0], live[1], live[4], live[5]
    link_head, link_count, link_total = live[7], live[8], live[9]
    left = _remove(flows, path_start, path_len, links, slot_next, slot_prev, link_head,
                   link_count, link_total, rate, in_lists)
    live_dirty(live, left)


@njit(cache=True)
def live_dirty(live, links):
    """Links whose capacity or members changed (each noted once)."""
    dirty, dirty_flag, counts = live[18], live[19], live[20]
    for link in links:
        if not dirty_flag[link]:
            dirty_flag[link] = True
            dirty[counts[N_DIRTY]] = link
            counts[N_DIRTY] += 1


@njit(cache=True)
def live_update(live, tx, n_tx, path_start, path_len, links, capacity, caps):
    """`LiveRates.update` on its arrays, for the flows ``tx[:n_tx]``."""
    (rate, in_lists, in_set, flow_stamp, slot_next, slot_prev, slot_flow, link_head,
     link_count, link_total, link_stamp, link_max_stamp, link_max, residual, local_id, stamp,
     seeds, seeded, dirty, dirty_flag, counts, bottleneck, link_mark) = live
    n_seeds, n_dirty = counts[N_SEEDS], counts[N_DIRTY]
    for i in range(n_seeds):
        seeded[seeds[i]] = False
    for i in range(n_dirty):
        dirty_flag[dirty[i]] = False
    counts[N_SEEDS] = 0
    counts[N_DIRTY] = 0
    counts[UPDATES] += 1
    full, computed, fills, checked = _update(
        seeds[:n_seeds], dirty[:n_dirty], n_tx, path_start, path_len, links, slot_next,
        slot_flow, link_head, link_total, link_stamp, link_max_stamp, link_max, residual,
        local_id, capacity, caps, rate, in_lists, in_set, flow_stamp, stamp, bottleneck,
        link_mark, CHECK_TOLERANCE, FULL_RECOMPUTE_SHARE)
    counts[COMPUTED] += computed
    counts[FILLS] += fills
    counts[CHECKED] += checked
    if full:
        counts[FULL] += 1
        listed = np.empty(n_tx, dtype=np.int64)
        n_listed = 0
        for i in range(n_tx):
            if in_lists[tx[i]]:
                listed[n_listed] = tx[i]
                n_listed += 1
        listed = listed[:n_listed]
        new = _progressive_filling(path_start[listed], path_len[listed], links, capacity,
                                   caps[listed], local_id, RELATIVE_TOLERANCE)
        for i in range(n_listed):
            rate[listed[i]] = new[i]
            bottleneck[listed[i]] = UNKNOWN         # found again when next checked
        _retotal(listed, path_start, path_len, links, link_total, rate)


# ---------------------------------------------------------------- compiled steps

@njit(cache=True)
def _insert(flows, path_start, path_len, links, slot_next, slot_prev, slot_flow, link_head,
            link_count, rate, in_lists):
    for f in flows:
        if in_lists[f] or path_len[f] == 0:
            continue
        in_lists[f] = True
        rate[f] = 0.0
        for e in range(path_start[f], path_start[f] + path_len[f]):
            link = links[e]
            slot_flow[e] = f
            slot_prev[e] = -1
            head = link_head[link]
            slot_next[e] = head
            if head >= 0:
                slot_prev[head] = e
            link_head[link] = e
            link_count[link] += 1


@njit(cache=True)
def _remove(flows, path_start, path_len, links, slot_next, slot_prev, link_head, link_count,
            link_total, rate, in_lists):
    """Unlink the flows' slots and take their rates off the totals; returns
    the links they left (dirty: their other flows may now get more)."""
    total = 0
    for f in flows:
        if in_lists[f]:
            total += path_len[f]
    left = np.empty(total, dtype=np.int64)
    k = 0
    for f in flows:
        if not in_lists[f]:
            continue
        in_lists[f] = False
        r = rate[f]
        for e in range(path_start[f], path_start[f] + path_len[f]):
            link = links[e]
            before, after = slot_prev[e], slot_next[e]
            if before >= 0:
                slot_next[before] = after
            else:
                link_head[link] = after
            if after >= 0:
                slot_prev[after] = before
            link_count[link] -= 1
            if link_count[link] == 0:
                link_total[link] = 0.0          # exact again: no rounding left behind
            elif r < np.inf:
                link_total[link] -= r
            left[k] = link
            k += 1
        rate[f] = 0.0
    return left


@njit(cache=True)
def _retotal(flows, path_start, path_len, links, link_total, rate):
    for f in flows:
        for e in range(path_start[f], path_start[f] + path_len[f]):
            link_total[links[e]] = 0.0
    for f in flows:
        if rate[f] < np.inf:
            for e in range(path_start[f], path_start[f] + path_len[f]):
                link_total[links[e]] += rate[f]


@njit(cache=True)
def _link_max_rate(link, stamp, link_head, slot_next, slot_flow, rate, link_max_stamp,
                   link_max):
    if link_max_stamp[link] != stamp:
        best = 0.0
        e = link_head[link]
        while e >= 0:
            r = rate[slot_flow[e]]
            if r > best:
                best = r
            e = slot_next[e]
        link_max[link] = best
        link_max_stamp[link] = stamp
    return link_max[link]


@njit(cache=True)
def _bottleneck_of(f, stamp, path_start, path_len, links, slot_next, slot_flow, link_head,
                   link_total, link_max_stamp, link_max, capacity, caps, rate, tolerance):
    """Flow f's bottleneck: a link of its path, CAP (its own cap, or nothing
    limits it), or UNKNOWN when it has none (it could get more)."""
    r = rate[f]
    if r == np.inf or r >= caps[f] * (1.0 - tolerance):
        return CAP
    for e in range(path_start[f], path_start[f] + path_len[f]):
        link = links[e]
        c = capacity[link]
        if c <= 0.0:
            if r == 0.0:
                return link                     # a dark link: waiting is its due
            continue
        if link_total[link] >= c * (1.0 - tolerance):
            top = _link_max_rate(link, stamp, link_head, slot_next, slot_flow, rate,
                                 link_max_stamp, link_max)
            if r >= top * (1.0 - tolerance):
                return link
    return UNKNOWN


@njit(cache=True)
def _update(seeds, dirty, n_tx, path_start, path_len, links, slot_next, slot_flow, link_head,
            link_total, link_stamp, link_max_stamp, link_max, residual, local_id,
            capacity, caps, rate, in_lists, in_set, flow_stamp, stamp_box, bottleneck,
            link_mark, tolerance, full_share):
    """The update of the module docstring.  Returns (whether every rate
    must be computed anew instead: A too large, or not converging; A's size;
    the fillings of A; the bottleneck checks)."""
    # A, the flows to compute, as a growing list.
    members = np.empty(max(len(seeds), 16), dtype=np.int64)
    n_members = 0
    for f in seeds:
        if in_lists[f] and not in_set[f]:
            members = _pushed(members, n_members, f)
            n_members += 1
            in_set[f] = True
    filled = 0                          # A's size at the last fill (0: never filled)
    passes = 0
    checked = 0
    check = dirty.copy()
    n_check = len(check)
    full = False
    while True:
        if n_members > full_share * n_tx:
            full = True
            break
        if n_members > filled:
            # Take A's rates off its links, fill A on what is left, put them back.
            for i in range(n_members):
                f = members[i]
                r = rate[f]
                if r > 0.0 and r < np.inf:
                    for e in range(path_start[f], path_start[f] + path_len[f]):
                        link_total[links[e]] -= r
                rate[f] = 0.0
            starts = np.empty(n_members, dtype=np.int64)
            lengths = np.empty(n_members, dtype=np.int64)
            cap = np.empty(n_members)
            for i in range(n_members):
                f = members[i]
                starts[i] = path_start[f]
                lengths[i] = path_len[f]
                cap[i] = caps[f]
                for e in range(path_start[f], path_start[f] + path_len[f]):
                    link = links[e]
                    left = capacity[link] - link_total[link]
                    residual[link] = left if left > 0.0 else 0.0
            new = _progressive_filling(starts, lengths, links, residual, cap, local_id,
                                       RELATIVE_TOLERANCE)
            extra = 0
            for i in range(n_members):
                extra += lengths[i]
            grown = np.empty(n_check + extra, dtype=np.int64)
            grown[:n_check] = check[:n_check]
            check = grown
            for i in range(n_members):
                f = members[i]
                rate[f] = new[i]
                for e in range(path_start[f], path_start[f] + path_len[f]):
                    if new[i] < np.inf:
                        link_total[links[e]] += new[i]
                    check[n_check] = links[e]
                    n_check += 1
            filled = n_members
            passes += 1
        # Check every flow on a changed link; collect the violators.
        stamp_box[0] += 1
        stamp = stamp_box[0]
        for j in range(n_check):
            link_mark[check[j]] = stamp
        violators = np.empty(16, dtype=np.int64)
        n_violators = 0
        for j in range(n_check):
            link = check[j]
            if link_stamp[link] == stamp:
                continue
            link_stamp[link] = stamp
            overloaded = link_total[link] > capacity[link] * (1.0 + tolerance)
            e = link_head[link]
            while e >= 0:
                g = slot_flow[e]
                if flow_stamp[g] != stamp or overloaded:
                    flow_stamp[g] = stamp
                    if overloaded:
                        violators = _pushed(violators, n_violators, g)
                        n_violators += 1
                        e = slot_next[e]
                        continue
                    # Its bottleneck still holds if neither its rate (it is
                    # not in A) nor that link (it is not checked) changed.
                    found = bottleneck[g]
                    if not in_set[g] and (found == CAP or (found >= 0 and
                                                          link_mark[found] != stamp)):
                        e = slot_next[e]
                        continue
                    checked += 1
                    found = _bottleneck_of(g, stamp, path_start, path_len, links, slot_next,
                                           slot_flow, link_head, link_total, link_max_stamp,
                                           link_max, capacity, caps, rate, tolerance)
                    bottleneck[g] = found
                    if found == UNKNOWN:
                        violators = _pushed(violators, n_violators, g)
                        n_violators += 1
                e = slot_next[e]
        if n_violators == 0:
            break
        # A grows by each violator and every flow sharing a link with it
        # (each link's flows once: a link of thousands of flows that lost
        # one has as many violators).
        before = n_members
        stamp_box[0] += 1
        stamp = stamp_box[0]
        for i in range(n_violators):
            g = violators[i]
            for e in range(path_start[g], path_start[g] + path_len[g]):
                if link_stamp[links[e]] == stamp:
                    continue
                link_stamp[links[e]] = stamp
                s = link_head[links[e]]
                while s >= 0:
                    h = slot_flow[s]
                    if not in_set[h]:
                        in_set[h] = True
                        members = _pushed(members, n_members, h)
                        n_members += 1
                    s = slot_next[s]
        if n_members == before:
            full = True                 # no progress: only rounding can do that
            break
        # The links checked so far are checked again after the next fill
        # (their members' rates may change); A's links are added then.
        n_check = 0
    for i in range(n_members):
        in_set[members[i]] = False
    return full, n_members, passes, checked


@njit(cache=True)
def _pushed(array, used, value):
    """``array`` with ``value`` at ``used`` (the first ``used`` are taken),
    doubled first when it is full."""
    if used == len(array):
        grown = np.empty(2 * len(array), dtype=array.dtype)
        grown[:used] = array
        array = grown
    array[used] = value
    return array
