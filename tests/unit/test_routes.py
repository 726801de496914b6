"""Route replacements written a batch at a time: the bytes, decoded by pyroute2's own
``rtmsg``; the answers matched to their routes; and, as root, what a real kernel keeps."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import textwrap

import pytest
from pyroute2.netlink.rtnl.rtmsg import rtmsg

from controllers.netlink import routes
from controllers.netlink.routes import NextHop, RouteSpec, RouteWriter, route_replace
from controllers.netlink.wire import HEADER, NLMSG_ERROR


def decoded(data: bytes) -> rtmsg:
    msg = rtmsg(data)
    msg.decode()
    return msg


def test_a_route_via_several_ports_is_one_multipath_route_of_onlink_gateways():
    data = route_replace(9, RouteSpec("10.0.0.7", (NextHop(12, "100.64.0.1"),
                                                   NextHop(13, "100.64.0.1")), 254, 71))
    length, kind, flags, seq, _ = HEADER.unpack_from(data)
    assert (length, kind, seq) == (len(data), routes.RTM_NEWROUTE, 9)
    assert flags & routes.NLM_F_REPLACE and flags & routes.NLM_F_CREATE and \
        flags & routes.NLM_F_ACK, "replace or create, and answer"
    msg = decoded(data)
    assert (msg["family"], msg["dst_len"], msg["proto"], msg["type"], msg["table"]) == \
        (socket.AF_INET, 32, 71, routes.RTN_UNICAST, 254)
    assert msg.get_attr("RTA_DST") == "10.0.0.7" and msg.get_attr("RTA_TABLE") == 254
    hops = msg.get_attr("RTA_MULTIPATH")
    assert [(h["oif"], h["flags"], h.get_attr("RTA_GATEWAY")) for h in hops] == \
        [(12, routes.RTNH_F_ONLINK, "100.64.0.1"), (13, routes.RTNH_F_ONLINK, "100.64.0.1")]
    assert msg.get_attr("RTA_OIF") is None


def test_one_port_is_a_plain_route_and_none_a_blackhole_in_any_table():
    via = decoded(route_replace(1, RouteSpec("10.0.0.7", (NextHop(12, "100.64.0.1"),),
                                             254, 71)))
    assert (via.get_attr("RTA_OIF"), via.get_attr("RTA_GATEWAY"), via["flags"]) == \
        (12, "100.64.0.1", routes.RTNH_F_ONLINK)
    to_host = decoded(route_replace(1, RouteSpec("10.0.0.7", (NextHop(3),), 254, 71)))
    assert (to_host.get_attr("RTA_OIF"), to_host.get_attr("RTA_GATEWAY"), to_host["flags"]) \
        == (3, None, 0), "a host port: straight to the destination"
    hole = decoded(route_replace(1, RouteSpec("10.0.0.7", (), 1005, 71)))
    assert hole["type"] == routes.RTN_BLACKHOLE and hole.get_attr("RTA_OIF") is None
    assert (hole["table"], hole.get_attr("RTA_TABLE")) == (0, 1005), \
        "a table above 255 goes in RTA_TABLE"


def answer(seq: int, code: int) -> bytes:
    body = struct.pack("=i", -code) + HEADER.pack(HEADER.size, routes.RTM_NEWROUTE, 0, seq, 0)
    return HEADER.pack(HEADER.size + len(body), NLMSG_ERROR, 0, seq, 0) + body


class FakeSocket:
    """Answers every message of a write, one datagram each, refusing some."""

    def __init__(self, refuse=()):
        self.refuse = dict(refuse)      # destination -> errno
        self.writes, self.queue = [], []

    def send(self, data: bytes) -> None:
        offset, count = 0, 0
        while offset < len(data):
            length, _, _, seq, _ = HEADER.unpack_from(data, offset)
            dst = decoded(data[offset:offset + length]).get_attr("RTA_DST")
            self.queue.append(answer(seq, self.refuse.get(dst, 0)))
            offset, count = offset + length, count + 1
        self.writes.append(count)

    def recv(self, _size: int) -> bytes:
        return self.queue.pop(0)


def test_a_writer_writes_a_batch_at_once_and_tells_each_routes_answer():
    sock = FakeSocket(refuse={"10.0.0.3": 100})
    batch = [RouteSpec(f"10.0.0.{i}", (NextHop(5, "100.64.0.1"),), 254, 71)
             for i in range(1, 6)]
    assert RouteWriter(sock).replace(batch) == [0, 0, 100, 0, 0]
    assert sock.writes == [5], "one write for the batch"


def test_a_long_batch_is_written_in_pieces_the_receive_buffer_holds():
    sock = FakeSocket()
    batch = [RouteSpec(f"10.0.{i // 250}.{i % 250 + 1}", (NextHop(5),), 254, 71)
             for i in range(routes.WRITE_MESSAGES + 10)]
    assert RouteWriter(sock).replace(batch) == [0] * len(batch)
    assert sock.writes == [routes.WRITE_MESSAGES, 10]


REAL_KERNEL = textwrap.dedent("""
    import json, socket, subprocess, sys
    from controllers.netlink.routes import NextHop, RouteSpec, RouteWriter
    run = lambda *a: subprocess.run(a, check=True, capture_output=True, text=True).stdout
    run("ip", "link", "set", "lo", "up")     # as on a router: a gateway needs the local table
    for name in ("p1", "p2"):       # veth pairs: this kernel has no dummy devices
        run("ip", "link", "add", name, "type", "veth", "peer", "name", "peer-" + name)
        run("ip", "link", "set", name, "up")
        run("ip", "link", "set", "peer-" + name, "up")
    index = {n: socket.if_nametoindex(n) for n in ("p1", "p2")}
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    sock.bind((0, 0))
    gw = "100.64.0.1"
    codes = RouteWriter(sock).replace([
        RouteSpec("10.0.0.1", (NextHop(index["p1"], gw), NextHop(index["p2"], gw)), 254, 71),
        RouteSpec("10.0.0.2", (NextHop(index["p2"]),), 254, 71),
        RouteSpec("10.0.0.3", (), 254, 71),
        RouteSpec("10.0.0.4", (NextHop(99999, gw),), 254, 71),
        RouteSpec("10.0.0.1", (NextHop(index["p2"], gw),), 254, 71),
        RouteSpec("10.0.0.5", (NextHop(index["p1"], gw),), 1005, 71),
        RouteSpec("10.0.0.6", (NextHop(index["p1"], gw), NextHop(index["p2"], gw)), 254, 71),
    ])
    print(json.dumps({"codes": codes, "main": json.loads(run("ip", "-j", "route", "show",
                      "proto", "71")), "pin": json.loads(run("ip", "-j", "route", "show",
                      "table", "1005"))}))
