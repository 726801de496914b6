"""How much KV data a transfer keeps in flight: the window that stands in for a lossless fabric.

The texts move KV caches with RDMA over lossless fabrics: the receiver
grants credit, priority flow control pauses a sender before a switch buffer
overflows, and a transfer never loses a packet to the others sharing its
path.  The emulator carries KV over TCP through drop-tail queues instead.
When several KV flows start into one queue, TCP's slow start overfills it,
a flow loses most of its first window, and Linux waits out its 200 ms
minimum retransmission timeout: two emulated seconds at ``tdf = 10``, a
swing of about ten points between two runs of the same stream, which no
lossless fabric would show.

So each KV flow's window (its receiver's buffer, as ``iperf3 -w`` sets it)
is bounded, by a rule fixed in advance rather than tuned to a result::

    window = queue_packets // (d_credits x flows_per_request)  full segments

``d_credits`` is how many requests' streams one D admits at once, and
``flows_per_request`` how many KV flows one request has (a flow per TP rank,
per NIC port on the multi-port fabrics).  Every KV flow one D admits at once
then fits in a single egress queue, even when all of them meet on one link
(a ToR failure moves a GPU's two ranks, or its two ports, onto one): they
queue, and lose nothing to their own concurrency.  Streams without credits
(`traffic.credits` off) can still pile up beyond that and overflow a queue,
which is the incast credits exist to prevent.

The window must also cover a flow's bandwidth-delay product, or a lone flow
would not fill its link.  At the emulated rates (10-20 Mbit/s, a data
packet takes 0.6-1.2 ms per hop and a path's round trip a few ms) a few
segments do; ``MIN_SEGMENTS`` keeps the bound from going below that when
many flows share a D.
"""

from __future__ import annotations

#: Rule names, for the scenarios' ``kv_window`` setting.
BOUNDED = "bounded"
TCP = "tcp"
RULES = (BOUNDED, TCP)

#: The smallest window the rule gives, in full segments.
MIN_SEGMENTS = 4
#: IPv4 and TCP headers with the timestamp option, which Linux sends.
TCP_IP_HEADER_BYTES = 52


def mss(mtu: int) -> int:
    """TCP payload bytes of a full-sized segment at ``mtu``."""
    return mtu - TCP_IP_HEADER_BYTES


def window_segments(queue_packets: int, d_credits: int, flows_per_request: int) -> int:
    """Full segments each KV flow may keep in flight under the bounded rule."""
    if queue_packets < 1 or d_credits < 1 or flows_per_request < 1:
        raise ValueError(f"kv window: queue_packets={queue_packets}, d_credits={d_credits} "
                         f"and flows_per_request={flows_per_request} must all be at least 1")
    return max(MIN_SEGMENTS, queue_packets // (d_credits * flows_per_request))


def window_bytes(rule: str, queue_packets: int, mtu: int, d_credits: int,
                 flows_per_request: int) -> int:
    """The window of every KV flow, in payload bytes; 0 leaves TCP its own (``tcp``)."""
    if rule == TCP:
        return 0
    if rule != BOUNDED:
        raise ValueError(f"kv_window={rule!r}; allowed: {', '.join(RULES)}")
    return window_segments(queue_packets, d_credits, flows_per_request) * mss(mtu)
