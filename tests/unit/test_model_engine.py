"""FlowSim: closed forms of collectives, latency and start-up, capacity changes,
reroutes, cancellation, batching of completions, and a scale smoke test."""

import numpy as np
import pytest

from traffic.model.engine import (ACTIVE, CANCELLED, DONE, DRAINED, WAITING, FlowSim)

GBPS = 1e9
MB = 1_000_000


class Star:
    """N hosts on one switch.  Link i: host i -> switch; link N + i: switch -> host i.

    Optionally, hosts are split into two groups joined by a cross link pair
    (a dumbbell): link 2N carries left -> right, link 2N + 1 right -> left.
    """

    def __init__(self, n_hosts, host_bps=GBPS, left=None, cross_bps=None):
        self.n = n_hosts
        self.left = None if left is None else np.asarray(left, dtype=bool)
        capacity = [host_bps] * (2 * n_hosts)
        if left is not None:
            capacity += [cross_bps, cross_bps]
        self.capacity = np.array(capacity, dtype=float)
        self.src = np.zeros(0, dtype=np.int64)
        self.dst = np.zeros(0, dtype=np.int64)
        self.router_calls = []

    def flows(self, src, dst):
        """Remember the endpoints of the next flows (ids in add order)."""
        self.src = np.concatenate([self.src, np.asarray(src, dtype=np.int64)])
        self.dst = np.concatenate([self.dst, np.asarray(dst, dtype=np.int64)])

    def route(self, ids):
        self.router_calls.append(ids.copy())
        src, dst = self.src[ids], self.dst[ids]
        hops = [src, self.n + dst]
        if self.left is not None:
            crossing = self.left[src] != self.left[dst]
            cross_link = np.where(self.left[src], 2 * self.n, 2 * self.n + 1)
            lengths = np.where(crossing, 3, 2)
            indptr = np.zeros(len(ids) + 1, dtype=np.int64)
            np.cumsum(lengths, out=indptr[1:])
            links = np.empty(indptr[-1], dtype=np.int64)
            links[indptr[:-1]] = src
            links[indptr[:-1] + 1] = np.where(crossing, cross_link, self.n + dst)
            links[indptr[:-1][crossing] + 2] = (self.n + dst)[crossing]
            return indptr, links
        return np.arange(0, 2 * len(ids) + 1, 2), np.column_stack(hops).ravel()

    def sim(self, **options):
        return FlowSim(self.capacity, self.route, **options)


def add_ring_allreduce(sim, star, ranks, size_bytes):
    """Ring all-reduce over ``ranks``: 2(N-1) steps of S/N bytes to the next rank.

    Step k of rank i waits for step k-1 of ranks i-1 (whose chunk it forwards)
    and i (its own previous send).  Returns the flow ids, step-major.
    """
    ranks = np.asarray(ranks)
    n = len(ranks)
    steps = 2 * (n - 1)
    first = sim.n_flows
    ids = first + np.arange(steps * n).reshape(steps, n)
    after = np.full((steps, n, 2), -1, dtype=np.int64)
    after[1:, :, 0] = np.roll(ids[:-1], 1, axis=1)
    after[1:, :, 1] = ids[:-1]
    star.flows(np.tile(ranks, steps), np.tile(np.roll(ranks, -1), steps))
    got = sim.add_flows(np.full(steps * n, size_bytes / n), after=after.reshape(-1, 2))
    assert np.array_equal(got, ids.reshape(-1))
    return got


@pytest.mark.parametrize("n", [2, 3, 8, 17])
def test_ring_allreduce_on_a_star_takes_2_n_minus_1_over_n_s_over_b(n):
    star = Star(n)
    sim = star.sim()
    size = 64 * MB
    ids = add_ring_allreduce(sim, star, range(n), size)
    sim.run()
    assert np.all(sim.state == DONE)
    expected = 2 * (n - 1) / n * size * 8 / GBPS
    assert sim.end_s.max() == pytest.approx(expected, rel=1e-12)
    # Each step ends together: one router call per step.
    assert len(star.router_calls) == 2 * (n - 1)
    assert sim.end_s[ids[-1]] == pytest.approx(expected, rel=1e-12)


