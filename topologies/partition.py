"""Place a fabric on N servers so that only the fewest, highest-tier links cross.

Mininet Cluster Edition spreads one emulated fabric over several machines:
every node lives on one server, and a link whose two ends are on different
servers becomes a tunnel between them.  A tunnel is slower and less
predictable than a veth pair on one kernel, so `place_fabric` keeps whole
units of the fabric together and lets only the links above them cross.

A k = 4 fat-tree on two servers, split by pods (``~`` marks tunnels)::

                   server 0            |                 server 1
                                       |
   core        c1        c3   ~~~~~~~~~|~~~~~~~~~    c2        c4
               |  \\    /  |            |             |  \\    /  |
               |    \\/    |            |             |    \\/    |
               |    /\\    |            |             |    /\\    |
               |  /    \\  |            |             |  /    \\  |
   agg       [a1 a2]  [a3 a4]          |           [a5 a6]  [a7 a8]
              | X |    | X |           |            | X |    | X |
   edge      [e1 e2]  [e3 e4]          |           [e5 e6]  [e7 e8]
              /\\ /\\    /\\ /\\           |            /\\ /\\    /\\ /\\
   GPUs      h1 .. h4  h5 .. h8        |           h9 .. h12 h13 .. h16
              pod 0     pod 1          |            pod 2     pod 3

Every core switch has one link into every pod, so with the pods split 2 + 2
each core keeps two links on its own server and sends two across (c1 and c3
to pods 2 and 3, c2 and c4 to pods 0 and 1): 4 x 2 = 8 = k^3/8 tunnels, all
agg-core.  No GPU, edge or edge-agg link crosses.  Why pods: a pod is the
largest unit whose inside links all stay local, so cutting between pods cuts
only top-tier links, which carry inter-pod traffic and nothing else.
Cutting through a pod would tunnel edge-agg links as well, and splitting a
ToR from its GPUs would tunnel the links every byte a GPU sends goes through.

How nodes are grouped:

1. Pods: all nodes that share a ``pod`` value (GPUs, ToRs or edges, aggs,
   per-pod OCSes ...) form one group, when every GPU has a pod.
2. Otherwise, or when the pods cannot be balanced (one pod, or too few pods
   for N servers), ToR groups: a GPU's access switch (the packet switch it is
   wired to; an ``nvswitch`` only when it has nothing else) with all GPUs
   wired to it, and an nvswitch whose GPUs all fall in one group.  A GPU
   wired to no packet switch (SiP-OCS: GPUs on OCSes, forwarding for each
   other) is a group of its own.

Groups holding GPUs are spread three ways, and of those that meet the
balance rule the one with the fewest tunnels wins (on a tie the earlier):

1. Servers in turn: server 0 takes groups while they fit in its weighted
   share of the GPUs (the largest first; among equal sizes the one with the
   most links to groups it already holds, then group order, which is the
   fabric's creation order), then server 1, and so on; a group that fits
   nowhere goes to the server with the fewest GPUs relative to its weight
   after taking it.  Keeps groups wired to each other (ZCube's layers)
   together.
2. Consecutive runs: the groups in order, cut at the share boundaries (a
   group goes to the server whose run holds its middle GPU).  Keeps
   neighbours together when two groups overflow a share, e.g. the two edge
   switches of a k = 4 pod on five servers of 3.2 GPUs each.
3. Largest first: each group, the largest first (ties in group order), to
   the server with the fewest GPUs relative to its weight (ties: lowest
   index).  Balances best when a small group takes the room a large one
   needs.

Every node left over (cores, spines, top-tier OCSes, shared nvswitches) then
goes, nearest to the groups first, to the server holding most of its links,
ties to the server with the fewest switches so far, then the lowest index;
so the links cut are the top tier's.

Balance rule: every server must hold at least a fraction F of its weighted
share of the GPUs (``hosts * weight / sum(weights)``), with F = N/4 for
N <= 4 servers and F = 1/2 beyond.  With equal weights that is at least a
quarter of all GPUs per server for N <= 4 (an exact quarter each at N = 4)
and at least half an equal share, hosts / (2N), for N > 4.  When neither
pods nor ToR groups meet it, `place_fabric` raises `PlacementError` naming
the fabric, N, the best GPU counts it reached and the rule.

Pure: the standard library and the fabric's networkx graph, read and never
changed; no Mininet.  The same fabric and arguments always give the same
placement.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from topologies.fabric import EPS, HOST, Fabric

#: What `Placement.groups` says was kept together.
POD, TOR, WHOLE = "pod", "tor", "fabric"

#: Stands for NVLink inside a server, not a ToR: a GPU's access switch is one
#: of its other packet switches when it has any.
NVSWITCH = "nvswitch"


class PlacementError(ValueError):
    """A fabric cannot be placed on the servers it was asked for."""


@dataclass(frozen=True)
class Placement:
    """Where every node of a fabric runs, and which links become tunnels.

    ``tunnels`` lists each crossing multigraph edge once, as ``(u, v)`` with
    ``u < v`` by name, sorted (parallel links appear once per link);
    ``tunnel_roles`` counts them by the roles of their ends (``agg-core``).
    """

    server_of: Dict[str, int] = field(hash=False)
    tunnels: Tuple[Tuple[str, str], ...]
    hosts_per_server: Tuple[int, ...]
    groups: str                                   # POD, TOR or WHOLE
    fabric: str
    tunnel_roles: Tuple[Tuple[str, int], ...] = ()

    @property
    def servers(self) -> int:
        return len(self.hosts_per_server)

    def describe(self) -> str:
        """One line, e.g. ``fattree on 2 servers, whole pods together: GPUs 8 + 8,
        8 tunnels (agg-core 8)``."""
        kept = {POD: "whole pods together", TOR: "each ToR with its GPUs",
                WHOLE: "all on one server"}[self.groups]
        hosts = " + ".join(str(n) for n in self.hosts_per_server)
        roles = ", ".join(f"{pair} {count}" for pair, count in self.tunnel_roles)
        tunnels = f"{len(self.tunnels)} tunnels" + (f" ({roles})" if roles else "")
        plural = "server" if self.servers == 1 else "servers"
        return f"{self.fabric} on {self.servers} {plural}, {kept}: GPUs {hosts}, {tunnels}"


@dataclass(frozen=True)
class _Group:
    """Nodes that must share a server; ``hosts`` of them are GPUs."""

    nodes: Tuple[str, ...]
    hosts: int


@dataclass(frozen=True)
class _Attempt:
    """One grouping spread over the servers."""

    grouping: str
    server_of: Dict[str, int]
    hosts_per_server: Tuple[int, ...]


def place_fabric(fabric: Fabric, servers: int,
                 weights: Optional[Sequence[float]] = None) -> Placement:
    """Place every node of ``fabric`` on one of ``servers`` servers (0..N-1).

    ``weights``: relative GPU capacity of each server (default all equal).
    Raises `PlacementError` when N < 1, N exceeds the GPU count, the weights
    do not fit N, or no grouping meets the balance rule (module docstring).
    """
    hosts = fabric.hosts
    shares = _check_arguments(fabric, servers, weights, len(hosts))
    if servers == 1:
        return _placement(fabric, {node: 0 for node in fabric.graph}, WHOLE, 1)

    attempts: List[_Attempt] = []
    for grouping, groups in ((POD, _pod_groups(fabric)), (TOR, _tor_groups(fabric))):
        if groups is None:
            continue
        spreads = [_spread(fabric, grouping, groups, shares, assign) for assign in SPREADS]
        balanced = [a for a in spreads if _meets_rule(a.hosts_per_server, shares, servers)]
        if balanced:
            # Fewest tunnels; on a tie the earlier in SPREADS.
            best = min(balanced, key=lambda a: len(_crossing_links(fabric, a.server_of)))
            return _placement(fabric, best.server_of, grouping, servers)
        attempts += spreads
    raise PlacementError(_infeasible(fabric, servers, shares, attempts))


# ---------------------------------------------------------------- arguments and rule
def _check_arguments(fabric: Fabric, servers: int, weights: Optional[Sequence[float]],
                     hosts: int) -> List[Fraction]:
    """Each server's weighted share of the GPUs, after checking the arguments."""
    if isinstance(servers, bool) or not isinstance(servers, int) or servers < 1:
        raise PlacementError(f"{fabric.name}: servers must be an integer >= 1, got {servers!r}")
    if servers > hosts:
        raise PlacementError(f"{fabric.name}: {servers} servers but only {hosts} GPUs; "
                             "every server needs at least one GPU")
    if weights is None:
        weights = [1] * servers
    if len(weights) != servers:
        raise PlacementError(f"{fabric.name}: {len(weights)} weights for {servers} servers")
    if not all(math.isfinite(w) and w > 0 for w in weights):
        raise PlacementError(f"{fabric.name}: weights must be finite and > 0, got "
                             f"{list(weights)}")
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    return [hosts * w / total for w in exact]


