"""Flows, flow DAGs and the ring all-reduce: structure, dependencies and the ideal."""

from collections import Counter

import pytest

from traffic.flows import Flow, FlowDag, FlowError, allreduce_ideal_s, ring_allreduce

MB = 1_000_000


def hosts(n):
    return [f"h{i + 1}" for i in range(n)]


# ---------------------------------------------------------------- validation
def test_a_flow_to_itself_is_refused():
    with pytest.raises(FlowError, match="flow f1: source and destination are both h1"):
        Flow("f1", "h1", "h1", 10)


@pytest.mark.parametrize("size", [0, -5])
def test_non_positive_bytes_are_refused(size):
    with pytest.raises(FlowError, match=f"flow f1: bytes must be > 0, got {size}"):
        Flow("f1", "h1", "h2", size)


def test_negative_start_is_refused():
    with pytest.raises(FlowError, match="flow f1: at_s must be >= 0"):
        Flow("f1", "h1", "h2", 10, at_s=-1.0)


def test_duplicate_ids_are_refused():
    with pytest.raises(FlowError, match=r"duplicate flow ids: \['a'\]"):
        FlowDag([Flow("a", "h1", "h2", 1), Flow("b", "h2", "h3", 1), Flow("a", "h3", "h1", 1)])


def test_unknown_dependencies_are_refused():
    with pytest.raises(FlowError, match=r"flow b waits for unknown flows \['ghost'\]"):
        FlowDag([Flow("a", "h1", "h2", 1), Flow("b", "h2", "h3", 1, after=("a", "ghost"))])


def test_cycles_are_refused_and_named():
    flows = [Flow("a", "h1", "h2", 1, after=("c",)), Flow("b", "h2", "h3", 1, after=("a",)),
             Flow("c", "h3", "h1", 1, after=("b",))]
    with pytest.raises(FlowError, match=r"cycle: a -> c -> b -> a"):
        FlowDag(flows)


def test_self_dependency_is_a_cycle():
    with pytest.raises(FlowError, match="cycle: a -> a"):
        FlowDag([Flow("a", "h1", "h2", 1, after=("a",))])


def test_topological_order_puts_dependencies_first():
    dag = FlowDag([Flow("late", "h1", "h2", 1, after=("mid",)),
                   Flow("mid", "h2", "h3", 1, after=("early",)),
                   Flow("early", "h3", "h1", 1)])
    assert [f.id for f in dag.topological_order()] == ["early", "mid", "late"]


def test_ideal_finish_follows_the_critical_path():
    rate = 8e6                                   # 1 MB/s
    dag = FlowDag([Flow("a", "h1", "h2", MB), Flow("b", "h2", "h3", 2 * MB),
                   Flow("c", "h3", "h1", MB, after=("a", "b"), at_s=0.5)])
    finish = dag.ideal_finish_s(rate)
    assert finish == pytest.approx({"a": 1.0, "b": 2.0, "c": 3.5}), \
        "c starts after the slower of a and b, plus its 0.5 s gap"
    assert dag.ideal_finish_s(rate, startup_s=0.1)["c"] == pytest.approx(3.7), \
        "each flow pays the start-up once: b ends at 2.1, c at 2.1 + 0.5 + 0.1 + 1"
    assert dag.total_bytes() == 4 * MB


# ---------------------------------------------------------------- ring all-reduce
@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_allreduce_has_2n_minus_2_steps_of_n_flows(n):
    size = 1000 * n
    dag = ring_allreduce(hosts(n), size)
    steps = Counter(f.step for f in dag.flows)
    assert sorted(steps) == list(range(2 * (n - 1))), f"steps: {sorted(steps)}"
    assert set(steps.values()) == {n}, f"flows per step: {dict(steps)}"
    assert {f.bytes for f in dag.flows} == {size // n}, "every flow carries S/N bytes"
    assert dag.total_bytes() == 2 * (n - 1) * size
    assert {f.group for f in dag.flows} == {"allreduce"}


@pytest.mark.parametrize("n", [2, 3, 5])
def test_every_rank_sends_to_the_next_rank(n):
    ring = hosts(n)[::-1]                         # any order: the ring is the list's order
    for flow in ring_allreduce(ring, 100 * n).flows:
        rank = int(flow.id.rsplit("-r", 1)[1])
        assert flow.src == ring[rank] and flow.dst == ring[(rank + 1) % n], \
            f"{flow.id}: {flow.src}->{flow.dst}, expected {ring[rank]}->{ring[(rank + 1) % n]}"


def test_dependencies_are_the_previous_step_of_this_rank_and_the_previous_rank():
    n = 4
    dag = ring_allreduce(hosts(n), 4000, start_after=())
    flows = dag.by_id()
    for step in range(2 * (n - 1)):
        for rank in range(n):
            flow = flows[f"allreduce-s{step}-r{rank}"]
            if step == 0:
                assert flow.after == (), f"{flow.id} should start at once"
            else:
                assert set(flow.after) == {f"allreduce-s{step - 1}-r{(rank - 1) % n}",
                                           f"allreduce-s{step - 1}-r{rank}"}, \
                    f"{flow.id} waits for {flow.after}"


def test_first_step_waits_for_start_after():
    warmup = Flow("warmup", "h9", "h10", 1)
    dag = ring_allreduce(hosts(3), 300, group="ar", start_after=("warmup",))
    assert all(f.after == ("warmup",) for f in dag.flows if f.step == 0)
    assert dag.external == ("warmup",)
    merged = FlowDag.merge(FlowDag([warmup]), dag)   # valid once warmup is in it
    assert merged.topological_order()[0].id == "warmup"
    assert not merged.external
    with pytest.raises(FlowError, match="unknown flows"):
        FlowDag(dag.flows)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_dag_critical_path_equals_the_alpha_beta_ideal(n):
    size, rate = 8 * MB, 10e6
    dag = ring_allreduce(hosts(n), size)
    finish = max(dag.ideal_finish_s(rate).values())
    expected = 2 * (n - 1) / n * size * 8 / rate
    assert allreduce_ideal_s(n, size, rate) == pytest.approx(expected)
    assert finish == pytest.approx(expected), \
        f"N={n}: critical path {finish} s, 2(N-1)/N x S/B = {expected} s"


@pytest.mark.parametrize("n", [3, 4, 6])
def test_each_link_direction_carries_s_over_n_per_step(n):
    size = 600 * n
    dag = ring_allreduce(hosts(n), size)
    for step in range(2 * (n - 1)):
        per_link = Counter()
        for flow in dag.flows:
            if flow.step == step:
                per_link[(flow.src, flow.dst)] += flow.bytes
        assert len(per_link) == n, f"step {step}: {n} ring links expected, got {dict(per_link)}"
        assert set(per_link.values()) == {size // n}, f"step {step}: {dict(per_link)}"


@pytest.mark.parametrize("ring,message", [
    (["h1"], "needs at least 2 hosts, got 1"),
    (["h1", "h2", "h1"], "hosts repeat"),
])
def test_ring_allreduce_refuses_bad_rings(ring, message):
    with pytest.raises(FlowError, match=message):
        ring_allreduce(ring, 1000)


def test_tiny_allreduce_still_sends_a_byte_per_flow():
    dag = ring_allreduce(hosts(4), 2)
    assert {f.bytes for f in dag.flows} == {1}
