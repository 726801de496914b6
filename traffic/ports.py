"""Transport ports drawn from the run's ECMP seed, so that a run's paths repeat.

Every fabric spreads flows over its equal-cost paths by hashing each
packet's five-tuple: the kernel routers (``fib_multipath_hash_policy=3``)
and Open vSwitch's select groups alike.  A flow's addresses and protocol
are fixed by the plan; its ports are not.  Left to the kernel, a client's
port is a random ephemeral one, so the same flow takes another path on
every run, two flows share a link in one run and not in the next, and a
comparison repeated three times measures the ECMP draw as much as the
fabric.

With a seed (``testbed.ecmp_seed``, not 0) every port is a function of the
seed and of the flow's name:

* a flow's server listens on a port of `SERVER_PORTS`, its client binds one
  of `CLIENT_PORTS`, each drawn by hashing (seed, flow id); so the same
  flow takes the same path in every replay and every run of one seed, and
  another seed is another draw of every flow's path;
* `CLIENT_PORTS` lies below the kernel's ephemeral range (32768-60999 by
  default), so a port bound here never meets one the kernel picked for a
  control connection;
* a book never hands out one port twice on one host: a port already taken
  moves the flow to the next free one up.  Replayers take their flows'
  ports in plan order before the first starts, so even that is the same
  from one run to the next.

Seed 0 keeps the kernel's ways: clients get ephemeral ports (`client` gives
0) and the kernel routers their boot's random hash key.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from typing import Dict, Set, Tuple

SERVER_PORTS = range(5201, 20000)
CLIENT_PORTS = range(20000, 32768)
#: The kernel's own multipath hash key when the seed is 0 ("the kernel's ways").
KERNEL_SEED = 0
#: Kernels before 6.11 have no settable multipath hash key: their routers
#: hash with the boot's random one.
MULTIPATH_SEED_SYSCTL = Path("/proc/sys/net/ipv4/fib_multipath_hash_seed")


def draw(seed: int, key: str, ports: range) -> int:
    """A port of ``ports`` drawn from ``seed`` and ``key`` (a stable hash: the
    same on every machine and in every process, unlike Python's ``hash``)."""
    digest = hashlib.blake2b(f"{seed}/{key}".encode(), digest_size=8).digest()
    return ports[int.from_bytes(digest, "big") % len(ports)]


def multipath_hash_seed(seed: int) -> int:
    """The key the kernel routers hash five-tuples with
    (``net.ipv4.fib_multipath_hash_seed``): a nonzero 32-bit number drawn from
    the run's seed, or 0 (the kernel's random key) for seed 0."""
    if seed == KERNEL_SEED:
        return 0
    digest = hashlib.blake2b(f"{seed}/multipath".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") or 1


class PortBook:
    """The ports handed out on each host, for one replay or for several that
    run side by side (thread-safe).  See the module docstring."""

    def __init__(self, seed: int):
        if seed < 0:
            raise ValueError(f"ECMP seed must be 0 or more, not {seed}")
        self.seed = seed
        self._taken: Dict[Tuple[str, int], Set[int]] = {}
        self._lock = threading.Lock()

    def server(self, host: str, key: str) -> int:
        """The port ``key``'s server listens on, on ``host``."""
        return self._take(host, f"server/{key}", SERVER_PORTS)

    def client(self, host: str, key: str) -> int:
        """The port ``key``'s client binds on ``host``; 0 (the kernel picks one)
        for seed 0."""
        if self.seed == KERNEL_SEED:
            return 0
        return self._take(host, f"client/{key}", CLIENT_PORTS)

    def _take(self, host: str, key: str, ports: range) -> int:
        with self._lock:
            taken = self._taken.setdefault((host, ports.start), set())
            if len(taken) >= len(ports):
                raise RuntimeError(f"{host}: every port of {ports.start}..{ports.stop - 1} "
                                   "is taken in this run")
            port = draw(self.seed, key, ports)
            while port in taken:
                port = ports.start + (port - ports.start + 1) % len(ports)
            taken.add(port)
            return port