def test_ring_allreduce_with_dependencies_as_lists():
    n, size = 4, 8 * MB
    star = Star(n)
    sim = star.sim()
    after = []
    for k in range(2 * (n - 1)):
        for i in range(n):
            after.append([] if k == 0 else [(k - 1) * n + (i - 1) % n, (k - 1) * n + i])
    star.flows(np.tile(np.arange(n), 2 * (n - 1)), np.tile(np.roll(np.arange(n), -1), 2 * (n - 1)))
    sim.add_flows(np.full(len(after), size / n), after=after)
    sim.run()
    assert sim.now == pytest.approx(2 * (n - 1) / n * size * 8 / GBPS, rel=1e-12)


@pytest.mark.parametrize("n", [1, 2, 5, 31])
def test_incast_takes_n_s_over_b(n):
    star = Star(n + 1)
    sim = star.sim()
    size = 10 * MB
    star.flows(np.arange(1, n + 1), np.zeros(n))
    sim.add_flows(np.full(n, size))
    sim.run()
    assert np.all(sim.end_s == sim.end_s[0])          # fair: they end together
    assert sim.end_s[0] == pytest.approx(n * size * 8 / GBPS, rel=1e-12)


def all_to_all_on_dumbbell(k, cross_bps, size=MB):
    star = Star(2 * k, left=np.arange(2 * k) < k, cross_bps=cross_bps)
    sim = star.sim()
    src, dst = np.nonzero(~np.eye(2 * k, dtype=bool))
    star.flows(src, dst)
    sim.add_flows(np.full(len(src), size))
    sim.run()
    assert np.all(sim.state == DONE)
    cross_bytes = k * k * size                     # per direction
    return sim.now, cross_bytes * 8 / cross_bps


def test_all_to_all_on_a_dumbbell_equals_the_bisection_bound_when_it_is_the_bottleneck():
    finish, bound = all_to_all_on_dumbbell(k=4, cross_bps=0.5 * GBPS)
    assert finish == pytest.approx(bound, rel=1e-12)


def test_all_to_all_on_a_dumbbell_is_above_the_bisection_bound_otherwise():
    finish, bound = all_to_all_on_dumbbell(k=4, cross_bps=8 * GBPS)
    assert finish > bound * 1.5
    # Host links are then the limit: each host sends 2k - 1 flows of 1 MB.
    assert finish == pytest.approx((2 * 4 - 1) * MB * 8 / GBPS, rel=1e-12)


def one_flow(**options):
    star = Star(2)
    sim = star.sim(**options)
    star.flows([0], [1])
    sim.add_flows([10 * MB])
    sim.run()
    return sim


def test_latency_and_startup_add_to_the_transfer_time():
    transfer = 10 * MB * 8 / GBPS
    sim = one_flow(hop_latency_s=0.001, startup_s=0.05)
    assert sim.released_s[0] == 0.0
    assert sim.drained_s[0] == pytest.approx(0.05 + transfer, rel=1e-12)
    assert sim.end_s[0] == pytest.approx(0.05 + transfer + 2 * 0.001, rel=1e-12)


def test_efficiency_scales_transfer_times():
    transfer = 10 * MB * 8 / GBPS
    assert one_flow(efficiency=0.8).end_s[0] == pytest.approx(transfer / 0.8, rel=1e-12)


def test_dependents_wait_for_the_end_including_latency_and_their_delay():
    star = Star(3)
    sim = star.sim(hop_latency_s=0.01)
    star.flows([0, 1], [1, 2])
    sim.add_flows([MB, MB], after=[[], [0]], delay_s=[0.0, 0.5])
    sim.run()
    first_end = MB * 8 / GBPS + 0.02
    assert sim.end_s[0] == pytest.approx(first_end)
    assert sim.released_s[1] == pytest.approx(first_end + 0.5)
    assert sim.end_s[1] == pytest.approx(first_end + 0.5 + first_end)


def test_base_and_delay_set_the_release_time():
    star = Star(2)
    sim = star.sim()
    star.flows([0, 0], [1, 1])
    sim.add_flows([MB, MB], base_s=2.0, delay_s=[0.0, 1.0])
    sim.run()
    assert sim.released_s.tolist() == [2.0, 3.0]


