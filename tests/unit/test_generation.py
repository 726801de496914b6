"""OrchestrRL's generation step: lengths, decode time, resharding moves, the policies."""

import json
import math
import time
from collections import defaultdict

import numpy as np
import pytest

from traffic import generation
from traffic.generation import (POLICIES, DecodeModel, GenerationError, LengthDist, Move,
                                PolicyParams, kv_bytes_per_token, kv_reshard, load_defaults,
                                merge_groups, merge_order, simulate, split_order,
                                weight_reshard)
from traffic.workload import QWEN25_14B, Model

# A toy model: 2 layers, hidden 16, 2 KV heads x 4: 2 x 2 x 8 x 2 = 64 KV bytes per token.
TOY = Model("toy", params=1e6, layers=2, hidden=16, heads=2, kv_heads=2, head_dim=4)
TOY_KV = 64
# T(t, b) = (1 + b) / t with no comm: hand-checkable step times.
UNIT = DecodeModel(fixed_s=0.0, weights_s=1.0, seq_s=1.0, comm_s=0.0)


def received(moves):
    """Bytes each destination GPU receives."""
    total = defaultdict(float)
    for move in moves:
        total[move.dst] += move.bytes
    return dict(total)


def consecutive(gpus, tp):
    return [tuple(range(i, i + tp)) for i in range(0, gpus, tp)]


# ---------------------------------------------------------------- lengths
def test_sampler_is_seeded():
    dist = LengthDist()
    assert dist.sample(200, seed=7) == dist.sample(200, seed=7)
    assert dist.sample(200, seed=7) != dist.sample(200, seed=8)


def test_sampler_is_the_rounded_clipped_lognormal():
    dist = LengthDist(median=300, sigma=0.8, min_len=20, max_len=900)
    raw = np.random.default_rng(3).lognormal(math.log(300), 0.8, size=500)
    expected = np.clip(np.rint(raw), 20, 900).astype(int).tolist()
    assert dist.sample(500, seed=3) == expected


def test_sampler_clips_to_the_bounds():
    dist = LengthDist(median=100, sigma=2.0, min_len=30, max_len=200)
    lengths = dist.sample(2000, seed=0)
    assert min(lengths) == 30 and max(lengths) == 200          # sigma 2 reaches both
    assert all(isinstance(n, int) for n in lengths)


@pytest.mark.parametrize("kwargs, field", [
    ({"median": 0}, "lengths.median"),
    ({"sigma": -0.5}, "lengths.sigma"),
    ({"min_len": 0}, "lengths.min_len"),
    ({"min_len": 100, "max_len": 10}, "lengths.max_len"),
    ({"median": 2.5}, "lengths.median"),
])
def test_length_validation_names_the_field(kwargs, field):
    with pytest.raises(GenerationError, match=field):
        LengthDist(**kwargs)


@pytest.mark.parametrize("count, seed, name", [(-1, 0, "count"), (5, -2, "seed"),
                                               (2.0, 0, "count")])
def test_sample_arguments_are_checked(count, seed, name):
    with pytest.raises(GenerationError, match=name):
        LengthDist().sample(count, seed)


# ---------------------------------------------------------------- decode time
def test_step_time_formula_on_hand_values():
    model = DecodeModel(fixed_s=0.001, weights_s=0.008, seq_s=0.0002, comm_s=0.0005)
    # 1 ms + 8/4 ms + 0.2 x 10/4 ms + 0.5 x 10 x 3/4 ms
    assert model.step_s(4, 10) == pytest.approx(0.001 + 0.002 + 0.0005 + 0.00375)
    assert model.step_s(1, 3) == pytest.approx(0.001 + 0.008 + 0.0006)   # no comm at TP 1
    assert model.step_s(8, 0) == 0.0


def test_crossover_is_the_closed_form():
    model = DecodeModel(fixed_s=0.002, weights_s=0.009, seq_s=0.0001, comm_s=0.0004)
    assert model.crossover_batch(2, 4) == pytest.approx(0.009 / (2 * 0.0004))
    assert DecodeModel(comm_s=0.0).crossover_batch(1, 8) == math.inf


