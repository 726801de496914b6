"""The root-namespace listener audit: /proc/net tables parsed from fixture
text (IPv4 and IPv6, in the kernel's host-order hex), sockets tied to
processes through a fake /proc, and the whole audit on this process's own
sockets."""

import ipaddress
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest

from emu.live import listening, state

# As an x86 kernel prints them: each 32-bit word of an address in little-endian.
TCP = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1A0B 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1001 1 0000000000000000 100 0 0 10 0
   1: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1002 1 0000000000000000 100 0 0 10 0
   2: 0B00000A:1389 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1003 1 0000000000000000 100 0 0 10 0
   3: 0100007F:1A0B 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 1004 1 0000000000000000 20 4 30 10 -1
   4: 0101A8C0:9C40 0201A8C0:0016 06 00000000:00000000 03:00000D2A 00000000     0        0 0 3 0000000000000000
"""
TCP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000000000000000000001000000:1A0B 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2001 1 0000000000000000 100 0 0 10 0
   1: 00000000000000000000000000000000:0050 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2002 1 0000000000000000 100 0 0 10 0
   2: 0000000000000000FFFF00000100007F:1F90 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2003 1 0000000000000000 100 0 0 10 0
   3: 000080FE000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2004 1 0000000000000000 100 0 0 10 0
"""
UDP = """\
   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  101: 00000000:14E9 00000000:0000 07 00000000:00000000 00:00000000 00000000   104        0 3001 2 0000000000000000 0
  102: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000   101        0 3002 2 0000000000000000 0
  103: 0B00000A:B0F5 0C00000A:1389 01 00000000:00000000 00:00000000 00000000     0        0 3003 2 0000000000000000 0
  104: 00000000:12B5 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 3004 2 0000000000000000 0
"""
UDP6 = """\
  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  200: 00000000000000000000000000000000:14E9 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000   104        0 4001 2 0000000000000000 0
"""
TABLES = {"tcp": TCP, "tcp6": TCP6, "udp": UDP, "udp6": UDP6}
# pid -> (command, socket inodes it holds)
PROCESSES = {100: ("python3", [1001, 2002]),            # the controller
             200: ("iperf3", [1003, 3001, 3003]),       # something it started
             300: ("sshd", [1002, 2004, 4001])}         # the user's


def parse(table):
    return {s.inode: s for s in listening.parse_table(TABLES[table], table, "little")}


def test_ipv4_addresses_ports_states_and_inodes():
    tcp = parse("tcp")
    assert (tcp[1001].address, tcp[1001].port) == ("127.0.0.1", 6667)
    assert (tcp[1002].address, tcp[1002].port) == ("0.0.0.0", 22)
    assert (tcp[1003].address, tcp[1003].port) == ("10.0.0.11", 5001)
    assert tcp[1001].listening and tcp[1001].loopback
    assert tcp[1002].listening and not tcp[1002].loopback, "0.0.0.0 is every address"
    assert not tcp[1004].listening, "an established connection listens for nobody"
    assert not tcp[0].listening and tcp[0].address == "192.168.1.1"


def test_ipv6_addresses_in_host_order_words():
    tcp6 = parse("tcp6")
    assert tcp6[2001].address == "::1" and tcp6[2001].loopback
    assert tcp6[2002].address == "::" and not tcp6[2002].loopback, ":: is every address"
    # (Python before 3.13 prints it ::ffff:7f00:1)
    assert ipaddress.ip_address(tcp6[2003].address) == ipaddress.ip_address("::ffff:127.0.0.1")
    assert tcp6[2003].loopback, "an IPv4-mapped 127.0.0.1 is loopback too"
    assert tcp6[2004].address == "fe80::1" and not tcp6[2004].loopback
    assert (tcp6[2002].port, tcp6[2004].port) == (80, 22)


def test_udp_bound_and_unconnected_listens_connected_does_not():
    udp = parse("udp")
    assert udp[3001].listening and not udp[3001].loopback
    assert udp[3002].listening and udp[3002].loopback
    assert not udp[3003].listening, "a UDP socket connected to one peer hears only it"
    assert parse("udp6")[4001].address == "::"


def test_big_endian_kernels_print_words_the_other_way():
    assert listening.hex_address("7F000001", "big") == "127.0.0.1"
    assert listening.hex_address("7F000001", "little") == "1.0.0.127"
    with pytest.raises(ValueError, match="not a /proc/net address"):
        listening.hex_address("7F0001", "little")
    with pytest.raises(ValueError, match="unknown table"):
        listening.parse_table(TCP, "sctp")


