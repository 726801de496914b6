"""Replay RL iterations (`traffic.phases.Schedule`) on a testbed, phase by phase,
optionally driving the RFabric control proxy (`controllers.proxy_core`).

Each phase of an iteration runs in its own thread with its own `Replayer`, so
phases that overlap in the one-step asynchronous layout (Train of batch i,
Gen of batch i+1) overlap on the wire too.  The replayers share one
`AgentPool` for the whole run: a host's agent starts once, when a phase
first sends to it.  A phase's replayer is made, and its first flows armed,
when the iteration starts, while the phase waits for its time and for the
phases before it; so a phase's time is its flows' (from its start to its
last flow's end), not that of starting processes.  A phase starts at its planned
offset from the iteration's start (``Phase.start_s``: the compute before it)
and not before every phase in ``Phase.after`` has ended; the weight sync also
waits ``optimizer_s`` after the DP all-reduce ends (the optimizer step runs
between them).  So a phase that ran late (TCP, contention, circuits)
delays the phases that wait for it, as it would a real job.

With a proxy, the runner reports phase events with its clock (seconds since
the first iteration started) and sends the requests it gets back over the
control channel.  Every request goes through one `ControlWorker` thread in
order (the controller serialises reconfigurations anyway, and one Unix
socket carries one request at a time): proactive requests are queued and
the runner goes on; a phase that starts waits for every queued or running
reconfiguration of the OCS its template names, so on-demand (blocking)
requests are waited for before its flows start.  The wait between a phase
being ready and its flows starting is its *stall*: the reconfiguration time
the phase exposed.  When a reconfiguration completes, the proxy's record of
it gets the measured ready time (``routes_restored`` of the reply), and the
runner's copy of the fabric gets the new circuits (and, for fabrics whose
GPUs forward, new host routes).

The run's feed (``bed.feed``, `emu.live.feed`) hears each iteration start
and end, and each phase start (its flows released) and end (its last flow's
end), with the proxy's template and the circuits it asked for that phase.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from emu.live.agents import AgentPool
from traffic.ports import PortBook
from emu.live.replay import FlowResult, Replayer
from traffic.iterations import (IterationRun, PhaseRun, dark_windows,  # noqa: F401
                                named_flows, ready_time)

RECONFIG_TIMEOUT_S = 120.0


@dataclass
class Reply:
    """A reconfiguration the controller carried out (epoch timestamps)."""

    ocs: str
    request: dict
    stamps: Dict[str, float]
    dark_s: float


class ControlWorker:
    """Sends control-channel requests one at a time, in order, from one thread."""

    def __init__(self, bed, on_done: Callable[[Reply, object], None]):
        self.bed = bed
        self.on_done = on_done
        self.replies: List[Reply] = []
        self.errors: List[str] = []
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="control")
        self._latest: Dict[str, Future] = {}
        self._lock = threading.Lock()

    def submit(self, request: dict, record=None) -> Future:
        future = self._pool.submit(self._send, request, record)
        with self._lock:
            self._latest[request["ocs"]] = future
        return future

    def _send(self, request: dict, record) -> Reply:
        args = {k: v for k, v in request.items() if k not in ("op", "ocs", "circuits")}
        if request["op"] != "reconfigure":
            raise ValueError(f"the control worker sends reconfigurations, not {request['op']!r}")
        try:
            answer = self.bed.reconfigure(request["ocs"], request["circuits"],
                                          timeout_s=RECONFIG_TIMEOUT_S, **args)
        except Exception as exc:
            self.errors.append(f"{request['op']} {request['ocs']}: {exc}")
            raise
        reply = Reply(request["ocs"], request, answer["timestamps"], answer["dark_s"])
        self.replies.append(reply)
        self.on_done(reply, record)
        return reply

    def wait(self, ocs: Sequence[str]) -> None:
        """Until every reconfiguration queued so far for these OCS is done."""
        with self._lock:
            futures = [self._latest[o] for o in ocs if o in self._latest]
        for future in futures:
            future.result(timeout=RECONFIG_TIMEOUT_S)

    def drain(self) -> None:
        with self._lock:
            futures = list(self._latest.values())
        for future in futures:
            try:
                future.result(timeout=RECONFIG_TIMEOUT_S)
            except Exception:      # already in self.errors
                pass

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


class IterationRunner:
    """Runs ``iterations`` of a schedule on one testbed; see the module docstring."""

    def __init__(self, bed, schedule, work_dir: Path, expected_mbps: float,
                 optimizer_s: float = 0.0, proxy=None, log: Callable[[str], None] = print,
                 replayer=Replayer):
        self.bed, self.schedule, self.work_dir = bed, schedule, Path(work_dir)
        # (bed, dag, mbps, work_dir, ports=, port_key=, agents=) -> .prepare(), .run(),
        # .close(), .finished_at
        self.replayer = replayer
        self.expected_mbps, self.optimizer_s = expected_mbps, optimizer_s
        self.proxy, self.log = proxy, log
        # One book for the phases that run side by side: no port twice on a host.
        self.ports = PortBook(bed.ecmp_seed)
        self.base = 0.0
        self.iterations: List[IterationRun] = []
        self._proxy_lock = threading.Lock()
        self.worker: Optional[ControlWorker] = None
        self.agents: Optional[AgentPool] = None
        self.total = 0

    # ------------------------------------------------------------ proxy
    def _clock(self, t: float) -> float:
        return t - self.base

    def _send(self, decide: Callable[[], object]) -> List[Future]:
        """Ask the proxy (under its lock) and queue its requests."""
        with self._proxy_lock:
            before = len(self.proxy.reconfigs)
            decision = decide()
            records = self.proxy.reconfigs[before:]
        if len(records) != len(decision.requests):
            raise RuntimeError("proxy returned requests it did not record")
        # What the proxy plans for an iteration after the last is not sent.
        return [self.worker.submit(req, rec) for req, rec in zip(decision.requests, records)
                if rec.iteration <= self.total]

    def _reconfigured(self, reply: Reply, record) -> None:
        if record is not None:
            with self._proxy_lock:
                record.ready_s = self._clock(reply.stamps["routes_restored"])

    def _proxy_choice(self, name: str, iteration: int) -> Tuple[Optional[str], Optional[dict]]:
        """The proxy's template for this occurrence of phase ``name``, and the
        circuits it asked for it: (None, None) without a proxy.

        The template is the circuit set the proxy wants while the phase runs
        (`controllers.rfabric_templates`), chosen by the phase's kind on its
        first occurrence and cached by name; a static proxy never puts one in
        place, so there it is None.  The circuits are what the proxy requested
        for this very occurrence, per OCS: ahead of it (proactive, possibly at
        the end of the iteration before) or when it started (on demand); None
        when the circuits it wants were in place already.
        """
        if self.proxy is None:
            return None, None
        with self._proxy_lock:
            template = self.proxy.cache[name].name if self.proxy.mode != "static" else None
            # In order: a later request for the same OCS replaces an earlier one.
            circuits = {rec.ocs: rec.request["circuits"] for rec in self.proxy.reconfigs
                        if rec.iteration == iteration and rec.phase == name}
        return template, circuits or None

    # ------------------------------------------------------------ phases
    def _run_phase(self, run: PhaseRun, phase, t0: float, ends: Dict[str, float],
                   done: Dict[str, threading.Event], failed: List[str]) -> None:
        replayer = None
        end_owed = False          # the feed heard of its start, not yet of its end
        try:
            replayer = self.replayer(self.bed, phase.dag, self.expected_mbps,
                                     self.work_dir / f"i{run.iteration}" / phase.name,
                                     ports=self.ports,
                                     port_key=f"i{run.iteration}/{phase.name}/",
                                     agents=self.agents)
            # Its first flows armed while it waits for its time and for the
            # phases before it, as a job's communicators exist before its
            # collectives: the phase's time is then its traffic's.
            replayer.prepare()
            for name in phase.after:
                done[name].wait()
            if failed:
                return
            run.ready = ready_time(phase, t0, ends, self.optimizer_s)
            delay = run.ready - time.time()
            if delay > 0:
                time.sleep(delay)      # the compute before the phase: time is the condition
            run.ready = max(run.ready, time.time())
            if self.proxy is not None:
                self._send(lambda: self.proxy.phase_started(
                    phase.name, phase.kind, self._clock(run.ready), phase.pairs()))
                self.worker.wait(self.proxy.cache[phase.name].ocs)
            run.start = time.time()
            template, circuits = self._proxy_choice(phase.name, run.iteration)
            self.bed.feed.emit("phase", t=run.start, state="start", name=phase.name,
                               iteration=run.iteration, template=template, circuits=circuits,
                               flows=len(phase.dag.flows), phase_kind=phase.kind,
                               stall_s=run.stall_s)
            end_owed = True
            run.flows = replayer.run()
            # Its last flow's end, not the replayer's own teardown after it.
            run.end = replayer.finished_at or time.time()
            bad = [f for f in run.flows if f.status != "ok"]
            if bad:
                failed.append(f"{phase.name}: {len(bad)} of {len(run.flows)} flows failed "
                              f"({bad[0].id}: {bad[0].status} {bad[0].error})")
            end_owed = False
            self._phase_ended(run, ok=not bad, flows_failed=len(bad))
            if self.proxy is not None:
                self._send(lambda: self.proxy.phase_ended(phase.name, self._clock(run.end)))
        except BaseException as exc:
            failed.append(f"{phase.name}: {type(exc).__name__}: {exc}")
            run.end = run.end or time.time()
            if end_owed:          # its replay broke off: the phase ends here, failed
                self._phase_ended(run, ok=False, flows_failed=None)
        finally:
            ends[phase.name] = run.end or time.time()
            done[phase.name].set()
            if replayer is not None:
                replayer.close()        # a phase that never ran (another failed)

    def _phase_ended(self, run: PhaseRun, ok: bool, flows_failed: Optional[int]) -> None:
        self.bed.feed.emit("phase", t=run.end, state="end", name=run.name,
                           iteration=run.iteration, duration_s=run.duration_s,
                           phase_kind=run.kind, ok=ok, flows_failed=flows_failed)

    def _iteration(self, index: int) -> IterationRun:
        t0 = time.time()
        it = IterationRun(index, t0)
        self.bed.feed.emit("iteration", t=t0, state="start", iteration=index,
                           iterations=self.total)
        if self.proxy is not None:
            self._send(lambda: self.proxy.begin_iteration(self._clock(t0)))
        ends: Dict[str, float] = {}
        done = {p.name: threading.Event() for p in self.schedule.phases}
        failed: List[str] = []
        threads = []
        for phase in self.schedule.phases:
            run = PhaseRun(index, phase.name, phase.kind)
            it.phases.append(run)
            thread = threading.Thread(target=self._run_phase, name=f"phase-{phase.name}",
                                      args=(run, phase, t0, ends, done, failed), daemon=True)
            thread.start()
            threads.append(thread)
        for thread in threads:
            while thread.is_alive():
                thread.join(0.5)         # short joins: signals reach the main thread
        it.end = max([t0] + list(ends.values()))
        self.bed.feed.emit("iteration", t=it.end, state="end", iteration=index,
                           iterations=self.total, duration_s=it.duration_s, ok=not failed)
        if failed:
            raise RuntimeError(f"iteration {index}: " + "; ".join(failed))
        if self.proxy is not None:
            self._send(lambda: self.proxy.end_iteration(self._clock(it.end)))
        return it

    def run(self, iterations: int) -> List[IterationRun]:
        self.worker = ControlWorker(self.bed, self._reconfigured)
        self.agents = AgentPool(self.bed, self.work_dir / "agents")
        self.total = iterations
        self.base = time.time()
        try:
            for index in range(1, iterations + 1):
                it = self._iteration(index)
                self.iterations.append(it)
                self.log(f"    iteration {index}: {it.duration_s:.2f} s, phases waited "
                         f"{it.exposed_s:.2f} s for circuits")
            self.worker.drain()
        finally:
            self.worker.close()
            self.agents.close()
        if self.worker.errors:
            raise RuntimeError("reconfiguration failed: " + "; ".join(self.worker.errors))
        return self.iterations

    # ------------------------------------------------------------ results
    def flows(self, prefix: str) -> List[FlowResult]:
        """Every flow, its id made unique across iterations: ``{prefix}-i{n}-{id}``."""
        return named_flows(self.iterations, prefix)

    def dark_windows(self) -> List[dict]:
        """Each reconfiguration's dark time, torn to lit, epoch seconds."""
        return dark_windows(self.worker.replies if self.worker else [])
