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

What it keeps.  Per link: its transmitting flows (a doubly linked list
through their *slots*, one per link of a flow's path), their number and
their total rate.  Per flow: its rate.  The flows in the lists are numbered
afresh, densely, as they start (a *local* number, taken back when they
stop): an RL iteration at 4,096 GPUs has 1.4 million flows, but only a few
thousand transmit at a time, and a check follows the linked lists from slot
to flow to slot.  Through arrays indexed by the flows' own numbers and
paths, each step of that walk was a cache miss in 100 MB of arrays; by local
numbers, the flows that transmit and their slots fit in the processor's
second-level cache.  Flow ``u``'s path is copied to slots ``u * stride`` to
``u * stride + length - 1`` (``stride``: a power of two at least as long as
every path in the lists), so a slot's flow is ``slot >> shift``.  The local
arrays grow, by `LiveRates.reserve`, before flows start: the compiled event
loop asks for room (`live_has_room`) and returns to Python when there is
none.  Everything else is scratch, read only where the same call wrote it
(stamps tell a pass's marks from older ones).
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

# The local arrays' first sizes: flows, and slots per flow (a power of two).
FIRST_FLOWS, FIRST_STRIDE = 1024, 8


class LiveRates:
    """The max-min rates of the transmitting flows, kept up to date.

    The caller (`engine.FlowSim`) owns the paths: flow f crosses
    ``path_links[path_start[f]:path_start[f] + path_len[f]]``.  It calls
    `insert` when flows start transmitting (their rate is 0 until the next
    `update`; their path is copied then), `remove` when they stop and
    before their path changes, `capacity_changed` with the links whose
    capacity changed, and `update(tx)` before it reads ``rate``.
    ``grow_flows`` and ``grow_links`` keep the arrays as large as the
    caller's; `reserve` makes room for more flows in the lists (`insert`
    does it itself; the compiled loop asks for it).
    """

    def __init__(self, n_links: int):
        self.rate = np.zeros(0)                     # bits per second, per flow
        self._local = np.zeros(0, dtype=np.int64)   # per flow, its local number (-1: none)
        # Per local number: the flow, its rate, cap, path length, the check
        # pass that saw it, its bottleneck when last checked (a link, CAP or
        # UNKNOWN), whether it is in A (scratch) and among the seeds.
        self._u_flow = np.zeros(0, dtype=np.int64)
        self._u_rate = np.zeros(0)
        self._u_cap = np.zeros(0)
        self._u_len = np.zeros(0, dtype=np.int64)
        self._u_stamp = np.zeros(0, dtype=np.int64)
        self._u_bottleneck = np.zeros(0, dtype=np.int64)
        self._u_in_set = np.zeros(0, dtype=np.bool_)
        self._u_seeded = np.zeros(0, dtype=np.bool_)
        self._free = np.zeros(0, dtype=np.int64)    # a stack: the next is the last
        # Per slot (local number x stride + hop): its link and list neighbours.
        self._slot_link = np.zeros(0, dtype=np.int64)
        self._slot_next = np.zeros(0, dtype=np.int64)
        self._slot_prev = np.zeros(0, dtype=np.int64)
        # Per link, one row of each (see _LINK_INTS and _LINK_FLOATS): what a
        # check reads of a link is in one or two cache lines, not in seven
        # arrays.
        self._link_i = np.zeros((0, len(_LINK_INTS)), dtype=np.int64)
        self._link_f = np.zeros((0, len(_LINK_FLOATS)))
        self._stamp = np.zeros(1, dtype=np.int64)   # the last check pass's number
        # The changes since the last update, each once: the flows that
        # started or moved (seeds, by local number) and the links that
        # changed (dirty).
        self._seeds = np.zeros(0, dtype=np.int64)
        self._dirty = np.zeros(0, dtype=np.int64)
        # Counters and sizes, read and written by the compiled functions (see _COUNTS).
        self._counts = np.zeros(len(_COUNTS), dtype=np.int64)
        self._arrays = None
        self.grow_links(n_links)
        self._resize(FIRST_FLOWS, FIRST_STRIDE)

    updates = property(lambda self: int(self._counts[UPDATES]))
    full_recomputes = property(lambda self: int(self._counts[FULL]))
    flows_computed = property(lambda self: int(self._counts[COMPUTED]))   # in A, summed
    fills = property(lambda self: int(self._counts[FILLS]))               # fillings of A
    flows_checked = property(lambda self: int(self._counts[CHECKED]))     # bottleneck checks
    listed = property(lambda self: int(self._counts[LISTED]))   # flows in the lists now

    def arrays(self) -> tuple:
        """Every array, as the compiled functions take them (`live_insert`,
        `live_remove`, `live_dirty`, `live_update`, `live_has_room`); made
        again after growth."""
        if self._arrays is None:
            self._arrays = (self.rate, self._local, self._u_flow, self._u_rate, self._u_cap,
                            self._u_len, self._u_stamp, self._u_bottleneck, self._u_in_set,
                            self._u_seeded, self._free, self._slot_link, self._slot_next,
                            self._slot_prev, self._link_i, self._link_f, self._stamp,
                            self._seeds, self._dirty, self._counts)
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
        self._local = self._grown(self._local, n_flows, -1)
        self._arrays = None

    def grow_links(self, n_links: int) -> None:
        if n_links <= len(self._link_i):
            return
        self._arrays = None
        self._dirty = self._grown(self._dirty, n_links, 0)
        ints = np.zeros((n_links, len(_LINK_INTS)), dtype=np.int64)
        ints[:, HEAD] = ints[:, LOCAL_ID] = -1
        ints[:len(self._link_i)] = self._link_i
        floats = np.zeros((n_links, len(_LINK_FLOATS)))
        floats[:len(self._link_f)] = self._link_f
        self._link_i, self._link_f = ints, floats

    def reserve(self, flows: int, longest: int) -> None:
        """Room in the lists for ``flows`` more flows, with paths of up to
        ``longest`` links."""
        size, stride = len(self._u_flow), len(self._slot_link) // max(len(self._u_flow), 1)
        wanted = self.listed + flows
        if wanted <= size and longest <= stride:
            return
        if wanted > size:
            size = max(wanted, 2 * size)
        while stride < longest:
            stride *= 2
        self._resize(size, stride)

    def _resize(self, size: int, stride: int) -> None:
        """Local arrays for ``size`` flows of ``stride`` slots: the flows keep
        their local numbers, the slots move to their new places."""
        old_size = len(self._u_flow)
        old_stride = len(self._slot_link) // old_size if old_size else stride
        self._u_flow = self._grown(self._u_flow, size, -1)
        self._u_rate = self._grown(self._u_rate, size, 0.0)
        self._u_cap = self._grown(self._u_cap, size, np.inf)
        self._u_len = self._grown(self._u_len, size, 0)
        self._u_stamp = self._grown(self._u_stamp, size, 0)
        self._u_bottleneck = self._grown(self._u_bottleneck, size, UNKNOWN)
        self._u_in_set = self._grown(self._u_in_set, size, False)
        self._u_seeded = self._grown(self._u_seeded, size, False)
        seeds = np.zeros(size, dtype=np.int64)
        seeds[:len(self._seeds)] = self._seeds
        self._seeds = seeds
        # The new numbers go under the free ones: the lowest numbers, and the
        # ones freed last, are taken first (they are in the cache).
        free = self._free[:self._counts[N_FREE]]
        self._free = np.concatenate([np.arange(size - 1, old_size - 1, -1, dtype=np.int64),
                                     free])
        self._counts[N_FREE] = len(self._free)
        self._free = self._grown(self._free, size, 0)

        def moved(slots):       # old slot numbers (or -1) -> new ones
            return np.where(slots >= 0, (slots // old_stride) * stride + slots % old_stride, -1)

        link = np.full(size * stride, -1, dtype=np.int64)
        after = np.full(size * stride, -1, dtype=np.int64)
        before = np.full(size * stride, -1, dtype=np.int64)
        if old_size:
            old = np.arange(old_size * old_stride, dtype=np.int64)
            new = moved(old)
            link[new], after[new] = self._slot_link, moved(self._slot_next)
            before[new] = moved(self._slot_prev)
            self._link_i[:, HEAD] = moved(self._link_i[:, HEAD])
        self._slot_link, self._slot_next, self._slot_prev = link, after, before
        self._counts[SHIFT] = stride.bit_length() - 1
        self._arrays = None

    # ------------------------------------------------------------------ changes
    def insert(self, flows, path_start, path_len, path_links, caps, capacity) -> None:
        """Flows that start transmitting on their current paths, with their
        rate caps (per flow), on links of ``capacity`` (as `update`'s)."""
        flows = np.asarray(flows, dtype=np.int64)
        if len(flows):
            self.reserve(len(flows), int(path_len[flows].max()))
        live_insert(self.arrays(), flows, path_start, path_len, path_links, caps, capacity)

    def remove(self, flows) -> None:
        """Flows that stop transmitting, or whose path is about to change."""
        live_remove(self.arrays(), np.asarray(flows, dtype=np.int64))

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
    def update(self, tx, capacity) -> None:
        """Make ``rate`` the max-min rates of the transmitting flows ``tx``
        (those with a path; the others' rate stays 0) on ``capacity`` (one
        per link, already times the efficiency), on the paths and within the
        caps given to `insert`."""
        tx = np.asarray(tx, dtype=np.int64)
        live_update(self.arrays(), tx, len(tx), capacity)


# Indices of LiveRates._counts.
_COUNTS = (N_SEEDS, N_DIRTY, UPDATES, FULL, COMPUTED, FILLS, CHECKED, LISTED, N_FREE,
           SHIFT) = range(10)

# Columns of a link's rows: its list's first slot and length, the passes
# that saw it, marked it and found its largest rate, its number in a
# filling (scratch) and whether it is dirty; its total rate, largest rate,
# residual (scratch) and capacity (a copy, taken when it is dirty or a flow
# starts on it).
_LINK_INTS = (HEAD, COUNT, STAMP, MAX_STAMP, MARK, LOCAL_ID, DIRTY) = range(7)
_LINK_FLOATS = (TOTAL, MAX, RESIDUAL, CAPACITY) = range(4)


@njit(cache=True)
def live_has_room(live, count, longest):
    """Whether ``count`` more flows with paths of up to ``longest`` links
    fit in the lists without `LiveRates.reserve`."""
    u_flow, slot_link, counts = live[2], live[11], live[19]
    return count <= counts[N_FREE] and longest <= len(slot_link) // len(u_flow)


@njit(cache=True)
def live_insert(live, flows, path_start, path_len, links, caps, capacity):
    """`LiveRates.insert` on its arrays (``live``: `LiveRates.arrays`); the
    caller made room (`live_has_room`)."""
    (rate, local, u_flow, u_rate, u_cap, u_len, u_stamp, u_bottleneck, u_in_set, u_seeded,
     free, slot_link, slot_next, slot_prev, link_i, link_f) = live[:16]
    seeds, counts = live[17], live[19]
    shift = counts[SHIFT]
    stride = 1 << shift
    for f in flows:
        if local[f] >= 0 or path_len[f] == 0:
            continue
        if path_len[f] > stride or counts[N_FREE] == 0:
            raise ValueError("LiveRates: no room for a flow (reserve first)")
        counts[N_FREE] -= 1
        u = free[counts[N_FREE]]
        local[f] = u
        u_flow[u] = f
        rate[f] = 0.0
        u_rate[u] = 0.0
        u_cap[u] = caps[f]
        u_len[u] = path_len[f]
        u_bottleneck[u] = UNKNOWN
        counts[LISTED] += 1
        first = u << shift
        for h in range(path_len[f]):
            link = links[path_start[f] + h]
            e = first + h
            slot_link[e] = link
            slot_prev[e] = -1
            head = link_i[link, HEAD]
            slot_next[e] = head
            if head >= 0:
                slot_prev[head] = e
            link_i[link, HEAD] = e
            link_i[link, COUNT] += 1
            link_f[link, CAPACITY] = capacity[link]
        if not u_seeded[u]:
            u_seeded[u] = True
            seeds[counts[N_SEEDS]] = u
            counts[N_SEEDS] += 1


@njit(cache=True)
def live_remove(live, flows):
    """`LiveRates.remove` on its arrays: unlink the flows' slots, take their
    rates off the totals and note the links they left (dirty: their other
    flows may now get more)."""
    (rate, local, u_flow, u_rate, u_cap, u_len, u_stamp, u_bottleneck, u_in_set, u_seeded,
     free, slot_link, slot_next, slot_prev, link_i, link_f) = live[:16]
    dirty, counts = live[18], live[19]
    shift = counts[SHIFT]
    for f in flows:
        u = local[f]
        if u < 0:
            continue
        local[f] = -1
        u_flow[u] = -1
        r = u_rate[u]
        first = u << shift
        for e in range(first, first + u_len[u]):
            link = slot_link[e]
            before, after = slot_prev[e], slot_next[e]
            if before >= 0:
                slot_next[before] = after
            else:
                link_i[link, HEAD] = after
            if after >= 0:
                slot_prev[after] = before
            link_i[link, COUNT] -= 1
            if link_i[link, COUNT] == 0:
                link_f[link, TOTAL] = 0.0       # exact again: no rounding left behind
            elif r < np.inf:
                link_f[link, TOTAL] -= r
            if link_i[link, DIRTY] == 0:
                link_i[link, DIRTY] = 1
                dirty[counts[N_DIRTY]] = link
                counts[N_DIRTY] += 1
        rate[f] = 0.0
        u_rate[u] = 0.0
        free[counts[N_FREE]] = u
        counts[N_FREE] += 1
        counts[LISTED] -= 1


@njit(cache=True)
def live_dirty(live, links):
    """Links whose capacity or members changed (each noted once)."""
    link_i, dirty, counts = live[14], live[18], live[19]
    for link in links:
        if link_i[link, DIRTY] == 0:
            link_i[link, DIRTY] = 1
            dirty[counts[N_DIRTY]] = link
            counts[N_DIRTY] += 1


@njit(cache=True)
def live_update(live, tx, n_tx, capacity):
    """`LiveRates.update` on its arrays, for the flows ``tx[:n_tx]``."""
    (rate, local, u_flow, u_rate, u_cap, u_len, u_stamp, u_bottleneck, u_in_set, u_seeded,
     free, slot_link, slot_next, slot_prev, link_i, link_f, stamp, seeds, dirty,
     counts) = live
    n_seeds, n_dirty = counts[N_SEEDS], counts[N_DIRTY]
    for i in range(n_seeds):
        u_seeded[seeds[i]] = False
    for i in range(n_dirty):
        link = dirty[i]
        link_i[link, DIRTY] = 0
        link_f[link, CAPACITY] = capacity[link]
    counts[N_SEEDS] = 0
    counts[N_DIRTY] = 0
    counts[UPDATES] += 1
    shift = counts[SHIFT]
    full, computed, fills, checked = _update(
        seeds[:n_seeds], dirty[:n_dirty], n_tx, shift, slot_link, slot_next, link_i, link_f,
        rate, u_flow, u_rate, u_cap, u_len, u_stamp, u_bottleneck, u_in_set, stamp,
        CHECK_TOLERANCE, FULL_RECOMPUTE_SHARE)
    counts[COMPUTED] += computed
    counts[FILLS] += fills
    counts[CHECKED] += checked
    if full:
        # In the caller's order of the transmitting flows.
        counts[FULL] += 1
        listed = np.empty(n_tx, dtype=np.int64)
        n_listed = 0
        for i in range(n_tx):
            u = local[tx[i]]
            if u >= 0:
                listed[n_listed] = u
                n_listed += 1
        listed = listed[:n_listed]
        new = _progressive_filling(listed << shift, u_len[listed], slot_link, capacity,
                                   u_cap[listed], link_i[:, LOCAL_ID], RELATIVE_TOLERANCE)
        for i in range(n_listed):
            u = listed[i]
            u_rate[u] = new[i]
            rate[u_flow[u]] = new[i]
            u_bottleneck[u] = UNKNOWN               # found again when next checked
        _retotal(listed, shift, u_len, slot_link, link_f, u_rate)


# ---------------------------------------------------------------- compiled steps

@njit(cache=True)
def _retotal(listed, shift, u_len, slot_link, link_f, u_rate):
    for u in listed:
        for e in range(u << shift, (u << shift) + u_len[u]):
            link_f[slot_link[e], TOTAL] = 0.0
    for u in listed:
        if u_rate[u] < np.inf:
            for e in range(u << shift, (u << shift) + u_len[u]):
                link_f[slot_link[e], TOTAL] += u_rate[u]


@njit(cache=True)
def _link_max_rate(link, stamp, shift, link_i, link_f, slot_next, u_rate):
    if link_i[link, MAX_STAMP] != stamp:
        best = 0.0
        e = link_i[link, HEAD]
        while e >= 0:
            r = u_rate[e >> shift]
            if r > best:
                best = r
            e = slot_next[e]
        link_f[link, MAX] = best
        link_i[link, MAX_STAMP] = stamp
    return link_f[link, MAX]


@njit(cache=True)
def _bottleneck_of(u, stamp, shift, slot_link, slot_next, link_i, link_f, u_cap, u_len,
                   u_rate, tolerance):
    """Flow u's bottleneck: a link of its path, CAP (its own cap, or nothing
    limits it), or UNKNOWN when it has none (it could get more)."""
    r = u_rate[u]
    if r == np.inf or r >= u_cap[u] * (1.0 - tolerance):
        return CAP
    for e in range(u << shift, (u << shift) + u_len[u]):
        link = slot_link[e]
        c = link_f[link, CAPACITY]
        if c <= 0.0:
            if r == 0.0:
                return link                     # a dark link: waiting is its due
            continue
        if link_f[link, TOTAL] >= c * (1.0 - tolerance):
            top = _link_max_rate(link, stamp, shift, link_i, link_f, slot_next, u_rate)
            if r >= top * (1.0 - tolerance):
                return link
    return UNKNOWN


@njit(cache=True)
def _update(seeds, dirty, n_tx, shift, slot_link, slot_next, link_i, link_f, rate, u_flow,
            u_rate, u_cap, u_len, u_stamp, u_bottleneck, in_set, stamp_box, tolerance,
            full_share):
    """The update of the module docstring, on local numbers.  Returns
    (whether every rate must be computed anew instead: A too large, or not
    converging; A's size; the fillings of A; the bottleneck checks)."""
    # A, the flows to compute, as a growing list.
    members = np.empty(max(len(seeds), 16), dtype=np.int64)
    n_members = 0
    for u in seeds:
        if u_flow[u] >= 0 and not in_set[u]:
            members = _pushed(members, n_members, u)
            n_members += 1
            in_set[u] = True
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
                u = members[i]
                r = u_rate[u]
                if r > 0.0 and r < np.inf:
                    for e in range(u << shift, (u << shift) + u_len[u]):
                        link_f[slot_link[e], TOTAL] -= r
                u_rate[u] = 0.0
            starts = np.empty(n_members, dtype=np.int64)
            lengths = np.empty(n_members, dtype=np.int64)
            cap = np.empty(n_members)
            for i in range(n_members):
                u = members[i]
                starts[i] = u << shift
                lengths[i] = u_len[u]
                cap[i] = u_cap[u]
                for e in range(starts[i], starts[i] + lengths[i]):
                    link = slot_link[e]
                    left = link_f[link, CAPACITY] - link_f[link, TOTAL]
                    link_f[link, RESIDUAL] = left if left > 0.0 else 0.0
            new = _progressive_filling(starts, lengths, slot_link, link_f[:, RESIDUAL], cap,
                                       link_i[:, LOCAL_ID], RELATIVE_TOLERANCE)
            extra = 0
            for i in range(n_members):
                extra += lengths[i]
            grown = np.empty(n_check + extra, dtype=np.int64)
            grown[:n_check] = check[:n_check]
            check = grown
            for i in range(n_members):
                u = members[i]
                u_rate[u] = new[i]
                rate[u_flow[u]] = new[i]
                for e in range(starts[i], starts[i] + lengths[i]):
                    if new[i] < np.inf:
                        link_f[slot_link[e], TOTAL] += new[i]
                    check[n_check] = slot_link[e]
                    n_check += 1
            filled = n_members
            passes += 1
        # Check every flow on a changed link; collect the violators.
        stamp_box[0] += 1
        stamp = stamp_box[0]
        for j in range(n_check):
            link_i[check[j], MARK] = stamp
        violators = np.empty(16, dtype=np.int64)
        n_violators = 0
        for j in range(n_check):
            link = check[j]
            if link_i[link, STAMP] == stamp:
                continue
            link_i[link, STAMP] = stamp
            overloaded = link_f[link, TOTAL] > link_f[link, CAPACITY] * (1.0 + tolerance)
            e = link_i[link, HEAD]
            while e >= 0:
                g = e >> shift
                if u_stamp[g] != stamp or overloaded:
                    u_stamp[g] = stamp
                    if overloaded:
                        violators = _pushed(violators, n_violators, g)
                        n_violators += 1
                        e = slot_next[e]
                        continue
                    # Its bottleneck still holds if neither its rate (it is
                    # not in A) nor that link (it is not checked) changed.
                    found = u_bottleneck[g]
                    if not in_set[g] and (found == CAP or (found >= 0 and
                                                          link_i[found, MARK] != stamp)):
                        e = slot_next[e]
                        continue
                    checked += 1
                    found = _bottleneck_of(g, stamp, shift, slot_link, slot_next, link_i,
                                           link_f, u_cap, u_len, u_rate, tolerance)
                    u_bottleneck[g] = found
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
            for e in range(g << shift, (g << shift) + u_len[g]):
                link = slot_link[e]
                if link_i[link, STAMP] == stamp:
                    continue
                link_i[link, STAMP] = stamp
                s = link_i[link, HEAD]
                while s >= 0:
                    h = s >> shift
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
