"""Flows and flow DAGs: what the replayer runs.

A flow moves ``bytes`` from ``src`` to ``dst``.  It starts at ``at_s``
seconds after the replay's start, or once every flow in ``after`` has
finished (plus ``at_s`` as a gap), never before.  Collectives are built as
DAGs of flows: one implementation each, shared by every scenario.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


# ``after`` tuples longer than this are often one tuple object shared by many
# flows (all the entry flows of an operation wait for the previous one's
# sinks); DAG passes handle such a tuple once, by identity.
_SHARED = 8
_ID = attrgetter("id")


class FlowError(ValueError):
    """A flow or a DAG is malformed; the message names the flow."""


@dataclass(frozen=True)
class Flow:
    id: str
    src: str
    dst: str
    bytes: int
    at_s: float = 0.0
    after: Tuple[str, ...] = ()
    step: Optional[int] = None      # collective step, for per-step timing
    group: str = ""                 # what the flow belongs to (e.g. "allreduce")
    rate_mbps: Optional[float] = None  # sender pacing; None = TCP's own

    def __post_init__(self):
        if self.src == self.dst:
            raise FlowError(f"flow {self.id}: source and destination are both {self.src}")
        if self.bytes <= 0:
            raise FlowError(f"flow {self.id}: bytes must be > 0, got {self.bytes}")
        if self.at_s < 0:
            raise FlowError(f"flow {self.id}: at_s must be >= 0, got {self.at_s}")

    def _replace(self, **changes) -> "Flow":
        """`dataclasses.replace` (checks included), without its per-call overhead."""
        new = object.__new__(type(self))
        fields = dict(self.__dict__)
        fields.update(changes)
        object.__setattr__(new, "__dict__", fields)
        new.__post_init__()
        return new


@dataclass
class FlowDag:
    """Flows and their dependencies.

    ``external`` names flows of another DAG that some flows here wait for;
    such a DAG is a building block, joined to the rest with ``merge`` before
    it is replayed (the replayer refuses a DAG with external dependencies).
    """

    flows: List[Flow] = field(default_factory=list)
    external: Tuple[str, ...] = ()

    def __post_init__(self):
        self.validate()

    # Set by `validate`: the flows are listed in a topological order (every
    # dependency before its flow).  Private; not a field.
    _listed = False
    # Set by a builder that knows them: the ids of the flows nothing here
    # waits for (`collectives.sinks`), in list order.  Private; not a field.
    _sinks: Optional[Tuple[str, ...]] = None

    @classmethod
    def _trusted(cls, flows: List[Flow], external: Tuple[str, ...] = (),
                 listed: bool = False) -> "FlowDag":
        """A DAG known to be valid (e.g. a valid DAG's flows with ids and
        dependencies unchanged): built without `validate`.  Private."""
        dag = cls.__new__(cls)
        dag.flows, dag.external, dag._listed = flows, external, listed
        return dag

    @classmethod
    def _joined(cls, flows: List[Flow], parts: Sequence["FlowDag"]) -> "FlowDag":
        """The DAG of ``flows``: the flows of the validated ``parts`` in turn
        (possibly copies with the same ids and dependencies).  Valid, with no
        need to check each flow again, if every part is listed in order, no
        id repeats and each part's ``external`` ids are flows of earlier
        parts; otherwise validated as `FlowDag(flows)` is (same errors)."""
        ids: set = set()
        rest, total = iter(flows), 0
        for part in parts:
            if not part._listed or not ids.issuperset(part.external):
                return cls(flows)
            ids.update(map(_ID, islice(rest, len(part.flows))))
            total += len(part.flows)
        if total != len(flows) or len(ids) != len(flows):
            return cls(flows)
        return cls._trusted(flows, (), True)

    @classmethod
    def merge(cls, *dags: "FlowDag") -> "FlowDag":
        """One DAG of several: every external dependency must now resolve."""
        return cls([flow for dag in dags for flow in dag.flows])

    def validate(self) -> None:
        flows = self.flows
        ids = {f.id for f in flows}
        if len(ids) != len(flows):
            counts = Counter(f.id for f in flows)
            raise FlowError(f"duplicate flow ids: {sorted(i for i, c in counts.items() if c > 1)}")
        external: Optional[set] = None          # built when first needed
        # One pass: unknown dependencies, and whether every dependency comes
        # before its flow (then the list is a topological order: no cycle).
        # A long ``after`` tuple shared by many flows is checked once, in bulk.
        seen: set = set()
        add = seen.add
        passed: set = set()          # id() of shared tuples found all seen or external
        ordered = True
        listed = seen.issuperset
        for flow in flows:
            after = flow.after
            if after:
                shared = len(after) > _SHARED
                if not shared and listed(after):    # the usual case, in one call
                    add(flow.id)
                    continue
                if shared:
                    if id(after) in passed or listed(after):
                        passed.add(id(after))
                        add(flow.id)
                        continue
                    if ids.isdisjoint(after):
                        if after is self.external:
                            passed.add(id(after))
                            add(flow.id)
                            continue
                        if external is None:
                            external = set(self.external)
                        if external.issuperset(after):
                            passed.add(id(after))
                            add(flow.id)
                            continue
                good = True
                for dep in after:
                    if dep not in seen:
                        if dep in ids:
                            ordered = good = False
                        else:
                            if external is None:
                                external = set(self.external)
                            if dep not in external:
                                missing = [d for d in after
                                           if d not in ids and d not in external]
                                raise FlowError(f"flow {flow.id} waits for unknown flows "
                                                f"{missing}")
                if shared and good:
                    passed.add(id(after))
            add(flow.id)
        if not ordered:
            self._visit_order(self.by_id())
        self._listed = ordered

    def by_id(self) -> Dict[str, Flow]:
        return {f.id: f for f in self.flows}

    def _listed_in_order(self, flows: Dict[str, Flow]) -> bool:
        """Ids unique and every dependency listed before its flow."""
        if len(flows) != len(self.flows):
            return False
        seen: set = set()
        add = seen.add
        passed: set = set()
        listed = seen.issuperset
        apart = flows.keys().isdisjoint
        for flow in self.flows:
            after = flow.after
            if after:
                shared = len(after) > _SHARED
                if not (shared and id(after) in passed) and not (listed(after) or apart(after)):
                    for dep in after:
                        if dep not in seen and dep in flows:
                            return False
                if shared:
                    passed.add(id(after))
            add(flow.id)
        return True

    def topological_order(self) -> List[Flow]:
        """Dependencies first: depth-first, flows in list order, each flow's
        dependencies in ``after`` order (a list already in such an order is
        returned as it is).  Raises FlowError naming a cycle."""
        flows = self.by_id()
        if self._listed_in_order(flows):
            return list(self.flows)
        return self._visit_order(flows)

    def _visit_order(self, flows: Dict[str, Flow]) -> List[Flow]:
        """Post-order depth-first search (iterative: no recursion limit)."""
        order: List[Flow] = []
        done: set = set()
        active: set = set()
        for root in self.flows:
            if root.id in done:
                continue
            path = [root.id]
            active.add(root.id)
            stack = [(flows[root.id], iter(flows[root.id].after))]
            while stack:
                flow, deps = stack[-1]
                for dep in deps:
                    if dep in done or dep not in flows:
                        continue
                    if dep in active:
                        raise FlowError("flow dependencies form a cycle: "
                                        f"{' -> '.join(path + [dep])}")
                    active.add(dep)
                    path.append(dep)
                    stack.append((flows[dep], iter(flows[dep].after)))
                    break
                else:
                    stack.pop()
                    fid = path.pop()
                    active.discard(fid)
                    done.add(fid)
                    order.append(flows[fid])
        return order

    def total_bytes(self) -> int:
        return sum(f.bytes for f in self.flows)

    def ideal_finish_s(self, rate_bps: float, startup_s: float = 0.0) -> Dict[str, float]:
        """Finish times if each flow ran alone at rate_bps (the DAG's critical path)."""
        # Optimistic: in list order, which is what `topological_order` returns
        # unless a flow is listed before a dependency (then a dependency was
        # not computed when needed but is by the end) or ids repeat.
        missing: List[str] = []
        finish = self._finish(self.flows, rate_bps, startup_s, missing)
        if len(finish) == len(self.flows) and not any(d in finish for d in missing):
            return finish
        return self._finish(self.topological_order(), rate_bps, startup_s, [])

    @staticmethod
    def _finish(order: List[Flow], rate_bps: float, startup_s: float,
                missing: List[str]) -> Dict[str, float]:
        """Finish times over ``order``; dependencies not computed yet count as
        finished at 0 and are listed in ``missing``."""
        finish: Dict[str, float] = {}
        get = finish.get
        shared: Dict[int, float] = {}      # id() of a long shared ``after`` -> its ready time
        for flow in order:
            after = flow.after
            if not after:
                ready = 0.0
            elif (len(after) == 2 and (first := get(after[0])) is not None
                  and (second := get(after[1])) is not None):
                ready = second if second > first else first    # max(): first of the largest
            elif len(after) > _SHARED and id(after) in shared:
                ready = shared[id(after)]
            else:
                ready = None
                for dep in after:               # as max(): the first of the largest
                    value = get(dep)
                    if value is None:
                        missing.append(dep)
                        value = 0.0
                    if ready is None or value > ready:
                        ready = value
                if len(after) > _SHARED:
                    shared[id(after)] = ready
            finish[flow.id] = ready + flow.at_s + startup_s + flow.bytes * 8 / rate_bps
        return finish


def ring_allreduce(hosts: Sequence[str], total_bytes: int, group: str = "allreduce",
                   start_after: Iterable[str] = (), *, label: Optional[str] = None) -> FlowDag:
    """Ring all-reduce: 2(N-1) steps, each rank sends S/N bytes to the next.

    Step k of rank i waits for step k-1 of rank i-1 (the chunk rank i
    forwards is the one it just received) and for its own step k-1 (one send
    at a time per NIC).  Reduce-scatter is steps 0..N-2, all-gather N-1..2N-3.
    Ids ``{group}-s{k}-r{i}``; ``label`` is the flows' ``Flow.group``
    (default: ``group``).
    """
    n = len(hosts)
    if n < 2:
        raise FlowError(f"ring all-reduce needs at least 2 hosts, got {n}")
    if len(set(hosts)) != n:
        raise FlowError(f"ring all-reduce hosts repeat: {list(hosts)}")
    chunk = max(1, total_bytes // n)
    label = group if label is None else label
    start = tuple(start_after)
    steps = 2 * (n - 1)
    flows = _ring_steps(hosts, chunk, steps, group, label, 0, [start] * n)
    if any(dep.startswith(f"{group}-s") for dep in start):
        return FlowDag(flows, external=start)       # it may wait for itself: checked
    # Otherwise valid by construction (ids unique, each step waits for the
    # one before it or for ``start``), and the last step is what nothing
    # waits for: a DP phase at 4,096 GPUs is 1.3 million such flows, and
    # checking them and finding their sinks took 2.5 s.
    dag = FlowDag._trusted(flows, start, True)
    dag._sinks = tuple(flow.id for flow in flows[-n:])
    return dag


def _ring_steps(hosts: Sequence[str], chunk: int, steps: int, prefix: str, label: str,
                first_step: int, entry: Sequence[Tuple[str, ...]]) -> List[Flow]:
    """``steps`` ring steps over ``hosts``: step k of rank i (id
    ``{prefix}-s{k}-r{i}``) goes to rank i+1 and waits for step k-1 of ranks
    i-1 and i, step 0 for ``entry[i]``.  Shared by `ring_allreduce` and the
    hierarchical all-reduce's passes; the flows' fields are set directly, as
    one ``__dict__`` (what the frozen dataclass's ``__init__`` does, without
    its per-field overhead: 2.8 -> 1.9 us a flow, 1.3 million flows in an
    iteration at 4,096 GPUs) once the checks of `Flow.__post_init__` are
    known to hold."""
    n = len(hosts)
    links = [(hosts[i], hosts[(i + 1) % n]) for i in range(n)]
    checked = chunk > 0 and all(src != dst for src, dst in links)
    new, put = object.__new__, object.__setattr__
    flows: List[Flow] = []
    append = flows.append
    previous: List[str] = []
    for k in range(steps):
        ids = [f"{prefix}-s{k}-r{i}" for i in range(n)]
        step = first_step + k
        for i, (src, dst) in enumerate(links):
            # previous[i - 1] is rank (i - 1) % n: -1 wraps to n - 1
            deps = entry[i] if k == 0 else (previous[i - 1], previous[i])
            if not checked:
                append(Flow(ids[i], src, dst, chunk, 0.0, deps, step, label))
                continue
            flow = new(Flow)
            put(flow, "__dict__", {"id": ids[i], "src": src, "dst": dst, "bytes": chunk,
                                   "at_s": 0.0, "after": deps, "step": step,
                                   "group": label, "rate_mbps": None})
            append(flow)
        previous = ids
    return flows


def allreduce_ideal_s(n: int, total_bytes: int, rate_bps: float) -> float:
    """Alpha-beta ideal with alpha = 0: 2(N-1)/N x S/B."""
    return 2 * (n - 1) / n * total_bytes * 8 / rate_bps
