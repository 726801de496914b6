"""The controller's state and its control operations, whatever the data plane.

``FabricService`` owns the cores (EPS routes, OCS circuits, pins), the link
state and the reconfiguration lock, and answers the control channel
(`controllers.control`).  Every change it decides is a batch of intents
(`controllers.intents`) handed to its *applier*, which carries it out on one
data plane and returns once the switches confirmed it.  An applier provides::

    apply(batch)      carry out {switch: [intents]}; return once confirmed, with
                      (first, last): the epoch times within which the data plane
                      took the batch, where the applier knows them more tightly
                      than the call's own span (else None)
    sync()            confirm the data plane itself took the last batch
    status()          {"connected": [...], "ready_switches": [...], "errors": [...]}
    counters()        {switch: {port: {"tx_bytes": ..., ...}}}
    path(src, dst, sport, dport, proto)   (optional) the nodes one flow crosses now

`controllers.openflow.applier.OpenFlowApplier` is the Open vSwitch one.  The
service never imports os-ken, so unit tests run it over a recording applier
or over fake OpenFlow datapaths.

What the service does is also published as it happens (``events``, a
`controllers.eventhub.EventHub`; the ``watch`` op streams it), every event
with its ``kind`` and epoch time ``t``::

    {"kind": "circuit", "ocs", "step", "technology", "t", ...}   each step of a
        reconfiguration (`controllers.reconfig`): "start" (tear, light, keep,
        delay_ms), "dark" (dark_until, tear, light), "lit" (light), "done"
        (dark_s, tear, light), or "failed" (error) if it raised
    {"kind": "link", "a", "b", "up", "t"}     a link changed, its reroute applied
    {"kind": "preset", "ocs", "technology", "delay_ms", "t"}   (delay_ms emulated)
    {"kind": "schedule", "t", "epoch", "slot_emulated_s", "guard_emulated_s", ...}
        a cyclic schedule started (or ``"stopped": true``)
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Dict, FrozenSet, List, Optional, Protocol, Sequence, Set, Tuple, Union

from controllers import arguments
from controllers.control import Watch
from controllers.eps_core import EpsCore
from controllers.eventhub import EventHub
from controllers import statefile
from controllers.intents import Batch, Intent, Reset, Resync, merge
from controllers.ocs_core import TECHNOLOGIES, OcsCore
from controllers.pause import pause_at
from controllers.pins import PinTable
from controllers.reconfig import reconfigure
from topologies.fabric import EPS, HOST, Fabric, FabricError

LOG = logging.getLogger("fabric.service")
LEAD_HISTORY = 5
OPS = ("status", "state", "reconfigure", "preset", "link", "pin", "unpin", "counters",
       "paths", "technologies", "watch", "schedule")
# The ops that change what the switches hold: saved to the state file after
# each (`controllers.statefile`), and answered once per request id.
CHANGING_OPS = ("reconfigure", "preset", "link", "pin", "unpin")


class Applier(Protocol):
    def apply(self, batch: Batch) -> Optional[Tuple[float, float]]: ...

    def sync(self) -> None: ...

    def status(self) -> dict: ...

    def counters(self) -> Dict[str, Dict[int, dict]]: ...


class FabricService:
    def __init__(self, fabric: Fabric, applier: Applier, tdf: float = 1.0,
                 state_path: Optional[str] = None):
        self.fabric = fabric
        self.applier = applier
        self.tdf = tdf
        self.eps = EpsCore(fabric)
        self.pins = PinTable(fabric)
        self.dropped_pins: Set[str] = set()
        self.ocs: Dict[str, OcsCore] = {name: OcsCore(fabric, name, tdf)
                                         for name in fabric.ocs_switches}
        self.down_ports: Set[tuple] = set()         # (switch, port) reported down
        self.manual_down: Set[frozenset] = set()    # links failed through `do_link`
        # The down links the data plane has been rerouted around: `state` shows
        # these, so whoever waits for a link change to show there also waits
        # for its routes.
        self._rerouted_down: List[List[str]] = []
        self._reconfig_lock = threading.Lock()
        self.events = EventHub()
        self.schedule: Optional[dict] = None      # the cyclic schedule running, if any
        # Where the decisions are kept for a controller started after this one
        # dies (None: nowhere), and the replies of requests that carried an id.
        self.state_path = state_path
        self.saved = statefile.ControllerState()
        self.resuming = False
        # Held while a request with an id runs and while the file is written:
        # the file never holds a reply list changing under json.dump.
        self._requests_lock = threading.RLock()

    # ------------------------------------------------------------ crash and resume
    def restore(self, saved: "statefile.ControllerState") -> None:
        """Take over a dead controller's decisions (its state file): the
        circuits, technologies, links failed by hand and pins.  The switches
        that connect from now on are resynchronised (`resync`), not reset."""
        for ocs, circuits in saved.circuits.items():
            self.fabric.set_circuits(self._ocs(ocs).name, circuits)
        for ocs, technology in saved.technology.items():
            self._ocs(ocs).set_technology(technology["name"], technology.get("delay_ms"))
        for u, v in saved.manual_down:
            link = frozenset((u, v))
            self.manual_down.add(link)
            self.eps.down_links.add(link)
        self._rerouted_down = sorted(sorted(link) for link in self.eps.down_links)
        self.eps.table = self.eps.routes_for()      # over the circuits taken over
        for pin_id, path in saved.pins.items():
            self.pins.pin(pin_id, path, down_links=self.eps.down_links)
        self.saved = saved
        self.resuming = True

    def _save(self) -> None:
        """Keep the decisions for a successor (atomically: whole or not at all)."""
        if self.state_path is None:
            return
        with self._requests_lock:
            self._save_locked()

    def _save_locked(self) -> None:
        self.saved.circuits = {o: sorted(sorted(c) for c in cs)
                               for o, cs in self.fabric.circuits.items()}
        self.saved.technology = {o: {"name": core.technology,
                                     "delay_ms": self.fabric.graph.nodes[o].get("delay_ms")}
                                 for o, core in self.ocs.items()}
        self.saved.manual_down = sorted(sorted(link) for link in self.manual_down)
        self.saved.pins = self.pins.state()
        statefile.save(self.state_path, self.saved)

    # ------------------------------------------------------------ switches
    def start(self, switch: str) -> List[Intent]:
        """What a switch that (re)connects must hold now: a Reset, then its routes
        and pins (packet switch) or its circuits (OCS).  A controller that took
        over a dead one's state (`restore`) resynchronises instead: a Resync,
        then the same, so that what is right keeps forwarding."""
        if self.resuming:
            return self.resync(switch)
        if self.fabric.kind(switch) == EPS:
            return [Reset(switch)] + self.eps.switch_start(switch) + \
                self.pins.switch_start(switch)
        return [Reset(switch)] + self.ocs[switch].switch_start()

    def resync(self, switch: str) -> List[Intent]:
        if self.fabric.kind(switch) == EPS:
            return [Resync(switch)] + self.eps.switch_start(switch) + \
                self.pins.switch_start(switch)
        lit = {port for circuit in self.fabric.circuits[switch] for port in circuit}
        dark = tuple(sorted(set(self.fabric.ports_of(switch)) - lit))
        return [Resync(switch, dark)] + self.ocs[switch].switch_start()

    def apply(self, batch: Batch) -> Optional[Tuple[float, float]]:
        return self.applier.apply(batch)

    # ------------------------------------------------------------ control requests
    def status(self) -> dict:
        switches = set(self.fabric.switches)
        status = self.applier.status()
        ready = set(status["ready_switches"])
        return {"ready": ready >= switches and not status["errors"],
                "connected": sorted(status["connected"]), "ready_switches": sorted(ready),
                "missing": sorted(switches - ready), "errors": list(status["errors"]),
                **{key: status[key] for key in ("panel", "panel_note", "refused", "takeovers")
                   if key in status}}

    def state(self) -> dict:
        return {"circuits": {o: sorted(list(c) for c in cs)
                             for o, cs in self.fabric.circuits.items()},
                "technology": {o: {"name": core.technology,
                                   "delay_ms": self.fabric.graph.nodes[o].get("delay_ms")}
                               for o, core in self.ocs.items()},
                "down_links": list(self._rerouted_down),
                "pins": self.pins.state(),
                "schedule": self.schedule,
                "tdf": self.tdf}

    def counters(self) -> dict:
        """Port counters of every switch: ``{"switches": {name: {port: {...}}}}``
        (port numbers as strings: the reply is JSON)."""
        return {"switches": {switch: {str(port): values for port, values in ports.items()}
                             for switch, ports in self.applier.counters().items()}}

    def paths(self, flows) -> dict:
        """The nodes each flow ``[src host, dst host, sport, dport]`` crosses now, as
        the data plane itself picks them (ECMP by flow hash), and the port each
        node sends it out of (which tells parallel links apart):
        ``{"paths": [[node, ...]], "ports": [[port, ...]]}``, None for a flow it
        cannot tell, or every one where the data plane cannot."""
        route = getattr(self.applier, "hops", None)
        if route is None:
            return {"paths": [None for _ in flows], "ports": [None for _ in flows]}
        hops = [route(src, dst, int(sport), int(dport)) for src, dst, sport, dport in flows]
        return {"paths": [None if h is None else [node for node, _ in h] for h in hops],
                "ports": [None if h is None else [port for _, port in h[:-1]] for h in hops]}

    def _ocs(self, name) -> OcsCore:
        if name not in self.ocs:
            raise FabricError(f"unknown OCS {name!r}; OCS in this fabric: {sorted(self.ocs)}")
        return self.ocs[name]

    def do_reconfigure(self, ocs: str, circuits, delay_ms: Optional[float] = None,
                       technology: Optional[str] = None) -> dict:
        core = self._ocs(ocs)
        with self._reconfig_lock:
            # Check everything before changing the technology: a refusal changes nothing.
            if self.schedule is not None:
                raise FabricError(f"{ocs}: a schedule runs; stop it first "
                                  "(op schedule with stop=true)")
            circuits = self.fabric.check_circuits(ocs, circuits)
            if technology is not None:
                core.set_technology(technology, delay_ms)
            plan = core.plan(circuits, delay_ms)

            def on_step(step: str, fields: dict) -> None:
                t = fields.get("t")
                self.events.publish({"kind": "circuit", "ocs": ocs, "step": step,
                                     "technology": core.technology,
                                     "t": time.time() if t is None else t,
                                     **{k: v for k, v in fields.items() if k != "t"}})
                if step == "dark":
                    pause_at("ocs-dark")     # tests kill the controller here

            timed = None
            if hasattr(self.applier, "timed_circuits") and self.applier.kernel_timed(ocs):
                def timed(tear, light, delay_s):
                    return self.applier.timed_circuits(ocs, tear, light, delay_s)
            try:
                result = reconfigure(self.eps, core, plan, self.apply, sync=self.applier.sync,
                                     light_lead_s=self.light_lead_s(), on_step=on_step,
                                     timed=timed)
            except Exception as exc:
                # Whoever shows the circuits dark must learn that no "done" comes.
                on_step("failed", {"error": f"{type(exc).__name__}: {exc}"})
                raise
        core.history.append(result)
        LOG.info("%s reconfigured: tear %s light %s dark %.3f ms", ocs, sorted(plan.tear),
                 sorted(plan.light), result["dark_s"] * 1000)
        return result

    def do_schedule(self, schedule: Optional[dict] = None, start_in_s: float = 0.05,
                    stop: bool = False) -> dict:
        """Run a cyclic OCS schedule (`controllers.schedule`), or stop the one running.

        ``schedule`` is the scenario's data (slot and guard in real
        microseconds, dilated by the fabric's tdf here); slot 0 starts
        ``start_in_s`` from now, and its OCSes are dark from the write until then.
        Only a data plane whose kernel times circuits (the BPF panel) runs one:
        no process touches a slot boundary."""
        from controllers import schedule as schedules

        if not hasattr(self.applier, "set_schedule"):
            raise FabricError("schedules need the linux data plane (its BPF patch panel)")
        with self._reconfig_lock:
            if stop:
                return self._stop_schedule()
            if schedule is None:
                raise FabricError("schedule: give the schedule, or stop=true")
            plan = schedules.from_dict(schedule, self.fabric, self.tdf, where="schedule")
            untimed = [ocs for ocs in sorted(plan.matchings)
                       if not self.applier.kernel_timed(ocs)]
            if untimed:
                raise FabricError(f"schedule: {', '.join(untimed)} run(s) the mirred patch "
                                  "panel; schedules need the BPF one (testbed.panel)")
            indexes = self.applier.indexes
            clock = self.applier.patches[next(iter(plan.matchings))].clock
            epoch_ns = clock.now_ns() + int(max(start_in_s, 0.0) * 1e9)
            ocs_entries = schedules.compile_ocs(plan, indexes, epoch_ns)
            tor_entries = schedules.compile_tor(plan, self.fabric, indexes, epoch_ns)
            written = self.applier.set_schedule(ocs_entries, tor_entries)
            self.schedule = {"epoch": clock.to_epoch(epoch_ns), "epoch_mono_ns": epoch_ns,
                             "slot_emulated_s": plan.slot_emulated_s,
                             "guard_emulated_s": plan.guard_emulated_s,
                             "slots": plan.slots, "duty_cycle": plan.duty_cycle,
                             "ocs": sorted(plan.matchings), "write_window": list(written)}
            self.events.publish({"kind": "schedule", "t": time.time(), **self.schedule})
            return dict(self.schedule)

    def _stop_schedule(self) -> dict:
        """Back to the circuits the cores hold, lit steadily; ToRs route by their tables."""
        if self.schedule is None:
            return {"stopped": False}
        self.applier.clear_schedule()
        self.apply({name: self.start(name) for name in self.schedule["ocs"]})
        stopped, self.schedule = self.schedule, None
        self.events.publish({"kind": "schedule", "t": time.time(), "stopped": True})
        return {"stopped": True, "schedule": stopped}

    def light_lead_s(self) -> float:
        """Half the median lighting round of the last reconfigurations (any OCS)."""
        latencies = sorted(r["light_latency_s"] for core in self.ocs.values()
                           for r in core.history[-LEAD_HISTORY:] if r["plan"]["light"])
        return latencies[len(latencies) // 2] / 2 if latencies else 0.0

    def do_preset(self, ocs: str, technology: str, delay_ms: Optional[float] = None) -> dict:
        real_ms = self._ocs(ocs).set_technology(technology, delay_ms)
        self.events.publish({"kind": "preset", "ocs": ocs, "technology": technology,
                             "delay_ms": real_ms * self.tdf, "t": time.time()})
        return {"ocs": ocs, "technology": technology, "delay_real_ms": real_ms,
                "delay_emulated_ms": real_ms * self.tdf}

    def do_link(self, u: str, v: str, up: bool) -> dict:
        """The control channel's ``link`` op: fail or restore a link by hand.

        A link failed by hand stays down whatever its ports report; one
        restored by hand comes back only if its ports are up.
        """
        if not self.fabric.graph.has_edge(u, v):
            raise FabricError(f"no link {u}-{v} in the fabric")
        link = frozenset((u, v))
        (self.manual_down.discard if up else self.manual_down.add)(link)
        return self._change_link(u, v, up and not self._ports_down(u, v))

    def _ports_down(self, a: str, b: str) -> bool:
        """Whether a switch port of a link between a and b reports down."""
        ends = {(node, data["ports"][node]) for _, _, data in
                self.fabric.graph.edges(a, data=True) if b in data["ports"]
                for node in (a, b) if self.fabric.kind(node) != HOST}
        return bool(ends & self.down_ports)

    def _change_link(self, u: str, v: str, up: bool) -> dict:
        return self._change_links([(frozenset((u, v)), up)])

    def _change_links(self, changes: List[Tuple[FrozenSet[str], bool]]) -> dict:
        """Set each link up or down, then reroute once for all of them."""
        with self._reconfig_lock:
            started = time.monotonic()
            # Announced once rerouted: only the links whose state this changes.
            flipped = [(link, up) for link, up in changes
                       if (link in self.eps.down_links) == up]
            for link, up in changes:
                (self.eps.down_links.discard if up else self.eps.down_links.add)(link)
            batch = self.eps.reroute()
            dropped = self.pins.crossing([link for link, up in changes if not up])
            for pin_id in dropped:
                # A pinned pair over a dead link falls back to its destination route.
                batch = merge(batch, self.pins.unpin(pin_id))
                self.dropped_pins.add(pin_id)
            planned = time.monotonic()
            self.apply(batch)
            self._rerouted_down = sorted(sorted(link) for link in self.eps.down_links)
            applied = time.time()
            for link, up in flipped:
                a, b = sorted(link)
                self.events.publish({"kind": "link", "a": a, "b": b, "up": up, "t": applied})
            LOG.info("rerouted for %d link change(s): %d intent(s) on %d switch(es), planned "
                     "in %.1f ms, applied in %.1f ms", len(changes),
                     sum(len(intents) for intents in batch.values()), len(batch),
                     (planned - started) * 1e3, (time.monotonic() - planned) * 1e3)
        return {"changed_switches": sorted(batch), "dropped_pins": dropped}

    def do_pin(self, id: str, path: list) -> dict:
        """Pin one host pair's packets onto ``path`` (a reserved fast lane)."""
        with self._reconfig_lock:
            batch = self.pins.pin(id, path, down_links=self.eps.down_links)
            try:
                self.apply(batch)
            except Exception:
                self.pins.pins.pop(id, None)
                raise
        return {"pin": id, "switches": sorted(batch)}

    def do_unpin(self, id: str) -> dict:
        """Remove a pin; one already dropped by a link failure (`do_link`) is
        not an error, since its owner cannot know."""
        with self._reconfig_lock:
            if id in self.dropped_pins:
                self.dropped_pins.discard(id)
                return {"unpin": id, "switches": [], "dropped_by_failure": True}
            batch = self.pins.unpin(id)
            self.apply(batch)
        return {"unpin": id, "switches": sorted(batch)}

    def port_changed(self, switch: str, port_no: int, up: bool) -> Optional[dict]:
        """A switch reported a port's link going down or up.

        A link counts as down while either of its switch ports reports down
        (the two ends of a veth pair report separately and in any order, and
        an end still reporting up must not revive a link whose other end is
        down), or while it is failed by hand (`do_link`).  A change of a
        link's state reroutes as `do_link` does; other reports return None.
        Ports the fabric does not wire (OVS's LOCAL port) are ignored.
        """
        return self.ports_changed([(switch, port_no, up)])

    def ports_changed(self, reports: Sequence[Tuple[str, int, bool]]) -> Optional[dict]:
        """Several port reports at once (`port_changed` each), rerouted once.

        A switch that fails takes its links down one after another; the
        reports that arrived meanwhile are handled together, so the fabric
        is rerouted once for them, not once per link.
        """
        touched: Dict[FrozenSet[str], Tuple[str, str, int]] = {}
        with self._reconfig_lock:
            for switch, port_no, up in reports:
                wired = self.fabric.ports_of(switch)
                if port_no not in wired:
                    continue
                peer = wired[port_no][0]
                (self.down_ports.discard if up else self.down_ports.add)((switch, port_no))
                touched[frozenset((switch, peer))] = (switch, peer, port_no)
            flips = []
            for link, (switch, peer, port_no) in touched.items():
                link_up = not self._ports_down(switch, peer) and link not in self.manual_down
                if (link not in self.eps.down_links) != link_up:
                    flips.append((link, link_up))
                    LOG.info("link %s-%s went %s (port %d of %s reported)", switch, peer,
                             "up" if link_up else "down", port_no, switch)
        if not flips:
            return None
        return self._change_links(flips)

    def handle(self, request: dict) -> Union[dict, Watch]:
        """Answer one control request.  A changing op that carries a
        ``request_id`` is carried out once: asked again with the same id (a
        runner retrying after a controller crash), it gets the first reply,
        from the state file if a predecessor carried it out."""
        request_id = request.get("request_id")
        if request_id is None or request.get("op") not in CHANGING_OPS:
            reply = self._handle(request)
            if request.get("op") in CHANGING_OPS:
                self._save()
            return reply
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"request_id: a non-empty string, got {request_id!r}")
        with self._requests_lock:
            done = self.saved.requests.get(request_id)
            if done is not None:
                return dict(done, replayed=True)
            reply = self._handle({k: v for k, v in request.items() if k != "request_id"})
            self.saved.remember(request_id, reply)
            self._save()
            return reply

    def _handle(self, request: dict) -> Union[dict, Watch]:
        op = request.get("op")
        args = {k: v for k, v in request.items() if k != "op"}
        operation = getattr(self, "paths" if op == "paths" else f"do_{op}", None) \
            if op in OPS else None
        if operation is not None:
            arguments.check(op, operation, args)
        if op == "status":
            return self.status()
        if op == "state":
            return self.state()
        if op == "reconfigure":
            return self.do_reconfigure(**args)
        if op == "preset":
            return self.do_preset(**args)
        if op == "link":
            return self.do_link(**args)
        if op == "pin":
            return self.do_pin(**args)
        if op == "unpin":
            return self.do_unpin(**args)
        if op == "counters":
            return self.counters()
        if op == "paths":
            return self.paths(**args)
        if op == "technologies":
            return {"technologies": {k: vars(t) for k, t in TECHNOLOGIES.items()}}
        if op == "watch":
            return Watch(self.events.subscribe)
        if op == "schedule":
            return self.do_schedule(**args)
        raise ValueError(f"unknown op {op!r}; allowed: {', '.join(OPS)}")


def take_over(service: FabricService, state_path: str) -> None:
    """Start ``service`` where a dead controller left the fabric: its state
    file's decisions if it saved any (else the fabric's start, which the
    switches hold), every switch resynchronised rather than reset."""
    saved = statefile.load(state_path)
    if saved is not None:
        service.restore(saved)
        LOG.info("took over %s: %d OCS, %d pin(s), %d link(s) down by hand, "
                 "%d request(s) answered", state_path, len(saved.circuits), len(saved.pins),
                 len(saved.manual_down), len(saved.requests))
    service.resuming = True
