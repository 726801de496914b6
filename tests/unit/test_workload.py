"""The RL workload model: rank layouts, rank placement, volume formulas, presets."""

import math
from collections import Counter

import pytest

from traffic.comms import AllReduce, AllToAll, Bipartite, Pipeline, Transfers, WeightSync
from traffic.ranks import (Parallelism, RankError, RankMap, fold, gen_grid, replica_rank,
                           train_grid)
from traffic.workload import (QWEN2_57B_A14B, QWEN25_14B, TABLE1, ComputeTimes, Model, RLConfig,
                              WorkloadError, build_iteration, gen_pod_replicas, preset,
                              qwen2_moe, qwen25_14b)

DENSE = Model("toy", params=1.2e9, layers=8, hidden=1024, heads=8, kv_heads=2, head_dim=128)
MOE = Model("toy-moe", params=4e9, layers=4, hidden=512, heads=8, kv_heads=2, head_dim=64,
            experts=16, top_k=2, expert_params=3e9)


def config(**kw):
    base = dict(model=DENSE, train=Parallelism(tp=2, pp=2, dp=2), gen=Parallelism(tp=2, dp=4),
                gpus_per_server=2, batch_prompts=4, responses_per_prompt=2, prompt_len=128,
                response_len=256, compute=ComputeTimes(1.0, 0.1, 1.5))
    base.update(kw)
    return RLConfig(**base)


def one(iteration, kind, index=0):
    specs = iteration.of_kind(kind)
    assert specs, f"no {kind} in {iteration.kinds()}"
    return specs[index]


def partition(groups, ranks):
    members = [r for g in groups for r in g]
    return sorted(members) == sorted(ranks) and len(members) == len(set(members))


# ---------------------------------------------------------------- layouts
def test_train_layout_is_megatron_order_tp_fastest_then_cp_dp_pp():
    grid = train_grid(Parallelism(tp=2, pp=2, dp=4, ep=2, cp=1))
    assert grid.coords(0) == {"tp": 0, "cp": 0, "ep": 0, "edp": 0, "pp": 0}
    assert grid.coords(1)["tp"] == 1 and grid.coords(2)["ep"] == 1 and grid.coords(4)["edp"] == 1
    assert grid.coords(8)["pp"] == 1
    assert grid.groups("tp")[0] == (0, 1)
    assert grid.groups("pp")[0] == (0, 8), "a pipeline lane: same tp/dp, stage 0 then 1"
    assert grid.groups("ep")[0] == (0, 2), "EP groups: consecutive DP indices"
    assert grid.groups("edp")[0] == (0, 4), "expert-DP: the same EP position in each block"
    assert grid.groups("cp", "ep", "edp")[0] == (0, 2, 4, 6)
    for axes in [("tp",), ("pp",), ("ep",), ("cp", "ep", "edp")]:
        assert partition(grid.groups(*axes), range(16)), f"{axes} groups must partition the ranks"


def test_gen_layout_replicas_of_tp_ranks_and_ep_blocks():
    grid = gen_grid(Parallelism(tp=4, dp=4, ep=2), offset=10)
    assert list(grid.ranks) == list(range(10, 26))
    assert [replica_rank(grid, r, 0) for r in range(4)] == [10, 14, 18, 22]
    assert grid.groups("tp")[1] == (14, 15, 16, 17)
    assert grid.groups("ep")[0] == (10, 14), "EP group: two consecutive replicas, same lane"
    with pytest.raises(RankError, match="only TP, DP and EP"):
        gen_grid(Parallelism(tp=2, pp=2, dp=2))


def test_parallelism_checks_name_the_field():
    with pytest.raises(RankError, match=r"train.tp must be an integer >= 1, got 0"):
        Parallelism(tp=0).check("train")
    with pytest.raises(RankError, match="ep=3 must divide dp=4"):
        Parallelism(dp=4, ep=3).check("train")


# ---------------------------------------------------------------- placement
def test_one_rank_per_host_when_there_are_enough():
    rank_map = RankMap.build(4, 4, 2, [f"h{i}" for i in range(10)])
    assert rank_map.hosts == tuple(f"h{i}" for i in range(8))
    assert rank_map.server(3) == 1 and not rank_map.on_network(2, 3)
    assert rank_map.on_network(1, 2), "ranks 1 and 2 are on two servers"


