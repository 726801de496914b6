"""RL iterations on the flow-level model: the emulator's `IterationRunner`, event
for event, on `FlowSim` instead of iperf3.

The same `traffic.phases.Schedule` is replayed with the same rules as
`emu.live.rlreplay`:

* a phase is *ready* at its planned offset from the iteration's start, once
  every phase in ``Phase.after`` has ended, and for the weight sync
  ``optimizer_s`` after the DP all-reduce ended (`traffic.iterations.ready_time`);
* with an RFabric control proxy (`controllers.proxy_core.ControlProxy`, the
  same object the live runner drives) the runner reports the phase events on
  its clock and carries out the requests it gets back; a phase starts once
  every reconfiguration queued for the OCS of its template is done, and the
  wait is its *stall* (exposed reconfiguration);
* each phase's flows are its DAG's flows, one modelled flow per flow of the
  DAG, released when the DAG says (`Flow.at_s` after the phase start, or
  after the flows it waits for).

Reconfigurations go through one control worker in order, as the controller
serialises them.  Each follows the six-step sequence of
`controllers.reconfig` with the plan of `controllers.ocs_core.OcsCore`::

    start --round--> routes moved --round--> torn ....dark (delay x tdf)....
          lit --round--> routes restored (done: the phase may start)

At *torn* the routes go over the kept circuits only: destinations that only
the torn circuits reached have no path and their flows wait at the
blackhole (packets sent into a dark port are lost); at *lit* the routes go
over the new circuits and every running flow is rerouted.  ``round_s`` is one
confirmed control round (calibrated, `traffic.model.calibration`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np

from controllers.ocs_core import OcsCore
from traffic.iterations import IterationRun, PhaseRun, dark_windows, named_flows, ready_time
from traffic.model.calibration import Calibration
from traffic.model.engine import FlowSim
from traffic.model.kernel_ecmp import KernelFlowKeys
from traffic.model.network import ModelNetwork
from traffic.model.phase_arrays import ScheduleArrays
from traffic.results import FlowResult


@dataclass
class ModelReply:
    """A reconfiguration the model carried out (model seconds)."""

    ocs: str
    request: dict
    stamps: Dict[str, float]
    dark_s: float


class ControlWorkerModel:
    """Reconfigurations one at a time, in order, on the model's clock."""

    def __init__(self, sim: FlowSim, net: ModelNetwork, tdf: float, round_s: float,
                 on_done: Callable[[ModelReply, object], None], on_routes: Callable[[], None]):
        self.sim, self.net, self.tdf, self.round_s = sim, net, tdf, round_s
        self.on_done, self.on_routes = on_done, on_routes
        self.free_at = 0.0
        self.done_at: Dict[str, float] = {}       # OCS -> end of its latest queued change
        self.replies: List[ModelReply] = []
        self.cores = {o: OcsCore(net.fabric, o, tdf=tdf) for o in net.fabric.ocs_switches}

    def submit(self, request: dict, record=None) -> float:
        """Queue a reconfiguration; returns when it will be done (routes restored)."""
        if request["op"] != "reconfigure":
            raise ValueError(f"the control worker sends reconfigurations, not {request['op']!r}")
        ocs = request["ocs"]
        start = max(self.sim.now, self.free_at)
        torn = start + 2 * self.round_s
        # The OCS core's plan says how long the ports stay dark (its Table 2
        # delay x tdf); the circuits it tears are planned again at the tear,
        # against the circuits of that moment.
        lit = torn + self.cores[ocs].plan(request["circuits"]).delay_emulated_s
        done = lit + self.round_s
        self.free_at = done
        self.done_at[ocs] = done
        stamps = {"start": start, "routes_moved": start + self.round_s, "torn": torn,
                  "dark_end": lit, "lit": lit, "routes_restored": done}
        reply = ModelReply(ocs, request, stamps, lit - torn)
        state: Dict[str, object] = {}

        def tear(_sim):
            plan = self.cores[ocs].plan(request["circuits"])
            state["plan"] = plan
            self.net.set_circuits(ocs, plan.keep)
            self.on_routes()

        def light(_sim):
            plan = state["plan"]
            self.cores[ocs].commit(plan)
            self.net.set_circuits(ocs, plan.keep | plan.light)
            self.on_routes()

        def finish(_sim):
            self.replies.append(reply)
            self.on_done(reply, record)

        self.sim.at(torn, tear)
        self.sim.at(lit, light)
        self.sim.at(done, finish)
        return done

    def ready_for(self, ocs_names) -> float:
        """When every change queued so far for these OCS is done."""
        return max([self.sim.now] + [self.done_at.get(o, 0.0) for o in ocs_names])


@dataclass
class _PhaseState:
    run: PhaseRun
    phase: object
    index: int                # in ModelIterationRunner._phases
    position: int             # in the schedule's phases
    scheduled: bool = False   # its start is due: every phase it waits for ended
    first: int = 0            # sim ids [first, first + count)
    count: int = 0


