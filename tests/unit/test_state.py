"""The run lock and the record of owned processes, in a private run directory.

Nothing here touches /run/fabric-emu, Open vSwitch or network links: emu.live.state
is pointed at tmp_path, and clean() (which deletes bridges) is never called.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from emu.live import state

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "30"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=5)


def wait_for(condition, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# ---------------------------------------------------------------- run lock
def test_lock_directory_is_private(run_dir):
    lock = state.RunLock(state.LOCK_PATH).acquire("unit test")
    try:
        assert oct(os.stat(run_dir).st_mode & 0o777) == oct(0o700)
        assert Path(state.LOCK_PATH).read_text() == f"pid {os.getpid()}: unit test"
    finally:
        lock.release()


def test_second_lock_in_the_same_process_is_refused_with_the_holder(run_dir):
    first = state.RunLock(state.LOCK_PATH).acquire("allreduce on fattree,k=4")
    try:
        with pytest.raises(state.AlreadyRunning,
                           match=rf"\(pid {os.getpid()}: allreduce on fattree,k=4\)"):
            state.RunLock(state.LOCK_PATH).acquire("second")
    finally:
        first.release()
    again = state.RunLock(state.LOCK_PATH).acquire("after release")
    again.release()
    assert Path(state.LOCK_PATH).read_text() == "", "release must clear the holder"


def test_lock_held_by_another_process(run_dir):
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent("""
            import sys
            from emu.live import state
            lock = state.RunLock(state.LOCK_PATH).acquire("ocs-reconfig in another process")
            print("locked", flush=True)
            sys.stdin.readline()
            lock.release()
        """)],
        cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, FABRIC_EMU_RUN_DIR=str(run_dir), PYTHONPATH=str(REPO)))
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(state.AlreadyRunning) as info:
            state.RunLock(state.LOCK_PATH).acquire("me")
        message = str(info.value)
        assert f"pid {holder.pid}: ocs-reconfig in another process" in message, message
        assert "wait for it to finish" in message
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.wait(timeout=10) == 0
        with state.RunLock(state.LOCK_PATH).acquire("now mine"):
            assert "now mine" in Path(state.LOCK_PATH).read_text()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_lock_is_released_when_the_holder_dies(run_dir):
    holder = subprocess.Popen(
        [sys.executable, "-c", "from emu.live import state\n"
                               "state.RunLock(state.LOCK_PATH).acquire('doomed')\n"
                               "print('locked', flush=True)\nimport time; time.sleep(60)"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
        env=dict(os.environ, FABRIC_EMU_RUN_DIR=str(run_dir), PYTHONPATH=str(REPO)))
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(state.AlreadyRunning, match="doomed"):
            state.RunLock(state.LOCK_PATH).acquire()
    finally:
        holder.kill()
        holder.wait()
    lock = state.RunLock(state.LOCK_PATH).acquire("after a crash")
    lock.release()


def test_context_manager_releases(run_dir):
    with state.RunLock(state.LOCK_PATH) as lock:
        assert lock._fd is not None
        with pytest.raises(state.AlreadyRunning):
            state.RunLock(state.LOCK_PATH).acquire()
    state.RunLock(state.LOCK_PATH).acquire().release()


# ---------------------------------------------------------------- owned processes
def test_record_pid_writes_pid_start_time_and_what(run_dir, sleeper):
    state.record_pid(sleeper.pid, "sleep 30")
    (entry,) = state.owned_pids()
    assert entry["pid"] == sleeper.pid and entry["what"] == "sleep 30"
    assert isinstance(entry["start"], int) and entry["start"] > 0


def test_no_record_means_nothing_owned(run_dir):
    assert state.owned_pids() == []
    assert state.kill_owned(grace_s=0.1) == []


def test_kill_owned_kills_a_recorded_process(run_dir, sleeper):
    state.record_pid(sleeper.pid, "sleep 30")
    started = time.monotonic()
    killed = state.kill_owned(grace_s=3.0)
    assert killed == [f"sleep 30 (pid {sleeper.pid})"]
    assert sleeper.wait(timeout=5) == -signal.SIGTERM, "SIGTERM comes first"
    assert time.monotonic() - started < 2.0, \
        "a process that exited (even unreaped) must not hold kill_owned for the grace period"


def test_kill_owned_never_kills_a_recycled_pid(run_dir, sleeper):
    state.record_pid(sleeper.pid, "an older process with this pid")
    entries = state.owned_pids()
    entries[0]["start"] += 1                      # the recorded process started at another time
    Path(state.OWNED_PATH).write_text("".join(json.dumps(e) + "\n" for e in entries))
    assert state.kill_owned(grace_s=0.1) == []
    assert sleeper.poll() is None, "a pid whose start time differs from the record was killed"


def test_kill_owned_escalates_to_sigkill(run_dir):
    stubborn = subprocess.Popen(
        [sys.executable, "-c", "import signal, time\n"
                               "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                               "print('ready', flush=True)\ntime.sleep(30)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert stubborn.stdout.readline().strip() == "ready"
        state.record_pid(stubborn.pid, "stubborn")
        assert state.kill_owned(grace_s=0.2) == [f"stubborn (pid {stubborn.pid})"]
        assert stubborn.wait(timeout=5) == -signal.SIGKILL
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
            stubborn.wait()


def test_dead_process_is_not_reported(run_dir):
    proc = subprocess.Popen(["true"])
    state.record_pid(proc.pid, "short-lived")
    proc.wait()
    assert wait_for(lambda: state.process_start_time(proc.pid) is None)
    assert state.kill_owned(grace_s=0.1) == []


@pytest.mark.parametrize("name,ours", [
    ("fes1", True), ("feo12", True), ("fes1-eth3", False), ("fe", False), ("br0", False),
    ("fesx", False), ("xfes1", False),
])
def test_bridge_names_are_matched_by_prefix(name, ours):
    assert bool(state.BRIDGE_RE.match(name)) is ours, name


@pytest.mark.parametrize("name,ours", [
    ("fes1-eth3", True), ("feo2-eth10", True), ("fes1", False), ("h1-eth0", False),
    ("eth0", False),
])
def test_port_names_are_matched_by_prefix(name, ours):
    assert bool(state.PORT_RE.match(name)) is ours, name


def test_our_links_are_read_from_iproutes_json():
    listing = json.dumps([{"ifindex": 1, "ifname": "lo"},
                          {"ifindex": 7, "ifname": "fes3-eth1", "link": "h1-eth0"},
                          {"ifindex": 8, "ifname": "feo12-eth10"},
                          {"ifindex": 9, "ifname": "fes3-eth1x"},
                          {"ifindex": 10, "ifname": "other-eth0"}])
    assert state.our_links(listing) == ["fes3-eth1", "feo12-eth10"]
    assert state.our_links("not json") == [] and state.our_links("") == []
    assert isinstance(state.our_links(), list), "the machine's own listing parses"
