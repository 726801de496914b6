"""The next hop a Linux kernel router picks for a flow, computed as the kernel does.

On the ``linux`` data plane every packet switch is a kernel router whose
routes list their equal-cost ports in port order (`topologies.routing`), and
which hashes each forwarded packet with ``fib_multipath_hash_policy=3`` over
the fields `topologies.routing.MULTIPATH_HASH_FIELDS` (addresses,
protocol, ports), keyed by ``fib_multipath_hash_seed`` (kernel 6.11 and
later; `traffic.ports.multipath_hash_seed` draws it from the run's ECMP
seed).  A flow's ports come from the same seed (`traffic.ports.PortBook`).
So on such a run every flow's path is fixed, and the model can take the
same path instead of a draw of its own.  What the kernel computes
(``net/ipv4/route.c``, ``net/core/flow_dissector.c``)::

    keys   = struct flow_keys, zeroed, with only the selected fields:
             basic.ip_proto, ports.src/dst, addrs.v4addrs.src/dst (as in the
             packet: network byte order); addresses, and ports, each put in
             ascending order (``__flow_hash_consistentify``: one hash for
             both directions)
    outer  = siphash-2-4(the 48 bytes from ``basic`` to the IPv4 addresses,
             key (s << 32 | s, s << 32 | s) with s the seed), low 32 bits, 0 -> 1
    hash   = jhash_2words(outer, inner = 0, 0) >> 1        (31 bits)
    pick   = the first next hop i with hash <= upper_bound(i),
             upper_bound(i) = round((i + 1) x 2^31 / n) - 1  (``fib_rebalance``)

Every router of the path hashes the same fields with the same key, so a
flow's hash is one number and each router's choice is the bucket it falls
in among that router's next hops.  Hosts that forward (SiP-OCS) keep the
kernel's default policy 0: the same siphash over the two addresses alone,
without the jhash step, both for the packets they send and for those they
pass on.  A flow's model key carries both: the routers' hash in its low 32
bits, the hosts' in its high 32 (`KernelFlowKeys`, `host_part`).

Checked against this machine's kernel (``ip route get ... ipproto tcp sport
S dport D iif IF`` in a namespace, and the paths a testbed's routers report):
`tests/integration/test_kernel_ecmp.py`.
"""

from __future__ import annotations

import socket
import struct
from typing import Dict, Sequence

import numpy as np
from numba import njit

from topologies.routing import MULTIPATH_HASH_FIELDS
from traffic.ports import PortBook, multipath_hash_seed

TCP = 6
# The fields the routers hash (src IP, dst IP, protocol, src port, dst port):
# what the layout below fills in.
_FIELDS_COMPUTED = 0x37
_M32 = np.uint64(0xFFFFFFFF)


@njit(cache=True, inline="always")
def _rotl(x, bits):
    return (x << np.uint64(bits)) | (x >> np.uint64(64 - bits))


@njit(cache=True, inline="always")
def _rol32(x, bits):
    return ((x << np.uint64(bits)) | (x >> np.uint64(32 - bits))) & np.uint64(0xFFFFFFFF)


@njit(cache=True, inline="always")
def _sipround(v0, v1, v2, v3):
    v0 += v1
    v1 = _rotl(v1, 13)
    v1 ^= v0
    v0 = _rotl(v0, 32)
    v2 += v3
    v3 = _rotl(v3, 16)
    v3 ^= v2
    v0 += v3
    v3 = _rotl(v3, 21)
    v3 ^= v0
    v2 += v1
    v1 = _rotl(v1, 17)
    v1 ^= v2
    v2 = _rotl(v2, 32)
    return v0, v1, v2, v3


@njit(cache=True)
def siphash_words(words, k0, k1):
    """SipHash-2-4 (64 bits) of 8 x len(words) bytes given as little-endian
    uint64 words, under the 128-bit key (k0, k1)."""
    v0 = np.uint64(0x736F6D6570736575) ^ k0
    v1 = np.uint64(0x646F72616E646F6D) ^ k1
    v2 = np.uint64(0x6C7967656E657261) ^ k0
    v3 = np.uint64(0x7465646279746573) ^ k1
    # The message words, then the final block: the length in the top byte
    # (no tail bytes: the message is whole words).
    last = np.uint64(len(words) * 8) << np.uint64(56)
    for i in range(len(words) + 1):
        m = words[i] if i < len(words) else last
        v3 ^= m
        for _ in range(2):
            v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
        v0 ^= m
    v2 ^= np.uint64(0xFF)
    for _ in range(4):
        v0, v1, v2, v3 = _sipround(v0, v1, v2, v3)
    return v0 ^ v1 ^ v2 ^ v3


@njit(cache=True, inline="always")
def _jhash_step(x, y, bits):
    return ((x ^ y) - _rol32(y, bits)) & np.uint64(0xFFFFFFFF)


@njit(cache=True)
def _jhash_2words(a, b, initval):
    """The kernel's ``jhash_2words`` (``__jhash_nwords`` then ``__jhash_final``)."""
    iv = (initval + np.uint64(0xDEADBEEF) + np.uint64(8)) & _M32
    a = (a + iv) & _M32
    b = (b + iv) & _M32
    c = _jhash_step(iv, b, 14)
    a = _jhash_step(a, c, 11)
    b = _jhash_step(b, a, 25)
    c = _jhash_step(c, b, 16)
    a = _jhash_step(a, c, 4)
    b = _jhash_step(b, a, 14)
    return _jhash_step(c, b, 24)


