"""The RFabric control proxy: templates per phase kind, caching, proactive timing,
and two iterations driven end to end through a FabricService on fake datapaths."""

import networkx as nx
import pytest
from fakes import FakeNetwork, assert_delivered

from controllers.openflow.applier import OpenFlowApplier
from controllers.proxy_core import ControlProxy
from controllers.rfabric_templates import (KIND_TEMPLATE, FreePorts, RFabricTemplates,
                                          size_circuits)
from controllers.service import FabricService
from topologies import registry, rfabric
from topologies.fabric import FabricError
from traffic.phases import build_phases
from traffic.ranks import Parallelism
from traffic.scale import Scale
from traffic.workload import ComputeTimes, Model, RLConfig, build_iteration

SPEC = "rfabric,pods=3,train_pods=2"          # 2 Train PoDs, 1 Gen PoD, 2 ToRs each, c=2
TDF = 200.0                                   # 3D MEMS: 10 ms real -> 2 s emulated
DELAY = 10e-3 * TDF


def fabric():
    return registry.build(SPEC)


def roles(fab):
    nodes = fab.graph.nodes
    agg = {nodes[o]["pod"]: o for o in fab.ocs_switches if nodes[o]["role"] == "agg-ocs"}
    core = {nodes[o]["plane"]: o for o in fab.ocs_switches if nodes[o]["role"] == "core-ocs"}
    return agg, core


# ---------------------------------------------------------------- templates
@pytest.mark.parametrize("kind", ["train-tp", "train-pp", "train-cp", "train-ep"])
def test_train_phases_get_the_train_pods_agg_mesh(kind):
    fab = fabric()
    agg, _ = roles(fab)
    tmpl = RFabricTemplates(fab).for_kind(kind)
    mesh = rfabric.circuit_set(fab, "mesh")
    assert tmpl.name == "train-pod-mesh" and tmpl.figure == "Figure 5(b)"
    assert tmpl.ocs == sorted([agg[0], agg[1]]), "only the Train PoDs' aggregation OCS"
    assert all(tmpl.circuits[o] == mesh[o] for o in tmpl.ocs)


def test_pd_bursts_get_isolated_gen_pod_meshes():
    fab = fabric()
    agg, _ = roles(fab)
    tmpl = RFabricTemplates(fab).for_kind("gen-pd")
    assert tmpl.name == "gen-isolated" and tmpl.ocs == [agg[2]]
    assert tmpl.circuits[agg[2]] == rfabric.circuit_set(fab, "mesh")[agg[2]]


@pytest.mark.parametrize("kind", ["gen-tp", "gen-ep", "gen-af", "gen-migrate"])
def test_small_window_phases_ride_the_circuits_in_place(kind):
    tmpl = RFabricTemplates(fabric()).for_kind(kind)
    assert tmpl.name == "rides" and tmpl.ocs == [] and tmpl.figure == "Table 1: Small window"


def test_dp_gets_the_inter_pod_mesh_and_response_its_small_core_share():
    fab = fabric()
    _, core = roles(fab)
    templates = RFabricTemplates(fab)
    dp, response = templates.for_kind("train-dp"), templates.for_kind("response")
    agg, _ = roles(fab)
    shape = rfabric.shape_of(fab)
    assert dp.ocs == sorted([core[0], agg[0], agg[1]]) and dp.figure == "Figure 5(a)"
    assert response.ocs == [core[1]], "its core plane; it rides the Gen agg OCS"
    assert not set(dp.ocs) & set(response.ocs), \
        "DP and the response stream run together, so they never name the same OCS"
    joined = {tuple(sorted((rfabric.core_tor(shape, a)[0], rfabric.core_tor(shape, b)[0])))
              for a, b in dp.circuits[core[0]]}
    assert joined == {(0, 1)}, "plane 0 meshes the two Train PoDs"
    share = [(rfabric.core_tor(shape, a), rfabric.core_tor(shape, b)) for a, b in response.circuits[core[1]]]
    assert len(share) == 1 and {share[0][0][0], share[0][1][0]} == {0, 2}, \
        "the last plane gives the Gen PoD one circuit (0.4 Tb/s at 400G) to a Train ToR"


