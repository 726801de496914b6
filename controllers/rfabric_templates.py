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
inter-pod-mesh      core planes: Train PoDs meshed on planes 0..c-2,    (a), (c)
                    plane c-1 gives each Gen PoD one circuit to a
                    Train ToR (rfabric's ``isolated`` core); and the
                    Train agg meshes (DP is ToR-Agg-Core, Table 1)
response-share      the same core: the Gen PoDs' small share (one       (c)
                    400G circuit = 0.4 Tb/s) streams responses; and
                    the Gen agg meshes
gen-isolated        Gen PoDs' agg OCS: isolated intra-PoD meshes        (c)
t2g-tree            core planes: circuits from the Train ToRs that      (d-f), (g)
                    send weights to the ToRs of each Gen PoD's DP-0
                    replica, as many as the planes allow, every
                    (Train PoD, Gen PoD) pair first; free ports keep
                    their inter-pod-mesh circuits; the agg meshes of
                    both sides (stage-1 transit, in-PoD broadcast)
==================  ==================================================  ==========

``inter-pod-mesh`` and ``response-share`` agree on the core on purpose: DP
and the response stream run at the same time (Gen of batch i+1 during Train of
batch i), so they must agree on the core; the core changes only for the
weight sync and back.  With a single core plane, or when Gen PoDs outnumber
Train ToRs, rfabric's full ``mesh`` core stands in for both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from topologies import rfabric
from topologies.fabric import Circuit, Fabric, FabricError, normalize_circuit

Pair = Tuple[str, str, float]          # (src host, dst host, bytes)

KIND_TEMPLATE = {
    "train-tp": "train-pod-mesh", "train-pp": "train-pod-mesh", "train-cp": "train-pod-mesh",
    "train-ep": "train-pod-mesh", "train-dp": "inter-pod-mesh", "response": "response-share",
    "gen-tp": "gen-isolated", "gen-ep": "gen-isolated", "gen-pd": "gen-isolated",
    "gen-af": "gen-isolated", "weight-sync": "t2g-tree",
}
FIGURE = {"train-pod-mesh": "Figure 5(b)", "inter-pod-mesh": "Figure 5(a)",
          "response-share": "Figure 5(c)", "gen-isolated": "Figure 5(c)",
          "t2g-tree": "Figure 5(d-g)"}


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


class RFabricTemplates:
    """Chooses a `Template` per phase kind for one rfabric `Fabric`."""

    def __init__(self, fabric: Fabric):
        if fabric.name != "rfabric":
            raise FabricError(f"RFabric templates need the 'rfabric' fabric, got {fabric.name!r}")
        self.fabric = fabric
        self.shape = rfabric.shape_of(fabric)
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
        """(PoD, ToR index) of a host's ToR."""
        tor, _ = self.fabric.host_port(host)
        data = self.fabric.graph.nodes[tor]
        return data["pod"], data["index"]

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

    def t2g_core(self, pairs: Optional[Iterable[Pair]]) -> Dict[str, FrozenSet[Circuit]]:
        """Core circuits for the weight sync.

        Per plane, a matching of ToR pairs (one port per ToR per plane):
        first the PoD pair, then the ToR pair with the most demand per
        circuit already given, so that every Train PoD that sends reaches
        every Gen PoD before any pair gets a second circuit.  Ports the
        tree leaves free keep their ``inter-pod-mesh`` circuits.
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
            ocs = self.core[plane]
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
            taken = {p for c in circuits for p in c}
            circuits |= {c for c in self.isolated[ocs] if not taken & set(c)}
            result[ocs] = frozenset(circuits)
        return result

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
        if name == "train-pod-mesh":
            circuits = self._agg("train")
            if pairs is not None and self._crosses_pods(pairs):
                circuits.update(self._core(self.isolated))
        elif name == "gen-isolated":
            circuits = self._agg("gen")
        elif name == "inter-pod-mesh":
            circuits = dict(self._core(self.isolated), **self._agg("train"))
        elif name == "response-share":
            circuits = dict(self._core(self.isolated), **self._agg("gen"))
        else:
            circuits = dict(self.t2g_core(pairs), **self._agg("train"), **self._agg("gen"))
        return Template(name, FIGURE[name], circuits)
