"""Attention-FFN (A/F) disaggregation inside a generation instance (`traffic.generation`,
the testbed's assumption): the split's validation, the lane roles across a widening,
KV moves between attention lanes only, the M2N's closed forms, and the phases
(`traffic.phases.build_phases`) and control proxy that carry it."""

from collections import defaultdict

import pytest

from controllers.proxy_core import ControlProxy
from emu.experiments import orchestrrl as orl
from traffic import generation
from traffic.generation import (AFSplit, DecodeModel, GenerationError, LengthDist, PolicyParams,
                                kv_bytes_per_token, merge_order, parse_af, simulate,
                                weight_reshard)
from traffic.scale import Scale
from traffic.workload import Model

# A toy model: 2 layers, hidden 16, 2 KV heads x 4: 2 x 2 x 8 x 2 = 64 KV bytes per token.
TOY = Model("toy", params=1e6, layers=2, hidden=16, heads=2, kv_heads=2, head_dim=4)
PER_TOKEN = TOY.layers * TOY.hidden * 2.0       # L x h x beta: one way, one token
ONE_ONE = AFSplit(1, 1)


def consecutive(gpus, tp):
    return [tuple(range(i, i + tp)) for i in range(0, gpus, tp)]


def reference(policy, af, gpus=24, batch=96):
    """The reference case of decode.toml on the toy model, with or without A/F."""
    lengths, decode, params = generation.load_defaults()
    return simulate(gpus, batch, policy, params, decode, lengths, TOY, seed=0, prompt_len=64,
                    af=af)


# ---------------------------------------------------------------- the parameter
@pytest.mark.parametrize("text, expected", [("1:1", AFSplit(1, 1)), (" 1 : 3 ", AFSplit(1, 3)),
                                            ("3:1", AFSplit(3, 1)), ("off", None),
                                            ("OFF", None), ("0", None)])
def test_parse_af_reads_a_split_or_off(text, expected):
    assert parse_af(text) == expected


@pytest.mark.parametrize("text", ["1", "1:0", "0:1", "a:b", "1:1:1", "", "-1:1", "1.5:1", 3,
                                  None])
def test_parse_af_refuses_anything_else_naming_the_key_and_the_allowed_values(text):
    with pytest.raises(GenerationError, match=r"orchestrrl\.af must be 'A:F'.*'off' or '0'"):
        parse_af(text, "orchestrrl.af")


@pytest.mark.parametrize("split, tp, lanes", [((1, 1), 2, (1, 1)), ((1, 1), 4, (2, 2)),
                                              ((1, 1), 16, (8, 8)), ((1, 3), 4, (1, 3)),
                                              ((3, 1), 8, (6, 2)), ((2, 2), 2, (1, 1))])
def test_lanes_split_an_instance_into_attention_first_then_ffn(split, tp, lanes):
    assert AFSplit(*split).lanes(tp) == lanes


@pytest.mark.parametrize("split, tp", [((1, 1), 1), ((1, 1), 3), ((1, 3), 2), ((1, 2), 2),
                                       ((3, 1), 2)])
def test_a_split_that_leaves_a_fraction_or_no_lane_of_a_role_is_refused(split, tp):
    with pytest.raises(GenerationError, match=r"orchestrrl\.af=.* does not split an instance "
                                              rf"of TP {tp} into whole attention and FFN lanes"):
        AFSplit(*split).lanes(tp, "orchestrrl.af")


def test_simulate_refuses_a_split_that_does_not_fit_the_starting_tp():
    """(A split that fits tp fits its multiples, switch_tp among them.)"""
    lengths, decode, _ = generation.load_defaults()
    for params, split in ((PolicyParams(tp=2, switch_tp=4), AFSplit(1, 3)),
                          (PolicyParams(tp=4, switch_tp=8), AFSplit(3, 5))):
        with pytest.raises(GenerationError, match=rf"af={split} does not split an instance "
                                                  rf"of TP {params.tp} \(params\.tp\)"):
            simulate(24, 48, "switch", params, decode, lengths, TOY, af=split)
    with pytest.raises(GenerationError, match="af must be an AFSplit or None"):
        simulate(24, 48, "switch", PolicyParams(), decode, lengths, TOY, af="1:1")


