"""The OCS probe's sender: minimum-size frames into OCS ports, at a fixed pace.

Run inside a ToR's namespace, it writes `traffic.measure.darkwindow.frame`
frames on a packet socket bound to each of the given uplinks, in turn, on
an absolute schedule.  ``PACKET_QDISC_BYPASS`` hands each frame straight to
the interface: the ToR's shaping (an HTB class at the link's emulated rate)
would otherwise space them by its own rate, not the probe's, and delay them
behind whatever it holds.  So the frames reach the OCS port spaced by the
pace alone, and the capture there resolves an edge to one period of the
pace per port (the pace divided among the interfaces).

The sender busy-waits under SCHED_FIFO: sleeping would not keep a 10 us
pace, and at the normal priority any other task that woke up on its core
(tcpdump, the controller) left gaps of 0.5-1 ms.  Each frame is received on
the other end of the veth inside the sender's own send call (the softirq
runs as the call re-enables it), so the OCS's program meets it at once.
It holds a core while it runs, so runs stay short, around the moment
measured; and the kernel lets a real-time task run at most 0.95 s of every
second, so every ``BREATH_EVERY_S`` the sender sleeps ``BREATH_S`` on its
own terms rather than be stopped for 50 ms at a random point.  A late frame
only widens the gap it ends, which the analysis reports as that edge's
resolution.

    python -m emu.live.rawprobe --dev s1-eth3 [--dev s1-eth4] --pps 100000 --duration 2
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys
import time

from traffic.measure.darkwindow import frame

SOL_PACKET = 263
PACKET_QDISC_BYPASS = 20
MAX_PPS = 400_000
PRIORITY = 10                 # SCHED_FIFO, below the kernel's own threads
BREATH_EVERY_S, BREATH_S = 0.8, 0.02
READY = "rawprobe ready"


def send(devices, pps: float, duration_s: float) -> int:
    sockets = []
    for dev in devices:
        sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        sock.setsockopt(SOL_PACKET, PACKET_QDISC_BYPASS, 1)
        try:
            sock.bind((dev, 0))
        except OSError as exc:
            raise SystemExit(f"rawprobe: --dev {dev}: {exc.strerror}") from None
        # (name, protocol, packet type, hardware type, address): the port's MAC.
        sockets.append((sock.send, sock.getsockname()[4]))
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(PRIORITY))
    except (PermissionError, OSError):
        pass
    # A collection of the cyclic garbage collector is a pause of its own.
    gc.disable()
    period = int(1e9 / pps)
    total = int(duration_s * pps)
    print(READY, flush=True)
    mono = time.monotonic_ns
    due = mono()
    breath_at = due + int(BREATH_EVERY_S * 1e9)
    sent = 0
    for seq in range(total):
        while mono() < due:
            pass
        if due >= breath_at:
            time.sleep(BREATH_S)
            due = mono()
            breath_at = due + int(BREATH_EVERY_S * 1e9)
        write, mac = sockets[seq % len(sockets)]
        try:
            write(frame(mac, seq, mono()))
            sent += 1
        except OSError:        # a port going down mid-run: the gap shows it
            pass
        due += period
    return sent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emu.live.rawprobe",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--dev", action="append", required=True,
                        help="interface to send on (repeat: frames go round them)")
    parser.add_argument("--pps", type=float, default=100_000.0)
    parser.add_argument("--duration", type=float, required=True, help="seconds")
    args = parser.parse_args(argv)
    if not 0 < args.pps <= MAX_PPS:
        parser.error(f"--pps must be in (0, {MAX_PPS}]")
    if not 0 < args.duration <= 600:
        parser.error("--duration must be in (0, 600] seconds")
    sent = send(args.dev, args.pps, args.duration)
    print(f"sent {sent}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
