"""The os-ken (or Ryu) application: thin shims over the service and the applier.

Each handler finds the object it concerns, calls one method and returns: a
switch that connects is given the service's start intents through the
OpenFlow applier (a datapath the fabric does not have is refused, and a
second connection for a switch takes over from the first: see the
applier); barrier, error and port-stats replies go to the applier; a port
status from a switch's live connection goes to the service, which
reroutes.  Handlers are wrapped by ``fail_loudly``: os-ken would log an
exception and carry on with a half-programmed fabric, so instead the
controller process exits and the runner stops the run with the
controller's log.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import sys
import threading
import traceback

from controllers.control import ControlServer
from controllers.openflow.applier import OpenFlowApplier
from controllers.openflow.compat import (CONFIG_DISPATCHER, MAIN_DISPATCHER, BaseApp, ofp,
                                         ofp_event, set_ev_cls)
from controllers.openflow.ovs_paths import vswitchd_ctl_path
from controllers.openflow.ovs_sync import Unixctl, flush_datapaths
from controllers.service import FabricService, take_over
from topologies.fabric import Fabric

LOG = logging.getLogger("fabric.app")
EXIT_HANDLER_FAILED = 70


def fail_loudly(handler):
    @functools.wraps(handler)
    def wrapper(self, ev):
        try:
            return handler(self, ev)
        except Exception:  # end the process: a swallowed error leaves a broken fabric
            traceback.print_exc()
            LOG.critical("handler %s failed; controller exits", handler.__name__)
            sys.stderr.flush()
            os._exit(EXIT_HANDLER_FAILED)
    return wrapper


class LaunchSettings:
    """Filled in by controllers.launcher before os-ken instantiates the app."""
    fabric_path: str = ""
    socket_path: str = ""
    tdf: float = 1.0
    dataplane_sync: bool = False
    sync_sockets: tuple = ()       # other servers' ovs-vswitchd, forwarded over ssh
    state_path: str = None         # controllers.statefile, if kept
    resume: bool = False           # take over a dead predecessor's state


class FabricController(BaseApp):
    OFP_VERSIONS = [ofp.OFP_VERSION]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        with open(LaunchSettings.fabric_path) as stream:
            fabric = Fabric.from_json(stream.read())
        sync = None
        if LaunchSettings.dataplane_sync:
            path = vswitchd_ctl_path()
            if path is None:
                raise RuntimeError("--dataplane-sync: no ovs-vswitchd control socket found")
            # Every server's datapath, so that a circuit is dark or lit on
            # all of them when the step is confirmed.
            sync = functools.partial(flush_datapaths, [Unixctl(p) for p in
                                                       [path, *LaunchSettings.sync_sockets]])
        self.applier = OpenFlowApplier(fabric, dataplane_sync=sync)
        self.service = FabricService(fabric, self.applier, tdf=LaunchSettings.tdf,
                                     state_path=LaunchSettings.state_path)
        if LaunchSettings.resume:
            take_over(self.service, LaunchSettings.state_path)
        self.control = ControlServer(LaunchSettings.socket_path, self.service.handle)
        self.control.start()
        self.port_events: "queue.Queue" = queue.Queue()
        threading.Thread(target=self._port_worker, name="port-status", daemon=True).start()
        LOG.info("fabric %s: %d EPS, %d OCS; control channel %s", fabric.name,
                 len(fabric.eps_switches), len(fabric.ocs_switches), LaunchSettings.socket_path)

    def close(self):
        self.control.stop()

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    @fail_loudly
    def switch_features(self, ev):
        datapath = ev.msg.datapath
        switch = self.applier.admit(datapath)     # None: not of this fabric, refused
        if switch is not None:
            self.applier.switch_connected(datapath, self.service.start(switch))

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    @fail_loudly
    def barrier_reply(self, ev):
        self.applier.barrier_replied(ev.msg.datapath, ev.msg.xid)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    @fail_loudly
    def error_msg(self, ev):
        msg = ev.msg
        self.applier.error_received(msg.datapath, f"OFPErrorMsg type={msg.type} "
                                                  f"code={msg.code} xid={msg.xid}")

    @set_ev_cls(ofp_event.EventOFPPortStatsReply, MAIN_DISPATCHER)
    @fail_loudly
    def port_stats_reply(self, ev):
        msg = ev.msg
        self.applier.port_stats_replied(msg.datapath, msg.xid, msg.body,
                                        bool(msg.flags & ofp.OFPMPF_REPLY_MORE))

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    @fail_loudly
    def port_status(self, ev):
        msg = ev.msg
        desc = msg.desc
        up = msg.reason != ofp.OFPPR_DELETE and not desc.state & ofp.OFPPS_LINK_DOWN \
            and not desc.config & ofp.OFPPC_PORT_DOWN
        LOG.debug("port status dpid %d port %d reason %d state %#x config %#x",
                  msg.datapath.id, desc.port_no, msg.reason, desc.state, desc.config)
        # A connection refused or taken over may still deliver what it had
        # sent: the switch's live connection reports for it.
        switch = self.applier.current(msg.datapath)
        # Rerouting waits for barrier replies, which reach this same event
        # loop, so it runs on a worker thread; one worker keeps the reports
        # in the order the switches sent them.
        if switch is not None:
            self.port_events.put((switch, desc.port_no, up))

    def _port_worker(self) -> None:
        while True:
            switch, port_no, up = self.port_events.get()
            try:
                self.service.port_changed(switch, port_no, up)
            except Exception:  # as fail_loudly: never leave a half-rerouted fabric
                traceback.print_exc()
                LOG.critical("rerouting after a port status failed; controller exits")
                sys.stderr.flush()
                os._exit(EXIT_HANDLER_FAILED)

    @set_ev_cls(ofp_event.EventOFPStateChange, ["dead"])
    @fail_loudly
    def state_change(self, ev):
        self.applier.switch_disconnected(ev.datapath)