def test_staggered_flows_share_then_run_alone():
    # Flow 0 alone at B for 1 s, then halves while flow 1 runs.
    star = Star(2)
    sim = star.sim()
    star.flows([0, 0], [1, 1])
    bytes_per_s = GBPS / 8
    sim.add_flows([3 * bytes_per_s, bytes_per_s], delay_s=[0.0, 1.0])
    sim.run()
    # From t=1 both at B/2: flow 1 ends at 3, flow 0 has 1 s of bytes left at 3.
    assert sim.end_s[1] == pytest.approx(3.0, rel=1e-12)
    assert sim.end_s[0] == pytest.approx(4.0, rel=1e-12)


def test_cap_limits_a_flow():
    star = Star(2)
    sim = star.sim()
    star.flows([0, 0], [1, 1])
    sim.add_flows([MB, MB], cap_bps=[0.1 * GBPS, np.inf])
    sim.run()
    assert sim.end_s[0] == pytest.approx(MB * 8 / (0.1 * GBPS))
    assert sim.end_s[1] == pytest.approx(MB * 8 / (0.9 * GBPS))


def test_flow_on_a_dark_link_waits_until_set_capacity():
    star = Star(2)
    star.capacity[0] = 0.0
    sim = star.sim()
    star.flows([0], [1])
    sim.add_flows([MB])
    sim.at(5.0, lambda s: s.set_capacity([0], GBPS))
    sim.run(until=4.0)
    assert sim.now == 4.0 and sim.state[0] == ACTIVE and sim.bytes_left[0] == MB
    sim.run()
    assert sim.end_s[0] == pytest.approx(5.0 + MB * 8 / GBPS, rel=1e-12)


def test_pathless_flow_waits_for_a_reroute():
    paths = {0: []}

    def router(ids):
        links = [paths[int(f)] for f in ids]
        return np.r_[0, np.cumsum([len(p) for p in links])], np.array(sum(links, []), dtype=int)

    sim = FlowSim([GBPS], router)
    sim.add_flows([MB])

    def connect(s):
        paths[0] = [0]
        s.reroute()

    sim.at(1.0, connect)
    sim.run()
    assert sim.end_s[0] == pytest.approx(1.0 + MB * 8 / GBPS)


def test_reroute_moves_a_flow_to_a_faster_path():
    # Link 0 at B, link 1 at 2B; the router reads the current choice.
    choice = {"link": 0}

    def router(ids):
        return np.arange(len(ids) + 1), np.full(len(ids), choice["link"])

    sim = FlowSim([GBPS, 2 * GBPS], router)
    size = GBPS / 8                                # 1 s at B
    sim.add_flows([size])

    def move(s):
        choice["link"] = 1
        s.reroute([0])

    sim.at(0.5, move)
    sim.run(until=0.6)
    assert sim.path_of(0).tolist() == [1]
    sim.run()
    assert sim.end_s[0] == pytest.approx(0.5 + 0.5 / 2, rel=1e-12)


def test_cancel_returns_delivered_bytes_and_dependents_never_start():
    star = Star(3)
    sim = star.sim()
    star.flows([0, 1, 0], [1, 2, 2])
    size = GBPS / 8                                # 1 s at B
    sim.add_flows([size, size], after=[[], [0]])
    delivered = {}
    sim.at(0.25, lambda s: delivered.update(bytes=s.cancel([0])))
    sim.run()
    assert delivered["bytes"] == pytest.approx([0.25 * size])
    assert sim.state.tolist() == [CANCELLED, WAITING]
    assert np.isnan(sim.end_s).all()
    # A flow added later after the cancelled one never starts either.
    sim.add_flows([size], after=[[0]])
    sim.run()
    assert sim.state[2] == WAITING


def test_on_done_is_called_once_per_simultaneous_batch():
    star = Star(4)
    calls = []
    sim = star.sim(on_done=lambda ids, t: calls.append((sorted(ids.tolist()), t)))
    star.flows([0, 1, 2, 3], [1, 2, 3, 0])
    # Sizes that differ by rounding still end as one event.
    sim.add_flows([MB, MB * (1 + 1e-13), MB, 2 * MB])
    sim.run()
    assert [ids for ids, _ in calls] == [[0, 1, 2], [3]]
    assert calls[0][1] == pytest.approx(MB * 8 / GBPS)


