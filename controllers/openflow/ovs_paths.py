"""Where ovs-vswitchd's unixctl socket is, without importing the ``ovs``
package (whose import pulls in eventlet and its deprecation warning): the
testbed's server agent asks this on every server of a cluster run."""

from __future__ import annotations

import glob
import os
from typing import Optional

RUN_DIR = "/var/run/openvswitch"


def vswitchd_ctl_path(run_dir: str = RUN_DIR) -> Optional[str]:
    try:
        with open(os.path.join(run_dir, "ovs-vswitchd.pid")) as stream:
            pid = int(stream.read().strip())
        path = os.path.join(run_dir, f"ovs-vswitchd.{pid}.ctl")
        return path if os.path.exists(path) else None
    except (OSError, ValueError):
        paths = glob.glob(os.path.join(run_dir, "ovs-vswitchd.*.ctl"))
        return paths[0] if len(paths) == 1 else None