def test_the_scenario_field_refuses_a_bad_split_naming_the_key():
    from emu.scenario import ScenarioError, load
    with pytest.raises(ScenarioError, match=r"key 'orchestrrl\.af': af must be 'A:F'"):
        load("orchestrrl", ["orchestrrl.af=half"])
    with pytest.raises(ScenarioError, match=r"orchestrrl\.af=1:3 does not split an instance "
                                            r"of TP 2 \(tp: 2-GPU servers\) into whole"):
        load("orchestrrl", ["orchestrrl.af=1:3"])


def test_the_default_scenario_loads_with_af_on():
    from emu.scenario import load
    scenario = load("orchestrrl")
    assert scenario.section["af"] == "1:1" and orl.FIELDS["af"].default == "1:1"
    assert orl.af_split(scenario.section) == ONE_ONE
    assert orl.af_split({"af": "off"}) is None


# ---------------------------------------------------------------- lane roles
@pytest.mark.parametrize("tp, split, merged", [(2, (1, 1), 2), (4, (1, 1), 2), (4, (1, 3), 3),
                                               (4, (3, 1), 2), (8, (1, 1), 2), (6, (1, 2), 2)])
def test_attention_lanes_stay_attention_after_a_lane_major_widening(tp, split, merged):
    """Position q of the wide instance is attention iff q < t' x a/(a+f), and holds lane
    l = q // m of an old instance: l < A exactly then."""
    af = AFSplit(*split)
    old = consecutive(tp * merged * 2, tp)
    new = merge_order(old, tp * merged)
    attention, _ = af.lanes(tp)
    wide_attention, _ = af.lanes(tp * merged)
    old_attention = {rank for instance in old for rank in instance[:attention]}
    new_attention = {rank for instance in new for rank in instance[:wide_attention]}
    assert new_attention == old_attention
    for instance in new:
        for q, rank in enumerate(instance):
            assert (q < tp * merged * af.attention / (af.attention + af.ffn)) == \
                (rank in old_attention)
    # Each role's weights are sharded over its own lanes: still nothing to move.
    for lanes in (slice(0, attention), slice(attention, tp)):
        wide = slice(lanes.start * merged, lanes.stop * merged)
        assert weight_reshard([i[lanes] for i in old], [i[wide] for i in new], 1e9) == []


# ---------------------------------------------------------------- moves
def test_kv_moves_only_between_attention_lanes_with_the_same_totals():
    with_af, without = reference("switch+rebalance", ONE_ONE), reference("switch+rebalance", None)
    assert [e.kind for e in with_af.events] == [e.kind for e in without.events]
    assert any(e.kind == "rebalance" for e in with_af.events)
    # TP 2 attention lanes: the even ranks; after the widening the same (lane 0 of each).
    for event, plain in zip(with_af.events, without.events):
        assert event.moves and all(m.src % 2 == 0 and m.dst % 2 == 0 for m in event.moves)
        assert event.weight_bytes == 0.0
        assert event.kv_bytes == pytest.approx(plain.kv_bytes)


def test_a_widening_moves_half_of_each_running_sequences_kv_to_the_other_attention_lane():
    """4 GPUs, TP 2 -> 4: instance (0, 1) holds sequence 2, (2, 3) sequence 3 when the
    short ones finish; the wide instance (0, 2, 1, 3) has attention lanes 0 and 2, so GPU
    2 fetches half of sequence 2's KV from GPU 0 and GPU 0 half of 3's from GPU 2."""
    params = PolicyParams(tp=2, switch_tp=4, switch_below=0.5)
    decode = DecodeModel(fixed_s=0.0, weights_s=1.0, seq_s=1.0, comm_s=0.0)
    step = simulate(4, 4, "switch", params, decode, LengthDist(), TOY, prompt_len=6,
                    lengths_list=[10, 10, 100, 100], af=ONE_ONE)
    (event,) = step.events
    kv = (6 + 10) * kv_bytes_per_token(TOY, 2.0)
    assert {(m.src, m.dst): m.bytes for m in event.moves} == {(0, 2): kv / 2, (2, 0): kv / 2}
    assert step.segments[1].instances == [(0, 2, 1, 3)]
    assert step.segments[1].attention_lanes == 2


