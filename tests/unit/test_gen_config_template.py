"""The ``gen-config`` circuit template (one TP configuration of OrchestrRL's
generation on the Gen PoDs' aggregation OCS), the Small-window kinds that ride
whatever is lit, and the response stream's own core plane."""

import random

import networkx as nx
import pytest

from controllers.proxy_core import ControlProxy
from controllers.rfabric_templates import KIND_TEMPLATE, RIDES, RFabricTemplates
from topologies import registry, rfabric

FOUR = "rfabric,pods=2,train_pods=1,servers_per_pod=8,gpus_per_server=2,radix=8"    # T=4, a=2
SIX = "rfabric,pods=2,train_pods=1,servers_per_pod=12,gpus_per_server=2,radix=8"    # T=6, a=2
WIDE = "rfabric,pods=2,train_pods=1,servers_per_pod=16,gpus_per_server=2,radix=16"  # T=4, a=4
TWO = "rfabric,pods=2,train_pods=1"                                                 # T=2, a=2
TWO_GEN = "rfabric,pods=3,train_pods=1,servers_per_pod=8,gpus_per_server=2,radix=8"  # 2 Gen PoDs
SMALL_WINDOWS = ("gen-tp", "gen-ep", "gen-af", "gen-migrate")


class Setup:
    def __init__(self, spec):
        self.fabric = registry.build(spec)
        self.shape = rfabric.shape_of(self.fabric)
        self.templates = RFabricTemplates(self.fabric)
        nodes = self.fabric.graph.nodes
        self.agg = {nodes[o]["pod"]: o for o in self.fabric.ocs_switches
                    if nodes[o]["role"] == "agg-ocs"}
        self.core = {nodes[o]["plane"]: o for o in self.fabric.ocs_switches
                     if nodes[o]["role"] == "core-ocs"}
        self.gen_pods = list(range(self.shape.train_pods, self.shape.pods))
        self.hosts = {}
        for h in self.fabric.hosts:
            self.hosts.setdefault(self.templates.tor_of(h), []).append(h)

    def tor_pairs(self, circuits):
        """ToR-index pairs of agg circuits, sorted, with repeats."""
        return sorted(tuple(sorted((rfabric.agg_tor(self.shape, a),
                                    rfabric.agg_tor(self.shape, b)))) for a, b in circuits)

    def connected(self, circuits):
        graph = nx.Graph()
        graph.add_nodes_from(range(self.shape.tors))
        graph.add_edges_from(self.tor_pairs(circuits))
        return nx.is_connected(graph)

    def flows(self, pod, a, b, count=1, size=1e6):
        """``count`` flows from distinct hosts of ToR a to distinct hosts of ToR b."""
        return [(self.hosts[pod, a][k], self.hosts[pod, b][k], size) for k in range(count)]


def check_ports(setup, circuits):
    """Each port of the agg OCS in at most one circuit, every port a real one."""
    ports = [p for c in circuits for p in c]
    assert len(ports) == len(set(ports)), f"a port used twice: {sorted(circuits)}"
    assert all(1 <= p <= setup.shape.tors * setup.shape.agg for p in ports)
    assert all(a != b and rfabric.agg_tor(setup.shape, a) != rfabric.agg_tor(setup.shape, b)
               for a, b in circuits), "no circuit loops back to its own ToR"


# ---------------------------------------------------------------- sized and joined
@pytest.mark.parametrize("spec, pairs", [
    (FOUR, [(0, 1), (2, 3)]),
    (SIX, [(0, 3), (1, 4)]),
    (SIX, [(0, 5), (2, 4), (1, 3)]),
])
def test_concentrated_pairs_get_circuits_and_the_pod_stays_joined(spec, pairs):
    setup = Setup(spec)
    (pod,) = setup.gen_pods
    traffic = [f for a, b in pairs for f in setup.flows(pod, a, b, count=2)]
    tmpl = setup.templates.for_kind("gen-config", traffic)
    assert tmpl.name == "gen-config" and KIND_TEMPLATE["gen-config"] == "gen-config"
    assert tmpl.ocs == [setup.agg[pod]], "only the Gen PoD's aggregation OCS"
    circuits = tmpl.circuits[setup.agg[pod]]
    given = setup.tor_pairs(circuits)
    for pair in pairs:
        assert pair in given, f"ToR pair {pair} carries the configuration's traffic: {given}"
    check_ports(setup, circuits)
    assert setup.connected(circuits), f"the Gen PoD's ToRs are split: {given}"
    mesh = setup.tor_pairs(setup.templates.mesh[setup.agg[pod]])
    assert given != mesh, "sized to the traffic, not the round-robin mesh"