def test_states_through_a_flows_life():
    star = Star(2)
    seen = []
    sim = star.sim(hop_latency_s=0.5, startup_s=0.5)
    star.flows([0], [1])
    sim.add_flows([GBPS / 8], delay_s=1.0)
    for t in (0.5, 1.2, 2.0, 2.7, 3.6):
        sim.at(t, lambda s: seen.append(int(s.state[0])))
    sim.run()
    # waiting, starting up, transmitting, drained (propagating), done
    assert seen == [WAITING, ACTIVE, ACTIVE, DRAINED, DONE]
    assert sim.end_s[0] == pytest.approx(1.0 + 0.5 + 1.0 + 2 * 0.5)


def test_at_callbacks_run_in_time_then_fifo_order():
    sim = FlowSim([GBPS], lambda ids: (np.zeros(len(ids) + 1, dtype=int), np.zeros(0, dtype=int)))
    order = []
    sim.at(2.0, lambda s: order.append("b"))
    sim.at(1.0, lambda s: order.append(("a", s.now)))
    sim.at(2.0, lambda s: order.append("c"))
    sim.run()
    assert order == [("a", 1.0), "b", "c"]
    with pytest.raises(ValueError):
        sim.at(1.0, lambda s: None)


def test_add_links_and_growth_in_chunks():
    star = Star(2)
    sim = star.sim()
    new = sim.add_links([GBPS, GBPS])
    assert new.tolist() == [4, 5] and sim.n_links == 6
    for _ in range(5):
        star.flows(np.zeros(3000), np.ones(3000))
        sim.add_flows(np.full(3000, 100.0))
    assert sim.n_flows == 15000
    sim.run()
    assert np.all(sim.state == DONE)
    assert sim.now == pytest.approx(15000 * 100 * 8 / GBPS, rel=1e-9)


def test_progress_is_called_during_long_runs(monkeypatch):
    import traffic.model.engine as engine
    monkeypatch.setattr(engine, "PROGRESS_PERIOD_S", 0.0)
    monkeypatch.setattr(engine, "PROGRESS_EVENTS", 1)
    seen = []
    star = Star(3)
    sim = star.sim(progress=lambda s: seen.append(s.now))
    add_ring_allreduce(sim, star, range(3), MB)
    sim.run()
    assert seen and seen == sorted(seen)


def test_scale_smoke_50k_flows_in_a_dag():
    # Six rings of 64 ranks on disjoint hosts of one switch: 6 x 126 x 64 flows.
    rings, n = 6, 64
    star = Star(rings * n)
    done = []
    sim = star.sim(on_done=lambda ids, t: done.append(len(ids)))
    sizes = [MB * (r + 1) for r in range(rings)]
    ring_ids = [add_ring_allreduce(sim, star, np.arange(r * n, (r + 1) * n), sizes[r])
                for r in range(rings)]
    assert sim.n_flows == rings * 2 * (n - 1) * n > 48_000
    sim.run()
    assert np.all(sim.state == DONE)
    assert sum(done) == sim.n_flows
    for ids, size in zip(ring_ids, sizes):
        assert sim.end_s[ids].max() == pytest.approx(2 * (n - 1) / n * size * 8 / GBPS, rel=1e-9)


