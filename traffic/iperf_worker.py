"""One iperf3 endpoint, run inside a Mininet host's network namespace.

The iperf3 Python wrapper drives libiperf in-process, and a process can only
be in one namespace, so every flow gets a small worker process started with
``host.popen``.  Two settings the wrapper does not expose are set through its
own libiperf handle: the byte count (``-n``) and the pacing timer; interval
reports are switched off so that the JSON the wrapper captures through a pipe
stays small however long the flow.

    server: python -m traffic.iperf_worker server --bind IP --port P
    client: python -m traffic.iperf_worker client --dst IP --port P --bytes N [--reverse]
            prints {"armed": true}, waits for a line on stdin, runs, prints
            {"start": epoch, "end": epoch, "result": <iperf3 JSON>}
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time

CONNECT_RETRIES = 100
CONNECT_RETRY_S = 0.02


def _libiperf_extras(endpoint, num_bytes: int = 0, pacing_us: int = 0) -> None:
    lib, test = endpoint.lib, endpoint._test
    lib.iperf_set_test_reporter_interval.argtypes = (ctypes.c_void_p, ctypes.c_double)
    lib.iperf_set_test_stats_interval.argtypes = (ctypes.c_void_p, ctypes.c_double)
    lib.iperf_set_test_reporter_interval(test, 0.0)
    lib.iperf_set_test_stats_interval(test, 0.0)
    if num_bytes:
        lib.iperf_set_test_bytes.argtypes = (ctypes.c_void_p, ctypes.c_uint64)
        lib.iperf_set_test_bytes(test, num_bytes)
    if pacing_us:
        lib.iperf_set_test_pacing_timer.argtypes = (ctypes.c_void_p, ctypes.c_int)
        lib.iperf_set_test_pacing_timer(test, pacing_us)


def run_server(args) -> dict:
    import iperf3
    server = iperf3.Server()
    server.bind_address = args.bind
    server.port = args.port
    server.json_output = True
    _libiperf_extras(server)
    result = server.run()
    return {"result": result.json if result is not None else {"error": "no result"}}


def _client(args):
    import iperf3
    client = iperf3.Client()
    client.server_hostname = args.dst
    client.port = args.port
    client.json_output = True
    client.protocol = "udp" if args.udp else "tcp"
    client.reverse = args.reverse
    if args.blksize:
        client.blksize = args.blksize
    if args.rate_mbps:
        client.bandwidth = int(args.rate_mbps * 1e6)
    if args.bytes:
        client.duration = 0
        _libiperf_extras(client, num_bytes=args.bytes, pacing_us=args.pacing_us)
    else:
        client.duration = args.duration
        _libiperf_extras(client, pacing_us=args.pacing_us)
    return client


def run_client(args) -> dict:
    print(json.dumps({"armed": True}), flush=True)
    if args.wait_go and not sys.stdin.readline():
        return {"error": "replayer closed stdin before go"}
    start = time.time()
    for _ in range(CONNECT_RETRIES):
        result = _client(args).run().json
        error = result.get("error", "")
        # The server is armed before the client, but may still be starting up.
        if "unable to connect" not in error and "Connection refused" not in error:
            break
        time.sleep(CONNECT_RETRY_S)
        start = time.time()
    return {"start": start, "end": time.time(), "result": result}


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m traffic.iperf_worker")
    sub = parser.add_subparsers(dest="role", required=True)
    server = sub.add_parser("server")
    server.add_argument("--bind", required=True)
    server.add_argument("--port", type=int, required=True)
    client = sub.add_parser("client")
    client.add_argument("--dst", required=True)
    client.add_argument("--port", type=int, required=True)
    client.add_argument("--bytes", type=int, default=0)
    client.add_argument("--duration", type=int, default=10)
    client.add_argument("--rate-mbps", type=float, default=0.0)
    client.add_argument("--udp", action="store_true")
    client.add_argument("--blksize", type=int, default=0)
    client.add_argument("--pacing-us", type=int, default=0)
    client.add_argument("--reverse", action="store_true",
                        help="the server sends; the client receives and stops at --bytes")
    client.add_argument("--wait-go", action="store_true")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    output = run_server(args) if args.role == "server" else run_client(args)
    print(json.dumps(output), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
