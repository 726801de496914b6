"""Cluster mode for real: a fat-tree whose hosts sit on two servers.

The second server is a `LocalServer` on this machine: its own network and
mount namespaces, sshd, Open vSwitch, run lock and /tmp, reached by ssh at
its own address.  The all-reduce must finish with its bytes through the
tunnels, the results folder must hold what the second server wrote, and
nothing of the run may remain on either server, after success and after
Ctrl-C.  Bad input fails before anything exists on either.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading

import pytest

from emu.live import localserver, state
from emu.live.localserver import LocalServer
from emu.live.waiting import wait_until
from tests.integration.utils import REPO, assert_no_leftovers, leftovers, only_run, run_cli, \
    run_ok

pytestmark = pytest.mark.require_root

# Processes a LocalServer runs for itself; anything else on it is the run's.
SERVER_OWN = ("sshd", "ovsdb-server", "ovs-vswitchd")


@pytest.fixture(scope="module")
def server():
    with LocalServer(1) as second:
        yield second


def cluster_sets(second, *extra):
    return [f"testbed.servers=['localhost', '{second.address}']",
            f"testbed.ssh_config={second.ssh_config}", *extra]


def remote_leftovers(second) -> list:
    """What of a run remains on the second server: bridges, our interfaces,
    processes, recorded pids, a held lock."""
    found = []
    bridges = second.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True,
                         text=True).stdout.split()
    found += [f"bridge {b}" for b in bridges if state.BRIDGE_RE.match(b)]
    links = json.loads(second.run(["ip", "-json", "link"], capture_output=True,
                                  text=True).stdout or "[]")
    found += [f"link {link['ifname']}" for link in links
              if state.PORT_RE.match(link["ifname"]) or re.match(r"^h\d+-eth", link["ifname"])]
    for pid in localserver._server_pids(second.name):
        if pid != second.anchor_pid and localserver._comm(pid) not in SERVER_OWN:
            found.append(f"process {pid} ({localserver._comm(pid)})")
    owned = second.run(["cat", "/run/fabric-emu/owned.jsonl"], capture_output=True, text=True)
    if owned.returncode == 0 and owned.stdout.strip():
        found.append(f"pid records: {owned.stdout.strip()[:200]}")
    probe = second.run([sys.executable, "-c", "from emu.live.server_agent import lock_free; "
                        "print(lock_free())"], capture_output=True, text=True, cwd=REPO)
    if probe.stdout.strip() != "True":
        found.append(f"the run lock is held ({probe.stdout.strip()} {probe.stderr[-200:]})")
    return found


def assert_nothing_left(second) -> None:
    assert_no_leftovers()
    wait_until(lambda: not remote_leftovers(second), 15, "the second server to be clean",
               detail=lambda: str(remote_leftovers(second)))


def test_allreduce_across_two_servers_crosses_the_tunnels(tmp_path, server):
    run, result = run_ok("allreduce", tmp_path, *cluster_sets(server, "allreduce.hosts=16"),
                         files=["flows.csv", "report.md"])
    cluster = result["cluster"]
    assert cluster["hosts_per_server"] == {"localhost": 8, server.address: 8}
    assert {t["kind"] for t in cluster["tunnels"]} == {"vxlan"}   # no ip_gre here
    assert len(cluster["tunnels"]) == 8        # k=4, a pod per server side: agg-core links
    sent = {"localhost": 0, server.address: 0}
    for tunnel in cluster["tunnels"]:
        for end, counts in tunnel["bytes"].items():
            sent[end.rsplit(":", 1)[0]] += counts["tx"]
    # The ring of 16 crosses between the servers once each way; each crossing
    # carries 2 (N-1) / N of the 10 MB buffer (18.75 MB) plus headers.
    assert min(sent.values()) > 18.75e6, sent
    flows = (run / "flows.csv").read_text().splitlines()
    assert len(flows) == 481 and all(",ok," in line for line in flows[1:])
    # The second server's own log, gathered, and its switches' tables.
    assert (run / "servers" / f"{server.address}.log").is_file()
    assert f"{server.address}:servers/{server.address}.log" in cluster["gathered"]
    remote_switches = [p for p in (run / "dumps").iterdir()
                       if p.read_text().startswith(f"# on {server.address}")]
    assert len(remote_switches) == 10          # 2 pods of 4 switches, and 2 cores
    assert [s["name"] for s in cluster["servers"]] == ["localhost", server.address]
    assert all(s["cpu_pct"] is not None for s in cluster["servers"])
    assert abs(cluster["servers"][1]["clock_offset_ms"]) < 5   # one kernel clock here
    assert_nothing_left(server)


def _start_traffic(tmp_path, server):
    proc = subprocess.Popen([sys.executable, "-m", "emu.run", "allreduce", "--out",
                             str(tmp_path)] +
                            [a for s in cluster_sets(server, "allreduce.hosts=16")
                             for a in ("--set", s)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    lines = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()
    wait_until(lambda: any("all-reduce of" in line for line in lines) or
               proc.poll() is not None, 180, "the run to start its traffic")
    assert proc.poll() is None, "".join(lines)
    assert remote_leftovers(server), "the run should be using the second server now"
    return proc, lines


# Linux binds a VXLAN device's UDP port on the wildcard address of the
# namespace the device was made in, whatever its local address: the one
# listener a cluster run cannot keep on loopback (GRE has none).
VXLAN_PORT = 4789


def _beyond_loopback(found) -> list:
    return [item for item in found
            if not (item.socket.table.startswith("udp") and item.socket.port == VXLAN_PORT
                    and not item.pids)]


def _second_servers_listeners(second) -> list:
    """What listens beyond loopback in the second server's root namespace,
    sshd (the user's) apart."""
    from emu.live import listening

    net_dir = f"/proc/{second.anchor_pid}/net"
    pids = [pid for pid in localserver._server_pids(second.name)
            if localserver._comm(pid) != "sshd"]
    return listening.non_loopback_listeners(pids, net_dir=net_dir) + \
        listening.kernel_listeners(net_dir=net_dir)


def test_ctrl_c_during_traffic_leaves_nothing_on_either_server(tmp_path, server):
    from emu.live import listening
    from tests.integration.utils import exposed_listeners

    kernel_before = listening.kernel_listeners()
    proc, lines = _start_traffic(tmp_path, server)
    # While it runs: nothing of it listens beyond loopback on either server.
    here = _beyond_loopback(exposed_listeners(kernel_before, runner=proc.pid))
    there = _beyond_loopback(_second_servers_listeners(server))
    assert not here, listening.describe(here)
    assert not there, listening.describe(there)
    # What a terminal's Ctrl-C does: SIGINT to the whole process group.
    os.killpg(proc.pid, signal.SIGINT)
    code = proc.wait(timeout=120)
    assert code == 130, f"exit code {code}:\n{''.join(lines)}"
    result = json.loads((only_run(tmp_path) / "result.json").read_text())
    assert result["status"] == "interrupted"
    assert_nothing_left(server)


def test_a_killed_run_leaves_the_other_server_clean(tmp_path, server):
    proc, _ = _start_traffic(tmp_path, server)
    os.killpg(proc.pid, signal.SIGKILL)          # no finally block runs here
    proc.wait(timeout=30)
    # Its agent's input ended with the runner: it cleans that server itself.
    wait_until(lambda: not remote_leftovers(server), 30, "the second server to clean itself",
               detail=lambda: str(remote_leftovers(server)))
    assert leftovers(), "this machine keeps its bridges for emu.clean, as on one server"
    done = subprocess.run([sys.executable, "-m", "emu.clean"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert_nothing_left(server)


def _fails(tmp_path, *sets):
    done = run_cli("allreduce", "--out", str(tmp_path / "out"),
                   *[a for s in sets for a in ("--set", s)], timeout_s=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert not (tmp_path / "out").exists()
    assert not leftovers()
    return done.stderr


def test_bad_cluster_input_fails_before_anything_exists(tmp_path, server):
    unreachable = server.address.rsplit(".", 1)[0] + ".3"
    message = _fails(tmp_path, f"testbed.servers=['localhost', '{unreachable}']",
                     f"testbed.ssh_config={server.ssh_config}")
    assert f"server {unreachable}" in message and "does not answer ssh" in message, message

    message = _fails(tmp_path, *cluster_sets(server, "dataplane=linux"))
    assert "does not run across servers" in message, message

    # Four servers, and the 16 GPUs of this Clos sit under leaves of 6, 6 and
    # 4: no server can hold a quarter without splitting a leaf.  Refused
    # before any of the (here nonexistent) servers is asked anything.
    message = _fails(tmp_path, "fabric.spec=fattree-os,gpus=16",
                     "testbed.servers=['localhost', '10.254.1.2', '10.254.1.3', '10.254.1.4']")
    assert "cannot place on 4 servers" in message, message
    assert not remote_leftovers(server)


def test_a_server_without_open_vswitch_is_named(tmp_path):
    with LocalServer(2) as bare:
        bare.run(["ovs-appctl", "-t", "ovsdb-server", "exit"], check=True)
        message = _fails(tmp_path, *cluster_sets(bare))
        assert f"server {bare.address} lacks Open vSwitch running" in message, message


def test_pd_inference_captures_every_servers_switch_ports(tmp_path, server):
    run, result = run_ok("pd-inference", tmp_path,
                         *cluster_sets(server, "pd-inference.fabrics=['zcube']",
                                       "pd-inference.requests=8"))
    captures = run / "zcube" / "captures"
    remote_map = json.loads((captures / f"links-{server.address}.ifmap.json").read_text())
    assert remote_map["server"] == server.address and remote_map["captured"] > 0, remote_map
    assert (captures / f"links-{server.address}.pcap").stat().st_size > 24
    assert json.loads((captures / "links.ifmap.json").read_text())["captured"] > 0
    # Links sent from the switches of both servers are in the per-link loads.
    remote = {p.stem[len("fe"):] for p in (run / "zcube" / "dumps").iterdir()
              if p.read_text().startswith(f"# on {server.address}")}
    with open(run / "zcube" / "links.csv") as stream:
        senders = {row["src"] for row in csv.DictReader(stream) if int(row["bytes"]) > 0}
    assert senders & remote and (senders - remote) & {s for s in senders if s[0] == "s"}, \
        (senders, remote)
    assert result["cluster"]["zcube"]["hosts_per_server"] == {"localhost": 16,
                                                              server.address: 16}
    assert_nothing_left(server)