def _rule_fraction(servers: int) -> Fraction:
    """F of the balance rule: the part of its share every server must hold."""
    return Fraction(servers, 4) if servers <= 4 else Fraction(1, 2)


def _meets_rule(hosts_per_server: Sequence[int], shares: Sequence[Fraction],
                servers: int) -> bool:
    fraction = _rule_fraction(servers)
    return all(count >= fraction * share for count, share in zip(hosts_per_server, shares))


def _infeasible(fabric: Fabric, servers: int, shares: Sequence[Fraction],
                attempts: Sequence[_Attempt]) -> str:
    hosts = len(fabric.hosts)
    fraction = _rule_fraction(servers)
    if len(set(shares)) == 1:
        rule = (f"at least a quarter of the {hosts} GPUs each (N <= 4)" if servers <= 4 else
                f"at least half an equal share, {hosts}/(2*{servers}) = "
                f"{hosts / (2 * servers):g} GPUs each (N > 4)")
    else:
        floors = ", ".join(f"{float(fraction * share):g}" for share in shares)
        rule = f"at least {fraction} of each server's weighted share: {floors} GPUs"

    def fullness(attempt: _Attempt) -> List[Fraction]:
        """Each server's GPUs over its share, emptiest first: the best attempt
        fills its emptiest server most, then its next emptiest, and so on."""
        return sorted(Fraction(count) / share
                      for count, share in zip(attempt.hosts_per_server, shares))

    best = max(attempts, key=fullness)          # the first on ties: pods before ToRs
    counts = " + ".join(str(n) for n in best.hosts_per_server)
    tried = " and ".join(f"{grouping} groups"
                         for grouping in dict.fromkeys(a.grouping for a in attempts))
    return (f"{fabric.name}: cannot place on {servers} servers: the rule wants {rule}; "
            f"tried {tried}, best GPUs per server {counts} (by {best.grouping})")


