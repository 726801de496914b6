"""The load of every link over a run, sampled from the switches' port counters.

A run's flows say how fast each transfer went, not where the fabric was busy:
two flows that met on one uplink, a spine left idle by the ECMP hash, the
links a circuit change emptied.  :class:`LoadSampler` records that: every
``interval_s`` (0.5 s by default) it reads the bytes every switch port has
sent and writes, per port that the fabric wires to a link, the rate it sent
at toward its peer since the previous sample::

    sampler = LoadSampler(bed.counters, bed.fabric, run_dir / LOAD_FILE,
                          on_sample=lambda sample: feed.emit("load", **sample)).start()
    ...                                   # the experiment's traffic
    sampler.stop()                        # one last sample, then the file is closed

Why port counters: the switches count every byte they send, whichever flow,
path or data plane sent it (OpenFlow port stats on Open vSwitch, the
interfaces' statistics on the kernel routers; `emu.live.testbed.Testbed.counters`
returns either), so sampling them costs one control call per interval and
no capture.  Each direction of a link is measured at its switch end: the
switch port's transmit counter for what the switch sends, and, since a
host's NIC has no counter the controller reads, the receive counter of the
switch port a host sends into for the host's side.

The file, ``load.csv``: a header, then one row per wired switch port for each
sample after the first (the first is the baseline the second is measured
from)::

    t,node,port,peer,peer_port,bytes,mbps
    1700000000.512345,s1,3,s5,1,104857600,16.0
    1700000000.512345,h1,1,s1,1,52428800,8.0

* ``t``: the sample's epoch time in seconds (6 decimals), the middle of the
  counters call;
* ``node``, ``port``: the sending end (a switch, an OCS or a host); ``peer``,
  ``peer_port``: what the fabric wires it to;
* ``bytes``: that direction's byte counter at ``t`` (emulated bytes; see above
  for a host's side);
* ``mbps``: emulated Mbit/s sent from ``node:port`` toward the peer since
  the previous sample, over the *measured* time between the two (a counter
  that went down, a reset, counts as 0).

A direction the counters did not report in this sample or the previous one gets
no row.  Each sample is flushed as written, so an interrupted run keeps the
samples taken up to then.  A counters call that raises (the controller has
gone) ends the sampling quietly: the file keeps what was written and
``error`` says why.
"""

from __future__ import annotations

import csv
import logging
import math
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Tuple

from topologies.fabric import HOST, Fabric

LOG = logging.getLogger("emu.loadlog")

LOAD_FILE = "load.csv"
LOAD_COLUMNS = ("t", "node", "port", "peer", "peer_port", "bytes", "mbps")
DEFAULT_INTERVAL_S = 0.5

# (node, port, peer, peer_port): one direction of a link, as node sends on it.
WiredPort = Tuple[str, int, str, int]
# {switch: {port: {"tx_bytes": int, ...}}}, as `Testbed.counters` returns them.
Counters = Mapping[str, Mapping[int, Mapping[str, int]]]


def wired_ports(fabric: Fabric) -> List[WiredPort]:
    """Both directions of every link that has a switch end, switch by switch, in port
    order: the switch's sending side, then a host's side of a host link."""
    ports = []
    for switch in fabric.switches:
        for port, (peer, peer_port) in sorted(fabric.ports_of(switch).items()):
            ports.append((switch, port, peer, peer_port))
            if fabric.kind(peer) == HOST:
                ports.append((peer, peer_port, switch, port))
    return ports


def sent_bytes(counters: Counters, fabric: Fabric) -> Dict[Tuple[str, int], int]:
    """Bytes sent so far on every link direction the counters tell:
    ``{(node, port): bytes}``.  A switch port's own transmit counter; for a host's
    NIC, which has no counter the controller reads, the receive counter of the
    switch port it enters."""
    # int(port): the control channel's JSON has string keys; Testbed converts
    # them, but a caller that passes the reply through should measure the same.
    sent = {}
    for switch, ports in counters.items():
        for port, values in ports.items():
            port = int(port)
            if "tx_bytes" in values:
                sent[(switch, port)] = int(values["tx_bytes"])
            peer = fabric.ports_of(switch).get(port) if switch in fabric.graph else None
            if peer is not None and fabric.kind(peer[0]) == HOST and "rx_bytes" in values:
                sent[peer] = int(values["rx_bytes"])
    return sent


