"""The RFabric control proxy (section 4.3) as a pure core: phase events in,
reconfiguration requests out.

The runner reports phase events with its own clock (emulated seconds) and
sends the requests it gets back over the control channel
(`controllers.service.FabricService.handle`); nothing here talks to a
switch or imports os-ken.  A request is
``{"op": "reconfigure", "ocs": name, "circuits": [[a, b], ...]}``.

Modes:

* ``proactive`` (RFabric).  Iteration 1 is profiling: each phase's
  template (`controllers.rfabric_templates`) is chosen when it starts,
  cached by phase name, and put in place on demand, so its delay is
  exposed; the phases' offsets from the iteration start are recorded.
  From ``end_iteration`` on the proxy knows the schedule: whenever an OCS
  has no running phase that needs it, it asks at once for the circuits of
  the next phase (in profiled order, wrapping into the next iteration)
  that needs that OCS.  The reconfiguration then runs in the window
  between the last user of the old circuits and the next phase, and
  ``exposed = max(0, delay - window)``.
* ``reactive``: every phase reconfigures on demand when it starts; the
  full delay is exposed each time.
* ``static``: never reconfigures (the circuits stay as built).

Timing model: a reconfiguration of one OCS takes the OCS's Table 2 delay
(``delay_ms`` of its technology, or the override) x ``tdf``.
`FabricService` serialises reconfigurations (one lock, held through the
dark time), so by default requests queue: the k-th of a batch is ready
after k delays.  ``parallel=True`` models a service that reconfigures
several OCS at once.  ``reconfigured(ocs, t)`` replaces the model's ready
time with the measured one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Sequence

from controllers.ocs_core import delay_ms_for
from controllers.rfabric_templates import Pair, RFabricTemplates, Template
from topologies.fabric import Circuit, Fabric, FabricError

MODES = ("proactive", "reactive", "static")


@dataclass
class Reconfig:
    """One OCS reconfiguration the proxy asked for, and what it cost."""

    iteration: int               # iteration of the phase that needs it
    phase: str
    ocs: str
    template: str
    mode: str                    # proactive (ahead of the phase) or reactive (on demand)
    issued_s: float
    ready_s: float
    delay_s: float
    request: dict
    needed_s: Optional[float] = None     # when the phase that needs it started
    kind: str = ""               # the phase's kind (as `phase_started` got it)

    @property
    def window_s(self) -> float:
        return 0.0 if self.needed_s is None else max(0.0, self.needed_s - self.issued_s)

    @property
    def exposed_s(self) -> float:
        return 0.0 if self.needed_s is None else max(0.0, self.ready_s - self.needed_s)

    @property
    def hidden_s(self) -> float:
        return max(0.0, self.delay_s - self.exposed_s)

    def to_dict(self) -> dict:
        return {"iteration": self.iteration, "phase": self.phase, "kind": self.kind,
                "ocs": self.ocs,
                "template": self.template, "mode": self.mode, "issued_s": self.issued_s,
                "ready_s": self.ready_s, "needed_s": self.needed_s, "delay_s": self.delay_s,
                "window_s": self.window_s, "exposed_s": self.exposed_s,
                "hidden_s": self.hidden_s}


@dataclass
class Decision:
    """What the runner does now.

    ``requests``: send these, in order.  ``blocking``: they are on-demand;
    the phase starts only once they are done.  ``wait_s``: at a phase start,
    how long the circuits it needs are still in flight (the runner waits for
    its pending reconfigurations to finish before starting the flows).
    """

    requests: List[dict] = field(default_factory=list)
    blocking: bool = False
    wait_s: float = 0.0


@dataclass
class Profiled:
    name: str
    kind: str
    start_s: float               # offset from the iteration start
    end_s: float = math.nan


@dataclass
class PlanEntry:
    """Steady-state reconfiguration ahead of a phase, from the profile."""

    phase: str
    ocs: str
    template: str
    issue_s: float               # offsets from the iteration start (may be < 0:
    phase_start_s: float         # issued in the previous iteration)
    delay_s: float
    ready_s: float
    request: dict

    @property
    def window_s(self) -> float:
        return self.phase_start_s - self.issue_s

    @property
    def exposed_s(self) -> float:
        return max(0.0, self.ready_s - self.phase_start_s)

    @property
    def hidden_s(self) -> float:
        return max(0.0, self.delay_s - self.exposed_s)


class ControlProxy:
    def __init__(self, fabric: Fabric, mode: str = "proactive", tdf: float = 1.0,
                 templates=None, delay_ms: Optional[float] = None, parallel: bool = False,
                 layerwise: bool = False):
        if mode not in MODES:
            raise ValueError(f"unknown proxy mode {mode!r}; allowed: {', '.join(MODES)}")
        self.fabric, self.mode, self.tdf = fabric, mode, tdf
        # ``layerwise``: the schedule's CP and EP phases are per layer type
        # (`traffic.phases.build_phases`), each gets circuits of its own.
        self.templates = (templates if templates is not None
                          else RFabricTemplates(fabric, layerwise=layerwise))
        self.delay_ms, self.parallel = delay_ms, parallel
        self.target: Dict[str, FrozenSet[Circuit]] = {o: frozenset(c)
                                                       for o, c in fabric.circuits.items()}
        self.cache: Dict[str, Template] = {}
        self.profile: Dict[str, Profiled] = {}
        self.schedule: List[str] = []
        self.profiled = False
        self.length_s = 0.0
        self.iteration, self.t0 = 0, 0.0
        self.started: List[str] = []
        self.active: Dict[str, Template] = {}
        self.reconfigs: List[Reconfig] = []
        self.pending: Dict[str, Reconfig] = {}
        self.busy_until = -math.inf
        self.warnings: List[str] = []

    # ------------------------------------------------------------ helpers
    def delay_s(self, ocs: str) -> float:
        node = self.fabric.graph.nodes[ocs]
        real_ms = delay_ms_for(node["technology"],
                               self.delay_ms if self.delay_ms is not None else node.get("delay_ms"))
        return real_ms * self.tdf / 1000.0

    def template(self, name: str, kind: str, pairs: Optional[Sequence[Pair]] = None) -> Template:
        """The cached template of a phase, chosen on its first occurrence."""
        if name not in self.cache:
            self.cache[name] = self.templates.for_kind(kind, pairs)
        return self.cache[name]

    def _issue(self, ocs: str, circuits: FrozenSet[Circuit], phase: str, kind: str,
               template: Template, t: float, mode: str, iteration: int) -> Reconfig:
        start = t if self.parallel else max(t, self.busy_until)
        delay = self.delay_s(ocs)
        if not self.parallel:
            self.busy_until = start + delay
        self.target[ocs] = circuits
        rec = Reconfig(iteration, phase, ocs, template.name, mode, t, start + delay, delay,
                       template.request(ocs), kind=kind)
        self.reconfigs.append(rec)
        self.pending[ocs] = rec
        return rec

    def _users(self, ocs: str, names: Sequence[str]) -> List[str]:
        return [n for n in names if ocs in self.cache[n].circuits]

    def _lookahead(self, t: float) -> List[dict]:
        """Proactive: put the next user's circuits on every idle OCS now."""
        if self.mode != "proactive" or not self.profiled:
            return []
        remaining = [n for n in self.schedule if n not in self.started]
        upcoming = remaining + self.schedule
        busy = {o for tmpl in self.active.values() for o in tmpl.circuits}
        requests = []
        for ocs in sorted({o for tmpl in self.cache.values() for o in tmpl.circuits} - busy):
            users = [i for i, n in enumerate(upcoming) if ocs in self.cache[n].circuits]
            if not users:
                continue
            name = upcoming[users[0]]
            want = self.cache[name].circuits[ocs]
            if want == self.target[ocs]:
                continue
            iteration = self.iteration + (0 if users[0] < len(remaining) else 1)
            # The schedule is the profile's: every phase in it has its kind there.
            rec = self._issue(ocs, want, name, self.profile[name].kind, self.cache[name], t,
                              "proactive", iteration)
            requests.append(rec.request)
        return requests

    # ------------------------------------------------------------ events
    def begin_iteration(self, t: float) -> Decision:
        self.iteration += 1
        self.t0, self.started = t, []
        return Decision(self._lookahead(t))

    def phase_started(self, name: str, kind: str, t: float,
                      pairs: Optional[Sequence[Pair]] = None) -> Decision:
        if self.iteration == 0:
            self.begin_iteration(t)
        tmpl = self.template(name, kind, pairs)
        if not self.profiled:
            self.profile[name] = Profiled(name, kind, t - self.t0)
        elif name not in self.profile:
            self.warnings.append(f"iteration {self.iteration}: phase {name!r} was not profiled")
        self.started.append(name)
        self.active[name] = tmpl
        if self.mode == "static":
            return Decision()
        requests, wait = [], 0.0
        for ocs in tmpl.ocs:
            want = tmpl.circuits[ocs]
            if want != self.target[ocs]:
                clash = [n for n, other in self.active.items()
                         if n != name and other.circuits.get(ocs, want) != want]
                if clash:
                    self.warnings.append(f"{name} needs other circuits on {ocs} than the "
                                         f"running {clash}")
                rec = self._issue(ocs, want, name, kind, tmpl, t, "reactive", self.iteration)
                requests.append(rec.request)
            rec = self.pending.pop(ocs, None)
            if rec is not None:
                rec.needed_s = t
                wait = max(wait, rec.ready_s - t)
        return Decision(requests, blocking=bool(requests), wait_s=max(0.0, wait))

    def phase_ended(self, name: str, t: float) -> Decision:
        if name in self.profile and not self.profiled:
            self.profile[name].end_s = t - self.t0
        self.active.pop(name, None)
        return Decision(self._lookahead(t))

    def end_iteration(self, t: float) -> Decision:
        """After the last phase: iteration 1 completes the profile."""
        if self.active:
            self.warnings.append(f"iteration {self.iteration} ended with {sorted(self.active)} "
                                 "still running")
        if not self.profiled:
            self.length_s = t - self.t0
            self.schedule = sorted(self.profile, key=lambda n: self.profile[n].start_s)
            self.profiled = True
        self.started = list(self.schedule)
        return Decision(self._lookahead(t))

    def reconfigured(self, ocs: str, t: float) -> None:
        """The runner saw the reconfiguration of ``ocs`` complete at ``t``."""
        for rec in reversed(self.reconfigs):
            if rec.ocs == ocs:
                rec.ready_s = t
                if rec is self.reconfigs[-1] and not self.parallel:
                    self.busy_until = t          # the queue behind it moves too
                return
        raise FabricError(f"no reconfiguration of {ocs!r} was requested")

    # ------------------------------------------------------------ results
    def plan(self) -> List[PlanEntry]:
        """Steady-state plan from the profile: per OCS, each change of
        circuits between consecutive users, issued when the last earlier
        user ends (wrapping from the previous iteration)."""
        if not self.profiled:
            raise FabricError("no plan before the first iteration has been profiled")
        prof, length = self.profile, self.length_s
        entries = []
        for ocs in sorted({o for tmpl in self.cache.values() for o in tmpl.circuits}):
            users = self._users(ocs, self.schedule)
            for i, name in enumerate(users):
                before = users[i - 1]
                if self.cache[before].circuits[ocs] == self.cache[name].circuits[ocs]:
                    continue
                issue = (max(prof[u].end_s for u in users[:i]) if i
                         else max(prof[u].end_s for u in users) - length)
                delay = self.delay_s(ocs)
                entries.append(PlanEntry(name, ocs, self.cache[name].name, issue,
                                         prof[name].start_s, delay, issue + delay,
                                         self.cache[name].request(ocs)))
        entries.sort(key=lambda e: (e.issue_s, e.ocs))
        if not self.parallel:
            free = -math.inf
            for entry in entries:
                entry.ready_s = max(entry.issue_s, free) + entry.delay_s
                free = entry.ready_s
        return entries

    def occurrences(self) -> List[dict]:
        """Per phase occurrence that needed new circuits: its kind, its reconfigurations
        (one per OCS) from the first request to the last OCS ready, and how
        much of that the phase waited for (``exposed_s``, wall time: the
        phase waits for its slowest OCS) or not (``hidden_s``)."""
        groups: Dict[tuple, List[Reconfig]] = {}
        for rec in self.reconfigs:
            groups.setdefault((rec.iteration, rec.phase, rec.needed_s), []).append(rec)
        rows = []
        for (iteration, phase, needed), recs in groups.items():
            issued, ready = min(r.issued_s for r in recs), max(r.ready_s for r in recs)
            exposed = 0.0 if needed is None else max(0.0, ready - needed)
            rows.append({"iteration": iteration, "phase": phase, "kind": recs[0].kind,
                         "ocs": [r.ocs for r in recs], "template": recs[0].template,
                         "mode": "/".join(sorted({r.mode for r in recs})),
                         "issued_s": issued, "ready_s": ready, "needed_s": needed,
                         "window_s": None if needed is None else max(0.0, needed - issued),
                         "reconfig_s": ready - issued, "exposed_s": exposed,
                         "hidden_s": max(0.0, ready - issued - exposed),
                         "dark_s": sum(r.delay_s for r in recs)})
        return rows

    def summary(self) -> Dict[int, dict]:
        """Per iteration: OCS reconfigurations, their summed dark time (OCS x
        seconds), and the wall time the phases waited (exposed) or not (hidden).
        Requests no phase has claimed yet (issued for an iteration that has
        not started) are counted as ``unclaimed``."""
        result: Dict[int, dict] = {}
        for row in self.occurrences():
            out = result.setdefault(row["iteration"], {
                "reconfigs": 0, "dark_s": 0.0, "exposed_s": 0.0, "hidden_s": 0.0,
                "unclaimed": 0})
            out["reconfigs"] += len(row["ocs"])
            out["dark_s"] += row["dark_s"]
            out["exposed_s"] += row["exposed_s"]
            out["hidden_s"] += row["hidden_s"]
            out["unclaimed"] += len(row["ocs"]) if row["needed_s"] is None else 0
        return result