def test_a_heavy_pair_gets_all_but_the_uplink_kept_for_the_join():
    setup = Setup(WIDE)                               # 4 ToRs, 4 agg uplinks each
    (pod,) = setup.gen_pods
    traffic = setup.flows(pod, 0, 1, count=8)        # 8 flows: could fill 8 circuits
    circuits = setup.templates.for_kind("gen-config", traffic).circuits[setup.agg[pod]]
    given = setup.tor_pairs(circuits)
    assert given.count((0, 1)) == setup.shape.agg - 1, given
    check_ports(setup, circuits)
    assert setup.connected(circuits), given


@pytest.mark.parametrize("spec", [FOUR, SIX, WIDE, TWO_GEN])
def test_random_pair_sets_always_leave_every_gen_pod_joined(spec):
    setup = Setup(spec)
    rng = random.Random(20261128)
    gen_agg = sorted(setup.agg[p] for p in setup.gen_pods)
    for trial in range(150):
        traffic = []
        for _ in range(rng.randint(1, 12)):
            pod = rng.choice(setup.gen_pods)
            a, b = rng.sample(range(setup.shape.tors), 2)
            traffic += setup.flows(pod, a, b, count=rng.randint(1, setup.shape.per_tor),
                                   size=rng.choice([1.0, 1e3, 1e6, 1e9]))
        # Noise the template must ignore: Train-side flows and flows across PoDs.
        train = rng.choice(range(setup.shape.train_pods))
        traffic.append((setup.hosts[train, 0][0], setup.hosts[train, 1][0], 1e9))
        traffic.append((setup.hosts[train, 0][1], setup.hosts[setup.gen_pods[0], 1][1], 1e9))
        rng.shuffle(traffic)
        tmpl = setup.templates.for_kind("gen-config", traffic)
        assert tmpl.ocs == gen_agg, f"trial {trial}: only the Gen agg OCS"
        for pod in setup.gen_pods:
            circuits = tmpl.circuits[setup.agg[pod]]
            check_ports(setup, circuits)
            assert setup.connected(circuits), \
                f"trial {trial}: PoD {pod} split by {setup.tor_pairs(circuits)}"
            inside = {tuple(sorted((setup.templates.tor_of(s)[1], setup.templates.tor_of(d)[1])))
                      for s, d, _ in traffic if setup.templates.tor_of(s)[0] == pod
                      and setup.templates.tor_of(d)[0] == pod}
            if len(inside) == 1:
                (pair,) = inside
                assert pair in setup.tor_pairs(circuits), \
                    f"trial {trial}: a lone pair {pair} always gets a circuit"


@pytest.mark.parametrize("spec", [FOUR, SIX, TWO, TWO_GEN])
def test_without_traffic_the_gen_pods_are_still_joined(spec):
    setup = Setup(spec)
    for pairs in (None, []):
        tmpl = setup.templates.for_kind("gen-config", pairs)
        assert tmpl.ocs == sorted(setup.agg[p] for p in setup.gen_pods)
        for pod in setup.gen_pods:
            check_ports(setup, tmpl.circuits[setup.agg[pod]])
            assert setup.connected(tmpl.circuits[setup.agg[pod]])


def test_two_tors_a_pod_take_every_uplink_and_stay_joined():
    setup = Setup(TWO)
    (pod,) = setup.gen_pods
    assert setup.shape.tors == 2 and setup.shape.agg == 2
    traffic = setup.flows(pod, 0, 1, count=4)
    circuits = setup.templates.for_kind("gen-config", traffic).circuits[setup.agg[pod]]
    assert setup.tor_pairs(circuits) == [(0, 1)] * setup.shape.agg, \
        "no uplink is kept back: every circuit joins the two ToRs anyway"
    check_ports(setup, circuits)
    assert setup.connected(circuits)


def test_each_gen_pod_is_sized_to_its_own_traffic():
    setup = Setup(TWO_GEN)
    first, second = setup.gen_pods
    traffic = setup.flows(first, 0, 2, count=2) + setup.flows(second, 1, 3, count=2)
    tmpl = setup.templates.for_kind("gen-config", traffic)
    assert (0, 2) in setup.tor_pairs(tmpl.circuits[setup.agg[first]])
    assert (1, 3) in setup.tor_pairs(tmpl.circuits[setup.agg[second]])
    assert setup.agg[0] not in tmpl.circuits, "the Train PoD's OCS is left as it is"
    assert not set(tmpl.ocs) & set(setup.core.values()), "no core plane"


# ---------------------------------------------------------------- Small windows ride
@pytest.mark.parametrize("kind", SMALL_WINDOWS)
def test_small_window_kinds_ride_with_an_empty_template(kind):
    setup = Setup(FOUR)
    (pod,) = setup.gen_pods
    assert KIND_TEMPLATE[kind] == RIDES
    tmpl = setup.templates.for_kind(kind, setup.flows(pod, 0, 1, count=2))
    assert tmpl.name == RIDES and tmpl.ocs == [] and dict(tmpl.circuits) == {}


