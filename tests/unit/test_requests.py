"""The seeded request stream: determinism, Poisson arrivals, lengths, sessions, delta KV."""

import statistics
from collections import defaultdict

import pytest

from traffic import kvcache
from traffic.requests import (WORKLOADS, LengthDist, StreamError, Workload, generate, summary,
                              token_hit_ratio, workload)


def test_the_same_seed_gives_the_same_stream():
    load = workload("cached-coding")
    assert generate(load, 4.0, seed=11, count=500) == generate(load, 4.0, seed=11, count=500)
    assert generate(load, 4.0, seed=11, count=500) != generate(load, 4.0, seed=12, count=500)


def test_a_shorter_stream_is_a_prefix_of_a_longer_one():
    load = workload("cached-coding")
    assert generate(load, 4.0, 3, count=200) == generate(load, 4.0, 3, count=700)[:200]


def test_single_turn_arrivals_are_poisson():
    stream = generate(workload("coding-agent"), 5.0, seed=1, count=20_000)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(stream, stream[1:])]
    assert statistics.mean(gaps) == pytest.approx(1 / 5.0, rel=0.03)
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.03)
    assert all(g >= 0 for g in gaps)
    assert all(r.turn == 0 and not r.warm for r in stream)


def test_a_duration_keeps_the_arrivals_before_it():
    stream = generate(workload("coding-agent"), 2.0, seed=5, duration_s=300)
    assert all(r.arrival_s < 300 for r in stream)
    assert len(stream) == pytest.approx(600, rel=0.15)
    sessions = generate(workload("cached-coding"), 2.0, seed=5, duration_s=300)
    assert sessions and all(r.arrival_s < 300 for r in sessions)
    assert [r.arrival_s for r in sessions] == sorted(r.arrival_s for r in sessions)


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_lengths_and_hits_follow_the_profile(name):
    item = kvcache.profile(name)
    figures = summary(generate(WORKLOADS[name], 10.0, seed=2, count=20_000))
    assert figures["mean_prompt_tokens"] == pytest.approx(item.input_tokens, rel=0.03)
    assert figures["mean_output_tokens"] == pytest.approx(item.output_tokens, rel=0.03)
    assert figures["hit_ratio"] == pytest.approx(item.hit_ratio, abs=0.02)
    assert figures["rate_per_s"] == pytest.approx(10.0, rel=0.05)


def test_sessions_run_their_turns_in_order_and_only_warm_turns_hit():
    stream = generate(workload("cached-coding"), 3.0, seed=9, count=3_000)
    turns = defaultdict(list)
    for request in stream:
        turns[request.session].append(request)
    assert any(len(t) > 1 for t in turns.values())
    for session in turns.values():
        assert [r.turn for r in session] == list(range(len(session)))
        assert all(a.arrival_s <= b.arrival_s for a, b in zip(session, session[1:]))
        assert session[0].cached_tokens == 0
        assert all(0 < r.cached_tokens < r.prompt_tokens for r in session[1:])
    warm = [r for r in stream if r.warm]
    assert len(warm) / len(stream) == pytest.approx(0.75, abs=0.03)


def test_warm_turns_send_only_the_delta_kv_on_their_home():
    warm = next(r for r in generate(workload("cached-coding"), 3.0, 9, count=100) if r.warm)
    config = kvcache.GLM_5_1
    assert warm.transfer_bytes(config, on_home=True) == 89_856 * warm.new_tokens
    assert warm.transfer_bytes(config, on_home=False) == warm.kv_bytes(config) \
        == 89_856 * warm.prompt_tokens
    assert warm.new_tokens == warm.prompt_tokens - warm.cached_tokens


def test_token_hit_ratio_is_the_share_of_cached_prompt_tokens():
    stream = generate(workload("cached-coding"), 3.0, seed=4, count=50)
    assert token_hit_ratio(stream) == pytest.approx(
        sum(r.cached_tokens for r in stream) / sum(r.prompt_tokens for r in stream))
    assert token_hit_ratio([]) == 0.0


def test_lengths_are_clipped_and_a_zero_cv_is_constant():
    import random
    rng = random.Random(0)
    clipped = LengthDist(1000, cv=3.0, minimum=100, maximum=2000)
    values = [clipped.sample(rng) for _ in range(2000)]
    assert min(values) >= 100 and max(values) <= 2000 and 2000 in values
    assert {LengthDist(512, cv=0).sample(rng) for _ in range(10)} == {512}


@pytest.mark.parametrize("kwargs, match", [
    ({"hit_ratio": 0.4, "turns_mean": 1.0}, "raise turns_mean"),
    ({"hit_ratio": 1.0}, "hit_ratio"),
    ({"turns_mean": 0.5}, "turns_mean"),
])
def test_impossible_workloads_are_refused(kwargs, match):
    with pytest.raises(StreamError, match=match):
        Workload("w", LengthDist(100), LengthDist(10), **kwargs)


def test_generate_needs_one_stop_and_a_rate():
    load = workload("coding-agent")
    with pytest.raises(StreamError, match="exactly one"):
        generate(load, 1.0, 0)
    with pytest.raises(StreamError, match="exactly one"):
        generate(load, 1.0, 0, count=5, duration_s=5)
    with pytest.raises(StreamError, match="rate_per_s"):
        generate(load, 0.0, 0, count=5)
    with pytest.raises(StreamError, match="unknown workload"):
        workload("chat")
