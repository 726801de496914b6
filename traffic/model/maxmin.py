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

Vectorised form, one *round* per distinct bottleneck level:

1. for every link, its fair share = residual capacity / number of unfrozen
   flows crossing it (one ``np.bincount`` over the (flow, link) pairs of the
   unfrozen flows);
2. the level ``s`` = the smallest such share, or the smallest rate cap of an
   unfrozen flow if that is smaller;
3. freeze, at rate ``s``, every unfrozen flow crossing a link whose share is
   within a relative 1e-9 of ``s`` (its bottleneck), and every flow whose cap
   is within that tolerance of ``s`` (at its cap);
4. subtract the frozen flows' rates from their links' residual capacity.

The tolerance makes links that tie in exact arithmetic tie in floating point
too, so symmetric flows freeze in one round at one rate.

Complexity: O(P + L) once for P (flow, link) pairs and L links (the links in
use are renumbered 0..U-1), then O(P' + U) per round for the P' pairs of the
flows still unfrozen: the frozen pairs are dropped after every round.  There
are at most as many rounds as distinct rates in the answer (at most
min(F, U + number of distinct caps) for F flows); a symmetric collective
needs a handful.  The cost in practice is the ~15 numpy calls per round.

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

# Links whose fair share is within this relative distance of the smallest one
# are bottlenecks of the same round.
RELATIVE_TOLERANCE = 1e-9


def flow_of_each_entry(indptr: np.ndarray) -> np.ndarray:
    """For CSR ``indptr`` of F rows, the row index of each of its entries."""
    lengths = np.diff(indptr)
    return np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)


def max_min_rates(indptr, links, capacity, caps=None, *, check: bool = True) -> np.ndarray:
    """The max-min fair rate of every flow.

    ``indptr``/``links``: the flows as CSR; flow f crosses links
    ``links[indptr[f]:indptr[f + 1]]``, each link at most once per flow.
    ``capacity``: one float per link (0: dark, ``np.inf``: unconstrained).
    ``caps``: optional rate cap per flow, or one for all (``np.inf``: none).
    ``check=False`` skips the validation of the inputs (capacities and caps
    >= 0, link ids in range) for a caller that guarantees them (the engine).
    Returns one float per flow, in the unit of ``capacity``.
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    links = np.asarray(links, dtype=np.int64)
    capacity = np.asarray(capacity, dtype=np.float64)
    n_flows = len(indptr) - 1
    n_links = len(capacity)
    if caps is None:
        caps = np.full(n_flows, np.inf)
    else:
        caps = np.broadcast_to(np.asarray(caps, dtype=np.float64), (n_flows,))
    if check:
        # One reduction each: a NaN makes the minimum NaN, which fails ">= 0" too.
        if n_links and not capacity.min() >= 0:
            raise ValueError("link capacities must be >= 0 (np.inf for unconstrained)")
        if n_flows and not caps.min() >= 0:
            raise ValueError("rate caps must be >= 0 (np.inf for none)")
        if len(links) and (links.min() < 0 or links.max() >= n_links):
            raise ValueError(f"link ids must be in [0, {n_links})")

    rates = np.zeros(n_flows)
    lengths = np.diff(indptr)
    entry_flow = np.repeat(np.arange(n_flows, dtype=np.int64), lengths)
    frozen = np.zeros(n_flows, dtype=bool)

    # A dark link stops every flow crossing it: rate 0, no use of other links.
    dark = capacity[links] <= 0.0
    any_dark = bool(dark.any())
    if any_dark:
        frozen[entry_flow[dark]] = True

    # Path-less flows are limited by their cap alone.
    pathless = lengths == 0
    if pathless.any():
        rates[pathless] = caps[pathless]
        frozen |= pathless

    if any_dark:
        keep = ~frozen[entry_flow]
        entry_flow = entry_flow[keep]
        kept_links = links[keep]
    else:
        kept_links = links
    # Work on the links in use only, renumbered 0..n_used-1: a few active
    # flows on a large fabric then cost rounds over their links, not all.
    in_use = np.zeros(n_links, dtype=bool)
    in_use[kept_links] = True
    used_links = np.flatnonzero(in_use)
    n_used = len(used_links)
    local_id = np.empty(n_links, dtype=np.int64)
    local_id[used_links] = np.arange(n_used)
    entry_link = local_id[kept_links]
    residual = capacity[used_links]
    has_caps = bool(np.isfinite(caps[~frozen]).any())
    unfrozen = np.flatnonzero(~frozen) if has_caps else None
    freezing = np.zeros(n_flows, dtype=bool)

    # The number of unfrozen flows on each link is kept up to date by
    # subtracting those that freeze (one bincount of the leaving pairs per
    # round, not of all pairs).  A link left with no unfrozen flow has a share
    # of +inf or NaN (0 / 0): np.fmin ignores the NaNs and "<=" is False on
    # them, so such links never bottleneck.
    crossing = np.bincount(entry_link, minlength=n_used).astype(np.float64)
    share = np.empty(n_used)
    with np.errstate(divide="ignore", invalid="ignore"):
        while len(entry_flow):
            np.divide(residual, crossing, out=share)
            level = np.fmin.reduce(share) if n_used else np.inf
            if level != level:              # every share NaN: cannot happen with flows
                level = np.inf
            if has_caps:
                unfrozen_caps = caps[unfrozen]
                level = min(level, unfrozen_caps.min())
            if level == np.inf:
                # Only unconstrained links and no caps: nothing limits these flows.
                rates[entry_flow] = np.inf
                break
            threshold = level * (1.0 + RELATIVE_TOLERANCE)

            freezing[entry_flow[(share <= threshold)[entry_link]]] = True
            if has_caps:
                freezing[unfrozen[unfrozen_caps <= threshold]] = True
                new = unfrozen[freezing[unfrozen]]
                rates[new] = np.minimum(level, caps[new])
                unfrozen = unfrozen[~freezing[unfrozen]]
            leaving = freezing[entry_flow]
            leaving_links = entry_link[leaving]
            if has_caps:
                released = np.bincount(leaving_links, weights=rates[entry_flow[leaving]],
                                       minlength=n_used)
                crossing -= np.bincount(leaving_links, minlength=n_used)
            else:
                rates[entry_flow[leaving]] = level
                count = np.bincount(leaving_links, minlength=n_used)
                crossing -= count
                released = level * count
            # Rounding must not leave a link with a negative residual.
            residual -= released
            np.maximum(residual, 0.0, out=residual)
            staying = ~leaving
            entry_flow = entry_flow[staying]
            entry_link = entry_link[staying]
    return rates
