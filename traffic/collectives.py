"""Collectives as flow DAGs: one implementation each, shared by every scenario.

Every builder takes host names, sizes in (emulated) bytes, a ``group`` that
prefixes the flow ids, and ``start_after``: ids of flows in another DAG that
the first flows wait for (the result then lists them in ``external`` and is
joined with `FlowDag.merge`).  ``Flow.step`` numbers the steps of the
schedule.  Closed forms, with B the rate of every link and no contention
(what `FlowDag.ideal_finish_s` computes):

====================  =========================================  ==========================
builder               steps                                      ideal critical path
====================  =========================================  ==========================
ring_allreduce        2(N-1)  (in `traffic.flows`)               2(N-1)/N x S/B
hierarchical_...      2(n-1) + 2(P-1)                            (2(n-1)/n + 2(P-1)/(nP)) S/B
all_to_all            N-1 rounds of N flows                      (N-1) x m/B
pipeline_p2p          2(M + K - 2) wavefronts (GPipe)            2(M + K - 2) x (S/B + c)
m2n                   1 (dispatch), 2 with combine               m/B, 2m/B
broadcast_tree        D + C - 1 (depth D, C chunks)              (D + C - 1) x S/(C B)
two_stage_broadcast   1 + the trees'                             stage 1 + the deepest tree
====================  =========================================  ==========================

The ideal ignores that a NIC sending to several peers at once shares its
rate (all-to-all rounds, m2n, tree fan-out); the replay measures that.
"""

from __future__ import annotations

import dataclasses
from itertools import chain, filterfalse
from operator import attrgetter
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from traffic.flows import Flow, FlowDag, FlowError, _ring_steps, ring_allreduce

PairBytes = Union[int, Mapping[Tuple[str, str], int]]

_AFTER, _ID = attrgetter("after"), attrgetter("id")

__all__ = ["ring_allreduce", "hierarchical_allreduce", "all_to_all", "pipeline_p2p", "m2n",
           "point_to_point", "broadcast_tree", "two_stage_broadcast", "sinks", "tree_depth"]


def sinks(dag: FlowDag) -> Tuple[str, ...]:
    """Ids of the flows nothing in the DAG waits for: where it ends (in list
    order; given by the builder where it knows them)."""
    if dag._sinks is not None:
        return dag._sinks
    afters = list(map(_AFTER, dag.flows))
    distinct = dict(zip(map(id, afters), afters)).values()   # a shared tuple once
    waited = set(chain.from_iterable(distinct))
    return tuple(filterfalse(waited.__contains__, map(_ID, dag.flows)))


def _unique(hosts: Sequence[str], what: str) -> None:
    if len(set(hosts)) != len(hosts):
        raise FlowError(f"{what}: hosts repeat: {list(hosts)}")


def _pair_bytes(sizes: PairBytes, src: str, dst: str) -> int:
    if isinstance(sizes, Mapping):
        return int(sizes.get((src, dst), 0))
    return int(sizes)


# ---------------------------------------------------------------- all-reduce
def _ring_pass(hosts: Sequence[str], chunk: int, steps: int, prefix: str, group: str,
               first_step: int, entry: Mapping[int, Tuple[str, ...]]) -> List[Flow]:
    """``steps`` ring steps (as in `ring_allreduce`); step 0 of rank i waits entry[i]."""
    return _ring_steps(hosts, chunk, steps, prefix, group, first_step,
                       [tuple(entry[i]) for i in range(len(hosts))])


def _held(prefix: str, steps: int, n: int, i: int) -> Tuple[str, ...]:
    """Rank i of a ring pass is done: it received its last chunk and sent its own."""
    return (f"{prefix}-s{steps - 1}-r{(i - 1) % n}", f"{prefix}-s{steps - 1}-r{i}")


