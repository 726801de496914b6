"""iperf3 clients through the iperf3 Python wrapper, inside a host's namespace.

The wrapper drives libiperf in-process, and a process lives in one network
namespace, so clients run in processes started in the Mininet host: either
one per flow (this module's command line) or forked by a per-host agent
(``emu.live.host_agent``), which keeps Python start-up off the CPU budget.

Settings the wrapper does not expose are set through its own libiperf
handle: the byte count (``-n``), the pacing timer, the TCP congestion control
(``-C``; the client passes it to the server, which sends in reverse mode),
the kernel's pacing of a TCP socket (``--fq-rate``: smooth, where
iperf3's own ``-b`` sends in bursts), the socket buffers (``-w``) and the
data stream's client port (``--cport``: a port drawn from the run's ECMP
seed, `traffic.ports`).  Interval reports are
switched off, so that the JSON the wrapper captures through a pipe stays
small however long the flow.

Servers are the iperf3 binary in one-off mode (``server_command``): the
measurement is the client's JSON (which carries the receiver's figures), and
a C process per flow costs far less CPU than a Python one on a 2-core
machine whose other core forwards every packet.

    python -m emu.live.iperf_worker --dst IP --port P (--bytes N | --duration S)
           [--reverse] [--udp] [--rate-mbps R] [--blksize B] [--pacing-us U]
           [--congestion CC] [--fq-rate-mbps R] [--cport P] [--wait-go]
    prints {"armed": true}; with --wait-go waits for a line on stdin; runs;
    prints {"start": epoch, "end": epoch, "result": <iperf3 JSON>}
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import functools
import json
import sys
import time
from dataclasses import asdict, dataclass
from typing import List

from emu.live.shaping import DATA_TOS

CONNECT_RETRIES = 100
CONNECT_RETRY_S = 0.02


SERVER_READY = "Server listening"

# iperf3's default TCP block: the sender writes whole blocks until its byte
# count is reached.
LARGEST_BLOCK = 128 * 1024


def exact_blocks(num_bytes: int, largest: int = LARGEST_BLOCK) -> int:
    """A block size whose whole blocks add up to ``num_bytes`` (within a byte per block).

    A sender of whole 128 KiB blocks overshoots a byte count by up to a
    block: 80 KB for a 312.5 KB flow.  The receiver stops at the count, but
    the rest is already queued at the sender's link, so the next flow on that
    link (the next step of a collective) waits behind up to a block of bytes
    nobody reads: 65 ms at 10 Mbit/s.
    """
    if num_bytes <= 0:
        raise ValueError(f"byte count must be positive, not {num_bytes}")
    blocks = -(-num_bytes // largest)
    return -(-num_bytes // blocks)


def server_command(bind_ip: str, port: int) -> List[str]:
    """A one-off iperf3 server: serves exactly one test, then exits.

    ``--forceflush`` makes it print SERVER_READY at once even into a pipe, so
    a client is started only once the server listens.
    """
    return ["iperf3", "--server", "--one-off", "--forceflush", "--bind", bind_ip,
            "--port", str(port)]


@dataclass
class ClientSpec:
    dst: str
    port: int
    bytes: int = 0
    duration: int = 10
    reverse: bool = False
    udp: bool = False
    rate_mbps: float = 0.0
    blksize: int = 0
    pacing_us: int = 0
    congestion: str = ""
    fq_rate_mbps: float = 0.0     # TCP: the kernel paces the socket (SO_MAX_PACING_RATE)
    window_bytes: int = 0         # TCP: both ends' socket buffers (iperf3 -w); 0: autotuned
    cport: int = 0                # the data stream's client port (iperf3 --cport); 0: kernel's

    def to_json(self) -> str:
        return json.dumps(asdict(self))


def _set(client, setting: str, ctype, value) -> None:
    """Call libiperf's ``iperf_set_test_<setting>`` on the client's test."""
    setter = getattr(client.lib, f"iperf_set_test_{setting}")
    setter.argtypes = (ctypes.c_void_p, ctype)
    setter(client._test, value)


def _libiperf_extras(client, num_bytes: int, pacing_us: int, congestion: str = "",
                     fq_rate_mbps: float = 0.0, window_bytes: int = 0, cport: int = 0) -> None:
    _set(client, "reporter_interval", ctypes.c_double, 0.0)
    _set(client, "stats_interval", ctypes.c_double, 0.0)
    if num_bytes:
        _set(client, "bytes", ctypes.c_uint64, num_bytes)
    if pacing_us:
        _set(client, "pacing_timer", ctypes.c_int, pacing_us)
    if fq_rate_mbps:
        _set(client, "fqrate", ctypes.c_uint64, int(fq_rate_mbps * 1e6))
    if window_bytes:
        # As iperf3 -w: the client sets its socket's buffers and sends the size
        # to the server, which sets its own; in reverse mode the client is the
        # receiver, whose buffer bounds the window it advertises.
        _set(client, "socket_bufsize", ctypes.c_int, window_bytes)
    if cport:
        # Only the data stream binds it; the control connection keeps an
        # ephemeral port (libiperf dials it with none).
        _set(client, "bind_port", ctypes.c_int, cport)
    if congestion:
        # libiperf keeps the pointer: the buffer lives as long as the client.
        client._congestion = ctypes.create_string_buffer(congestion.encode())
        _set(client, "congestion_control", ctypes.c_char_p, client._congestion)


@functools.lru_cache(maxsize=None)
def libiperf() -> str:
    """libiperf's file name, looked up once per process (and inherited by a
    host agent's forks).

    The wrapper, given none, asks ``ctypes.util.find_library("libiperf")``
    for every client: a name it never finds, after running ``ldconfig``,
    ``gcc`` and ``ld`` in turn.  That took 10 ms per client here on an idle
    machine, and far more in a forked client on a busy one, where it sat
    between a resent flow's go and its first byte.
    """
    return ctypes.util.find_library("iperf") or "libiperf.so.0"


def build_client(spec: ClientSpec):
    import iperf3
    client = iperf3.Client(lib_name=libiperf())
    client.server_hostname = spec.dst
    client.port = spec.port
    client.json_output = True
    client.protocol = "udp" if spec.udp else "tcp"
    client.reverse = spec.reverse
    if spec.blksize:
        client.blksize = spec.blksize
    elif spec.bytes and not spec.udp:
        client.blksize = exact_blocks(spec.bytes)
    if spec.rate_mbps:
        client.bandwidth = int(spec.rate_mbps * 1e6)
    # With a byte count the test must have no duration, as `iperf3 -n` does.
    client.duration = 0 if spec.bytes else max(1, int(spec.duration))
    _libiperf_extras(client, spec.bytes, spec.pacing_us, spec.congestion, spec.fq_rate_mbps,
                     spec.window_bytes, spec.cport)
    # The data stream's DSCP puts it in the links' data queue; the control
    # connection, without one, rides the signalling class (emu.live.shaping).
    _set(client, "tos", ctypes.c_int, DATA_TOS)
    return client


def run_client(spec: ClientSpec, client=None) -> dict:
    """Run one test; retry while the one-off server is still starting up.

    ``client`` is one `build_client` made ahead: building one loads libiperf
    and looks it up with ``ldconfig`` (about 18 ms here), which would
    otherwise delay every flow's start.

    A test that could not connect is tried again (its server may still be
    starting); if every try fails, the error says what the first one met.
    That is the cause: once a try's control connection got through, the
    one-off server took its one test, and the tries after it were refused
    whatever had gone wrong ("unable to connect stream: No route to host"
    under a routing loop showed as "Connection refused").
    """
    first_error = ""
    for tries in range(1, CONNECT_RETRIES + 1):
        client = client or build_client(spec)
        start = time.time()
        result = client.run().json
        client = None               # a libiperf test runs once
        error = result.get("error", "")
        if "unable to connect" not in error and "Connection refused" not in error:
            break
        first_error = first_error or error
        time.sleep(CONNECT_RETRY_S)
    else:
        if first_error != error:
            result["error"] = f"{first_error} (then {tries - 1} more tries, the last: {error})"
    return {"start": start, "end": time.time(), "result": result}


def parse_args(argv) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m emu.live.iperf_worker",
                                     description="one iperf3 client test, JSON on stdout")
    parser.add_argument("--dst", required=True, help="server address")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bytes", type=int, default=0, help="bytes to move (iperf3 -n)")
    parser.add_argument("--duration", type=int, default=10, help="seconds, without --bytes")
    parser.add_argument("--reverse", action="store_true",
                        help="the server sends; the client receives and stops at --bytes")
    parser.add_argument("--udp", action="store_true")
    parser.add_argument("--rate-mbps", type=float, default=0.0)
    parser.add_argument("--blksize", type=int, default=0)
    parser.add_argument("--pacing-us", type=int, default=0)
    parser.add_argument("--congestion", default="", help="TCP congestion control (iperf3 -C)")
    parser.add_argument("--fq-rate-mbps", type=float, default=0.0,
                        help="TCP: the kernel paces the socket at this rate (iperf3 --fq-rate)")
    parser.add_argument("--cport", type=int, default=0,
                        help="the data stream's client port (iperf3 --cport); 0: the kernel's")
    parser.add_argument("--wait-go", action="store_true", help="wait for a line on stdin")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = vars(parse_args(sys.argv[1:] if argv is None else argv))
    wait_go = args.pop("wait_go")
    spec = ClientSpec(**args)
    print(json.dumps({"armed": True}), flush=True)
    if wait_go and not sys.stdin.readline():
        print(json.dumps({"error": "stdin closed before go"}), flush=True)
        return 1
    print(json.dumps(run_client(spec)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