@pytest.mark.parametrize("tp, wide", [(1, 2), (1, 8), (2, 4), (2, 8), (4, 8)])
def test_crossover_against_brute_force(tp, wide):
    model = DecodeModel(fixed_s=0.0013, weights_s=0.0097, seq_s=0.00011, comm_s=0.00023)
    merged = wide // tp
    # Batches that split evenly: m TP-tp instances of k sequences vs one wide of m x k.
    wide_faster = [model.step_s(wide, merged * k) < model.step_s(tp, k) for k in range(1, 400)]
    first_slower = wide_faster.index(False) + 1
    assert all(wide_faster[:first_slower - 1])
    assert not any(wide_faster[first_slower - 1:])
    assert merged * (first_slower - 1) < model.crossover_batch(tp, wide) <= merged * first_slower


def test_crossover_needs_a_wider_multiple():
    with pytest.raises(GenerationError, match="wide_tp"):
        DecodeModel().crossover_batch(2, 2)
    with pytest.raises(GenerationError, match="wide_tp"):
        DecodeModel().crossover_batch(2, 5)


def test_decode_validation_names_the_field():
    with pytest.raises(GenerationError, match="decode.comm_s"):
        DecodeModel(comm_s=-1.0)
    with pytest.raises(GenerationError, match="decode.fixed_s"):
        DecodeModel(fixed_s=0.0, weights_s=0.0, seq_s=0.0)


# ---------------------------------------------------------------- layouts and moves
def test_merge_order_is_lane_major():
    assert merge_order([(0, 1), (2, 3)], 4) == [(0, 2, 1, 3)]
    assert merge_order([(0,), (1,), (2,), (3,)], 4) == [(0, 1, 2, 3)]
    assert merge_order(consecutive(8, 2), 8) == [(0, 2, 4, 6, 1, 3, 5, 7)]


@pytest.mark.parametrize("old_tp, new_tp", [(2, 4), (1, 4), (1, 2), (2, 8)])
def test_widening_in_merge_order_moves_no_weights(old_tp, new_tp):
    old = consecutive(16, old_tp)
    assert weight_reshard(old, merge_order(old, new_tp), 1e9) == []


def test_widening_in_rank_order_would_move_weights():
    # Why merge_order: GPU 1 at position 1 of (0, 1, 2, 3) needs [1/4, 1/2), held by lane 0;
    # GPU 2 at position 2 needs [1/2, 3/4), held by lane 1.
    moves = weight_reshard(consecutive(4, 2), consecutive(4, 4), 1000.0)
    assert received(moves) == {1: 250.0, 2: 250.0}
    assert {(m.src, m.dst) for m in moves} == {(0, 1), (1, 2)}     # from inside the new one


def test_split_order_inverts_merge_order():
    assert split_order([(0, 1, 2, 3)], 2) == [(0, 2), (1, 3)]
    old = consecutive(16, 2)
    assert split_order(merge_order(old, 8), 2) == old


