"""An RL iteration as replayable phases: flow DAGs on hosts, laid out in time.

`build_phases` maps the communication of `traffic.workload.build_iteration`
onto fabric hosts (`traffic.ranks.RankMap`) and builds one `Phase` per
Table 1 type present: its kind, its reconfiguration window class (Table 1),
its planned start, the phases it waits for, and a `FlowDag` made with
`traffic.collectives`.  Everything is in emulated units (`traffic.scale.Scale`):
bytes x ``bw_factor`` x ``tdf``, times x ``tdf``.

One-step asynchronous layout of an iteration (Figure 1(c)), real seconds
from `ComputeTimes`, then dilated::

    0 ............................... train_s   ... +optimizer_s
    | Train(i): train-tp/pp/cp/ep ops spread |train-dp|          |
    | Gen(i+1): gen-tp/ep/pd/af ops spread over gen_s ..........| weight-sync |
    |     response: one message per finished sequence ..........|             |

* Train-side phases start at 0 with their operations spread over
  ``train_s`` (compute between operations); ``train-dp`` starts when they
  are done and not before ``train_s``.
* Gen-side phases start at 0, spread over ``gen_s``; ``response`` starts
  once the first share of the batch is generated.
* ``weight-sync`` waits for every other phase, and for ``optimizer_s``
  after the DP all-reduce; the iteration ends with it.

Replaying every operation is out of reach (Gen TP alone is 2L x r
all-reduces), so each spec's ``ops`` are coalesced into at most ``max_ops``
replayed operations of proportionally more bytes: the phase's volume and
its links' loads are kept, per-operation latency is not.  Traffic inside a
server's HBD, or between ranks folded onto one host, is not replayed; its
real bytes are listed in `Schedule.off_network`.  Folding approximations:
a group's ranks on one host count as one member; groups that land on the
same hosts are replayed once with their bytes added.
"""

from __future__ import annotations

import functools
import gc
from collections import OrderedDict
from itertools import compress
from operator import attrgetter, not_
from dataclasses import dataclass, field
from typing import (TYPE_CHECKING, Callable, Dict, Hashable, List, Mapping, Optional, Sequence,
                    Tuple)

from traffic.scale import Scale
from traffic import collectives as coll
from traffic.comms import (AllReduce, AllToAll, Bipartite, Comm, Pipeline, Transfers,
                           WeightSync)
from traffic.flows import FlowDag, ring_allreduce
from traffic.ranks import RankMap
from traffic.workload import TABLE1, Iteration

if TYPE_CHECKING:                     # only its shapes are read here
    from traffic.generation import GenerationStep, Move, Segment

_AFTER = attrgetter("after")
TRAIN_SIDE = ("train-tp", "train-pp", "train-cp", "train-ep")
GEN_SIDE = ("gen-tp", "gen-ep", "gen-pd", "gen-af", "response")
GENERATION_KINDS = ("gen-config", "gen-migrate")     # OrchestrRL's dynamic generation
# With A/F inside its instances, the generation chain also holds an M2N phase
# (kind gen-af, riding) per segment that has one on the network.
LAYER_KINDS = ("train-cp", "train-ep")   # per layer: attention (CP), then the MoE block (EP)
FORWARD_SHARE = 1.0 / 3.0                # the backward pass costs twice the forward
PodOf = Callable[[str], Hashable]


