"""Collectives as flow DAGs: step counts, bytes per link and endpoint, critical paths."""

from collections import Counter

import pytest

from traffic.collectives import (all_to_all, broadcast_tree, hierarchical_allreduce, m2n,
                                 pipeline_p2p, point_to_point, sinks, tree_depth,
                                 two_stage_broadcast)
from traffic.flows import Flow, FlowDag, FlowError, ring_allreduce

MB = 1_000_000
RATE = 8e6                                # 1 MB/s: one MB takes one second


def hosts(n, prefix="h"):
    return [f"{prefix}{i + 1}" for i in range(n)]


def pods_of(count, n):
    return [hosts(n, prefix=f"p{p}h") for p in range(count)]


def sent(dag):
    out = Counter()
    for f in dag.flows:
        out[f.src] += f.bytes
    return out


def received(dag):
    into = Counter()
    for f in dag.flows:
        into[f.dst] += f.bytes
    return into


def finish(dag, rate=RATE):
    return max(dag.ideal_finish_s(rate).values())


# ---------------------------------------------------------------- hierarchical all-reduce
@pytest.mark.parametrize("count,n", [(2, 2), (2, 4), (3, 2), (4, 3), (1, 4), (3, 1)])
def test_hierarchical_allreduce_steps_bytes_and_critical_path(count, n):
    size = 12 * MB
    pods = pods_of(count, n)
    dag = hierarchical_allreduce(pods, size)
    steps = 2 * (n - 1) + 2 * (count - 1)
    assert sorted({f.step for f in dag.flows}) == list(range(steps)), \
        f"P={count}, n={n}: steps {sorted({f.step for f in dag.flows})}, expected 0..{steps - 1}"
    pod_of = {h: p for p, members in enumerate(pods) for h in members}
    cross = Counter(f.src for f in dag.flows if pod_of[f.src] != pod_of[f.dst])
    for host in pod_of:
        assert sum(f.bytes for f in dag.flows if f.src == host
                   and pod_of[f.dst] == pod_of[host]) == pytest.approx(2 * (n - 1) * size / n), \
            f"{host} inside its PoD"
        assert sum(f.bytes for f in dag.flows if f.src == host
                   and pod_of[f.dst] != pod_of[host]) == pytest.approx(
                       2 * (count - 1) * size / (n * count)), f"{host} across PoDs"
    assert sum(f.bytes for f in dag.flows if pod_of[f.src] != pod_of[f.dst]) == \
        pytest.approx(2 * (count - 1) * size), "the core carries 2(P-1) x S in all"
    assert sent(dag) == received(dag), "every host sends as much as it receives"
    ideal = (2 * (n - 1) / n + 2 * (count - 1) / (n * count)) * size * 8 / RATE
    assert finish(dag) == pytest.approx(ideal), \
        f"critical path {finish(dag)} s, closed form {ideal} s"
    assert not cross or len(cross) == count * n, "every host takes part in the inter-PoD rings"


def test_hierarchical_allreduce_ids_name_the_stages_and_dependencies_chain():
    dag = hierarchical_allreduce(pods_of(2, 2), 4 * MB, group="dp")
    flows = dag.by_id()
    assert {i.split("-s")[0] for i in flows} == {"dp-rs-p0", "dp-rs-p1", "dp-x-i0", "dp-x-i1",
                                                 "dp-ag-p0", "dp-ag-p1"}
    # Host 1 of PoD 0 enters the inter-PoD ring once it received its reduced chunk
    # from host 0 and sent its own.
    assert set(flows["dp-x-i1-s0-r0"].after) == {"dp-rs-p0-s0-r0", "dp-rs-p0-s0-r1"}
    assert set(flows["dp-ag-p1-s0-r0"].after) == {"dp-x-i0-s1-r0", "dp-x-i0-s1-r1"}


