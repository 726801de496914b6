"""`FlowSim`'s event loop, compiled.

An RL iteration at 4,096 GPUs is about 55,000-110,000 events.  Each drains
a few dozen flows, finds their dependents, releases and routes them and
starts them transmitting: about fifteen numpy and numba calls and their
Python glue, 0.2-0.3 ms an event, more than the rates themselves once
those were kept between events (`rates.LiveRates`).  `run_events` does a
whole event in one compiled call, and goes on to the next one, until
something only Python can do is due:

    NEXT ---------> FINISHING ---------> ROUTING ---------> STARTING ---+
    rates, the       dependents           route the          start the    |
    next time,       counted down,        released flows     flows        |
    drains, the      releases             (GROW: room for    (CALLS:      |
    entries due,     (WAITING ->           paths; ROUTE:     the `at`     |
    flows DONE       ACTIVE)               Python routes)    callbacks    |
    (NOTIFY: tell                                            due now;     |
    the caller)                                              ROOM: room   |
                                                             in the rates'|
                                                             lists)       |
      ^-------------------------------------------------------------------+

It returns a code saying what it stopped for (`IDLE`: no event left, or
``until``); `FlowSim.run` does it and calls again, and the stage it was in
(``box[STAGE]``) says where the event goes on.  The results are those of
the event loop this replaced, bit for bit up to the order in which flows
enter the rates' link lists.

Flow events (a release, the start of transmission, done after the path's
latency) sit in a binary heap of one entry per flow, in arrays, ordered by
time and then by push order; `FlowSim.at` callbacks stay in a Python heap,
and their earliest time is ``clock[CALL_AT]``.  A flow has at most one
entry at a time, and a cancelled one at most one stale entry, so the heap
needs room for the flows plus the cancelled ones (`FlowSim` keeps it).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from traffic.model.paths import UNREACHABLE, walk_paths
from traffic.model.rates import _pushed, live_has_room, live_insert, live_remove, live_update

# Flow states (`engine` names them).
WAITING, ACTIVE, DRAINED, DONE, CANCELLED = range(5)

# Heap entry kinds.
RELEASE, TRANSMIT, ARRIVE = range(3)

# What run_events stopped for.
IDLE, CALLS, NOTIFY, ROUTE, GROW, PROGRESS, ROOM = range(7)

# Where the current event stands.
NEXT, FINISHING, ROUTING, STARTING = range(4)

# Indices of the int64 ``box``.
(STAGE, HEAP_N, SEQ, PATH_USED, TX_N, EVENTS, RATE_UPDATES, STALE, FIN_N, REL_N, TXM_N,
 TAGS_N, NEEDED, SINCE_PROGRESS, LONGEST) = range(15)
BOX_SIZE = 15

# Indices of the float64 ``clock``.
NOW, CALL_AT, UNTIL = range(3)

# Indices of ``params`` (float64) and ``flags`` (int64).
HOP_LATENCY, STARTUP, COALESCE = range(3)
NOTIFY_EACH, TAGS, COMPILED_ROUTER, PROGRESS_EVERY = range(4)

# Drains and events this close are simultaneous: relative to now, plus absolute.
RELATIVE_TIME_TOLERANCE = 1e-9
ABSOLUTE_TIME_TOLERANCE = 1e-12


@njit(cache=True)
def tolerance(t):
    return RELATIVE_TIME_TOLERANCE * abs(t) + ABSOLUTE_TIME_TOLERANCE


# ---------------------------------------------------------------- the heap

@njit(cache=True)
def heap_push(heap, box, t, kind, flow):
    """Add an entry; the caller made room (see the module docstring)."""
    h_time, h_seq, h_kind, h_flow = heap
    i = box[HEAP_N]
    box[HEAP_N] += 1
    seq = box[SEQ]
    box[SEQ] += 1
    while i > 0:
        parent = (i - 1) >> 1
        if h_time[parent] < t or (h_time[parent] == t and h_seq[parent] < seq):
            break
        h_time[i], h_seq[i] = h_time[parent], h_seq[parent]
        h_kind[i], h_flow[i] = h_kind[parent], h_flow[parent]
        i = parent
    h_time[i], h_seq[i], h_kind[i], h_flow[i] = t, seq, kind, flow


@njit(cache=True)
def heap_push_many(heap, box, times, kind, flows):
    for i in range(len(flows)):
        heap_push(heap, box, times[i], kind, flows[i])


@njit(cache=True)
def _heap_pop(heap, box):
    """Remove the earliest entry; returns its kind and flow."""
    h_time, h_seq, h_kind, h_flow = heap
    kind, flow = h_kind[0], h_flow[0]
    n = box[HEAP_N] - 1
    box[HEAP_N] = n
    if n == 0:
        return kind, flow
    t, seq, k, f = h_time[n], h_seq[n], h_kind[n], h_flow[n]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        right = child + 1
        if right < n and (h_time[right] < h_time[child] or (
                h_time[right] == h_time[child] and h_seq[right] < h_seq[child])):
            child = right
        if t < h_time[child] or (t == h_time[child] and seq < h_seq[child]):
            break
        h_time[i], h_seq[i] = h_time[child], h_seq[child]
        h_kind[i], h_flow[i] = h_kind[child], h_flow[child]
        i = child
    h_time[i], h_seq[i], h_kind[i], h_flow[i] = t, seq, k, f
    return kind, flow


# ---------------------------------------------------------------- the rates

@njit(cache=True)
def refresh_rates(flows, live, bufs, box, capacity):
    """Drop the flows that stopped from the transmitting list and bring the
    rates up to date (only when something changed since the last time)."""
    if box[STALE] == 0:
        return
    transmitting = flows[12]
    tx_ids, tx_rate = bufs[0], bufs[1]
    n = 0
    for i in range(box[TX_N]):
        f = tx_ids[i]
        if transmitting[f]:
            tx_ids[n] = f
            n += 1
    box[TX_N] = n
    # A flow with no path (yet, or a dead end) has rate 0: it waits.
    live_update(live, tx_ids, n, capacity)
    rate = live[0]
    for i in range(n):
        tx_rate[i] = rate[tx_ids[i]]
    box[STALE] = 0
    box[RATE_UPDATES] += 1


@njit(cache=True)
def start_transmitting(flows, live, path, bufs, box, ids, count, capacity):
    """The ACTIVE flows among ``ids[:count]`` that do not transmit yet start."""
    state, transmitting, path_start, path_len = flows[0], flows[12], flows[10], flows[11]
    tx_ids = bufs[0]
    first = box[TX_N]
    n = first
    for i in range(count):
        f = ids[i]
        if state[f] == ACTIVE and not transmitting[f]:
            transmitting[f] = True
            tx_ids[n] = f
            n += 1
    if n > first:
        box[TX_N] = n
        live_insert(live, tx_ids[first:n], path_start, path_len, path, flows[7], capacity)
        box[STALE] = 1


# ---------------------------------------------------------------- dependencies

@njit(cache=True)
def _count_down_dependents(finished, deps, flows, now):
    """One finished dependency for every dependent of ``finished`` (every
    edge of every run in each one's list, see FlowSim's dependency edges; an
    edge to a barrier counts the barrier down, and a barrier whose members
    are all done counts down its own dependents): returns, ascending, those
    left with none that still wait."""
    first_run, run_start, run_len, run_next, edge_dst = deps[0], deps[1], deps[2], deps[3], deps[4]
    bar_left, bar_end, bar_first_run = deps[5], deps[6], deps[7]
    state, deps_left, deps_end = flows[0], flows[8], flows[9]
    ready = np.empty(64, dtype=np.int64)
    n_ready = 0
    for flow in finished:
        run = first_run[flow]
        while run >= 0:
            for e in range(run_start[run], run_start[run] + run_len[run]):
                dependent = edge_dst[e]
                if dependent < 0:
                    barrier = -dependent - 1
                    bar_left[barrier] -= 1
                    bar_end[barrier] = now
                    if bar_left[barrier] > 0:
                        continue
                    waiting = bar_first_run[barrier]
                    while waiting >= 0:
                        for w in range(run_start[waiting], run_start[waiting] + run_len[waiting]):
                            if _count_one(edge_dst[w], state, deps_left, deps_end, now):
                                ready = _pushed(ready, n_ready, edge_dst[w])
                                n_ready += 1
                        waiting = run_next[waiting]
                elif _count_one(dependent, state, deps_left, deps_end, now):
                    ready = _pushed(ready, n_ready, dependent)
                    n_ready += 1
            run = run_next[run]
    return np.sort(ready[:n_ready])


@njit(cache=True)
def _count_one(flow, state, deps_left, deps_end, now):
    """One of ``flow``'s dependencies ended now: whether it may go."""
    deps_left[flow] -= 1
    deps_end[flow] = now
    return deps_left[flow] == 0 and state[flow] == WAITING