def test_folding_keeps_train_and_gen_on_their_own_hosts():
    rank_map = RankMap.build(24, 40, 8, ["t0", "t1", "t2", "t3"], ["g0", "g1", "g2", "g3"])
    assert Counter(rank_map.hosts) == {"t0": 6, "t1": 6, "t2": 6, "t3": 6,
                                       "g0": 10, "g1": 10, "g2": 10, "g3": 10}
    assert rank_map.host(5) == "t0" and rank_map.host(6) == "t1" and rank_map.host(24) == "g0"
    assert not rank_map.on_network(8, 10), "two ranks folded on t1 talk locally"
    assert fold(3, ["a", "b", "c", "d"]) == ["a", "b", "c"]


def test_a_flat_host_list_is_split_in_proportion_or_refused():
    rank_map = RankMap.build(24, 40, 8, [f"h{i}" for i in range(16)])
    assert set(rank_map.hosts[:24]) == {f"h{i}" for i in range(6)}
    assert set(rank_map.hosts[24:]) == {f"h{i}" for i in range(6, 16)}
    with pytest.raises(RankError, match="cannot be split 24:40"):
        RankMap.build(24, 40, 8, [f"h{i}" for i in range(10)])
    with pytest.raises(RankError, match="given to both Train and Gen"):
        RankMap.build(2, 2, 1, ["a", "b"], ["b", "c"])


# ---------------------------------------------------------------- train formulas
def test_train_dp_allreduce_per_rank_is_2_n_minus_1_over_n_params_bytes_over_tp_pp():
    cfg = config(train=Parallelism(tp=2, pp=2, dp=4), grad_bytes=4.0)
    dp = one(build_iteration(cfg), "train-dp")
    assert isinstance(dp, AllReduce) and dp.ops == cfg.optimizer_steps
    assert dp.bytes == pytest.approx(DENSE.params * 4.0 / (2 * 2))
    assert len(dp.groups) == 4 and all(len(g) == 4 for g in dp.groups)
    n = 4
    for rank, size in dp.sent_per_rank().items():
        assert size == pytest.approx(2 * (n - 1) / n * DENSE.params * 4.0 / 4), f"rank {rank}"