@dataclass
class Phase:
    name: str
    kind: str
    stage: str                   # train, gen, inter (Table 1)
    window: str                  # Small, Medium, Large (Table 1)
    start_s: float               # planned offset from the iteration's start, emulated s
    dag: FlowDag
    after: Tuple[str, ...] = ()  # phases that must have ended first
    ops: int = 1                 # replayed operations per spec
    ops_real: int = 1            # real operations per iteration (largest spec)
    span_s: float = 0.0          # compute the operations are spread over, emulated s
    real_bytes: float = 0.0      # network bytes per iteration, real
    ideal_s: float = 0.0         # DAG critical path at the emulated link rate
    # Compute that must follow a dependency's end before this phase is ready
    # (dependency name, emulated s): a chain of generation moments keeps the
    # decode time between them however long the network made each one.
    gaps: Tuple[Tuple[str, float], ...] = ()

    @property
    def planned_end_s(self) -> float:
        return self.start_s + self.ideal_s

    def pairs(self) -> List[Tuple[str, str, int]]:
        """(src, dst, bytes) of the DAG, summed per host pair."""
        total: Dict[Tuple[str, str], int] = OrderedDict()
        for f in self.dag.flows:
            total[f.src, f.dst] = total.get((f.src, f.dst), 0) + f.bytes
        return [(s, d, b) for (s, d), b in total.items()]

    def hosts(self) -> List[str]:
        return sorted({h for f in self.dag.flows for h in (f.src, f.dst)})


@dataclass
class Schedule:
    phases: List[Phase]
    scale: Scale
    off_network: Dict[str, float] = field(default_factory=dict)   # kind -> real bytes
    iteration_s: float = 0.0     # planned, emulated

    def phase(self, name: str) -> Phase:
        for phase in self.phases:
            if phase.name == name:
                return phase
        raise KeyError(f"no phase {name!r}; phases: {[p.name for p in self.phases]}")

    def names(self) -> List[str]:
        return [p.name for p in self.phases]


# ---------------------------------------------------------------- rank -> host
def _hosts(ranks: Sequence[int], rank_map: RankMap) -> List[str]:
    seen: List[str] = []
    for rank in ranks:
        if rank_map.host(rank) not in seen:
            seen.append(rank_map.host(rank))
    return seen


def _networked(ranks: Sequence[int], rank_map: RankMap) -> bool:
    return any(rank_map.on_network(a, b) for a in ranks for b in ranks if a < b)


def _pair_bytes(items, rank_map: RankMap) -> Dict[Tuple[str, str], float]:
    total: Dict[Tuple[str, str], float] = OrderedDict()
    for src, dst, size in items:
        if rank_map.on_network(src, dst):
            key = (rank_map.host(src), rank_map.host(dst))
            total[key] = total.get(key, 0.0) + size
    return total


def _by_pod(hosts: Sequence[str], pod_of: Optional[PodOf]) -> Optional[List[List[str]]]:
    """Hosts split by PoD if they span >= 2 PoDs in equal numbers."""
    if pod_of is None:
        return None
    pods: Dict[Hashable, List[str]] = OrderedDict()
    for host in hosts:
        pods.setdefault(pod_of(host), []).append(host)
    sizes = {len(p) for p in pods.values()}
    return list(pods.values()) if len(pods) > 1 and len(sizes) == 1 else None