# ---------------------------------------------------------------- the loop

@njit(cache=True)
def run_events(flows, deps, live, path, heap, bufs, box, clock, params, flags, capacity,
               router):
    """Run events until one of the codes of the module docstring is due."""
    state, bytes_total, bytes_left, released = flows[0], flows[1], flows[2], flows[3]
    end, delay, tag, tag_left = flows[5], flows[6], flows[13], flows[14]
    path_len = flows[11]
    tx_ids, tx_rate, time_left, fin_buf, rel_buf, txm_buf, tags_done = bufs
    h_time = heap[0]
    hop_latency, startup, coalesce = params[HOP_LATENCY], params[STARTUP], params[COALESCE]
    while True:
        stage = box[STAGE]
        now = clock[NOW]
        if stage == NEXT:
            refresh_rates(flows, live, bufs, box, capacity)
            n_tx = box[TX_N]
            soonest = np.inf
            for i in range(n_tx):
                bits = bytes_left[tx_ids[i]] * 8.0
                if bits <= 0.0:
                    left = 0.0
                elif tx_rate[i] > 0.0:
                    left = bits / tx_rate[i]
                else:
                    left = np.inf
                time_left[i] = left
                if left < soonest:
                    soonest = left
            next_drain = now + soonest
            next_event = min(h_time[0] if box[HEAP_N] > 0 else np.inf, clock[CALL_AT])
            t_next = min(next_drain, next_event)
            if t_next == np.inf or t_next > clock[UNTIL]:
                until = clock[UNTIL]
                if until < np.inf and until > now:
                    _advance(tx_ids, tx_rate, n_tx, until - now, bytes_left)
                    clock[NOW] = until
                return IDLE
            if flags[PROGRESS_EVERY] > 0 and box[SINCE_PROGRESS] >= flags[PROGRESS_EVERY]:
                box[SINCE_PROGRESS] = 0
                return PROGRESS
            step = t_next - now
            slack_to = tolerance(t_next)
            # With coalescing, also the flows due within coalesce x their
            # transfer time at their current rate (at most that fraction of
            # their bytes skipped); a flow at rate 0 has no slack: it waits.
            within = step + slack_to if next_drain <= t_next + slack_to else -1.0
            # One pass: which flows finish, and every flow's bytes moved on
            # by the step (as `_advance`).
            n_fin = 0
            moved = step / 8.0
            for i in range(n_tx):
                rate, f = tx_rate[i], tx_ids[i]
                if within >= 0.0:
                    slack = coalesce * 8.0 * bytes_total[f] / rate if rate > 0.0 else 0.0
                    if time_left[i] <= within + slack:
                        fin_buf[n_fin] = f
                        n_fin += 1
                if rate > 0.0 and step > 0.0:
                    bytes_left[f] = max(bytes_left[f] - rate * moved, 0.0)
            now = t_next
            clock[NOW] = now
            box[EVENTS] += 1
            box[SINCE_PROGRESS] += 1
            n_fin = _drain(flows, live, path, heap, box, fin_buf, n_fin, now, hop_latency,
                           startup, coalesce)
            n_rel, n_txm = 0, 0
            while box[HEAP_N] > 0 and h_time[0] <= now + slack_to:
                kind, f = _heap_pop(heap, box)
                if kind == RELEASE:
                    rel_buf[n_rel] = f
                    n_rel += 1
                elif kind == TRANSMIT:
                    txm_buf[n_txm] = f
                    n_txm += 1
                else:
                    fin_buf[n_fin] = f
                    n_fin += 1
            # Done now: the drained ones (not those cancelled since).
            n_done = 0
            n_tags = 0
            for i in range(n_fin):
                f = fin_buf[i]
                if state[f] != DRAINED:
                    continue
                fin_buf[n_done] = f
                n_done += 1
                state[f] = DONE
                end[f] = now
                if flags[TAGS] and tag[f] >= 0:
                    tag_left[tag[f]] -= 1
                    if tag_left[tag[f]] == 0:
                        tags_done[n_tags] = tag[f]
                        n_tags += 1
            box[FIN_N], box[REL_N], box[TXM_N], box[TAGS_N] = n_done, n_rel, n_txm, n_tags
            box[STAGE] = FINISHING
            if n_tags > 0 or (flags[NOTIFY_EACH] and n_done > 0):
                return NOTIFY
        elif stage == FINISHING:
            n_rel = box[REL_N]
            n_done = box[FIN_N]
            if n_done > 0:
                ready = _count_down_dependents(fin_buf[:n_done], deps, flows, now)
                for f in ready:
                    if delay[f] > 0.0:
                        heap_push(heap, box, now + delay[f], RELEASE, f)
                    else:
                        rel_buf[n_rel] = f
                        n_rel += 1
            box[FIN_N] = 0
            # Released now: those that still wait (not cancelled).
            n_go = 0
            for i in range(n_rel):
                f = rel_buf[i]
                if state[f] == WAITING:
                    state[f] = ACTIVE
                    released[f] = now
                    rel_buf[n_go] = f
                    n_go += 1
            box[REL_N] = n_go
            box[STAGE] = ROUTING
        elif stage == ROUTING:
            n_go = box[REL_N]
            if n_go > 0:
                if not flags[COMPILED_ROUTER]:
                    return ROUTE                # FlowSim routes them, then STARTING
                needed = _route(flows, path, box, rel_buf, n_go, router)
                if needed > 0:
                    box[NEEDED] = needed
                    return GROW                 # room for the paths, then again
            box[STAGE] = STARTING
        else:                                   # STARTING
            n_go, n_txm = box[REL_N], box[TXM_N]
            # Room in the rates' lists for every flow that may start now
            # (before anything is done: the stage is run again after ROOM).
            n_now = n_go if startup <= 0.0 else 0
            longest = 0
            for i in range(n_now):
                longest = max(longest, path_len[rel_buf[i]])
            for i in range(n_txm):
                longest = max(longest, path_len[txm_buf[i]])
            if not live_has_room(live, n_now + n_txm, longest):
                box[NEEDED], box[LONGEST] = n_now + n_txm, longest
                return ROOM
            if startup > 0.0:
                for i in range(n_go):
                    heap_push(heap, box, now + startup, TRANSMIT, rel_buf[i])
            else:
                start_transmitting(flows, live, path, bufs, box, rel_buf, n_go, capacity)
            start_transmitting(flows, live, path, bufs, box, txm_buf, n_txm, capacity)
            box[REL_N], box[TXM_N] = 0, 0
            box[STAGE] = NEXT
            if clock[CALL_AT] <= now + tolerance(now):
                return CALLS


