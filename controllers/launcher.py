"""Start the fabric controller in its own process, for one data plane.

``--dataplane ovs``: os-ken's ``AppManager`` runs the OpenFlow app
(`controllers.openflow.app`; os-ken 4.x has no ``osken-manager``), whose
OpenFlow listener binds to 127.0.0.1 only.  ``--dataplane linux``: the
netlink daemon (`controllers.netlink.daemon`) drives kernel routers and tc
patch panels in the switches' namespaces.  Either way the control channel is
a 0600 Unix socket.

    python -m controllers.launcher --fabric F.json --socket S --dataplane ovs --ofp-port 6653
    python -m controllers.launcher --fabric F.json --socket S --dataplane linux

With ``--state FILE`` the controller keeps its decisions there
(`controllers.statefile`); started again with ``--resume`` after it died, it
takes them over and resynchronises the switches without resetting them.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading

LOOPBACK = "127.0.0.1"
DATAPLANES = ("ovs", "linux")


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m controllers.launcher",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--fabric", required=True, help="fabric JSON written by the runner")
    parser.add_argument("--socket", required=True, help="control channel Unix socket path")
    parser.add_argument("--dataplane", choices=DATAPLANES, default="ovs",
                        help="ovs: OpenFlow to Open vSwitch; linux: netlink to kernel routers")
    parser.add_argument("--ofp-port", type=int, help="OpenFlow TCP port (ovs)")
    parser.add_argument("--tdf", type=float, default=1.0, help="time-dilation factor")
    parser.add_argument("--dataplane-sync", action="store_true",
                        help="ovs: confirm datapath changes through the local ovs-vswitchd")
    parser.add_argument("--dataplane-sync-socket", action="append", default=[],
                        help="ovs: also flush the datapath of the ovs-vswitchd behind this "
                        "unixctl socket (another server's, forwarded over ssh); repeatable")
    parser.add_argument("--panel", choices=("auto", "bpf", "mirred"), default="auto",
                        help="linux: the OCS patch panel (auto: BPF where it loads, "
                        "else mirred)")
    parser.add_argument("--state", help="keep the controller's decisions in this file "
                        "(controllers.statefile), for a successor if this process dies")
    parser.add_argument("--resume", action="store_true",
                        help="a predecessor died: take over its --state file and "
                        "resynchronise the switches instead of resetting them")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.dataplane == "ovs" and args.ofp_port is None:
        parser.error("--dataplane ovs needs --ofp-port")
    if args.resume and not args.state:
        parser.error("--resume needs --state")
    return args


def on_stop_signals(stop) -> None:
    """Call ``stop(signum, frame)`` on SIGTERM and SIGINT in this process only.

    pyroute2 forks a short-lived helper per namespace it opens a socket in, and
    stops it with SIGTERM.  A forked child inherits Python's handlers: without
    this guard each helper ran ``stop`` and wrote "signal 15: stopping" into the
    controller's log while the controller itself went on.  A child dies of the
    signal as if no handler were installed.
    """
    owner = os.getpid()

    def handler(signum, frame):
        if os.getpid() != owner:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        stop(signum, frame)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def run_openflow(args) -> int:
    from controllers.openflow.app import LaunchSettings
    from controllers.openflow.compat import FRAMEWORK, app_manager, cfg

    LaunchSettings.fabric_path = args.fabric
    LaunchSettings.socket_path = args.socket
    LaunchSettings.tdf = args.tdf
    LaunchSettings.dataplane_sync = args.dataplane_sync
    LaunchSettings.sync_sockets = list(args.dataplane_sync_socket)
    LaunchSettings.state_path = args.state
    LaunchSettings.resume = args.resume
    cfg.CONF(args=["--ofp-listen-host", LOOPBACK, "--ofp-tcp-listen-port", str(args.ofp_port)],
             project=FRAMEWORK)

    def stop(signum, _frame):
        # os-ken's native hub cannot kill its threads (run_apps' cleanup
        # raises AttributeError on HubThread.kill), so close the apps, which
        # removes the control socket, and leave at once.
        logging.getLogger("fabric.launcher").info("signal %d: stopping", signum)
        try:
            app_manager.AppManager.get_instance().close()
        finally:
            logging.shutdown()
            os._exit(0)

    on_stop_signals(stop)
    logging.getLogger("fabric.launcher").info("%s controller on %s:%d", FRAMEWORK, LOOPBACK,
                                              args.ofp_port)
    app_manager.AppManager.run_apps(["controllers.openflow.app"])
    return 0


def run_netlink(args) -> int:
    from controllers.netlink.daemon import serve

    stopping = threading.Event()

    def stop(signum, _frame):
        logging.getLogger("fabric.launcher").info("signal %d: stopping", signum)
        stopping.set()

    on_stop_signals(stop)
    logging.getLogger("fabric.launcher").info("netlink controller (kernel data plane)")
    serve(args.fabric, args.socket, args.tdf, stopping, panel=args.panel,
          state_path=args.state, resume=args.resume)
    logging.shutdown()
    return 0


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    return run_openflow(args) if args.dataplane == "ovs" else run_netlink(args)


if __name__ == "__main__":
    sys.exit(main())
