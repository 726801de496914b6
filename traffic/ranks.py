"""GPU ranks of a disaggregated RL job: parallel layouts, groups, and hosts.

Global ranks follow the RFabric text's split (section 3) into a Train
cluster and a Gen cluster.  Here the Train ranks come first
(``0..T-1``) and the Gen ranks after them (``T..T+G-1``), so that they line
up with the fabrics, whose Train PoDs come first (``topologies/rfabric.py``).
Figure 2 of the text numbers the other way round (Gen 0-39, Train 40-63);
only the labels differ.

Layouts inside a cluster, fastest-varying dimension first:

* Train, Megatron's ``tp-cp-ep-dp-pp`` order: ``tp``, ``cp``, ``ep``, ``edp``,
  ``pp``.  Expert parallelism is carved out of data parallelism, so the DP
  index is ``dp = edp x EP + ep`` and the DP group varies over ``ep`` and
  ``edp`` (and ``cp``: Megatron reduces gradients over DP x CP).
* Gen, vLLM replicas: ``tp``, ``ep``, ``edp``; replica ``dp = edp x EP + ep``,
  so an EP group is EP consecutive replicas (attention DP, experts EP).

With ``tp`` fastest and TP <= GPUs per server, a TP group sits inside one
server, in its high-bandwidth domain (HBD, NVLink): off the network.

`RankMap` places ranks on fabric hosts.  With at least as many hosts as
ranks, rank r runs on host r.  With fewer, ranks are folded contiguously
(rank i of a cluster of n on host ``hosts[i x H // n]``): an emulated host
then stands for several GPUs, and traffic between ranks on the same host,
like traffic inside a server, stays off the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product
from typing import Dict, List, Optional, Sequence, Tuple

Group = Tuple[int, ...]


class RankError(ValueError):
    """A parallel layout or a rank placement is inconsistent."""


@dataclass(frozen=True)
class Parallelism:
    """Degrees of parallelism of one cluster (Train or Gen).

    ``world = tp x pp x dp x cp``; ``ep`` splits ``dp`` (EP <= DP, DP % EP == 0).
    ``dp = 0`` means "derive it from the cluster's GPU count".
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    cp: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp * self.cp

    def check(self, where: str) -> None:
        for name in ("tp", "pp", "dp", "ep", "cp"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise RankError(f"{where}.{name} must be an integer >= 1, got {value!r}")
        if self.dp % self.ep:
            raise RankError(f"{where}: ep={self.ep} must divide dp={self.dp} "
                            "(expert parallelism is carved out of data parallelism)")


class Grid:
    """Mixed-radix rank layout: ``dims`` are (name, size), fastest first."""

    def __init__(self, dims: Sequence[Tuple[str, int]], offset: int = 0):
        self.dims = tuple(dims)
        self.offset = offset
        self.size = 1
        for _, size in self.dims:
            self.size *= size

    @property
    def ranks(self) -> range:
        return range(self.offset, self.offset + self.size)

    def coords(self, rank: int) -> Dict[str, int]:
        if rank not in self.ranks:
            raise RankError(f"rank {rank} outside {self.offset}..{self.offset + self.size - 1}")
        local, result = rank - self.offset, {}
        for name, size in self.dims:
            local, result[name] = divmod(local, size)
        return result

    def rank(self, **coords: int) -> int:
        local, stride = 0, 1
        for name, size in self.dims:
            value = coords.get(name, 0)
            if not 0 <= value < size:
                raise RankError(f"coordinate {name}={value} outside 0..{size - 1}")
            local += value * stride
            stride *= size
        return self.offset + local

    def groups(self, *axes: str) -> List[Group]:
        """Ranks that differ only along ``axes``; one group per fixed rest."""
        names = [name for name, _ in self.dims]
        unknown = [a for a in axes if a not in names]
        if unknown:
            raise RankError(f"unknown axes {unknown}; this layout has {names}")
        sizes = dict(self.dims)
        rest = [n for n in names if n not in axes]
        varying = [n for n in names if n in axes]          # layout order, fastest first
        result = []
        for fixed in product(*(range(sizes[n]) for n in reversed(rest))):
            base = dict(zip(reversed(rest), fixed))
            members = []
            for values in product(*(range(sizes[n]) for n in reversed(varying))):
                members.append(self.rank(**base, **dict(zip(reversed(varying), values))))
            result.append(tuple(sorted(members)))
        return sorted(result)


def train_grid(par: Parallelism, offset: int = 0) -> Grid:
    """Megatron order tp-cp-ep-dp-pp (see the module docstring)."""
    return Grid([("tp", par.tp), ("cp", par.cp), ("ep", par.ep), ("edp", par.dp // par.ep),
                 ("pp", par.pp)], offset)


def gen_grid(par: Parallelism, offset: int = 0) -> Grid:
    """vLLM replicas of TP ranks; EP groups of EP consecutive replicas."""
    if par.pp != 1 or par.cp != 1:
        raise RankError(f"gen: only TP, DP and EP are modelled (vLLM as in section 3); "
                        f"got pp={par.pp}, cp={par.cp}")
    return Grid([("tp", par.tp), ("ep", par.ep), ("edp", par.dp // par.ep)], offset)


def replica_of(grid: Grid, rank: int) -> int:
    """Gen replica (DP index) of a Gen rank."""
    c = grid.coords(rank)
    return c["edp"] * dict(grid.dims)["ep"] + c["ep"]


def replica_rank(grid: Grid, replica: int, tp: int) -> int:
    ep = dict(grid.dims)["ep"]
    return grid.rank(tp=tp, ep=replica % ep, edp=replica // ep)


def fold(count: int, hosts: Sequence[str]) -> List[str]:
    """Host of each of ``count`` ranks: one per host, or contiguous blocks."""
    if not hosts:
        raise RankError("no hosts to place ranks on")
    if len(set(hosts)) != len(hosts):
        raise RankError(f"hosts repeat: {list(hosts)}")
    if count <= len(hosts):
        return list(hosts[:count])
    return [hosts[i * len(hosts) // count] for i in range(count)]


@dataclass(frozen=True)
class RankMap:
    """Where each global rank runs, and which ranks share a server (HBD)."""

    hosts: Tuple[str, ...]        # hosts[r] runs rank r
    gpus_per_server: int

    @classmethod
    def build(cls, train_gpus: int, gen_gpus: int, gpus_per_server: int,
              hosts: Sequence[str], gen_hosts: Optional[Sequence[str]] = None) -> "RankMap":
        """Place Train ranks then Gen ranks on hosts.

        ``gen_hosts`` given: Train ranks go on ``hosts`` and Gen ranks on
        ``gen_hosts`` (e.g. the hosts of the Train and of the Gen PoDs).
        Otherwise ``hosts`` is split in proportion to the two clusters, which
        must then come out whole.
        """
        world = train_gpus + gen_gpus
        if gen_hosts is None:
            if len(hosts) >= world:
                return cls(tuple(hosts[:world]), gpus_per_server)
            if (len(hosts) * train_gpus) % world:
                raise RankError(f"{len(hosts)} hosts cannot be split {train_gpus}:{gen_gpus} "
                                "between Train and Gen; pass the Gen hosts separately")
            cut = len(hosts) * train_gpus // world
            hosts, gen_hosts = hosts[:cut], hosts[cut:]
        overlap = set(hosts) & set(gen_hosts)
        if overlap:
            raise RankError(f"hosts {sorted(overlap)} are given to both Train and Gen")
        placed = fold(train_gpus, hosts) + fold(gen_gpus, gen_hosts)
        return cls(tuple(placed), gpus_per_server)

    def host(self, rank: int) -> str:
        return self.hosts[rank]

    def server(self, rank: int) -> int:
        return rank // self.gpus_per_server

    def on_network(self, a: int, b: int) -> bool:
        """False inside a server's HBD and between ranks folded onto one host."""
        return self.server(a) != self.server(b) and self.hosts[a] != self.hosts[b]
