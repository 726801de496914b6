"""Confirm that Open vSwitch's datapath applied an OpenFlow change.

A barrier reply only says ovs-vswitchd's OpenFlow tables changed; its
datapath keeps forwarding with cached megaflows until revalidation (measured
here: an old circuit kept forwarding ~4 ms after its DELETE, a new one took
~2.7 ms to carry its first packet).  Flushing the datapath's flow cache
(``dpctl/del-flows`` over ovs-vswitchd's unixctl socket, the channel
ovs-appctl uses) makes the next packet of every flow take the new tables, so
the dark window of an OCS reconfiguration is timed from the data plane.
``revalidator/wait`` was tried first: it waits for a full revalidation
cycle, up to 500 ms here.

Used only when the controller runs on the machine that runs OVS (the
testbed's case); the launcher enables it with ``--dataplane-sync``.
"""

from __future__ import annotations

import glob
import json
import os
import socket
from typing import Optional

RUN_DIR = "/var/run/openvswitch"


class DataplaneSyncError(RuntimeError):
    """ovs-vswitchd could not confirm a datapath change."""


def vswitchd_ctl_path(run_dir: str = RUN_DIR) -> Optional[str]:
    try:
        with open(os.path.join(run_dir, "ovs-vswitchd.pid")) as stream:
            pid = int(stream.read().strip())
        path = os.path.join(run_dir, f"ovs-vswitchd.{pid}.ctl")
        return path if os.path.exists(path) else None
    except (OSError, ValueError):
        paths = glob.glob(os.path.join(run_dir, "ovs-vswitchd.*.ctl"))
        return paths[0] if len(paths) == 1 else None


class Unixctl:
    """A minimal ovs-appctl: one JSON-RPC request per connection."""

    def __init__(self, path: str, timeout_s: float = 10.0):
        self.path = path
        self.timeout_s = timeout_s

    def call(self, method: str, *params: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(self.timeout_s)
            sock.connect(self.path)
            sock.sendall(json.dumps({"method": method, "params": list(params), "id": 0}).encode())
            decoder, buffer = json.JSONDecoder(), ""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    raise DataplaneSyncError(f"ovs-vswitchd closed the channel during {method}")
                buffer += chunk.decode()
                try:
                    reply, _ = decoder.raw_decode(buffer)
                    break
                except ValueError:
                    continue
        if reply.get("error"):
            raise DataplaneSyncError(f"{method}: {reply['error'].strip()}")
        return reply.get("result") or ""


def flush_datapath(unixctl: Unixctl) -> None:
    unixctl.call("dpctl/del-flows")