class SmallClos:
    """Hosts on leaves joined by spines; a flow between two leaves crosses the
    spine ECMP picks for it (at random, per flow): collisions slow some flows
    of a ring step, so the rings drift out of lockstep as on a real fabric.

    Links: host i up (i), host i down (n + i), leaf l -> spine s
    (2n + l S + s), spine s -> leaf l (2n + L S + l S + s).
    """

    def __init__(self, leaves=4, per_leaf=4, spines=2, seed=0):
        self.n, self.per_leaf, self.leaves, self.spines = leaves * per_leaf, per_leaf, leaves, spines
        self.capacity = np.full(2 * self.n + 2 * leaves * spines, GBPS)
        self.rng = np.random.default_rng(seed)
        self.src = self.dst = self.spine = np.zeros(0, dtype=np.int64)

    def flows(self, src, dst):
        self.src = np.concatenate([self.src, np.asarray(src, dtype=np.int64)])
        self.dst = np.concatenate([self.dst, np.asarray(dst, dtype=np.int64)])
        self.spine = np.concatenate([self.spine, self.rng.integers(0, self.spines, len(src))])

    def route(self, ids):
        paths = []
        for f in ids:
            src, dst, spine = self.src[f], self.dst[f], self.spine[f]
            up, down = src // self.per_leaf, dst // self.per_leaf
            path = [src]
            if up != down:
                uplinks = 2 * self.n
                downlinks = uplinks + self.leaves * self.spines
                path += [uplinks + up * self.spines + spine, downlinks + down * self.spines + spine]
            paths.append(path + [self.n + dst])
        indptr = np.r_[0, np.cumsum([len(p) for p in paths])]
        return indptr, np.array([link for p in paths for link in p], dtype=np.int64)


def rings_with_collisions(coalesce, seed):
    """Four ring all-reduces of 4 ranks (sizes differ) over a SmallClos."""
    net = SmallClos(seed=seed)
    sim = FlowSim(net.capacity, net.route, coalesce=coalesce)
    ranks = np.random.default_rng(seed + 100).permutation(net.n)
    rings = [add_ring_allreduce(sim, net, ranks[4 * r:4 * r + 4], (32 + 8 * r) * MB)
             for r in range(4)]
    sim.run()
    assert np.all(sim.state == DONE)
    return sim, rings


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("coalesce", [0.01, 0.05, 0.1])
def test_coalesce_bounds_the_error_of_ring_allreduces_with_collisions(coalesce, seed):
    exact, rings = rings_with_collisions(0.0, seed)
    fast, _ = rings_with_collisions(coalesce, seed)
    # The stated bound: each all-reduce ends within a fraction coalesce of
    # its exact end (here, in practice, always earlier or equal).
    for ids in rings:
        exact_end, fast_end = exact.end_s[ids].max(), fast.end_s[ids].max()
        assert abs(fast_end - exact_end) <= coalesce * exact_end
    assert abs(fast.now - exact.now) <= coalesce * exact.now


def test_coalesce_cuts_the_number_of_events():
    exact = [rings_with_collisions(0.0, seed)[0] for seed in range(3)]
    fast = [rings_with_collisions(0.1, seed)[0] for seed in range(3)]
    exact_events = sum(s.events_processed for s in exact)
    fast_events = sum(s.events_processed for s in fast)
    assert fast_events < 0.8 * exact_events
    assert sum(s.rate_computations for s in fast) < sum(s.rate_computations for s in exact)


def test_coalesce_zero_is_exact_and_bad_values_are_rejected():
    star = Star(4)
    sim = star.sim(coalesce=0.0)
    add_ring_allreduce(sim, star, range(4), 64 * MB)
    sim.run()
    assert sim.now == pytest.approx(2 * 3 / 4 * 64 * MB * 8 / GBPS, rel=1e-12)
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError):
            Star(2).sim(coalesce=bad)


def test_coalesced_flows_skip_at_most_a_fraction_of_their_bytes():
    # Two flows alone on their links, the second 5% bigger: with coalesce=0.1
    # it drains with the first (skipping < 10% of its bytes), with 0.01 not.
    for coalesce, together in ((0.1, True), (0.01, False)):
        star = Star(4)
        batches = []
        sim = star.sim(coalesce=coalesce, on_done=lambda ids, t: batches.append(len(ids)))
        star.flows([0, 1], [2, 3])
        sim.add_flows([MB, 1.05 * MB])
        sim.run()
        assert sim.end_s[0] == pytest.approx(MB * 8 / GBPS, rel=1e-12)
        if together:
            assert batches == [2] and sim.end_s[1] == sim.end_s[0]
        else:
            assert batches == [1, 1]
            assert sim.end_s[1] == pytest.approx(1.05 * MB * 8 / GBPS, rel=1e-12)


