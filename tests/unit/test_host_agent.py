"""The per-host agent with real iperf3 clients and a one-off server on loopback (no root)."""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import threading
from dataclasses import asdict
from pathlib import Path

import pytest

from emu.live.waiting import wait_until

from emu.live.iperf_worker import SERVER_READY, ClientSpec, server_command

pytestmark = pytest.mark.skipif(shutil.which("iperf3") is None, reason="needs iperf3")
REPO = Path(__file__).resolve().parents[2]
SERVER_IP = "127.0.0.2"


class Agent:
    def __init__(self, results: Path):
        self.proc = subprocess.Popen([sys.executable, "-m", "emu.live.host_agent",
                                      "--results", str(results)], cwd=REPO, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.events: "queue.Queue" = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        assert self.next(10)["event"] == "ready"

    def _pump(self):
        for line in self.proc.stdout:
            self.events.put(json.loads(line))
        self.events.put({"event": "exit"})

    def send(self, **command):
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()

    def next(self, timeout_s: float) -> dict:
        return self.events.get(timeout=timeout_s)

    def until(self, kind: str, flow_id: str, timeout_s: float) -> dict:
        while True:
            event = self.next(timeout_s)
            if event["event"] == kind and event.get("id") == flow_id:
                return event

    def quit(self) -> list:
        self.send(op="quit")
        self.proc.wait(timeout=10)
        rest = []
        while True:
            event = self.next(5)
            if event["event"] == "exit":
                return rest
            rest.append(event)


@pytest.fixture
def agent(tmp_path):
    agent = Agent(tmp_path)
    yield agent
    if agent.proc.poll() is None:
        agent.proc.kill()
        agent.proc.wait()


def _server(port: int) -> subprocess.Popen:
    server = subprocess.Popen(server_command(SERVER_IP, port), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    for line in server.stdout:
        if SERVER_READY in line:
            return server
    raise AssertionError("iperf3 server did not start")


def _spec(port: int, num_bytes: int = 100_000) -> dict:
    return asdict(ClientSpec(dst=SERVER_IP, port=port, bytes=num_bytes, reverse=True))


def test_done_carries_the_result_once_and_the_file_keeps_it(agent, tmp_path):
    server = _server(5391)
    try:
        agent.send(op="arm", id="f1", spec=_spec(5391))
        agent.until("armed", "f1", 10)
        agent.send(op="go", id="f1")
        done = agent.until("done", "f1", 20)
    finally:
        server.wait(timeout=10)
    received = done["result"]["result"]["end"]["sum_received"]["bytes"]
    assert received == 100_000
    assert done["result"]["start"] <= done["result"]["end"]
    # The child tells the agent first and writes the file after (the agent's
    # "done" is on the critical path of every dependent flow): wait for it.
    wait_until(lambda: Path(done["path"]).is_file(), 5, "the result file")
    assert json.loads(Path(done["path"]).read_text()) == done["result"]
    assert Path(done["path"]) == tmp_path / "f1.json"
    later = agent.quit()
    assert not [e for e in later if e["event"] == "done"], "reaping told 'done' a second time"


def test_a_cancelled_flow_ends_while_a_flow_armed_after_it_still_waits(agent):
    # The second child is forked while the first one's go pipe is open; had it
    # kept a copy, closing the pipe (cancel) would not reach the first child.
    agent.send(op="arm", id="first", spec=_spec(5392))
    agent.until("armed", "first", 10)
    agent.send(op="arm", id="second", spec=_spec(5393))
    agent.until("armed", "second", 10)
    agent.send(op="cancel", id="first")
    done = agent.until("done", "first", 5)
    assert "result" not in done, "a cancelled flow has no result"
    agent.send(op="cancel", id="second")
    assert "result" not in agent.until("done", "second", 5)