class ModelIterationRunner:
    """Runs ``iterations`` of a schedule on the model; see the module docstring.

    ``bps_of(gbps)`` gives a link's capacity (the emulator's shaped rate at
    emulated scale, or the real line rate at full scale); times are model
    seconds in the schedule's units.  ``kernel_keys``: the flows take the
    paths a ``linux`` data plane run of that ECMP seed takes
    (`traffic.model.kernel_ecmp`), instead of a draw by the model's hash.
    """

    def __init__(self, fabric, schedule, bps_of: Callable[[float], float],
                 calibration: Calibration, optimizer_s: float = 0.0, proxy=None,
                 ecmp_seed: int = 1, tdf: float = 1.0,
                 log: Callable[[str], None] = print, progress=None, keep_flows: bool = True,
                 coalesce: float = 0.0, arrays: Optional[ScheduleArrays] = None,
                 kernel_keys: Optional[KernelFlowKeys] = None):
        self.fabric, self.schedule = fabric, schedule
        # The flows as arrays: built here, or shared by the caller (one
        # schedule modelled on several fabrics).
        self.arrays = arrays if arrays is not None else ScheduleArrays(schedule)
        # A linux data plane run's own paths: each flow keyed by the kernel
        # routers' hash of its ports, taken as the emulator's replayers take them.
        self.kernel_keys = kernel_keys
        self._iteration_keys: Dict[int, np.ndarray] = {}
        self.net = ModelNetwork(fabric, bps_of, ecmp_seed=ecmp_seed,
                                kernel_multipath=kernel_keys is not None)
        self.calibration, self.optimizer_s, self.proxy = calibration, optimizer_s, proxy
        self.log = log
        # Per-flow records cost memory and time at full scale: the phase times
        # and the iteration times do not need them.
        self.keep_flows = keep_flows
        self.sim = FlowSim(self.net.capacity_bps, self._route,
                           efficiency=calibration.efficiency,
                           hop_latency_s=calibration.hop_latency_s,
                           startup_s=calibration.startup_s, on_tag_done=self._phases_done,
                           tables=self._route_tables, progress=progress, coalesce=coalesce)
        self.worker = ControlWorkerModel(self.sim, self.net, tdf, calibration.round_s,
                                         self._reconfigured, self._routes_changed)
        self._src = np.empty(0, dtype=np.int64)
        self._dst = np.empty(0, dtype=np.int64)
        self._key = np.empty(0, dtype=np.uint64)
        self._phases: List[_PhaseState] = []
        self.iterations: List[IterationRun] = []
        self.base = 0.0
        self.total = 0
        self.failed: List[str] = []

    # ------------------------------------------------------------ the engine's hooks
    def _route(self, flows: np.ndarray):
        return self.net.paths_indexed(self._src[flows], self._dst[flows], self._key[flows])

    def _routes_changed(self) -> None:
        self.sim.set_capacity(np.arange(len(self.net.capacity_bps)), self.net.capacity_bps)
        self.sim.reroute()

    def _route_tables(self) -> tuple:
        return self.net.route_tables(self._src, self._dst, self._key)

    def _phases_done(self, indices: np.ndarray, t: float) -> None:
        """Every flow of these phases (tagged by their index) is done."""
        for index in indices.tolist():
            self._phase_ended(self._phases[index], t)

    def _reconfigured(self, reply: ModelReply, record) -> None:
        if record is not None:
            record.ready_s = reply.stamps["routes_restored"] - self.base

    # ------------------------------------------------------------ proxy
    def _send(self, decide) -> None:
        before = len(self.proxy.reconfigs)
        decision = decide()
        records = self.proxy.reconfigs[before:]
        if len(records) != len(decision.requests):
            raise RuntimeError("proxy returned requests it did not record")
        for request, record in zip(decision.requests, records):
            if record.iteration <= self.total:   # what it plans past the last is not sent
                self.worker.submit(request, record)

    # ------------------------------------------------------------ phases
    def _append(self, name: str, values: np.ndarray) -> None:
        setattr(self, name, np.concatenate([getattr(self, name), values]))

    def _start_flows(self, state: _PhaseState, t: float, started: float) -> None:
        run = state.run
        arrays = self.arrays.phases[state.position]
        first = self.sim.n_flows
        count = len(arrays.nbytes)
        index = self.net.index
        hosts = np.array([index[h] for h in arrays.hosts], dtype=np.int64)
        self._append("_src", hosts[arrays.src])
        self._append("_dst", hosts[arrays.dst])
        self._append("_key", self._iteration_keys[state.position] if self.kernel_keys
                     else self.arrays.keys(run.iteration, state.position))
        self.sim.add_flows(arrays.nbytes, delay_s=arrays.at_s,
                           after=(arrays.after_ptr, arrays.after + first),
                           barriers=(arrays.barrier_ptr, arrays.barrier_members + first,
                                     arrays.waits), base_s=t,
                           cap_bps=arrays.cap_bps, tag=state.index)
        state.first, state.count = first, count
        run.flows_count = count
        run.start = started

    def _phase_ready(self, state: _PhaseState) -> None:
        """Every phase ``state`` waits for has ended: it starts when it is due."""
        phase, run = state.phase, state.run
        state.scheduled = True
        run.ready = ready_time(phase, self._current["t0"], self._current["ends"],
                               self.optimizer_s)

        def go(_sim):
            start = run.ready
            if self.proxy is not None:
                self._send(lambda: self.proxy.phase_started(
                    phase.name, phase.kind, run.ready - self.base,
                    self.arrays.pairs(state.position)))
                start = max(start, self.worker.ready_for(self.proxy.cache[phase.name].ocs))
            # The phase has started (its stall ends here); its flows go once the
            # emulator's replayer has told them to (`Calibration.phase_startup_s`).
            release = start + self.calibration.phase_startup_s
            if release > self.sim.now:
                self.sim.at(release, lambda _s: self._start_flows(state, release, start))
            else:
                self._start_flows(state, self.sim.now, start)

        self.sim.at(max(run.ready, self.sim.now), go)

    def _phase_ended(self, state: _PhaseState, t: float) -> None:
        run, phase = state.run, state.phase
        run.end = t
        if self.keep_flows:
            run.flows = self._results(state)
        if self.proxy is not None:
            self._send(lambda: self.proxy.phase_ended(phase.name, t - self.base))
        self._current["ends"][phase.name] = t
        for other in self._current["states"]:
            if not other.scheduled and phase.name in other.phase.after and all(
                    name in self._current["ends"] for name in other.phase.after):
                self._phase_ready(other)
        if len(self._current["ends"]) == len(self._current["states"]):
            self._iteration_ended(t)

    def _results(self, state: _PhaseState) -> List[FlowResult]:
        ids = slice(state.first, state.first + state.count)
        starts, ends = self.sim.released_s[ids].tolist(), self.sim.end_s[ids].tolist()
        results = []
        for flow, start, end in zip(state.phase.dag.flows, starts, ends):
            goodput = flow.bytes * 8 / (end - start) / 1e6 if end > start else 0.0
            results.append(FlowResult(id=flow.id, src=flow.src, dst=flow.dst, bytes=flow.bytes,
                                      step=flow.step, group=flow.group, start=start, end=end,
                                      bytes_received=flow.bytes, goodput_mbps=goodput,
                                      status="ok"))
        return results

    # ------------------------------------------------------------ iterations
    def _begin_iteration(self, index: int) -> None:
        t0 = self.sim.now
        it = IterationRun(index, t0)
        if self.proxy is not None:
            self._send(lambda: self.proxy.begin_iteration(t0 - self.base))
        states = []
        for position, phase in enumerate(self.schedule.phases):
            run = PhaseRun(index, phase.name, phase.kind)
            it.phases.append(run)
            state = _PhaseState(run, phase, len(self._phases), position)
            self._phases.append(state)
            states.append(state)
        self._current = {"it": it, "t0": t0, "ends": {}, "states": states}
        if self.kernel_keys is not None:
            # The emulator's phases take their ports as the iteration starts,
            # in the schedule's order, from one book for the run.
            self._iteration_keys = {
                position: self.kernel_keys.keys(f"i{index}/{phase.name}/", phase.dag)
                for position, phase in enumerate(self.schedule.phases)}
        for state in states:
            if not state.phase.after:
                self._phase_ready(state)

    def _iteration_ended(self, t: float) -> None:
        it = self._current["it"]
        it.end = t
        if self.proxy is not None:
            self._send(lambda: self.proxy.end_iteration(t - self.base))
        self.iterations.append(it)
        self.log(f"    iteration {it.iteration}: {it.duration_s:.3f} s, phases waited "
                 f"{it.exposed_s:.3f} s for circuits ({self.sim.n_flows:,} flows modelled)")
        if it.iteration < self.total:
            self.sim.at(t, lambda _s: self._begin_iteration(it.iteration + 1))

    def run(self, iterations: int) -> List[IterationRun]:
        self.total = iterations
        self.base = self.sim.now
        self.sim.at(self.sim.now, lambda _s: self._begin_iteration(1))
        self.sim.run()
        if len(self.iterations) != iterations:
            raise RuntimeError(f"the model ended after {len(self.iterations)} of {iterations} "
                               f"iterations: a phase's flows never finished (a destination "
                               f"unreachable for good?)")
        return self.iterations

    # ------------------------------------------------------------ results
    def flows(self, prefix: str) -> List[FlowResult]:
        return named_flows(self.iterations, prefix)

    def dark_windows(self) -> List[dict]:
        return dark_windows(self.worker.replies)
