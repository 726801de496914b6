"""A per-host agent that moves a DAG's flows over kept TCP connections.

A collective library's socket transport (NCCL's, Gloo's) opens one
connection per peer when a job starts and keeps it: each step of a ring is
a chunk written on a warm connection, sent the moment the chunk it depends
on has arrived.  `emu.live.replay` starts an iperf3 session per flow
instead, whose set-up, result exchange and hand-over through the runner
add tens of milliseconds to every step.  This agent is the kept-connection
transport: one per host, in its namespace, listening on one port.

Each flow is a header (its id and byte count) then its bytes, on the
connection from its source's agent to its destination's.  A flow is sent
when every flow it waits for has arrived (told by this agent itself when it
received them, or by the runner) and its delay after them has passed.  A
flow that follows at once one this agent wrote to the same peer goes as soon
as that one is written: on one connection its bytes cannot overtake the
earlier flow's, as a collective's next chunk queues behind the last on its
channel (NCCL does not wait for its own sends to land before the next one
either).  The receiver times the flow's last byte; the sender its first
write, so a flow's time includes any wait behind the one before it.

Protocol, JSON lines: stdin ``{"op": "flow", "id": ID, "dst": IP, "port": P,
"sport": P, "bytes": N, "after": [IDS], "delay_s": S, "t0": EPOCH}`` (send
it: at ``t0 + delay_s`` if it waits for nothing, else ``delay_s`` after the
last of ``after`` arrived; the connection to the peer, opened by the first
flow to it, binds ``sport`` when not 0: a port drawn from the run's ECMP
seed, `traffic.ports`), ``{"op": "done", "id": ID, "end": EPOCH}`` (a flow this
host did not receive has arrived), ``{"op": "quit"}``; stdout
``{"event": "ready"}``, ``{"event": "started", "id": ID, "start": EPOCH,
"sport": P, "dport": P}``, ``{"event": "written", "id": ID, "retransmits":
N}`` (the socket's while the flow was written), ``{"event": "received",
"id": ID, "end": EPOCH, "bytes": N}`` and ``{"event": "error", "id": ID,
"error": TEXT}``.

    python -m emu.live.peer_agent --bind IP --port P [--congestion CC]
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import threading
import time
from typing import Dict, List, Optional, Tuple

from emu.live.shaping import DATA_TOS

# A flow's header: the id's length and the byte count, then the id.
HEADER = struct.Struct("!HQ")
CHUNK = 256 * 1024
CONNECT_TIMEOUT_S = 10.0
# struct tcp_info: eight one-byte fields, then 32-bit ones; tcpi_total_retrans
# is the 24th of those (include/uapi/linux/tcp.h).
TCP_INFO_PREFIX = struct.Struct("=8B24I")


def frame(flow_id: str, num_bytes: int) -> bytes:
    name = flow_id.encode()
    return HEADER.pack(len(name), num_bytes) + name


def total_retransmits(sock: socket.socket) -> int:
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_PREFIX.size)
    return TCP_INFO_PREFIX.unpack(info[:TCP_INFO_PREFIX.size])[-1]


def data_socket(congestion: str = "") -> socket.socket:
    """A TCP socket in the links' data class, with the run's congestion control.

    No Nagle: a flow's last bytes, under a segment, must not wait for the
    acknowledgement of the ones before them (a delayed ACK is 40 ms here)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, DATA_TOS)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if congestion:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, congestion.encode())
    return sock


def _read_exactly(sock: socket.socket, count: int) -> Optional[bytes]:
    data = b""
    while len(data) < count:
        part = sock.recv(count - len(data))
        if not part:
            return None
        data += part
    return data