@njit(cache=True)
def _advance(tx_ids, tx_rate, n_tx, step, bytes_left):
    """Move every transmitting flow's bytes forward by ``step`` seconds."""
    if step <= 0.0:
        return
    for i in range(n_tx):
        if tx_rate[i] > 0.0:
            f = tx_ids[i]
            bytes_left[f] = max(bytes_left[f] - tx_rate[i] * (step / 8.0), 0.0)


@njit(cache=True)
def _drain(flows, live, path, heap, box, fin_buf, n_fin, now, hop_latency, startup,
           coalesce):
    """The flows ``fin_buf[:n_fin]`` sent their last byte now.  Those whose
    last byte also arrives now stay in ``fin_buf`` (their number is
    returned); the others arrive a path's latency later (a heap entry)."""
    state, bytes_left, released, drained = flows[0], flows[2], flows[3], flows[4]
    path_start, path_len, transmitting = flows[10], flows[11], flows[12]
    if n_fin == 0:
        return 0
    gone = fin_buf[:n_fin].copy()
    live_remove(live, gone)
    box[STALE] = 1
    at_once = 0
    for f in gone:
        bytes_left[f] = 0.0
        transmitting[f] = False
        state[f] = DRAINED
        drained[f] = now
        latency = path_len[f] * hop_latency
        # Coalescing: a flow whose last bytes would arrive within coalesce x
        # its transfer time is done with its drain (early by at most that,
        # the bound of a coalesced drain), not one event later.
        if latency == 0.0 or (coalesce > 0.0 and
                              latency <= coalesce * (now - released[f] - startup)):
            fin_buf[at_once] = f
            at_once += 1
        else:
            heap_push(heap, box, now + latency, ARRIVE, f)
    return at_once