# ---------------------------------------------------------------- one operation
class _Builder:
    """Builds one replayed operation of a spec as a DAG on hosts."""

    def __init__(self, rank_map: RankMap, scale: Scale, pod_of: Optional[PodOf],
                 chunks: int):
        self.rank_map, self.scale, self.pod_of, self.chunks = rank_map, scale, pod_of, chunks

    def emu(self, real: float) -> int:
        return self.scale.emu_bytes(real)

    def build(self, comm: Comm, factor: float, prefix: str, start: Tuple[str, ...],
              micro_batches: int = 1, compute_s: float = 0.0) -> List[FlowDag]:
        method = getattr(self, f"_{type(comm).__name__.lower()}")
        return method(comm, factor, prefix, start, micro_batches, compute_s)

    def _allreduce(self, comm: AllReduce, factor, prefix, start, *_):
        rings: Dict[Tuple[str, ...], int] = OrderedDict()
        for group in comm.groups:
            hosts = tuple(_hosts(group, self.rank_map))
            if len(hosts) > 1 and _networked(group, self.rank_map):
                rings[hosts] = rings.get(hosts, 0) + 1
        dags = []
        for g, (hosts, count) in enumerate(rings.items()):
            size, name = self.emu(comm.bytes * factor * count), f"{prefix}-g{g}"
            pods = _by_pod(hosts, self.pod_of)
            if pods:
                dags.append(coll.hierarchical_allreduce(pods, size, name, start,
                                                        label=comm.kind))
            else:
                dags.append(ring_allreduce(list(hosts), size, name, start, label=comm.kind))
        return dags

    def _alltoall(self, comm: AllToAll, factor, prefix, start, *_):
        groups: Dict[Tuple[str, ...], Dict] = OrderedDict()
        for group in comm.groups:
            items = [(a, b, comm.bytes / len(group)) for a in group for b in group if a != b]
            pairs = _pair_bytes(items, self.rank_map)
            if pairs:
                merged = groups.setdefault(tuple(_hosts(group, self.rank_map)), {})
                for key, size in pairs.items():
                    merged[key] = merged.get(key, 0.0) + size
        return [coll.all_to_all(list(hosts), {k: self.emu(v * factor) for k, v in pairs.items()},
                                f"{prefix}-g{g}", start, label=comm.kind)
                for g, (hosts, pairs) in enumerate(groups.items())]

    def _pipeline(self, comm: Pipeline, factor, prefix, start, micro_batches, compute_s):
        chains: Dict[Tuple[str, ...], int] = OrderedDict()
        for chain in comm.chains:
            hops = [chain[0]]
            for rank in chain[1:]:
                if self.rank_map.on_network(hops[-1], rank):
                    hops.append(rank)
            hosts = tuple(_hosts(hops, self.rank_map))
            if len(hosts) > 1:
                chains[hosts] = chains.get(hosts, 0) + 1
        return [coll.pipeline_p2p([[h] for h in hosts], self.emu(comm.bytes * factor * count),
                                  micro_batches, f"{prefix}-g{g}", start, comm.backward,
                                  compute_s)
                for g, (hosts, count) in enumerate(chains.items())]

    def _bipartite(self, comm: Bipartite, factor, prefix, start, *_):
        dags = []
        for g, (senders, receivers) in enumerate(comm.pairs):
            items = [(a, b, comm.bytes) for a in senders for b in receivers if a != b]
            pairs = _pair_bytes(items, self.rank_map)
            if pairs:
                dags.append(coll.m2n(_hosts(senders, self.rank_map),
                                     _hosts(receivers, self.rank_map),
                                     {k: self.emu(v * factor) for k, v in pairs.items()},
                                     f"{prefix}-g{g}", start, comm.combine))
        return dags

    def _transfers(self, comm: Transfers, factor, prefix, start, *_):
        pairs = _pair_bytes(comm.transfers(), self.rank_map)
        if not pairs:
            return []
        return [coll.point_to_point([(s, d, self.emu(b * factor)) for (s, d), b in pairs.items()],
                                    prefix, start)]

    # A ring's step is its transfers, all at once, one flow per host pair (a
    # ring's ranks on one host pass their blocks inside it).
    _ringp2p = _transfers

    def _weightsync(self, comm: WeightSync, factor, prefix, start, *_):
        stage1 = [(s, d, self.emu(b * factor))
                  for (s, d), b in _pair_bytes(comm.stage1, self.rank_map).items()]
        trees: Dict[Tuple[str, Tuple[str, ...]], float] = OrderedDict()
        for root, members, size in comm.trees:
            far = [m for m in members if self.rank_map.on_network(root, m)]
            hosts = tuple(h for h in _hosts(far, self.rank_map)
                          if h != self.rank_map.host(root))
            if hosts:
                key = (self.rank_map.host(root), hosts)
                trees[key] = trees.get(key, 0.0) + size
        if not stage1 and not trees:
            return []
        return [coll.two_stage_broadcast(
            stage1, [(root, list(members), self.emu(size * factor))
                     for (root, members), size in trees.items()],
            comm.fanout, self.chunks, prefix, start)]


