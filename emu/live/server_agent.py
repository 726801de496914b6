"""The testbed's agent on another server of a cluster run, reached over ssh.

    runner (first server)                         server 2
    emu.live.cluster.Cluster  --ssh, stdin-->  python -m emu.live.server_agent
                              <--stdout, JSON    holds server 2's run lock,
                                 lines           records what the run starts,
                                                 cleans it up when stdin ends

Mininet Cluster Edition starts the remote nodes' shells over ssh by itself;
what it does not do is what the testbed does on its own machine around
them: hold the run lock, remove a killed run's leftovers, record the pids
it must stop, run ``ip``/``tc`` batches in many namespaces at once, point
the bridges at the controller, read the CPU and the clock.  One agent per
server does that, as one process whose life is the run's: when its stdin
ends (the runner finished, crashed or was killed, and ssh closed the
channel) it cleans up the server by our prefix and pid files, as
``emu.clean`` does on the first server, and never by ``mn -c``.

``--probe`` prints what the runner's pre-flight checks need (version, OVS,
mnexec, the lock, GRE) as one JSON object and exits without creating
anything.

Requests are JSON lines ``{"op": ..., ...}``; each gets one reply line,
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from typing import List, Optional

from emu.live import listening, ovs, shaping, state

BRIDGE_NAME = state.BRIDGE_RE
CONTROLLER_TARGET = re.compile(r"^tcp:127\.0\.0\.1:\d{1,5}$")
IPV4 = re.compile(r"^\d{1,3}(\.\d{1,3}){3}$")
# What a remote dump may run: the data plane's own listing tools.
DUMP_TOOLS = ("ovs-ofctl", "ovs-vsctl", "ovs-appctl", "ip", "tc")
IPERF_LISTEN_TIMEOUT_S = 5.0


class AgentError(RuntimeError):
    """A request the agent refuses or could not carry out."""


INTERFACE = re.compile(r"^[A-Za-z0-9_.-]{1,15}$")
VXLAN_PORT = 4789


def tunnel_end_commands(name: str, kind: str, vni: int, local: str, remote: str, mtu: int,
                        netns_pid: Optional[int] = None) -> List[List[str]]:
    """The ``ip`` commands that make one end of a tunnel link in a server's root
    namespace: a VXLAN or GRE (gretap) device keyed by the link, up at the
    fabric's MTU, then moved into its node's namespace if the node has one.
    Every word is checked: this runs as root on each server."""
    if not INTERFACE.match(str(name)) or kind not in ("vxlan", "gre"):
        raise AgentError(f"tunnel: bad name {name!r} or kind {kind!r}")
    if not (IPV4.match(str(local)) and IPV4.match(str(remote))):
        raise AgentError(f"tunnel: bad addresses {local!r}, {remote!r}")
    vni, mtu = int(vni), int(mtu)
    if not (0 < vni < 1 << 24 and 68 <= mtu <= 65535):
        raise AgentError(f"tunnel: key {vni} or MTU {mtu} out of range")
    if kind == "gre":
        device = ["type", "gretap", "local", local, "remote", remote, "key", str(vni),
                  "ttl", "64"]
    else:
        device = ["type", "vxlan", "id", str(vni), "local", local, "remote", remote,
                  "dstport", str(VXLAN_PORT)]
    commands = [["ip", "link", "add", "name", name] + device,
                ["ip", "link", "set", name, "mtu", str(mtu), "up"]]
    if netns_pid is not None:
        commands.append(["ip", "link", "set", name, "netns", str(int(netns_pid))])
    return commands


def make_tunnel_end(**params) -> None:
    """Run `tunnel_end_commands` here; raise AgentError with what ip said."""
    commands = tunnel_end_commands(**params)
    subprocess.run(["ip", "link", "del", commands[0][4]], capture_output=True, timeout=10)
    for command in commands:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10)
        if done.returncode != 0:
            raise AgentError(f"{' '.join(command)}: {done.stderr.strip()[:300]}")


def testbed_version(repo: str) -> str:
    """The checkout's commit (with ``+dirty`` when files differ), or the
    installed package's version where there is no git checkout."""
    if os.path.isdir(os.path.join(repo, ".git")) and shutil.which("git"):
        head = subprocess.run(["git", "-C", repo, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10)
        if head.returncode == 0:
            dirty = subprocess.run(["git", "-C", repo, "status", "--porcelain",
                                    "--untracked-files=no"], capture_output=True, text=True,
                                   timeout=30)
            return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    try:
        from importlib import metadata
        return "package " + metadata.version("llm-fabric-emu")
    except Exception:                       # noqa: BLE001 - any failure means unknown
        return "unknown"


def lock_free() -> bool:
    """Whether the run lock could be taken now (it is not kept)."""
    if not os.path.exists(state.LOCK_PATH):
        return True
    fd = os.open(state.LOCK_PATH, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


def kernel_has(module: str) -> bool:
    if os.path.isdir(f"/sys/module/{module}"):
        return True
    if shutil.which("modprobe") is None:
        return False
    probe = subprocess.run(["modprobe", "-q", module], capture_output=True, timeout=10)
    return probe.returncode == 0 and os.path.isdir(f"/sys/module/{module}")


def probe(repo: str) -> dict:
    """What pre-flight checks on this server; creates nothing (``modprobe``
    aside, which loads a module the kernel ships)."""
    ctl = None
    if ovs.ovs_running():
        from controllers.openflow.ovs_paths import vswitchd_ctl_path
        ctl = vswitchd_ctl_path()
    return {"version": testbed_version(repo), "ovs_running": ovs.ovs_running(),
            "mnexec": shutil.which("mnexec") is not None,
            "iperf3": shutil.which("iperf3") is not None,
            "lock_free": lock_free(), "gre": kernel_has("ip_gre"),
            "vxlan": kernel_has("vxlan"),
            "kernel_datapath": ovs.kernel_datapath_available(),
            "vswitchd_ctl": ctl, "python": sys.executable, "time": time.time()}


def cpu_jiffies() -> List[int]:
    """The machine's busy and total CPU time since boot, from /proc/stat."""
    with open("/proc/stat") as stream:
        fields = [int(x) for x in stream.readline().split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return [sum(fields) - idle, sum(fields)]


def _netns(pid: int) -> Optional[int]:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def kill_in_namespaces(pids: List[int]) -> List[str]:
    """Kill every process inside the network namespaces of ``pids`` (the
    nodes' shells): what a run started there over ssh (iperf3, tcpdump,
    agents) would otherwise outlive its node.  The root namespace is never
    one of them."""
    own = _netns(os.getpid())
    spaces = {ns for ns in (_netns(pid) for pid in pids) if ns is not None and ns != own}
    killed = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid() and _netns(int(entry)) in spaces:
            try:
                os.kill(int(entry), signal.SIGKILL)
                killed.append(f"process {entry} in a node's namespace")
            except ProcessLookupError:
                pass
    return killed


class ServerAgent:
    """Holds this server's lock for a run and answers the runner's requests."""

    def __init__(self, repo: str):
        self.repo = repo
        self.lock: Optional[state.RunLock] = None
        self.node_pids: List[int] = []
        self.log_stream = None          # the run's log of this server, once told where

    def note(self, text: str) -> None:
        if self.log_stream is not None:
            self.log_stream.write(f"{time.strftime('%H:%M:%S')} {text}\n")
            self.log_stream.flush()

    # ---------------------------------------------------------- life
    def start(self, description: str) -> List[str]:
        self.lock = state.RunLock(state.LOCK_PATH).acquire(description)
        return state.clean(log=lambda m: None)

    def finish(self) -> List[str]:
        removed: List[str] = []
        try:
            removed += kill_in_namespaces(self.node_pids)
            removed += state.clean(log=lambda m: None)
            self.note(f"cleaned up: {len(removed)} item(s)" +
                      "".join(f"\n  {item}" for item in removed))
        finally:
            if self.lock is not None:
                self.lock.release()
                self.lock = None
            if self.log_stream is not None:
                self.log_stream.close()
                self.log_stream = None
        return removed

    # ---------------------------------------------------------- requests
    def handle(self, request: dict) -> dict:
        op = request.get("op")
        handler = getattr(self, f"op_{op}", None) if isinstance(op, str) else None
        if handler is None:
            raise AgentError(f"unknown op {op!r}")
        try:
            reply = handler(request) or {}
        except Exception as exc:
            self.note(f"{op}: failed: {exc}")
            raise
        if op not in ("clock", "cpu"):
            self.note(f"{op}: done")
        return reply

    def op_log(self, request: dict) -> dict:
        """Keep this server's log of the run at ``path`` (gathered at the end)."""
        path = str(request["path"])
        if not os.path.isabs(path):
            raise AgentError(f"log: {path!r} is not absolute")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self.log_stream = open(path, "a")
        self.note(f"agent pid {os.getpid()} on {socket.gethostname()}, testbed "
                  f"{testbed_version(self.repo)}; run lock held")
        return {}

    def op_record(self, request: dict) -> dict:
        for pid, what, is_node in request["pids"]:
            state.record_pid(int(pid), str(what))
            if is_node:
                self.node_pids.append(int(pid))
        self.note(f"recorded {len(request['pids'])} process(es)")
        return {}

    def op_clock(self, _request: dict) -> dict:
        return {"time": time.time()}

    def op_cpu(self, _request: dict) -> dict:
        return {"jiffies": cpu_jiffies(), "cores": os.cpu_count()}

    def op_batches(self, request: dict) -> dict:
        tool = request["tool"]
        if tool not in ("ip", "tc"):
            raise AgentError(f"batches: tool {tool!r}; allowed: ip, tc")
        batches = {int(pid) if pid is not None else None: [str(line) for line in lines]
                   for pid, lines in request["batches"]}
        try:
            shaping.run_batches(tool, batches, str(request.get("what", tool)))
        except shaping.BatchError as exc:
            raise AgentError(str(exc)) from None
        return {}

    def op_set_controller(self, request: dict) -> dict:
        bridges, target = list(request["bridges"]), str(request["target"])
        bad = [b for b in bridges if not BRIDGE_NAME.match(str(b))]
        if bad or not CONTROLLER_TARGET.match(target):
            raise AgentError(f"set_controller: refused bridges {bad} or target {target!r}")
        if bridges:
            ovs.set_controller(bridges, target)
        return {}

    def op_free_port(self, _request: dict) -> dict:
        with socket.socket() as probe_socket:
            probe_socket.bind(("127.0.0.1", 0))
            return {"port": probe_socket.getsockname()[1]}

    def op_listening(self, request: dict) -> dict:
        """The sockets listening on ``port`` in this server's root namespace, and
        whether each is on loopback (`emu.live.listening`): what address an
        ``ssh -R`` forward really got."""
        port = int(request["port"])
        return {"sockets": [{"table": s.table, "address": s.address, "loopback": s.loopback}
                            for s in listening.read_sockets()
                            if s.listening and s.port == port]}

    def op_mkdir(self, request: dict) -> dict:
        path = str(request["path"])
        if not os.path.isabs(path):
            raise AgentError(f"mkdir: {path!r} is not absolute")
        os.makedirs(path, exist_ok=True)
        return {}

    def op_iperf_server(self, request: dict) -> dict:
        """One iperf3 test's server on this server's own address (the tunnel's
        underlay), recorded for cleanup; returns once it listens."""
        bind, port = str(request["bind"]), int(request["port"])
        if not IPV4.match(bind):
            raise AgentError(f"iperf_server: bind {bind!r} is not an IPv4 address")
        proc = subprocess.Popen(["iperf3", "-s", "-1", "-B", bind, "-p", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        state.record_pid(proc.pid, "iperf3 server (tunnel capacity)")
        deadline = time.monotonic() + IPERF_LISTEN_TIMEOUT_S
        while time.monotonic() < deadline:
            listening = subprocess.run(["ss", "-Htln", f"sport = :{port}"],
                                       capture_output=True, text=True, timeout=5).stdout
            if listening.strip():
                return {"pid": proc.pid}
            time.sleep(0.02)
        proc.kill()
        raise AgentError(f"iperf3 did not listen on {bind}:{port}")

    def op_iperf_client(self, request: dict) -> dict:
        """Measure this server's path to another one (``bind`` -> ``dst``)."""
        bind, dst = str(request["bind"]), str(request["dst"])
        port, seconds = int(request["port"]), float(request["seconds"])
        if not (IPV4.match(bind) and IPV4.match(dst)) or not 0 < seconds <= 30:
            raise AgentError("iperf_client: bad address or duration")
        out = subprocess.run(["iperf3", "-c", dst, "-B", bind, "-p", str(port), "-t",
                              f"{seconds:g}", "-J"], capture_output=True, text=True,
                             timeout=seconds + 20)
        return {"json": out.stdout, "code": out.returncode}

    def op_tunnel(self, request: dict) -> dict:
        """One end of a tunnel link (`make_tunnel_end`)."""
        make_tunnel_end(**{key: request.get(key) for key in
                           ("name", "kind", "vni", "local", "remote", "mtu", "netns_pid")})
        return {}

    def op_dump(self, request: dict) -> dict:
        parts = []
        for command in request["commands"]:
            command = [str(c) for c in command]
            tool = command[3] if command[:2] == ["mnexec", "-a"] and len(command) > 3 \
                else command[0]
            if tool not in DUMP_TOOLS:
                raise AgentError(f"dump: {tool!r} is not a listing tool")
            out = subprocess.run(command, capture_output=True, text=True, timeout=30)
            shown = " ".join(command[3:] if command[0] == "mnexec" else command)
            parts.append(f"# {shown}\n{out.stdout}{out.stderr}")
        return {"text": "\n".join(parts)}


def _interrupt(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def serve(agent: ServerAgent, description: str, stdin=None, stdout=None) -> int:
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout

    def reply(message: dict) -> None:
        stdout.write(json.dumps(message) + "\n")
        stdout.flush()

    try:
        cleaned = agent.start(description)
    except state.AlreadyRunning as exc:
        # Another run's: nothing here is ours to clean.
        reply({"event": "busy", "error": str(exc)})
        return 3
    try:
        reply({"event": "ready", "cleaned": cleaned, "pid": os.getpid()})
        for line in stdin:
            if not line.strip():
                continue
            request = json.loads(line)
            if request.get("op") == "quit":
                break
            try:
                reply(dict(agent.handle(request), ok=True))
            except (AgentError, KeyError, ValueError, TypeError, OSError,
                    subprocess.SubprocessError) as exc:
                reply({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
    except KeyboardInterrupt:
        pass
    finally:
        removed = agent.finish()
        try:
            reply({"event": "finished", "removed": removed})
        except (OSError, ValueError):
            pass
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m emu.live.server_agent",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--repo", required=True, help="the testbed checkout on this server")
    parser.add_argument("--probe", action="store_true",
                        help="print what pre-flight checks as JSON and exit")
    parser.add_argument("--description", default="cluster run")
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(args.repo)))
        return 0
    # ssh delivers SIGHUP when the channel goes with a pty; without one the
    # input ends.  Either way serve's cleanup runs.
    for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _interrupt)
    return serve(ServerAgent(args.repo), args.description)


if __name__ == "__main__":
    sys.exit(main())