def link_rates(ports: List[WiredPort], before: Mapping[Tuple[str, int], int],
               after: Mapping[Tuple[str, int], int],
               seconds: float) -> List[Tuple[str, int, str, int, float]]:
    """Mbit/s each link direction carried over ``seconds`` between two readings of
    `sent_bytes`.

    ``[(node, port, peer, peer_port, mbps)]`` in the order of ``ports``; one
    missing from either reading is left out, and a counter that went down (the
    port was reset) gives 0 rather than a negative rate.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds!r}")
    rates = []
    for switch, port, peer, peer_port in ports:
        key = (switch, port)
        if key in before and key in after:
            sent = max(0, after[key] - before[key])
            rates.append((switch, port, peer, peer_port, sent * 8 / seconds / 1e6))
    return rates


class LoadSampler:
    """Samples the load of every wired switch port into ``path`` (``load.csv``).

    ``read_counters()`` returns ``{switch: {port: {"tx_bytes": int, ...}}}``
    (`emu.live.testbed.Testbed.counters`).  :meth:`start` takes the baseline
    sample and starts a daemon thread that samples every ``interval_s`` on a
    fixed grid (each deadline is the previous one plus the interval, so the
    samples do not drift by the time each takes; a deadline missed by a slow
    call is skipped).  :meth:`stop` takes one last sample and closes the file.
    ``on_sample(sample)`` is called after each sample that measured a rate
    with ``{"t", "interval_s", "links": [[node, port, peer, peer_port,
    mbps], ...]}`` (every wired port the counters reported, idle ones with
    0).  ``clock`` (epoch seconds) exists for tests, which drive
    :meth:`sample` by hand.
    """

    def __init__(self, read_counters: Callable[[], Counters], fabric: Fabric, path: Path,
                 interval_s: float = DEFAULT_INTERVAL_S,
                 on_sample: Optional[Callable[[dict], None]] = None,
                 clock: Callable[[], float] = time.time):
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) \
                or not math.isfinite(interval_s) or interval_s <= 0:
            raise ValueError(f"interval_s must be a positive finite number of seconds, "
                             f"got {interval_s!r}")
        self.read_counters = read_counters
        self.fabric = fabric
        self.ports = wired_ports(fabric)
        self.path = Path(path)
        self.interval_s = float(interval_s)
        self.on_sample = on_sample
        self.clock = clock
        self.error: Optional[str] = None        # why sampling ended early, if it did
        self.samples = 0                         # samples written (the baseline is not)
        self._previous: Optional[Tuple[float, Dict[Tuple[str, int], int]]] = None
        self._lock = threading.Lock()            # one sample at a time: the thread's or stop()'s
        self._stopping = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._stream = None
        self._writer = None

    # ------------------------------------------------------------ lifecycle
    def start(self) -> "LoadSampler":
        """Write the header, take the baseline sample and start sampling; returns self."""
        if self._stream is not None or self._stopping.is_set():
            raise RuntimeError("LoadSampler already started; use a new one")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._stream = open(self.path, "w", newline="")
        self._writer = csv.writer(self._stream)
        self._writer.writerow(LOAD_COLUMNS)
        self._stream.flush()
        # The baseline is taken here, not in the thread, so that the first
        # interval covers everything the caller does after start() returns.
        self.sample()
        # The grid starts at the baseline, so each interval is interval_s long.
        anchor = self._previous[0] if self._previous is not None else self.clock()
        self._thread = threading.Thread(target=self._run, args=(anchor,),
                                        name="load-sampler", daemon=True)
        self._thread.start()
        return self

    def _run(self, anchor: float) -> None:
        deadline = anchor
        while True:
            deadline += self.interval_s
            now = self.clock()
            if deadline < now:
                # A slow counters call overran the next deadlines: keep to the grid.
                deadline += math.ceil((now - deadline) / self.interval_s) * self.interval_s
            if self._stopping.wait(deadline - now):
                return      # stop() was called, or the counters failed (sample() set it)
            self.sample()

    def stop(self) -> None:
        """Stop the thread, take one last sample and close the file; harmless twice."""
        if self._stream is None:
            return
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        with self._lock:
            self._stream.close()
            self._stream = self._writer = None

    def __enter__(self) -> "LoadSampler":
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    # ------------------------------------------------------------ sampling
    def sample(self) -> Optional[dict]:
        """Read the counters now and write the rates since the previous sample.

        Returns what ``on_sample`` was given, or None for the baseline, a
        sample that measured no time, or once sampling has ended.
        """
        with self._lock:
            if self._stream is None or self.error is not None:
                return None
            before = self.clock()
            try:
                reading = sent_bytes(self.read_counters(), self.fabric)
            except Exception as exc:   # the controller has gone: keep what was written
                self.error = f"{type(exc).__name__}: {exc}"
                LOG.info("load sampling ended: %s", self.error)
                self._stopping.set()
                return None
            now = (before + self.clock()) / 2     # the counters were read during the call
            previous, self._previous = self._previous, (now, reading)
            if previous is None or now <= previous[0]:
                return None       # the baseline, or a clock that went back: no interval
            interval = now - previous[0]
            rates = [(switch, port, peer, peer_port, round(mbps, 6))
                     for switch, port, peer, peer_port, mbps
                     in link_rates(self.ports, previous[1], reading, interval)]
            stamp = f"{now:.6f}"
            self._writer.writerows(
                (stamp, switch, port, peer, peer_port, reading[(switch, port)], mbps)
                for switch, port, peer, peer_port, mbps in rates)
            self._stream.flush()   # a run can be interrupted: keep every sample taken
            self.samples += 1
            sample = {"t": now, "interval_s": interval, "links": [list(r) for r in rates]}
        if self.on_sample is not None:
            try:
                self.on_sample(sample)
            except Exception:   # a watcher's bug must not cost the run its record
                LOG.exception("load on_sample failed; no more samples are handed to it")
                self.on_sample = None
        return sample