def _with_gap(dag: FlowDag, start: Tuple[str, ...], gap: float) -> FlowDag:
    """Entry flows of a chained operation wait ``gap`` (compute) after ``start``."""
    if not gap or not start:
        return dag
    entry = set(start)
    flows = list(dag.flows)
    inside: Dict[int, bool] = {}     # id() of an ``after`` tuple -> all in ``start``
    # Only a flow that waits for something in ``start`` can be an entry flow.
    apart = map(entry.isdisjoint, map(_AFTER, flows))
    for i in compress(range(len(flows)), map(not_, apart)):
        f = flows[i]
        key = id(f.after)                # many entry flows share ``start`` itself
        if key not in inside:
            inside[key] = entry.issuperset(f.after)
        if inside[key]:
            flows[i] = f._replace(at_s=f.at_s + gap)
    gapped = FlowDag._trusted(flows, dag.external, dag._listed)   # same ids and dependencies
    gapped._sinks = dag._sinks
    return gapped


def _chain(builder: _Builder, comm: Comm, name: str, index: int, max_ops: int,
           span_s: float) -> Tuple[List[FlowDag], int]:
    """The spec's operations as a chain of at most ``max_ops`` replayed ones:
    their DAGs, each waiting (``external``) for the previous operation's."""
    replayed = max(1, min(comm.ops, max_ops))
    factor = comm.ops / replayed
    prefix = f"{name}-c{index}"
    if isinstance(comm, Pipeline):
        stages = max(len(c) for c in comm.chains)
        compute = span_s / (2 * (replayed + stages - 2)) if span_s else 0.0
        return builder.build(comm, factor, prefix, (), replayed, compute), replayed
    gap = span_s / replayed if span_s else 0.0
    chain: List[FlowDag] = []
    start: Tuple[str, ...] = ()
    for op in range(replayed):
        dags = builder.build(comm, factor, f"{prefix}-o{op}", start)
        if not dags:
            return [], replayed
        dags = [_with_gap(d, start, gap) for d in dags]
        chain += dags
        start = tuple(fid for d in dags for fid in coll.sinks(d))
    return chain, replayed


# ---------------------------------------------------------------- dynamic generation
@dataclass
class _Moment:
    """A phase of the generation chain before it becomes a `Phase`."""

    name: str
    kind: str
    start_s: float               # planned, emulated
    span_s: float                # decode compute it covers, emulated
    parts: List[FlowDag]
    replayed: int
    ops_real: int
    real_bytes: float
    anchor_s: float              # planned start of its last operation, emulated: the
                                 # compute after it is owed by the next moment


def _moves_dag(builder: _Builder, moves: Sequence[Move], offset: int, name: str,
               group: str) -> Optional[FlowDag]:
    items = tuple((offset + m.src, offset + m.dst, m.bytes) for m in moves)
    pairs = _pair_bytes(items, builder.rank_map)
    if not pairs:
        return None
    dag = coll.point_to_point([(s, d, builder.emu(b)) for (s, d), b in pairs.items()], name)
    return FlowDag._trusted([f._replace(group=group) for f in dag.flows], dag.external)


