"""A fabric as the flow-level model sees it: directed links with capacities, and
the testbed's routing over them, computed for many flows at once.

Every wire of a `Fabric` becomes two directed links (one per direction), each
with the capacity of its line rate (``bps_of(gbps)``).  A flow's path is a list
of link ids::

    h1 --l0--> s1 --l4--> s5 --l9--> s2 --l2--> h7          (static links)
    s1 --l6--> o1 --l11--> s3                                 (a lit circuit:
                                                               the two fibres)

Routing is the testbed's own rule (`topologies.routing`, the controller's
`EpsCore`): shortest paths over the *logical* graph (static links that are up
plus the lit circuits), never through a host unless the fabric's hosts
forward (SiP-OCS), and without Rail-Fabric's fast lanes, which carry only
pinned flows.  Each switch spreads flows over its equal-cost next hops by a
hash of the flow's key, as a kernel router hashes a five-tuple; the model's
hash is its own (seeded by ``ecmp_seed``), so a flow's path is a draw of the
same ECMP choice, not the emulator's exact draw.  With ``kernel_multipath``
the keys are the kernel routers' own hashes of the flows
(`traffic.model.kernel_ecmp`) and each router picks among its next hops in
port order as the kernel does: the paths of a ``linux`` data plane run.

For speed at 16K GPUs the distances are computed once per routing state
between *routing nodes* only (packet switches, and hosts where hosts
forward) with scipy's breadth-first search, and the paths of a whole batch of
flows are walked hop by hop with numpy: at each hop every flow looks at its
node's neighbours one step closer to its destination and takes one by its
hash.  A destination with no path (a dark circuit, a failed switch) gets the
*blackhole* link as its last hop: a link of capacity 0, so the flow waits
there until the routes change and it is rerouted, as packets sent toward a
dark port are lost until the circuit lights.
"""

from __future__ import annotations

import zlib
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np
from numba import njit

from topologies.fabric import EPS, HOST, OCS, Fabric, FabricError
from traffic.model.paths import UNREACHABLE, _mix, walk_paths


@njit(cache=True)
def _mix_all(keys, nodes, seed):
    out = np.empty(len(keys), dtype=np.uint64)
    for i in range(len(keys)):
        out[i] = _mix(keys[i], nodes[i], seed)
    return out


def ecmp_hash(keys: np.ndarray, nodes: np.ndarray, seed: int) -> np.ndarray:
    """A 64-bit mix (splitmix64) of each flow's key, the node it is at and the
    seed: which of the node's equal-cost next hops the flow takes."""
    keys = np.ascontiguousarray(keys, dtype=np.uint64)
    nodes = np.ascontiguousarray(np.broadcast_to(nodes, keys.shape), dtype=np.uint64)
    return _mix_all(keys, nodes, np.uint64(seed & 0xFFFFFFFF))


def key_of(name: str) -> int:
    """A stable 63-bit key for a flow id (Python's hash() is salted per process)."""
    data = name.encode()
    return (zlib.crc32(data) << 31) ^ zlib.adler32(data)


def _crc32_table() -> np.ndarray:
    """zlib's CRC-32 (reflected, polynomial 0xEDB88320) byte table."""
    table = np.empty(256, dtype=np.uint64)
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0xEDB88320 if crc & 1 else crc >> 1
        table[byte] = crc
    return table


_CRC32_TABLE = _crc32_table()