def test_dependents_added_in_several_batches_are_all_released():
    # Flow 0's dependents come in three add_flows calls (one before it ends,
    # one with an edge to 0 and to a flow of its own batch, one after it
    # ended): each is released at the right time.
    star = Star(4)
    sim = star.sim()
    star.flows([0], [1])
    sim.add_flows([MB])
    star.flows([1, 2], [2, 3])
    sim.add_flows([MB, MB], after=[[0], [0]])
    star.flows([2, 3], [3, 0])
    sim.add_flows([MB, MB], after=[[0, 1], [3]])
    sim.run()
    step = MB * 8 / GBPS
    assert sim.released_s.tolist() == pytest.approx([0, step, step, 2 * step, 3 * step])
    star.flows([3], [1])
    added_at = sim.now
    sim.add_flows([MB], after=[[0]])
    sim.run()
    assert sim.released_s[5] == pytest.approx(added_at)
    assert np.all(sim.state == DONE)


def test_coalesce_does_not_drain_a_flow_waiting_on_a_dark_link():
    star = Star(3)
    star.capacity[2] = 0.0
    sim = star.sim(coalesce=0.5)
    star.flows([0, 2], [1, 1])
    sim.add_flows([MB, MB])
    sim.run()
    assert sim.state.tolist() == [DONE, ACTIVE]
    assert sim.bytes_left[1] == MB


def test_coalesce_ends_a_flow_at_its_drain_when_its_latency_is_within_the_bound():
    transfer = 10 * MB * 8 / GBPS                      # 0.08 s; two hops of latency
    for latency, coalesce, at_drain in ((0.001, 0.05, True),    # 2 ms <= 4 ms
                                        (0.001, 0.01, False),   # 2 ms > 0.8 ms
                                        (0.001, 0.0, False)):   # exact
        sim = one_flow(hop_latency_s=latency, coalesce=coalesce)
        assert sim.drained_s[0] == pytest.approx(transfer, rel=1e-12)
        expected = transfer if at_drain else transfer + 2 * latency
        assert sim.end_s[0] == pytest.approx(expected, rel=1e-12), (latency, coalesce)
        assert sim.events_processed == (2 if at_drain else 3)   # release, drain, done


def test_dependencies_as_csr_give_the_same_run_as_lists():
    n, size = 4, 8 * MB
    ends = []
    for form in ("lists", "csr"):
        star = Star(n)
        sim = star.sim(hop_latency_s=1e-4)
        after = [[] if k == 0 else [(k - 1) * n + (i - 1) % n, (k - 1) * n + i]
                 for k in range(2 * (n - 1)) for i in range(n)]
        if form == "csr":
            indptr = np.concatenate(([0], np.cumsum([len(a) for a in after])))
            after = (indptr, np.array([d for a in after for d in a]))
        star.flows(np.tile(np.arange(n), 2 * (n - 1)),
                   np.tile(np.roll(np.arange(n), -1), 2 * (n - 1)))
        sim.add_flows(np.full(2 * (n - 1) * n, size / n), after=after)
        sim.run()
        ends.append(sim.end_s.copy())
    assert np.array_equal(ends[0], ends[1])
    with pytest.raises(ValueError, match="indptr has 2 entries for 3 flows"):
        Star(3).sim().add_flows([1, 1, 1], after=(np.array([0, 0]), np.array([], dtype=int)))


def _all_to_all_steps(sim, star, n, steps, size, as_barriers, base=0, entry=()):
    """``steps`` all-to-alls over ``n`` hosts, each step's flows waiting for
    every flow of the step before (the first for ``entry``): as lists in
    ``after``, or as one barrier per step."""
    pairs = [(a, b) for a in range(n) for b in range(n) if a != b]
    per = len(pairs)
    first = sim.n_flows
    star.flows([a for _ in range(steps) for a, _b in pairs],
               [b for _ in range(steps) for _a, b in pairs])
    waited = [list(entry)] + [list(range(first + k * per, first + (k + 1) * per))
                              for k in range(steps - 1)]
    sizes = np.full(steps * per, size) * (1 + np.arange(steps * per) % 3)
    if not as_barriers:
        return sim.add_flows(sizes, after=[waited[k] for k in range(steps) for _ in pairs],
                             base_s=base)
    lengths = [len(w) for w in waited]
    barriers = (np.concatenate(([0], np.cumsum(lengths))),
                np.array([f for w in waited for f in w], dtype=np.int64),
                np.repeat(np.arange(steps), per))
    return sim.add_flows(sizes, after=[[] for _ in range(steps * per)], barriers=barriers,
                         base_s=base)


