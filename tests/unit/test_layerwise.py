"""Layer-wise training (RFabric section 4.3): Train's CP and EP all-to-alls as a
chain of per-layer-block phases (`traffic.phases.build_phases(layerwise=True)`)
and the ``train-layer`` circuit template each layer type gets on the Train
PoDs' aggregation OCS, with TP and PP riding."""

from __future__ import annotations

import dataclasses

import networkx as nx
import pytest

from controllers.proxy_core import ControlProxy
from controllers.rfabric_templates import KIND_TEMPLATE, RIDES, RFabricTemplates
from emu.experiments import orchestrrl as orl
from topologies import registry, rfabric
from traffic.phases import FORWARD_SHARE, LAYER_KINDS, build_phases
from traffic.ranks import Parallelism
from traffic.scale import Scale
from traffic.workload import build_iteration

SIX = ("rfabric,pods=2,train_pods=1,servers_per_pod=12,gpus_per_server=2,radix=8,"
       "core_uplinks=1")                                  # the scenario's: T=6, a=3, c=1
FOUR = "rfabric,pods=2,train_pods=1,servers_per_pod=8,gpus_per_server=2,radix=8"  # T=4, a=2
WIDE = "rfabric,pods=2,train_pods=1,servers_per_pod=16,gpus_per_server=2,radix=16"
SCALE = Scale(bw_factor=10 / 400e3, tdf=0.5)