""")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root for a network namespace of its own")
def test_a_real_kernel_keeps_what_the_batch_means_and_refuses_only_the_bad_route():
    out = subprocess.run(["unshare", "--net", sys.executable, "-c", REAL_KERNEL],
                         check=True, capture_output=True, text=True, timeout=30,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    found = json.loads(out.stdout)
    codes = found["codes"]
    assert codes[:3] == [0, 0, 0] and codes[3] != 0 and codes[4:] == [0, 0, 0], \
        f"only the route out of a missing interface is refused: {codes}"
    main = {route["dst"]: route for route in found["main"]}
    assert set(main) == {"10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.6"}
    assert [(hop["dev"], hop["gateway"], "onlink" in hop["flags"])
            for hop in main["10.0.0.6"]["nexthops"]] == \
        [("p1", "100.64.0.1", True), ("p2", "100.64.0.1", True)], "ECMP over both ports"
    assert main["10.0.0.1"]["dev"] == "p2" and main["10.0.0.1"]["gateway"] == "100.64.0.1" \
        and "onlink" in main["10.0.0.1"]["flags"], "replaced by the later message of the batch"
    assert main["10.0.0.2"]["dev"] == "p2" and "gateway" not in main["10.0.0.2"]
    assert main["10.0.0.3"]["type"] == "blackhole"
    assert [route["dst"] for route in found["pin"]] == ["10.0.0.5"]
