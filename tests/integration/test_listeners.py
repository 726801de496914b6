"""Nothing a run starts listens beyond loopback in the root namespace.

A real ``emu.run`` with the web view on is paused in its traffic
(`controllers.pause`) and the kernel's socket tables are read
(`emu.live.listening`): the controller's OpenFlow port, the control
channel, the web view and every agent are on 127.0.0.1, a Unix socket or a
host's own namespace.  The control socket is 0600 in a 0700 directory.
(Cluster mode's second server: tests/integration/test_cluster.py.)
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from controllers.pause import PAUSE_AT, PAUSE_DIR
from emu.live import listening, state
from emu.live.waiting import wait_until
from tests.integration.utils import REPO, assert_no_leftovers, exposed_listeners

pytestmark = pytest.mark.require_root


def test_a_running_testbed_listens_on_loopback_only(tmp_path, dataplane):
    kernel_before = listening.kernel_listeners()
    pauses = tmp_path / "pauses"
    pauses.mkdir()
    env = dict(os.environ, **{PAUSE_AT: "traffic", PAUSE_DIR: str(pauses)})
    proc = subprocess.Popen([sys.executable, "-m", "emu.run", "ocs-reconfig", "--web", "--out",
                             str(tmp_path / "results"), "--set", f"dataplane={dataplane}",
                             "--set", "ocs_reconfig.presets=mems",
                             "--set", "ocs_reconfig.settle_s=0.5"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: (pauses / "traffic.reached").exists() or proc.poll() is not None,
                   120, "the run to start its traffic")
        assert proc.poll() is None, proc.stdout.read()
        found = exposed_listeners(kernel_before, runner=proc.pid)
        socket_path = os.path.join(state.RUN_DIR, "control.sock")
        mode = stat.S_IMODE(os.stat(socket_path).st_mode)
        folder_mode = stat.S_IMODE(os.stat(state.RUN_DIR).st_mode)
        ours = listening.our_pids() | {proc.pid}
        web = [item for item in listening.read_sockets() if item.listening and
               item.inode in listening.socket_owners({proc.pid})]
    finally:
        (pauses / "traffic.go").touch()
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert len(ours) > 5, f"the audit saw too few of the run's processes: {ours}"
    assert not found, listening.describe(found)
    assert web, "the runner's web view should listen (on loopback): the audit saw nothing"
    assert (mode, folder_mode) == (0o600, 0o700), (oct(mode), oct(folder_mode))
    assert_no_leftovers()