def config(gpus=48, **train):
    settings = {k: f.default for k, f in orl.FIELDS.items()}
    cfg = orl.emulated_config(settings, gpus, 2)
    if train:
        cfg = dataclasses.replace(cfg, train=Parallelism(**train), train_gpus=gpus // 2)
    return cfg


def schedule(cfg, spec=SIX, layerwise=True, max_ops=4):
    hosts = registry.build(spec).hosts
    return build_phases(build_iteration(cfg), cfg.rank_map(hosts), SCALE, max_ops=max_ops,
                        layerwise=layerwise)


# ---------------------------------------------------------------- the phases
def test_the_chain_runs_forward_attention_then_moe_and_backward_in_reverse():
    sched = schedule(config())
    chain = [p for p in sched.phases if p.kind in LAYER_KINDS]
    names = [p.name for p in chain]
    forward = [f"train-f{b}-{t}" for b in range(4) for t in ("cp", "ep")]
    backward = [f"train-b{b}-{t}" for b in reversed(range(4)) for t in ("ep", "cp")]
    assert names == forward + backward
    assert "train-cp" not in sched.names() and "train-ep" not in sched.names(), \
        "the whole-iteration CP and EP phases are replaced"
    assert chain[0].after == () and chain[0].start_s == 0.0
    for before, phase in zip(chain, chain[1:]):
        assert phase.after == (before.name,), "each layer waits for the one before it"
        assert phase.start_s > before.start_s
    assert all(f.group == p.kind for p in chain for f in p.dag.flows)
    assert {p.window for p in chain} == {"Medium"}, "Table 1: CP and EP have Medium windows"


def test_the_compute_between_layers_adds_up_to_the_train_compute():
    cfg = config()
    sched = schedule(cfg)
    chain = [p for p in sched.phases if p.kind in LAYER_KINDS]
    train_s = SCALE.emu_seconds(cfg.compute.train_s)
    owed = sum(gap for p in chain for _, gap in p.gaps)
    (tail,) = sched.phase("train-dp").gaps
    assert tail[0] == chain[-1].name
    assert owed + tail[1] == pytest.approx(train_s), "forward + backward, all of it"
    forward = [p for p in chain if p.name.startswith("train-f")]
    assert forward[-1].start_s + (chain[len(forward)].start_s - forward[-1].start_s) \
        == pytest.approx(train_s * FORWARD_SHARE), "the backward starts after a third"
    assert set(sched.phase("train-dp").after) >= {p.name for p in chain}


def test_the_chain_keeps_each_kinds_bytes():
    cfg = config()
    iteration = build_iteration(cfg)
    hosts = registry.build(SIX).hosts
    rank_map = cfg.rank_map(hosts)
    whole = schedule(cfg, layerwise=False)
    layered = schedule(cfg)
    for kind in LAYER_KINDS:
        chain = [p for p in layered.phases if p.kind == kind]
        assert len(chain) == 8, "4 blocks forward and backward"
        network = sum(c.network_bytes(rank_map) for c in iteration.of_kind(kind))
        assert sum(p.real_bytes for p in chain) == pytest.approx(network)
        emulated = sum(f.bytes for p in chain for f in p.dag.flows)
        assert emulated == pytest.approx(sum(f.bytes for f in whole.phase(kind).dag.flows),
                                         rel=0.01), "the replayed bytes too (rounding aside)"


def test_blocks_never_exceed_the_layers_of_a_stage():
    cfg = config(64, tp=2, cp=2, pp=4, ep=2, dp=0)     # 28 layers over PP 4: 7 a stage
    sched = schedule(cfg, WIDE, max_ops=16)
    assert len([p for p in sched.phases if p.kind == "train-cp"]) == 2 * 7, \
        "16 blocks asked, 7 layers a stage: a block per layer, forward and backward"


def test_without_cp_or_ep_the_schedule_is_unchanged():
    cfg = config(tp=2, pp=2, dp=0)       # dense-like Train: TP and PP only
    plain, layered = schedule(cfg, layerwise=False), schedule(cfg)
    assert plain.names() == layered.names()
    assert not [p for p in layered.phases if p.kind in LAYER_KINDS]


# ---------------------------------------------------------------- the templates
def tor_graph(shape, circuits):
    graph = nx.Graph()
    graph.add_nodes_from(range(shape.tors))
    graph.add_edges_from((rfabric.agg_tor(shape, a), rfabric.agg_tor(shape, b))
                         for a, b in circuits)
    return graph


def test_each_layer_type_gets_its_own_train_circuits_and_the_pod_stays_joined():
    spec = SIX
    fabric = registry.build(spec)
    gpus = len(fabric.hosts)
    cfg = config(gpus)
    sched = schedule(cfg, spec)
    templates = RFabricTemplates(fabric, layerwise=True)
    shape = rfabric.shape_of(fabric)
    train_agg = next(o for o in fabric.ocs_switches
                     if fabric.graph.nodes[o]["role"] == "agg-ocs"
                     and fabric.graph.nodes[o]["pod"] == 0)
    chosen = {}
    for kind in LAYER_KINDS:
        phase = next(p for p in sched.phases if p.kind == kind)
        tmpl = templates.for_kind(kind, phase.pairs())
        assert tmpl.name == "train-layer" and tmpl.ocs == [train_agg], \
            "only the Train PoD's aggregation OCS"
        circuits = tmpl.circuits[train_agg]
        ports = [p for c in circuits for p in c]
        assert len(ports) == len(set(ports)), "a port in one circuit at most"
        assert nx.is_connected(tor_graph(shape, circuits)), \
            "TP and PP ride these circuits: every Train ToR stays reachable"
        tors = {(templates.tor_of(s)[1], templates.tor_of(d)[1]) for s, d, _ in phase.pairs()}
        given = {tuple(sorted(e)) for e in tor_graph(shape, circuits).edges}
        assert {tuple(sorted(t)) for t in tors if t[0] != t[1]} & given, \
            f"{kind}'s ToR pairs get circuits"
        chosen[kind] = circuits
    assert chosen["train-cp"] != chosen["train-ep"], \
        "attention and the MoE block talk to different ToRs: different circuits"


def test_tp_and_pp_ride_only_in_layerwise_mode():
    fabric = registry.build(SIX)
    layered, whole = RFabricTemplates(fabric, layerwise=True), RFabricTemplates(fabric)
    for kind in ("train-tp", "train-pp"):
        assert layered.for_kind(kind).name == RIDES and not layered.for_kind(kind).circuits
        assert whole.for_kind(kind).name == KIND_TEMPLATE[kind] == "train-pod-mesh"
    for kind in LAYER_KINDS:
        assert whole.for_kind(kind).name == "train-pod-mesh", "one mesh for the whole phase"


def test_the_proxy_profiles_each_layer_type_then_puts_it_in_ahead():
    fabric = registry.build(SIX)
    sched = schedule(config())
    proxy = ControlProxy(fabric, mode="proactive", tdf=0.5, layerwise=True)
    chain = [p for p in sched.phases if p.kind in LAYER_KINDS]
    delay = proxy.delay_s(next(iter(proxy.template(chain[0].name, chain[0].kind,
                                                   chain[0].pairs()).circuits)))
    for iteration in (1, 2):
        t = 10.0 * iteration
        proxy.begin_iteration(t)
        for phase in chain:
            decision = proxy.phase_started(phase.name, phase.kind, t, phase.pairs())
            if iteration == 1 and phase is chain[1]:
                assert decision.blocking and decision.requests, "on demand while profiling"
            if iteration == 2 and phase is not chain[0]:
                assert not decision.requests and decision.wait_s == 0.0, \
                    f"{phase.name}: in place ahead of the layer"
            t += max(decision.wait_s, 0.0) + 0.001
            proxy.phase_ended(phase.name, t)
            t += 2 * delay                   # the layer's compute: a window of two delays
        proxy.end_iteration(t)
    rows = [o for o in proxy.occurrences() if o["iteration"] == 2]
    assert rows and all(o["mode"] == "proactive" for o in rows)
    assert sum(o["exposed_s"] for o in rows if o["phase"] != chain[0].name) == 0.0


def test_a_layer_type_under_its_tors_rides():
    fabric = registry.build(SIX)
    templates = RFabricTemplates(fabric, layerwise=True)
    by_tor = {}
    for host in fabric.hosts:
        by_tor.setdefault(templates.tor_of(host), []).append(host)
    inside = [(hosts[0], hosts[-1], 1e6) for hosts in by_tor.values()]
    assert templates.for_kind("train-cp", inside).name == RIDES
    (a, b), *_ = [(t, u) for t in by_tor for u in by_tor if t[0] == u[0] == 0 and t < u]
    across = inside + [(by_tor[a][0], by_tor[b][0], 1e6)]
    assert templates.for_kind("train-cp", across).name == "train-layer"


# ---------------------------------------------------------------- ring attention
@pytest.mark.parametrize("cp", [2, 3, 6])
def test_ring_attention_passes_kv_blocks_to_the_next_cp_rank(cp):
    cfg = dataclasses.replace(config(), train=Parallelism(tp=2, cp=cp, dp=1), train_gpus=0,
                              gen=Parallelism(tp=2, dp=cp), gen_gpus=0, af_attention=0,
                              af_ffn=0)
    (ring,) = build_iteration(cfg).of_kind("train-cp")
    m = cfg.model
    block = cfg.micro_batch * cfg.seq_len / cp * 2 * m.kv_dim * cfg.act_bytes / 2
    micro = -(-cfg.seqs // cfg.micro_batch)
    assert ring.bytes == pytest.approx(block)
    assert ring.ops == 3 * (cp - 1) * m.layers * micro, "CP-1 steps forward, 2(CP-1) backward"
    assert ring.forward_share == pytest.approx(1 / 3)
    sent = ring.sent_per_rank()
    assert set(sent) == set(range(2 * cp))
    assert all(v == pytest.approx(block) for v in sent.values()), "one block per rank per step"
    assert all((dst - src) % (2 * cp) == 2 for src, dst, _ in ring.transfers()), \
        "to the next CP rank of the same TP lane, the last to the first"


def test_cp_comm_is_checked():
    from traffic.workload import WorkloadError
    with pytest.raises(WorkloadError, match=r"cp_comm must be one of a2a, p2p, got 'ring'"):
        dataclasses.replace(config(), cp_comm="ring")


def test_the_dp_template_never_splits_a_train_pod():
    """At 32 GPUs the DP ring's CP neighbours (ToRs 0-1, 2-3) need the most
    circuits; sized greedily they took every uplink and left ToRs 1-2 and 3-0,
    the ring's other hops, with no path."""
    fabric = registry.build(FOUR)
    cfg = config(32)
    dp = schedule(cfg, FOUR).phase("train-dp")
    tmpl = RFabricTemplates(fabric).for_kind("train-dp", dp.pairs())
    shape = rfabric.shape_of(fabric)
    train_agg = next(o for o in fabric.ocs_switches
                     if fabric.graph.nodes[o]["role"] == "agg-ocs"
                     and fabric.graph.nodes[o]["pod"] == 0)
    graph = tor_graph(shape, tmpl.circuits[train_agg])
    assert nx.is_connected(graph), sorted(graph.edges)
    busiest = {tuple(sorted(e)) for e in graph.edges}
    assert {(0, 1), (2, 3)} <= busiest, "the busiest pairs still get their circuits"


def test_at_32_gpus_the_cp_pairs_share_a_tor_and_ride():
    """PP 2 x DP 2 leaves CP 2: a CP pair is two servers under one ToR."""
    fabric = registry.build(FOUR)
    sched = schedule(config(32), FOUR)
    templates = RFabricTemplates(fabric, layerwise=True)
    names = {kind: templates.for_kind(kind, next(p for p in sched.phases
                                                 if p.kind == kind).pairs()).name
             for kind in LAYER_KINDS}
    assert names == {"train-cp": RIDES, "train-ep": "train-layer"}


def test_the_bytes_inside_the_servers_are_listed_layerwise_or_not():
    cfg = config(32, tp=1, cp=2, pp=2, ep=2, dp=0)      # a CP pair is one server's GPUs
    plain, layered = schedule(cfg, FOUR, layerwise=False), schedule(cfg, FOUR)
    assert layered.off_network["train-cp"] > 0
    assert layered.off_network == plain.off_network
