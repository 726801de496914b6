"""A per-host agent that forks armed iperf3 clients on demand.

Started once in each Mininet host that receives flows.  Forking an agent
that has already imported the iperf3 wrapper costs a few milliseconds of CPU,
where a fresh Python process per flow costs about a hundred: on a 2-core
machine that CPU is taken from the datapath being measured.

Protocol, JSON lines: stdin ``{"op": "arm", "id": ID, "spec": {...}}``
(a ``emu.live.iperf_worker.ClientSpec``; an optional ``"path"`` names the
file its result is kept in, ``RESULTS_DIR/ID.json`` by default: an agent
shared by several replays keeps each one's results with it),
``{"op": "go", "id": ID}``,
``{"op": "cancel", "id": ID}`` (unarmed or running: the flow ends with no
result), ``{"op": "quit"}``; stdout ``{"event": "ready"}``,
``{"event": "armed", "id": ID, "pid": PID}`` and
``{"event": "done", "id": ID, "path": FILE, "result": {...}}``: the child
hands its result to the agent through a pipe the moment its flow ends, and
the agent tells at once (waiting for the child to exit and be reaped took
12 ms here, on the critical path of every dependent flow); the result is
also kept in FILE.  A child that ends with no result
(cancelled, killed) is reported, without "result", when it is reaped.

    python -m emu.live.host_agent --results DIR
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import selectors
import signal
import sys
from typing import Dict

from emu.live.iperf_worker import ClientSpec, build_client, libiperf, run_client


def _child(spec: ClientSpec, go_fd: int, result_fd: int, path: str) -> None:
    client = build_client(spec)     # ready before go: a flow starts when told
    if not os.read(go_fd, 1):
        return  # the agent died before go: the flow must not start on its own
    result = json.dumps(run_client(spec, client))
    with os.fdopen(result_fd, "w") as to_agent:
        to_agent.write(result + "\n")
    tmp = path + ".tmp"
    with open(tmp, "w") as stream:
        stream.write(result)
    os.rename(tmp, path)


def _emit(event: dict) -> None:
    # Each line is far below PIPE_BUF, so lines from one writer never interleave.
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def serve(results_dir: str) -> int:
    import iperf3  # noqa: F401  (imported once here, inherited by every fork)
    ctypes.CDLL(libiperf())   # loaded once here too: a child's own load is then a lookup

    go_pipes: Dict[str, int] = {}
    results: Dict[str, _Result] = {}    # armed or running flows' result pipes
    children: Dict[int, str] = {}
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
    selector.register(wake_r, selectors.EVENT_READ, "child")
    _emit({"event": "ready"})
    # Read stdin through the raw descriptor: a buffered readline() could pull
    # several commands into Python's buffer, where select() no longer sees
    # them, and an "arm" followed at once by "go" would wait forever.
    stdin_fd, pending = sys.stdin.fileno(), b""
    while True:
        for key, _ in selector.select():
            if key.data == "child":
                os.read(wake_r, 4096)
                _reap(children, results, selector)
                continue
            if isinstance(key.data, _Result):
                if key.data.open:   # reaping may have drained it in this round
                    key.data.read(selector)
                continue
            chunk = os.read(stdin_fd, 65536)
            if not chunk:
                return 0
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip() and not _command(json.loads(line), go_pipes, results,
                                                 children, selector, results_dir):
                    return 0
        _reap(children, results, selector)


class _Result:
    """The read end of one child's result pipe, what has come through it, and
    the file the child keeps its result in."""

    def __init__(self, flow_id: str, fd: int, path: str):
        self.flow_id, self.fd, self.path, self.data = flow_id, fd, path, b""
        self.open = True
        self.told = False               # its "done" has gone out

    def read(self, selector) -> None:
        """Take what the pipe holds; tell "done" once a whole result line is in."""
        chunk = os.read(self.fd, 65536)
        self.data += chunk
        if chunk and not self.data.endswith(b"\n"):
            return
        self.close(selector)
        if chunk:       # a whole result line; at EOF without one, reaping tells
            self.told = True
            _emit({"event": "done", "id": self.flow_id, "path": self.path,
                   "result": json.loads(self.data)})

    def drain(self, selector) -> None:
        """The child has exited: read what it left (its write end is closed)."""
        while self.open:
            self.read(selector)

    def close(self, selector) -> None:
        if self.open:
            selector.unregister(self.fd)
            os.close(self.fd)
            self.open = False


def _command(command: dict, go_pipes: Dict[str, int], results: Dict[str, _Result],
             children: Dict[int, str], selector, results_dir: str) -> bool:
    """Carry out one command; False means quit."""
    op = command["op"]
    if op == "quit":
        return False
    if op == "arm":
        flow_id = command["id"]
        path = command.get("path") or os.path.join(results_dir, f"{flow_id}.json")
        go_r, go_w = os.pipe()
        result_r, result_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into the agent's loop
            code = 0
            try:
                # Hold no other flow's pipe ends: a go pipe closed by the
                # agent (cancel) must read as closed in its own child, and a
                # copy kept open here would hide that until this child exits.
                for fd in [go_w, result_r, *go_pipes.values(),
                           *(pipe.fd for pipe in results.values() if pipe.open)]:
                    os.close(fd)
                signal.set_wakeup_fd(-1)
                _child(ClientSpec(**command["spec"]), go_r, result_w, path)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(go_r)
        os.close(result_w)
        results[flow_id] = _Result(flow_id, result_r, path)
        selector.register(result_r, selectors.EVENT_READ, results[flow_id])
        go_pipes[flow_id] = go_w
        children[pid] = flow_id
        _emit({"event": "armed", "id": flow_id, "pid": pid})
    elif op == "go":
        fd = go_pipes.pop(command["id"])
        os.write(fd, b"g")
        os.close(fd)
    elif op == "cancel":
        # An armed child sees its go pipe close and exits without a flow; a
        # running one is killed.  Either is reaped and reported "done".
        fd = go_pipes.pop(command["id"], None)
        if fd is not None:
            os.close(fd)
        else:
            for pid, flow_id in children.items():
                if flow_id == command["id"]:
                    os.kill(pid, signal.SIGKILL)
    return True


def _reap(children: Dict[int, str], results: Dict[str, _Result], selector) -> None:
    """Reap exited children; tell "done" for each whose result never came."""
    while children:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        flow_id = children.pop(pid, None)
        if flow_id is None:
            continue
        pipe = results.pop(flow_id)
        pipe.drain(selector)
        if not pipe.told:
            _emit({"event": "done", "id": flow_id, "path": pipe.path})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emu.live.host_agent")
    parser.add_argument("--results", required=True, help="folder for per-flow result JSON")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    os.makedirs(args.results, exist_ok=True)
    return serve(args.results)


if __name__ == "__main__":
    sys.exit(main())