class Agent:
    """The state of one host's agent: its flows, what arrived, its connections."""

    def __init__(self, congestion: str = "", out=None, clock=time.time):
        self.congestion = congestion
        self.out = out or sys.stdout
        self.clock = clock
        self._emit_lock = threading.Lock()
        self._state = threading.Condition()
        self.arrived: Dict[str, float] = {}          # flow id -> when it arrived
        self.written: Dict[str, Tuple[str, int]] = {}  # flow id -> the peer it was written to
        self._peers: Dict[Tuple[str, int], Tuple[socket.socket, threading.Lock]] = {}
        self._peers_lock = threading.Lock()
        self._quitting = False

    # ------------------------------------------------------------ events
    def emit(self, event: dict) -> None:
        with self._emit_lock:
            self.out.write(json.dumps(event) + "\n")
            self.out.flush()

    def mark_arrived(self, flow_id: str, end: float) -> None:
        with self._state:
            self.arrived.setdefault(flow_id, end)
            self._state.notify_all()

    # ------------------------------------------------------------ receiving
    def serve(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return          # the listener closed: quitting
            threading.Thread(target=self.receive, args=(conn,), daemon=True).start()

    def receive(self, conn: socket.socket) -> None:
        """Read flows off one peer's connection until it closes."""
        buffer = bytearray(CHUNK)
        view = memoryview(buffer)
        with conn:
            while True:
                head = _read_exactly(conn, HEADER.size)
                if head is None:
                    return
                name_len, remaining = HEADER.unpack(head)
                name = _read_exactly(conn, name_len)
                if name is None:
                    return
                flow_id, total = name.decode(), remaining
                while remaining:
                    got = conn.recv_into(view[:min(remaining, CHUNK)])
                    if not got:
                        self.emit({"event": "error", "id": flow_id,
                                   "error": f"connection closed after {total - remaining} "
                                            f"of {total} bytes"})
                        return
                    remaining -= got
                end = self.clock()
                self.mark_arrived(flow_id, end)
                self.emit({"event": "received", "id": flow_id, "end": end, "bytes": total})

    # ------------------------------------------------------------ sending
    def connection(self, ip: str, port: int, sport: int = 0
                   ) -> Tuple[socket.socket, threading.Lock]:
        """The kept connection to a peer's agent, opened on first use (from local
        port ``sport``, or one the kernel picks)."""
        with self._peers_lock:
            if (ip, port) not in self._peers:
                sock = data_socket(self.congestion)
                if sport:
                    # The last run's connection may still be in TIME_WAIT here;
                    # with SO_REUSEADDR the kernel lets a bound port take over
                    # its four-tuple (TCP timestamps tell the two apart).
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    sock.bind(("0.0.0.0", sport))
                sock.settimeout(CONNECT_TIMEOUT_S)
                sock.connect((ip, port))
                sock.settimeout(None)
                self._peers[(ip, port)] = (sock, threading.Lock())
            return self._peers[(ip, port)]

    def due_at(self, after: List[str], delay_s: float, t0: float,
               peer: Tuple[str, int]) -> Optional[float]:
        """When a flow to ``peer`` may go: None while something it waits for has
        not arrived (or, followed at once on the same connection, been written)."""
        with self._state:
            ends = []
            for dep in after:
                if dep in self.arrived:
                    ends.append(self.arrived[dep])
                elif delay_s > 0 or self.written.get(dep) != peer:
                    return None
            return max(ends or [t0]) + delay_s

    def send(self, command: dict) -> None:
        """One flow: connect ahead, wait for its turn, write it."""
        flow_id = command["id"]
        peer = (command["dst"], int(command["port"]))
        try:
            sock, lock = self.connection(*peer, sport=int(command.get("sport", 0)))
            after, delay_s, t0 = command.get("after", []), float(command.get("delay_s", 0.0)), \
                float(command.get("t0", 0.0))
            with self._state:
                while not self._quitting and self.due_at(after, delay_s, t0, peer) is None:
                    self._state.wait()
                if self._quitting:
                    return
            while True:
                wait_s = self.due_at(after, delay_s, t0, peer) - self.clock()
                if wait_s <= 0:
                    break
                time.sleep(wait_s)
            with lock:
                before = total_retransmits(sock)
                sport, dport = sock.getsockname()[1], sock.getpeername()[1]
                start = self.clock()
                self.emit({"event": "started", "id": flow_id, "start": start,
                           "sport": sport, "dport": dport})
                sock.sendall(frame(flow_id, int(command["bytes"])))
                remaining = int(command["bytes"])
                zeros = memoryview(bytes(CHUNK))
                while remaining:
                    count = min(remaining, CHUNK)
                    sock.sendall(zeros[:count])
                    remaining -= count
                retransmits = total_retransmits(sock) - before
                with self._state:
                    self.written[flow_id] = peer
                    self._state.notify_all()
            self.emit({"event": "written", "id": flow_id, "retransmits": retransmits})
        except OSError as exc:
            self.emit({"event": "error", "id": flow_id, "error": f"{type(exc).__name__}: {exc}"})

    # ------------------------------------------------------------ commands
    def handle(self, command: dict) -> bool:
        """Carry out one command; False on quit."""
        op = command.get("op")
        if op == "flow":
            threading.Thread(target=self.send, args=(command,), daemon=True).start()
        elif op == "done":
            self.mark_arrived(command["id"], float(command["end"]))
        elif op == "quit":
            with self._state:
                self._quitting = True
                self._state.notify_all()
            return False
        else:
            self.emit({"event": "error", "id": command.get("id", ""),
                       "error": f"unknown op {op!r}"})
        return True

    def close(self) -> None:
        with self._peers_lock:
            for sock, _ in self._peers.values():
                sock.close()
            self._peers.clear()


def listen(bind: str, port: int) -> socket.socket:
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((bind, port))
    listener.listen(64)
    return listener


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emu.live.peer_agent",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--bind", required=True, help="this host's address")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--congestion", default="", help="TCP congestion control")
    args = parser.parse_args(argv)
    agent = Agent(args.congestion)
    listener = listen(args.bind, args.port)
    threading.Thread(target=agent.serve, args=(listener,), daemon=True).start()
    agent.emit({"event": "ready"})
    try:
        for line in sys.stdin:
            if line.strip() and not agent.handle(json.loads(line)):
                break
    finally:
        listener.close()
        agent.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
