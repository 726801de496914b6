"""The patch panel's fast-path messages, decoded by pyroute2's own message classes."""

import socket
import struct
import time

import pytest
from pyroute2.netlink.rtnl.tcmsg import tcmsg

from controllers.netlink import lookup, patch, wire


def decoded(data: bytes) -> tcmsg:
    msg = tcmsg(data)
    msg.decode()
    return msg


def test_a_lit_circuit_is_a_catch_all_u32_filter_redirecting_to_the_peer():
    data = patch.filter_add(seq=7, ifindex=12, peer=15, prio=1)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", data)
    assert (length, kind, seq) == (len(data), patch.RTM_NEWTFILTER, 7)
    assert flags & patch.NLM_F_ACK and flags & patch.NLM_F_CREATE and flags & patch.NLM_F_EXCL
    msg = decoded(data)
    assert msg["index"] == 12 and msg["parent"] == patch.INGRESS_PARENT
    assert msg["info"] >> 16 == 1 and msg["info"] & 0xFFFF == socket.htons(patch.ETH_P_ALL)
    assert msg.get_attr("TCA_KIND") == "u32"
    options = msg.get_attr("TCA_OPTIONS")
    selector = options.get_attr("TCA_U32_SEL")
    assert selector["nkeys"] == 1 and selector["flags"] & patch.TC_U32_TERMINAL
    assert (selector["keys"][0]["key_mask"], selector["keys"][0]["key_val"]) == (0, 0), \
        "mask 0, value 0: every frame matches"
    (action,) = options.get_attr("TCA_U32_ACT").get_attrs("TCA_ACT_PRIO_1")
    assert action.get_attr("TCA_ACT_KIND") == "mirred"
    mirred = action.get_attr("TCA_ACT_OPTIONS").get_attr("TCA_MIRRED_PARMS")
    assert (mirred["ifindex"], mirred["action"], mirred["eaction"]) == \
        (15, patch.TC_ACT_STOLEN, patch.TCA_EGRESS_REDIR), "stolen, redirected out of the peer"


def test_a_torn_circuit_deletes_the_ports_filter_by_priority():
    data = patch.filter_delete(seq=8, ifindex=12, prio=1)
    length, kind, flags, seq, _ = struct.unpack_from("=IHHII", data)
    assert (length, kind, seq) == (len(data), patch.RTM_DELTFILTER, 8)
    assert flags == patch.NLM_F_REQUEST | patch.NLM_F_ACK
    msg = decoded(data)
    assert msg["index"] == 12 and msg["info"] >> 16 == 1 and msg.get_attr("TCA_KIND") == "u32"


class Loopback:
    """A socket that acknowledges each request with the error code it is given."""

    def __init__(self, code=0):
        self.code, self.sent = code, []

    def send(self, data):
        self.sent.append(data)

    def recv(self, size):
        seq = struct.unpack_from("=IHHII", self.sent[-1])[3]
        other = struct.pack("=IHHII", 20, wire.NLMSG_ERROR, 0, seq + 99, 0) + struct.pack("=i", 0)
        ack = struct.pack("=IHHII", 36, wire.NLMSG_ERROR, 0, seq, 0) + \
            struct.pack("=i", -self.code) + self.sent[-1][:16]
        return other + ack

    def close(self):
        pass


def test_a_request_returns_once_its_own_acknowledgement_came():
    sock = Loopback()
    panel = patch.PatchSocket(sock)
    panel.light(3, 4)
    panel.dark(3)
    kinds = [struct.unpack_from("=IHHII", m)[1] for m in sock.sent]
    seqs = [struct.unpack_from("=IHHII", m)[3] for m in sock.sent]
    assert kinds == [patch.RTM_NEWTFILTER, patch.RTM_DELTFILTER] and seqs == [1, 2]
    with pytest.raises(patch.PatchError, match="File exists"):
        patch.PatchSocket(Loopback(code=17)).light(3, 4)


class SlowAnswer(Loopback):
    """A kernel that takes each request as it is written and answers 50 ms later."""

    def send(self, data):
        self.written_at = time.time()
        super().send(data)

    def recv(self, size):
        time.sleep(0.05)
        return super().recv(size)


def test_a_change_is_timed_by_its_write_not_by_the_wait_for_its_answer():
    sock = SlowAnswer()
    panel = patch.PatchSocket(sock)
    for change in (lambda: panel.light(3, 4), lambda: panel.dark(3)):
        before, after = change()
        assert before <= sock.written_at <= after
        assert after - before < 0.025, "the wait for the acknowledgement is not when it took it"


class RouteReplies(Loopback):
    """A router's kernel that answers a route question with output interface 7."""

    def recv(self, size):
        seq = struct.unpack_from("=IHHII", self.sent[-1])[3]
        if self.code:
            return super().recv(size)
        body = struct.pack("=BBBBBBBBI", 2, 32, 32, 0, 254, 0, 0, 1, 0) + \
            wire.attr(lookup.RTA_OIF, struct.pack("=I", 7))
        return wire.message(lookup.RTM_NEWROUTE, 0, seq, body)


def test_a_route_question_carries_the_five_tuple_and_reads_the_output_port():
    sock = RouteReplies()
    assert lookup.RouteLookup(sock).output("10.0.0.16", "10.0.0.1", 3, 5201, 40000) == 7
    question = sock.sent[0]
    assert struct.unpack_from("=IHHII", question)[1] == lookup.RTM_GETROUTE
    for kind, payload in ((lookup.RTA_SPORT, struct.pack("!H", 5201)),
                          (lookup.RTA_DPORT, struct.pack("!H", 40000)),
                          (lookup.RTA_IP_PROTO, bytes([6]))):
        assert wire.attr(kind, payload) in question, kind
    with pytest.raises(lookup.RouteLookupError, match="Network is unreachable"):
        lookup.RouteLookup(RouteReplies(code=101)).output("10.0.0.16", "10.0.0.1", 3, 1, 2)
