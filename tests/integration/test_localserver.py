"""A second server on this machine (emu.live.localserver): it starts, ssh into
it reaches its own Open vSwitch and its own run directory, the root
namespace's OVS sockets and /run/fabric-emu are untouched, and nothing is
left after stop() or after remove_leftovers() cleans up a killed run.

These tests never write into the root namespace's /run/fabric-emu or talk
to its Open vSwitch except to read (list-br, the Open_vSwitch row's uuid).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from emu.live import localserver
from emu.live.localserver import LocalServer, LocalServerError
from tests.integration.utils import REPO

pytestmark = pytest.mark.require_root

ROOT_DB_SOCK = "/run/openvswitch/db.sock"
ROOT_RUN_DIR = "/run/fabric-emu"


def ssh(server: LocalServer, *command: str, timeout: float = 20) -> subprocess.CompletedProcess:
    return subprocess.run(["ssh", "-F", str(server.ssh_config), "-o", "BatchMode=yes",
                           server.address, *command],
                          capture_output=True, text=True, timeout=timeout)


def ok(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 0, f"{done.args} failed ({done.returncode}): {done.stderr}"
    return done.stdout


def root_ovs(*args: str) -> subprocess.CompletedProcess:
    """A read-only query of the machine's main Open vSwitch."""
    return subprocess.run(["ovs-vsctl", "--timeout=3", *args], capture_output=True, text=True)


def fesrv_netns() -> list:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.strip() and line.startswith("fesrv")]


def fesrv_links() -> list:
    out = subprocess.run(["ip", "-br", "link"], capture_output=True, text=True).stdout
    return [line.split()[0].split("@")[0] for line in out.splitlines()
            if line.startswith("fesrv")]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stream:
            return stream.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def start_nested(server: LocalServer) -> int:
    """A process on the server in namespaces of its own (as a Mininet host
    started there would be: mnexec -n); returns its pid."""
    ok(ssh(server, "setsid -f sh -c 'echo $$ > /tmp/nested.pid; exec unshare --net --mount "
                   "--propagation private sleep 300' </dev/null >/dev/null 2>&1"))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        pid = server.run(["cat", "/tmp/nested.pid"]).stdout.strip()
        if pid.isdigit() and os.readlink(f"/proc/{pid}/exe").endswith("sleep"):
            break
        time.sleep(0.05)
    netns = subprocess.run(["ip", "netns", "pids", server.netns], capture_output=True,
                           text=True).stdout.split()
    assert pid.isdigit() and pid not in netns, (pid, netns)
    return int(pid)


@pytest.fixture(autouse=True)
def no_servers_before_or_after():
    localserver.remove_leftovers(log=lambda m: None)
    yield
    leftover = localserver.all_leftovers()
    localserver.remove_leftovers(log=lambda m: None)
    assert not leftover, f"left behind: {leftover}"


def test_index_is_checked_and_the_constructor_creates_nothing(tmp_path):
    for bad in (0, 201, -1, "1", 1.0, True, None):
        with pytest.raises(ValueError, match="index"):
            LocalServer(bad)
    with pytest.raises(ValueError, match="tmpfs"):
        LocalServer(1, workdir=tmp_path)           # under /tmp: sshd inside would not see it
    server = LocalServer(7)
    assert (server.name, server.address, server.host_address) == \
        ("fesrv7", "10.254.7.2", "10.254.7.1")
    assert server.anchor_pid is None and server.leftovers() == []
    server.stop()                                   # never started: nothing to do
    assert server.leftovers() == []


