"""Paths by ECMP, walked hop by hop, compiled: what `network.ModelNetwork`
routes a batch of flows with, and what the engine's compiled event loop
(`events`) routes the flows it releases with, from the same tables."""

from __future__ import annotations

import numpy as np
from numba import njit

from traffic.model.kernel_ecmp import hash_threshold, host_part

UNREACHABLE = np.iinfo(np.int32).max
_MIX = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True)
def _mix(key, node, seed):
    """splitmix64 of a flow's key, the node it is at and the seed (all uint64)."""
    x = (key * _MIX) ^ (node << np.uint64(32)) ^ seed
    x = x + _MIX
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def walk_paths(origin, target, keys, dist, nh_ptr, nh_hop, adj_nbr, adj_link1, adj_link2,
               seed, blackhole, kernel, is_host):
    """Every flow's links, hop by hop: the link up from its host (if any), at
    each router the next hop its hash picks among those one step closer, and
    the link down to its host, or the blackhole when there is no path.
    ``kernel``: the keys are kernel multipath hashes (`traffic.model.kernel_ecmp`),
    picked by threshold, a host's (``is_host``) by its own part of the key.
    Compiled: the engine routes a few flows at almost every event."""
    n = len(keys)
    count = dist.shape[0]
    indptr = np.zeros(n + 1, dtype=np.int64)
    # A path is at most: up, two links per router hop, down (or the blackhole).
    capacity = 0
    for i in range(n):
        cur, goal = origin[i, 0], target[i, 0]
        if cur >= 0 and goal >= 0 and dist[cur, goal] < UNREACHABLE:
            capacity += 2 + 2 * dist[cur, goal]
        else:
            capacity += 2
    out = np.empty(capacity, dtype=np.int64)
    used = 0
    for i in range(n):
        if origin[i, 1] >= 0:
            out[used] = origin[i, 1]
            used += 1
        cur, goal = origin[i, 0], target[i, 0]
        if cur < 0 or goal < 0 or dist[cur, goal] >= UNREACHABLE:
            out[used] = blackhole
            used += 1
        else:
            while cur != goal:
                key = cur * count + goal
                start = nh_ptr[key]
                width = nh_ptr[key + 1] - start
                if kernel:
                    value = host_part(keys[i]) if is_host[cur] else keys[i] & np.uint64(0xFFFFFFFF)
                    pick = np.int64(hash_threshold(value, max(width, 1)))
                else:
                    pick = np.int64(_mix(keys[i], np.uint64(cur), seed) % np.uint64(max(width, 1)))
                chosen = nh_hop[start + pick]
                out[used] = adj_link1[chosen]
                used += 1
                if adj_link2[chosen] >= 0:
                    out[used] = adj_link2[chosen]
                    used += 1
                cur = adj_nbr[chosen]
            if target[i, 1] >= 0:
                out[used] = target[i, 1]
                used += 1
        indptr[i + 1] = used
    return indptr, out[:used]