@njit(cache=True)
def _keys_of(prefix, buffer, starts, ends, table):
    # zlib's crc32 and adler32 of prefix + buffer[start:end], as key_of does;
    # the prefix's state is computed once and continued per name.
    crc0, a0, b0 = np.uint64(0xFFFFFFFF), np.uint64(1), np.uint64(0)
    for byte in prefix:
        crc0 = table[(crc0 ^ np.uint64(byte)) & np.uint64(0xFF)] ^ (crc0 >> np.uint64(8))
        a0 = (a0 + np.uint64(byte)) % np.uint64(65521)
        b0 = (b0 + a0) % np.uint64(65521)
    out = np.empty(len(starts), dtype=np.uint64)
    for i in range(len(starts)):
        crc, a, b = crc0, a0, b0
        for j in range(starts[i], ends[i]):
            byte = np.uint64(buffer[j])
            crc = table[(crc ^ byte) & np.uint64(0xFF)] ^ (crc >> np.uint64(8))
            a = (a + byte) % np.uint64(65521)
            b = (b + a) % np.uint64(65521)
        crc ^= np.uint64(0xFFFFFFFF)
        out[i] = (crc << np.uint64(31)) ^ ((b << np.uint64(16)) | a)
    return out


def keys_of(prefix: str, names: Sequence[str]) -> np.ndarray:
    """``key_of(prefix + name)`` of every name, as uint64, compiled: 1.4
    million flow ids took 1.8 s one by one."""
    try:
        buffer = "\n".join(names).encode("ascii")
        head = prefix.encode("ascii")
    except UnicodeEncodeError:          # byte and character lengths differ: one by one
        return np.fromiter((key_of(prefix + n) for n in names), dtype=np.uint64,
                           count=len(names))
    lengths = np.fromiter(map(len, names), dtype=np.int64, count=len(names))
    ends = np.cumsum(lengths + 1) - 1             # each name is followed by one separator
    return _keys_of(np.frombuffer(head, dtype=np.uint8), np.frombuffer(buffer, dtype=np.uint8),
                    ends - lengths, ends, _CRC32_TABLE)


@dataclass
class _PacketHops:
    """What `ModelNetwork.rebuild` keeps between reconfigurations: the
    routers, and the logical hops over packet wires (see `_packet_state`)."""

    routers: List[str]
    router_ids: Dict[str, int]
    key_index: Dict[Tuple[str, str], int]        # pair (u, v) -> its order
    key_lists: List[int]                         # wires per pair
    entries: Optional[np.ndarray] = None         # (from, to, link, pair, position) rows
    attach: Dict[str, Tuple[str, int, int]] = field(default_factory=dict)
    first_link: Dict[Tuple[str, str], int] = field(default_factory=dict)  # (u, host) -> link