def test_a_rebalance_moves_each_sequences_kv_on_the_attention_lanes_only():
    """Per (donor, receiver) instance pair, the A/F rebalance moves what the plain one
    moves over all its lanes, on attention lane 0 alone (one attention lane at TP 2)."""
    with_af, without = reference("switch+rebalance", ONE_ONE), reference("switch+rebalance", None)
    for event, plain in zip(with_af.events, without.events):
        if event.kind != "rebalance" or event.tp_from != 2:
            continue
        by_instances = defaultdict(float)
        for move in plain.moves:
            by_instances[move.src // 2, move.dst // 2] += move.bytes
        assert {(m.src // 2, m.dst // 2): m.bytes for m in event.moves} == \
            pytest.approx(dict(by_instances))
        assert len(event.moves) == len(by_instances)


# ---------------------------------------------------------------- the M2N
def test_segments_carry_the_m2n_and_the_attention_all_reduce_by_their_closed_forms():
    with_af, without = reference("switch", ONE_ONE), reference("switch", None)
    assert with_af.compute_s == without.compute_s, "T(t, b) is unchanged under A/F"
    assert len(with_af.segments) == 2
    for seg, plain in zip(with_af.segments, without.segments):
        tokens = [b / (2 * PER_TOKEN) for b in plain.tp_bytes]    # plain: 2 L h beta / token
        attention = seg.tp // 2
        assert seg.attention_lanes == attention
        assert seg.af_bytes == pytest.approx([PER_TOKEN * t for t in tokens])
        assert seg.af_ops == [ops // 2 for ops in plain.tp_ops]   # L x steps
        # The attention lanes' own all-reduce, one per layer: none with one lane.
        expected = [PER_TOKEN * t if attention > 1 else 0.0 for t in tokens]
        assert seg.tp_bytes == pytest.approx(expected)
        assert seg.tp_ops == seg.af_ops
        for i, instance in enumerate(seg.instances):
            assert seg.tp_group(i) == instance[:attention]
            pairs = seg.af_pairs(i)
            assert len(pairs) == 2 * attention * (seg.tp - attention)
            attention_lanes, ffn_lanes = set(instance[:attention]), set(instance[attention:])
            dispatch = [p for p in pairs if p[0] in attention_lanes]
            combine = [p for p in pairs if p[0] in ffn_lanes]
            assert all(d in ffn_lanes for _, d, _ in dispatch)
            assert all(d in attention_lanes for _, d, _ in combine)
            share = seg.af_bytes[i] / (attention * (seg.tp - attention))
            assert all(size == pytest.approx(share) for _, _, size in pairs)
            assert sum(size for _, _, size in dispatch) == pytest.approx(seg.af_bytes[i])
    # Every generated token goes through the M2N once each way.
    assert with_af.af_bytes() == pytest.approx(2 * PER_TOKEN * with_af.tokens)
    assert without.af_bytes() == 0.0 and without.to_dict()["af"] is None
    assert with_af.to_dict()["af"] == "1:1"


# ---------------------------------------------------------------- the phases, the proxy
def _schedule_48(policy, af):
    settings = {k: f.default for k, f in orl.FIELDS.items()}
    cfg = orl.emulated_config(settings, 48, 2)
    step = orl.generation_step(cfg, policy, 0, af)
    hosts = [f"h{i + 1}" for i in range(48)]
    return cfg, step, orl.schedule_for(cfg, step, hosts, Scale(), 4)


def test_with_af_the_m2n_replaces_gen_ep_and_stays_inside_the_servers_at_tp_2():
    _, step, sched = _schedule_48("static", ONE_ONE)
    kinds = {p.kind for p in sched.phases}
    assert "gen-ep" not in kinds and "gen-af" not in kinds, \
        "TP-2 instances are one server each: the M2N never reaches the network"
    assert sched.off_network["gen-af"] == pytest.approx(step.af_bytes())
    _, _, plain = _schedule_48("static", None)
    assert "gen-ep" in {p.kind for p in plain.phases} and "gen-af" not in plain.off_network


def test_after_the_widening_the_m2n_crosses_servers_as_a_riding_phase_after_its_config():
    cfg, step, sched = _schedule_48("switch", ONE_ONE)
    names = [p.name for p in sched.phases if p.kind in ("gen-config", "gen-af")]
    assert names == ["gen-config1-tp4", "gen-af1-tp4"]
    m2n, config = sched.phase("gen-af1-tp4"), sched.phase("gen-config1-tp4")
    assert (m2n.stage, m2n.window) == ("gen", "Small")
    assert m2n.after == ("gen-config1-tp4",) and m2n.gaps == (("gen-config1-tp4", 0.0),)
    assert m2n.start_s == config.start_s
    assert {f.group for f in m2n.dag.flows} == {"gen-af"}
    seg = step.segments[1]
    # Wide instance (a0, b0, a1, b1) over two servers: attention a0, b0; of the 4 pairs,
    # a0-b1 and b0-a1 cross, each way: af_bytes of the instance on the network.
    assert m2n.real_bytes == pytest.approx(sum(seg.af_bytes))
    assert sched.off_network["gen-af"] == pytest.approx(step.af_bytes() - sum(seg.af_bytes))
    offset = cfg.train.world
    attention_hosts = {f"h{offset + r + 1}" for i in range(len(seg.instances))
                       for r in seg.tp_group(i)}
    decode = [f for f in config.dag.flows if f.group == "gen-config"]
    assert decode and {h for f in decode for h in (f.src, f.dst)} <= attention_hosts, \
        "the decode all-reduce runs over the attention lanes only"
    weight_sync = sched.phase("weight-sync")
    assert weight_sync.gaps[0][0] == "gen-af1-tp4", "the sync owes the compute after the M2N"


def test_the_control_proxy_asks_no_circuits_for_the_m2n():
    from topologies import registry
    from emu.scenario import load
    scenario = load("orchestrrl")
    fabric = registry.build(scenario.config["fabric"]["spec"])
    cfg = orl.emulated_config(scenario.section, 48, 2)
    step = orl.generation_step(cfg, "switch", 0, ONE_ONE)
    sched = orl.schedule_for(cfg, step, fabric.hosts, Scale(), 4)
    m2n, config = sched.phase("gen-af1-tp4"), sched.phase("gen-config1-tp4")
    for mode in ("proactive", "reactive"):
        proxy = ControlProxy(fabric, mode=mode)
        for iteration in (1, 2):
            proxy.begin_iteration(10.0 * iteration)
            proxy.phase_started(config.name, config.kind, 10.0 * iteration, config.pairs())
            proxy.phase_ended(config.name, 10.0 * iteration + 1)
            decision = proxy.phase_started(m2n.name, m2n.kind, 10.0 * iteration + 1,
                                           m2n.pairs())
            assert decision.requests == [] and not decision.blocking and decision.wait_s == 0
            assert proxy.cache[m2n.name].name == "rides" and proxy.cache[m2n.name].ocs == []
            proxy.phase_ended(m2n.name, 10.0 * iteration + 2)
            proxy.end_iteration(10.0 * iteration + 3)
        assert not [r for r in proxy.reconfigs if r.phase == m2n.name]
        assert any(r.phase == config.name for r in proxy.reconfigs), "the config still gets some"
