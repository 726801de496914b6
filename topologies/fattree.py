"""k-ary fat-tree (Al-Fares et al.), non-blocking: the FT baseline of the texts.

::

            c1   c2   c3   c4          (k/2)^2 core switches
            | \\ / |    | \\ / |
           a1    a2   a3    a4   ...   k/2 aggregation switches per pod
            | \\  / |   | \\  / |
           e1    e2   e3    e4   ...   k/2 edge switches per pod
           /\\    /\\    /\\    /\\
          h1 h2 h3 h4 h5 h6 h7 h8 ...  k/2 hosts per edge switch
          '---pod 0---' '---pod 1---'

Counts for even k: k^3/4 hosts, k^2/4 core, k^2/2 aggregation and k^2/2 edge
switches (5k^2/4 in all), k^3/4 host links and k^3/2 switch-to-switch links,
every switch with k ports, diameter 6 host-to-host hops.

Aggregation switch i of every pod connects to core switches
i*k/2 .. (i+1)*k/2-1, so every pod reaches every core switch once.

Parameters: ``k`` (even, >= 2), ``gbps`` (every link's real rate),
``hosts_per_edge`` (default k/2; fewer keeps an emulation small, and leaves the
fabric non-blocking).
"""

from __future__ import annotations

from typing import Optional

from topologies.fabric import Fabric, FabricError, ScaleError


def build(k: int = 4, gbps: float = 400.0, hosts_per_edge: Optional[int] = None) -> Fabric:
    if k < 2 or k % 2:
        raise FabricError(f"fattree: k must be an even number >= 2, got {k}")
    half = k // 2
    if hosts_per_edge is None:
        hosts_per_edge = half
    if not 1 <= hosts_per_edge <= half:
        raise FabricError(f"fattree: hosts_per_edge must be in 1..{half} for k={k}, "
                          f"got {hosts_per_edge}")
    fabric = Fabric("fattree", params={"k": k, "gbps": gbps, "hosts_per_edge": hosts_per_edge})
    cores = [fabric.add_switch("core") for _ in range(half * half)]
    for pod in range(k):
        aggs = [fabric.add_switch("agg", pod=pod) for _ in range(half)]
        edges = [fabric.add_switch("edge", pod=pod) for _ in range(half)]
        for e, edge in enumerate(edges):
            for slot in range(hosts_per_edge):
                host = fabric.add_host("gpu", pod=pod, server=pod * half + e, rail=slot)
                fabric.add_link(host, edge, gbps)
            for agg in aggs:
                fabric.add_link(edge, agg, gbps)
        for i, agg in enumerate(aggs):
            for core in cores[i * half:(i + 1) * half]:
                fabric.add_link(agg, core, gbps)
    return fabric


def params_at(gpus: int, radix: Optional[int] = None, gpus_per_server: Optional[int] = None,
              small: bool = False) -> dict:
    """The k whose fat-tree has ``gpus`` = k^3/4 hosts; k sets the radix and
    the hosts per edge switch, so the other arguments do not apply.  Raises
    ScaleError when no even k gives ``gpus`` (the folded Clos builds any count)."""
    k = round((4 * gpus) ** (1 / 3))
    if k ** 3 != 4 * gpus or k % 2:
        raise ScaleError("fattree", f"has no k with k^3/4 = {gpus} GPUs", instead="clos")
    return {"k": k}
