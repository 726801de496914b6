"""The controller process on the ``linux`` data plane: service, netlink applier, events.

No OpenFlow here: the launcher runs `serve` instead of os-ken's app manager.
The runner builds the network first, then sends ``attach`` on the control
channel with each switch's namespace (the pid of the Mininet node's shell)::

    {"op": "attach", "namespaces": {"s1": 4242, "o1": 4250, ...}}

The controller opens a route socket, a link-event socket and a socket for the
port counters in every namespace, brings each switch to the service's start
intents (routes and static neighbours, or dark patch-panel ports and the lit
circuits), and from then on reroutes on link events exactly as the OpenFlow
controller does on port status.  Every other op is the service's
(`controllers.service`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
from typing import Dict, List, Tuple

from controllers.control import ControlServer
from controllers.netlink import namespaces
from controllers.netlink.applier import NetlinkApplier, NetlinkError
from controllers.netlink.bpfpanel import (BpfPatchPanel, TimeflowTable, attached_program_id,
                                          load_program, take_over_program)
from controllers.netlink.events import LinkWatcher, is_up
from controllers.netlink.linkstats import LinkStats
from controllers.netlink.lookup import RouteLookup
from controllers.netlink.patch import PatchSocket
from controllers.netlink.routes import RouteWriter
from controllers.service import FabricService, take_over
from topologies.fabric import Fabric

LOG = logging.getLogger("fabric.netlink.daemon")
EXIT_HANDLER_FAILED = 70
PANELS = ("auto", "bpf", "mirred")


class KernelPlane:
    """The service over the netlink applier, and the ``attach`` op that starts it."""

    def __init__(self, fabric: Fabric, tdf: float = 1.0, route_socket=None, event_socket=None,
                 patch_socket=None, lookup_socket=None, writer_socket=None,
                 stats_socket=None, panel: str = "auto", state_path=None):
        if panel not in PANELS:
            raise ValueError(f"panel {panel!r}: allowed {', '.join(PANELS)}")
        self.panel = panel
        self.fabric = fabric
        self.applier = NetlinkApplier(fabric)
        self.service = FabricService(fabric, self.applier, tdf=tdf, state_path=state_path)
        self.route_socket = route_socket or namespaces.route_socket
        self.event_socket = event_socket or namespaces.link_event_socket
        self.patch_socket = patch_socket or self._patch_panel
        self.lookup_socket = lookup_socket or (
            lambda pid: RouteLookup(namespaces.netlink_socket(pid)))
        self.writer_socket = writer_socket or (
            lambda pid: RouteWriter(namespaces.netlink_socket(pid)))
        self.stats_socket = stats_socket or (
            lambda pid: LinkStats(namespaces.netlink_socket(pid)))
        self.watcher = LinkWatcher(self.applier.port_of, self._ports_changed)
        self._attached = threading.Lock()

    def _patch_panel(self, pid: int):
        """The BPF panel where it loads (``auto``, ``bpf``), else the mirred one:
        ``auto`` falls back and says why (status ``panel_note``, the log).  A
        successor of a dead controller takes over its BPF panel in place."""
        if self.panel != "mirred" and self.service.resuming:
            taken = self._take_over_panel(pid)
            if taken is not None:
                return taken
        if self.panel != "mirred":
            from controllers.bpf.libbpf import PanelError

            try:
                program = load_program()      # before a socket exists that it would leak
            except (PanelError, OSError) as exc:
                if self.panel == "bpf":
                    raise
                note = (f"the BPF patch panel did not load ({exc}); using the mirred panel: "
                        "dark windows are timed by the controller's process")
                if not self.applier.panel_note:
                    LOG.warning("%s", note)
                self.applier.panel_note = note
            else:
                return BpfPatchPanel(namespaces.netlink_socket(pid), obj=program)
        return PatchSocket(namespaces.netlink_socket(pid))

    def _take_over_panel(self, pid: int):
        """The dead controller's BPF panel in this namespace, its maps (and so
        its circuits) kept; None if it ran none, or it cannot be taken over
        (the OCS then gets a new panel, its circuits dark for the reinstall)."""
        from controllers.bpf.libbpf import PanelError

        routes = namespaces.route_socket(pid)
        sock = namespaces.netlink_socket(pid)
        try:
            ifindexes = [link["index"] for link in routes.get_links()]
            program_id = attached_program_id(sock, ifindexes)
            if program_id is None:
                return None
            obj = take_over_program(program_id)
        except (PanelError, OSError) as exc:
            LOG.warning("namespace of pid %d: the BPF panel could not be taken over (%s); "
                        "its circuits go dark while a new one is installed", pid, exc)
            return None
        finally:
            routes.close()
            sock.close()
        LOG.info("namespace of pid %d: took over BPF program id %d and its maps", pid,
                 program_id)
        return BpfPatchPanel(namespaces.netlink_socket(pid), obj=obj, taken_over=True)

    def _timeflow(self, pid: int):
        return lambda: TimeflowTable(namespaces.netlink_socket(pid))

    def handle(self, request: dict) -> dict:
        if request.get("op") == "attach":
            return self.attach(request.get("namespaces") or {})
        return self.service.handle(request)

    def attach(self, pids: Dict[str, int]) -> dict:
        missing = sorted(set(self.fabric.switches) - set(pids))
        if missing:
            raise ValueError(f"attach: no namespace for {missing}")
        if not self._attached.acquire(blocking=False):
            raise ValueError("attach: the namespaces are attached already")
        for switch in self.fabric.switches:
            ocs = switch in self.fabric.ocs_switches
            self.applier.attach(switch, self.route_socket(pids[switch]),
                                patch=self.patch_socket(pids[switch]) if ocs else None,
                                lookup=None if ocs else self.lookup_socket(pids[switch]),
                                writer=None if ocs else self.writer_socket(pids[switch]),
                                stats=self.stats_socket(pids[switch]),
                                timeflow=None if ocs else self._timeflow(pids[switch]))
        # Subscribe before reading the ports' state, so no change falls between.
        events = {switch: self.event_socket(pids[switch]) for switch in self.fabric.switches}
        for switch in self.fabric.switches:
            self._start(switch, pids[switch])
            self.watcher.watch(switch, events[switch], self._ports_up(switch))
        self.watcher.start()
        found_down = [(switch, port, False) for switch in self.fabric.switches
                      for port, up in self._ports_up(switch).items() if not up]
        if found_down:              # ports already down when we attached: one reroute
            self._ports_changed(found_down)
        LOG.info("attached %d namespaces", len(pids))
        return {"attached": sorted(pids)}

    def _start(self, switch: str, pid: int) -> None:
        """Bring a switch to its start intents.  The BPF panel's program may load
        and still not attach (a kernel without the bpf classifier refuses the
        filter): with ``auto`` that OCS then runs the mirred panel, and says why."""
        try:
            self.applier.start(switch, self.service.start(switch))
        except NetlinkError as exc:
            patch = self.applier.patches.get(switch)
            if self.panel != "auto" or not getattr(patch, "kernel_timed", False):
                raise
            note = (f"the BPF patch panel did not attach on {switch} ({exc}); using the "
                    "mirred panel: dark windows are timed by the controller's process")
            LOG.warning("%s", note)
            self.applier.panel_note = note
            patch.close()
            self.applier.patches[switch] = PatchSocket(namespaces.netlink_socket(pid))
            self.applier.start(switch, self.service.start(switch))

    def _ports_up(self, switch: str) -> Dict[int, bool]:
        sock = self.applier.sockets[switch]
        flags = {link["index"]: link["flags"] for link in sock.get_links()}
        return {port: is_up(flags.get(index, 0))
                for port, index in self.applier.indexes[switch].items()}

    def _ports_changed(self, changes: List[Tuple[str, int, bool]]) -> None:
        try:
            for switch, port, up in changes:
                if up:
                    self.applier.port_up(switch, port)
            self.service.ports_changed(changes)
        except Exception:  # as the OpenFlow app: never leave a half-rerouted fabric
            traceback.print_exc()
            LOG.critical("rerouting after a link event failed; controller exits")
            sys.stderr.flush()
            os._exit(EXIT_HANDLER_FAILED)

    def close(self) -> None:
        self.watcher.stop()
        self.applier.close()


def serve(fabric_path: str, socket_path: str, tdf: float, stop: threading.Event,
          panel: str = "auto", state_path=None, resume: bool = False) -> None:
    """Run the kernel data plane's controller until ``stop`` is set, or until the
    runner that started it is gone (a killed run: its network goes with it)."""
    with open(fabric_path) as stream:
        fabric = Fabric.from_json(stream.read())
    plane = KernelPlane(fabric, tdf=tdf, panel=panel, state_path=state_path)
    if resume:
        # The runner attaches the namespaces again; each switch is then
        # resynchronised from the predecessor's state.
        take_over(plane.service, state_path)
    server = ControlServer(socket_path, plane.handle)
    server.start()
    LOG.info("fabric %s: %d routers, %d patch panels; control channel %s", fabric.name,
             len(fabric.eps_switches), len(fabric.ocs_switches), socket_path)
    runner = os.getppid()
    try:
        while not stop.wait(1.0):
            if os.getppid() != runner:
                LOG.info("the runner (pid %d) is gone: stopping", runner)
                break
    finally:
        server.stop()
        plane.close()
