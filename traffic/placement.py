"""Where P and D instances sit: affinity tiles hashed over the switches, or zones.

Section 6 of the 002 text ("Intra-Cell P/D Placement"): never "Rack/Zone
A: all Prefill, Rack/Zone B: all Decode", which squeezes every KV transfer
onto the few A -> B links; instead every switch should see P and D ports
close to the global ratio.  The unit is the affinity tile (its table):

    ============  ===========  =====  ====  ============================
    config        tile         tiles  flex  on 128 nodes (1,024 GPUs)
    ============  ===========  =====  ====  ============================
    general 3:2   3P + 2D      25     3     general coding agent
    P-heavy 5:3   5P + 3D      16     0     long input, short output
    balanced 1:1  4P + 4D      16     0     long reasoning, multi-turn
    ============  ===========  =====  ====  ============================

"Tiles are not physically contiguous rows of machines - they're evenly
hashed across ZCube's two switch dimensions."  On ZCube GPU (i, j) sits on
A_i and B_j (topologies/zcube.py), so a node (a TP group of 8 GPUs) has one
A switch and eight B switches on a 32 x 32 cube; `tile_placement` gives
roles so that the P share of every switch's node ports stays near the
global one, then groups tiles out of nodes close to each other (few switch
hops between same-rank GPUs), so that "same tile D" is also a short path.

Any fabric whose GPU hosts are single-homed on packet switches works: a
node is the hosts sharing ``server`` (or ``gpus_per_node`` consecutive
GPUs), its TP rank k is its k-th GPU, and a GPU with several NIC ports
(ZCube, HPN, Rail-Fabric) has one host per port.
"""

from __future__ import annotations

import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Dict, FrozenSet, Iterable, List, Optional, Sequence, Tuple

import networkx as nx
import numpy as np

from topologies import zcube
from topologies.fabric import EPS, HOST, Fabric

P, D, FLEX = "P", "D", "flex"
ROLES = (P, D, FLEX)

#: The text's tile table: name -> (P per tile, D per tile).
TILES: Dict[str, Tuple[int, int]] = {"3p2d": (3, 2), "5p3d": (5, 3), "4p4d": (4, 4)}


class PlacementError(ValueError):
    """A placement cannot be made as asked; the message says why."""


@dataclass(frozen=True)
class Node:
    """One TP group: its GPUs by TP rank, each GPU's NIC hosts, its switches."""

    id: int
    gpus: Tuple[int, ...]
    hosts: Tuple[Tuple[str, ...], ...]      # hosts[k]: rank k's hosts by nic_port
    ports: Tuple[Tuple[str, int], ...]      # (switch, NIC ports of this node on it)

    @property
    def tp(self) -> int:
        return len(self.gpus)

    @property
    def switches(self) -> FrozenSet[str]:
        return frozenset(switch for switch, _ in self.ports)