# ---------------------------------------------------------------- groups
def _pod_groups(fabric: Fabric) -> Optional[List[_Group]]:
    """One group per ``pod`` value in order of first appearance, or None when
    some GPU has no pod (pods would then not hold the GPUs together)."""
    graph = fabric.graph
    if any(graph.nodes[host].get("pod") is None for host in fabric.hosts):
        return None
    members: Dict[object, List[str]] = {}
    for node, data in graph.nodes(data=True):
        if data.get("pod") is not None:
            members.setdefault(data["pod"], []).append(node)
    return [_make_group(fabric, nodes) for nodes in members.values()]


def _tor_groups(fabric: Fabric) -> List[_Group]:
    """Each access switch with the GPUs wired to it (see the module docstring)."""
    graph = fabric.graph
    order = {node: index for index, node in enumerate(graph)}
    parent: Dict[str, str] = {}

    def root(node: str) -> str:
        parent.setdefault(node, node)
        while parent[node] != node:
            parent[node] = parent[parent[node]]          # path halving
            node = parent[node]
        return node

    def join(a: str, b: str) -> None:
        ra, rb = root(a), root(b)
        if ra != rb:                                     # the earlier node leads
            first, second = sorted((ra, rb), key=order.__getitem__)
            parent[second] = first

    for host in fabric.hosts:
        root(host)
        switches = [peer for peer in graph.neighbors(host) if fabric.kind(peer) == EPS]
        access = [s for s in switches if graph.nodes[s]["role"] != NVSWITCH] or switches
        for switch in access:
            join(host, switch)

    # An nvswitch shared by GPUs of several ToRs belongs to none of them (it is
    # placed by its links later); one whose GPUs all sit in one group joins it.
    for node, data in graph.nodes(data=True):
        if data["kind"] != EPS or data["role"] != NVSWITCH or node in parent:
            continue
        roots = {root(peer) for peer in graph.neighbors(node) if fabric.kind(peer) == HOST}
        if len(roots) == 1:
            join(roots.pop(), node)

    members: Dict[str, List[str]] = {}
    for node in graph:                                   # creation order throughout
        if node in parent:
            members.setdefault(root(node), []).append(node)
    return [_make_group(fabric, nodes) for nodes in members.values()]