def test_barriers_give_the_run_of_the_same_dependencies_as_lists():
    # Three all-to-all steps, then three more added later, the first of them
    # waiting for flows of which some are already done; then barriers with a
    # cancelled member (its flows never start, as with a cancelled
    # dependency) and with every member done (its flows go at once).
    runs = []
    for as_barriers in (False, True):
        star = Star(4)
        sim = star.sim(hop_latency_s=1e-4, startup_s=1e-3)
        first = _all_to_all_steps(sim, star, 4, 3, MB, as_barriers)
        sim.run(until=0.07)
        entry = first[6:18]                     # half of step 0, half of step 1
        assert (sim.state[entry] == DONE).any() and (sim.state[entry] != DONE).any()
        _all_to_all_steps(sim, star, 4, 3, MB, as_barriers, base=0.07, entry=entry)
        sim.run()
        assert (sim.state == DONE).all()
        runs.append((sim.released_s.copy(), sim.end_s.copy(), sim.events_processed))
    assert np.array_equal(runs[0][0], runs[1][0]) and np.array_equal(runs[0][1], runs[1][1])
    assert runs[0][2] == runs[1][2]
    # Waiting for a barrier with a cancelled member, or for a done one.
    star = Star(4)
    sim = star.sim()
    first = _all_to_all_steps(sim, star, 4, 1, MB, True)
    sim.cancel(first[:1])
    blocked = _all_to_all_steps(sim, star, 4, 1, MB, True, entry=first)
    sim.run()
    assert (sim.state[blocked] == WAITING).all() and (sim.state[first[1:]] == DONE).all()
    end = sim.now
    after_done = _all_to_all_steps(sim, star, 4, 1, MB, True, entry=first[1:])
    sim.run()
    assert (sim.state[after_done] == DONE).all()
    assert sim.released_s[after_done].min() == pytest.approx(end)
    with pytest.raises(ValueError, match="waits must be -1 or in"):
        sim.add_flows([1], barriers=(np.array([0, 1]), np.array([0]), np.array([1])))


def test_dependencies_on_far_apart_flows_are_all_counted():
    # A batch whose sources lie far apart (grouped by numpy's sort) and one
    # whose sources are close together (grouped by a counting sort) release
    # their dependents when their last dependency ends.
    sim = FlowSim([1e6], lambda flows: (np.arange(len(flows) + 1, dtype=np.int64),
                                        np.zeros(len(flows), dtype=np.int64)))
    first = sim.add_flows(np.arange(1.0, 5001.0))
    far = sim.add_flows([10.0], after=[[first[0], first[-1]]])
    close = sim.add_flows([10.0, 10.0], after=[[first[1]], [first[2], first[3], first[1]]])
    sim.run()
    assert np.all(sim.state == DONE)
    end, released = sim.end_s, sim.released_s
    assert released[far[0]] == end[first[-1]]
    assert released[close[0]] == end[first[1]]
    assert released[close[1]] == max(end[first[1]], end[first[2]], end[first[3]])


@pytest.mark.parametrize("seed,tight", [(seed, False) for seed in range(6)]
                         + [(seed, True) for seed in range(2)])
