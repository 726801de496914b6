"""Max-min fair rates of flows over shared links, by progressive filling.

A rate allocation is *max-min fair* when no flow's rate can grow without
lowering the rate of a flow that already has less.  Every flow then has a
*bottleneck*: a saturated link on which no other flow gets more than it does
(or its own rate cap).  Progressive filling ("water-filling") finds it: all
flows grow together; when a link fills up, the flows crossing it freeze at
the current level and the others keep growing:

    rate
     ^                 f3 (alone on link C) keeps growing ...
     |            ____/
     |  ______---    f1, f2 freeze: link A (shared by f1, f2, f3) is full
     | /
     +-------------------------------------> rounds

Compiled form (numba), one *round* per distinct bottleneck level:

1. for every link in use, its fair share = residual capacity / number of
   unfrozen flows crossing it;
2. the level ``s`` = the smallest such share, or the smallest rate cap of an
   unfrozen flow if that is smaller;
3. freeze, at rate ``s``, every unfrozen flow crossing a link whose share is
   within a relative 1e-9 of ``s`` (its bottleneck), and every flow whose cap
   is within that tolerance of ``s`` (at its cap);
4. subtract the frozen flows' rates from their links' residual capacity and
   their number from their links' count.

The tolerance makes links that tie in exact arithmetic tie in floating point
too, so symmetric flows freeze in one round at one rate.

What keeps a round cheap:

* a link that a single flow crosses is that flow's cap, not a link: it is
  never scanned (on a Clos at 4,096 GPUs, about a fifth of the links in use);
* the caps are sorted once, so each round's smallest unfrozen cap is at a
  pointer that only moves forward;
* one pass over the links still crossed by an unfrozen flow finds the level,
  drops the links no unfrozen flow crosses any more, and keeps the few
  within the tolerance of the smallest share so far as the round's
  candidate bottlenecks.

The rates are the same, bit for bit, as those of the plain rounds above
(checked on recorded instances of every fabric at 2,048 GPUs: SiP-OCS's 140
rounds an event took 0.5 of the time, RFabric's 30 rounds 0.6).

Complexity: O(P + U) per round for the P (flow, link) pairs of the flows
still unfrozen and the U links in use (renumbered 0..U-1 through a scratch
table the caller may keep, so that a few flows on a 16K-GPU fabric do not
cost a pass over all its links).  There are at most as many rounds as
distinct rates in the answer; a symmetric collective needs a handful.  The
loops are compiled because the engine calls this at every event (through
`rates.LiveRates`, on the flows a change reaches): numpy's ~15 calls per
round cost more than the arithmetic (0.4 ms against 0.03 ms a call on a
thousand flows).

Conventions:

* capacities and caps are in any one unit (the engine uses bits per second);
  ``np.inf`` is an unconstrained link or no cap;
* a flow crossing a link of capacity 0 (a dark circuit) gets rate 0 and uses
  nothing elsewhere;
* a flow crossing no link gets its cap, or ``np.inf`` when it has none: the
  caller decides what a path-less flow means (the engine makes it wait).
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from numba import njit

# Links whose fair share is within this relative distance of the smallest one
# are bottlenecks of the same round.
RELATIVE_TOLERANCE = 1e-9


def max_min_rates(indptr, links, capacity, caps=None, *, check: bool = True,
                  scratch: Optional[np.ndarray] = None) -> np.ndarray:
    """The max-min fair rate of every flow.

    ``indptr``/``links``: the flows as CSR; flow f crosses links
    ``links[indptr[f]:indptr[f + 1]]``, each link at most once per flow.
    ``capacity``: one float per link (0: dark, ``np.inf``: unconstrained).
    ``caps``: optional rate cap per flow, or one for all (``np.inf``: none).
    ``check=False`` skips the validation of the inputs (capacities and caps
    >= 0, link ids in range) for a caller that guarantees them (the engine).
    ``scratch``: optional int64 array of one -1 per link, kept by a caller
    that calls often; it is all -1 again on return.
    Returns one float per flow, in the unit of ``capacity``.
    """
    indptr = np.ascontiguousarray(indptr, dtype=np.int64)
    links = np.ascontiguousarray(links, dtype=np.int64)
    capacity = np.ascontiguousarray(capacity, dtype=np.float64)
    n_flows = len(indptr) - 1
    n_links = len(capacity)
    if caps is None:
        caps = np.full(n_flows, np.inf)
    else:
        caps = np.ascontiguousarray(np.broadcast_to(np.asarray(caps, dtype=np.float64),
                                                    (n_flows,)))
    if check:
        # One reduction each: a NaN makes the minimum NaN, which fails ">= 0" too.
        if n_links and not capacity.min() >= 0:
            raise ValueError("link capacities must be >= 0 (np.inf for unconstrained)")
        if n_flows and not caps.min() >= 0:
            raise ValueError("rate caps must be >= 0 (np.inf for none)")
        if len(links) and (links.min() < 0 or links.max() >= n_links):
            raise ValueError(f"link ids must be in [0, {n_links})")
    if scratch is None or len(scratch) != n_links:
        scratch = np.full(n_links, -1, dtype=np.int64)
    return _progressive_filling(indptr[:-1], np.diff(indptr), links, capacity, caps, scratch,
                                RELATIVE_TOLERANCE)


def max_min_rates_of_paths(starts, lengths, links, capacity, caps, scratch) -> np.ndarray:
    """`max_min_rates` with flow f crossing ``links[starts[f]:starts[f] +
    lengths[f]]``: the engine's paths are slices of one array of every path
    it ever gave, read in place.  Unchecked (the engine checks its inputs);
    ``caps`` one per flow, ``scratch`` as in `max_min_rates` (required)."""
    return _progressive_filling(starts, lengths, links, capacity, caps, scratch,
                                RELATIVE_TOLERANCE)


@njit(cache=True)
def _progressive_filling(starts, lengths, links, capacity, caps, local_id, tolerance):
    n_flows = len(starts)
    rates = np.zeros(n_flows)
    # The flows still to freeze, and the links in use renumbered 0..n_used-1.
    active = np.empty(n_flows, dtype=np.int64)
    n_active = 0
    pairs = 0
    for f in range(n_flows):
        pairs += lengths[f]
    used = np.empty(pairs, dtype=np.int64)
    n_used = 0
    # The active flows' paths in local link numbers, as CSR (flow f: pairs
    # flow_ptr[f]..flow_ptr[f + 1]; none for a flow that is not active).
    flow_ptr = np.zeros(n_flows + 1, dtype=np.int64)
    flow_u = np.empty(pairs, dtype=np.int64)
    crossing = np.zeros(pairs, dtype=np.int64)
    p = 0
    for f in range(n_flows):
        start, stop = starts[f], starts[f] + lengths[f]
        flow_ptr[f] = p
        if start == stop:
            rates[f] = caps[f]              # path-less: limited by its cap alone
            continue
        dark = False
        for e in range(start, stop):
            if capacity[links[e]] <= 0.0:
                dark = True                 # a dark link stops it: rate 0, uses nothing
                break
        if dark:
            continue
        active[n_active] = f
        n_active += 1
        for e in range(start, stop):
            link = links[e]
            if local_id[link] < 0:
                local_id[link] = n_used
                used[n_used] = link
                n_used += 1
            u = local_id[link]
            flow_u[p] = u
            p += 1
            crossing[u] += 1
    flow_ptr[n_flows] = p
    residual = np.empty(n_used)
    for u in range(n_used):
        residual[u] = capacity[used[u]]
    # The unfrozen flows crossing each used link, as CSR: a round visits the
    # flows of its bottleneck links only, not every unfrozen flow's path.
    link_ptr = np.zeros(n_used + 1, dtype=np.int64)
    for u in range(n_used):
        link_ptr[u + 1] = link_ptr[u] + crossing[u]
    link_flows = np.empty(link_ptr[n_used], dtype=np.int64)
    fill = link_ptr[:n_used].copy()
    for i in range(n_active):
        f = active[i]
        for e in range(flow_ptr[f], flow_ptr[f + 1]):
            u = flow_u[e]
            link_flows[fill[u]] = f
            fill[u] += 1
    is_frozen = np.zeros(n_flows, dtype=np.bool_)
    # A link that only one flow crosses limits that flow alone: it is the
    # flow's cap, not a link to scan every round (on a Clos at 4,096 GPUs,
    # about a fifth of the links in use at an event: host links, mostly).
    cap = np.empty(n_flows)
    for i in range(n_active):
        cap[active[i]] = caps[active[i]]
    live = np.empty(n_used, dtype=np.int64)
    n_live = 0
    for u in range(n_used):
        if crossing[u] == 1:
            f = link_flows[link_ptr[u]]
            if residual[u] < cap[f]:
                cap[f] = residual[u]
        else:
            live[n_live] = u
            n_live += 1
    # The flows with a cap, smallest first: each round's smallest unfrozen
    # cap is at a pointer that only moves forward.
    capped = np.empty(n_active, dtype=np.int64)
    n_capped = 0
    for i in range(n_active):
        if cap[active[i]] < np.inf:
            capped[n_capped] = active[i]
            n_capped += 1
    capped = capped[:n_capped]
    capped = capped[np.argsort(cap[capped], kind="mergesort")]
    next_cap = 0
    freezing = np.empty(n_active, dtype=np.int64)
    candidates = np.empty(n_used, dtype=np.int64)
    # Each link's fair share, kept up to date for the links whose flows froze.
    share = np.empty(n_used)
    for u in range(n_used):
        share[u] = residual[u] / crossing[u]
    left = n_active
    while left > 0:
        # One pass over the live links: drop those no unfrozen flow crosses
        # any more, find the level, and keep every link that was within the
        # tolerance of the smallest share so far (filtered below).
        level = np.inf
        bound = np.inf                  # level x (1 + tolerance)
        n_candidates = 0
        kept = 0
        for j in range(n_live):
            u = live[j]
            if crossing[u] == 0:
                continue
            live[kept] = u
            kept += 1
            if share[u] <= bound:
                if share[u] < level:
                    level = share[u]
                    bound = level * (1.0 + tolerance)
                candidates[n_candidates] = u
                n_candidates += 1
        n_live = kept
        while next_cap < n_capped and is_frozen[capped[next_cap]]:
            next_cap += 1
        if next_cap < n_capped and cap[capped[next_cap]] < level:
            level = cap[capped[next_cap]]
        if level == np.inf:
            # Only unconstrained links and no caps: nothing limits these flows.
            for i in range(n_active):
                if not is_frozen[active[i]]:
                    rates[active[i]] = np.inf
            break
        threshold = level * (1.0 + tolerance)
        n_freezing = 0
        for c in range(n_candidates):
            u = candidates[c]
            if share[u] <= threshold:
                for k in range(link_ptr[u], link_ptr[u + 1]):
                    f = link_flows[k]
                    if not is_frozen[f]:
                        is_frozen[f] = True
                        freezing[n_freezing] = f
                        n_freezing += 1
        while next_cap < n_capped and cap[capped[next_cap]] <= threshold:
            f = capped[next_cap]
            if not is_frozen[f]:
                is_frozen[f] = True
                freezing[n_freezing] = f
                n_freezing += 1
            next_cap += 1
        # Counts and residuals change only now: every bottleneck of this round
        # was found with the shares it started with.
        for i in range(n_freezing):
            f = freezing[i]
            rates[f] = min(level, caps[f])
            for e in range(flow_ptr[f], flow_ptr[f + 1]):
                u = flow_u[e]
                crossing[u] -= 1
                # Rounding must not leave a link with a negative residual.
                residual[u] = max(residual[u] - rates[f], 0.0)
        for i in range(n_freezing):
            f = freezing[i]
            for e in range(flow_ptr[f], flow_ptr[f + 1]):
                u = flow_u[e]
                share[u] = residual[u] / crossing[u] if crossing[u] > 0 else np.inf
        left -= n_freezing
    for u in range(n_used):
        local_id[used[u]] = -1
    return rates