def test_hierarchical_allreduce_spreads_the_core_load_over_every_host():
    count, n, size = 2, 4, 8 * MB
    pods = pods_of(count, n)
    pod_of = {h: p for p, members in enumerate(pods) for h in members}

    def core_hops(dag):
        hops = Counter()
        for f in dag.flows:
            if pod_of[f.src] != pod_of[f.dst]:
                hops[f.src, f.dst] += f.bytes
        return hops

    hier = core_hops(hierarchical_allreduce(pods, size))
    flat = core_hops(ring_allreduce([h for p in pods for h in p], size))
    assert len(hier) == count * n and set(hier.values()) == {2 * (count - 1) * size // (n * count)}
    assert len(flat) == count and set(flat.values()) == {2 * (count * n - 1) * size // (count * n)}
    assert max(flat.values()) / max(hier.values()) == pytest.approx(
        (count * n - 1) / (count - 1)), "a flat ring loads its core hops (N-1)/(P-1) times more"


@pytest.mark.parametrize("pods,message", [
    ([["a", "b"], ["c"]], "PoDs of equal size"),
    ([["a", "b"], ["b", "c"]], "hosts repeat"),
    ([["a"]], "at least 2 hosts"),
])
def test_hierarchical_allreduce_refuses_bad_pods(pods, message):
    with pytest.raises(FlowError, match=message):
        hierarchical_allreduce(pods, MB)


# ---------------------------------------------------------------- all-to-all
@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_all_to_all_has_n_n_minus_1_flows_in_n_minus_1_rounds(n):
    m = MB
    dag = all_to_all(hosts(n), m)
    assert len(dag.flows) == n * (n - 1)
    rounds = Counter(f.step for f in dag.flows)
    assert rounds == {r: n for r in range(n - 1)}, f"flows per round: {dict(rounds)}"
    assert Counter((f.src, f.dst) for f in dag.flows) == \
        {(a, b): 1 for a in hosts(n) for b in hosts(n) if a != b}, "each ordered pair once"
    for r in range(n - 1):
        step = [f for f in dag.flows if f.step == r]
        assert len({f.src for f in step}) == len({f.dst for f in step}) == n, \
            f"round {r}: every host sends once and receives once"
    assert set(sent(dag).values()) == set(received(dag).values()) == {(n - 1) * m}
    assert finish(dag) == pytest.approx((n - 1) * m * 8 / RATE)


def test_all_to_all_with_a_byte_map_skips_absent_pairs_and_keeps_the_send_order():
    sizes = {("a", "b"): 100, ("b", "c"): 200, ("c", "a"): 300, ("a", "c"): 50}
    dag = all_to_all(["a", "b", "c"], sizes, group="ep")
    assert {(f.src, f.dst): f.bytes for f in dag.flows} == sizes
    flows = dag.by_id()
    assert flows["ep-s1-r0"].after == ("ep-s0-r0",), "a's second send waits for its first"
    assert "ep-s1-r1" not in flows and "ep-s1-r2" not in flows, "b->a and c->b send nothing"


# ---------------------------------------------------------------- pipeline
@pytest.mark.parametrize("stages,micro", [(2, 1), (3, 4), (4, 2), (4, 8)])
def test_pipeline_gpipe_critical_path_and_bytes(stages, micro):
    size = 2 * MB
    layout = [[f"s{k}l0", f"s{k}l1"] for k in range(stages)]
    dag = pipeline_p2p(layout, size, micro)
    assert len(dag.flows) == 2 * micro * (stages - 1) * 2, "fwd + bwd, per hop, lane, micro-batch"
    per_link = Counter((f.src, f.dst) for f in dag.flows)
    assert set(per_link.values()) == {micro}, "each lane hop carries M transfers each way"
    waves = 2 * (micro + stages - 2)
    assert sorted({f.step for f in dag.flows}) == list(range(waves))
    t = size * 8 / RATE
    assert finish(dag) == pytest.approx(waves * t), f"GPipe: 2(M + K - 2) x S/B = {waves * t}"
    assert finish(dag) == pytest.approx(2 * (micro + stages - 2) * t)
    gap = 0.25
    assert finish(pipeline_p2p(layout, size, micro, compute_s=gap)) == \
        pytest.approx(waves * (t + gap)), "each transfer waits for its stage's compute"


def test_pipeline_forward_only_and_dependencies():
    dag = pipeline_p2p([["a"], ["b"], ["c"]], MB, 2, group="pp", backward=False,
                       start_after=("warm",))
    flows = dag.by_id()
    assert len(flows) == 4 and dag.external == ("warm",)
    assert flows["pp-f-m0-k0-l0"].after == ("warm",)
    assert set(flows["pp-f-m1-k1-l0"].after) == {"pp-f-m1-k0-l0", "pp-f-m0-k1-l0"}
    assert finish(FlowDag.merge(FlowDag([Flow("warm", "x", "y", 1)]), dag)) > 0


def test_pipeline_backward_waits_for_the_last_forward_at_the_last_stage():
    flows = pipeline_p2p([["a", "A"], ["b", "B"], ["c", "C"]], MB, 3, group="pp").by_id()
    first_back = flows["pp-b-m0-k1-l0"]
    assert set(first_back.after) == {"pp-f-m2-k1-l0", "pp-f-m2-k1-l1"}, \
        "GPipe flush: backward starts after every lane's last forward"
    assert first_back.src == "c" and first_back.dst == "b"
    assert set(flows["pp-b-m0-k0-l1"].after) == {"pp-b-m0-k1-l0", "pp-b-m0-k1-l1"}


# ---------------------------------------------------------------- m2n
@pytest.mark.parametrize("m,n", [(1, 3), (3, 2), (4, 4)])
def test_m2n_bipartite_bytes_and_combine(m, n):
    size = MB
    senders, receivers = hosts(m, "a"), hosts(n, "f")
    dispatch = m2n(senders, receivers, size)
    assert len(dispatch.flows) == m * n and {f.step for f in dispatch.flows} == {0}
    assert set(sent(dispatch).values()) == {n * size}
    assert set(received(dispatch).values()) == {m * size}
    assert finish(dispatch) == pytest.approx(size * 8 / RATE)
    both = m2n(senders, receivers, size, combine=True)
    assert len(both.flows) == 2 * m * n
    back = [f for f in both.flows if f.step == 1]
    assert all(len(f.after) == m for f in back), "an FFN answers once all its tokens arrived"
    assert finish(both) == pytest.approx(2 * size * 8 / RATE)


def test_m2n_skips_a_host_in_both_sets():
    dag = m2n(["a", "b"], ["b", "c"], 10)
    assert ("b", "b") not in {(f.src, f.dst) for f in dag.flows}
    assert len(dag.flows) == 3


def test_point_to_point_runs_all_at_once():
    dag = point_to_point([("a", "b", 5), ("c", "d", 7)], group="kv")
    assert [f.id for f in dag.flows] == ["kv-0", "kv-1"] and dag.total_bytes() == 12
    assert finish(dag, 8.0) == pytest.approx(7.0)


# ---------------------------------------------------------------- broadcast
@pytest.mark.parametrize("members,fanout", [(1, 2), (6, 2), (7, 2), (12, 3), (5, 1)])
def test_broadcast_tree_bytes_depth_and_critical_path(members, fanout):
    size = 4 * MB
    dag = broadcast_tree("root", hosts(members), size, fanout)
    nodes = ["root"] + hosts(members)
    assert len(dag.flows) == members and dag.total_bytes() == members * size
    assert set(received(dag).values()) == {size} and "root" not in received(dag)
    children = Counter((i - 1) // fanout for i in range(1, len(nodes)))
    assert sent(dag) == {nodes[p]: c * size for p, c in children.items()}
    assert max(children.values()) <= fanout
    depth = tree_depth(len(nodes), fanout)
    assert finish(dag) == pytest.approx(depth * size * 8 / RATE)
    assert max(f.step for f in dag.flows) == depth - 1


@pytest.mark.parametrize("nodes,fanout,depth", [(2, 2, 1), (3, 2, 1), (4, 2, 2), (7, 2, 2),
                                                (8, 2, 3), (13, 3, 2), (14, 3, 3), (5, 1, 4)])
def test_tree_depth_closed_form(nodes, fanout, depth):
    assert tree_depth(nodes, fanout) == depth


@pytest.mark.parametrize("chunks", [1, 2, 4])
def test_chunked_broadcast_pipelines(chunks):
    size = 4 * MB
    dag = broadcast_tree("r", hosts(6), size, fanout=2, chunks=chunks)
    depth = tree_depth(7, 2)
    t = size / chunks * 8 / RATE
    assert finish(dag) == pytest.approx((depth + chunks - 1) * t), \
        f"(D + C - 1) x S/(C B) with D={depth}, C={chunks}"
    assert set(received(dag).values()) == {size}


def test_two_stage_broadcast_trees_wait_for_their_roots():
    stage1 = [("t1", "g0", 3 * MB), ("t2", "g0", 3 * MB), ("t1", "k0", 3 * MB),
              ("t2", "k0", 3 * MB)]
    trees = [("g0", ["g1", "g2", "g3"], 6 * MB), ("k0", ["k1"], 6 * MB)]
    dag = two_stage_broadcast(stage1, trees, fanout=2, group="ws")
    flows = dag.by_id()
    assert set(flows["ws-b0-c0-n1"].after) == {"ws-t2g-0", "ws-t2g-1"}
    assert set(flows["ws-b1-c0-n1"].after) == {"ws-t2g-2", "ws-t2g-3"}
    assert {f.group for f in dag.flows} == {"ws"}
    assert received(dag)["g0"] == 6 * MB and received(dag)["k0"] == 6 * MB, \
        "each PoD's DP-0 gets one full copy in stage 1"
    assert all(received(dag)[h] == 6 * MB for h in ("g1", "g2", "g3", "k1"))
    assert sorted({f.step for f in dag.flows}) == [0, 1, 2]
    assert finish(dag) == pytest.approx(3 + 6 * tree_depth(4, 2)), \
        "stage 1 (3 s) then the deeper tree (2 levels of 6 s)"
    assert set(sinks(dag)) == {"ws-b0-c0-n2", "ws-b0-c0-n3", "ws-b1-c0-n1"}


# ---------------------------------------------------------------- label
def test_label_sets_the_group_but_not_the_ids_or_anything_else():
    def relabelled(dag, label):
        return [Flow(f.id, f.src, f.dst, f.bytes, f.at_s, f.after, f.step, label)
                for f in dag.flows]

    plain = all_to_all(hosts(4), 400, group="a2a", start_after=("w",))
    assert all_to_all(hosts(4), 400, group="a2a", start_after=("w",), label="ep").flows == \
        relabelled(plain, "ep")
    plain = hierarchical_allreduce(pods_of(2, 3), 6000, group="hier")
    assert hierarchical_allreduce(pods_of(2, 3), 6000, group="hier", label="dp").flows == \
        relabelled(plain, "dp")


@pytest.mark.parametrize("n", [2, 3, 5])
def test_a_ring_all_reduce_knows_its_sinks_and_they_are_what_nothing_waits_for(n):
    dag = ring_allreduce([f"h{i}" for i in range(n)], 1200, "dp", start_after=("x", "y"))
    waited = {dep for flow in dag.flows for dep in flow.after}
    by_scan = tuple(flow.id for flow in dag.flows if flow.id not in waited)
    assert dag._sinks is not None
    assert sinks(dag) == by_scan == tuple(f"dp-s{2 * n - 3}-r{i}" for i in range(n))
    # Built trusted, it is what validation would make of it.
    FlowDag(list(dag.flows), external=dag.external).validate()
    assert dag._listed and dag.external == ("x", "y")
    # A compute gap before it (as a phase chains its operations) keeps them.
    from traffic.phases import _with_gap
    gapped = _with_gap(dag, ("x", "y"), 0.5)
    assert gapped.flows[0].at_s == 0.5 and sinks(gapped) == by_scan
