"""Ctrl-C and SIGTERM to a run's whole process group, at every stage of it.

A terminal's Ctrl-C reaches every process of the foreground group: the
runner, and whatever it started without a session of its own.  Each case
pauses a real ``emu.run ocs-reconfig`` at a named point (`controllers.pause`),
signals the group there, lets the run go on, and checks that it ends as
interrupted (exit 130, a whole ``result.json`` saying so) and leaves nothing:
no bridge, veth, namespace, tc state on this namespace's interfaces, process,
pid record, run file, or held lock.  A SIGKILL, which no cleanup survives, is
followed by a new run, which must clean up after it and succeed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from controllers.pause import PAUSE_AT, PAUSE_DIR
from emu.live import state
from emu.live.waiting import wait_until
from tests.integration.utils import REPO, assert_no_leftovers, leftovers, only_run

pytestmark = pytest.mark.require_root

SHORT = ["--set", "ocs_reconfig.presets=mems", "--set", "ocs_reconfig.settle_s=0.5",
         "--set", "ocs_reconfig.probe_pps=1000"]
# (point, signal, data plane).  Each point once; the two signals and the two
# data planes alternate, so that both meet every kind of stage.  "ovs-start"
# is Open vSwitch's; "ocs-dark" pauses the controller inside a dark window
# (the runner waits for its reply); "teardown" is inside the runner's cleanup.
CASES = [("ovs-start", signal.SIGINT, "ovs"),
         ("network-build", signal.SIGTERM, "ovs"),
         ("network-build", signal.SIGINT, "linux"),
         ("static-arp", signal.SIGINT, "ovs"),
         ("static-arp", signal.SIGTERM, "linux"),
         ("traffic", signal.SIGTERM, "ovs"),
         ("traffic", signal.SIGINT, "linux"),
         ("ocs-dark", signal.SIGINT, "ovs"),
         ("ocs-dark", signal.SIGTERM, "linux"),
         ("teardown", signal.SIGTERM, "ovs"),
         ("teardown", signal.SIGINT, "linux")]


def _root_tc() -> str:
    """tc state on this namespace's interfaces (every qdiscs, ingress included)."""
    out = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    return "\n".join(sorted(out.splitlines()))


def _netns() -> str:
    return subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout


def _nothing_of_ours(before_tc: str, before_netns: str) -> None:
    assert_no_leftovers()
    assert _root_tc() == before_tc, f"tc state left:\n{_root_tc()}"
    assert _netns() == before_netns, f"namespaces left:\n{_netns()}"
    assert not os.path.exists(state.OWNED_PATH), "the pid records were left"
    left = [n for n in os.listdir(state.RUN_DIR)] if os.path.isdir(state.RUN_DIR) else []
    assert not [n for n in left if n.endswith((".sock", ".json", ".ctl", ".tmp"))], left
    lock = state.RunLock()
    lock.acquire("the test: is the lock free?")
    lock.release()


def _start(tmp_path, point: str, dataplane: str, *extra: str):
    pauses = tmp_path / "pauses"
    pauses.mkdir(exist_ok=True)
    env = dict(os.environ, **{PAUSE_AT: point, PAUSE_DIR: str(pauses)})
    out = open(tmp_path / "out.txt", "w")
    proc = subprocess.Popen([sys.executable, "-m", "emu.run", "ocs-reconfig", "--out",
                             str(tmp_path / "results"), "--set", f"dataplane={dataplane}",
                             *SHORT, *extra], cwd=REPO, env=env, stdout=out,
                            stderr=subprocess.STDOUT, start_new_session=True)
    return proc, pauses, tmp_path / "out.txt"


@pytest.mark.parametrize("point,sig,dataplane", CASES,
                         ids=[f"{p}-{s.name}-{d}" for p, s, d in CASES])
def test_signal_to_the_group_at_every_stage(tmp_path, point, sig, dataplane):
    before_tc, before_netns = _root_tc(), _netns()
    proc, pauses, out = _start(tmp_path, point, dataplane)
    try:
        wait_until(lambda: (pauses / f"{point}.reached").exists() or proc.poll() is not None,
                   120, f"the run to reach {point}")
        assert proc.poll() is None, out.read_text()
        os.killpg(proc.pid, sig)            # what a terminal does
        (pauses / f"{point}.go").touch()
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert code == 130, f"exit code {code}:\n{out.read_text()}"
    text = (only_run(tmp_path / "results") / "result.json").read_text()
    assert json.loads(text)["status"] == "interrupted"
    assert "Traceback" not in out.read_text(), out.read_text()
    _nothing_of_ours(before_tc, before_netns)


def test_sigkill_then_a_new_run_cleans_up_and_succeeds(tmp_path):
    (tmp_path / "killed").mkdir()
    proc, pauses, out = _start(tmp_path / "killed", "traffic", "ovs")
    wait_until(lambda: (pauses / "traffic.reached").exists() or proc.poll() is not None,
               120, "the run to reach its traffic")
    os.killpg(proc.pid, signal.SIGKILL)     # no finally block runs
    proc.wait(timeout=30)
    assert leftovers(), "a SIGKILLed run should have left its bridges"
    done = subprocess.run([sys.executable, "-m", "emu.run", "ocs-reconfig", "--out",
                           str(tmp_path / "next"), "--set", "dataplane=ovs", *SHORT],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "leftover(s) of an earlier run" in done.stdout + done.stderr, done.stdout
    assert_no_leftovers()
