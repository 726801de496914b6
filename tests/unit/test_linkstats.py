"""A namespace's port counters over a netlink socket of their own (`LinkStats`):
the dump request, its multi-part answer, and the kernel's own answer here."""

from __future__ import annotations

import socket
import struct
from pathlib import Path
from typing import List

import pytest

from controllers.netlink.linkstats import (IFINFO, IFLA_STATS64, NLM_F_DUMP, NLMSG_DONE,
                                           RTM_GETLINK, RTM_NEWLINK, STATS64_FIELDS,
                                           LinkStats, LinkStatsError)
from controllers.netlink.wire import HEADER, NLM_F_REQUEST, NLMSG_ERROR, attr, message

IFLA_IFNAME = 3
NLM_F_MULTI = 0x2
# struct rtnl_link_stats64 has grown over the years; the fields read come first.
STATS64_LENGTH = 24


def newlink(seq: int, index: int, name: str, counters=None) -> bytes:
    body = IFINFO.pack(0, 1, index, 0, 0) + attr(IFLA_IFNAME, name.encode() + b"\0")
    if counters is not None:
        values = [counters.get(field, 0) for field in STATS64_FIELDS]
        values += [0] * (STATS64_LENGTH - len(values))
        body += attr(IFLA_STATS64, struct.pack(f"={len(values)}Q", *values))
    return message(RTM_NEWLINK, NLM_F_MULTI, seq, body)


def done(seq: int) -> bytes:
    return message(NLMSG_DONE, NLM_F_MULTI, seq, struct.pack("=i", 0))


def error(seq: int, code: int) -> bytes:
    return message(NLMSG_ERROR, 0, seq, struct.pack("=i", -code) + b"\0" * HEADER.size)


class ScriptedSocket:
    """Answers each request with datagrams built from its sequence number."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.sent: List[bytes] = []
        self.pending: List[bytes] = []
        self.closed = False

    def send(self, data: bytes) -> int:
        self.sent.append(data)
        seq = HEADER.unpack_from(data)[3]
        self.pending = list(self.answers.pop(0)(seq))
        return len(data)

    def recv(self, size: int) -> bytes:
        assert self.pending, "read past the end of the answer: the dump never ended"
        return self.pending.pop(0)

    def close(self):
        self.closed = True


def test_the_request_is_a_link_dump():
    sock = ScriptedSocket(lambda seq: [done(seq)])
    assert LinkStats(sock).by_index() == {}
    length, kind, flags, seq, _ = HEADER.unpack_from(sock.sent[0])
    assert (kind, flags, length) == (RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP,
                                     HEADER.size + IFINFO.size)


def test_a_dump_over_several_datagrams_gives_every_interfaces_counters():
    eth1 = {"rx_bytes": 1500, "tx_bytes": 3000, "rx_packets": 1, "tx_packets": 2,
            "rx_dropped": 7, "tx_dropped": 9}
    sock = ScriptedSocket(lambda seq: [
        newlink(seq - 1, 5, "stale") + newlink(seq, 1, "lo", {"rx_bytes": 10}),
        newlink(seq, 2, "s1-eth1", eth1) + newlink(seq, 3, "no-stats"),
        done(seq)])
    stats = LinkStats(sock)
    found = stats.by_index()
    assert sorted(found) == [1, 2], "the stale message and the one without stats are skipped"
    assert {key: found[2][key] for key in eth1} == eth1
    assert found[1]["rx_bytes"] == 10 and found[1]["tx_errors"] == 0
    stats.close()
    assert sock.closed


def test_each_call_is_its_own_request():
    sock = ScriptedSocket(lambda seq: [newlink(seq, 1, "lo", {"tx_bytes": 1}), done(seq)],
                          lambda seq: [newlink(seq, 1, "lo", {"tx_bytes": 2}), done(seq)])
    stats = LinkStats(sock)
    assert stats.by_index()[1]["tx_bytes"] == 1
    assert stats.by_index()[1]["tx_bytes"] == 2
    first, second = (HEADER.unpack_from(data)[3] for data in sock.sent)
    assert second == first + 1


def test_a_refused_dump_is_an_error_with_the_kernels_errno():
    sock = ScriptedSocket(lambda seq: [error(seq, 1)])
    with pytest.raises(LinkStatsError) as refused:
        LinkStats(sock).by_index()
    assert refused.value.errno == 1


def test_the_kernel_answers_the_dump_in_this_namespace():
    """Read-only, in the test's own network namespace: the loopback's counters,
    which only grow, lie between two readings of sysfs."""
    sysfs = Path("/sys/class/net/lo/statistics/rx_bytes")
    try:
        sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
        sock.bind((0, 0))
        index = socket.if_nametoindex("lo")
    except OSError as exc:
        pytest.skip(f"no netlink route socket here: {exc}")
    if not sysfs.exists():
        pytest.skip("no sysfs statistics for lo")
    stats = LinkStats(sock)
    try:
        before = int(sysfs.read_text())
        found = stats.by_index()
        after = int(sysfs.read_text())
    finally:
        stats.close()
    assert index in found, f"lo (index {index}) missing from the dump: {sorted(found)}"
    assert before <= found[index]["rx_bytes"] <= after
    assert set(found[index]) == set(STATS64_FIELDS)
