"""The `Fabric`: one graph model shared by full-scale counting and emulation.

Naming and addressing scheme (the one place it is documented)
-------------------------------------------------------------
* Nodes have a ``kind``: ``host`` (a GPU NIC), ``eps`` (an electrical packet
  switch) or ``ocs`` (an optical circuit switch), and a ``role`` that names the
  tier (``gpu``, ``edge``, ``agg``, ``core``, ``tor``, ``leaf``, ``spine``,
  ``nvswitch``, ``ocs`` ...).  Optional coordinates: ``pod``, ``server``,
  ``rail``.
* Names: hosts ``h1..hN``, packet switches ``s1..sM``, circuit switches
  ``o1..oK``, numbered in creation order.  Mininet gets the same host names and
  the switch names with the testbed prefix ``fe`` (``fes3``, ``feo1``), so that
  cleanup can find our bridges by name.
* Host ``hI`` has IPv4 ``10.A.B.C/8`` where ``I = A*65536 + B*256 + C`` and MAC
  ``02:fe:00:A:B:C`` (locally administered).
* Every switch, EPS or OCS, has a nonzero datapath id: its creation index.
* Ports: each node numbers its ports from 1 in the order its links are added.
  Every edge stores ``ports = {u: port_on_u, v: port_on_v}``, ``gbps`` (the
  real-world line rate) and ``medium`` (``electrical``, ``fiber`` or ``ocs``
  for a fibre that lands on an OCS port).
* An OCS is a node with a ``radix`` and a ``technology`` preset (see
  ``controllers.ocs_core.TECHNOLOGIES``).  Its *circuits* are unordered port
  pairs ``(a, b)`` with ``a < b``; they change at run time.  The *logical
  graph* replaces each OCS by one edge per lit circuit between the two nodes
  wired to its ports, and is what routing runs on.

The graph is a ``networkx.MultiGraph`` because fabrics have parallel links
(several ToR uplinks to the same OCS, for example).
"""

from __future__ import annotations

import json
import math
import numbers
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Set, Tuple

import networkx as nx

HOST, EPS, OCS = "host", "eps", "ocs"
KINDS = (HOST, EPS, OCS)
MEDIA = ("electrical", "fiber", "ocs")

Circuit = Tuple[int, int]


#: GPUs per server of the texts' full-scale fabrics (eight-GPU servers).
TEXT_GPUS_PER_SERVER = 8

#: The most nodes a fabric may have: sixteen times the 16,384 GPUs of the largest
#: fabric built here (for the flow-level model).  A builder asked for more
#: (``fattree,k=1000`` from a command line) would take hours and all the memory
#: before any other check could refuse it; at this cap it fails in seconds.
MAX_NODES = 1 << 18


class FabricError(ValueError):
    """A fabric was asked for something its wiring does not allow."""


class ScaleError(FabricError):
    """A fabric has no build at the GPU count it was asked for.

    ``reason`` reads after the fabric's registry name ("has no k with k^3/4 =
    24 GPUs"); ``instead`` names a registered fabric of the same kind that
    builds at any GPU count, when there is one.
    """

    def __init__(self, name: str, reason: str, instead: Optional[str] = None):
        super().__init__(f"{name}: {reason}")
        self.name = name
        self.reason = reason
        self.instead = instead

    def naming(self, key: str, allowed: Iterable[str]) -> str:
        """The message for a scenario: the key that asked for the fabric, why it
        does not build, and the values ``key`` allows."""
        allowed = ", ".join(allowed)
        if self.instead:
            return (f"{key}: {self.name!r} {self.reason}; use {self.instead!r} "
                    f"(allowed: {allowed})")
        return f"{key}: {self.name!r} {self.reason}; allowed: {allowed}"


def host_ip(index: int) -> str:
    if not 1 <= index < 2 ** 24:
        raise FabricError(f"host index {index} outside 1..{2 ** 24 - 1}")
    return f"10.{index >> 16}.{(index >> 8) & 255}.{index & 255}"


