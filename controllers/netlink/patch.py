"""The patch panel's fast path: a circuit lit or torn with one netlink message.

An OCS circuit on the kernel data plane is a catch-all u32 filter on a
port's ingress whose one action redirects every frame to the peer port
(``mirred egress redirect``).  The dark window of a reconfiguration is timed
from these two changes, so they take the shortest way there is: a netlink
socket of the OCS's namespace that is kept open, and the request bytes
written here (pyroute2's general request path costs about a millisecond a
call; this one, the kernel's own time, tens of microseconds).  Each request
asks for an acknowledgement, and returns only once it came: the filter is in
effect (or gone) when `light` or `dark` returns.  Both return when the
kernel took the change: the epoch times just before and after the request
was written (`controllers.netlink.wire.Channel.timed_request`).

The messages (``include/uapi/linux/rtnetlink.h``, ``pkt_cls.h``,
``tc_act/tc_mirred.h``)::

    RTM_NEWTFILTER  tcmsg{ifindex, parent ffff:, info = prio << 16 | ETH_P_ALL}
                    TCA_KIND "u32"
                    TCA_OPTIONS { TCA_U32_SEL  one key: mask 0, value 0 (match all),
                                               terminal
                                  TCA_U32_ACT  { 1: TCA_ACT_KIND "mirred"
                                                    TCA_ACT_OPTIONS { TCA_MIRRED_PARMS
                                                      action stolen, egress redirect,
                                                      ifindex <peer> } } }
    RTM_DELTFILTER  tcmsg{ifindex, parent ffff:, info = prio << 16 | ETH_P_ALL}
                    TCA_KIND "u32"

Unit tests decode these bytes with pyroute2's own message classes.
"""

from __future__ import annotations

import socket
import struct
from typing import Tuple

from controllers.netlink.wire import (NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REQUEST,
                                      Channel, attr, message)

RTM_NEWTFILTER, RTM_DELTFILTER = 44, 45
TCA_KIND, TCA_OPTIONS = 1, 2
TCA_U32_SEL, TCA_U32_ACT = 5, 7
TCA_ACT_KIND, TCA_ACT_OPTIONS = 1, 2
TCA_MIRRED_PARMS = 2
TC_ACT_STOLEN = 4
TCA_EGRESS_REDIR = 1
TC_U32_TERMINAL = 1
INGRESS_PARENT = 0xFFFF0000
ETH_P_ALL = 0x0003

_TCMSG = struct.Struct("=BxxxiIII")         # tcmsg: family, ifindex, handle, parent, info
_SEL = struct.Struct("=BBBxHHhhI")          # tc_u32_sel without its keys
_KEY = struct.Struct("=IIii")               # tc_u32_key: mask, val, off, offmask
_MIRRED = struct.Struct("=IIiiiiI")         # tc_mirred: index, capab, action, refcnt,
                                            # bindcnt, eaction, ifindex


def _info(prio: int) -> int:
    return (prio << 16) | socket.htons(ETH_P_ALL)


def filter_add(seq: int, ifindex: int, peer: int, prio: int = 1) -> bytes:
    """RTM_NEWTFILTER: every frame entering ``ifindex`` leaves by ``peer``."""
    selector = _SEL.pack(TC_U32_TERMINAL, 0, 1, 0, 0, 0, 0, 0) + _KEY.pack(0, 0, 0, 0)
    mirred = _MIRRED.pack(0, 0, TC_ACT_STOLEN, 0, 0, TCA_EGRESS_REDIR, peer)
    action = attr(TCA_ACT_KIND, b"mirred\0") + \
        attr(TCA_ACT_OPTIONS, attr(TCA_MIRRED_PARMS, mirred), nested=True)
    options = attr(TCA_U32_SEL, selector) + \
        attr(TCA_U32_ACT, attr(1, action, nested=True), nested=True)
    body = _TCMSG.pack(0, ifindex, 0, INGRESS_PARENT, _info(prio)) + \
        attr(TCA_KIND, b"u32\0") + attr(TCA_OPTIONS, options, nested=True)
    return message(RTM_NEWTFILTER, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL,
                   seq, body)


def filter_delete(seq: int, ifindex: int, prio: int = 1) -> bytes:
    """RTM_DELTFILTER: the filter of priority ``prio`` on ``ifindex``'s ingress goes."""
    body = _TCMSG.pack(0, ifindex, 0, INGRESS_PARENT, _info(prio)) + attr(TCA_KIND, b"u32\0")
    return message(RTM_DELTFILTER, NLM_F_REQUEST | NLM_F_ACK, seq, body)


class PatchError(OSError):
    """The kernel refused a filter change."""


class PatchSocket:
    """Lights and tears circuits on one OCS namespace's netlink socket."""

    def __init__(self, sock: socket.socket):
        self.channel = Channel(sock, PatchError)

    def light(self, ifindex: int, peer: int, prio: int = 1) -> Tuple[float, float]:
        return self.channel.timed_request(lambda seq: filter_add(seq, ifindex, peer, prio))[1]

    def dark(self, ifindex: int, prio: int = 1) -> Tuple[float, float]:
        return self.channel.timed_request(lambda seq: filter_delete(seq, ifindex, prio))[1]

    def close(self) -> None:
        self.channel.close()