@njit(cache=True)
def _hashes(saddr, daddr, sport, dport, proto, seed, custom):
    """The 31-bit multipath hash of each flow (see the module docstring);
    addresses and ports as the packet's bytes read little-endian.  ``custom``:
    policy 3's jhash step (a router); without it, policy 0's hash, given
    zero ports and protocol (a forwarding host)."""
    key = (seed << np.uint64(32)) | seed
    out = np.empty(len(saddr), dtype=np.uint64)
    words = np.zeros(6, dtype=np.uint64)
    for i in range(len(saddr)):
        s, d = saddr[i], daddr[i]
        if d < s:
            s, d = d, s
        sp, dp = sport[i], dport[i]
        if dp < sp:
            sp, dp = dp, sp
        # struct flow_keys from ``basic`` on: n_proto, ip_proto (byte 2), tags,
        # vlan, cvlan, keyid (zero), ports at 28, icmp (zero), v4 addresses
        # at 36, then 4 bytes of the address union's padding.
        words[0] = proto << np.uint64(16)
        words[3] = (sp | (dp << np.uint64(16))) << np.uint64(32)
        words[4] = s << np.uint64(32)
        words[5] = d
        hashed = siphash_words(words, key, key) & _M32
        if hashed == 0:
            hashed = np.uint64(1)
        if custom:
            hashed = _jhash_2words(hashed, np.uint64(0), np.uint64(0))
        out[i] = hashed >> np.uint64(1)
    return out


def _raw_u32(ip: str) -> int:
    """An IPv4 address's bytes as the kernel's ``(__force u32)`` reads them."""
    return struct.unpack("<I", socket.inet_aton(ip))[0]


def _raw_u16(port: int) -> int:
    return struct.unpack("<H", struct.pack("!H", port))[0]


def _flow_hashes(src_ips, dst_ips, sports, dports, proto: int, seed: int,
                 custom: bool) -> np.ndarray:
    if not 0 < seed < 2 ** 32:
        raise ValueError(f"multipath hash key must be in 1..2^32-1, got {seed}")
    return _hashes(np.array([_raw_u32(a) for a in src_ips], dtype=np.uint64),
                   np.array([_raw_u32(a) for a in dst_ips], dtype=np.uint64),
                   np.array([_raw_u16(p) for p in sports], dtype=np.uint64),
                   np.array([_raw_u16(p) for p in dports], dtype=np.uint64),
                   np.uint64(proto), np.uint64(seed), custom)


def multipath_hashes(src_ips: Sequence[str], dst_ips: Sequence[str], sports: Sequence[int],
                     dports: Sequence[int], seed: int, proto: int = TCP) -> np.ndarray:
    """The kernel routers' 31-bit multipath hash of each flow (uint64) under
    hash key ``seed`` (``net.ipv4.fib_multipath_hash_seed``, not 0)."""
    if MULTIPATH_HASH_FIELDS != _FIELDS_COMPUTED:
        raise ValueError(f"the routers hash fields {MULTIPATH_HASH_FIELDS:#x}; this "
                         f"computes {_FIELDS_COMPUTED:#x}")
    return _flow_hashes(src_ips, dst_ips, sports, dports, proto, seed, custom=True)


def address_hashes(src_ips: Sequence[str], dst_ips: Sequence[str], seed: int) -> np.ndarray:
    """A host's 31-bit multipath hash of each flow (policy 0: the addresses)."""
    zeros = [0] * len(src_ips)
    return _flow_hashes(src_ips, dst_ips, zeros, zeros, 0, seed, custom=False)


@njit(cache=True, inline="always")
def host_part(key):
    """The hosts' hash of a `KernelFlowKeys` key (the routers' is ``key & 0xFFFFFFFF``)."""
    return key >> np.uint64(32)


@njit(cache=True)
def hash_threshold(hash31, width):
    """The next hop a hash picks among ``width`` equal ones (``fib_select_multipath``)."""
    for i in range(width - 1):
        bound = ((np.uint64(i + 1) << np.uint64(31)) + np.uint64(width // 2)) \
            // np.uint64(width) - np.uint64(1)
        if hash31 <= bound:
            return i
    return width - 1


class KernelFlowKeys:
    """Each flow's multipath hashes on a ``linux`` data plane run of ECMP seed
    ``ecmp_seed``: its ports taken as the emulator's replayers take them (one
    `PortBook` for the run, a replay's flows in plan order, the server on the
    flow's source and the client on its destination), then hashed with the
    key of the routers and hosts, packed in one key per flow (see the module
    docstring).  They are the model's flow keys on a `ModelNetwork` made with
    ``kernel_multipath=True``."""

    def __init__(self, fabric, ecmp_seed: int):
        if ecmp_seed == 0:
            raise ValueError("ECMP seed 0 leaves ports and the hash key to the kernel: "
                             "there is no path to compute")
        self.book = PortBook(ecmp_seed)
        self.key = multipath_hash_seed(ecmp_seed)
        graph = fabric.graph
        self.ip: Dict[str, str] = {n: graph.nodes[n]["ip"] for n in graph.nodes
                                   if "ip" in graph.nodes[n]}

    def keys(self, prefix: str, dag) -> np.ndarray:
        """The hashes of the flows of ``dag``, in its order, with port keys
        ``prefix`` + the flow's id, as ``Replayer(port_key=prefix)`` takes
        them (in plan order: the DAG's topological order)."""
        ports = {f.id: (self.book.server(f.src, prefix + f.id),
                        self.book.client(f.dst, prefix + f.id))
                 for f in dag.topological_order()}
        flows = dag.flows
        src = [self.ip[f.src] for f in flows]
        dst = [self.ip[f.dst] for f in flows]
        routers = multipath_hashes(src, dst, [ports[f.id][0] for f in flows],
                                   [ports[f.id][1] for f in flows], self.key)
        return routers | (address_hashes(src, dst, self.key) << np.uint64(32))