def _generation_moments(builder: _Builder, step: GenerationStep, offset: int,
                        off: Dict[str, float]) -> List[_Moment]:
    """The generation step as a chain of network moments (see `build_phases`).

    Segment k under TP t is one ``gen-config`` phase named ``gen-config{k}-tp{t}``
    when it has traffic: the switch's moves that opened it (group
    ``gen-switch``: nothing decodes before its KV and shards are in place),
    then its instances' decode TP all-reduces, all of the segment's
    coalesced into one flow per ring neighbour (each rank's 2(N-1)/N share,
    times the operations) at the segment's start.  A segment holds thousands
    of decode steps of 2L all-reduces of a few hundred kB each, which no
    replay can keep apart; the bytes and the links they load are kept, the
    per-operation latency is not.  A ring replayed step by step would add
    2(N-1) dependent flows' start-up per operation, which at these sizes is
    all an operation costs on the emulator, and is not the network's.  A rebalance is one
    ``gen-migrate{j}`` phase of KV moves.  A segment with no traffic (TP
    inside the servers) is compute only: it lies in the gap between the
    moments around it, which is planned time from one moment's last
    operation to the next moment (`build_phases` makes it `Phase.gaps`).

    With A/F inside the instances (``step.af``, `traffic.generation`), a
    segment's all-reduce rings run over each instance's attention lanes
    only, and its M2N (dispatch attention -> FFN and combine back, each
    lane pair's ``af_bytes / (A x F)`` per direction, coalesced the same
    way: one flow per host pair) is a ``gen-af{k}-tp{t}`` phase of kind
    ``gen-af`` (group ``gen-af``) right after ``gen-config{k}-tp{t}`` in the
    chain, owing no compute to it: Table 1's Small window, so the control
    proxy gives it no circuits and it rides what is lit.  Chaining it after
    the configuration's phase runs the segment's coalesced all-reduce and
    M2N one after the other (conservative: the decode interleaves them layer
    by layer), and after the switch's moves (nothing decodes before the KV
    is in place).  M2N bytes inside a server are listed in ``off`` (real,
    both directions) under ``gen-af``.
    """
    scale = builder.scale
    moments: List[_Moment] = []
    for k, seg in enumerate(step.segments):
        parts: List[FlowDag] = []
        start: Tuple[str, ...] = ()
        event = step.events[k - 1] if k else None
        name = f"gen-config{k}-tp{seg.tp}"
        switch_bytes = 0.0
        if event is not None and event.kind == "rebalance":
            dag = _moves_dag(builder, event.moves, offset, f"gen-migrate{k - 1}", "gen-migrate")
            if dag is not None:
                moments.append(_Moment(f"gen-migrate{k - 1}", "gen-migrate",
                                       scale.emu_seconds(event.at_s), 0.0, [dag], 1, 1,
                                       sum(m.bytes for m in event.moves
                                           if builder.rank_map.on_network(offset + m.src,
                                                                          offset + m.dst)),
                                       scale.emu_seconds(event.at_s)))
        elif event is not None:
            dag = _moves_dag(builder, event.moves, offset, f"{name}-switch", "gen-switch")
            if dag is not None:
                parts.append(dag)
                start = coll.sinks(dag)
                switch_bytes = sum(m.bytes for m in event.moves
                                   if builder.rank_map.on_network(offset + m.src,
                                                                  offset + m.dst))
        span = scale.emu_seconds(seg.compute_s)
        ops_real, decode_bytes, ring = 1, 0.0, []
        for i in range(len(seg.instances)):
            if not seg.tp_ops[i] or not seg.tp_bytes[i]:
                continue
            # The ring goes through each server's ranks in turn, as NCCL builds
            # its rings from the topology: the TP rank order (lane-major after a
            # merge, `traffic.generation.merge_order`) would cross servers at
            # every hop.
            group = tuple(sorted(offset + r for r in seg.tp_group(i)))
            comm = AllReduce(kind="gen-config", groups=(group,),
                             bytes=seg.tp_bytes[i] / seg.tp_ops[i], ops=seg.tp_ops[i],
                             formula="decode: S = b x h x beta per op; ops = 2L x steps")
            if _networked(comm.groups[0], builder.rank_map):
                decode_bytes += comm.network_bytes(builder.rank_map)
                ops_real = max(ops_real, comm.ops)
                ring += [(a, b, size * comm.ops) for a, b, size in comm.transfers()]
        pairs = _pair_bytes(ring, builder.rank_map)
        if pairs:
            dag = coll.point_to_point([(a, b, builder.emu(size)) for (a, b), size in pairs.items()],
                                      f"{name}-decode", start)
            parts.append(FlowDag._trusted([f._replace(group="gen-config") for f in dag.flows],
                                          dag.external))
        begin = scale.emu_seconds(seg.start_s)
        if parts:
            moments.append(_Moment(name, "gen-config", begin, span, parts, 1, ops_real,
                                   switch_bytes + decode_bytes, begin))
        m2n = _m2n_moment(builder, seg, offset, f"gen-af{k}-tp{seg.tp}", begin, span, off)
        if m2n is not None:
            moments.append(m2n)
    return moments