def hierarchical_allreduce(pods: Sequence[Sequence[str]], total_bytes: int,
                           group: str = "hier-allreduce",
                           start_after: Iterable[str] = (), *,
                           label: Optional[str] = None) -> FlowDag:
    """All-reduce of S bytes over P PoDs of n hosts each, in three stages.

    1. Intra-PoD reduce-scatter: a ring inside each PoD, n-1 steps of S/n;
       host i then holds chunk i of its PoD's sum (ids ``{group}-rs-p{p}``).
    2. Inter-PoD all-reduce: n parallel rings, ring i joining host i of every
       PoD, each a ring all-reduce of its S/n chunk: 2(P-1) steps of S/(nP)
       (ids ``{group}-x-i{i}``).  Only this stage crosses the core.
    3. Intra-PoD all-gather: the PoD rings again, n-1 steps of S/n
       (ids ``{group}-ag-p{p}``).

    Each host sends 2(n-1)/n x S inside its PoD and 2(P-1)/(nP) x S across
    PoDs: the core carries 2(P-1) x S in all, spread over all nP hosts,
    where a flat ring over the N = nP hosts puts 2(N-1)/N x S on each of its
    P PoD-crossing hops ((N-1)/(P-1) >= n times the load per hop).  A host
    enters a stage once it received its last chunk of the previous one and
    sent its own.  n = 1 leaves only stage 2; P = 1 only stages 1 and 3 (a
    ring all-reduce).  ``label`` is the flows' ``Flow.group`` (default: ``group``).
    """
    count, n = len(pods), len(pods[0]) if pods else 0
    if count < 1 or n < 1 or any(len(p) != n for p in pods):
        raise FlowError(f"hierarchical all-reduce needs PoDs of equal size, got "
                        f"{[len(p) for p in pods]}")
    _unique([h for p in pods for h in p], "hierarchical all-reduce")
    if count * n < 2:
        raise FlowError("hierarchical all-reduce needs at least 2 hosts")
    start = tuple(start_after)
    label = group if label is None else label
    local, cross = max(1, total_bytes // n), max(1, total_bytes // (n * count))
    flows: List[Flow] = []
    ready = {(p, i): start for p in range(count) for i in range(n)}
    step = 0
    if n > 1:
        for p, hosts in enumerate(pods):
            prefix = f"{group}-rs-p{p}"
            flows += _ring_pass(hosts, local, n - 1, prefix, label, step,
                                {i: ready[p, i] for i in range(n)})
            for i in range(n):
                ready[p, i] = _held(prefix, n - 1, n, i)
        step += n - 1
    if count > 1:
        for i in range(n):
            prefix = f"{group}-x-i{i}"
            ring = [pods[p][i] for p in range(count)]
            flows += _ring_pass(ring, cross, 2 * (count - 1), prefix, label, step,
                                {p: ready[p, i] for p in range(count)})
            for p in range(count):
                ready[p, i] = _held(prefix, 2 * (count - 1), count, p)
        step += 2 * (count - 1)
    if n > 1:
        for p, hosts in enumerate(pods):
            flows += _ring_pass(hosts, local, n - 1, f"{group}-ag-p{p}", label, step,
                                {i: ready[p, i] for i in range(n)})
    return FlowDag(flows, external=start)


# ---------------------------------------------------------------- all-to-all
def all_to_all(hosts: Sequence[str], bytes_per_pair: PairBytes, group: str = "alltoall",
               start_after: Iterable[str] = (), *, label: Optional[str] = None) -> FlowDag:
    """N(N-1) flows in N-1 rounds: in round r host i sends to host i+r (mod N).

    Linear shift schedule: every host sends to one peer and receives from one
    peer per round, and starts round r once its send of round r-1 is done.
    ``bytes_per_pair`` is one size m for every pair or a {(src, dst): bytes}
    mapping (pairs absent or 0 send nothing).  Ids ``{group}-s{r-1}-r{i}``;
    ``label`` is the flows' ``Flow.group`` (default: ``group``).
    """
    n = len(hosts)
    if n < 2:
        raise FlowError(f"all-to-all needs at least 2 hosts, got {n}")
    _unique(hosts, "all-to-all")
    start = tuple(start_after)
    label = group if label is None else label
    last: Dict[int, Tuple[str, ...]] = {i: start for i in range(n)}
    flows = []
    for r in range(1, n):
        for i in range(n):
            size = _pair_bytes(bytes_per_pair, hosts[i], hosts[(i + r) % n])
            if size <= 0:
                continue
            flow = Flow(id=f"{group}-s{r - 1}-r{i}", src=hosts[i], dst=hosts[(i + r) % n],
                        bytes=size, after=last[i], step=r - 1, group=label)
            flows.append(flow)
            last[i] = (flow.id,)
    return FlowDag(flows, external=start)


# ---------------------------------------------------------------- pipeline
def pipeline_p2p(stages: Sequence[Sequence[str]], bytes_per_flow: int, micro_batches: int,
                 group: str = "pipeline", start_after: Iterable[str] = (),
                 backward: bool = True, compute_s: float = 0.0) -> FlowDag:
    """Pipeline-parallel send/recv, GPipe schedule, K stages and M micro-batches.

    ``stages[k]`` are the hosts of stage k, one per lane (TP rank); lane j of
    stage k sends to lane j of stage k+1.  Forward F(m, k): micro-batch m
    from stage k to k+1, after F(m, k-1) of every lane (stage k has the whole
    activation) and F(m-1, k) of its lane.  Backward (GPipe: after the last
    forward reached the last stage) B(m, k) from stage k+1 to k, after
    B(m, k+1) of every lane and B(m-1, k) of its lane.  Every flow waits
    ``compute_s`` (the stage's compute) after its dependencies.  Step of
    F(m, k) is m + k; of B(m, k) it is (M + K - 2) + m + (K - 2 - k).
    Per lane and stage boundary: M x S forward and M x S backward.
    """
    depth = len(stages)
    lanes = len(stages[0]) if stages else 0
    if depth < 2 or lanes < 1 or any(len(s) != lanes for s in stages):
        raise FlowError(f"pipeline needs >= 2 stages of equal width, got "
                        f"{[len(s) for s in stages]}")
    if micro_batches < 1:
        raise FlowError(f"pipeline needs micro_batches >= 1, got {micro_batches}")
    _unique([h for s in stages for h in s], "pipeline")
    start, width = tuple(start_after), range(lanes)
    last_hop = depth - 2
    flows = []

    def fid(way, m, k, j):
        return f"{group}-{way}-m{m}-k{k}-l{j}"

    for m in range(micro_batches):
        for k in range(depth - 1):
            for j in width:
                deps = [fid("f", m, k - 1, x) for x in width] if k else list(start if m == 0
                                                                            else ())
                if m:
                    deps.append(fid("f", m - 1, k, j))
                flows.append(Flow(id=fid("f", m, k, j), src=stages[k][j], dst=stages[k + 1][j],
                                  bytes=bytes_per_flow, at_s=compute_s, after=tuple(deps),
                                  step=m + k, group=group))
    if backward:
        wave = micro_batches + depth - 2
        for m in range(micro_batches):
            for k in range(last_hop, -1, -1):
                for j in width:
                    if k == last_hop:
                        deps = [fid("f", micro_batches - 1, last_hop, x) for x in width]
                    else:
                        deps = [fid("b", m, k + 1, x) for x in width]
                    if m:
                        deps.append(fid("b", m - 1, k, j))
                    flows.append(Flow(id=fid("b", m, k, j), src=stages[k + 1][j],
                                      dst=stages[k][j], bytes=bytes_per_flow, at_s=compute_s,
                                      after=tuple(deps), step=wave + m + (last_hop - k),
                                      group=group))
    return FlowDag(flows, external=start)


# ---------------------------------------------------------------- bipartite
def m2n(senders: Sequence[str], receivers: Sequence[str], bytes_per_pair: PairBytes,
        group: str = "m2n", start_after: Iterable[str] = (), combine: bool = False) -> FlowDag:
    """M x N bipartite exchange (Table 1's M2N: A/F, P/D).

    Dispatch: every sender to every receiver at once (step 0, ids
    ``{group}-d-{i}-{j}``).  With ``combine`` each receiver answers every
    sender (step 1, ids ``{group}-c-{j}-{i}``) once everything sent to it has
    arrived (A/F: the FFN needs all its tokens).  A host in both sets does
    not send to itself.  Per sender N x m out; per receiver M x m in.
    """
    if not senders or not receivers:
        raise FlowError(f"m2n needs senders and receivers, got {len(senders)} and "
                        f"{len(receivers)}")
    _unique(senders, "m2n senders")
    _unique(receivers, "m2n receivers")
    start = tuple(start_after)
    flows, into = [], {j: [] for j in range(len(receivers))}
    for i, src in enumerate(senders):
        for j, dst in enumerate(receivers):
            size = _pair_bytes(bytes_per_pair, src, dst)
            if src == dst or size <= 0:
                continue
            flows.append(Flow(id=f"{group}-d-{i}-{j}", src=src, dst=dst, bytes=size,
                              after=start, step=0, group=group))
            into[j].append((i, flows[-1].id))
    if combine:
        for j, arrived in into.items():
            for i, _ in arrived:
                size = _pair_bytes(bytes_per_pair, senders[i], receivers[j])
                flows.append(Flow(id=f"{group}-c-{j}-{i}", src=receivers[j], dst=senders[i],
                                  bytes=size, after=tuple(fid for _, fid in arrived), step=1,
                                  group=group))
    return FlowDag(flows, external=start)


def point_to_point(transfers: Sequence[Tuple[str, str, int]], group: str = "p2p",
                   start_after: Iterable[str] = (), step: int = 0) -> FlowDag:
    """Independent messages (src, dst, bytes), all at once: ids ``{group}-{k}``."""
    start = tuple(start_after)
    flows = [Flow(id=f"{group}-{k}", src=s, dst=d, bytes=int(b), after=start, step=step,
                  group=group) for k, (s, d, b) in enumerate(transfers)]
    return FlowDag(flows, external=start)


# ---------------------------------------------------------------- broadcast
def tree_depth(nodes: int, fanout: int) -> int:
    """Depth of the heap-ordered k-ary tree over ``nodes`` nodes (root: 0)."""
    depth, last = 0, nodes - 1
    while last > 0:
        last = (last - 1) // fanout
        depth += 1
    return depth


def broadcast_tree(root: str, members: Sequence[str], total_bytes: int, fanout: int = 2,
                   chunks: int = 1, group: str = "bcast",
                   start_after: Iterable[str] = ()) -> FlowDag:
    """Broadcast S bytes from ``root`` over a ``fanout``-ary tree (2: binary).

    Nodes are [root] + members in heap order: node i's parent is
    (i - 1) // fanout.  S goes in C ``chunks``, pipelined: chunk c to node i
    (id ``{group}-c{c}-n{i}``) waits for chunk c at the parent and chunk c-1
    to node i.  Every member receives S; an inner node sends S to each of
    its children; (N-1) x S in all.  Steps: depth D + C - 1.
    """
    nodes = [root] + list(members)
    _unique(nodes, "broadcast tree")
    if len(nodes) < 2:
        raise FlowError("broadcast tree needs at least one member besides the root")
    if fanout < 1 or chunks < 1:
        raise FlowError(f"broadcast tree needs fanout >= 1 and chunks >= 1, got {fanout}, "
                        f"{chunks}")
    start = tuple(start_after)
    size = max(1, total_bytes // chunks)
    level = [0] * len(nodes)
    flows = []
    for i in range(1, len(nodes)):
        parent = (i - 1) // fanout
        level[i] = level[parent] + 1
        for c in range(chunks):
            deps = list(start) if parent == 0 and c == 0 else []
            if parent:
                deps.append(f"{group}-c{c}-n{parent}")
            if c:
                deps.append(f"{group}-c{c - 1}-n{i}")
            flows.append(Flow(id=f"{group}-c{c}-n{i}", src=nodes[parent], dst=nodes[i],
                              bytes=size, after=tuple(deps), step=level[i] - 1 + c, group=group))
    return FlowDag(flows, external=start)


def two_stage_broadcast(stage1: Sequence[Tuple[str, str, int]],
                        trees: Sequence[Tuple[str, Sequence[str], int]], fanout: int = 2,
                        chunks: int = 1, group: str = "weight-sync",
                        start_after: Iterable[str] = ()) -> FlowDag:
    """Section 3's weight sync: T2G transfers, then a broadcast tree per root.

    Stage 1 (step 0, ids ``{group}-t2g-{k}``): the (src, dst, bytes) messages
    from the Train ranks to the DP-0 replica of each Gen PoD.  Stage 2: each
    (root, members, bytes) tree (ids ``{group}-b{t}-...``) starts once every
    stage-1 message into its root has arrived, its steps after stage 1's.
    """
    start = tuple(start_after)
    first = point_to_point(stage1, f"{group}-t2g", start, step=0)
    flows = [dataclasses.replace(f, group=group) for f in first.flows]
    offset = 1 if stage1 else 0
    for t, (root, members, size) in enumerate(trees):
        into = tuple(f.id for f in first.flows if f.dst == root) or start
        tree = broadcast_tree(root, members, size, fanout, chunks, f"{group}-b{t}", into)
        flows += [dataclasses.replace(f, step=f.step + offset, group=group) for f in tree.flows]
    return FlowDag(flows, external=start)