def test_socket_inode_reads_only_socket_links():
    assert listening.socket_inode("socket:[12345]") == 12345
    assert listening.socket_inode("pipe:[12345]") is None
    assert listening.socket_inode("/dev/null") is None
    assert listening.socket_inode("socket:[x]") is None


# The audit reads tables in the host's byte order, as its kernel writes them.
little_endian = pytest.mark.skipif(sys.byteorder != "little",
                                   reason="the fixture tables are a little-endian kernel's")


@pytest.fixture
def fake_proc(tmp_path):
    """A /proc with the fixture's processes and a net directory of its tables."""
    net = tmp_path / "net"
    net.mkdir()
    for table, text in TABLES.items():
        (net / table).write_text(text)
    proc = tmp_path / "proc"
    for pid, (comm, inodes) in PROCESSES.items():
        fd = proc / str(pid) / "fd"
        fd.mkdir(parents=True)
        (proc / str(pid) / "comm").write_text(comm + "\n")
        os.symlink("/dev/null", fd / "0")
        os.symlink("pipe:[77]", fd / "1")
        for number, inode in enumerate(inodes, start=3):
            os.symlink(f"socket:[{inode}]", fd / str(number))
    (proc / "self").mkdir()         # not a pid: skipped
    return str(net), str(proc)


@little_endian
def test_socket_owners_from_fd_links(fake_proc):
    _, proc = fake_proc
    owners = listening.socket_owners([100, 200, 999], proc)
    assert owners == {1001: {100}, 2002: {100}, 1003: {200}, 3001: {200}, 3003: {200}}, \
        "a pid without a /proc entry (999, gone) holds nothing"
    assert set(listening.socket_owners(None, proc)) == \
        {i for _, inodes in PROCESSES.values() for i in inodes}


@little_endian
def test_only_our_processes_non_loopback_listeners_are_reported(fake_proc):
    net, proc = fake_proc
    found = listening.non_loopback_listeners([100, 200], net, proc)
    assert [(f.socket.table, f.socket.address, f.socket.port, sorted(f.pids)) for f in found] \
        == [("tcp", "10.0.0.11", 5001, [200]), ("tcp6", "::", 80, [100]),
            ("udp", "0.0.0.0", 5353, [200])], \
        "loopback, connected and the user's sshd's sockets are not ours to report"
    text = listening.describe(found)
    assert "tcp6 [::]:80 held by python3 (pid 100)" in text
    assert "udp 0.0.0.0:5353 held by iperf3 (pid 200)" in text
    assert listening.describe([]) == "nothing listens on a non-loopback address"


@little_endian
def test_kernel_listeners_are_the_exposed_sockets_no_process_holds(fake_proc):
    net, proc = fake_proc
    found = listening.kernel_listeners(net, proc)
    assert [(f.socket.address, f.socket.port) for f in found] == [("0.0.0.0", 4789)], \
        "a VXLAN device's port is held by the kernel, not a process"
    assert "held by no process (the kernel's)" in str(found[0])


def test_this_process_own_sockets_through_the_real_proc():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as loopback, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as wildcard:
        loopback.bind(("127.0.0.1", 0))
        loopback.listen(1)
        wildcard.bind(("0.0.0.0", 0))
        found = listening.non_loopback_listeners([os.getpid()])
        ports = {(f.socket.table, f.socket.port) for f in found}
        assert ("udp", wildcard.getsockname()[1]) in ports, listening.describe(found)
        assert ("tcp", loopback.getsockname()[1]) not in ports, "127.0.0.1 is not exposed"
        assert all(f.pids == {os.getpid()} for f in found)


def test_our_pids_are_the_recorded_live_processes_and_their_descendants(tmp_path, monkeypatch):
    owned = tmp_path / "owned.jsonl"
    monkeypatch.setattr(state, "OWNED_PATH", str(owned))
    parent = subprocess.Popen(["sh", "-c", "sleep 30 & wait"])
    child = None
    try:
        psutil_parent = psutil.Process(parent.pid)
        deadline = time.monotonic() + 5
        while not psutil_parent.children() and time.monotonic() < deadline:
            time.sleep(0.01)
        child = psutil_parent.children()[0].pid
        entries = [{"pid": parent.pid, "start": state.process_start_time(parent.pid),
                    "what": "a shell"},
                   # A recycled pid: recorded with another start time, not ours.
                   {"pid": os.getppid(), "start": -1, "what": "gone"}]
        owned.write_text("".join(json.dumps(e) + "\n" for e in entries))
        pids = listening.our_pids(include_self=False)
        assert pids == {parent.pid, child}, f"expected the shell and its sleep, got {pids}"
        assert os.getpid() in listening.our_pids()
    finally:
        if child is not None:
            state.signal_process(child, signal.SIGKILL)
        parent.kill()
        parent.wait()