@njit(cache=True)
def _route(flows, path, box, ids, count, router):
    """The paths of ``ids[:count]`` by the router's tables, appended to
    ``path``; or, when ``path`` has no room for them, the room needed (and
    nothing routed)."""
    path_start, path_len = flows[10], flows[11]
    (src_idx, dst_idx, keys, origin_table, target_table, dist, nh_ptr, nh_hop, adj_nbr,
     adj_link1, adj_link2, seed, blackhole, kernel, is_host) = router
    origin = np.empty((count, 2), dtype=np.int64)
    target = np.empty((count, 2), dtype=np.int64)
    key = np.empty(count, dtype=np.uint64)
    worst = 0
    for i in range(count):
        f = ids[i]
        origin[i, 0], origin[i, 1] = origin_table[src_idx[f], 0], origin_table[src_idx[f], 1]
        target[i, 0], target[i, 1] = target_table[dst_idx[f], 0], target_table[dst_idx[f], 1]
        key[i] = keys[f]
        cur, goal = origin[i, 0], target[i, 0]
        if cur >= 0 and goal >= 0 and dist[cur, goal] < UNREACHABLE:
            worst += 2 + 2 * dist[cur, goal]
        else:
            worst += 2
    used = box[PATH_USED]
    if used + worst > len(path):
        return used + worst
    indptr, links = walk_paths(origin, target, key, dist, nh_ptr, nh_hop, adj_nbr, adj_link1,
                               adj_link2, seed, blackhole, kernel, is_host)
    for i in range(count):
        f = ids[i]
        path_start[f] = used + indptr[i]
        path_len[f] = indptr[i + 1] - indptr[i]
    path[used:used + len(links)] = links
    box[PATH_USED] = used + len(links)
    return 0