class ModelNetwork:
    """Directed links, their capacities and the current routes of one fabric.

    ``bps_of(gbps)`` gives a link's capacity in bits per second (real rates:
    ``lambda g: g * 1e9``; the emulator's scale: `traffic.scale.Scale`).
    The last link is the blackhole (capacity 0).  Circuits change with
    `set_circuits`; links and switches fail with `fail_link` / `fail_node`.
    """

    def __init__(self, fabric: Fabric, bps_of: Callable[[float], float] = lambda g: g * 1e9,
                 ecmp_seed: int = 1, kernel_multipath: bool = False):
        self.fabric = fabric
        self.ecmp_seed = int(ecmp_seed)
        self.kernel_multipath = kernel_multipath
        graph = fabric.graph
        self.names: List[str] = list(graph.nodes)
        self.index: Dict[str, int] = {n: i for i, n in enumerate(self.names)}
        self.kind = np.array([graph.nodes[n]["kind"] for n in self.names])
        # A node's kind, looked up millions of times by each rebuild.
        self._kind_of: Dict[str, str] = {n: graph.nodes[n]["kind"] for n in self.names}
        self.transit_hosts = bool(fabric.params.get("transit_hosts", False))
        src, dst, caps, port = [], [], [], []
        # (u, v) -> [(port on u, link u->v)] over parallel wires, in port order
        self._wires: Dict[Tuple[str, str], List[Tuple[int, int]]] = defaultdict(list)
        # (ocs, port) -> (node wired there, link node->ocs, link ocs->node)
        self._ocs_port: Dict[Tuple[str, int], Tuple[str, int, int]] = {}
        for u, v, data in graph.edges(data=True):
            ids = {}
            for a, b in ((u, v), (v, u)):
                link = len(src)
                ids[a] = link
                src.append(self.index[a])
                dst.append(self.index[b])
                caps.append(bps_of(data["gbps"]))
                port.append(data["ports"][a])
                self._wires[a, b].append((data["ports"][a], link))
            for ocs, node in ((u, v), (v, u)):
                if graph.nodes[ocs]["kind"] == OCS and graph.nodes[node]["kind"] != OCS:
                    self._ocs_port[ocs, data["ports"][ocs]] = (node, ids[node], ids[ocs])
        for key in self._wires:
            self._wires[key].sort()
        # The wires between two packet nodes (a hop each), which no circuit changes.
        self._packet_wires = [(a, b, port, link) for (a, b), wires in self._wires.items()
                              if OCS not in (self._kind_of[a], self._kind_of[b])
                              for port, link in wires]
        self.blackhole = len(src)
        src.append(-1)
        dst.append(-1)
        caps.append(0.0)
        port.append(-1)
        self.link_port = np.array(port, dtype=np.int64)    # the port it leaves its source by
        self.link_src = np.array(src, dtype=np.int64)
        self.link_dst = np.array(dst, dtype=np.int64)
        self.nominal_bps = np.array(caps, dtype=float)
        self.capacity_bps = self.nominal_bps.copy()
        self.down_links: Set[frozenset] = set()
        self.down_nodes: Set[str] = set()
        self.excluded_ports: Set[Tuple[str, int]] = self._fast_lane_ports()
        self._attach: Dict[str, Tuple[str, int, int]] = {}
        self._packet_hops: Optional[_PacketHops] = None     # see _packet_state
        self.rebuild()

    # ------------------------------------------------------------ wiring
    def _fast_lane_ports(self) -> Set[Tuple[str, int]]:
        if self.fabric.name != "rail-fabric":
            return set()
        from topologies.rail_fabric import fast_lane_ports
        lanes = set()
        for a, pa, b, pb in fast_lane_ports(self.fabric):
            lanes |= {(a, pa), (b, pb)}
        return lanes

    def routing_node(self, name: str) -> bool:
        kind = self._kind_of[name]
        return kind == EPS or (kind == HOST and self.transit_hosts)

    # ------------------------------------------------------------ routing state
    def _packet_state(self) -> "_PacketHops":
        """The routers and the logical hops over packet wires: only a failure
        or a restore changes them (they clear this cache), so a
        reconfiguration (two rebuilds per OCS, 123 an iteration of RFabric
        at 4,096 GPUs) adds its circuits to them and builds nothing else."""
        if self._packet_hops is not None:
            return self._packet_hops
        down_nodes, down_links, capacity = self.down_nodes, self.down_links, self.capacity_bps
        # (u, v) -> the link of each packet wire u -> v that is up, in port order.
        hops: Dict[Tuple[str, str], List[int]] = defaultdict(list)
        for a, b, port, link in self._packet_wires:
            if a in down_nodes or b in down_nodes or (a, port) in self.excluded_ports:
                continue
            if capacity[link] <= 0 or (down_links and frozenset((a, b)) in down_links):
                continue
            hops[a, b].append(link)
        routers = [n for n in self.names if self.routing_node(n) and n not in down_nodes]
        router_ids = {n: i for i, n in enumerate(routers)}
        state = _PacketHops(routers, router_ids, {key: k for k, key in enumerate(hops)},
                            [len(links) for links in hops.values()])
        entries = []                 # (from, to, link, key, position in the key's list)
        for k, ((a, b), links) in enumerate(hops.items()):
            if a in router_ids and b in router_ids:
                entries.extend((router_ids[a], router_ids[b], link, k, j)
                               for j, link in enumerate(links))
            elif self._kind_of[a] == HOST and b in router_ids:
                state.attach.setdefault(a, (b, links[0], -1))
            if self._kind_of[b] == HOST:
                state.first_link[a, b] = links[0]
        state.entries = np.array(entries, dtype=np.int64).reshape(-1, 5)
        self._packet_hops = state
        return state

    def rebuild(self) -> None:
        """Recompute the logical graph and the distances after any change.

        A logical hop u -> v is a packet wire, or a lit circuit (two fibres:
        u up to the OCS, the OCS down to v).  Each router's hops are listed
        in a fixed order, which the ECMP pick by hash depends on: by the
        pair (u, v) in order of first appearance (packet pairs first), then
        the packet wires in port order, then the circuits in their OCS's
        order."""
        packet = self._packet_state()
        routers, router_ids = packet.routers, packet.router_ids
        self.routers, self.router_ids = routers, router_ids
        self.router_is_host = np.array([self._kind_of[n] == HOST for n in routers],
                                       dtype=np.bool_)
        count = len(routers)
        capacity = self.capacity_bps
        # The circuits' hops, each numbered as the pair it belongs to.
        new_keys: Dict[Tuple[str, str], int] = {}
        taken: Dict[int, int] = {}            # key -> lists in it so far
        circuit, first_link = [], {}
        for ocs, circuits in self.fabric.circuits.items():
            if ocs in self.down_nodes:
                continue
            for pa, pb in circuits:
                if (ocs, pa) not in self._ocs_port or (ocs, pb) not in self._ocs_port:
                    continue
                (na, up_a, down_a), (nb, up_b, down_b) = (self._ocs_port[ocs, pa],
                                                          self._ocs_port[ocs, pb])
                if na in self.down_nodes or nb in self.down_nodes:
                    continue
                if min(capacity[up_a], capacity[down_a], capacity[up_b], capacity[down_b]) <= 0:
                    continue
                for a, b, up, down in ((na, nb, up_a, down_b), (nb, na, up_b, down_a)):
                    k = packet.key_index.get((a, b))
                    if k is None:
                        k = new_keys.setdefault((a, b), len(packet.key_index) + len(new_keys))
                        first_link.setdefault((a, b), up)
                        j = taken.get(k, 0)
                    else:
                        j = taken.get(k, packet.key_lists[k])
                    taken[k] = j + 1
                    if a in router_ids and b in router_ids:
                        circuit.append((router_ids[a], router_ids[b], up, down, k, j))
        attach = dict(packet.attach)
        for (a, b) in new_keys:                 # after every packet pair, in order
            if a not in router_ids and self._kind_of[a] == HOST and b in router_ids:
                attach.setdefault(a, (b, first_link[a, b], -1))
        for host, (sw, up, _) in attach.items():   # the link back down to each leaf host
            down = packet.first_link.get((sw, host), first_link.get((sw, host)))
            if down is not None:
                attach[host] = (sw, up, down)
        self._attach = attach
        wired = packet.entries
        hops = np.empty((len(wired) + len(circuit), 6), dtype=np.int64)
        hops[:len(wired), :3] = wired[:, :3]
        hops[:len(wired), 3] = -1
        hops[:len(wired), 4:] = wired[:, 3:]
        if circuit:
            hops[len(wired):] = np.array(circuit, dtype=np.int64)
        hops = hops[np.lexsort((hops[:, 5], hops[:, 4], hops[:, 0]))]
        # Each router's logical hops: neighbour and up to two links (a circuit
        # crosses two fibres), grouped by router.
        indptr = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(np.bincount(hops[:, 0], minlength=count), out=indptr[1:])
        self.adj_ptr = indptr
        self.adj_nbr = hops[:, 1].copy()
        self.adj_link1 = hops[:, 2].copy()
        self.adj_link2 = hops[:, 3].copy()
        self.dist = _hop_distances(indptr, self.adj_nbr, UNREACHABLE)
        self._next_hops()

    def _next_hops(self) -> None:
        """The ECMP table: for every (router u, router g), the hops of u one step
        closer to g, as one CSR keyed by u x count + g, so a walk takes one
        lookup per hop whatever the radix.  Each key's hops are in adjacency
        order, or, as a kernel route lists its next hops
        (`topologies.routing.next_hops`), in port order: the hash picks by
        position."""
        ports = (self.link_port[self.adj_link1] if self.kernel_multipath
                 else np.zeros(0, dtype=np.int64))
        self.nh_ptr, self.nh_hop = _closer_hops(self.adj_ptr, self.adj_nbr, self.dist,
                                                UNREACHABLE, ports)

    # ------------------------------------------------------------ changes
    def set_circuits(self, ocs: str, circuits: Iterable[Iterable[int]]) -> None:
        self.fabric.set_circuits(ocs, circuits)
        self.rebuild()

    def _links_between(self, u: str, v: str) -> List[int]:
        return [l for _, l in self._wires.get((u, v), [])] + \
               [l for _, l in self._wires.get((v, u), [])]

    def fail_link(self, u: str, v: str) -> List[int]:
        links = self._links_between(u, v)
        if not links:
            raise FabricError(f"no link {u}-{v} in {self.fabric.name}")
        self.down_links.add(frozenset((u, v)))
        self.capacity_bps[links] = 0.0
        self._rebuild_wires()
        return links

    def _rebuild_wires(self) -> None:
        """Rebuild after a failure or a restore: the packet hops change too."""
        self._packet_hops = None
        self.rebuild()

    def _up(self, links: List[int]) -> List[int]:
        """Of ``links``, those with no end failed on its own (a link down, a node down)."""
        up = []
        for link in links:
            a, b = self.names[self.link_src[link]], self.names[self.link_dst[link]]
            if frozenset((a, b)) not in self.down_links and \
                    a not in self.down_nodes and b not in self.down_nodes:
                up.append(link)
        return up

    def restore_link(self, u: str, v: str) -> List[int]:
        links = self._links_between(u, v)
        self.down_links.discard(frozenset((u, v)))
        up = self._up(links)
        self.capacity_bps[up] = self.nominal_bps[up]
        self._rebuild_wires()
        return up

    def node_links(self, name: str) -> List[int]:
        me = self.index[name]
        return np.flatnonzero((self.link_src == me) | (self.link_dst == me)).tolist()

    def fail_node(self, name: str) -> List[int]:
        if name not in self.index:
            raise FabricError(f"no node {name!r} in {self.fabric.name}")
        links = self.node_links(name)
        self.down_nodes.add(name)
        self.capacity_bps[links] = 0.0
        self._rebuild_wires()
        return links

    def restore_node(self, name: str) -> List[int]:
        self.down_nodes.discard(name)
        up = self._up(self.node_links(name))
        self.capacity_bps[up] = self.nominal_bps[up]
        self._rebuild_wires()
        return up

    # ------------------------------------------------------------ paths
    def _target(self, dst: str) -> Tuple[int, int]:
        """(router id to reach, link down to the host or -1) for a destination."""
        if dst in self.router_ids:
            return self.router_ids[dst], -1
        if dst in self._attach:
            sw, _, down = self._attach[dst]
            return self.router_ids[sw], down
        return -1, -1

    def _origin(self, src: str) -> Tuple[int, int]:
        """(router id the flow starts at, link up from the host or -1)."""
        if src in self.router_ids:
            return self.router_ids[src], -1
        if src in self._attach:
            sw, up, _ = self._attach[src]
            return self.router_ids[sw], up
        return -1, -1

    def paths(self, srcs: Sequence[str], dsts: Sequence[str], keys: Sequence[int]
              ) -> Tuple[np.ndarray, np.ndarray]:
        """The routed paths of many flows at once, as CSR (indptr, link ids)."""
        n = len(srcs)
        origin = np.array([self._origin(s) for s in srcs], dtype=np.int64).reshape(n, 2)
        target = np.array([self._target(d) for d in dsts], dtype=np.int64).reshape(n, 2)
        keys = np.asarray(keys, dtype=np.uint64).reshape(n)
        return self._walk(origin, target, keys)

    def paths_indexed(self, src_idx: np.ndarray, dst_idx: np.ndarray, keys: np.ndarray
                      ) -> Tuple[np.ndarray, np.ndarray]:
        """`paths` for node indices (`self.index`), for callers that keep arrays."""
        origin = self._table(self._origin)[src_idx]
        target = self._table(self._target)[dst_idx]
        return self._walk(origin, target, np.asarray(keys, dtype=np.uint64))

    def _table(self, fn) -> np.ndarray:
        cache = getattr(self, "_tables", None)
        if cache is None or cache[0] is not self.dist:
            cache = (self.dist, {})
            self._tables = cache
        if fn.__name__ not in cache[1]:
            cache[1][fn.__name__] = np.array([fn(n) for n in self.names], dtype=np.int64)
        return cache[1][fn.__name__]

    def _walk(self, origin: np.ndarray, target: np.ndarray, keys: np.ndarray
              ) -> Tuple[np.ndarray, np.ndarray]:
        return walk_paths(np.ascontiguousarray(origin, dtype=np.int64),
                          np.ascontiguousarray(target, dtype=np.int64),
                          np.ascontiguousarray(keys, dtype=np.uint64),
                          *self._walk_tables())

    def _walk_tables(self) -> tuple:
        return (self.dist, self.nh_ptr, self.nh_hop, self.adj_nbr, self.adj_link1,
                self.adj_link2, np.uint64(self.ecmp_seed & 0xFFFFFFFF), self.blackhole,
                bool(self.kernel_multipath), self.router_is_host)

    def route_tables(self, src_idx: np.ndarray, dst_idx: np.ndarray, keys: np.ndarray
                     ) -> tuple:
        """What the engine routes flows with in its compiled loop (`FlowSim`'s
        ``tables``), as `paths_indexed` would: flow f goes from node
        ``src_idx[f]`` to ``dst_idx[f]`` with ECMP key ``keys[f]``.  Valid
        until the routes change (`set_circuits`, `fail`)."""
        return (np.ascontiguousarray(src_idx, dtype=np.int64),
                np.ascontiguousarray(dst_idx, dtype=np.int64),
                np.ascontiguousarray(keys, dtype=np.uint64),
                np.ascontiguousarray(self._table(self._origin)),
                np.ascontiguousarray(self._table(self._target))) + self._walk_tables()

    def node_path(self, nodes: Sequence[str]) -> np.ndarray:
        """Link ids along an explicit node path (a planned KV path, a pin).

        Between two nodes wired more than once a fast lane is taken first, as
        `controllers.pins` pins a path (the lanes exist for pinned flows), then
        the first wire in port order; a hop through an OCS needs a lit circuit;
        a hop that is down ends in the blackhole."""
        links: List[int] = []
        for a, b in zip(nodes, nodes[1:]):
            wires = [l for p, l in sorted(self._wires.get((a, b), []),
                                          key=lambda w: ((a, w[0]) not in self.excluded_ports,
                                                         w[0]))
                     if self.capacity_bps[l] > 0]
            if wires and a not in self.down_nodes and b not in self.down_nodes:
                links.append(wires[0])
                continue
            via = self._circuit_between(a, b)
            if via is None:
                links.append(self.blackhole)
                break
            links += via
        return np.array(links, dtype=np.int64)

    def _circuit_between(self, a: str, b: str) -> Optional[List[int]]:
        for ocs, circuits in self.fabric.circuits.items():
            for pa, pb in circuits:
                ends = (self._ocs_port.get((ocs, pa)), self._ocs_port.get((ocs, pb)))
                if None in ends:
                    continue
                (na, up_a, down_a), (nb, up_b, down_b) = ends
                if (na, nb) == (a, b):
                    return [up_a, down_b]
                if (nb, na) == (a, b):
                    return [up_b, down_a]
        return None

    def router(self, spec_of: Callable[[int], tuple]) -> Callable[[np.ndarray], Tuple[np.ndarray, np.ndarray]]:
        """A router for `FlowSim`: ``spec_of(flow_id)`` is ``("route", src, dst, key)``
        or ``("nodes", [n1, n2, ...])``."""
        def route(flow_ids: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
            specs = [spec_of(int(f)) for f in flow_ids]
            routed = [i for i, s in enumerate(specs) if s[0] == "route"]
            per_flow: List[np.ndarray] = [np.empty(0, dtype=np.int64)] * len(specs)
            if routed:
                indptr, links = self.paths([specs[i][1] for i in routed],
                                           [specs[i][2] for i in routed],
                                           [specs[i][3] for i in routed])
                for j, i in enumerate(routed):
                    per_flow[i] = links[indptr[j]:indptr[j + 1]]
            for i, spec in enumerate(specs):
                if spec[0] == "nodes":
                    per_flow[i] = self.node_path(spec[1])
                elif spec[0] != "route":
                    raise ValueError(f"flow {flow_ids[i]}: unknown path spec {spec[0]!r}")
            indptr = np.zeros(len(specs) + 1, dtype=np.int64)
            np.cumsum([len(p) for p in per_flow], out=indptr[1:])
            links = np.concatenate(per_flow) if per_flow else np.empty(0, dtype=np.int64)
            return indptr, links.astype(np.int64)
        return route

    def describe(self, link: int) -> str:
        if link == self.blackhole:
            return "blackhole"
        return f"{self.names[self.link_src[link]]}->{self.names[self.link_dst[link]]}"


# ---------------------------------------------------------------- compiled steps

@njit(cache=True)
def _hop_distances(adj_ptr, adj_nbr, unreachable):
    """Hops from every router to every router (``unreachable`` where none):
    a breadth-first search from each, over the adjacency in CSR.  SciPy's
    all-pairs Dijkstra did this in 2.4 s on SiP-OCS at 4,096 GPUs, whose
    4,096 hosts all forward, and RFabric does it at every reconfiguration."""
    count = len(adj_ptr) - 1
    dist = np.full((count, count), unreachable, dtype=np.int32)
    queue = np.empty(max(count, 1), dtype=np.int64)
    for source in range(count):
        row = dist[source]
        row[source] = 0
        queue[0] = source
        head, tail = 0, 1
        while head < tail:
            u = queue[head]
            head += 1
            d = row[u] + 1
            for e in range(adj_ptr[u], adj_ptr[u + 1]):
                v = adj_nbr[e]
                if row[v] == unreachable:
                    row[v] = d
                    queue[tail] = v
                    tail += 1
    return dist


@njit(cache=True)
def _closer_hops(adj_ptr, adj_nbr, dist, unreachable, ports):
    """`ModelNetwork._next_hops`' table: the hops e of each router u (in
    adjacency order) whose neighbour is one hop closer to g, as CSR keyed by
    u x count + g; each key's hops sorted by ``ports[e]`` (stably) when
    ``ports`` is given.  Two passes over (hop, router): count, then fill."""
    count = len(adj_ptr) - 1
    ptr = np.zeros(count * count + 1, dtype=np.int64)
    hops = np.empty(0, dtype=np.int64)
    fill = np.empty(0, dtype=np.int64)
    for filling in (False, True):
        for u in range(count):
            near = dist[u]
            for e in range(adj_ptr[u], adj_ptr[u + 1]):
                far = dist[adj_nbr[e]]
                for g in range(count):
                    if near[g] < unreachable and far[g] == near[g] - 1:
                        key = u * count + g
                        if filling:
                            hops[fill[key]] = e
                            fill[key] += 1
                        else:
                            ptr[key + 1] += 1
        if not filling:
            for k in range(count * count):
                ptr[k + 1] += ptr[k]
            hops = np.empty(ptr[count * count], dtype=np.int64)
            fill = ptr[:-1].copy()
    if len(ports):
        for key in range(count * count):            # insertion sort: a few hops a key
            for i in range(ptr[key] + 1, ptr[key + 1]):
                hop = hops[i]
                j = i - 1
                while j >= ptr[key] and ports[hops[j]] > ports[hop]:
                    hops[j + 1] = hops[j]
                    j -= 1
                hops[j + 1] = hop
    return ptr, hops
