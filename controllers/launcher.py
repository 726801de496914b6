"""Start the fabric controller in its own process.

os-ken 4.x has no ``osken-manager``, so this wraps
``AppManager.run_apps()``.  The OpenFlow listener binds to 127.0.0.1 only;
the control channel is a 0600 Unix socket.

    python -m controllers.launcher --fabric F.json --socket S --ofp-port 6653
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

LOOPBACK = "127.0.0.1"


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m controllers.launcher",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--fabric", required=True, help="fabric JSON written by the runner")
    parser.add_argument("--socket", required=True, help="control channel Unix socket path")
    parser.add_argument("--ofp-port", type=int, required=True, help="OpenFlow TCP port")
    parser.add_argument("--tdf", type=float, default=1.0, help="time-dilation factor")
    parser.add_argument("--dataplane-sync", action="store_true",
                        help="confirm datapath changes through the local ovs-vswitchd")
    parser.add_argument("--verbose", action="store_true")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from controllers.openflow.compat import FRAMEWORK, app_manager, cfg
    from controllers.openflow.app import LaunchSettings

    LaunchSettings.fabric_path = args.fabric
    LaunchSettings.socket_path = args.socket
    LaunchSettings.tdf = args.tdf
    LaunchSettings.dataplane_sync = args.dataplane_sync
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

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    logging.getLogger("fabric.launcher").info("%s controller on %s:%d", FRAMEWORK, LOOPBACK,
                                              args.ofp_port)
    app_manager.AppManager.run_apps(["controllers.openflow.app"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
