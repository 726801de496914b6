"""Replay a flow DAG on Mininet hosts with iperf3 and record every flow.

Each flow is *armed* ahead of time (a one-off iperf3 server on the source,
and a client forked by the destination's host agent, waiting) and *fired*
when its start condition holds.  Clients run in reverse mode: the client is
the receiver and stops when it has received every byte, so a flow's end is
its last byte's arrival.  Arming the next wave while the current one runs
keeps process start-up off the critical path.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import queue
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Deque, Dict, List, Optional, Sequence, Tuple

from controllers.pause import pause_at
from emu.live import state
from emu.live.agents import AgentPool, HostAgent
from traffic.ports import PortBook
from traffic.flows import Flow, FlowDag
from traffic.results import FlowResult  # noqa: F401  (re-exported: callers import it here)
from emu.live.iperf_worker import SERVER_READY, ClientSpec, server_command

MIN_FLOW_TIMEOUT_S = 30.0
AGENT_START_TIMEOUT_S = 30.0
ARM_AHEAD_S = 2.0
#: Flows armed per pass of the replay loop, earliest due first: a server takes
#: a few milliseconds to start, so a pass stays short and a flow already due
#: waits at most about one pass for its go once its server listens.
ARM_PER_PASS = 2
#: A standby's processes run under its resend's id and this (see `Replayer._stand_by`).
STANDBY_SUFFIX = "~standby"


def start_server(bed, host: str, ip: str, port: int, name: str, on_ready) -> subprocess.Popen:
    """A one-off iperf3 server; ``on_ready()`` is called once it listens."""
    server = bed.popen(host, server_command(ip, port), f"iperf3 server {name}",
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def watch():
        told = False
        for line in server.stdout:  # read to the end, so the server never blocks on output
            if not told and SERVER_READY in line:
                told = True
                on_ready()

    threading.Thread(target=watch, daemon=True).start()
    return server


def reap(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace_s)


class Replayer:
    """Replay a DAG; ``gate`` and ``on_done`` let a caller hold flows back.

    ``gate(flow)`` is asked whenever a flow is otherwise due (its time has
    come and its dependencies are done), whether or not its processes are
    ready yet; a False keeps it waiting, and it is asked again after the next
    flow finishes: KV ingress credits are such a gate.  ``on_done(result)``
    is told of every finished flow (to release credit, say), and
    ``on_start(flow)`` of every flow given its go (a request's KV transfer
    under way, say), both from the replay loop.  Flows are
    armed at most ``ARM_AHEAD_S`` before they are due, so a long open-loop
    stream never holds hundreds of idle processes.

    ``events`` are (seconds after the start, callback(replayer)) pairs run
    in the replay loop at their time, e.g. a switch failure; a callback may
    `move` flows to other hosts (a NIC failing over to its other port), and
    one that must wait for something should `post` its follow-up from a
    thread rather than hold the loop.
    Hosts in ``agent_hosts`` get a host agent from the start, so a flow
    moved to them does not wait for one.  ``on_moved(old_id, new_id)`` is
    told when a started flow is cancelled and resent (``on_done`` never
    hears of the cancelled one): a gate frees what the old one held.
    ``window_bytes`` bounds every flow's TCP window (both ends' socket
    buffers, as ``iperf3 -w``; 0: TCP's own autotuning).
    ``agents``: an `AgentPool` whose agents the replay uses instead of
    starting (and stopping) its own.
    Every flow's server and client ports come from ``ports`` (a fresh book
    of the testbed's ECMP seed by default; replayers running side by side
    share one), drawn by ``port_key`` + the flow's id, so a flow takes the
    same ECMP path in every replay of one seed (`traffic.ports`).
    ``standby(flow)`` says where a flow would be resent if it had to move,
    ``(src, dst)``, or None: each such flow's resend has its server
    listening and its client waiting before the clock starts (`_stand_by`).
    """

    def __init__(self, bed, dag: FlowDag, expected_mbps: float, work_dir: Path,
                 progress: Optional[Callable[[int, int], None]] = None,
                 gate: Optional[Callable[[Flow], bool]] = None,
                 on_done: Optional[Callable[[FlowResult], None]] = None,
                 events: Sequence[Tuple[float, Callable[["Replayer"], None]]] = (),
                 agent_hosts: Sequence[str] = (),
                 on_moved: Optional[Callable[[str, str], None]] = None,
                 window_bytes: int = 0, ports: Optional[PortBook] = None,
                 port_key: str = "", agents: Optional[AgentPool] = None,
                 standby: Optional[Callable[[Flow], Optional[Tuple[str, str]]]] = None,
                 on_start: Optional[Callable[[Flow], None]] = None):
        self.bed = bed
        self.dag = dag
        self.expected_mbps = expected_mbps
        self.work_dir = Path(work_dir)
        self.progress = progress
        self.gate = gate
        self.on_done = on_done
        self.on_start = on_start
        self.events = sorted(events, key=lambda event: event[0])
        self.agent_hosts = tuple(agent_hosts)
        self.on_moved = on_moved
        self.window_bytes = window_bytes
        self.standby = standby
        self.t0 = 0.0
        self.finished_at: Optional[float] = None    # when the last flow ended
        self._prepared = self._closed = False
        self.ports = ports if ports is not None else PortBook(bed.ecmp_seed)
        self.port_key = port_key
        self._port_of: Dict[str, Tuple[int, int]] = {}    # flow -> (server, client) port
        # Replay state, shared by the loop and the event callbacks.
        self.flows: Dict[str, Flow] = {}
        self.results: Dict[str, FlowResult] = {}
        self._order: List[str] = []
        self._agents: Dict[str, HostAgent] = {}
        self._servers: Dict[str, subprocess.Popen] = {}
        # A first move's id (<fid>~m1) -> the hosts its standby processes wait
        # on.  They run under an id of their own (<fid>~m1~standby), so that
        # one dropped never shares an id with the flow's own processes; the
        # resend that takes them over speaks to its agent with that id.
        self._standby: Dict[str, Tuple[str, str]] = {}
        self._took_standby: set = set()     # resends running on their standby's processes
        self._events: "queue.Queue" = queue.Queue()
        self._pool = agents.view(self._events) if agents is not None else None
        self._armed: set = set()
        self._fired: Dict[str, float] = {}
        self._done: set = set()
        self._listening: set = set()
        self._admitted: set = set()      # due flows the gate let through
        self._moved: set = set()
        self._aborts: List[subprocess.Popen] = []
        # Slow work no flow waits for (ending a moved flow's old processes and
        # connections): the loop does one per pass once nothing is left to arm.
        self._chores: Deque[Callable[[], None]] = collections.deque()

    def _take_ports(self, fid: str) -> None:
        flow, key = self.flows[fid], self.port_key + fid
        self._port_of[fid] = (self.ports.server(flow.src, key), self.ports.client(flow.dst, key))

    def _ip(self, host: str) -> str:
        return self.bed.fabric.graph.nodes[host]["ip"]

    def _timeout_s(self, flow: Flow) -> float:
        return max(MIN_FLOW_TIMEOUT_S, 10 * flow.bytes * 8 / (self.expected_mbps * 1e6))

    # ------------------------------------------------------------ agents and arming
    def _start_agent(self, host: str) -> HostAgent:
        """The host's agent, this replay's own or the pool's (not waited for)."""
        if host not in self._agents:
            self._agents[host] = (self._pool.agent(host) if self._pool is not None else
                                  HostAgent(self.bed, host, self.work_dir, self._events))
        return self._agents[host]

    def _agent(self, host: str) -> HostAgent:
        agent = self._start_agent(host)
        if not agent.ready.wait(AGENT_START_TIMEOUT_S):
            raise RuntimeError(f"host agent on {host} did not start")
        return agent

    def _arm_at(self, flow: Flow) -> Optional[float]:
        """When ``flow`` may be armed, or None while that is not known yet.

        A flow due at a time is armed ``ARM_AHEAD_S`` before it.  A flow that
        follows others right away (the next step of a collective) is armed
        once they have all fired, so its processes start while they run.  A
        flow that follows others after a pause longer than ``ARM_AHEAD_S``
        (the next phase, after compute) waits until they have ended and is
        armed ``ARM_AHEAD_S`` before it is due: armed at once, its processes
        would start while the flows it follows still send, and take the CPU
        those senders need.
        """
        if not flow.after:
            return self.t0 + flow.at_s - ARM_AHEAD_S
        if flow.at_s <= ARM_AHEAD_S:
            return time.time() if all(d in self._fired for d in flow.after) else None
        if not all(d in self._done for d in flow.after):
            return None
        return max(self.results[d].end for d in flow.after) + flow.at_s - ARM_AHEAD_S

    def _start_processes(self, flow: Flow, fid: str) -> None:
        """The flow's one-off server on its source and its client, forked by
        its destination's agent to wait for its go, under the id ``fid``;
        the flow's ports taken already."""
        events = self._events
        port, cport = self._port_of[flow.id]
        self._servers[fid] = start_server(
            self.bed, flow.src, self._ip(flow.src), port, fid,
            lambda: events.put({"event": "listening", "id": fid}))
        spec = ClientSpec(dst=self._ip(flow.src), port=port, cport=cport, bytes=flow.bytes,
                          reverse=True, rate_mbps=flow.rate_mbps or 0.0,
                          congestion=self.bed.congestion, window_bytes=self.window_bytes)
        self._agent(flow.dst).send({"op": "arm", "id": fid, "spec": asdict(spec),
                                    "path": str(self.work_dir / f"{fid}.json")})

    def _stand_by(self) -> None:
        """Arm every flow's resend that ``standby`` names hosts for, before the
        clock starts: its server listening on the new source and its client
        waiting on the new destination, with the id and ports `move` gives a
        first move (``<fid>~m1``; ports taken after every planned flow's, so
        that those stay the same).

        Arming a resend mid-stream, with both cores busy, took the replay
        loop 3-10 ms a flow (the flows moved together waiting for one
        another's), its server 1-10 ms more to listen and the destination's
        agent a fork: resends started 20-70 ms after their cancellation, where
        a transfer engine whose other NIC port is up already reconnects in
        about a round trip.  A standby left unused is cancelled by `close`.
        """
        for fid in self._order:
            flow = self.flows[fid]
            ends = self.standby(flow)
            if ends is None:
                continue
            resend = dataclasses.replace(flow, id=f"{fid}~m1", src=ends[0], dst=ends[1])
            key = self.port_key + resend.id
            self._port_of[resend.id] = (self.ports.server(resend.src, key),
                                        self.ports.client(resend.dst, key))
            self._standby[resend.id] = ends
            self._start_processes(resend, self._process_id(resend.id, standby=True))

    def _arm(self, fid: str) -> None:
        if self._standby.pop(fid, None) is not None:    # armed already: take it over
            self._took_standby.add(fid)
            process_id = self._process_id(fid)
            self._servers[fid] = self._servers.pop(process_id)
            if process_id in self._listening:
                self._listening.add(fid)
        else:
            if fid not in self._port_of:
                self._take_ports(fid)       # a flow moved to other hosts
            self._start_processes(self.flows[fid], fid)
        self._armed.add(fid)

    def _process_id(self, fid: str, standby: bool = False) -> str:
        """The id flow ``fid``'s processes run under (its standby's, if it took one)."""
        return fid + STANDBY_SUFFIX if standby or fid in self._took_standby else fid

    def _flow_id(self, process_id: str) -> Optional[str]:
        """The flow whose processes run under ``process_id``; None for a
        standby no flow took over (one cancelled, or not needed yet)."""
        if not process_id.endswith(STANDBY_SUFFIX):
            return process_id
        fid = process_id[:-len(STANDBY_SUFFIX)]
        return fid if fid in self._took_standby else None

    def _send(self, host: str, op: str, fid: str) -> None:
        """Tell ``host``'s agent to ``op`` (go, cancel) flow ``fid``'s client."""
        self._agents[host].send({"op": op, "id": self._process_id(fid)})

    def post(self, callback: Callable[["Replayer"], None]) -> None:
        """Run ``callback(replayer)`` in the replay loop, soon; callable from any
        thread.  Work that waits elsewhere (a controller rerouting after a
        failure) hands its result back this way, while the loop goes on
        starting and finishing flows: the loop is the only place flows change.
        A callback still queued when the last flow ends is not run."""
        self._events.put({"event": "call", "callback": callback})

    # ------------------------------------------------------------ moving flows
    def move(self, fid: str, src: Optional[str] = None, dst: Optional[str] = None
             ) -> Optional[str]:
        """Send flow ``fid`` between other hosts; returns the id that now carries it.

        A flow not armed yet just changes hosts.  An armed one is cancelled
        (its result says "moved", its processes go) and a new flow
        ``<fid>~m<n>`` takes its place between the new hosts; flows that
        waited for it wait for the new one.  A running one is resent in full
        from now, as a transfer restarted on another NIC port would; one
        armed but not started keeps its start condition (due time and the
        flows it follows), so that a move never makes a later flow due
        early.  A finished flow stays as it is (None).  Only from the replay
        loop: an event callback.
        """
        if fid in self._done:
            return None
        flow = self.flows[fid]
        src, dst = src or flow.src, dst or flow.dst
        if fid not in self._armed:
            self.flows[fid] = dataclasses.replace(flow, src=src, dst=dst)
            self.results[fid].src, self.results[fid].dst = src, dst
            self._port_of.pop(fid, None)    # its ports were taken on the old hosts
            return fid
        now = time.time()
        self._send(flow.dst, "cancel", fid)
        # Ending the old flow's server and connections takes a process each and
        # no flow waits for it: a chore, for when the loop has time.
        server = self._servers.pop(fid, None)
        if server is not None:
            self._chores.append(lambda: reap(server, grace_s=1.0))
        if self.started(fid):
            self._abort_connections(flow)
        count = sum(1 for other in self.flows if other.startswith(fid + "~m")) + 1
        new_id = f"{fid}~m{count}"
        if self._standby.get(new_id, (src, dst)) != (src, dst):
            self._drop_standby(new_id)      # it moves elsewhere: a server of its own
        result = self.results[fid]
        result.status, result.error = "moved", f"moved to {src}->{dst} as {new_id}"
        result.start, result.end = self._fired.get(fid, now), now
        self._done.add(fid)
        self._moved.add(fid)
        if self.started(fid):
            flow = dataclasses.replace(flow, after=(), at_s=now - self.t0)
        self.flows[new_id] = dataclasses.replace(flow, id=new_id, src=src, dst=dst)
        self.results[new_id] = FlowResult(new_id, src, dst, flow.bytes, flow.step, flow.group)
        # Beside the flow it replaces: the loop asks the gate in this order.
        self._order.insert(self._order.index(fid) + 1, new_id)
        for other_id, other in list(self.flows.items()):
            if fid in other.after:
                self.flows[other_id] = dataclasses.replace(
                    other, after=tuple(new_id if d == fid else d for d in other.after))
        if self.on_moved:
            self.on_moved(fid, new_id)
        if self.started(fid):
            # Due now: its server starts while the callback moves other flows.
            self._arm(new_id)
        return new_id

    def _drop_standby(self, fid: str) -> None:
        """Cancel a standby's processes (its ports stay taken: nothing needs them)."""
        _, dst = self._standby.pop(fid)
        del self._port_of[fid]
        process_id = self._process_id(fid, standby=True)
        self._agents[dst].send({"op": "cancel", "id": process_id})
        server = self._servers.pop(process_id)
        self._chores.append(lambda: reap(server, grace_s=1.0))

    def _abort_connections(self, flow: Flow) -> None:
        """Destroy a cancelled flow's TCP connections at both ends (``ss -K``,
        in the background).

        Its processes go, but not their sockets: behind a failed port each
        end's kernel resends its FIN into the dead link for minutes and keeps
        the flow's four-tuple, which the next replay of the same ECMP seed
        takes again; there the new connection met the old one (refused, or
        thousands of retransmissions).  A failed-over transfer's connection
        is gone for good, as an RDMA queue pair on a failed port is.
        """
        server = f"{self._ip(flow.src)}:{self._port_of[flow.id][0]}"

        def abort(host, side):
            self._aborts.append(self.bed.popen(
                host, ["ss", "-K", "-t", "-n", side, server], f"ss -K {flow.id}",
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

        for host, side in ((flow.src, "src"), (flow.dst, "dst")):
            self._chores.append(lambda host=host, side=side: abort(host, side))

    def started(self, fid: str) -> bool:
        """Whether flow ``fid`` has been told to go (it may have ended since)."""
        return fid in self._fired

    # ------------------------------------------------------------ the loop
    def prepare(self) -> None:
        """Take the ports, start the agents and arm the first wave now, ahead of
        `run` (which does it otherwise): a caller that knows the replay is
        coming (an RL phase waiting for the phases before it) keeps this off
        the replay's clock.  Once; `close` undoes it if `run` never comes."""
        if self._prepared:
            return
        if self.dag.external:
            raise ValueError(f"the DAG waits for flows outside it: {list(self.dag.external)}; "
                             "merge it with the DAG that holds them first")
        self._prepared = True
        self.flows = dict(self.dag.by_id())
        self._order = [f.id for f in self.dag.topological_order()]
        self.results = {fid: FlowResult(fid, f.src, f.dst, f.bytes, f.step, f.group)
                        for fid, f in self.flows.items()}
        for fid in self._order:         # in plan order: the same ports every run
            self._take_ports(fid)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            for host in sorted({f.dst for f in self.flows.values()} | set(self.agent_hosts)):
                self._start_agent(host)
            for agent in self._agents.values():
                if not agent.ready.wait(AGENT_START_TIMEOUT_S):
                    raise RuntimeError(f"host agent on {agent.host} did not start")
            if self.standby is not None:
                self._stand_by()
            self._arm_first_wave()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Stop what the replay started (its own agents, servers, aborts); a
        pool's agents go on.  Idempotent; `run` ends with it."""
        if self._closed:
            return
        self._closed = True
        while self._chores:
            self._chores.popleft()()
        for fid, (_, dst) in self._standby.items():     # unused: a pool's agent goes on
            try:
                self._agents[dst].send({"op": "cancel",
                                        "id": self._process_id(fid, standby=True)})
            except OSError:
                pass                # the agent is gone, and its waiting clients with it
        for agent in self._agents.values():
            agent.stop()            # a pool's agents go on
        if self._pool is not None:
            self._pool.release()
        for proc in list(self._servers.values()) + self._aborts:
            if proc.poll() is None:
                proc.terminate()        # all at once: dozens of standbys may be left
        for proc in list(self._servers.values()) + self._aborts:
            reap(proc)

    def run(self) -> List[FlowResult]:
        self.prepare()
        flows, results, fired, done = self.flows, self.results, self._fired, self._done
        try:
            self.t0 = time.time()
            pending_events = list(self.events)
            pause_at("replay-started")      # tests kill the controller here

            while len(done) < len(flows):
                self.bed.check_controller()
                while pending_events and time.time() >= self.t0 + pending_events[0][0]:
                    pending_events.pop(0)[1](self)
                now = time.time()
                next_start = None
                due = []
                for fid in self._order:
                    flow = flows[fid]
                    if fid in fired or fid in done or not all(d in done for d in flow.after):
                        continue
                    ready_at = max([results[d].end for d in flow.after] or [self.t0]) + flow.at_s
                    if now >= ready_at:
                        due.append((ready_at, fid))
                    else:
                        next_start = ready_at if next_start is None else min(next_start, ready_at)
                # The gate hears of a flow when it is due, whether or not its
                # server listens yet, and of flows found due together in the
                # order they came due (a stable sort: plan order among ties).
                # A queue for credit is then in the order the workload made
                # flows due, not in the order helper processes happened to
                # start, nor in plan order after the loop was busy (moving
                # flows off a failed port) while several came due.
                for _, fid in sorted(due, key=lambda item: item[0]):
                    flow = flows[fid]
                    if fid not in self._admitted and (self.gate is None or self.gate(flow)):
                        self._admitted.add(fid)
                    if fid in self._admitted and fid in self._listening:
                        self._send(flow.dst, "go", fid)
                        fired[fid] = now
                        if self.on_start:
                            self.on_start(flow)
                # Arm the next wave.  After the go messages: starting servers
                # takes milliseconds each, which a flow whose dependencies just
                # ended should not wait for.  The earliest first and only
                # ARM_PER_PASS per pass, so that a flow already due (one resent
                # after a failure) gets its go as soon as its server listens,
                # not after the servers of every flow moved with it.
                pending, armable = [], []
                for fid in self._order:
                    if fid in self._armed or fid in done:
                        continue
                    arm_at = self._arm_at(flows[fid])
                    if arm_at is None:
                        continue
                    if time.time() >= arm_at:
                        armable.append((arm_at, fid))
                    else:
                        pending.append(arm_at)
                armable.sort(key=lambda item: item[0])
                for _, fid in armable[:ARM_PER_PASS]:
                    self._arm(fid)
                if len(armable) > ARM_PER_PASS:
                    pending.append(time.time())     # more to arm: no waiting
                elif self._chores:
                    self._chores.popleft()()
                    pending.append(time.time())     # maybe more chores: no waiting
                if pending:
                    next_start = min(pending) if next_start is None else min(next_start, *pending)
                if pending_events:
                    event_at = self.t0 + pending_events[0][0]
                    next_start = event_at if next_start is None else min(next_start, event_at)
                wait_s = 1.0 if next_start is None else max(0.0, next_start - time.time())
                try:
                    event = self._events.get(timeout=min(wait_s, 1.0))
                except queue.Empty:
                    event = None
                while event is not None:
                    if event["event"] == "listening":
                        self._listening.add(self._flow_id(event["id"]) or event["id"])
                    else:
                        self._on_event(event, results, done)
                    try:
                        event = self._events.get_nowait()
                    except queue.Empty:
                        event = None
                for fid, fired_at in fired.items():
                    if fid not in done and time.time() - fired_at > self._timeout_s(flows[fid]):
                        results[fid].status = "timeout"
                        results[fid].error = f"no result after {self._timeout_s(flows[fid]):.0f} s"
                        results[fid].start, results[fid].end = fired_at, time.time()
                        done.add(fid)
                        if self.on_done:
                            self.on_done(results[fid])
                if self.progress:
                    self.progress(len(done), len(flows))
            self.finished_at = time.time()
        finally:
            self.close()
        return [results[fid] for fid in self._order]

    def _arm_first_wave(self) -> None:
        """Arm the flows the replay's first ``ARM_AHEAD_S`` hold and wait until
        every one has its server listening and its client forked, and every
        standby (`_stand_by`) too.

        The clock starts after that.  Dozens of helper processes starting
        together took 0.05-0.2 s here, varying from one replay to the next;
        with the clock already running, the first flows would start that much
        late and carry the offset down the whole stream (a D's later
        requests wait for its first ones), which the emulated system does
        not have.
        """
        first = [fid for fid in self._order
                 if not self.flows[fid].after and self.flows[fid].at_s < ARM_AHEAD_S]
        for fid in first:
            self._arm(fid)
        waiting_servers = set(first) | {self._process_id(fid, standby=True)
                                        for fid in self._standby}
        waiting_clients = set(waiting_servers)
        deadline = time.time() + AGENT_START_TIMEOUT_S
        while waiting_servers or waiting_clients:
            try:
                event = self._events.get(timeout=max(0.0, deadline - time.time()))
            except queue.Empty:
                raise RuntimeError(f"{len(waiting_servers | waiting_clients)} of the first "
                                   f"{len(first)} flows were not ready in "
                                   f"{AGENT_START_TIMEOUT_S:.0f} s") from None
            if event["event"] == "listening":
                self._listening.add(event["id"])
                waiting_servers.discard(event["id"])
                continue
            if event["event"] == "armed":
                waiting_clients.discard(event["id"])
            self._on_event(event, self.results, self._done)

    def _on_event(self, event: dict, results: Dict[str, FlowResult], done: set) -> None:
        kind = event["event"]
        if kind == "call":
            event["callback"](self)
        elif kind == "armed":
            state.record_pid(event["pid"], f"iperf3 client {event['id']}")
        elif kind == "done":
            fid = self._flow_id(event["id"])
            if fid is None:
                return  # a standby's client, cancelled
            if fid in self._moved:
                return  # the cancelled client of a moved flow: its result is "moved"
            if "result" in event:
                results[fid].fill(event["result"])
            else:   # the client ended without one (it crashed, or was killed)
                results[fid].status, results[fid].error = "failed", "the client gave no result"
                results[fid].start = results[fid].end = time.time()
            done.add(fid)
            if self.on_done:
                self.on_done(results[fid])
        elif kind == "agent-exit":
            raise RuntimeError(f"host agent on {event['host']} exited during the replay")


class Stream:
    """A time-bounded iperf3 stream (TCP, or a paced UDP probe), forward mode.

    Used where a measurement needs traffic that simply keeps flowing across
    events, e.g. across OCS reconfigurations; the DAG replayer is for
    byte-counted flows.
    """

    def __init__(self, bed, src: str, dst: str, duration_s: float, port: int,
                 udp: bool = False, rate_mbps: float = 0.0, blksize: int = 0,
                 pacing_us: int = 0, name: str = "stream", congestion: str = ""):
        self.name = name
        ip = bed.fabric.graph.nodes[dst]["ip"]
        listening = threading.Event()
        self.server = start_server(bed, dst, ip, port, name, listening.set)
        if not listening.wait(AGENT_START_TIMEOUT_S):
            reap(self.server)
            raise RuntimeError(f"iperf3 server for {name} on {dst} did not start listening")
        args = [sys.executable, "-m", "emu.live.iperf_worker", "--dst", ip, "--port", str(port),
                "--duration", str(max(1, int(round(duration_s))))]
        if udp:
            args.append("--udp")
        if rate_mbps and udp:
            args += ["--rate-mbps", str(rate_mbps)]
        elif rate_mbps:
            # The kernel paces a TCP stream smoothly; iperf3's own -b sends a burst,
            # then waits, which fills the link's queue in between.
            args += ["--fq-rate-mbps", str(rate_mbps)]
        if blksize:
            args += ["--blksize", str(blksize)]
        if pacing_us:
            args += ["--pacing-us", str(pacing_us)]
        if not udp and (congestion or bed.congestion):
            args += ["--congestion", congestion or bed.congestion]
        self.client = bed.popen(src, args, f"iperf3 client {name}", stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def finish(self, timeout_s: float) -> dict:
        """Wait for the stream's own end; returns the worker's JSON (or an error)."""
        try:
            out, _ = self.client.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            return {"error": f"{self.name}: no result within {timeout_s:.0f} s"}
        finally:
            reap(self.server)
        lines = [json.loads(line) for line in out.splitlines() if line.strip()]
        results = [line for line in lines if "armed" not in line]
        return results[-1] if results else {"error": f"{self.name}: worker printed no result"}

    def stop(self) -> None:
        reap(self.client)
        reap(self.server)