def _m2n_moment(builder: _Builder, seg: Segment, offset: int, name: str, begin: float,
                span: float, off: Dict[str, float]) -> Optional[_Moment]:
    """The segment's A/F M2N as one ``gen-af`` moment (`_generation_moments`), or
    None when none of it is on the network; its bytes inside servers go to ``off``."""
    items = [(offset + src, offset + dst, size)
             for i in range(len(seg.instances)) for src, dst, size in seg.af_pairs(i)]
    if not items:
        return None
    networked = sum(size for src, dst, size in items if builder.rank_map.on_network(src, dst))
    inside = sum(size for _, _, size in items) - networked
    if inside > 0:
        off["gen-af"] = off.get("gen-af", 0.0) + inside
    pairs = _pair_bytes(items, builder.rank_map)
    if not pairs:
        return None
    dag = coll.point_to_point([(a, b, builder.emu(size)) for (a, b), size in pairs.items()],
                              name)
    dag = FlowDag._trusted([f._replace(group="gen-af") for f in dag.flows], dag.external)
    return _Moment(name, "gen-af", begin, span, [dag], 1, max(seg.af_ops, default=1),
                   networked, begin)


def _layer_moments(builder: _Builder, iteration: Iteration, train_s: float,
                   blocks: int) -> List[_Moment]:
    """Train's CP and EP collectives layer by layer (section 4.3 of the RFabric
    text), as a chain of network moments::

        forward   f0-cp  f0-ep  f1-cp  f1-ep ... (attention, then the MoE block)
        backward  ... b1-ep  b1-cp  b0-ep  b0-cp  (the reverse)

    Each stage's ``L/PP`` layers are coalesced into ``blocks`` blocks (at most
    the layers): moment ``train-f{j}-cp`` carries the CP collectives of
    block j's forward pass for every micro-batch and every pipeline stage,
    ``ops x forward_share / blocks`` of the spec's operations (the backward
    moments the rest: ring attention sends twice as much backward).  Stages and
    micro-batches run the same layer type at about the same time in a
    steady pipeline, so the circuits follow the layer type, not the
    micro-batch: the type alternates 4 x blocks times per iteration instead
    of 4 x L/PP x m.  The forward pass takes a third of ``train_s``, the
    backward two thirds, spread evenly over the blocks and, inside a
    block, over its layer types; a moment owes that compute to the one
    before it (`Phase.gaps`).  A type whose groups stay inside the servers
    is compute only.
    """
    comms = {kind: iteration.of_kind(kind) for kind in LAYER_KINDS}
    present = [kind for kind in LAYER_KINDS if comms[kind]]
    if not present:
        return []
    cfg = iteration.config
    blocks = max(1, min(blocks, cfg.model.layers // cfg.train.pp))
    moments: List[_Moment] = []
    begin = 0.0
    for pass_, share, order in (("f", FORWARD_SHARE, present),
                                ("b", 1.0 - FORWARD_SHARE, present[::-1])):
        step = train_s * share / blocks / len(order)
        for block in (range(blocks) if pass_ == "f" else reversed(range(blocks))):
            for kind in order:
                name = f"train-{pass_}{block}-{kind.split('-')[1]}"
                parts: List[FlowDag] = []
                ops, real = 0.0, 0.0
                for index, comm in enumerate(comms[kind]):
                    factor = comm.ops * (comm.forward_share if pass_ == "f"
                                         else 1.0 - comm.forward_share) / blocks
                    ops = max(ops, factor)
                    real += factor / comm.ops * comm.network_bytes(builder.rank_map)
                    for dag in builder.build(comm, factor, f"{name}-c{index}", ()):
                        parts.append(FlowDag._trusted(
                            [f._replace(group=kind) for f in dag.flows], dag.external))
                if parts:
                    moments.append(_Moment(name, kind, begin, step, parts, 1,
                                           max(1, round(ops)), real, begin))
                begin += step
    return moments


def _chained(phases: Dict[str, Phase], moments: Sequence[_Moment],
             rate_bps: float) -> Optional[_Moment]:
    """Add ``moments`` to ``phases`` as a chain: each waits for the one before
    it, then for the compute between them (`Phase.gaps`); returns the last."""
    previous = None
    for moment in moments:
        dag = FlowDag._joined([f for part in moment.parts for f in part.flows], moment.parts)
        after = () if previous is None else (previous.name,)
        gaps = () if previous is None else ((previous.name,
                                             moment.start_s - previous.anchor_s),)
        info = TABLE1[moment.kind]
        phases[moment.name] = Phase(
            moment.name, moment.kind, info.stage, info.window, moment.start_s, dag, after,
            moment.replayed, moment.ops_real, moment.span_s, moment.real_bytes,
            max(dag.ideal_finish_s(rate_bps).values()), gaps)
        previous = moment
    return previous


# ---------------------------------------------------------------- the schedule
def _networked_bytes(kind: str, comms: Sequence[Comm], rank_map: RankMap,
                     off: Dict[str, float]) -> float:
    """The real bytes of ``comms`` (one kind's, per iteration) that cross the
    network; those that stay off it (inside a server's HBD, between ranks folded
    onto one host) go to ``off[kind]`` when there are any.  For a phase of the
    kind (`build_phases`' ``make``) and for a kind replaced by a chain of
    per-layer phases alike."""
    total = sum(c.ops * c.bytes_per_op() for c in comms)
    networked = sum(c.network_bytes(rank_map) for c in comms)
    if total - networked > 0:
        off[kind] = total - networked
    return networked


def _gc_paused(build):
    """Run ``build`` with the cyclic garbage collector off: a schedule at the
    texts' scale is >1M acyclic objects that only make the collector rescan
    the heap (a third of the build time), never cycles to reclaim."""
    @functools.wraps(build)
    def wrapper(*args, **kwargs):
        if not gc.isenabled():
            return build(*args, **kwargs)
        gc.disable()
        try:
            return build(*args, **kwargs)
        finally:
            gc.enable()
    return wrapper


@_gc_paused
def build_phases(iteration: Iteration, rank_map: RankMap, scale: Scale = Scale(),
                 max_ops: int = 4, link_gbps: float = 400.0, pod_of: Optional[PodOf] = None,
                 chunks: int = 1, spans: Optional[Mapping[str, float]] = None,
                 generation: Optional[GenerationStep] = None,
                 layerwise: bool = False) -> Schedule:
    """Phases of one iteration in emulated units (see the module docstring).

    ``pod_of(host)`` makes DP all-reduces that span PoDs hierarchical
    (`collectives.hierarchical_allreduce`); ``chunks`` pipelines the weight
    sync's broadcast trees; ``link_gbps`` (real) sets ``Phase.ideal_s``;
    ``spans`` gives a phase kind its own compute span in real seconds (the
    time its operations are spread over; default ``train_s`` for the Train
    side, ``gen_s`` for the Gen side, 0 for ``train-dp`` and the sync).

    ``generation`` (`traffic.generation.simulate`, OrchestrRL's dynamic
    generation step) replaces the fixed decode: the Gen side spans its
    compute time instead of ``gen_s``, ``gen-tp`` is left out (and ``gen-ep``
    when the step splits its instances into attention and FFN lanes), and the step
    becomes a chain of phases (`_generation_moments`), each waiting for the
    one before it and then for the decode compute between them
    (`Phase.gaps`), so a slow migration delays everything after it.  The
    weight sync owes the compute after the chain's last moment.

    ``layerwise`` replaces the ``train-cp`` and ``train-ep`` phases spread
    over ``train_s`` by a chain of per-layer-block phases (`_layer_moments`,
    ``max_ops`` blocks), so that a control proxy can give each layer type
    its own circuits; ``train-dp`` owes the backward compute after the
    chain's last moment.
    """
    if max_ops < 1:
        raise ValueError(f"max_ops must be >= 1, got {max_ops}")
    spans = dict(spans or {})
    unknown = sorted(set(spans) - set(TABLE1))
    if unknown:
        raise ValueError(f"spans: unknown phase kinds {unknown}; allowed: {sorted(TABLE1)}")
    cfg = iteration.config
    builder = _Builder(rank_map, scale, pod_of, chunks)
    rate_bps = scale.emu_mbps(link_gbps) * 1e6
    train_s, gen_s = scale.emu_seconds(cfg.compute.train_s), scale.emu_seconds(cfg.compute.gen_s)
    if generation is not None:
        gen_s = scale.emu_seconds(generation.compute_s)
    phases: Dict[str, Phase] = OrderedDict()
    off: Dict[str, float] = OrderedDict()

    def make(kind: str, start_s: float, span_s: float, after=()) -> None:
        if kind in spans:
            span_s = scale.emu_seconds(spans[kind])
        comms = iteration.of_kind(kind)
        parts: List[FlowDag] = []
        replayed = 1
        for index, comm in enumerate(comms):
            chain, replayed_here = _chain(builder, comm, kind, index, max_ops, span_s)
            parts += chain
            replayed = max(replayed, replayed_here)
        flows = [f if f.group == kind else f._replace(group=kind)
                 for part in parts for f in part.flows]
        networked = _networked_bytes(kind, comms, rank_map, off)
        if not flows:
            return
        dag = FlowDag._joined(flows, parts)      # validated unless its parts show it valid
        ideal = max(dag.ideal_finish_s(rate_bps).values())
        first = span_s / replayed if kind == "response" else 0.0
        phases[kind] = Phase(kind, kind, TABLE1[kind].stage, TABLE1[kind].window,
                             start_s + first, dag, tuple(a for a in after if a in phases),
                             replayed, max(c.ops for c in comms), span_s, networked, ideal)

    for kind in TRAIN_SIDE:
        if not (layerwise and kind in LAYER_KINDS):
            make(kind, 0.0, train_s)
    layers = _chained(phases, _layer_moments(builder, iteration, train_s, max_ops)
                      if layerwise else [], rate_bps)
    for kind in LAYER_KINDS if layerwise else ():
        _networked_bytes(kind, iteration.of_kind(kind), rank_map, off)
    # The generation step replaces the fixed decode's TP all-reduce; with A/F
    # inside its instances also the expert all-to-all (the experts live on
    # each instance's FFN lanes: the M2N carries their traffic).
    replaced = () if generation is None else (
        ("gen-tp",) if generation.af is None else ("gen-tp", "gen-ep"))
    for kind in GEN_SIDE:
        if kind not in replaced:
            make(kind, 0.0, gen_s)
    chain_tail: Tuple[Tuple[str, float], ...] = ()
    if generation is not None:
        previous = _chained(phases, _generation_moments(builder, generation, cfg.train.world,
                                                        off), rate_bps)
        if previous is not None:
            chain_tail = ((previous.name, max(0.0, gen_s - previous.anchor_s)),)
    train_side = TRAIN_SIDE + tuple(p.name for p in phases.values() if p.kind in LAYER_KINDS
                                    and p.name != p.kind)
    train_end = max([train_s] + [phases[k].planned_end_s for k in train_side if k in phases])
    make("train-dp", train_end, 0.0, train_side)
    if layers is not None and "train-dp" in phases:
        phases["train-dp"].gaps = ((layers.name, max(0.0, train_s - layers.anchor_s)),)
    ready = (phases["train-dp"].planned_end_s if "train-dp" in phases else train_end)
    ready += scale.emu_seconds(cfg.compute.optimizer_s)
    ready = max([ready] + [phases[k].planned_end_s for k in GEN_SIDE if k in phases])
    if generation is not None:
        ready = max([ready, gen_s] + [p.planned_end_s for p in phases.values()
                                      if p.kind in GENERATION_KINDS + ("gen-af",)])
    make("weight-sync", ready, 0.0, tuple(phases))
    if chain_tail and "weight-sync" in phases:
        phases["weight-sync"].gaps = chain_tail
    ordered = sorted(phases.values(), key=lambda p: (p.start_s, list(phases).index(p.name)))
    end = max((p.planned_end_s for p in ordered), default=0.0)
    return Schedule(ordered, scale, dict(off), end)
