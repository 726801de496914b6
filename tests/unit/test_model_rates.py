"""LiveRates: max-min rates kept up to date equal the rates computed anew."""

import numpy as np
import pytest

from traffic.model.maxmin import max_min_rates
from traffic.model import rates
from traffic.model.rates import LiveRates


class Paths:
    """Paths as the engine keeps them: slices of one append-only array."""

    def __init__(self, n_flows):
        self.start = np.zeros(n_flows, dtype=np.int64)
        self.length = np.zeros(n_flows, dtype=np.int64)
        self.links = np.zeros(0, dtype=np.int64)

    def give(self, flow, path):
        self.start[flow] = len(self.links)
        self.length[flow] = len(path)
        self.links = np.concatenate([self.links, np.asarray(path, dtype=np.int64)])


def anew(tx, paths, capacity, caps):
    """The rates of ``tx`` from nothing (0 for a flow without a path)."""
    lengths = paths.length[tx]
    indptr = np.concatenate(([0], np.cumsum(lengths)))
    links = np.concatenate([paths.links[paths.start[f]:paths.start[f] + paths.length[f]]
                            for f in tx] or [np.zeros(0, dtype=np.int64)])
    want = max_min_rates(indptr, links, capacity, caps[tx])
    want[lengths == 0] = 0.0
    return want


@pytest.mark.parametrize("seed,tight", [(seed, False) for seed in range(8)]
                         + [(seed, True) for seed in range(3)])
def test_kept_rates_equal_rates_computed_anew_through_starts_stops_moves_and_dark_links(
        seed, tight, monkeypatch):
    # tight: the lists start with room for 2 flows of 1 link, so they grow
    # (more flows, longer paths: the slots move) while flows are in them.
    if tight:
        monkeypatch.setattr(rates, "FIRST_FLOWS", 2)
        monkeypatch.setattr(rates, "FIRST_STRIDE", 1)
    rng = np.random.default_rng(seed)
    n_links, n_flows = 200, 600
    capacity = rng.choice([10.0, 25.0, 40.0, 100.0], n_links)   # ties, as in a fabric
    capacity[:3] = np.inf
    caps = np.where(rng.random(n_flows) < 0.1, rng.uniform(1.0, 20.0, n_flows), np.inf)
    paths = Paths(n_flows)
    live = LiveRates(n_links)
    live.grow_flows(n_flows)
    tx = np.zeros(0, dtype=np.int64)
    waiting = list(rng.permutation(n_flows))

    def new_path():
        long = tight and rng.random() < 0.05
        return rng.choice(n_links, size=12 if long else int(rng.integers(1, 5)), replace=False)

    for step in range(150):
        action = rng.random()
        if action < 0.5 and waiting:                      # a few flows start
            started = np.array([waiting.pop() for _ in range(min(len(waiting),
                                                                 int(rng.integers(1, 8))))])
            for f in started:
                paths.give(f, new_path() if rng.random() > 0.05 else [])
            live.insert(started, paths.start, paths.length, paths.links, caps, capacity)
            tx = np.concatenate([tx, started])
        elif action < 0.8 and len(tx):                   # a few stop
            stopped = rng.choice(tx, size=min(len(tx), int(rng.integers(1, 8))),
                                 replace=False)
            live.remove(stopped)
            tx = np.setdiff1d(tx, stopped)
        elif action < 0.9 and len(tx):                   # a few move
            moved = rng.choice(tx, size=min(len(tx), 4), replace=False)
            live.remove(moved)
            for f in moved:
                paths.give(f, new_path())
            live.insert(moved, paths.start, paths.length, paths.links, caps, capacity)
        else:                                             # a circuit goes dark or lights
            links = rng.choice(np.arange(3, n_links), size=3, replace=False)
            capacity[links] = 0.0 if rng.random() < 0.5 else rng.choice([10.0, 40.0], 3)
            live.capacity_changed(links)
        live.update(tx, capacity)
        np.testing.assert_allclose(live.rate[tx], anew(tx, paths, capacity, caps),
                                   rtol=1e-6, atol=1e-9, err_msg=f"step {step}")
    assert len(tx) > 50
    if tight:
        assert len(live._u_flow) >= 64 and len(live._slot_link) >= 16 * len(live._u_flow)
    # Most updates computed only some flows again (else this tests nothing new).
    assert live.full_recomputes < live.updates / 4


def test_a_flow_that_stops_gives_its_share_to_the_flows_of_its_bottleneck():
    # Link 0 (10) shared by flows 0 and 1; flow 1 also crosses link 1 (4),
    # flow 2 crosses link 1 alone ... then flow 0 stops.
    paths = Paths(3)
    for flow, path in enumerate([[0], [0, 1], [1]]):
        paths.give(flow, path)
    live = LiveRates(2)
    live.grow_flows(3)
    capacity, caps = np.array([10.0, 4.0]), np.full(3, np.inf)
    tx = np.arange(3)
    live.insert(tx, paths.start, paths.length, paths.links, caps, capacity)
    live.update(tx, capacity)
    np.testing.assert_allclose(live.rate[tx], [8.0, 2.0, 2.0])
    live.remove([1])
    tx = np.array([0, 2])
    live.update(tx, capacity)
    np.testing.assert_allclose(live.rate[tx], [10.0, 4.0])
    assert live.rate[1] == 0.0


def test_stats_count_what_the_updates_did():
    paths = Paths(2)
    paths.give(0, [0])
    paths.give(1, [0])
    live = LiveRates(1)
    live.grow_flows(2)
    tx = np.arange(2)
    live.insert(tx, paths.start, paths.length, paths.links, np.full(2, np.inf), np.array([10.0]))
    live.update(tx, np.array([10.0]))
    stats = live.stats()
    # Both flows are new: more than half of them, so every rate is filled anew.
    assert stats["updates"] == 1 and stats["full_share"] == 1.0
    assert stats["filled_per_update"] == 2
