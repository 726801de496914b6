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


# ---------------------------------------------------------------- fast paths
def _reference_order(flows):
    """The original recursive depth-first post-order."""
    by_id, order, state = {f.id: f for f in flows}, [], {}

    def visit(fid):
        if state.get(fid) == "done":
            return
        state[fid] = "active"
        for dep in by_id[fid].after:
            if dep in by_id:
                visit(dep)
        state[fid] = "done"
        order.append(by_id[fid])

    for flow in flows:
        visit(flow.id)
    return order


def test_a_list_out_of_order_gets_the_same_order_as_before():
    import random
    rng = random.Random(7)
    for trial in range(20):
        n = 60
        shared = tuple(f"f{i}" for i in range(10))          # a long tuple many flows share
        flows = []
        for i in range(n):
            if i > 20 and trial % 2:
                after = shared
            else:
                after = tuple(f"f{j}" for j in rng.sample(range(i), min(i, rng.randint(0, 3))))
            flows.append(Flow(f"f{i}", "h1", "h2", 1 + i, after=after))
        rng.shuffle(flows)
        dag = FlowDag(flows)
        assert [f.id for f in dag.topological_order()] == \
            [f.id for f in _reference_order(flows)]
        ordered = FlowDag(dag.topological_order())
        assert dag.ideal_finish_s(8e6, 0.01) == ordered.ideal_finish_s(8e6, 0.01), \
            "the finish times do not depend on the listing order"


def test_a_listed_in_order_dag_keeps_its_order():
    dag = ring_allreduce(hosts(4), 4000)
    assert dag.topological_order() == dag.flows


def test_long_chains_need_no_recursion():
    n = 5000                                     # deeper than the recursion limit
    flows = [Flow(f"f{i}", "h1", "h2", 1, after=(f"f{i - 1}",) if i else ())
             for i in range(n)][::-1]            # listed last first: a depth-first walk
    dag = FlowDag(flows)
    assert [f.id for f in dag.topological_order()] == [f"f{i}" for i in range(n)]
    finish = dag.ideal_finish_s(8e6)
    assert finish[f"f{n - 1}"] == pytest.approx(n * 8 / 8e6)


def test_a_cycle_behind_a_long_shared_tuple_is_named():
    shared = tuple(f"s{i}" for i in range(12))
    flows = [Flow(f"s{i}", "h1", "h2", 1, after=("late",) if i == 3 else ()) for i in range(12)]
    flows += [Flow("late", "h2", "h3", 1, after=shared)]
    with pytest.raises(FlowError, match=r"cycle: s3 -> late -> s3"):
        FlowDag(flows)


def test_several_duplicates_are_all_listed_sorted():
    flows = [Flow(i, "h1", "h2", 1) for i in ("b", "a", "c", "b", "a", "d")]
    with pytest.raises(FlowError, match=r"duplicate flow ids: \['a', 'b'\]"):
        FlowDag(flows)


def test_an_unknown_flow_in_a_long_shared_tuple_is_named():
    start = tuple(f"x{i}" for i in range(12))
    flows = [Flow(f"f{i}", "h1", "h2", 1, after=start + ("ghost",)) for i in range(3)]
    with pytest.raises(FlowError, match=r"flow f0 waits for unknown flows \['ghost'\]"):
        FlowDag(flows, external=start)
    mixed = [Flow("a", "h1", "h2", 1)] + [Flow(f"f{i}", "h1", "h2", 1, after=("a",) + start)
                                          for i in range(3)]
    assert [f.id for f in FlowDag(mixed, external=start).topological_order()] == \
        ["a", "f0", "f1", "f2"], "seen and external dependencies mixed in one tuple"


def test_an_external_id_that_is_also_a_flow_counts_as_internal():
    start = tuple(f"r-s1-r{i}" for i in range(12))     # the ring's own step-1 ids
    with pytest.raises(FlowError, match="cycle"):
        ring_allreduce(hosts(12), 1200, group="r", start_after=start)


def test_private_replace_checks_like_the_constructor():
    flow = Flow("f1", "h1", "h2", 10, after=("x",), step=3, group="g")
    copy = flow._replace(group="other", at_s=0.5)
    assert copy == Flow("f1", "h1", "h2", 10, at_s=0.5, after=("x",), step=3, group="other")
    assert flow.group == "g"
    with pytest.raises(FlowError, match="flow f1: at_s must be >= 0"):
        flow._replace(at_s=-1.0)


def test_ring_label_sets_the_group_but_not_the_ids():
    dag = ring_allreduce(hosts(3), 300, group="ar-c0", label="train-dp")
    assert {f.group for f in dag.flows} == {"train-dp"}
    assert dag.flows == [Flow(f.id, f.src, f.dst, f.bytes, f.at_s, f.after, f.step, "train-dp")
                         for f in ring_allreduce(hosts(3), 300, group="ar-c0").flows]


def test_a_dag_joined_from_validated_parts_is_checked_like_a_new_one():
    first = ring_allreduce(hosts(3), 300, group="a")
    second = ring_allreduce(hosts(3), 300, group="b", start_after=("a-s3-r0", "a-s3-r2"))
    joined = FlowDag._joined(first.flows + second.flows, [first, second])
    assert joined == FlowDag(first.flows + second.flows) and not joined.external
    assert joined.topological_order() == first.flows + second.flows
    with pytest.raises(FlowError, match=r"flow b-s0-r0 waits for unknown flows \['a-s3-r0', "):
        FlowDag._joined(second.flows + first.flows[:1], [second, FlowDag(first.flows[:1])])
    with pytest.raises(FlowError, match=r"duplicate flow ids: \['a-s0-r0', "):
        FlowDag._joined(first.flows + first.flows, [first, first])
    # the second part listed before the first: out of order, still valid
    late = FlowDag._joined(second.flows + first.flows, [second, first])
    assert [f.id for f in late.topological_order()] == \
        [f.id for f in _reference_order(second.flows + first.flows)]
    looped = FlowDag([Flow("x", "h1", "h2", 1, after=("y",))], external=("y",))
    with pytest.raises(FlowError, match="cycle: x -> y -> x"):
        FlowDag._joined(looped.flows + [Flow("y", "h2", "h1", 1, after=("x",))],
                        [looped, FlowDag([Flow("y", "h2", "h1", 1, after=("x",))],
                                         external=("x",))])
