"""OCS circuit templates per RL phase kind on the rfabric fabric (Figure 5).

A template is the full circuit set of each OCS a phase needs; OCS it does
not name are left as they are.  The rfabric wiring (`topologies/rfabric.py`):
ToR t of PoD p has ``a`` uplinks to its PoD's aggregation OCS (ports
``t*a + u + 1``) and one uplink to each of ``c`` core planes (port
``p*T + t + 1``).  Choices, following section 4.2 and Table 1:

==================  ==================================================  ==========
template            circuits                                            Figure 5
==================  ==================================================  ==========
train-pod-mesh      Train PoDs' agg OCS: the round-robin ToR mesh       (b)
                    (ToR bandwidth inside the PoD for fwd/bwd: TP
                    across servers, PP, CP, EP); if the phase's
                    traffic crosses PoDs (a pipeline over two Train
                    PoDs), also the inter-pod-mesh core
inter-pod-mesh      Train agg OCS and core planes 0..c-2, sized to      (a)
                    what the phase's flows can fill (the DP ring's
                    neighbours get the circuits); ports it leaves free
                    keep the mesh (agg) and the ``isolated`` core
                    (DP is ToR-Agg-Core, Table 1)
response-share      core plane c-1 as in rfabric's ``isolated`` core:   (c)
                    each Gen PoD's small share (one 400G circuit =
                    0.4 Tb/s) to a Train ToR streams responses.  It
                    rides the Gen agg OCS: those belong to the Gen
                    phases that run beside it the whole step (P/D,
                    a TP configuration, the weight sync); their
                    templates keep each PoD's ToRs joined on the agg
                    OCS
gen-isolated        Gen PoDs' agg OCS: isolated intra-PoD meshes        (c)
                    (P/D KV bursts)
train-layer         with ``layerwise``: Train PoDs' agg OCS sized to    (b), 4.3
                    one layer type's collectives (CP's ring or
                    all-to-all in attention, EP's all-to-all in the
                    MoE block), each
                    ToR keeping one uplink to join the PoD, which
                    train-tp and train-pp then ride; pairs across
                    PoDs also get the ``isolated`` core; a layer
                    type that stays under its ToRs rides
gen-config          Gen PoDs' agg OCS sized to one TP configuration     (c)
                    of OrchestrRL's generation (its switch's KV
                    moves, its instances' decode rings across
                    servers); free ports keep the mesh
rides               no circuits: gen-tp, gen-ep, gen-af and a           Table 1
                    rebalance's KV moves have Small windows and ride
                    whatever is lit; the proxy never reconfigures
                    for them
t2g-tree            core planes: circuits from the Train ToRs that      (d-f), (g)
                    send weights to the ToRs of each Gen PoD's DP-0
                    replica, as many as the planes allow, every
                    (Train PoD, Gen PoD) pair first; then the Gen agg
                    OCS and the Gen ToRs' core ports the tree left
                    free, sized to the in-PoD broadcast (stage 2);
                    free ports keep the ``isolated`` core and the
                    mesh; the Train agg meshes (stage-1 transit)
==================  ==================================================  ==========

*Sized* circuits (`size_circuits`) share a phase's OCS ports out among
its ToR pairs like seats among parties (largest average, D'Hondt), each
pair up to the circuits it could fill (`circuits_needed`: each flow at
its share of its two GPUs' ports, one port being one circuit's rate): the
next circuit goes to the pair with the most need per circuit it already
has, on a free agg port of both ToRs when they share a PoD (for the
broadcast inside a Gen PoD, a free core port first), else on a core plane
where both ToRs' ports are free.  A round-robin mesh gives a ToR pair
a/(T-1) of the ports whatever the traffic; at 2,048 GPUs that left a DP
ring's neighbouring ToRs two circuits for eight ring flows and made the
DP all-reduce four times slower than on a non-blocking Clos.  One static
topology serves a whole phase: a broadcast tree's levels, which run one
after another through the same ToRs, share its ports (Figure 5(d-f)
reconfigures between them; here they are one phase).

``inter-pod-mesh`` and ``response-share`` never name the same OCS on
purpose: DP and the response stream run at the same time (Gen of batch
i+1 during Train of batch i), so the response plane (c-1) is the
response stream's alone, and the core changes only for the weight sync
and back.  With a single core plane, or when Gen PoDs outnumber Train
ToRs, rfabric's full ``mesh`` core stands in for both, and only the
Train agg OCS are sized for DP.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from topologies import rfabric
from topologies.fabric import Circuit, Fabric, FabricError, normalize_circuit

Pair = Tuple[str, str, float]          # (src host, dst host, bytes)
RIDES = "rides"                        # no circuits of its own: the phase rides what is lit

KIND_TEMPLATE = {
    "train-tp": "train-pod-mesh", "train-pp": "train-pod-mesh", "train-cp": "train-pod-mesh",
    "train-ep": "train-pod-mesh", "train-dp": "inter-pod-mesh", "response": "response-share",
    "gen-pd": "gen-isolated", "weight-sync": "t2g-tree", "gen-config": "gen-config",
    # Table 1's Small windows: shorter than any OCS could follow (gen-tp, gen-ep,
    # gen-af: per layer and decode step), so they ride the circuits in place.
    "gen-tp": RIDES, "gen-ep": RIDES, "gen-af": RIDES, "gen-migrate": RIDES,
}
# Layer-wise training (`traffic.phases.build_phases(layerwise=True)`): each layer
# type's phases get circuits sized to them; TP and PP, which run through every
# layer, ride what is lit (each layer template keeps the Train PoDs joined).
LAYERWISE_TEMPLATE = {"train-cp": "train-layer", "train-ep": "train-layer",
                      "train-tp": RIDES, "train-pp": RIDES}
FIGURE = {"train-pod-mesh": "Figure 5(b)", "inter-pod-mesh": "Figure 5(a)",
          "response-share": "Figure 5(c)", "gen-isolated": "Figure 5(c)",
          "t2g-tree": "Figure 5(d-g)", "gen-config": "Figure 5(c), per TP configuration",
          "train-layer": "Figure 5(b), per layer type (section 4.3)",
          RIDES: "Table 1: Small window"}


@dataclass(frozen=True)
class Template:
    name: str
    figure: str
    circuits: Mapping[str, FrozenSet[Circuit]]     # OCS -> its full circuit set

    @property
    def ocs(self) -> List[str]:
        return sorted(self.circuits)

    def request(self, ocs: str) -> dict:
        """The control-channel request that puts this template on one OCS."""
        return {"op": "reconfigure", "ocs": ocs,
                "circuits": [list(c) for c in sorted(self.circuits[ocs])]}


Tor = Tuple[int, int]                  # (PoD, ToR index)


class FreePorts:
    """The OCS ports a template may still give out: each ToR's uplinks on its
    PoD's agg OCS (for the PoDs in scope) and its one port on each core
    plane in scope; `connect` takes a port on each side for one circuit."""

    def __init__(self, shape: rfabric.Shape, agg: Mapping[int, str], core: Mapping[int, str],
                 agg_pods: Iterable[int], planes: Iterable[int]):
        self.shape, self.agg, self.core = shape, agg, core
        self.agg_free: Dict[Tor, List[int]] = {
            (p, t): list(range(shape.agg)) for p in agg_pods for t in range(shape.tors)}
        self.core_free: Dict[int, Set[Tor]] = {
            u: {(p, t) for p in range(shape.pods) for t in range(shape.tors)}
            for u in sorted(planes)}
        self.circuits: Dict[str, Set[Circuit]] = {agg[p]: set() for p in agg_pods}
        self.circuits.update({core[u]: set() for u in self.core_free})

    def take_core(self, plane: int, circuits: Iterable[Circuit]) -> None:
        """Circuits already chosen on a plane in scope: their ports are taken."""
        for a, b in circuits:
            for port in (a, b):
                self.core_free[plane].discard(rfabric.core_tor(self.shape, port))
            self.circuits[self.core[plane]].add(normalize_circuit(a, b))

    def connect(self, a: Tor, b: Tor, core_first: bool = False) -> bool:
        """One circuit between ToRs a and b: on their PoD's agg OCS if both
        have a free uplink there, or on the first core plane where both
        ports are free; the agg OCS first unless ``core_first`` (when no
        pair across PoDs is left to need the core ports).  False when
        neither is left."""
        for use_core in ((True, False) if core_first else (False, True)):
            if use_core:
                for plane, free in self.core_free.items():
                    if a in free and b in free:
                        free -= {a, b}
                        self.circuits[self.core[plane]].add(normalize_circuit(
                            rfabric.core_port(self.shape, *a), rfabric.core_port(self.shape, *b)))
                        return True
            elif a[0] == b[0] and self.agg_free.get(a) and self.agg_free.get(b):
                ports = (rfabric.agg_port(self.shape, a[1], self.agg_free[a].pop(0)),
                         rfabric.agg_port(self.shape, b[1], self.agg_free[b].pop(0)))
                self.circuits[self.agg[a[0]]].add(normalize_circuit(*ports))
                return True
        return False

    def filled(self, base: Mapping[str, Iterable[Circuit]]) -> Dict[str, FrozenSet[Circuit]]:
        """The circuits given, and on ports left free those of ``base``."""
        result = {}
        for ocs, circuits in self.circuits.items():
            taken = {port for c in circuits for port in c}
            result[ocs] = frozenset(circuits | {c for c in base[ocs] if not taken & set(c)})
        return result


def size_circuits(ports: FreePorts, need: Mapping[Tuple[Tor, Tor], float],
                  core_first: bool = False) -> None:
    """Give ``ports`` out as circuits among ToR pairs, each up to the circuits
    it needs (rounded up), by largest average (D'Hondt): the next one to
    the pair with the most need per circuit it already has, until every
    pair has what it needs or no port is left on one of its sides."""
    queue = [(-circuits, pair) for pair, circuits in need.items() if circuits > 0]
    heapq.heapify(queue)
    given: Dict[Tuple[Tor, Tor], int] = {}
    while queue:
        _, pair = heapq.heappop(queue)
        if ports.connect(*pair, core_first=core_first):
            given[pair] = given.get(pair, 0) + 1
            if given[pair] < math.ceil(need[pair] - 1e-9):
                heapq.heappush(queue, (-need[pair] / (given[pair] + 1), pair))


class RFabricTemplates:
    """Chooses a `Template` per phase kind for one rfabric `Fabric`;
    ``layerwise`` for a schedule whose CP and EP phases are per layer type."""

    def __init__(self, fabric: Fabric, layerwise: bool = False):
        if fabric.name != "rfabric":
            raise FabricError(f"RFabric templates need the 'rfabric' fabric, got {fabric.name!r}")
        self.fabric, self.layerwise = fabric, layerwise
        self.shape = rfabric.shape_of(fabric)
        self._tors: Dict[str, Tuple[int, int]] = {}     # host -> its ToR (see tor_of)
        nodes = fabric.graph.nodes
        self.agg = {nodes[o]["pod"]: o for o in fabric.ocs_switches
                    if nodes[o]["role"] == "agg-ocs"}
        self.core = {nodes[o]["plane"]: o for o in fabric.ocs_switches
                     if nodes[o]["role"] == "core-ocs"}
        self.mesh = rfabric.circuit_set(fabric, "mesh")
        try:
            self.isolated = rfabric.circuit_set(fabric, "isolated")
        except FabricError:
            self.isolated = self.mesh
        if self.shape.train_pods == self.shape.pods:
            self.isolated = self.mesh
        # The response plane is apart from the DP planes only with isolated.
        self.response_plane = self.shape.core - 1 if self.isolated is not self.mesh else None

    # ------------------------------------------------------------ pieces
    def _pods(self, role: str) -> List[int]:
        train = range(self.shape.train_pods)
        return list(train) if role == "train" else list(range(self.shape.train_pods,
                                                             self.shape.pods))

    def _agg(self, role: str) -> Dict[str, FrozenSet[Circuit]]:
        return {self.agg[p]: frozenset(self.mesh[self.agg[p]]) for p in self._pods(role)}

    def _core(self, circuits: Mapping[str, Set[Circuit]]) -> Dict[str, FrozenSet[Circuit]]:
        return {o: frozenset(circuits[o]) for o in self.core.values()}

    def tor_of(self, host: str) -> Tuple[int, int]:
        """(PoD, ToR index) of a host's ToR.  Kept per host: hosts do not move,
        and sizing a phase's circuits asks once per host pair (68,000 times
        an iteration at 4,096 GPUs, 1.3 s through the fabric's graph)."""
        found = self._tors.get(host)
        if found is None:
            tor, _ = self.fabric.host_port(host)
            data = self.fabric.graph.nodes[tor]
            found = self._tors[host] = (data["pod"], data["index"])
        return found

    def t2g_demand(self, pairs: Optional[Iterable[Pair]]) -> Dict[Tuple[Tuple[int, int],
                                                                       Tuple[int, int]], float]:
        """Cross-PoD ToR pairs and their bytes; default: every Train ToR to
        ToR 0 of each Gen PoD (where its DP-0 replica sits), equal weights."""
        demand: Dict = {}
        if pairs is None:
            for g in self._pods("gen"):
                for p in self._pods("train"):
                    for t in range(self.shape.tors):
                        demand[(p, t), (g, 0)] = 1.0
            return demand
        for src, dst, size in pairs:
            a, b = self.tor_of(src), self.tor_of(dst)
            if a[0] != b[0]:
                key = (a, b) if a < b else (b, a)
                demand[key] = demand.get(key, 0.0) + float(size)
        return demand

    def circuits_needed(self, pairs: Optional[Iterable[Pair]], pods: Iterable[int],
                        tree: bool = False) -> Dict[Tuple[Tor, Tor], float]:
        """How many circuits each pair of distinct ToRs in ``pods`` could fill.

        Each flow could get at most its share of its two GPUs' ports (one
        port = one circuit's rate): 1 / the flows its sender sends at once,
        and 1 / the flows its receiver takes at once; a ToR pair needs the
        sum over the flows between them.  A phase's flows all run at once
        (a ring's neighbours send together), except with ``tree``: a
        broadcast tree's levels run one after another (a member forwards
        what it has received), and a pair needs what its busiest level needs.
        Levels are found from the edges: a member no edge in the scope sends
        to is a root (level 0), and an edge leaves its sender's level.
        """
        inside = set(pods)
        edges = [(src, dst) for src, dst, size in pairs or ()
                 if src != dst and size > 0 and self.tor_of(src)[0] in inside
                 and self.tor_of(dst)[0] in inside]
        level: Dict[str, int] = {}
        if tree:
            children: Dict[str, List[str]] = {}
            for src, dst in edges:
                children.setdefault(src, []).append(dst)
            receivers = {dst for _, dst in edges}
            level = {src: 0 for src, _ in edges if src not in receivers}
            frontier = sorted(level)
            while frontier:
                reached = []
                for member in frontier:
                    for child in children.get(member, ()):
                        if child not in level:
                            level[child] = level[member] + 1
                            reached.append(child)
                frontier = reached
        sends: Dict[Tuple[str, int], int] = {}
        takes: Dict[Tuple[str, int], int] = {}
        for src, dst in edges:
            at = level.get(src, 0)
            sends[src, at] = sends.get((src, at), 0) + 1
            takes[dst, at] = takes.get((dst, at), 0) + 1
        per_level: Dict[Tuple[Tuple[Tor, Tor], int], float] = {}
        for src, dst in edges:
            a, b = self.tor_of(src), self.tor_of(dst)
            if a != b:
                at = level.get(src, 0)
                key = ((a, b) if a < b else (b, a), at)
                per_level[key] = per_level.get(key, 0.0) + min(1.0 / sends[src, at],
                                                               1.0 / takes[dst, at])
        need: Dict[Tuple[Tor, Tor], float] = {}
        for (pair, _), circuits in per_level.items():
            need[pair] = max(need.get(pair, 0.0), circuits)
        return need

    def t2g_tree(self, pairs: Optional[Iterable[Pair]]) -> Dict[int, Set[Circuit]]:
        """Stage 1's circuits per core plane, without the ports it leaves free.

        Per plane, a matching of ToR pairs (one port per ToR per plane):
        first the PoD pair, then the ToR pair with the most demand per
        circuit already given, so that every Train PoD that sends reaches
        every Gen PoD before any pair gets a second circuit.
        """
        demand = self.t2g_demand(pairs)
        pod_demand: Dict[Tuple[int, int], float] = {}
        for (a, b), size in demand.items():
            pod_demand[a[0], b[0]] = pod_demand.get((a[0], b[0]), 0.0) + size
        given = {key: 0 for key in demand}
        pod_given = {key: 0 for key in pod_demand}

        def score(key):
            pods = (key[0][0], key[1][0])
            return (-pod_demand[pods] / (pod_given[pods] + 1), -demand[key] / (given[key] + 1),
                    key)

        result = {}
        for plane in sorted(self.core):
            used: Set[Tuple[int, int]] = set()
            circuits = set()
            while True:
                free = [k for k in demand if k[0] not in used and k[1] not in used]
                if not free:
                    break
                a, b = min(free, key=score)
                used |= {a, b}
                given[a, b] += 1
                pod_given[a[0], b[0]] += 1
                circuits.add(normalize_circuit(rfabric.core_port(self.shape, *a),
                                               rfabric.core_port(self.shape, *b)))
            result[plane] = circuits
        return result

    def _weight_sync(self, pairs: Optional[Iterable[Pair]]) -> Dict[str, FrozenSet[Circuit]]:
        """Stage 1 on the core (`t2g_tree`), then stage 2, the broadcast
        inside each Gen PoD, sized on the Gen agg OCS and on the core ports
        stage 1 left free (a core circuit may join two ToRs of one PoD), one
        agg uplink per ToR kept to join the PoD on its agg OCS (`_join`)."""
        gen = self._pods("gen")
        ports = FreePorts(self.shape, self.agg, self.core, gen, self.core)
        for plane, circuits in self.t2g_tree(pairs).items():
            ports.take_core(plane, circuits)
        for pod in gen:
            kept = self._keep_one_uplink(ports, pod)
            size_circuits(ports, self.circuits_needed(pairs, [pod], tree=True), core_first=True)
            self._join(ports, pod, kept)
        return dict(ports.filled(self.isolated), **self._agg("train"))

    def _dp(self, pairs: Optional[Iterable[Pair]]) -> Dict[str, FrozenSet[Circuit]]:
        """The Train agg OCS and the DP planes (all but the response plane),
        sized to the phase's traffic among Train ToRs; if that leaves a Train
        PoD's ToRs apart on its agg OCS, sized again keeping one uplink per
        ToR to join them (`_join`).  Without a response plane of its own the
        core stays the full mesh, which the response stream shares."""
        train = self._pods("train")
        planes = [] if self.response_plane is None else \
            [u for u in self.core if u != self.response_plane]
        need = self.circuits_needed(pairs, train)
        ports = FreePorts(self.shape, self.agg, self.core, train, planes)
        size_circuits(ports, need)
        if any(len(self._components(ports, pod)) > 1 for pod in train):
            # The sizing split a PoD (the busiest pairs took every uplink): the
            # ring's other hops, and the phases riding beside it, would find no
            # path.  Size again with one uplink per ToR kept to join it.
            ports = FreePorts(self.shape, self.agg, self.core, train, planes)
            kept = {pod: self._keep_one_uplink(ports, pod) for pod in train}
            size_circuits(ports, need)
            for pod in train:
                self._join(ports, pod, kept[pod])
        circuits = ports.filled(self.isolated)     # its agg circuits are the mesh's
        if self.response_plane is None:
            circuits.update(self._core(self.isolated))
        return circuits

    def _sized_joined(self, role: str,
                      pairs: Optional[Iterable[Pair]]) -> Dict[str, FrozenSet[Circuit]]:
        """The agg OCS of the ``role``'s PoDs sized to the phase's traffic inside
        each PoD on all but one of each ToR's uplinks; then every PoD's ToRs
        are joined again (`_join`), because the phases that ride these
        circuits go anywhere in the PoD (Gen: gen-ep, a rebalance's KV moves,
        the response stream; Train: TP across servers, PP); ports still free
        keep the isolated mesh.  ``gen-config`` sizes one TP configuration
        (its switch's moves, its instances' decode rings), ``train-layer``
        one layer type's collectives."""
        pods = self._pods(role)
        pairs = list(pairs or ())
        ports = FreePorts(self.shape, self.agg, self.core, pods, [])
        for pod in pods:
            kept = self._keep_one_uplink(ports, pod)
            size_circuits(ports, self.circuits_needed(pairs, [pod]))
            self._join(ports, pod, kept)
        return ports.filled(self.isolated)

    def _keep_one_uplink(self, ports: FreePorts, pod: int) -> Dict[int, int]:
        """Take one agg uplink of each of the PoD's ToRs out of the sizing, for
        `_join` (with two ToRs every circuit joins them anyway)."""
        if self.shape.tors <= 2:
            return {}
        return {t: ports.agg_free[pod, t].pop() for t in range(self.shape.tors)
                if ports.agg_free[pod, t]}

    def _join(self, ports: FreePorts, pod: int, kept: Mapping[int, int]) -> None:
        """Give the uplinks ``kept`` back, then chain the PoD's ToRs that the agg
        circuits so far leave apart, one circuit between neighbouring groups
        on ports still free: each ToR kept one, so a chain always closes.  The
        phases that ride the Gen agg OCS (gen-ep, a rebalance's KV moves, the
        response stream) go anywhere in the PoD, and core circuits inside a
        PoD are torn when the next phase takes the core."""
        for t, uplink in kept.items():
            ports.agg_free[pod, t].append(uplink)
        chain = self._components(ports, pod)
        for left, right in zip(chain, chain[1:]):
            joined = any(ports.connect((pod, a), (pod, b))
                         for a in left if ports.agg_free[pod, a]
                         for b in right if ports.agg_free[pod, b])
            if not joined:
                raise FabricError(f"rfabric: no free agg uplinks left to join PoD {pod}'s "
                                  f"ToRs {left} and {right}")

    def _components(self, ports: FreePorts, pod: int) -> List[List[int]]:
        """The PoD's ToRs in groups the agg circuits given so far join."""
        parent = {t: t for t in range(self.shape.tors)}

        def root(t: int) -> int:
            while parent[t] != t:
                parent[t] = parent[parent[t]]
                t = parent[t]
            return t

        for a, b in ports.circuits[self.agg[pod]]:
            parent[root(rfabric.agg_tor(self.shape, a))] = root(rfabric.agg_tor(self.shape, b))
        groups: Dict[int, List[int]] = {}
        for t in range(self.shape.tors):
            groups.setdefault(root(t), []).append(t)
        return list(groups.values())

    def _crosses_pods(self, pairs: Iterable[Pair]) -> bool:
        return any(self.tor_of(src)[0] != self.tor_of(dst)[0] for src, dst, _ in pairs)

    # ------------------------------------------------------------ choice
    def for_kind(self, kind: str, pairs: Optional[Sequence[Pair]] = None) -> Template:
        """The template of a phase kind; ``pairs`` (src host, dst host, bytes)
        are the phase's traffic, used by the weight-sync tree."""
        if kind not in KIND_TEMPLATE:
            raise FabricError(f"no OCS template for phase kind {kind!r}; "
                              f"known kinds: {sorted(KIND_TEMPLATE)}")
        name = KIND_TEMPLATE[kind]
        if self.layerwise:
            name = LAYERWISE_TEMPLATE.get(kind, name)
            if name == "train-layer" and pairs is not None and not any(
                    self.tor_of(src) != self.tor_of(dst) for src, dst, _ in pairs):
                name = RIDES          # the layer type stays under its ToRs
        if name == "train-pod-mesh":
            circuits = self._agg("train")
            if pairs is not None and self._crosses_pods(pairs):
                circuits.update(self._core(self.isolated))
        elif name == "gen-isolated":
            circuits = self._agg("gen")
        elif name == RIDES:
            circuits = {}
        elif name == "gen-config":
            circuits = self._sized_joined("gen", pairs)
        elif name == "train-layer":
            circuits = self._sized_joined("train", pairs)
            if pairs is not None and self._crosses_pods(pairs):
                circuits.update(self._core(self.isolated))
        elif name == "inter-pod-mesh":
            circuits = self._dp(pairs)
        elif name == "response-share":
            if self.response_plane is None:
                circuits = self._core(self.isolated)
            else:
                plane = self.core[self.response_plane]
                circuits = {plane: frozenset(self.isolated[plane])}
        else:
            circuits = self._weight_sync(pairs)
        return Template(name, FIGURE[name], circuits)