# (name, kind, start, end) offsets in an iteration of LENGTH s: the Gen agg OCS
# goes gen-pd's mesh -> a TP configuration's circuits -> the weight sync's
# tree; gen-ep, gen-tp, gen-af and a rebalance run beside them.
PHASES = [("gen-ep", "gen-ep", 0.0, 9.0), ("gen-tp", "gen-tp", 0.0, 9.0),
          ("gen-pd", "gen-pd", 0.5, 1.5), ("gen-af", "gen-af", 1.0, 8.0),
          ("gen-migrate0", "gen-migrate", 2.0, 2.5), ("gen-config1-tp4", "gen-config", 4.0, 5.0),
          ("gen-migrate1", "gen-migrate", 6.0, 6.5), ("weight-sync", "weight-sync", 10.0, 11.0)]
LENGTH = 12.0
TDF = 0.5


def drive(proxy, setup, iterations=3):
    """Phase events by hand, ends before starts at the same instant; returns each
    phase start's decision per (iteration, name)."""
    (pod,) = setup.gen_pods
    traffic = {"gen-config": setup.flows(pod, 0, 2, count=2) + setup.flows(pod, 1, 3, 2),
               "gen-pd": setup.flows(pod, 0, 1), "weight-sync": None}
    decisions = {}
    for it in range(iterations):
        base = it * LENGTH
        proxy.begin_iteration(base)
        events = sorted([(s, 1, n, k) for n, k, s, _ in PHASES] +
                        [(e, 0, n, k) for n, k, _, e in PHASES])
        for offset, starts, name, kind in events:
            if starts:
                decisions[it + 1, name] = proxy.phase_started(name, kind, base + offset,
                                                              traffic.get(kind))
            else:
                proxy.phase_ended(name, base + offset)
        proxy.end_iteration(base + LENGTH)
    return decisions


@pytest.mark.parametrize("mode", ["proactive", "reactive"])
def test_the_proxy_never_reconfigures_for_a_phase_that_rides(mode):
    setup = Setup(FOUR)
    proxy = ControlProxy(setup.fabric, mode=mode, tdf=TDF)
    decisions = drive(proxy, setup)
    riding = {n for n, k, _, _ in PHASES if KIND_TEMPLATE[k] == RIDES}
    assert riding == {"gen-ep", "gen-tp", "gen-af", "gen-migrate0", "gen-migrate1"}
    for (it, name), decision in decisions.items():
        if name in riding:
            assert decision.requests == [] and not decision.blocking and decision.wait_s == 0, \
                (it, name)
    assert proxy.reconfigs, "the other phases do reconfigure"
    assert not {r.phase for r in proxy.reconfigs} & riding, \
        f"requests for riding phases: {[(r.iteration, r.phase) for r in proxy.reconfigs]}"
    assert all(proxy.cache[n].circuits == {} for n in riding)
    assert proxy.warnings == []


def test_riding_phases_do_not_hold_back_the_next_configuration():
    """gen-ep runs the whole step; if it held the Gen agg OCS, the configuration's
    circuits could only go in on demand."""
    setup = Setup(FOUR)
    proxy = ControlProxy(setup.fabric, mode="proactive", tdf=TDF)
    decisions = drive(proxy, setup)
    gen_agg = setup.agg[setup.gen_pods[0]]
    config = [r for r in proxy.reconfigs if r.phase == "gen-config1-tp4"]
    assert [r.mode for r in config] == ["reactive", "proactive", "proactive"]
    assert all(r.ocs == gen_agg for r in config)
    for r in config[1:]:
        assert r.issued_s == pytest.approx((r.iteration - 1) * LENGTH + 1.5), \
            "issued when gen-pd ends, with gen-ep and gen-af still running"
        assert r.exposed_s == 0.0
    assert decisions[1, "gen-config1-tp4"].blocking
    assert not decisions[2, "gen-config1-tp4"].blocking
    assert decisions[2, "gen-config1-tp4"].wait_s == 0.0


# ---------------------------------------------------------------- the response stream
@pytest.mark.parametrize("spec", [FOUR, SIX, TWO_GEN])
def test_the_response_stream_names_only_its_core_plane(spec):
    setup = Setup(spec)
    tmpl = setup.templates.for_kind("response")
    plane = setup.core[setup.shape.core - 1]
    assert tmpl.name == "response-share" and tmpl.ocs == [plane]
    assert not set(tmpl.ocs) & set(setup.agg.values()), "it rides the Gen agg OCS"


def test_with_one_core_plane_the_response_stream_keeps_the_core_and_no_agg():
    setup = Setup(FOUR + ",core_uplinks=1")
    tmpl = setup.templates.for_kind("response")
    assert tmpl.ocs == sorted(setup.core.values())
    assert not set(tmpl.ocs) & set(setup.agg.values())
