"""The P/D planning pipeline's output, hashed: placement, pairing, plan, KV flows, paths.

The planning code (`traffic.placement`, `traffic.pairing`, `traffic.pdplan`,
`traffic.kvflows`, `traffic.fastlane`, `topologies.zcube` paths) was sped up
for the texts' scale; the emulator's measured figures (README.md) depend on
its exact output.  These digests were taken from the code *before* the speed-up,
built the way `emu.experiments.pd_setup` / pd_inference / pd_failure /
pd_pairing build it (scenario defaults of `emu/scenarios/pd-*.toml`), and
must not change.
"""

from __future__ import annotations

import hashlib

import pytest

from emu.experiments import pd_setup
from topologies import registry
from traffic import requests as rq
from traffic.pdplan import plan
from traffic.scale import Scale

REFERENCE = "zcube,n=4,gpus_per_server=2"
SCALE = Scale.from_rates(200.0, 10.0, 10.0)     # [scale] link_mbps 10, tdf 10


def _settings(**overrides):
    settings = {name: field.default for name, field in pd_setup.FIELDS.items()}
    settings.update({"lane_threshold_gb": 1.0})
    settings.update(overrides)
    return settings


def placement_digest(place) -> str:
    text = repr((place.kind, sorted(place.roles.items()),
                 [(t.index, t.prefill, t.decode) for t in place.tiles]))
    return hashlib.sha256(text.encode()).hexdigest()


def plan_digest(place, planned) -> str:
    h = hashlib.sha256(placement_digest(place).encode())
    for x in planned:
        h.update(repr((x.id, x.p, x.d, x.on_home, x.arrival_s, x.prefill_start_s,
                       x.prefill_end_s, x.transfer.request_id, x.transfer.p, x.transfer.d,
                       x.transfer.paths, x.transfer.dag.external)).encode())
        for f in x.transfer.dag.flows:
            h.update(repr((f.id, f.src, f.dst, f.bytes, f.at_s, f.after, f.group,
                           f.step)).encode())
        if x.lanes is not None:
            h.update(repr((x.lanes.large, [(r.kind, r.path, r.lane)
                                           for r in x.lanes.routes])).encode())
    return h.hexdigest()


def run_config(fabric_name: str, spec: str = REFERENCE, **overrides):
    s = _settings(**overrides)
    if fabric_name != "zcube" and spec != REFERENCE:
        # At 1,024 GPUs each fabric by its own full-radix rule.
        fabric = registry.build_at(fabric_name, 1024, radix=64, gpus_per_server=8)
    else:
        fabric = registry.build(pd_setup.fabric_specs(spec, [fabric_name])[fabric_name])
    topo = pd_setup.topology(fabric, s["tp"])
    place = pd_setup.make_placement(topo, s)
    stream = rq.generate(rq.workload(s["workload"]), s["rate_per_s"], s["seed"],
                         count=s["requests"])
    planned = plan(topo, place, stream, SCALE, s["pairing"], s["prefill_ms_per_ktoken"],
                   s["seed"], s["path_strategy"],
                   lane_threshold_bytes=s["lane_threshold_gb"] * 1e9)
    return plan_digest(place, planned)


#: pd-inference (16 requests at 30/s, prefill 5 ms/1K), pd-failure and pd-pairing
#: (24 at 100/s, prefill 1 ms/1K), every fabric, every pairing, every path strategy.
INFERENCE = dict(requests=16, rate_per_s=30.0, prefill_ms_per_ktoken=5.0)
BUSY = dict(requests=24, rate_per_s=100.0, prefill_ms_per_ktoken=1.0)
CASES = {
    **{f"inference-{name}": (name, REFERENCE, INFERENCE)
       for name in pd_setup.FABRICS},
    **{f"failure-{name}": (name, REFERENCE, BUSY) for name in ("roft", "hpn", "zcube")},
    **{f"pairing-zcube-{p}": ("zcube", REFERENCE, {**BUSY, "pairing": p})
       for p in ("fixed", "random", "score", "sticky")},
    **{f"pairing-{name}-score": (name, REFERENCE, {**BUSY, "pairing": "score"})
       for name in ("roft", "railfly", "hpn", "rail-fabric")},
    **{f"strategy-zcube-{st}-{p}": ("zcube", REFERENCE, {**BUSY, "path_strategy": st,
                                                         "pairing": p})
       for st in ("request", "least-loaded") for p in ("fixed", "score")},
    "zone-zcube-sticky": ("zcube", REFERENCE, {**BUSY, "placement": "zone",
                                               "pairing": "sticky"}),
    "tile-4p4d-roft-random": ("roft", REFERENCE, {**BUSY, "tile": "4p4d",
                                                  "pairing": "random"}),
    "tile-5p3d-zcube-seed3": ("zcube", REFERENCE, {**BUSY, "tile": "5p3d", "seed": 3,
                                                   "pairing": "sticky"}),
    # 1,024 GPUs, TP 8: 25 tiles of 3P+2D and 3 flex, as in the text.
    "zcube-1024-tp8": ("zcube", "zcube,n=32,gpus_per_server=8",
                       {"tp": 8, "requests": 200, "rate_per_s": 100.0,
                        "prefill_ms_per_ktoken": 1.0}),
    **{f"{name}-1024-tp8": (name, "zcube,n=32,gpus_per_server=8",
                            {"tp": 8, "requests": 100, "rate_per_s": 100.0,
                             "prefill_ms_per_ktoken": 1.0})
       for name in ("roft", "railfly", "hpn", "rail-fabric")},
    "zcube-1024-tp8-score": ("zcube", "zcube,n=32,gpus_per_server=8",
                             {"tp": 8, "requests": 40, "rate_per_s": 100.0,
                              "prefill_ms_per_ktoken": 1.0, "pairing": "sticky",
                              "path_strategy": "request"}),
}

