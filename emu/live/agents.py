"""Host agent processes: one per Mininet host that replays flows there.

An agent takes JSON-line commands on its stdin and reports JSON-line events
on its stdout (`emu.live.host_agent` for iperf3 clients, `emu.live.peer_agent`
for kept connections).  A replay starts its own, or takes them from an
`AgentPool` that a run keeps for all its replays.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from pathlib import Path
from typing import Dict, List


# Epoch times in what agents say (a flow's start and end, also inside an
# iperf3 client's result) and in what they are told (a replay's t0, when a
# flow another host received arrived).
EPOCH_FIELDS = ("start", "end", "t0")


def _shifted(message: dict, by_s: float) -> dict:
    shifted = {}
    for key, value in message.items():
        if key in EPOCH_FIELDS and isinstance(value, (int, float)):
            value = value + by_s
        elif key == "result" and isinstance(value, dict):
            value = _shifted(value, by_s)
        shifted[key] = value
    return shifted


def on_local_clock(event: dict, offset_s: float) -> dict:
    """An agent's event with its epoch times moved from its server's clock to
    this machine's (``offset_s``: that clock minus this one)."""
    return _shifted(event, -offset_s) if offset_s else event


def on_agent_clock(command: dict, offset_s: float) -> dict:
    """A command's epoch times moved from this machine's clock to the agent's."""
    return _shifted(command, offset_s) if offset_s else command


class AgentProcess:
    """A per-host agent process that takes JSON-line commands on stdin and
    reports JSON-line events on stdout, first ``{"event": "ready"}``; every
    other event goes to ``events``, and ``agent-exit`` when its output ends."""

    def __init__(self, bed, host: str, args: List[str], what: str, events: "queue.Queue"):
        self.host = host
        self.proc = bed.popen(host, args, what, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
        self.ready = threading.Event()
        self._send_lock = threading.Lock()    # replays side by side may share an agent
        # Epoch times the agent reports were read on its server's clock; a
        # cluster run puts them on this machine's (`Testbed.clock_offset`).
        clock_offset = getattr(bed, "clock_offset", None)
        self.offset_s = clock_offset(host) if clock_offset else 0.0
        threading.Thread(target=self._pump, args=(events,), daemon=True).start()

    def _pump(self, events: "queue.Queue") -> None:
        for line in self.proc.stdout:
            event = on_local_clock(json.loads(line), self.offset_s)
            if event["event"] == "ready":
                self.ready.set()
            else:
                events.put(event)
        events.put({"event": "agent-exit", "host": self.host})

    def send(self, command: dict) -> None:
        command = on_agent_clock(command, self.offset_s)
        with self._send_lock:
            self.proc.stdin.write(json.dumps(command) + "\n")
            self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send({"op": "quit"})
                self.proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=5)


class HostAgent(AgentProcess):
    """The ``emu.live.host_agent`` process of one host: armed iperf3 clients."""

    def __init__(self, bed, host: str, results_dir: Path, events: "queue.Queue"):
        super().__init__(bed, host, [sys.executable, "-m", "emu.live.host_agent", "--results",
                                     str(results_dir)], f"host agent {host}", events)


class AgentPool:
    """Host agents kept for a whole run and shared by the replays in it.

    A replay's own agents start with it: a Python process per receiving host
    that imports the iperf3 wrapper.  On 16 emulated GPUs that took the RL
    phases 0.4-2.4 s from their start to their first flow (more when two
    phases started together), and 0.1-0.6 s to stop after their last one: a
    phase of an RL iteration measured its replayer as much as its traffic.
    A pool starts each host's agent once, on first use, and a replay given
    one (``Replayer(agents=pool)``) only arms and fires flows through it.

    Replays side by side may name flows alike (the same phase of two
    iterations), so each replay takes a `PoolView`: its commands carry a
    tag of its own in the flow id (``TAG:ID``) and the events come back to
    its own queue with the id it gave.  ``close()`` stops every agent.
    """

    def __init__(self, bed, results_dir: Path):
        self.bed = bed
        self.results_dir = Path(results_dir)
        self._agents: Dict[str, HostAgent] = {}
        self._queues: Dict[str, "queue.Queue"] = {}
        self._tags = iter(range(1, 1 << 62))
        self._lock = threading.Lock()

    def agent(self, host: str) -> HostAgent:
        """The host's agent, started now if it is not yet (not waited for)."""
        with self._lock:
            if host not in self._agents:
                self.results_dir.mkdir(parents=True, exist_ok=True)
                self._agents[host] = HostAgent(self.bed, host, self.results_dir, self)
            return self._agents[host]

    def view(self, events: "queue.Queue") -> "PoolView":
        """A replay's handle on the pool: its events go to ``events``."""
        with self._lock:
            tag = str(next(self._tags))
            self._queues[tag] = events
        return PoolView(self, tag)

    def release(self, tag: str) -> None:
        with self._lock:
            self._queues.pop(tag, None)

    def put(self, event: dict) -> None:
        """An agent's event (the agents' pumps call this as their queue): a
        flow's goes to the replay that tagged it; an agent's exit to all."""
        with self._lock:
            if "id" not in event:
                targets = list(self._queues.values())
            else:
                tag, _, fid = event["id"].partition(":")
                targets = [self._queues[tag]] if tag in self._queues else []
                event = dict(event, id=fid)
        for events in targets:
            events.put(event)

    def close(self) -> None:
        with self._lock:
            agents, self._agents = list(self._agents.values()), {}
        for agent in agents:
            agent.stop()


class PoolView:
    """One replay's use of an `AgentPool`: the agent of a host, as a replay
    sees its own (``send``, ``ready``, ``stop``), with its flow ids tagged."""

    def __init__(self, pool: AgentPool, tag: str):
        self.pool, self.tag = pool, tag

    def agent(self, host: str) -> "PooledAgent":
        return PooledAgent(self.pool.agent(host), self.tag)

    def release(self) -> None:
        self.pool.release(self.tag)


class PooledAgent:
    """A pool's agent seen by one replay: its commands' flow ids tagged; it
    outlives the replay (``stop`` leaves it running)."""

    def __init__(self, agent: HostAgent, tag: str):
        self.agent, self.tag = agent, tag
        self.host, self.ready = agent.host, agent.ready

    def send(self, command: dict) -> None:
        self.agent.send(dict(command, id=f"{self.tag}:{command['id']}"))

    def stop(self) -> None:
        pass