def test_server_has_its_own_ovs_and_run_dir_and_leaves_nothing():
    db_sock_before = os.path.exists(ROOT_DB_SOCK)
    root_ovs_up = root_ovs("show").returncode == 0
    root_uuid = root_ovs("get", "Open_vSwitch", ".", "_uuid").stdout.strip() if root_ovs_up \
        else None

    server = LocalServer(1)
    try:
        server.start()
        pids = [server.anchor_pid] + [int(p) for p in subprocess.run(
            ["ip", "netns", "pids", server.netns], capture_output=True, text=True).stdout.split()]
        assert len(pids) >= 4, f"anchor, ovsdb-server, ovs-vswitchd, sshd: {pids}"
        # The tmpfs over /run/openvswitch stayed inside: the root's sockets are there.
        assert os.path.exists(ROOT_DB_SOCK) == db_sock_before

        # Its own Open vSwitch: no bridges, another database.
        shown = ok(ssh(server, "ovs-vsctl", "--timeout=5", "show"))
        assert "Bridge" not in shown, shown
        inner_uuid = ok(ssh(server, "ovs-vsctl", "get", "Open_vSwitch", ".", "_uuid")).strip()
        assert inner_uuid and inner_uuid != root_uuid
        ok(ssh(server, "ovs-vsctl", "--timeout=10", "add-br", "fesrvtest0", "--", "set",
               "bridge", "fesrvtest0", "datapath_type=netdev"))
        assert "fesrvtest0" in ok(ssh(server, "ovs-vsctl", "list-br")).split()
        if root_ovs_up:
            assert "fesrvtest0" not in root_ovs("list-br").stdout.split()
        assert not os.path.exists("/sys/class/net/fesrvtest0"), \
            "the server's bridge port appeared in the root namespace"
        ok(ssh(server, "ovs-vsctl", "--timeout=10", "del-br", "fesrvtest0"))

        # Its own /run/fabric-emu: check it is the server's tmpfs before writing.
        inner_dev = ok(server.run(["stat", "-c", "%d", ROOT_RUN_DIR])).strip()
        if os.path.exists(ROOT_RUN_DIR):
            assert inner_dev != str(os.stat(ROOT_RUN_DIR).st_dev), \
                "the server's /run/fabric-emu is the root namespace's"
        assert ok(server.run(["findmnt", "-n", "-o", "FSTYPE", "--mountpoint",
                              ROOT_RUN_DIR])).strip() == "tmpfs"
        marker = f"fesrv-marker-{uuid.uuid4().hex}"
        ok(ssh(server, f"echo {marker} > {ROOT_RUN_DIR}/{marker}"))
        assert ok(ssh(server, "cat", f"{ROOT_RUN_DIR}/{marker}")).strip() == marker
        assert not os.path.exists(f"{ROOT_RUN_DIR}/{marker}")
        # ... and its own /tmp.
        ok(ssh(server, f"echo {marker} > /tmp/{marker}"))
        assert not os.path.exists(f"/tmp/{marker}")

        # Its network: ping from the root namespace, a 9000-byte MTU.
        ok(subprocess.run(["ping", "-c", "3", "-i", "0.2", "-W", "1", server.address],
                          capture_output=True, text=True))
        ok(subprocess.run(["ping", "-c", "1", "-W", "1", "-M", "do", "-s", "8972",
                           server.address], capture_output=True, text=True))
        assert "mtu 9000" in ok(subprocess.run(["ip", "link", "show", "fesrv1-up"],
                                               capture_output=True, text=True))
        nested = start_nested(server)
        assert any(f"process {nested} " in item for item in server.leftovers())
        pids.append(nested)
        # run() is inside the namespaces too.
        assert server.address in ok(server.run(["ip", "-br", "addr"]))
        with pytest.raises(TypeError):
            server.run("ip addr")
    finally:
        server.stop()

    assert server.leftovers() == []
    assert fesrv_netns() == [] and fesrv_links() == []
    assert not [p for p in pids if alive(p)], f"still alive: {pids}"
    assert not server.private_dir.exists()
    server.stop()                                   # twice is fine
    assert os.path.exists(ROOT_DB_SOCK) == db_sock_before
    assert server.timings["start_s"] < 10 and server.timings["stop_s"] < 10, server.timings


def test_failed_start_leaves_nothing(monkeypatch):
    def broken(self):
        raise LocalServerError("sshd refused to start (simulated)")
    monkeypatch.setattr(LocalServer, "_start_sshd", broken)
    server = LocalServer(3)
    with pytest.raises(LocalServerError, match="simulated"):
        server.start()
    assert server.leftovers() == [] and fesrv_netns() == [] and fesrv_links() == []


def test_remove_leftovers_after_a_killed_run():
    script = textwrap.dedent("""
        import time
        from emu.live.localserver import LocalServer
        from tests.integration.test_localserver import start_nested
        server = LocalServer(2).start()
        print("up", server.anchor_pid, start_nested(server), flush=True)
        time.sleep(120)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline()
        assert line.startswith("up"), f"the server did not start: {line}{child.stderr.read()}"
        anchor, nested = map(int, line.split()[1:])
    finally:
        child.send_signal(signal.SIGKILL)           # an interrupted run: no stop()
        child.wait(timeout=10)

    pids = [int(p) for p in subprocess.run(["ip", "netns", "pids", "fesrv2"],
                                           capture_output=True, text=True).stdout.split()]
    assert anchor in pids and len(pids) >= 4, pids
    assert alive(nested) and nested not in pids
    pids.append(nested)
    assert "fesrv2" in fesrv_netns() and "fesrv2-up" in fesrv_links()
    assert os.path.isdir("/run/fesrv2")
    found = localserver.all_leftovers()
    assert any("netns fesrv2" in item for item in found), found

    messages = []
    began = time.monotonic()
    removed = localserver.remove_leftovers(log=messages.append)
    took = time.monotonic() - began
    assert "netns fesrv2" in removed and "directory /run/fesrv2" in removed, removed
    assert len(messages) == len(removed)
    assert localserver.all_leftovers() == []
    assert fesrv_netns() == [] and fesrv_links() == []
    assert not [p for p in pids if alive(p)], f"still alive: {pids}"
    assert not os.path.exists("/run/fesrv2")
    assert took < 10, took
