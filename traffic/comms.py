"""Communication specs: who talks to whom in one operation, in rank space.

A spec names a Table 1 type (``kind``), how many operations of it one RL
iteration performs (``ops``), the standard formula its bytes come from
(``formula``), and its participants as GPU ranks.  ``transfers()`` lists the
point-to-point traffic of one operation under the canonical algorithm of its
primitive, which is what byte accounting and tests use:

=============  =====================================================  =================
spec           one operation                                          sent per rank
=============  =====================================================  =================
AllReduce      each group reduces S bytes (ring)                      2(N-1)/N x S
AllToAll       each rank holds S bytes, S/N to every peer             (N-1)/N x S
RingP2P        each rank sends S to the next rank of its ring         S
Pipeline       each lane hop carries S forward (and S backward)       S per hop, per way
Bipartite      every sender sends S to every receiver (and back)      N_recv x S
Transfers      explicit (src, dst, S) point-to-point messages         as listed
WeightSync     stage 1 transfers, then a k-ary tree per root          S per tree edge
=============  =====================================================  =================

Turning a spec into a flow DAG on hosts is `traffic.phases`; the DAG shapes
are `traffic.collectives`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Iterable, List, Sequence, Set, Tuple

from traffic.ranks import Group, RankMap

Transfer = Tuple[int, int, float]         # (src rank, dst rank, bytes)


@dataclass(frozen=True, kw_only=True)
class Comm:
    kind: str
    ops: int
    formula: str = ""
    # The share of ``ops`` in the forward pass, for Train's layer collectives
    # replayed layer by layer (`traffic.phases`): most run once each way.
    forward_share: float = 0.5
    primitive: ClassVar[str] = ""

    def ranks(self) -> Set[int]:
        raise NotImplementedError

    def transfers(self) -> List[Transfer]:
        raise NotImplementedError

    def bytes_per_op(self) -> float:
        return sum(b for _, _, b in self.transfers())

    def network_bytes(self, rank_map: RankMap) -> float:
        """Bytes per iteration that leave a server (and a host), all ops."""
        return self.ops * sum(b for s, d, b in self.transfers() if rank_map.on_network(s, d))

    def sent_per_rank(self) -> dict:
        """Rank -> bytes it sends in one operation."""
        sent: dict = {}
        for src, _, size in self.transfers():
            sent[src] = sent.get(src, 0.0) + size
        return sent


def _ring(group: Sequence[int], size: float) -> List[Transfer]:
    n = len(group)
    return [(group[i], group[(i + 1) % n], size) for i in range(n)] if n > 1 else []


@dataclass(frozen=True, kw_only=True)
class AllReduce(Comm):
    groups: Tuple[Group, ...]
    bytes: float                      # S: the buffer each rank reduces
    primitive: ClassVar[str] = "allreduce"

    def ranks(self) -> Set[int]:
        return {r for g in self.groups for r in g}

    def transfers(self) -> List[Transfer]:
        # Ring: 2(N-1) steps of S/N to the next rank, i.e. 2(N-1)/N x S per rank.
        return [t for g in self.groups
                for t in _ring(g, 2 * (len(g) - 1) / len(g) * self.bytes)]


@dataclass(frozen=True, kw_only=True)
class AllToAll(Comm):
    groups: Tuple[Group, ...]
    bytes: float                      # S: what each rank holds; S/N goes to each peer
    primitive: ClassVar[str] = "all-to-all"

    def ranks(self) -> Set[int]:
        return {r for g in self.groups for r in g}

    def transfers(self) -> List[Transfer]:
        return [(a, b, self.bytes / len(g)) for g in self.groups for a in g for b in g if a != b]


@dataclass(frozen=True, kw_only=True)
class RingP2P(Comm):
    """Point-to-point around each group's ring: ring attention passes every
    rank's KV block on to the next CP rank, one step per operation."""

    groups: Tuple[Group, ...]
    bytes: float                      # S: what each rank passes on per step
    primitive: ClassVar[str] = "p2p"

    def ranks(self) -> Set[int]:
        return {r for g in self.groups for r in g}

    def transfers(self) -> List[Transfer]:
        return [t for g in self.groups for t in _ring(g, self.bytes)]


@dataclass(frozen=True, kw_only=True)
class Pipeline(Comm):
    chains: Tuple[Group, ...]         # one lane: the ranks of stage 0, 1, ... in order
    bytes: float                      # S per hop per micro-batch and direction
    backward: bool = True
    primitive: ClassVar[str] = "p2p"

    def ranks(self) -> Set[int]:
        return {r for c in self.chains for r in c}

    def transfers(self) -> List[Transfer]:
        hops = [(c[k], c[k + 1], self.bytes) for c in self.chains for k in range(len(c) - 1)]
        return hops + ([(d, s, b) for s, d, b in hops] if self.backward else [])


@dataclass(frozen=True, kw_only=True)
class Bipartite(Comm):
    pairs: Tuple[Tuple[Group, Group], ...]   # (senders, receivers) sets, each bipartite
    bytes: float                             # S per (sender, receiver) pair
    combine: bool = True                     # receivers answer (A/F: dispatch + combine)
    primitive: ClassVar[str] = "m2n"

    def ranks(self) -> Set[int]:
        return {r for s, d in self.pairs for r in s + d}

    def transfers(self) -> List[Transfer]:
        out = [(a, b, self.bytes) for s, d in self.pairs for a in s for b in d if a != b]
        return out + ([(b, a, size) for a, b, size in out] if self.combine else [])


@dataclass(frozen=True, kw_only=True)
class Transfers(Comm):
    items: Tuple[Transfer, ...]              # per operation
    primitive: ClassVar[str] = "p2p"

    def ranks(self) -> Set[int]:
        return {r for s, d, _ in self.items for r in (s, d)}

    def transfers(self) -> List[Transfer]:
        return [t for t in self.items if t[0] != t[1]]


def tree_edges(root: int, members: Iterable[int], fanout: int) -> List[Tuple[int, int]]:
    """(parent, child) of the k-ary tree over [root] + members, heap order."""
    nodes = [root] + [m for m in members if m != root]
    return [(nodes[(i - 1) // fanout], nodes[i]) for i in range(1, len(nodes))]


@dataclass(frozen=True, kw_only=True)
class WeightSync(Comm):
    """Section 3's two-stage weight sync (Figure 2; Figure 5(d-g)).

    Stage 1 (T2G): ``stage1`` transfers, Train ranks to the DP-0 replica of
    each Gen PoD, each byte of the weights sent once per PoD.  Stage 2: each
    ``(root, members, bytes)`` tree broadcasts the root's shard to the same
    shard of the other replicas in its PoD, over a ``fanout``-ary tree.
    """

    stage1: Tuple[Transfer, ...]
    trees: Tuple[Tuple[int, Group, float], ...]
    fanout: int = 2
    primitive: ClassVar[str] = "t2g"

    def ranks(self) -> Set[int]:
        return {r for s, d, _ in self.stage1 for r in (s, d)} | \
            {r for root, members, _ in self.trees for r in (root,) + members}

    def transfers(self) -> List[Transfer]:
        tree = [(p, c, size) for root, members, size in self.trees
                for p, c in tree_edges(root, members, self.fanout)]
        return [t for t in self.stage1 if t[0] != t[1]] + tree