def test_rates_kept_between_events_equal_the_rates_of_every_flow_computed_anew(
        seed, tight, monkeypatch):
    """The engine computes again only the flows a change reaches
    (`rates.LiveRates`); at any time its rates are those of a max-min
    computation over every transmitting flow, through releases, drains, a
    link going dark and lighting, reroutes and a cancel.  ``tight``: the
    rates' lists start with room for 2 flows of 1 link, so the compiled loop
    stops for room (`events.ROOM`) as flows start, with and without a
    start-up delay."""
    from traffic.model import rates
    from traffic.model.maxmin import max_min_rates

    if tight:
        monkeypatch.setattr(rates, "FIRST_FLOWS", 2)
        monkeypatch.setattr(rates, "FIRST_STRIDE", 1)
    rng = np.random.default_rng(seed)
    n_links, n_flows = 120, 300             # sparse: most changes reach few flows
    capacity = rng.uniform(1.0, 10.0, n_links) * GBPS
    capacity[:2] = np.inf
    choice = {"shift": 0}
    paths = [rng.choice(n_links, size=int(rng.integers(1, 3)), replace=False)
             for _ in range(n_flows)]

    def router(ids):
        chosen = [(paths[i] + choice["shift"]) % n_links for i in ids]
        indptr = np.concatenate(([0], np.cumsum([len(p) for p in chosen])))
        return indptr, np.concatenate(chosen).astype(np.int64)

    sim = FlowSim(capacity, router, efficiency=0.9, hop_latency_s=1e-4,
                  startup_s=0.0 if tight and seed % 2 else 1e-3)
    sizes = rng.uniform(0.1, 2.0, n_flows) * MB
    first = sim.add_flows(sizes[:100], delay_s=rng.uniform(0.0, 0.02, 100))
    sim.add_flows(sizes[100:], after=[[int(rng.integers(100))] for _ in range(200)],
                  delay_s=rng.uniform(0.0, 0.005, 200))
    checked = []

    def check(s):
        ids, got = s.rates_bps()
        lengths = np.array([len(s.path_of(f)) for f in ids], dtype=np.int64)
        indptr = np.concatenate(([0], np.cumsum(lengths)))
        links = np.concatenate([s.path_of(f) for f in ids] or [np.zeros(0, dtype=np.int64)])
        want = max_min_rates(indptr, links, s.capacity_bps * 0.9)
        want[lengths == 0] = 0.0
        np.testing.assert_allclose(got, want, rtol=1e-6)
        checked.append(len(ids))

    def dark(s):
        s.set_capacity([5, 6], 0.0)

    def light(s):
        s.set_capacity([5, 6], [3 * GBPS, np.inf])

    def move(s):
        choice["shift"] = 1
        s.reroute(np.arange(0, n_flows, 3))      # a third move; the rest keep their paths

    # Each change first, then a check at the same instant (callbacks at one
    # time run in the order given), then checks all along.
    sim.at(0.02, dark)
    sim.at(0.03, move)
    sim.at(0.04, lambda s: s.cancel(first[:5]))
    sim.at(0.05, light)
    for t in np.concatenate([[0.02, 0.03, 0.04, 0.05], np.linspace(0.0, 1.0, 100)]):
        sim.at(float(t), check)
    sim.run()
    assert max(checked) > 20                 # many flows at once, and checked
    assert (sim.state[first[5:]] == DONE).all()
    if tight:
        assert len(sim._live._u_flow) >= 32 and len(sim._live._slot_link) >= 2 * 32


def test_flows_added_by_a_callback_in_the_middle_of_an_event_keep_it_going():
    # Flows 0 and 1 end together; on_done then adds 2,000 flows (every array
    # grows, in the middle of the event) with a new tag.  The event goes on:
    # flow 2 (waiting for flow 0) is released at that instant, and the tags
    # are reported as each one's last flow ends.
    star = Star(2)
    tags, added = [], []

    def on_done(ids, t):
        if not added:
            added.append(t)
            star.flows(np.zeros(2000, dtype=int), np.ones(2000, dtype=int))
            sim.add_flows(np.full(2000, 1000.0), tag=70)

    sim = star.sim(on_done=on_done, on_tag_done=lambda got, t: tags.append((got.tolist(), t)))
    star.flows([0, 1, 0], [1, 0, 1])
    sim.add_flows([MB, MB], tag=3)
    sim.add_flows([MB], after=[[0]], tag=4)
    sim.run()
    assert (sim.state == DONE).all() and sim.n_flows == 2003
    first_end = added[0]
    assert sim.end_s[0] == sim.end_s[1] == first_end
    assert sim.released_s[2] == first_end
    assert tags[0] == ([3], first_end)
    assert sorted(tag for got, _t in tags[1:] for tag in got) == [4, 70]