class Topology:
    """Nodes of a fabric and switch-hop distances between their GPUs."""

    def __init__(self, fabric: Fabric, gpus_per_node: Optional[int] = None):
        self.fabric = fabric
        logical = fabric.logical_graph()
        self.switch_of: Dict[str, str] = {}
        by_gpu: Dict[int, List[Tuple[int, str]]] = defaultdict(list)
        for index, host in enumerate(fabric.hosts):
            data = fabric.graph.nodes[host]
            peers = [peer for peer in logical[host] if logical.nodes[peer]["kind"] == EPS]
            if len(peers) != 1:
                raise PlacementError(f"{fabric.name}: host {host} is not single-homed on a "
                                     "packet switch; placement needs one switch per NIC port")
            self.switch_of[host] = peers[0]
            by_gpu[data.get("gpu", index)].append((data.get("nic_port", 0), host))
        self.gpu_hosts = {gpu: tuple(h for _, h in sorted(hosts)) for gpu, hosts in by_gpu.items()}
        groups: Dict[int, List[int]] = defaultdict(list)
        for gpu in sorted(self.gpu_hosts):
            if gpus_per_node:
                groups[gpu // gpus_per_node].append(gpu)
            else:
                groups[fabric.graph.nodes[self.gpu_hosts[gpu][0]].get("server", gpu)].append(gpu)
        self.nodes: List[Node] = []
        for node_id, gpus in sorted(groups.items()):
            hosts = tuple(self.gpu_hosts[g] for g in gpus)
            ports = Counter(self.switch_of[h] for rank in hosts for h in rank)
            self.nodes.append(Node(node_id, tuple(gpus), hosts, tuple(sorted(ports.items()))))
        self._by_id = {node.id: node for node in self.nodes}
        switches = logical.subgraph(n for n, d in logical.nodes(data=True) if d["kind"] != HOST)
        self._distance = dict(nx.all_pairs_shortest_path_length(switches))
        self._node_hops: Dict[Tuple[int, int], float] = {}
        self._paths: Dict[Tuple[int, int], List[List[str]]] = {}
        self._logical = logical

    def node(self, node_id: int) -> Node:
        try:
            return self._by_id[node_id]
        except KeyError:
            raise PlacementError(f"no node {node_id}; nodes are "
                                 f"{self.nodes[0].id}..{self.nodes[-1].id}") from None

    def gpu_hops(self, a: int, b: int) -> int:
        """Switches on the shortest path between GPUs a and b, over any of their NICs."""
        best = None
        for host_a in self.gpu_hosts[a]:
            reach = self._distance[self.switch_of[host_a]]
            for host_b in self.gpu_hosts[b]:
                hops = reach.get(self.switch_of[host_b])
                if hops is not None and (best is None or hops + 1 < best):
                    best = hops + 1
        if best is None:
            raise PlacementError(f"GPUs {a} and {b} are not connected")
        return best

    def paths(self, src_gpu: int, dst_gpu: int) -> List[List[str]]:
        """Candidate node paths (host, switches..., host) from one GPU to another.

        ZCube: `topologies.zcube.paths`, [P -> A_p -> B_d -> D, P -> B_p ->
        A_d -> D].  Other fabrics: a shortest path from each NIC port of the
        source GPU to the same NIC port of the destination GPU where one
        exists (HPN's two planes: port 0 to port 0, port 1 to port 1), else
        between their first NIC hosts.  Cached per GPU pair (the KV planner
        asks for every rank of every request).
        """
        key = (src_gpu, dst_gpu)
        if key not in self._paths:
            if self.fabric.name == "zcube":
                self._paths[key] = zcube.paths(self.fabric, src_gpu, dst_gpu)
            else:
                pairs = list(zip(self.gpu_hosts[src_gpu], self.gpu_hosts[dst_gpu]))
                found = [nx.shortest_path(self._logical, a, b) for a, b in pairs
                         if nx.has_path(self._logical, a, b)]
                self._paths[key] = found or [nx.shortest_path(
                    self._logical, self.gpu_hosts[src_gpu][0], self.gpu_hosts[dst_gpu][0])]
        return self._paths[key]

    def node_hops(self, p: int, d: int) -> float:
        """Mean switch hops from P's TP rank k to D's TP rank k (rank i -> rank i)."""
        key = (p, d)
        if key not in self._node_hops:
            src, dst = self.node(p), self.node(d)
            if src.tp != dst.tp:
                raise PlacementError(f"nodes {p} and {d} have TP {src.tp} and {dst.tp}: "
                                     "rank i -> rank i needs equal TP sizes")
            hops = [self.gpu_hops(a, b) for a, b in zip(src.gpus, dst.gpus)]
            self._node_hops[key] = sum(hops) / len(hops)
        return self._node_hops[key]


@dataclass(frozen=True)
class Tile:
    index: int
    prefill: Tuple[int, ...]
    decode: Tuple[int, ...]

    @property
    def nodes(self) -> Tuple[int, ...]:
        return self.prefill + self.decode


@dataclass(frozen=True)
class Placement:
    """Roles per node id, the tiles (none for zones) and how it was made."""

    kind: str
    roles: Dict[int, str]
    tiles: Tuple[Tile, ...] = ()

    def nodes_with(self, role: str) -> List[int]:
        return sorted(n for n, r in self.roles.items() if r == role)

    @property
    def prefill(self) -> List[int]:
        return self.nodes_with(P)

    @property
    def decode(self) -> List[int]:
        return self.nodes_with(D)

    @property
    def flex(self) -> List[int]:
        return self.nodes_with(FLEX)

    def tile_of(self, node: int) -> Optional[int]:
        for tile in self.tiles:
            if node in tile.nodes:
                return tile.index
        return None

    def assume(self, flex_node: int, role: str) -> "Placement":
        """A flex node turns P or D (a prefill peak, a D memory peak, a failure)."""
        if self.roles.get(flex_node) != FLEX:
            raise PlacementError(f"node {flex_node} is {self.roles.get(flex_node)}, not flex")
        if role not in (P, D):
            raise PlacementError(f"a flex node becomes P or D, not {role!r}")
        return replace(self, roles={**self.roles, flex_node: role})

    def switch_ports(self, topo: Topology) -> Dict[str, Dict[str, int]]:
        """NIC ports per role on every switch."""
        counts: Dict[str, Dict[str, int]] = defaultdict(lambda: dict.fromkeys(ROLES, 0))
        for node in topo.nodes:
            role = self.roles.get(node.id)
            for switch, ports in node.ports:
                if role is not None:
                    counts[switch][role] += ports
        return dict(counts)

    def p_share(self) -> float:
        p, d = len(self.prefill), len(self.decode)
        return p / (p + d) if p + d else 0.0

    def max_deviation(self, topo: Topology) -> float:
        """Largest gap, over switches, between a switch's P share and the global one."""
        target, worst = self.p_share(), 0.0
        for ports in self.switch_ports(topo).values():
            total = ports[P] + ports[D]
            if total:
                worst = max(worst, abs(ports[P] / total - target))
        return worst


# ------------------------------------------------------------------ builders
def _counts(topo: Topology, tile: Tuple[int, int], tiles: Optional[int]) -> Tuple[int, int, int]:
    p, d = tile
    if p < 1 or d < 1:
        raise PlacementError(f"a tile needs at least one P and one D, got {p}P+{d}D")
    size, n = p + d, len(topo.nodes)
    tiles = n // size if tiles is None else tiles
    if tiles < 1 or tiles * size > n:
        raise PlacementError(f"{tiles} tiles of {p}P+{d}D need {tiles * size} nodes; the "
                             f"fabric has {n}")
    return tiles * p, tiles * d, n - tiles * size


def _hashed(nodes: Iterable[Node], seed: int) -> List[Node]:
    return sorted(nodes, key=lambda node: (zlib.crc32(f"{seed}:{node.id}".encode()), node.id))


def _spread(order: Sequence[Node], count: int) -> List[Node]:
    """`count` nodes sharing as few switches as possible (flex 'evenly across')."""
    chosen: List[Node] = []
    used: Counter = Counter()
    for _ in range(count):
        rest = [n for n in order if n not in chosen]
        best = min(rest, key=lambda n: sum(used[s] for s in n.switches))
        chosen.append(best)
        used.update(best.switches)
    return chosen


def _cost(ports: Dict[str, List[int]], target: float, switches: Iterable[str]) -> float:
    """Squared gap between P ports and the target share of P + D ports, summed."""
    return sum((ports[s][0] - target * (ports[s][0] + ports[s][1])) ** 2 for s in switches)


def _assign_roles(order: Sequence[Node], n_p: int, n_d: int) -> Dict[int, str]:
    """Roles keeping every switch's P share near the global one.

    Greedy in hashed order (each node takes the role that costs its
    switches least), then P<->D swaps while a swap lowers the summed
    squared gap: the greedy's last nodes have no choice left.
    """
    target = n_p / (n_p + n_d)
    ports: Dict[str, List[int]] = defaultdict(lambda: [0, 0])
    left = {P: n_p, D: n_d}
    roles: Dict[int, str] = {}

    def move(node: Node, role: str, sign: int) -> None:
        for switch, count in node.ports:
            ports[switch][0 if role == P else 1] += sign * count

    def cost_as(node: Node, role: str) -> float:
        before = _cost(ports, target, node.switches)
        move(node, role, +1)
        after = _cost(ports, target, node.switches)
        move(node, role, -1)
        return after - before

    for node in order:
        options = [role for role in (P, D) if left[role]]
        role = min(options, key=lambda r: (round(cost_as(node, r), 9),
                                           -left[r] / (n_p if r == P else n_d)))
        roles[node.id] = role
        left[role] -= 1
        move(node, role, +1)

    _swap_roles(order, roles, ports, n_p, n_d)
    return roles


def _swap_roles(order: Sequence[Node], roles: Dict[int, str], ports: Dict[str, List[int]],
                n_p: int, n_d: int) -> None:
    """`_assign_roles`' swaps, in place: passes over ``order`` while one swaps.

    The rule, as it always was: for each node a in order that is P, the first node
    b in order that is D and whose swap with a lowers the summed squared gap by
    more than 1e-9 swaps with it (a is then D, so a's scan ends).  Scanning every
    (a, b) pair in Python made 16,384 GPUs take minutes; here a's scan is one
    vector expression over every b, in exact integer arithmetic:

    With t = n_p / N (N = n_p + n_d) and, per switch s, P_s its P ports, T_s its
    P + D ports (a swap keeps T_s) and E_s = N.P_s - n_p.T_s (N times the gap
    P_s - t.T_s), swapping a (P -> D, ports a_s) and b (D -> P, ports b_s)
    changes P_s by b_s - a_s and the cost by F(a, b) / N, with the integer

        F(a, b) = sum_s N.a_s^2 - 2 E_s a_s  +  sum_s N.b_s^2 + 2 E_s b_s
                  - 2 N sum_s a_s b_s.

    The old floating-point test (cost after < cost before - 1e-9) decides the
    same: the true change is a multiple of 1/N (>= 1/N in size unless 0, far
    above 1e-9 and the float's rounding).
    """
    if not order:
        return
    total = n_p + n_d
    columns: Dict[str, int] = {}
    rows = []
    for node in order:
        cols, counts = [], []
        for switch, count in node.ports:
            cols.append(columns.setdefault(switch, len(columns)))
            counts.append(count)
        rows.append((np.array(cols, dtype=np.int64), np.array(counts, dtype=np.int64)))
    m = np.zeros((len(order), len(columns)), dtype=np.int64)
    for i, (cols, counts) in enumerate(rows):
        np.add.at(m[i], cols, counts)
    p_ports = np.array([ports[s][0] for s in columns], dtype=np.int64)
    t_ports = np.array([ports[s][0] + ports[s][1] for s in columns], dtype=np.int64)
    e = total * p_ports - n_p * t_ports
    squares = (m * m).sum(axis=1)
    me = m @ e
    is_p = np.array([roles[node.id] == P for node in order])
    is_d = np.array([roles[node.id] == D for node in order])
    threshold = -1e-9 * total
    improved = True
    while improved:
        improved = False
        for i in range(len(order)):
            if not is_p[i] or not is_d.any():
                continue
            cols = np.flatnonzero(m[i])
            own = m[i, cols]
            a_term = total * squares[i] - 2 * me[i]
            f = a_term + total * squares + 2 * me - 2 * total * (m[:, cols] @ own)
            hits = np.flatnonzero(is_d & (f < threshold))
            if not len(hits):
                continue
            j = int(hits[0])
            is_p[i], is_d[i], is_p[j], is_d[j] = False, True, True, False
            roles[order[i].id], roles[order[j].id] = D, P
            touched = np.flatnonzero(m[i] | m[j])
            change = total * (m[j, touched] - m[i, touched])
            e[touched] += change
            me += m[:, touched] @ change
            improved = True


def _group_tiles(topo: Topology, order: Sequence[Node], roles: Dict[int, str],
                 tile: Tuple[int, int], tiles: int) -> Tuple[Tile, ...]:
    """Tiles of nodes close to each other: seed a P, add the nearest needed role
    (the one with the least summed `Topology.node_hops` to the tile's members,
    the earliest in ``order`` on a tie)."""
    hops = _hop_matrix(topo, order)
    if hops is not None:
        return _group_tiles_fast(order, roles, tile, tiles, hops)
    return _group_tiles_pairwise(topo, order, roles, tile, tiles)


def _group_tiles_pairwise(topo: Topology, order: Sequence[Node], roles: Dict[int, str],
                          tile: Tuple[int, int], tiles: int) -> Tuple[Tile, ...]:
    """`_group_tiles` pair by pair (`Topology.node_hops`): where the hop matrix
    cannot be made, and the reference the fast path is tested against."""
    rank = {node.id: index for index, node in enumerate(order)}
    free = {P: [n.id for n in order if roles[n.id] == P],
            D: [n.id for n in order if roles[n.id] == D]}
    result = []
    for index in range(tiles):
        members = {P: [free[P].pop(0)], D: []}
        need = {P: tile[0] - 1, D: tile[1]}
        while need[P] or need[D]:
            everyone = members[P] + members[D]
            candidates = [(role, n) for role in (P, D) if need[role] for n in free[role]]
            role, best = min(candidates, key=lambda c: (
                sum(topo.node_hops(c[1], m) for m in everyone), rank[c[1]]))
            free[role].remove(best)
            members[role].append(best)
            need[role] -= 1
        result.append(Tile(index, tuple(sorted(members[P])), tuple(sorted(members[D]))))
    return tuple(result)


def _hop_matrix(topo: Topology, order: Sequence[Node]):
    """``hops[i, j]`` = ``topo.node_hops(order[i].id, order[j].id)`` for every pair,
    computed at once (numpy), or None where `node_hops` would raise (TP sizes
    differ, GPUs not connected): `_group_tiles` then asks pair by pair as before.

    Same values: per TP rank k the fewest switches between any NIC port of the
    two rank-k GPUs (the switch-to-switch distance + 1), summed over the ranks
    as integers and divided by TP, as `Topology.node_hops` does."""
    if not order or len({node.tp for node in order}) != 1:
        return None
    switches = list(topo._distance)
    column = {switch: index for index, switch in enumerate(switches)}
    # Small integers gathered N x N times: int16 where the distances fit (16K GPUs).
    small = len(switches) < 8000
    far = 16000 if small else np.iinfo(np.int64).max // 4
    dist = np.full((len(switches) + 1, len(switches) + 1), far,
                   dtype=np.int16 if small else np.int64)
    for switch, reach in topo._distance.items():
        row = column[switch]
        for other, length in reach.items():
            dist[row, column[other]] = length
    ports = max(len(rank) for node in order for rank in node.hosts)
    tp = order[0].tp
    total = np.zeros((len(order), len(order)), dtype=np.int64)
    for k in range(tp):
        at = np.full((len(order), ports), len(switches), dtype=np.int64)   # padding: far
        for i, node in enumerate(order):
            for port, host in enumerate(topo.gpu_hosts[node.gpus[k]]):
                at[i, port] = column[topo.switch_of[host]]
        best = np.full((len(order), len(order)), far, dtype=dist.dtype)
        for pa in range(ports):
            for pb in range(ports):
                np.minimum(best, dist[np.ix_(at[:, pa], at[:, pb])], out=best)
        if (best >= far).any():
            return None
        total += best + 1
    return total / tp


def _group_tiles_fast(order: Sequence[Node], roles: Dict[int, str], tile: Tuple[int, int],
                      tiles: int, hops) -> Tuple[Tile, ...]:
    """`_group_tiles` over the hop matrix: the same picks.  A pick is the free
    node of a needed role with the least summed hops to the tile's members (P
    members first, then D, summed as Python floats as before), the earliest in
    ``order`` on a tie; the sums of all candidates come from one vector
    expression, and the few within 1e-9 of the least are summed exactly again."""
    size = len(order)
    is_role = {P: np.array([roles[n.id] == P for n in order]),
               D: np.array([roles[n.id] == D for n in order])}
    free = np.ones(size, dtype=bool)
    result = []
    for index in range(tiles):
        seeds = np.flatnonzero(free & is_role[P])
        if not len(seeds):
            raise IndexError("pop from empty list")
        first = int(seeds[0])
        free[first] = False
        members = {P: [first], D: []}
        need = {P: tile[0] - 1, D: tile[1]}
        near = hops[:, first].copy()
        while need[P] or need[D]:
            allowed = np.zeros(size, dtype=bool)
            for role in (P, D):
                if need[role]:
                    allowed |= is_role[role]
            allowed &= free
            picks = np.flatnonzero(allowed)
            if not len(picks):
                raise ValueError("min() arg is an empty sequence")
            sums = near[picks]
            close = picks[sums <= sums.min() + 1e-9]
            everyone = members[P] + members[D]
            best = int(close[0]) if len(close) == 1 else min(
                (sum(float(hops[c, m]) for m in everyone), int(c)) for c in close)[1]
            role = P if is_role[P][best] else D
            free[best] = False
            members[role].append(best)
            need[role] -= 1
            near += hops[:, best]
        result.append(Tile(index, tuple(sorted(order[i].id for i in members[P])),
                           tuple(sorted(order[i].id for i in members[D]))))
    return tuple(result)


def tile_placement(topo: Topology, tile: Tuple[int, int] = (3, 2), tiles: Optional[int] = None,
                   seed: int = 0) -> Placement:
    """Affinity tiles hashed across the switches; the nodes left over are flex.

    ``tiles`` defaults to as many as fit (25 of 3P+2D and 3 flex on 128
    nodes, as in the text).  ``seed`` changes the hash, not the quality.
    """
    n_p, n_d, n_flex = _counts(topo, tile, tiles)
    order = _hashed(topo.nodes, seed)
    flex = _spread(order, n_flex)
    rest = [node for node in order if node not in flex]
    roles = _assign_roles(rest, n_p, n_d)
    roles.update({node.id: FLEX for node in flex})
    count = n_p // tile[0]
    return Placement("tiles", roles, _group_tiles(topo, rest, roles, tile, count))


def zone_placement(topo: Topology, tile: Tuple[int, int] = (3, 2),
                   tiles: Optional[int] = None) -> Placement:
    """The wrong baseline: the same counts, all P first (by node id), then all D."""
    n_p, n_d, _ = _counts(topo, tile, tiles)
    roles = {}
    for index, node in enumerate(topo.nodes):
        roles[node.id] = P if index < n_p else D if index < n_p + n_d else FLEX
    return Placement("zone", roles)


def placement(topo: Topology, kind: str = "tiles", tile: str = "3p2d",
              tiles: Optional[int] = None, seed: int = 0) -> Placement:
    """By name: ``kind`` "tiles" or "zone", ``tile`` one of `TILES`."""
    if tile not in TILES:
        raise PlacementError(f"unknown tile {tile!r}; known: {', '.join(TILES)}")
    if kind == "tiles":
        return tile_placement(topo, TILES[tile], tiles, seed)
    if kind == "zone":
        return zone_placement(topo, TILES[tile], tiles)
    raise PlacementError(f"unknown placement {kind!r}; known: tiles, zone")