def _make_group(fabric: Fabric, nodes: Sequence[str]) -> _Group:
    return _Group(tuple(nodes), sum(1 for n in nodes if fabric.kind(n) == HOST))


# ---------------------------------------------------------------- spreading
def _spread(fabric: Fabric, grouping: str, groups: Sequence[_Group],
            shares: Sequence[Fraction], assign: Callable[..., List[int]]) -> _Attempt:
    """Groups with GPUs to servers by ``assign``, then everything else by its links."""
    servers = len(shares)
    with_hosts = [g for g in groups if g.hosts]
    loads = [0] * servers
    server_of: Dict[str, int] = {}
    for group, server in zip(with_hosts, assign(fabric, with_hosts, shares)):
        loads[server] += group.hosts
        for node in group.nodes:
            server_of[node] = server

    # Groups without GPUs (a pod of switches only) move as one unit, like a node.
    units = [g.nodes for g in groups if not g.hosts]
    decided = set(server_of).union(*units)
    units += [(node,) for node in fabric.graph if node not in decided]
    _place_by_links(fabric, server_of, units, servers)
    return _Attempt(grouping, server_of, tuple(loads))


def _fill_servers_in_turn(fabric: Fabric, groups: Sequence[_Group],
                          shares: Sequence[Fraction]) -> List[int]:
    """Server of each group: server 0 takes groups while they fit in its share
    (largest first, then most links to what it holds, then group order), then
    server 1, ...; a group that fits nowhere goes to the server it leaves
    least loaded relative to its share."""
    servers = len(shares)
    between = _links_between(fabric, groups)
    loads = [0] * servers
    server_of_group = [-1] * len(groups)
    # One server at a time, so that groups wired to each other, or following
    # each other in creation order (and so sharing the switches above them),
    # end up together: dealing equal groups round-robin cuts twice the links
    # of a ZCube or a rail-only fabric.
    left = list(range(len(groups)))
    for server in range(servers):
        links_here = [0] * len(groups)           # links to the groups this server holds
        while True:
            fitting = [i for i in left if loads[server] + groups[i].hosts <= shares[server]]
            if not fitting:
                break
            chosen = min(fitting, key=lambda i: (-groups[i].hosts, -links_here[i], i))
            left.remove(chosen)
            server_of_group[chosen] = server
            loads[server] += groups[chosen].hosts
            for other, links in between[chosen].items():
                links_here[other] += links
    for index in left:
        size = groups[index].hosts
        server = min(range(servers), key=lambda s: ((loads[s] + size) / shares[s], s))
        server_of_group[index] = server
        loads[server] += size
    return server_of_group


def _cut_in_creation_order(fabric: Fabric, groups: Sequence[_Group],
                           shares: Sequence[Fraction]) -> List[int]:
    """Server of each group: the groups in order, cut into consecutive runs at
    the share boundaries; a group goes to the server whose run holds its
    middle GPU.  Keeps neighbours together even when two of them overflow a
    share (the two edge switches of a k = 4 pod, 4 GPUs, on servers of 3.2)."""
    boundaries = []
    total = Fraction(0)
    for share in shares:
        total += share
        boundaries.append(total)
    server_of_group = []
    before = 0
    for group in groups:
        middle = before + Fraction(group.hosts, 2)
        server_of_group.append(next(s for s, end in enumerate(boundaries)
                                    if middle <= end or s == len(shares) - 1))
        before += group.hosts
    return server_of_group