def test_train_tp_pp_volumes_and_counts():
    cfg = config()
    it = build_iteration(cfg)
    micro = math.ceil(cfg.seqs / (cfg.train.dp * cfg.micro_batch))
    tp = one(it, "train-tp")
    assert tp.bytes == cfg.micro_batch * cfg.seq_len * DENSE.hidden * cfg.act_bytes
    assert tp.ops == 4 * (DENSE.layers // cfg.train.pp) * micro, "2 fwd + 2 bwd per layer"
    pp = one(it, "train-pp")
    assert isinstance(pp, Pipeline) and pp.ops == micro and pp.backward
    assert pp.bytes == tp.bytes / cfg.train.tp, "b x s x h x beta split over the TP lanes"
    assert len(pp.chains) == cfg.train.tp * cfg.train.dp and all(len(c) == 2 for c in pp.chains)
    assert pp.bytes_per_op() == pytest.approx(2 * len(pp.chains) * pp.bytes), "fwd + bwd"


def test_tp_inside_a_server_is_off_the_network_unless_it_spans_servers():
    inside = config()                                     # TP=2 on servers of 2 GPUs
    it = build_iteration(inside)
    rank_map = inside.rank_map([f"h{i}" for i in range(inside.world)])
    assert it.network_bytes(rank_map, "train-tp") == 0
    assert it.network_bytes(rank_map, "gen-tp") == 0
    assert it.network_bytes(rank_map, "train-pp") > 0
    across = config(train=Parallelism(tp=4, pp=1, dp=2), gen=Parallelism(tp=4, dp=2))
    rank_map = across.rank_map([f"h{i}" for i in range(across.world)])
    it = build_iteration(across)
    tp = one(it, "train-tp")
    assert it.network_bytes(rank_map, "train-tp") == pytest.approx(
        tp.ops * len(tp.groups) * 2 * 2 * (3 / 4) * tp.bytes), \
        "a TP ring of 4 over 2 servers crosses the network twice"


def test_cp_and_ep_all_to_all():
    cfg = config(model=MOE, train=Parallelism(tp=2, pp=1, dp=4, ep=2, cp=2),
                 gen=Parallelism(tp=2, dp=4, ep=2), gpus_per_server=2)
    it = build_iteration(cfg)
    tokens = cfg.micro_batch * cfg.seq_len / 2
    micro = math.ceil(cfg.seqs / 4)
    cp = one(it, "train-cp")
    assert isinstance(cp, AllToAll) and cp.ops == 2 * MOE.layers * micro
    assert cp.bytes == pytest.approx(tokens * (2 * 512 + 2 * 128) * 2 / 2)
    ep = one(it, "train-ep")
    assert ep.bytes == pytest.approx(tokens / 2 * MOE.top_k * MOE.hidden * 2)
    assert ep.ops == 4 * MOE.layers * micro
    for rank, size in ep.sent_per_rank().items():
        assert size == pytest.approx(ep.bytes / 2), "(N-1)/N x S with N = EP = 2"
    dense, experts = it.of_kind("train-dp")
    assert dense.bytes == pytest.approx(MOE.dense_params * 2 / 2)
    assert experts.bytes == pytest.approx(MOE.expert_params * 2 / (2 * 2))
    assert all(len(g) == 8 for g in dense.groups), "DP x CP = 8 ranks reduce dense gradients"
    assert all(len(g) == 4 for g in experts.groups), "experts over DP/EP x CP = 4"


# ---------------------------------------------------------------- gen formulas
def test_gen_tp_prefill_and_decode():
    cfg = config()
    prefill, decode = build_iteration(cfg).of_kind("gen-tp")
    q = math.ceil(cfg.seqs / cfg.gen.dp)
    assert prefill.bytes == q * cfg.prompt_len * DENSE.hidden * 2 and prefill.ops == 2 * 8
    assert decode.bytes == q * DENSE.hidden * 2 and decode.ops == 2 * 8 * cfg.response_len


def test_gen_ep_all_to_all_for_moe():
    cfg = config(model=MOE, gen=Parallelism(tp=2, dp=4, ep=4))
    prefill, decode = build_iteration(cfg).of_kind("gen-ep")
    q = math.ceil(cfg.seqs / 4)
    assert decode.bytes == pytest.approx(q * MOE.top_k * MOE.hidden * 2 / 2)
    assert decode.ops == 2 * MOE.layers * cfg.response_len
    assert all(len(g) == 4 for g in decode.groups)


def test_pd_kv_bursts_go_lane_to_lane_from_prefill_to_decode():
    cfg = config(gen=Parallelism(tp=2, dp=4), pd_prefill=1, pd_decode=1)
    pd = one(build_iteration(cfg), "gen-pd")
    assert isinstance(pd, Transfers)
    kv = cfg.prompt_len * 2 * DENSE.layers * DENSE.kv_dim * cfg.act_bytes
    assert DENSE.kv_bytes_per_token(2) * cfg.prompt_len == kv
    grid = gen_grid(cfg.gen, offset=cfg.train.world)
    expected = {(replica_rank(grid, p, lane), replica_rank(grid, d, lane))
                for p, d in ((0, 1), (2, 3)) for lane in range(2)}
    assert {(s, d) for s, d, _ in pd.items} == expected
    assert {b for _, _, b in pd.items} == {kv / 2}, "1/TP of a request's KV per lane"
    assert pd.ops == math.ceil(cfg.seqs / 2), "one burst per request of a decode replica"
    assert TABLE1["gen-pd"].window == "Large"


def test_af_m2n_dispatch_and_combine():
    cfg = config(gen=Parallelism(tp=2, dp=4), af_attention=1, af_ffn=1)
    af = one(build_iteration(cfg), "gen-af")
    assert isinstance(af, Bipartite) and af.combine
    q = math.ceil(cfg.seqs / 2)
    assert af.bytes == pytest.approx(q * DENSE.hidden * 2 / (2 * 1))
    assert len(af.pairs) == 2 * 2, "two A/F blocks x two lanes"
    assert af.ops == DENSE.layers * cfg.response_len
    assert af.bytes_per_op() == pytest.approx(2 * 4 * af.bytes)


def test_pd_and_af_together_split_the_decode_side():
    # 4 replicas, P/D 1:1: prefill 0 and 2, decode 1 and 3; A/F 1:1 splits the
    # decode side: attention 1, FFN 3.
    cfg = config(gen=Parallelism(tp=2, dp=4), pd_prefill=1, pd_decode=1, af_attention=1,
                 af_ffn=1)
    it = build_iteration(cfg)
    grid = gen_grid(cfg.gen, offset=cfg.train.world)
    pd = one(it, "gen-pd")
    assert {(s, d) for s, d, _ in pd.items} == {
        (replica_rank(grid, 0, lane), replica_rank(grid, 1, lane)) for lane in range(2)}, \
        "the KV goes to the attention replica, which keeps it"
    assert pd.ops == cfg.seqs, "every request decodes on the one attention replica"
    af = one(it, "gen-af")
    assert af.pairs == tuple(((replica_rank(grid, 1, lane),), (replica_rank(grid, 3, lane),))
                             for lane in range(2))
    assert af.bytes == pytest.approx(cfg.seqs * DENSE.hidden * 2 / 2)
    response = one(it, "response")
    assert {s for s, _, _ in response.items} == {replica_rank(grid, 1, 0)}
    with pytest.raises(WorkloadError, match="af_attention \\+ af_ffn = 3 must divide the 2 "
                                            "decode replicas"):
        config(gen=Parallelism(tp=2, dp=4), pd_prefill=1, pd_decode=1, af_attention=1,
               af_ffn=2)


def test_with_af_the_m2n_is_the_decodes_expert_traffic():
    """A/F puts the experts on the FFN replicas: the decode's dispatch and combine
    are the M2N, never an all-to-all beside it.  With P/D the prefill replicas
    run whole layers, their EP all-to-all among themselves; without P/D the
    prefill's tokens take the M2N too."""
    moe = Model("moe", params=1e9, layers=4, hidden=1024, heads=8, kv_heads=2, experts=8,
                top_k=2, expert_params=6e8)
    both = build_iteration(config(model=moe, gen=Parallelism(tp=2, dp=4, ep=2),
                                  pd_prefill=1, pd_decode=1, af_attention=1, af_ffn=1))
    (ep,) = both.of_kind("gen-ep")
    grid = gen_grid(Parallelism(tp=2, dp=4, ep=2), offset=8)
    assert set(ep.groups) == {(replica_rank(grid, 0, lane), replica_rank(grid, 2, lane))
                              for lane in range(2)}, "the two prefill replicas, lane by lane"
    assert ep.ops == 2 * moe.layers, "prefill only"
    assert len(both.of_kind("gen-af")) == 1, "the decode's M2N"
    af_only = build_iteration(config(model=moe, gen=Parallelism(tp=2, dp=4, ep=2),
                                     af_attention=1, af_ffn=1))
    assert not af_only.of_kind("gen-ep")
    decode, prefill = af_only.of_kind("gen-af")
    assert (decode.ops, prefill.ops) == (moe.layers * 256, moe.layers)
    assert prefill.bytes == pytest.approx(decode.bytes * 128), "a prompt's tokens at once"
    plain = build_iteration(config(model=moe, gen=Parallelism(tp=2, dp=4, ep=2)))
    assert [s.ops for s in plain.of_kind("gen-ep")] == [2 * moe.layers, 2 * moe.layers * 256]


# ---------------------------------------------------------------- inter-stage
@pytest.mark.parametrize("pods", [1, 2, 4])
def test_weight_sync_sends_one_copy_per_gen_pod_then_broadcasts(pods):
    cfg = config(gen=Parallelism(tp=2, dp=4), gen_pods=pods, bytes_per_param=2.0)
    ws = one(build_iteration(cfg), "weight-sync")
    assert isinstance(ws, WeightSync)
    weights = DENSE.params * 2.0
    grid = gen_grid(cfg.gen, offset=cfg.train.world)
    into = Counter()
    for src, dst, size in ws.stage1:
        assert src < cfg.train.world <= dst, "stage 1 goes Train -> Gen"
        into[dst] += size
    roots = {replica_rank(grid, reps[0], lane) for reps in gen_pod_replicas(cfg)
             for lane in range(2)}
    assert set(into) == roots, "only the DP-0 replica of each Gen PoD receives from Train"
    for root in roots:
        assert into[root] == pytest.approx(weights / 2), "each DP-0 lane gets its shard once"
    assert sum(into.values()) == pytest.approx(pods * weights)
    senders = Counter(src for src, _, _ in ws.stage1)
    assert set(senders) == set(range(cfg.train.world)), "the whole Train DP group sends"
    replicas = 4 // pods
    assert len(ws.trees) == (pods * 2 if replicas > 1 else 0)
    for root, members, size in ws.trees:
        assert size == pytest.approx(weights / 2) and len(members) == replicas - 1
    assert ws.bytes_per_op() == pytest.approx(pods * weights + (4 - pods) * weights)


def test_weight_sync_shards_overlap_when_train_and_gen_tp_differ():
    cfg = config(train=Parallelism(tp=2, pp=2, dp=2), gen=Parallelism(tp=1, dp=8),
                 gpus_per_server=1)
    ws = one(build_iteration(cfg), "weight-sync")
    assert len({d for _, d, _ in ws.stage1}) == 1
    assert sum(b for _, _, b in ws.stage1) == pytest.approx(DENSE.params * 2)
    assert [b for _, _, b in ws.stage1] == pytest.approx([DENSE.params * 2 / 8] * 8), \
        "8 Train ranks, each a quarter of the tensors of half the layers, split over DP=2"


def test_response_stream_goes_from_each_replica_to_a_train_stage0():
    cfg = config()
    rs = one(build_iteration(cfg), "response")
    grid = gen_grid(cfg.gen, offset=cfg.train.world)
    tgrid = train_grid(cfg.train)
    assert [s for s, _, _ in rs.items] == [replica_rank(grid, r, 0) for r in range(4)]
    assert all(tgrid.coords(d)["pp"] == 0 and tgrid.coords(d)["tp"] == 0 for _, d, _ in rs.items)
    assert {b for _, _, b in rs.items} == {cfg.seq_len * 8.0}
    assert rs.ops == math.ceil(cfg.seqs / 4)


# ---------------------------------------------------------------- presets
def test_measured_preset_is_section_3():
    cfg = qwen25_14b()
    assert cfg.model is QWEN25_14B
    assert (cfg.train.world, cfg.gen.world, cfg.world) == (24, 40, 64)
    assert (cfg.train.pp, cfg.train.tp, cfg.train.dp) == (3, 8, 1)
    assert (cfg.gen.tp, cfg.gen.dp) == (8, 5)
    it = build_iteration(cfg)
    assert it.kinds() == ["train-tp", "train-pp", "weight-sync", "response", "gen-tp"]
    rank_map = cfg.rank_map([f"h{i}" for i in range(64)])
    assert it.network_bytes(rank_map, "train-tp") == 0 and it.network_bytes(rank_map, "gen-tp") == 0
    assert it.network_bytes(rank_map, "train-pp") > 0
    ws = one(it, "weight-sync")
    assert sum(b for _, _, b in ws.stage1) == pytest.approx(14.7e9 * 2)
    assert cfg.compute.train_s + cfg.compute.optimizer_s < cfg.compute.gen_s + 60 < 1260


def test_moe_preset_for_section_5():
    cfg = qwen2_moe()
    assert cfg.model is QWEN2_57B_A14B and cfg.world == 2048
    assert QWEN2_57B_A14B.expert_params == pytest.approx(49.3e9, rel=0.01)
    assert (cfg.train.dp, cfg.gen.dp) == (128, 256)
    kinds = build_iteration(qwen2_moe(64)).kinds()
    assert {"train-ep", "gen-ep", "train-dp", "weight-sync"} <= set(kinds)
    assert preset("qwen2-57b-a14b", gpus=64).world == 64


def test_presets_take_overrides_and_refuse_unknown_keys():
    assert preset("qwen2.5-14b", batch_prompts=4).batch_prompts == 4
    with pytest.raises(WorkloadError, match=r"unknown workload keys \['nope'\]"):
        qwen25_14b(nope=1)
    with pytest.raises(WorkloadError, match="unknown workload preset 'gpt'"):
        preset("gpt")


@pytest.mark.parametrize("kw,message", [
    (dict(train_gpus=10), "train_gpus=10 but train parallelism gives"),
    (dict(gpus_per_server=3), "not a whole number of servers"),
    (dict(gen_pods=5), "gen_pods=5 exceeds the 4 Gen replicas"),
    (dict(pd_prefill=1), "pd_prefill and pd_decode must both be 0"),
    (dict(af_attention=1, af_ffn=2), "af_attention \\+ af_ffn = 3 must divide gen.dp=4"),
    (dict(train=Parallelism(tp=2, pp=3, dp=2)), "train.pp=3 must divide"),
    (dict(compute=ComputeTimes(-1.0)), "compute.train_s must be"),
    (dict(batch_prompts=0), "batch_prompts must be an integer >= 1"),
])
def test_bad_configs_are_refused_by_name(kw, message):
    with pytest.raises(WorkloadError, match=message):
        config(**kw)


def test_dp_is_derived_from_the_gpu_split():
    cfg = config(train=Parallelism(tp=2, pp=2, dp=0), train_gpus=16)
    assert cfg.train.dp == 4 and cfg.train.world == 16