DIGESTS = {
    "failure-hpn": "8808e2f99a8ec2cf8b9a6fb5cbeb120e6fce19c03248b3f1ddb03ae9f4ab8e3c",
    "failure-roft": "b57d6494609563d4dd38cb3412349a095fafdfeba97afee92a11ad84845b5e8e",
    "failure-zcube": "5992098f8accb14037a849db5ab93e5d13b9c15e55cb617e404774f4e5444bf8",
    "hpn-1024-tp8": "11ade1d1c92862b9e465288655d4e5dc8ff8005b332948be966faa4eda258e54",
    "inference-hpn": "04db96e1deff4b0275a12d81582ab378329da397b13e9f4dc533fc73d4142f64",
    "inference-rail-fabric": "cfa891179ac0413c28a93d5aa639928f766dda814c2d910cf1f165bdceaec5d4",
    "inference-railfly": "c046cb1a3ba6b13a663a45a7a18642ed624d8141468532e57428efd10daeda75",
    "inference-roft": "bd8a82d5beb05ca35a6ec5c639140b2df615cf9fdf82f15a717a890275966108",
    "inference-zcube": "20609d24677ed7f6211784dfa8320e5fd7ade72f801c976acd4217f182012cf4",
    "pairing-hpn-score": "77cf3fa21d1a35ca74fbd16366b1c239fb02a25fa5b5cfbbce29a2262a2b98f3",
    "pairing-rail-fabric-score": "e155692812451dc1f94b1e3b5ffebb516124367e2cca45f3b670234008087e03",
    "pairing-railfly-score": "afe93d1952c98fac39db5f2c8c36ba8a31812e32ba6784385d713a70ae67af3b",
    "pairing-roft-score": "2d8e9d3e5b1beb553c6a54afb9814062eda340fd1b8463e1a50adac34efe1a79",
    "pairing-zcube-fixed": "5992098f8accb14037a849db5ab93e5d13b9c15e55cb617e404774f4e5444bf8",
    "pairing-zcube-random": "358c7264825857ce86026289c0503131f1bd875d589c2ab4efce67d3b3bc75dc",
    "pairing-zcube-score": "0e1cf900cef154fcbd6e215447c9db3d749b20d7e06f0a2f25ba59946f68a6e2",
    "pairing-zcube-sticky": "0e1cf900cef154fcbd6e215447c9db3d749b20d7e06f0a2f25ba59946f68a6e2",
    "rail-fabric-1024-tp8": "6d8759595180d6864b8483445d24a7530d1f05d72494523449463272cc34f40e",
    "railfly-1024-tp8": "b141161780df7652b6fe35ee706fac40299363f9ccaa8704ab0379564adf77c0",
    "roft-1024-tp8": "5e78a7606d62a1af25e89705fa74f458a1bb3b1a6444afb5b3f5727264982dff",
    "strategy-zcube-least-loaded-fixed":
        "ea6708d64faafb3cc41bea8cb523c17f634b6c1006b9e6ac08ea324207c641be",
    "strategy-zcube-least-loaded-score":
        "8ef8ea387ba9dba001a8ab8c8147ef7d53b067ab5fa7e819d97b1cfa9259dc2e",
    "strategy-zcube-request-fixed":
        "742340021b1d5ef2b76fda9faac0cf973fd75a0b5d74d07329af7bc655f5b618",
    "strategy-zcube-request-score":
        "3e6d067aa9f99c151ec4ae7154df95e6ecfcef323e0d961a652c436f4b0184a0",
    "tile-4p4d-roft-random": "f936c0318200c53caa93299e59bd4a7e473faf1b73f87a69d35535cb8aee731f",
    "tile-5p3d-zcube-seed3": "afb385cdbcbcc9367aa066c4727b83e15895f39405199f59d5f8f9773418a3ac",
    "zcube-1024-tp8": "130c6474cac4340b5fd4af12c408202b57d3528acdd1a5dbbabcbac929a45511",
    "zcube-1024-tp8-score": "faf851aa911dd891653893120153497ef13a5a7ae838f14cb0e687034bf57fd1",
    "zone-zcube-sticky": "972fb0100e3c81aa6b5089702b347d8e69a2473394c9c9b63a63b4e4d0d26c5f",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_output_unchanged(case):
    name, spec, overrides = CASES[case]
    assert run_config(name, spec, **overrides) == DIGESTS[case]


# ---------------------------------------------------------------- the fast paths vs the old rules
import random                                                        # noqa: E402
from collections import defaultdict                                  # noqa: E402

from topologies import zcube                                         # noqa: E402
from traffic import placement as pl                                  # noqa: E402
from traffic.pdplan import _Queues                                   # noqa: E402


def _old_swaps(order, roles, ports, n_p, n_d):
    """`_assign_roles`' swap loop as it was (every (a, b) pair in Python)."""
    target = n_p / (n_p + n_d)

    def move(node, role, sign):
        for switch, count in node.ports:
            ports[switch][0 if role == pl.P else 1] += sign * count

    improved = True
    while improved:
        improved = False
        for a in order:
            for b in order:
                if roles[a.id] != pl.P or roles[b.id] != pl.D:
                    continue
                touched = a.switches | b.switches
                before = pl._cost(ports, target, touched)
                move(a, pl.P, -1), move(b, pl.D, -1), move(a, pl.D, +1), move(b, pl.P, +1)
                if pl._cost(ports, target, touched) < before - 1e-9:
                    roles[a.id], roles[b.id] = pl.D, pl.P
                    improved = True
                else:
                    move(a, pl.D, -1), move(b, pl.P, -1), move(a, pl.P, +1), move(b, pl.D, +1)


@pytest.mark.parametrize("seed", range(40))
def test_swaps_are_the_old_loops_on_random_nodes(seed):
    rng = random.Random(seed)
    switches = [f"s{i}" for i in range(rng.randint(2, 12))]
    nodes = [pl.Node(i, (i,), ((f"h{i}",),),
                     tuple(sorted((s, rng.randint(1, 4)) for s in
                                  rng.sample(switches, rng.randint(1, min(4, len(switches)))))))
             for i in range(rng.randint(2, 30))]
    p, d = rng.choice([(3, 2), (5, 3), (1, 1), (2, 5)])
    n_p = max(1, round(len(nodes) * p / (p + d)))
    n_p = min(n_p, len(nodes) - 1)
    n_d = len(nodes) - n_p
    # A random (bad) start, so that many swaps happen.
    chosen = set(rng.sample(range(len(nodes)), n_p))
    roles = {n.id: pl.P if n.id in chosen else pl.D for n in nodes}
    ports = defaultdict(lambda: [0, 0])
    for node in nodes:
        for switch, count in node.ports:
            ports[switch][0 if roles[node.id] == pl.P else 1] += count
    old_roles, old_ports = dict(roles), defaultdict(lambda: [0, 0],
                                                    {k: list(v) for k, v in ports.items()})
    _old_swaps(nodes, old_roles, old_ports, n_p, n_d)
    pl._swap_roles(nodes, roles, ports, n_p, n_d)
    assert roles == old_roles


@pytest.mark.parametrize("spec,tp", [(REFERENCE, 2), ("roft,gpus=16,radix=8,gpus_per_server=2", 2),
                                     ("zcube,n=8,gpus_per_server=8", 4),
                                     ("zcube,n=32,gpus_per_server=8", 8)])
def test_hop_matrix_and_tiles_are_node_hops_pair_by_pair(spec, tp):
    topo = pd_setup.topology(registry.build(spec), tp)
    order = pl._hashed(topo.nodes, 1)
    hops = pl._hop_matrix(topo, order)
    sample = order if len(order) <= 40 else order[:: len(order) // 40]
    index = {node.id: i for i, node in enumerate(order)}
    for a in sample:
        for b in sample:
            assert hops[index[a.id], index[b.id]] == topo.node_hops(a.id, b.id)
    for tile in ((3, 2), (5, 3), (4, 4)):
        n_p, n_d, _ = pl._counts(topo, tile, None)
        rest = order[: n_p + n_d]
        roles = pl._assign_roles(rest, n_p, n_d)
        count = n_p // tile[0]
        assert pl._group_tiles(topo, rest, roles, tile, count) == \
            pl._group_tiles_pairwise(topo, rest, roles, tile, count)


def _brute(planned, arrival, prefill, decode):
    return ({p: sum(1 for x in planned if x.p == p and x.prefill_end_s > arrival)
             for p in prefill},
            {d: sum(1 for x in planned if x.d == d and x.prefill_end_s > arrival)
             for d in decode})


class _X:
    def __init__(self, p, d, end):
        self.p, self.d, self.prefill_end_s = p, d, end


@pytest.mark.parametrize("seed", range(30))
def test_queues_count_as_the_definition_even_out_of_arrival_order(seed):
    rng = random.Random(seed)
    prefill, decode = [1, 4, 7], [2, 3]
    queues, planned, arrival = _Queues(prefill, decode), [], 0.0
    for _ in range(60):
        arrival = arrival + rng.choice([0.0, 0.3, 1.0]) if rng.random() > 0.15 \
            else rng.uniform(0, arrival)                              # now and then earlier
        got = queues.at(arrival, planned)
        assert got == _brute(planned, arrival, prefill, decode)
        assert list(got[0]) == prefill and list(got[1]) == decode
        p, d = rng.choice(prefill + [9]), rng.choice(decode)          # 9: not a P (ignored)
        end = arrival + rng.choice([0.0, 0.5, 2.0, 5.0])
        planned.append(_X(p, d, end))
        queues.add(p, d, end)


def test_zcube_paths_index_matches_a_scan_and_follows_added_nodes():
    fabric = registry.build("zcube,n=4,k=3")
    for src, dst in [(0, 63), (5, 6), (17, 17), (40, 2)]:
        hosts = {}
        for host in fabric.hosts:
            data = fabric.graph.nodes[host]
            hosts.setdefault(data["gpu"], {})[data["nic_port"]] = host
        assert zcube._gpu_hosts(fabric, src) == tuple(hosts[src][k] for k in range(3))
        paths = zcube.paths(fabric, src, dst)
        assert paths[0][0] == hosts[src][0] and paths[1][0] == hosts[src][2]
    with pytest.raises(zcube.FabricError, match="no GPU 64"):
        zcube.paths(fabric, 0, 64)
    for port in range(3):                                             # GPU 64 appears
        fabric.add_host("gpu", gpu=64, nic_port=port)
    assert len(zcube._gpu_hosts(fabric, 64)) == 3


@pytest.mark.parametrize("seed", range(12))
def test_score_pairing_at_once_is_the_pair_by_pair_min(seed):
    from traffic.pairing import ClusterState, ScorePairs, Weights, _on_home
    rng = random.Random(seed)
    spec, tp = [(REFERENCE, 2), ("zcube,n=8,gpus_per_server=8", 4),
                ("roft,gpus=16,radix=8,gpus_per_server=2", 2)][seed % 3]
    topo = pd_setup.topology(registry.build(spec), tp)
    place = pl.tile_placement(topo, (3, 2), seed=seed)
    weights = Weights(*[rng.choice([0.0, 0.5, 1.0, 2, 3.7]) for _ in range(6)])
    chooser = ScorePairs(topo, place, weights=weights, sticky=bool(seed % 2))
    stream = rq.generate(rq.workload("cached-coding"), 3.0, seed, count=60)
    state, warm = ClusterState(), 0
    for request in stream:
        state.p_queue = {p: rng.choice([0, 1, 2, 0.5]) for p in place.prefill
                         if rng.random() < 0.7}
        state.d_queue = {d: rng.randint(0, 3) for d in place.decode}
        state.d_memory = {d: rng.choice([0.0, 0.25, 1.0]) for d in place.decode}
        state.d_streams = {d: rng.randint(0, 2) for d in place.decode}
        decode = place.decode if rng.random() < 0.7 else [rng.choice(place.decode)]
        fast = chooser._best_at_once(request, state, decode)
        _, p, d = min((chooser.score(request, state, p, d), p, d)
                      for p in chooser.prefill for d in decode)
        assert fast == (p, d)
        warm += _on_home(request, state, d)
        state.record(request, chooser.choose(request, state))
    assert warm                                       # D_home's delta KV and Acache scored