def host_mac(index: int) -> str:
    return f"02:fe:00:{index >> 16:02x}:{(index >> 8) & 255:02x}:{index & 255:02x}"


def normalize_circuit(a: int, b: int) -> Circuit:
    a, b = int(a), int(b)
    if a == b:
        raise FabricError(f"circuit {a}-{b} connects a port to itself")
    return (a, b) if a < b else (b, a)


@dataclass
class Fabric:
    """A network fabric: wiring, coordinates and the current OCS circuits."""

    name: str
    params: Dict[str, object] = field(default_factory=dict)
    graph: nx.MultiGraph = field(default_factory=nx.MultiGraph)
    circuits: Dict[str, Set[Circuit]] = field(default_factory=dict)
    _next_port: Dict[str, int] = field(default_factory=dict, repr=False)
    _counts: Dict[str, int] = field(default_factory=lambda: {HOST: 0, EPS: 0, OCS: 0},
                                    repr=False)
    _next_dpid: int = field(default=1, repr=False)

    # ------------------------------------------------------------ building
    def add_host(self, role: str = "gpu", **coords) -> str:
        self._check_room()
        self._counts[HOST] += 1
        index = self._counts[HOST]
        name = f"h{index}"
        self.graph.add_node(name, kind=HOST, role=role, index=index,
                            ip=host_ip(index), mac=host_mac(index), **coords)
        self._next_port[name] = 1
        return name

    def add_switch(self, role: str, **coords) -> str:
        self._counts[EPS] += 1
        name = f"s{self._counts[EPS]}"
        self.graph.add_node(name, kind=EPS, role=role, dpid=self._take_dpid(), **coords)
        self._next_port[name] = 1
        return name

    def add_ocs(self, radix: int, technology: str = "mems", delay_ms: Optional[float] = None,
                role: str = "ocs", **coords) -> str:
        if radix < 2:
            raise FabricError(f"OCS radix must be at least 2, got {radix}")
        self._counts[OCS] += 1
        name = f"o{self._counts[OCS]}"
        self.graph.add_node(name, kind=OCS, role=role, dpid=self._take_dpid(), radix=radix,
                            technology=technology, delay_ms=delay_ms, **coords)
        self._next_port[name] = 1
        self.circuits[name] = set()
        return name

    def add_link(self, u: str, v: str, gbps: float, medium: Optional[str] = None) -> Tuple[int, int]:
        """Wire u to v; returns (port on u, port on v)."""
        for node in (u, v):
            if node not in self.graph:
                raise FabricError(f"unknown node {node!r}")
        if medium is None:
            medium = "ocs" if OCS in (self.kind(u), self.kind(v)) else "electrical"
        if medium not in MEDIA:
            raise FabricError(f"medium {medium!r} not one of {MEDIA}")
        # A zero, negative or unbounded rate would reach the shaping of every
        # emulated link (and divide by zero in the scale) rather than be refused.
        if not 0 < float(gbps) < math.inf:
            raise FabricError(f"{self.name}: link {u}-{v}: gbps={gbps!r}; a link's rate "
                              "must be a positive finite number of Gbit/s")
        pu, pv = self._take_port(u), self._take_port(v)
        self.graph.add_edge(u, v, ports={u: pu, v: pv}, gbps=float(gbps), medium=medium)
        return pu, pv

    def _take_port(self, node: str) -> int:
        port = self._next_port[node]
        if self.kind(node) == OCS and port > self.graph.nodes[node]["radix"]:
            raise FabricError(f"{node} has radix {self.graph.nodes[node]['radix']}: "
                              f"no port {port} to wire")
        self._next_port[node] = port + 1
        return port

    def _check_room(self) -> None:
        if len(self.graph) >= MAX_NODES:
            raise FabricError(f"{self.name}: more than {MAX_NODES:,} nodes; these parameters "
                              f"({', '.join(f'{k}={v}' for k, v in self.params.items())}) "
                              "ask for a fabric too large to build")

    def _take_dpid(self) -> int:
        self._check_room()          # every switch, packet or circuit, takes a dpid
        dpid = self._next_dpid
        self._next_dpid += 1
        return dpid

    # ------------------------------------------------------------ queries
    def kind(self, node: str) -> str:
        return self.graph.nodes[node]["kind"]

    def nodes_of(self, kind: str, role: Optional[str] = None) -> List[str]:
        return [n for n, d in self.graph.nodes(data=True)
                if d["kind"] == kind and (role is None or d["role"] == role)]

    @property
    def hosts(self) -> List[str]:
        return self.nodes_of(HOST)

    @property
    def eps_switches(self) -> List[str]:
        return self.nodes_of(EPS)

    @property
    def ocs_switches(self) -> List[str]:
        return self.nodes_of(OCS)

    @property
    def switches(self) -> List[str]:
        return self.eps_switches + self.ocs_switches

    def node_by_dpid(self, dpid: int) -> str:
        for name, data in self.graph.nodes(data=True):
            if data.get("dpid") == dpid:
                return name
        raise FabricError(f"no switch with dpid {dpid}")

    def host_by_ip(self, ip: str) -> str:
        for name in self.hosts:
            if self.graph.nodes[name]["ip"] == ip:
                return name
        raise FabricError(f"no host with address {ip}")

    def ports_of(self, node: str) -> Dict[int, Tuple[str, int]]:
        """Port number -> (peer node, peer port)."""
        result = {}
        for _, peer, data in self.graph.edges(node, data=True):
            result[data["ports"][node]] = (peer, data["ports"][peer])
        return result

    def peer(self, node: str, port: int) -> Tuple[str, int]:
        try:
            return self.ports_of(node)[port]
        except KeyError:
            raise FabricError(f"{node} has nothing wired to port {port}") from None

    def links(self) -> Iterable[Tuple[str, str, dict]]:
        return self.graph.edges(data=True)

    def host_port(self, host: str) -> Tuple[str, int]:
        """The switch a host hangs off and the switch's port toward it."""
        edges = list(self.graph.edges(host, data=True))
        if len(edges) != 1:
            raise FabricError(f"{host} has {len(edges)} links; hosts are single-homed here")
        _, switch, data = edges[0]
        return switch, data["ports"][switch]

    # ------------------------------------------------------------ circuits
    def check_circuits(self, ocs: str, circuits: Iterable[Iterable[int]]) -> Set[Circuit]:
        """Validate a full circuit assignment for one OCS; returns it normalised."""
        if ocs not in self.graph or self.kind(ocs) != OCS:
            raise FabricError(f"{ocs!r} is not an OCS; OCS here: {self.ocs_switches}")
        radix = self.graph.nodes[ocs]["radix"]
        used: Set[int] = set()
        result: Set[Circuit] = set()
        # Circuits come from control requests too (JSON): "14" was read as ports
        # 1 and 4, [1.5, 3] lit 1-3, and a number failed as "not iterable".
        if isinstance(circuits, (str, bytes, dict)) or not hasattr(circuits, "__iter__"):
            raise FabricError(f"circuits on {ocs} must be a list of port pairs, got {circuits!r}")
        for pair in circuits:
            if isinstance(pair, (str, bytes, dict)) or not hasattr(pair, "__iter__") \
                    or len(tuple(pair)) != 2:
                raise FabricError(f"circuit {pair!r} on {ocs} is not a port pair")
            pair = tuple(pair)
            for port in pair:
                if isinstance(port, bool) or not isinstance(port, numbers.Integral):
                    raise FabricError(f"circuit {list(pair)!r} on {ocs}: port {port!r} is not "
                                      "an integer")
            circuit = normalize_circuit(*pair)
            for port in circuit:
                if not 1 <= port <= radix:
                    raise FabricError(f"circuit {circuit[0]}-{circuit[1]} on {ocs}: port {port} "
                                      f"beyond radix {radix} (allowed 1..{radix})")
                if port in used:
                    raise FabricError(f"circuit {circuit[0]}-{circuit[1]} on {ocs}: port {port} "
                                      "is already used by another circuit")
                used.add(port)
            result.add(circuit)
        return result

    def set_circuits(self, ocs: str, circuits: Iterable[Iterable[int]]) -> None:
        self.circuits[ocs] = self.check_circuits(ocs, circuits)

    def set_technology(self, ocs: str, technology: str, delay_ms: Optional[float] = None) -> None:
        self.graph.nodes[ocs]["technology"] = technology
        self.graph.nodes[ocs]["delay_ms"] = delay_ms

    def logical_graph(self, circuits: Optional[Dict[str, Set[Circuit]]] = None) -> nx.MultiGraph:
        """Hosts and EPS joined by static links and by the lit circuits.

        A circuit a-b on OCS o becomes an edge between the nodes wired to o's
        ports a and b, using those nodes' ports toward o.  Ports of a circuit
        that are not wired produce no edge (a dark fibre).
        """
        circuits = self.circuits if circuits is None else circuits
        logical = nx.MultiGraph()
        for name, data in self.graph.nodes(data=True):
            if data["kind"] != OCS:
                logical.add_node(name, **data)
        for u, v, data in self.graph.edges(data=True):
            if OCS not in (self.kind(u), self.kind(v)):
                logical.add_edge(u, v, ports=dict(data["ports"]), gbps=data["gbps"],
                                 medium=data["medium"])
        for ocs, lit in circuits.items():
            wired = self.ports_of(ocs)
            for a, b in lit:
                if a not in wired or b not in wired:
                    continue
                (na, pa), (nb, pb) = wired[a], wired[b]
                if self.kind(na) == OCS or self.kind(nb) == OCS:
                    raise FabricError(f"{ocs} circuit {a}-{b} lands on another OCS; "
                                      "cascaded OCS are not modelled")
                gbps = min(self.graph.edges[ocs, na, k]["gbps"] for k in self.graph[ocs][na])
                logical.add_edge(na, nb, ports={na: pa, nb: pb} if na != nb else {na: pa},
                                 gbps=gbps, medium="circuit", ocs=ocs, circuit=(a, b))
        return logical

    # ------------------------------------------------------------ export
    def to_dict(self) -> dict:
        nodes = [dict(name=n, **d) for n, d in self.graph.nodes(data=True)]
        links = [{"u": u, "v": v, "port_u": d["ports"][u], "port_v": d["ports"][v],
                  "gbps": d["gbps"], "medium": d["medium"]}
                 for u, v, d in self.graph.edges(data=True)]
        return {"name": self.name, "params": self.params, "nodes": nodes, "links": links,
                "circuits": {o: sorted(list(c) for c in cs) for o, cs in self.circuits.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "Fabric":
        fabric = cls(name=data["name"], params=dict(data.get("params", {})))
        max_dpid = 0
        for node in data["nodes"]:
            attrs = dict(node)
            name = attrs.pop("name")
            fabric.graph.add_node(name, **attrs)
            fabric._next_port[name] = 1
            fabric._counts[attrs["kind"]] += 1
            max_dpid = max(max_dpid, attrs.get("dpid") or 0)
        fabric._next_dpid = max_dpid + 1
        for link in data["links"]:
            u, v = link["u"], link["v"]
            fabric.graph.add_edge(u, v, ports={u: link["port_u"], v: link["port_v"]},
                                  gbps=link["gbps"], medium=link["medium"])
            fabric._next_port[u] = max(fabric._next_port[u], link["port_u"] + 1)
            fabric._next_port[v] = max(fabric._next_port[v], link["port_v"] + 1)
        for ocs, circuits in data.get("circuits", {}).items():
            fabric.set_circuits(ocs, circuits)
        return fabric

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Fabric":
        return cls.from_dict(json.loads(text))