@pytest.mark.parametrize("old_tp, new_tp", [(4, 2), (8, 2), (4, 1)])
def test_narrowing_moves_the_closed_form_per_gpu(old_tp, new_tp):
    weights = 28e9
    old = consecutive(16, old_tp)
    moves = weight_reshard(old, split_order(old, new_tp), weights)
    per_gpu = weights * (1 / new_tp - 1 / old_tp)
    assert received(moves) == pytest.approx({g: per_gpu for g in range(16)})
    assert all(m.src != m.dst and m.bytes > 0 for m in moves)
    # A split GPU fetches from its own old instance: nobody else holds a nearer copy.
    assert all(m.src // old_tp == m.dst // old_tp for m in moves)


def test_narrowing_in_rank_order_moves_more():
    # (0, 1, 2, 3) -> (0, 1), (2, 3): GPU 1 needs [1/2, 1) and held [1/4, 1/2).
    moves = weight_reshard([(0, 1, 2, 3)], consecutive(4, 2), 1000.0)
    assert received(moves) == {0: 250.0, 1: 500.0, 2: 500.0, 3: 250.0}


@pytest.mark.parametrize("old_tp, merged", [(1, 2), (1, 4), (2, 2), (2, 4)])
def test_kv_widening_moves_m_minus_1_over_m(old_tp, merged):
    kv = 1.2e6
    old = consecutive(old_tp * merged, old_tp)
    new = merge_order(old, old_tp * merged)[0]
    for instance in old:
        moves = kv_reshard(instance, new, kv)
        assert sum(m.bytes for m in moves) == pytest.approx(kv * (merged - 1) / merged)
        assert all(m.src != m.dst and m.bytes > 0 for m in moves)
        # Every new lane outside the old instance gets its 1/t' slice from the old lanes.
        outside = [g for g in new if g not in instance]
        assert received(moves) == pytest.approx({g: kv / len(new) for g in outside})


def test_layouts_must_be_uniform_and_disjoint():
    with pytest.raises(GenerationError, match="same TP size"):
        weight_reshard([(0, 1), (2,)], [(0, 1, 2)], 1.0)
    with pytest.raises(GenerationError, match="share GPUs"):
        weight_reshard([(0, 1), (1, 2)], [(0, 1, 2, 3)], 1.0)
    with pytest.raises(GenerationError, match="new_tp"):
        merge_order([(0, 1), (2, 3)], 3)


def test_kv_per_token_is_the_models():
    assert kv_bytes_per_token(TOY, 2.0) == TOY_KV
    assert kv_bytes_per_token(QWEN25_14B, 2.0) == 48 * 2 * 8 * 128 * 2


# ---------------------------------------------------------------- the policies by hand
# 4 GPUs at TP 1, 8 sequences round-robin: instance 0 has lengths 2, 2; 1 has 3, 6; 2 has
# 10, 4; 3 has 10, 10.  T(1, b) = 1 + b: the finishes are at 6, 6 (instance 0), 9, 15
# (1), 12, 24 (2), 30, 30 (3).
HAND_LENGTHS = [2, 3, 10, 10, 2, 6, 4, 10]


def hand_step(policy, **policy_kw):
    params = PolicyParams(**dict(dict(tp=1, switch_tp=2, switch_below=0.5), **policy_kw))
    return simulate(4, 8, policy, params, UNIT, LengthDist(), TOY, prompt_len=10,
                    lengths_list=HAND_LENGTHS)


def test_static_has_no_events_and_ends_at_the_last_finish():
    step = hand_step("static")
    assert step.events == [] and len(step.segments) == 1
    assert step.compute_s == 30.0
    assert step.segments[0].steps == 10
    assert step.segments[0].tp_ops == [2 * 2 * n for n in (2, 6, 10, 10)]
    assert step.tokens == sum(HAND_LENGTHS)
    assert step.throughput() == sum(HAND_LENGTHS) / 30.0


def test_switch_happens_at_the_barrier_after_the_threshold():
    step = hand_step("switch")
    # The 4th finish (instance 2 at 12) leaves 4 <= 0.5 x 8 running; instance 1 is then
    # inside its step 11 -> 13 (1 sequence, T = 2), so the barrier ends at 13.
    [event] = step.events
    assert (event.kind, event.at_s, event.tp_from, event.tp_to) == ("switch", 13.0, 1, 2)
    assert event.requests_moved == 4
    assert event.weight_bytes == 0.0                              # merge_order: a widening
    # Running counts [0, 1, 1, 2]; busiest first (ties in rank order) 3, 1, 2, 0; the snake
    # draft gives group 0 instance 3, group 1 instances 1 and 2, group 0 instance 0: the
    # busiest (3) merges with the idle 0 -> (3, 0), and 1 with 2 -> (1, 2).
    # Instance 1's survivor has 5 tokens, the three others 4: half of each KV moves, to
    # the merged partner: GPU 0 from 3 (its two sequences; 0 had none), GPU 2 from 1,
    # GPU 1 from 2.
    assert event.kv_bytes == pytest.approx((10 + 5 + 3 * (10 + 4)) * TOY_KV / 2)
    assert sorted((m.src, m.dst, m.bytes) for m in event.moves) == [
        (1, 2, 15 * TOY_KV / 2), (2, 1, 14 * TOY_KV / 2), (3, 0, 2 * 14 * TOY_KV / 2)]
    first, second = step.segments
    assert (first.start_s, first.compute_s, first.steps, first.running_at_start) == (0, 13, 5, 8)
    assert first.tp_ops == [2 * 2 * n for n in (2, 5, 4, 4)]
    assert first.tp_bytes == [0.0] * 4                            # TP 1: no all-reduce
    # At TP 2, T = (1 + b) / 2: (3, 0) runs its 2 sequences of 6 tokens left 6 steps of
    # T(2, 2) = 1.5 = 9; (1, 2) runs 2 for 1 step (1.5), then the 5 left of instance 2's
    # sequence alone at T(2, 1) = 1: 6.5.  Tokens: 12 and 1 + 6 = 7.
    assert second.instances == [(3, 0), (1, 2)]
    assert (second.start_s, second.compute_s, second.steps) == (13.0, 9.0, 6)
    assert second.running_at_start == 4
    assert second.tp_ops == [2 * 2 * 6, 2 * 2 * 6]
    assert second.tp_bytes == [2 * 2 * 16 * 2.0 * tokens for tokens in (12, 7)]
    assert step.compute_s == 22.0                 # consecutive merging, (0, 1) + (2, 3): 25
    assert step.moved_bytes("switch") == pytest.approx(event.kv_bytes)
    assert step.moved_bytes("rebalance") == 0.0


def test_switch_merges_the_busiest_instances_gpus_with_the_idlest():
    # 8 GPUs at TP 2 -> 4, UNIT decode (T(2, b) = (1 + b) / 2, T(4, b) = (1 + b) / 4), 8
    # sequences round-robin: instance 0 (GPUs 0, 1) has 2, 2; 1 (2, 3) has 3, 30; 2 (4, 5)
    # has 30, 30; 3 (6, 7) has 3, 30.  Instance 0 finishes both at 2 x 1.5 = 3, instances
    # 1 and 3 their short one at 3 x 1.5 = 4.5: the 4th finish, 4 <= 0.5 x 8 running, and
    # every instance with work ends a step at 4.5 (steps of 1.5): the switch is there.
    params = PolicyParams(tp=2, switch_tp=4, switch_below=0.5)
    step = simulate(8, 8, "switch", params, UNIT, LengthDist(), TOY, prompt_len=10,
                    lengths_list=[2, 3, 30, 3, 2, 30, 30, 30])
    [event] = step.events
    assert (event.kind, event.at_s, event.tp_from, event.tp_to) == ("switch", 4.5, 2, 4)
    # Running counts [0, 1, 2, 1]: busiest first 2, 1, 3, 0; group 0 takes 2 and then 0
    # (the busiest with the idlest), group 1 takes 1 and 3.  Lane-major (merge_order):
    # (4, 0, 5, 1) and (2, 6, 3, 7).
    first, second = step.segments
    assert first.instances == consecutive(8, 2)
    assert second.instances == [(4, 0, 5, 1), (2, 6, 3, 7)]
    assert set(second.instances[0]) == set(first.instances[2]) | set(first.instances[0])
    assert event.weight_bytes == 0.0
    # KV: each old instance's two lanes keep their quarter; the quarters [1/4, 1/2) and
    # [3/4, 1) go lane to lane to the partner's GPUs.  Each survivor has 3 tokens:
    # (10 + 3) x 64 per sequence; instance 2 has two, 1 and 3 one each.
    quarter = (10 + 3) * TOY_KV / 4
    assert sorted((m.src, m.dst, m.bytes) for m in event.moves) == [
        (2, 6, quarter), (3, 7, quarter), (4, 0, 2 * quarter), (5, 1, 2 * quarter),
        (6, 2, quarter), (7, 3, quarter)]
    # Two sequences of 27 tokens left in each wide instance: 27 steps of T(4, 2) = 0.75.
    assert (second.start_s, second.compute_s, second.steps) == (4.5, 20.25, 27)
    assert step.compute_s == 24.75


def test_switch_to_the_same_tp_is_no_event():
    assert hand_step("switch", switch_tp=1).events == []


# 8 GPUs at TP 2, 16 sequences: instance 0 holds four of 100 tokens, instance 1 one of 100
# and three of 2, instances 2 and 3 four of 2.  T(2, b) = 1 + b again.
REBALANCE_LENGTHS = [100, 100, 2, 2] + [100, 2, 2, 2] * 3


def test_rebalance_moves_kv_lane_to_lane_until_counts_are_within_one():
    decode = DecodeModel(fixed_s=0.0, weights_s=2.0, seq_s=2.0, comm_s=0.0)
    params = PolicyParams(tp=2, switch_tp=2, rebalance_every=4, max_rebalances=8)
    step = simulate(8, 16, "switch+rebalance", params, decode, LengthDist(), TOY,
                    prompt_len=10, lengths_list=REBALANCE_LENGTHS)
    # Checks every 4 x T(2, 4) = 20: at 20 the counts are [4, 1, 0, 0], 4 > 1.5 x 2.5.
    # Instance 0 ends its 4th step and instance 1 its 7th at 20: no wait.  Afterwards
    # [2, 1, 1, 1] has 2 > 1.5 x 1.25 but cannot even out further: no second event.
    [event] = step.events
    assert (event.kind, event.at_s, event.tp_from, event.tp_to) == ("rebalance", 20.0, 2, 2)
    assert event.requests_moved == 2 and event.weight_bytes == 0.0
    half_kv = (10 + 4) * TOY_KV / 2                               # one lane of one sequence
    assert sorted((m.src, m.dst, m.bytes) for m in event.moves) == [
        (0, 4, half_kv), (0, 6, half_kv), (1, 5, half_kv), (1, 7, half_kv)]
    # Counts [2, 1, 1, 1]: tokens of the last segment are count x tokens left.
    last = step.segments[-1]
    tokens = [b / (2 * 2 * 16 * 2.0) for b in last.tp_bytes]
    assert tokens == [2 * 96, 93, 96, 96]
    assert step.compute_s == 20.0 + 96 * 3                        # instance 0: 96 steps of T(2, 2)
    assert step.compute_s < hand_rebalance_static()


def hand_rebalance_static():
    decode = DecodeModel(fixed_s=0.0, weights_s=2.0, seq_s=2.0, comm_s=0.0)
    step = simulate(8, 16, "static", PolicyParams(tp=2, switch_tp=2), decode, LengthDist(),
                    TOY, lengths_list=REBALANCE_LENGTHS)
    assert step.compute_s == 100 * 5.0                            # 100 steps of T(2, 4)
    return step.compute_s


def test_rebalance_after_a_switch_moves_the_least_generated_first():
    # 4 GPUs at TP 1 -> 2, 12 sequences round-robin: instance 0 runs 20, 2, 2; 1 runs 20,
    # 2, 2; 2 runs 20, 1, 1; 3 runs 20, 20, 20.  (8 sequences, 2 per instance, no longer
    # rebalance after a switch at 4 running: the snake draft pairs counts such as
    # [2, 1, 1, 0] as 2 + 0 and 1 + 1.)
    params = PolicyParams(tp=1, switch_tp=2, switch_below=0.5, rebalance_every=1,
                          imbalance=1.25, max_rebalances=1)
    step = simulate(4, 12, "switch+rebalance", params, UNIT, LengthDist(), TOY, prompt_len=10,
                    lengths_list=[20, 20, 20, 20, 2, 2, 1, 20, 2, 2, 1, 20])
    switch, rebalance = step.events
    # T(1, 3) = 4: instance 2's short ones finish at 4, instances 0's and 1's at 8: the
    # 6th finish, 6 <= 0.5 x 12 running.  Instance 2 runs alone at T(1, 1) = 2 from 4 and
    # ends a step at 8 too: no wait.  The check at 4 (every T(1, 3)) saw [3, 3, 1, 3]:
    # 3 is not > 1.25 x 2.5.
    assert (switch.kind, switch.at_s, switch.requests_moved) == ("switch", 8.0, 6)
    first = step.segments[0]
    assert (first.compute_s, first.steps) == (8.0, 3)
    assert first.tp_ops == [2 * 2 * n for n in (2, 2, 3, 2)]
    # Running [1, 1, 1, 3]: busiest first 3, 0, 1, 2 (ties in rank order); group 0 takes
    # 3 then 2, group 1 takes 0 then 1: (3, 2) and (0, 1).  Instance 2's survivor has 3
    # tokens, every other 2: GPU 2 gets half of instance 3's three KVs, GPU 3 half of
    # instance 2's one, GPUs 0 and 1 swap halves.
    assert step.segments[1].instances == [(3, 2), (0, 1)]
    assert switch.kv_bytes == pytest.approx((3 * 12 + 13 + 12 + 12) * TOY_KV / 2)
    assert sorted((m.src, m.dst, m.bytes) for m in switch.moves) == [
        (0, 1, 12 * TOY_KV / 2), (1, 0, 12 * TOY_KV / 2), (2, 3, 13 * TOY_KV / 2),
        (3, 2, 3 * 12 * TOY_KV / 2)]
    # (3, 2) holds 4 sequences, (0, 1) 2: 4 > 1.25 x 3.  The check after 1 step of
    # T(2, 4) = 2.5 finds them; (0, 1) (T(2, 2) = 1.5) is then in its step 1.5 -> 3, so
    # the barrier ends at 8 + 3 = 11.  (3, 2) ran 1 step, (0, 1) 2.
    second = step.segments[1]
    assert (second.start_s, second.compute_s, second.steps) == (8.0, 3.0, 2)
    assert second.tp_ops == [2 * 2 * 1, 2 * 2 * 2]
    assert second.tp_bytes == [2 * 2 * 16 * 2.0 * tokens for tokens in (4, 4)]
    # In (3, 2) instance 2's sequence 2 has 4 tokens, instance 3's 3, 7, 11 have 3 each:
    # the least generated, 3 (not the lowest index, 2), goes to (0, 1), lane to lane.
    assert (rebalance.kind, rebalance.at_s, rebalance.requests_moved) == ("rebalance", 11.0, 1)
    assert sorted((m.src, m.dst, m.bytes) for m in rebalance.moves) == [
        (2, 1, (10 + 3) * TOY_KV / 2), (3, 0, (10 + 3) * TOY_KV / 2)]
    # (3, 2): sequence 2 with 16 left, 7 and 11 with 17: 16 steps of T(2, 3) = 2, then 1
    # of T(2, 2) = 1.5: 33.5.  (0, 1): 0 and 1 with 16, 3 with 17: 16 steps of 2, then 1
    # of T(2, 1) = 1: 33.  Tokens 16 + 17 + 17 = 50 and 16 + 16 + 17 = 49.
    last = step.segments[2]
    assert (last.start_s, last.compute_s, last.steps, last.running_at_start) == (11.0, 33.5,
                                                                                 17, 6)
    assert last.instances == [(3, 2), (0, 1)]
    assert last.tp_bytes == [2 * 2 * 16 * 2.0 * tokens for tokens in (50, 49)]
    assert step.compute_s == 11.0 + 33.5
    assert step.tokens == 6 * 20 + 4 * 2 + 2 * 1


def test_no_rebalance_when_the_counts_cannot_improve():
    params = PolicyParams(tp=1, switch_tp=1, rebalance_every=1, max_rebalances=8)
    # Two instances, one sequence each of very different lengths: counts [1, 1] then [1, 0].
    step = simulate(2, 2, "switch+rebalance", params, UNIT, LengthDist(), TOY,
                    lengths_list=[5, 50])
    assert step.events == []


# ---------------------------------------------------------------- merge_groups
def test_merge_groups_is_a_snake_draft_busiest_first():
    # [5, 0, 3, 1], 2 groups: busiest first 0 (5), 2 (3), 3 (1), 1 (0); group 0 takes 0,
    # group 1 takes 2, then back: group 1 takes 3, group 0 takes 1.  Totals 5 and 4.
    assert merge_groups([5, 0, 3, 1], 2) == [0, 1, 2, 3]
    # The same loads elsewhere: 1 (5), 3 (3), 2 (1), 0 (0) -> (1, 0), (3, 2).
    assert merge_groups([0, 5, 1, 3], 2) == [1, 0, 3, 2]
    # 4 groups: 0..3 take 8, 7, 6, 5, then 3..0 take 4, 3, 2, 1: totals 9 each.
    assert merge_groups([8, 7, 6, 5, 4, 3, 2, 1], 2) == [0, 7, 1, 6, 2, 5, 3, 4]
    assert merge_groups(np.array([5, 0, 3, 1]), 2) == [0, 1, 2, 3]    # as _switch calls it


def test_merge_groups_ties_keep_rank_order():
    # All equal: ranks 0, 1, 2, 3 dealt to groups 0, 1, 1, 0.
    assert merge_groups([1, 1, 1, 1], 2) == [0, 3, 1, 2]
    assert merge_groups([0] * 8, 4) == [0, 3, 4, 7, 1, 2, 5, 6]
    # Ties within each level: 0 before 2 (load 2), 1 before 3 (load 1).
    assert merge_groups([2, 1, 2, 1], 2) == [0, 3, 2, 1]
    assert merge_groups([7], 1) == [0]


def test_merge_groups_of_four_balance_the_totals():
    load = [3, 8, 1, 6, 7, 2, 5, 4]
    # Busiest first 1 (8), 4 (7), 3 (6), 6 (5), 7 (4), 0 (3), 5 (2), 2 (1); 2 groups
    # take, in turn, 0 1 | 1 0 | 0 1 | 1 0: group 0 gets 1, 6, 7, 2 (8 + 5 + 4 + 1 = 18),
    # group 1 gets 4, 3, 0, 5 (7 + 6 + 3 + 2 = 18).
    order = merge_groups(load, 4)
    assert order == [1, 6, 7, 2, 4, 3, 0, 5]
    assert [sum(load[i] for i in order[g:g + 4]) for g in (0, 4)] == [18, 18]


@pytest.mark.parametrize("count, merged", [(3, 2), (6, 4), (4, 0), (8, 3)])
def test_merge_groups_needs_a_divisible_count(count, merged):
    with pytest.raises(GenerationError, match=f"{count} instances do not merge {merged} at a"):
        merge_groups([1] * count, merged)


# ---------------------------------------------------------------- the defaults
@pytest.fixture(scope="module")
def reference():
    """Batch 96 on 24 GPUs with the shipped defaults, seed 0, every policy."""
    lengths, decode, params = load_defaults()
    return {policy: simulate(24, 96, policy, params, decode, lengths, QWEN25_14B, seed=0)
            for policy in POLICIES}


def test_switching_beats_static_with_the_defaults(reference):
    static, switch, both = (reference[p].throughput() for p in POLICIES)
    assert static < switch <= both
    assert 1.1 <= both / static <= 1.4
    assert reference["static"].events == []


def test_reference_steps_are_consistent(reference):
    for step in reference.values():
        assert len(step.segments) == len(step.events) + 1
        for k, event in enumerate(step.events):
            before, after = step.segments[k], step.segments[k + 1]
            assert before.start_s + before.compute_s == pytest.approx(event.at_s)
            assert after.start_s == event.at_s and after.tp == event.tp_to
            assert all(m.src != m.dst and m.bytes > 0 for m in event.moves)
            assert set(m.src for m in event.moves) | set(m.dst for m in event.moves) <= set(
                range(24))
        # Every token is decoded once: tp_bytes / (2 L h beta) summed over the segments.
        per_token = 2 * QWEN25_14B.layers * QWEN25_14B.hidden * 2.0
        assert sum(sum(s.tp_bytes) for s in step.segments) / per_token == step.tokens
        assert step.compute_s == pytest.approx(step.segments[-1].start_s
                                               + step.segments[-1].compute_s)
    both = reference["switch+rebalance"]
    assert [e.kind for e in both.events].count("switch") == 1
    assert [e.kind for e in both.events].count("rebalance") <= PolicyParams().max_rebalances


def test_to_dict_is_json_and_summarises_long_lists():
    lengths, decode, params = load_defaults()
    step = simulate(256, 1000, "switch+rebalance", params, decode, lengths, QWEN25_14B)
    summary = json.loads(json.dumps(step.to_dict()))
    assert summary["lengths"]["count"] == 1000 and "values" not in summary["lengths"]
    assert summary["lengths"]["max"] == max(step.lengths)
    assert summary["tokens"] == step.tokens

    def longest_list(value):
        if isinstance(value, dict):
            return max([longest_list(v) for v in value.values()] + [0])
        if isinstance(value, list):
            return max([len(value)] + [longest_list(v) for v in value])
        return 0
    assert longest_list(summary) <= 100


def test_large_steps_are_fast():
    lengths, decode, params = load_defaults()
    for policy in POLICIES:
        began = time.perf_counter()
        step = simulate(2048, 4096, policy, params, decode, lengths, QWEN25_14B)
        assert time.perf_counter() - began < 3.0
        assert step.tokens == sum(step.lengths)


# ---------------------------------------------------------------- simulate's arguments
@pytest.mark.parametrize("kwargs, words", [
    ({"policy": "dynamic"}, ["policy", "static", "switch+rebalance"]),
    ({"gpus": 6}, ["gpus=6", "params.switch_tp=4"]),
    ({"gpus": 3}, ["gpus=3", "params.tp=2"]),
    ({"batch": 0}, ["batch"]),
    ({"prompt_len": -1}, ["prompt_len"]),
    ({"lengths_list": [5, 5]}, ["lengths_list", "batch=4"]),
])
def test_simulate_validation_names_the_field(kwargs, words):
    args = dict(gpus=8, batch=4, policy="switch", params=PolicyParams(), decode=DecodeModel(),
                lengths=LengthDist(), model=TOY)
    args.update(kwargs)
    with pytest.raises(GenerationError) as err:
        simulate(**args)
    for word in words:
        assert word in str(err.value)


def test_policy_validation_names_the_field():
    with pytest.raises(GenerationError, match="policy.switch_tp must be a multiple of policy.tp"):
        PolicyParams(tp=2, switch_tp=3)
    with pytest.raises(GenerationError, match=r"policy.switch_below must be a number in \[0, 1\)"):
        PolicyParams(switch_below=1.0)


# ---------------------------------------------------------------- the data file
def test_load_defaults_reads_the_shipped_file():
    lengths, decode, params = load_defaults()
    assert generation.DATA.name == "decode.toml" and generation.DATA.exists()
    # The file and the dataclasses' defaults are one set of values.
    assert (lengths, decode, params) == (LengthDist(), DecodeModel(), PolicyParams())


def shipped_with(tmp_path, old, new):
    text = generation.DATA.read_text()
    assert old in text
    path = tmp_path / "decode.toml"
    path.write_text(text.replace(old, new))
    return path


@pytest.mark.parametrize("old, new, words", [
    ("comm_s = 0.0008", "comm_s = 0.0008\nlatency_s = 1.0", ["[decode]", "latency_s",
                                                             "allowed", "comm_s"]),
    ("sigma = 1.0", "sigma = -1.0", ["[lengths]", "sigma", ">= 0", "-1.0"]),
    ("tp = 2", "tp = 2.5", ["[policy]", "tp", "an integer >= 1"]),
    ("imbalance = 1.5", "imbalance = true", ["[policy]", "imbalance", ">= 1"]),
    ("switch_tp = 4", "switch_tp = 3", ["[policy]", "switch_tp", "multiple", "tp"]),
    ("switch_below = 0.25", "switch_below = 1.5", ["[policy]", "switch_below", "[0, 1)"]),
    ("[policy]", "[policies]", ["unknown sections", "[policy]"]),
])
def test_bad_file_names_file_section_and_key(tmp_path, old, new, words):
    path = shipped_with(tmp_path, old, new)
    with pytest.raises(GenerationError) as err:
        load_defaults(path)
    message = str(err.value)
    assert str(path) in message
    for word in words:
        assert word in message


def test_a_missing_key_keeps_the_default(tmp_path):
    path = tmp_path / "decode.toml"
    path.write_text("[decode]\nweights_s = 0.02\n")
    lengths, decode, params = load_defaults(path)
    assert decode == DecodeModel(weights_s=0.02)
    assert (lengths, params) == (LengthDist(), PolicyParams())


def test_a_missing_or_broken_file_is_named(tmp_path):
    with pytest.raises(GenerationError, match="nothere.toml"):
        load_defaults(tmp_path / "nothere.toml")
    path = tmp_path / "broken.toml"
    path.write_text("[decode\n")
    with pytest.raises(GenerationError, match="broken.toml: not valid TOML"):
        load_defaults(path)


def test_moves_are_plain_values():
    assert Move(0, 1, 2.0) == Move(0, 1, 2.0)