def _deal_largest_first(fabric: Fabric, groups: Sequence[_Group],
                        shares: Sequence[Fraction]) -> List[int]:
    """Server of each group, largest group first (ties in group order), each to
    the server with the fewest GPUs relative to its share (ties: lowest index).
    Balances better when a small group would take the room a large one needs."""
    servers = len(shares)
    loads = [0] * servers
    server_of_group = [-1] * len(groups)
    for index in sorted(range(len(groups)), key=lambda i: -groups[i].hosts):
        server = min(range(servers), key=lambda s: (loads[s] / shares[s], s))
        server_of_group[index] = server
        loads[server] += groups[index].hosts
    return server_of_group


#: The ways of spreading groups over servers, in order of preference on a tie.
SPREADS = (_fill_servers_in_turn, _cut_in_creation_order, _deal_largest_first)


def _links_between(fabric: Fabric, groups: Sequence[_Group]) -> List[Dict[int, int]]:
    """For each group, the number of links to each other group (by index)."""
    group_of = {node: index for index, group in enumerate(groups) for node in group.nodes}
    between: List[Dict[int, int]] = [{} for _ in groups]
    for u, v in fabric.graph.edges():
        a, b = group_of.get(u), group_of.get(v)
        if a is not None and b is not None and a != b:
            between[a][b] = between[a].get(b, 0) + 1
            between[b][a] = between[b].get(a, 0) + 1
    return between


def _place_by_links(fabric: Fabric, server_of: Dict[str, int],
                    units: Sequence[Tuple[str, ...]], servers: int) -> None:
    """Put each unit (nodes that stay together) on the server holding most of
    its links, nearest to the placed nodes first; ties to the server with the
    fewest switches so far, then the lowest index."""
    graph = fabric.graph
    switches = [0] * servers
    for node, server in server_of.items():
        if fabric.kind(node) != HOST:
            switches[server] += 1

    # Hops from the placed nodes: a core is placed after the aggs below it
    # are, so its majority is counted over links that are already decided.
    distance = {node: 0 for node in server_of}
    queue = deque(server_of)
    while queue:
        node = queue.popleft()
        for peer in graph.neighbors(node):
            if peer not in distance:
                distance[peer] = distance[node] + 1
                queue.append(peer)
    order = {node: index for index, node in enumerate(graph)}
    unreachable = len(order) + 1

    def nearest_first(unit: Tuple[str, ...]) -> Tuple[int, int]:
        return (min(distance.get(n, unreachable) for n in unit), min(order[n] for n in unit))

    for unit in sorted(units, key=nearest_first):
        inside = set(unit)
        links = [0] * servers
        for node in unit:
            for _, peer in graph.edges(node):            # parallel links count each
                if peer not in inside and peer in server_of:
                    links[server_of[peer]] += 1
        target = min(range(servers), key=lambda s: (-links[s], switches[s], s))
        for node in unit:
            server_of[node] = target
            if fabric.kind(node) != HOST:
                switches[target] += 1


# ---------------------------------------------------------------- result
def _crossing_links(fabric: Fabric, server_of: Dict[str, int]) -> List[Tuple[str, str]]:
    """Links whose ends are on different servers, each as (u, v) with u < v, sorted."""
    return sorted(tuple(sorted((u, v))) for u, v in fabric.graph.edges()
                  if server_of[u] != server_of[v])


def _placement(fabric: Fabric, server_of: Dict[str, int], grouping: str,
               servers: int) -> Placement:
    graph = fabric.graph
    tunnels = _crossing_links(fabric, server_of)
    roles = Counter("-".join(_tier_order(graph.nodes[u]["role"], graph.nodes[v]["role"]))
                    for u, v in tunnels)
    hosts_per_server = [0] * servers
    for host in fabric.hosts:
        hosts_per_server[server_of[host]] += 1
    return Placement(server_of=dict(server_of), tunnels=tuple(tunnels),
                     hosts_per_server=tuple(hosts_per_server), groups=grouping,
                     fabric=fabric.name,
                     tunnel_roles=tuple(sorted(roles.items(), key=lambda kv: (-kv[1], kv[0]))))


#: Lower tiers first when naming a tunnel by its ends' roles (``agg-core``).
_TIERS = ("gpu", "nvswitch", "edge", "tor", "leaf", "rail", "agg", "spine", "core")


def _tier_order(a: str, b: str) -> Tuple[str, str]:
    rank = {role: index for index, role in enumerate(_TIERS)}
    return tuple(sorted((a, b), key=lambda role: (rank.get(role, len(_TIERS)), role)))