def ring_pairs(templates, hosts_by_tor, tors, size=10.0):
    """A ring over ``tors`` (one flow from each ToR to the next)."""
    return [(hosts_by_tor[a], hosts_by_tor[b], size)
            for a, b in zip(tors, tors[1:] + tors[:1])]


def test_dp_circuits_follow_the_ring_not_the_round_robin_mesh():
    fab = registry.build("rfabric,pods=2,train_pods=1,servers_per_pod=8,radix=8")
    shape = rfabric.shape_of(fab)                   # 4 ToRs, 2 agg uplinks, 2 planes
    templates = RFabricTemplates(fab)
    host = {templates.tor_of(h): h for h in fab.hosts}
    ring = [(0, t) for t in range(shape.tors)]
    agg, core = roles(fab)
    dp = templates.for_kind("train-dp", ring_pairs(templates, host, ring))

    def tor_pairs(ocs, port_to_tor):
        return sorted(tuple(sorted((port_to_tor(a), port_to_tor(b))))
                      for a, b in dp.circuits[ocs])

    in_pod = tor_pairs(agg[0], lambda port: (port - 1) // shape.agg)
    assert in_pod == [(0, 1), (0, 3), (1, 2), (2, 3)], \
        "each ToR's two uplinks go to its two ring neighbours, none across the ring"
    mesh_pairs = sorted(tuple(sorted(((a - 1) // shape.agg, (b - 1) // shape.agg)))
                        for a, b in rfabric.circuit_set(fab, "mesh")[agg[0]])
    assert (0, 2) in mesh_pairs, "the mesh would have spent an uplink across the ring"
    assert core[1] not in dp.circuits, "the response plane is not DP's"
    assert dp.ocs == sorted([core[0], agg[0]])


def test_sized_circuits_take_what_a_pair_needs_and_keep_the_mesh_on_free_ports():
    fab = registry.build("rfabric,pods=2,train_pods=1,servers_per_pod=8,radix=16")
    shape = rfabric.shape_of(fab)                   # 2 ToRs a PoD, 4 agg uplinks
    templates = RFabricTemplates(fab)
    agg, core = roles(fab)
    ports = FreePorts(shape, agg, core, [0], [])
    size_circuits(ports, {((0, 0), (0, 1)): 2.5})
    assert len(ports.circuits[agg[0]]) == 3 < shape.agg, "a pair takes what it needs, no more"
    ports = FreePorts(shape, agg, core, [0], [0])
    size_circuits(ports, {((0, 0), (1, 1)): 1.0})
    assert ports.circuits[core[0]] == {(rfabric.core_port(shape, 0, 0),
                                        rfabric.core_port(shape, 1, 1))}, \
        "across PoDs only a core plane joins two ToRs"
    assert ports.circuits[agg[0]] == set()
    filled = ports.filled(templates.mesh)
    assert filled[agg[0]] == templates.mesh[agg[0]], "unused agg ports keep the mesh"
    assert templates.mesh[core[0]] == {(1, 3), (2, 4)}, "ToR t of PoD 0 to ToR t of PoD 1"
    assert filled[core[0]] == {(1, 4)}, "the mesh circuits of taken ports are not kept"


def test_sized_circuits_share_scarce_ports_by_need_largest_average_first():
    fab = registry.build("rfabric,pods=2,train_pods=1,servers_per_pod=12,radix=16")
    shape = rfabric.shape_of(fab)                   # 3 ToRs a PoD, 4 agg uplinks, 4 planes
    agg, core = roles(fab)
    ports = FreePorts(shape, agg, core, [0], [])
    size_circuits(ports, {((0, 0), (0, 1)): 6.0, ((0, 0), (0, 2)): 2.0})
    counts = {}
    for a, b in ports.circuits[agg[0]]:
        pair = tuple(sorted(((a - 1) // shape.agg, (b - 1) // shape.agg)))
        counts[pair] = counts.get(pair, 0) + 1
    assert counts == {(0, 1): 3, (0, 2): 1}, "ToR 0's four uplinks split 3:1 as the needs"


def test_with_one_core_plane_dp_and_the_responses_share_the_mesh_core():
    fab = registry.build("rfabric,pods=2,train_pods=1,servers_per_pod=8,radix=8,core_uplinks=1")
    templates = RFabricTemplates(fab)
    host = {templates.tor_of(h): h for h in fab.hosts}
    agg, core = roles(fab)
    dp = templates.for_kind("train-dp", ring_pairs(templates, host, [(0, t) for t in range(4)]))
    response = templates.for_kind("response")
    mesh = rfabric.circuit_set(fab, "mesh")
    assert dp.circuits[core[0]] == response.circuits[core[0]] == mesh[core[0]], \
        "no plane of its own for the responses: both keep the mesh core"
    assert dp.circuits[agg[0]] != mesh[agg[0]], "the Train agg OCS is still sized for the ring"


def test_a_pair_needs_its_flows_share_of_their_ports_and_a_tree_its_busiest_level():
    fab = registry.build("rfabric,pods=2,train_pods=1,servers_per_pod=8,radix=8")
    templates = RFabricTemplates(fab)                # Gen PoD 1: ToR t holds h17+4t .. h20+4t
    root, left, right, back = "h17", "h21", "h22", "h18"
    tree = [(root, left, 5.0), (root, right, 5.0),   # level 0: the root's port, halved
            (left, back, 5.0)]                        # level 1: back to ToR 0, a whole port
    gen = [1]
    assert templates.circuits_needed(tree, gen) == {((1, 0), (1, 1)): 2.0}, \
        "all at once: 1/2 + 1/2 + 1"
    assert templates.circuits_needed(tree, gen, tree=True) == {((1, 0), (1, 1)): 1.0}, \
        "a tree's levels take turns: the busiest needs one circuit"
    incast = [("h21", root, 1.0), ("h25", root, 1.0)]
    assert templates.circuits_needed(incast, gen) == {((1, 0), (1, 1)): 0.5,
                                                      ((1, 0), (1, 2)): 0.5}
    assert templates.circuits_needed(tree, [0]) == {}, "only ToRs of the PoDs in scope"


def test_weight_sync_sizes_the_broadcast_in_the_gen_pod_on_agg_and_free_core_ports():
    fab = registry.build("rfabric,pods=2,train_pods=1,servers_per_pod=8,radix=8")
    shape = rfabric.shape_of(fab)                    # 4 ToRs a PoD, 2 agg uplinks, 2 planes
    templates = RFabricTemplates(fab)
    agg, core = roles(fab)
    host = {}
    for h in fab.hosts:
        host.setdefault(templates.tor_of(h), []).append(h)
    stage1 = [(host[0, t][0], host[1, 0][0], 1.0) for t in range(shape.tors)]
    # ToR 1's four GPUs each send to one on ToR 2: four ports' worth, and
    # ToR 1 has four ports (2 agg, 2 core), one of them for the level before.
    stage2 = [(host[1, 0][0], host[1, 1][k], 9.0) for k in range(1)] + \
             [(host[1, 1][k], host[1, 2][k], 9.0) for k in range(4)]
    tmpl = templates.for_kind("weight-sync", stage1 + stage2)
    gen_agg = [tuple(sorted(((a - 1) // shape.agg, (b - 1) // shape.agg)))
               for a, b in tmpl.circuits[agg[1]]]
    in_pod_core = [tuple(sorted((rfabric.core_tor(shape, a)[1], rfabric.core_tor(shape, b)[1])))
                   for o in core.values() for a, b in tmpl.circuits[o]
                   if rfabric.core_tor(shape, a)[0] == rfabric.core_tor(shape, b)[0] == 1]
    assert gen_agg.count((0, 1)) == 1, "the first level gets the one circuit it needs"
    assert in_pod_core.count((1, 2)) == 2, "the core ports stage 1 left free join the Gen ToRs"
    # Each ToR kept one agg uplink out of the sizing: the Gen PoD stays joined on
    # its agg OCS, whatever the next phase does with the core.
    joined = nx.Graph(gen_agg)
    joined.add_nodes_from(range(shape.tors))
    assert nx.is_connected(joined), gen_agg
    assert tmpl.circuits[agg[0]] == templates.mesh[agg[0]], "the Train PoD keeps its mesh"


def test_weight_sync_gets_a_tree_from_train_tors_to_the_gen_pod():
    fab = fabric()
    agg, core = roles(fab)
    shape = rfabric.shape_of(fab)
    tmpl = RFabricTemplates(fab).for_kind("weight-sync")
    assert tmpl.name == "t2g-tree" and tmpl.ocs == sorted([*core.values(), *agg.values()])
    mesh = RFabricTemplates(fab).for_kind("train-dp").circuits
    tree = {}
    for plane in core.values():
        for a, b in tmpl.circuits[plane]:
            ends = sorted((rfabric.core_tor(shape, a), rfabric.core_tor(shape, b)))
            if ends[1][0] == 2:
                tree[plane] = ends
            else:
                assert (a, b) in mesh[plane], "ports the tree leaves free keep the DP mesh"
    assert sorted(tree) == sorted(core.values()), "a Train -> Gen circuit on every plane"
    assert {ends[1] for ends in tree.values()} == {(2, 0)}, "all to the DP-0 ToR"
    assert {ends[0][0] for ends in tree.values()} == {0, 1}, "one from each Train PoD"


def test_weight_sync_tree_follows_the_phase_traffic():
    fab = fabric()
    shape = rfabric.shape_of(fab)
    templates = RFabricTemplates(fab)
    host = {templates.tor_of(h): h for h in fab.hosts}
    pairs = [(host[1, 1], host[2, 1], 100.0), (host[0, 0], host[2, 1], 50.0),
             (host[2, 1], host[2, 0], 999.0)]                 # in-PoD: not the core's business
    tmpl = templates.for_kind("weight-sync", pairs)
    circuits = [(rfabric.core_tor(shape, a), rfabric.core_tor(shape, b))
                for o in sorted(roles(fab)[1].values()) for a, b in tmpl.circuits[o]]
    to_gen = [c for c in circuits if c[1][0] == 2]
    assert sorted(to_gen) == [((0, 0), (2, 1)), ((1, 1), (2, 1))], \
        "one plane each for the two Train ToRs that send to the Gen ToR"


def test_unknown_kinds_and_other_fabrics_are_refused():
    with pytest.raises(FabricError, match="no OCS template for phase kind 'nope'"):
        RFabricTemplates(fabric()).for_kind("nope")
    with pytest.raises(FabricError, match="need the 'rfabric' fabric, got 'hybrid'"):
        RFabricTemplates(registry.build("hybrid"))
    assert set(KIND_TEMPLATE) >= {"train-dp", "weight-sync", "response", "gen-tp"}
    with pytest.raises(ValueError, match="unknown proxy mode 'eager'"):
        ControlProxy(fabric(), mode="eager")


# ---------------------------------------------------------------- a synthetic schedule
class Spy:
    """Counts how often the proxy asks for a template."""

    def __init__(self, fab):
        self.inner, self.calls = RFabricTemplates(fab), []

    def for_kind(self, kind, pairs=None):
        self.calls.append(kind)
        return self.inner.for_kind(kind, pairs)


def schedule(window):
    """(name, kind, start, end) offsets: the core changes before weight-sync
    (window ``window`` after train-dp and the response stream) and back before
    the next train-dp (plane 0) and response stream (plane 1)."""
    return [("train-pp", "train-pp", 0.0, 4.0), ("train-dp", "train-dp", 4.0, 6.0),
            ("response", "response", 4.0, 6.0),
            ("weight-sync", "weight-sync", 6.0 + window, 8.0 + window)], 9.0 + window


def drive(proxy, phases, length, iterations):
    """Replay phase events; returns the decisions taken at each phase start.

    A phase that must wait for its circuits stalls the job: every later
    event of the iteration moves by the wait, as a runner that waits would
    see it.
    """
    starts, base = {}, 0.0
    for it in range(iterations):
        events = sorted([(s, 1, n, k) for n, k, s, _ in phases] +
                        [(e, 0, n, k) for n, k, _, e in phases])     # ends first
        proxy.begin_iteration(base)
        shift = 0.0
        for offset, what, name, kind in events:
            t = base + offset + shift
            if what:
                starts[it + 1, name] = decision = proxy.phase_started(name, kind, t)
                shift += decision.wait_s
            else:
                proxy.phase_ended(name, t)
        base += length + shift
        proxy.end_iteration(base)
    return starts


def test_templates_are_chosen_once_per_phase_and_cached():
    fab = fabric()
    spy = Spy(fab)
    proxy = ControlProxy(fab, tdf=TDF, templates=spy)
    phases, length = schedule(3.0)
    drive(proxy, phases, length, iterations=3)
    assert sorted(spy.calls) == ["response", "train-dp", "train-pp", "weight-sync"], \
        f"one choice per phase, cached for later iterations: {spy.calls}"
    assert proxy.template("weight-sync", "weight-sync") is proxy.cache["weight-sync"]
    assert proxy.schedule == ["train-pp", "response", "train-dp", "weight-sync"]


@pytest.mark.parametrize("window", [0.5, 1.0, 1.5, 2.0, 3.0, 6.0])
@pytest.mark.parametrize("parallel", [True, False])
def test_proactive_exposes_max_0_delay_minus_window(window, parallel):
    fab = fabric()
    proxy = ControlProxy(fab, tdf=TDF, parallel=parallel)
    phases, length = schedule(window)
    starts = drive(proxy, phases, length, iterations=3)
    assert proxy.delay_s("o1") == pytest.approx(DELAY)
    changed = len(roles(fab)[1])                   # both core planes change for the sync
    delay = DELAY if parallel else changed * DELAY   # FabricService serialises OCS
    expected = max(0.0, delay - window)
    plan = {(e.phase, e.ocs): e for e in proxy.plan()}
    sync = [e for (phase, _), e in plan.items() if phase == "weight-sync"]
    assert len(sync) == changed and all(e.window_s == pytest.approx(window) for e in sync)
    assert max(e.exposed_s for e in sync) == pytest.approx(expected), \
        f"plan: window {window} s against a {delay} s reconfiguration"
    rows = [r for r in proxy.occurrences() if r["phase"] == "weight-sync"]
    assert [r["mode"] for r in rows] == ["reactive", "proactive", "proactive"]
    assert rows[0]["exposed_s"] >= delay - 1e-9, \
        "profiling: reconfigured on demand (queued behind train-dp's when serialised)"
    for row in rows[1:]:
        assert row["window_s"] == pytest.approx(window)
        assert row["exposed_s"] == pytest.approx(expected)
        assert row["hidden_s"] == pytest.approx(delay - expected)
    assert starts[2, "weight-sync"].wait_s == pytest.approx(expected)
    assert not starts[2, "weight-sync"].requests and not starts[2, "weight-sync"].blocking
    assert starts[1, "weight-sync"].blocking and len(starts[1, "weight-sync"].requests) == changed


def test_iteration_2_exposes_less_than_iteration_1():
    proxy = ControlProxy(fabric(), tdf=TDF)
    phases, length = schedule(5.0)
    drive(proxy, phases, length, iterations=2)
    summary = proxy.summary()
    assert summary[1]["exposed_s"] > 0 and summary[1]["hidden_s"] == 0
    assert summary[2]["exposed_s"] < summary[1]["exposed_s"]
    assert summary[2]["exposed_s"] == 0 and summary[2]["hidden_s"] > 0
    assert summary[2]["reconfigs"] == summary[1]["reconfigs"] == 4, \
        "both core planes, before train-dp and before weight-sync"


def test_reactive_mode_exposes_the_delay_every_time_and_static_never_reconfigures():
    phases, length = schedule(5.0)
    reactive = ControlProxy(fabric(), mode="reactive", tdf=TDF, parallel=True)
    drive(reactive, phases, length, iterations=3)
    rows = reactive.occurrences()
    assert {r["mode"] for r in rows} == {"reactive"}
    assert all(r["exposed_s"] == pytest.approx(DELAY) for r in rows)
    summary = reactive.summary()
    assert summary[2]["exposed_s"] > 0
    assert summary[2]["exposed_s"] == pytest.approx(summary[3]["exposed_s"])
    static = ControlProxy(fabric(), mode="static", tdf=TDF)
    drive(static, phases, length, iterations=2)
    assert static.reconfigs == [] and static.summary() == {}


def test_occurrences_carry_the_kind_each_phase_started_with():
    """Reactive (on demand) and proactive (from the profile) reconfigurations
    alike: a phase's name need not say its kind."""
    phases, length = schedule(5.0)
    named = [(f"p{i}-{name}", kind, start, end)
             for i, (name, kind, start, end) in enumerate(phases)]
    for mode in ("proactive", "reactive"):
        proxy = ControlProxy(fabric(), mode=mode, tdf=TDF)
        drive(proxy, named, length, iterations=2)
        rows = proxy.occurrences()
        assert {r["mode"] for r in rows} == ({"reactive", "proactive"} if mode == "proactive"
                                             else {"reactive"})
        kinds = {name: kind for name, kind, _, _ in named}
        assert rows and all(r["kind"] == kinds[r["phase"]] for r in rows)
        assert all(r.to_dict()["kind"] == kinds[r.phase] for r in proxy.reconfigs)


def test_measured_completion_replaces_the_model():
    proxy = ControlProxy(fabric(), mode="reactive", tdf=TDF, parallel=True)
    decision = proxy.phase_started("weight-sync", "weight-sync", 10.0)
    assert decision.blocking and decision.wait_s == pytest.approx(DELAY)
    proxy.reconfigured("o1", 10.0 + 3 * DELAY)
    assert proxy.occurrences()[0]["exposed_s"] == pytest.approx(3 * DELAY)
    with pytest.raises(FabricError, match="no reconfiguration of 'o5'"):
        proxy.reconfigured("o5", 1.0)
    with pytest.raises(FabricError, match="no plan before the first iteration"):
        proxy.plan()


def test_a_preset_delay_override_is_dilated():
    proxy = ControlProxy(fabric(), tdf=4.0, delay_ms=25.0)
    assert proxy.delay_s("o1") == pytest.approx(0.1)


# ---------------------------------------------------------------- end to end on fakes
E2E_SPEC = "rfabric,pods=3,train_pods=1"       # 8 Train hosts, two Gen PoDs of 8
TOY = Model("toy", params=1.2e9, layers=8, hidden=1024, heads=8, kv_heads=2, head_dim=128)


def rl_phases(fab):
    """Train TP=2 x PP=2 x DP=2 in the Train PoD; Gen TP=2 x DP=8 over both Gen
    PoDs; Gen finishes first, so the weights wait for the optimizer."""
    cfg = RLConfig(model=TOY, train=Parallelism(tp=2, pp=2, dp=2), gen=Parallelism(tp=2, dp=8),
                   gpus_per_server=2, gen_pods=2, batch_prompts=8, responses_per_prompt=2,
                   prompt_len=128, response_len=256,
                   compute=ComputeTimes(train_s=2.0, optimizer_s=0.5, gen_s=1.5))
    rank_map = cfg.rank_map(fab.hosts)                       # hosts in PoD order
    pods = {h: fab.graph.nodes[h]["pod"] for h in fab.hosts}
    return build_phases(build_iteration(cfg), rank_map, Scale(1e-3, 10.0), pod_of=pods.get)


def realised(table, radix):
    """Circuits an OCS flow table implements (each port to exactly one other)."""
    circuits = set()
    for port in range(1, radix + 1):
        out = table.output_ports(port)
        assert len(out) <= 1, f"port {port} leaves by {sorted(out)}"
        for peer in out:
            assert table.output_ports(peer) == {port}, f"circuit {port}-{peer} is one-way"
            circuits.add(tuple(sorted((port, peer))))
    return circuits


def test_two_iterations_through_a_fabric_service_on_fake_datapaths():
    fab = registry.build(E2E_SPEC)
    applier = OpenFlowApplier(fab)
    service = FabricService(fab, applier, tdf=1.0)
    network = FakeNetwork(fab, on_barrier=applier.barrier_replied)
    network.connect(applier, service)
    assert service.status()["ready"]
    sched = rl_phases(fab)
    assert sched.names() == ["train-pp", "response", "train-dp", "weight-sync"]
    proxy = ControlProxy(fab, tdf=1.0)                # Table 2 3D MEMS: 10 ms, undilated
    sent = []

    def send(requests):
        for request in requests:
            reply = service.handle(request)
            assert reply["plan"]["ocs"] == request["ocs"]
            sent.append(request)

    def check(phase, active):
        for name in active:                     # every running phase keeps its circuits
            for ocs, want in proxy.cache[name].circuits.items():
                radix = fab.graph.nodes[ocs]["radix"]
                assert realised(network.tables[ocs], radix) == set(want), \
                    f"{phase.name}: {ocs} does not carry the {proxy.cache[name].name} circuits"
        template = proxy.cache[phase.name].circuits
        crossed = set()
        for src, dst, _ in phase.pairs():
            for path in assert_delivered(network, src, dst).delivered:
                for hop in path:
                    # OCS a template does not name keep their circuits.
                    if fab.graph.nodes[hop.node]["role"] == "core-ocs" and hop.node in template:
                        circuit = tuple(sorted((hop.in_port, hop.out_port)))
                        assert circuit in template[hop.node], \
                            f"{phase.name}: {src}->{dst} crosses {hop.node} {circuit}, " \
                            "not a circuit of its template"
                        crossed.add(hop.node)
        return crossed

    crossed = {}
    for it in range(2):
        base = it * (sched.iteration_s + 1.0)          # 1 s between iterations
        send(proxy.begin_iteration(base).requests)
        events = sorted([(base + p.start_s, 1, p) for p in sched.phases] +
                        [(base + p.planned_end_s, 0, p) for p in sched.phases],
                        key=lambda e: (e[0], e[1], e[2].name))       # ends first
        active = []
        for t, what, phase in events:
            if what:
                decision = proxy.phase_started(phase.name, phase.kind, t, phase.pairs())
                assert decision.blocking == bool(decision.requests)
                send(decision.requests)
                active.append(phase.name)
                crossed[phase.name] = check(phase, active)
            else:
                active.remove(phase.name)
                send(proxy.phase_ended(phase.name, t).requests)
        send(proxy.end_iteration(base + sched.iteration_s).requests)

    core = {o for o in fab.ocs_switches if fab.graph.nodes[o]["role"] == "core-ocs"}
    assert crossed["weight-sync"] == core, "the weights use every core plane"
    assert crossed["train-pp"] == set(), "the pipeline stays in the Train PoD"
    history = sum(len(c.history) for c in service.ocs.values())
    assert history == len(sent) == len(proxy.reconfigs)
    rows = [r for r in proxy.occurrences() if r["needed_s"] is not None]
    assert {(r["iteration"], r["phase"], r["mode"]) for r in rows} == {
        (1, "response", "reactive"), (1, "train-dp", "reactive"), (1, "weight-sync", "reactive"),
        (2, "response", "proactive"), (2, "train-dp", "proactive"),
        (2, "weight-sync", "proactive")}
    summary = proxy.summary()
    assert summary[1]["exposed_s"] == pytest.approx(4 * 0.01), \
        "10 ms each: the response plane, the DP plane, then both for the weights"
    assert summary[2]["exposed_s"] == 0.0 < summary[2]["hidden_s"]
    assert not proxy.warnings and not service.status()["errors"]
