"""One emulation across several servers: Mininet Cluster Edition, run safely.

    server 1 (this machine, "localhost")          server 2 (ssh)
    +-----------------------------------+         +-----------------------------+
    | runner, controller (127.0.0.1:P)  |         | server_agent (lock, pids,   |
    | OVS: pods placed here             |  ssh -R | cleanup at the end of input)|
    |      fes1 ... ----- VXLAN/GRE ----+---------+-- fes9 ... OVS: other pods  |
    |                      (top-tier    |         | 127.0.0.1:P' -> controller  |
    |                       links only) |         | (forwarded back over ssh)   |
    +-----------------------------------+         +-----------------------------+

`Cluster` is what a `Testbed` holds when ``testbed.servers`` names more than
one server.  In order:

1. ``preflight()``: before anything exists anywhere, every other server must
   answer ``ssh -o BatchMode=yes``, run the same version of the testbed at
   the same path, have OVS running, ``mnexec`` and ``iperf3``, and a free
   run lock.  The error names the server and what it lacks.
2. ``start()``: an agent per server (`emu.live.server_agent`, over ssh)
   takes that server's lock and removes a killed run's leftovers; the clock
   offset of each server is measured (the round trip to its agent, the
   smallest of several); each server pair that carries tunnels has its
   capacity measured with iperf3 over the underlay.
3. ``forward_controller()``: the controller listens on 127.0.0.1 of the
   first server only; each other server gets an ``ssh -R`` from its own
   loopback to it, and its ovs-vswitchd's unixctl socket forwarded back
   (``ssh -L`` of a Unix socket) so the controller can flush its datapath.
4. The nodes are placed by `topologies.partition` (a pod per server, only
   the top-tier links become tunnels) through `emu.live.cluster_nodes`.
5. ``finish()``: each tunnel's byte counters, each server's CPU, and every
   file the run wrote on another server, gathered into the run folder.
   Then the agents are told to quit and clean their server.

Tunnels are VXLAN, or GRE (``gretap``) where both servers' kernels have it:
GRE's header is 12 bytes smaller and needs no UDP port; VXLAN is in every
kernel this testbed runs on.  Mininet's own `RemoteGRELink` cannot work
without GRE, and its `RemoteSSHLink` needs ``PermitTunnel``, hard-codes
``tap9`` and encrypts every frame in user space.
"""

from __future__ import annotations

import getpass
import ipaddress
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from emu.live import state
from emu.live.waiting import WaitTimeout, wait_until

LOCALHOST = "localhost"
HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,62})"
                      r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$")
USER = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")
SSH_TIMEOUT_S = 20.0
AGENT_TIMEOUT_S = 60.0
CLOCK_SAMPLES = 9
# A clock offset known to no better than this is no offset: cross-server
# timings would carry an error as large as the flows they time.
CLOCK_MAX_RTT_S = 0.05
CAPACITY_SECONDS = 2.0
CAPACITY_PORT = 5399


class ClusterError(RuntimeError):
    """A cluster run cannot start; the message names the server and why."""


def check_servers(servers, where: str = "testbed.servers") -> List[str]:
    """The server list of a scenario, validated: ``[]`` (one machine) or
    ``["localhost", HOST, ...]`` with hostnames or IPv4 addresses, once each."""
    servers = list(servers or [])
    if not servers:
        return []
    if not all(isinstance(s, str) for s in servers):
        raise ClusterError(f"{where}: every server is a host name or address")
    if servers[0] != LOCALHOST:
        raise ClusterError(f"{where}: the first server is the one the run starts on and "
                           f"holds the controller; write it as 'localhost' (got "
                           f"{servers[0]!r})")
    if len(servers) < 2:
        raise ClusterError(f"{where}: name at least one other server after 'localhost', "
                           "or leave the list empty for one machine")
    if len(set(servers)) != len(servers):
        raise ClusterError(f"{where}: a server is named twice: {servers}")
    for server in servers[1:]:
        if server == LOCALHOST or not HOSTNAME.match(server):
            raise ClusterError(f"{where}: {server!r} is not a host name or IPv4 address")
    return servers


def resolve(server: str) -> str:
    """An IPv4 address for a server name (Mininet's nodes connect by address)."""
    try:
        return str(ipaddress.IPv4Address(server))
    except ValueError:
        pass
    try:
        return socket.getaddrinfo(server, 22, socket.AF_INET)[0][4][0]
    except OSError as exc:
        raise ClusterError(f"server {server!r}: its name does not resolve ({exc})") from None


def source_address(remote: str) -> str:
    """This machine's address on the route to ``remote`` (a tunnel's local end)."""
    out = subprocess.run(["ip", "-json", "route", "get", remote], capture_output=True,
                         text=True, timeout=10)
    try:
        return json.loads(out.stdout)[0]["prefsrc"]
    except (ValueError, IndexError, KeyError):
        raise ClusterError(f"server {remote}: this machine has no route to it") from None


def run_user() -> str:
    """The user Mininet Cluster Edition connects as: who ran sudo, else us."""
    user = os.environ.get("SUDO_USER") or getpass.getuser()
    if not USER.match(user):
        raise ClusterError(f"cannot ssh as user {user!r}")
    return user


@dataclass
class Server:
    """One server of the run, and what pre-flight found there."""
    name: str
    address: str
    local: bool
    facts: Dict = field(default_factory=dict)


@dataclass
class Tunnel:
    """A fabric link whose two ends sit on different servers."""
    link: Tuple[str, str]
    servers: Tuple[str, str]
    kind: str
    interfaces: Tuple[str, str] = ("", "")
    vni: int = 0


def tunnel_kind(facts_a: Dict, facts_b: Dict) -> Tuple[str, str]:
    """VXLAN or GRE between two servers, and why."""
    if facts_a.get("gre") and facts_b.get("gre"):
        return "gre", "both kernels have ip_gre: gretap's header is 12 bytes smaller"
    where = "either kernel" if not facts_a.get("gre") and not facts_b.get("gre") \
        else "one of the kernels"
    return "vxlan", f"no ip_gre in {where}; VXLAN is in every kernel"


def demand_warnings(tunnels: Sequence[Tunnel], link_mbps: Dict[Tuple[str, str], float],
                    capacity_mbps: Dict[Tuple[str, str], Optional[float]]) -> List[str]:
    """The guardrail: a server pair whose tunnels may carry, at their emulated
    rates and in one direction, more than the underlay measured between the
    two servers.  Their links would then run slower than emulated, and a
    fabric comparison would measure the servers' network instead."""
    per_pair: Dict[Tuple[str, str], float] = {}
    for tunnel in tunnels:
        pair = tuple(sorted(tunnel.servers))
        per_pair[pair] = per_pair.get(pair, 0.0) + link_mbps[tunnel.link]
    warnings = []
    for pair, demand in sorted(per_pair.items()):
        measured = capacity_mbps.get(pair)
        if measured is None:
            warnings.append(f"tunnels {pair[0]} <-> {pair[1]}: capacity not measured; "
                            f"their links may carry {demand:.0f} Mbit/s each way")
        elif demand > measured:
            warnings.append(f"tunnels {pair[0]} <-> {pair[1]} may carry {demand:.0f} Mbit/s "
                            f"each way at the emulated rates, more than the "
                            f"{measured:.0f} Mbit/s measured between the servers: their "
                            "links can run slower than emulated")
    return warnings


def clock_offset(samples: Sequence[Tuple[float, float, float]]) -> Tuple[float, float]:
    """NTP's estimate from (sent, remote time, received) samples: the offset of
    the remote clock (remote - local) from the sample with the smallest round
    trip, and that round trip (the offset's error is at most half of it)."""
    sent, remote, received = min(samples, key=lambda s: s[2] - s[0])
    return remote - (sent + received) / 2.0, received - sent


class RemoteAgent:
    """The ssh session of one server's `emu.live.server_agent`."""

    def __init__(self, server: Server, ssh: Callable[[Server, List[str]], List[str]],
                 args: List[str]):
        self.server = server
        # A file, not a pipe: nobody reads the agent's stderr while it runs,
        # and a full pipe would stop it.
        self.errors = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(ssh(server, args), stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.errors,
                                     text=True, start_new_session=True)
        self._lock = threading.Lock()
        self.broken = ""          # why it stopped answering; every later call fails

    def _line(self, timeout_s: float) -> dict:
        if self.broken:
            raise ClusterError(f"server {self.server.name}: {self.broken}")
        line: List[str] = []
        reader = threading.Thread(target=lambda: line.append(self.proc.stdout.readline()),
                                  daemon=True)
        reader.start()
        reader.join(timeout_s)
        if not line or not line[0]:
            # A reader still waiting would take the next reply as this one's.
            self.errors.seek(0)
            err = self.errors.read().decode(errors="replace").strip()[-500:]
            self.broken = "its agent did not answer" + (f": {err}" if err else "")
            raise ClusterError(f"server {self.server.name}: {self.broken}")
        return json.loads(line[0])

    def wait_ready(self) -> dict:
        event = self._line(AGENT_TIMEOUT_S)
        if event.get("event") == "busy":
            raise ClusterError(f"server {self.server.name}: {event['error']}")
        return event

    def call(self, op: str, timeout_s: float = AGENT_TIMEOUT_S, **args) -> dict:
        with self._lock:
            if self.proc.poll() is not None:
                raise ClusterError(f"server {self.server.name}: its agent exited")
            self.proc.stdin.write(json.dumps(dict(args, op=op)) + "\n")
            self.proc.stdin.flush()
            reply = self._line(timeout_s)
        if not reply.get("ok"):
            raise ClusterError(f"server {self.server.name}: {op}: {reply.get('error')}")
        return reply

    def quit(self, timeout_s: float = 60.0) -> List[str]:
        """Ask the agent to clean its server and go; returns what it removed."""
        removed: List[str] = []
        with self._lock:
            try:
                if self.proc.poll() is None:
                    self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                    self.proc.stdin.close()
                    removed = self._line(timeout_s).get("removed", [])
            except (OSError, ValueError, ClusterError):
                pass
            finally:
                try:
                    self.proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
                self.errors.close()
        return removed


class Cluster:
    """The servers of one run: pre-flight, agents, forwards, tunnels, gathering."""

    def __init__(self, servers: Sequence[str], ssh_config: str = "",
                 log: Callable[[str], None] = print,
                 repo: Optional[str] = None, python: Optional[str] = None):
        names = check_servers(servers)
        if ssh_config and not os.path.isfile(ssh_config):
            raise ClusterError(f"testbed.ssh_config: {ssh_config!r} is not a file")
        self.ssh_config = ssh_config
        self.log = log
        self.repo = repo or str(Path(__file__).resolve().parents[2])
        self.python = python or sys.executable
        self.user = run_user()
        self.servers = [Server(name, "127.0.0.1" if name == LOCALHOST else resolve(name),
                               name == LOCALHOST) for name in names]
        self.agents: Dict[str, RemoteAgent] = {}
        self.forwards: List[subprocess.Popen] = []
        self.controller_ports: Dict[str, int] = {}
        self.sync_sockets: List[str] = []
        self.clock: Dict[str, Dict[str, float]] = {}
        self.capacity_mbps: Dict[Tuple[str, str], Optional[float]] = {}
        self.tunnels: List[Tunnel] = []
        self.cpu_start: Dict[str, List[int]] = {}
        self.cpu_pct: Dict[str, Optional[float]] = {}
        self.underlay: Dict[Tuple[str, str], Tuple[str, str]] = {}
        self.tunnel_kinds: Dict[str, str] = {}        # "a <-> b" -> kind: why

    # ---------------------------------------------------------- ssh
    @property
    def remote_servers(self) -> List[Server]:
        return [s for s in self.servers if not s.local]

    def server(self, name: str) -> Server:
        return next(s for s in self.servers if s.name == name)

    def ssh_options(self) -> List[str]:
        options = ["-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
                   "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3"]
        return options + (["-F", self.ssh_config] if self.ssh_config else [])

    def ssh(self, server: Server, remote: List[str], extra: Sequence[str] = ()) -> List[str]:
        """The local argv that runs ``remote`` on ``server``; every word is
        quoted, since ssh hands the remote side one shell line.  As Mininet
        Cluster Edition does, ssh runs as the run's user (who ran sudo) and
        the remote side takes root with sudo unless that user is root."""
        run_as = [] if self.user == getpass.getuser() else ["sudo", "-E", "-u", self.user]
        sudo = [] if self.user == "root" else ["sudo", "-n", "-E"]
        return run_as + ["ssh"] + self.ssh_options() + list(extra) + \
            [f"{self.user}@{server.address}", shlex.join(sudo + list(remote))]

    def run_root(self, server: str, script: str) -> str:
        """A shell script (built from validated words only) in the root
        namespace of ``server``; its output, empty on success."""
        target = self.server(server)
        args = ["sh", "-c", script] if target.local else self.ssh(target, ["sh", "-c", script])
        out = subprocess.run(args, capture_output=True, text=True, timeout=SSH_TIMEOUT_S)
        return (out.stdout + out.stderr).strip()

    def make_tunnel_end(self, server: str, **params) -> None:
        """One end of a tunnel link on ``server`` (`server_agent.make_tunnel_end`):
        here by ip, there by its agent, on the ssh session already open."""
        from emu.live.server_agent import AgentError, make_tunnel_end
        if self.server(server).local:
            try:
                make_tunnel_end(**params)
            except AgentError as exc:
                raise ClusterError(f"server {server}: {exc}") from None
        else:
            self.agents[server].call("tunnel", **params)

    def interface_bytes(self, server: str, names: Sequence[str]) -> Dict[str, List[int]]:
        """tx and rx bytes of interfaces in ``server``'s root namespace."""
        names = [n for n in names if re.match(r"^[A-Za-z0-9_.-]{1,15}$", n)]
        script = "; ".join(f"echo {n} $(cat /sys/class/net/{n}/statistics/tx_bytes "
                           f"/sys/class/net/{n}/statistics/rx_bytes)" for n in names)
        counts = {}
        for line in self.run_root(server, script).splitlines():
            parts = line.split()
            if len(parts) == 3:
                counts[parts[0]] = [int(parts[1]), int(parts[2])]
        return counts

    def agent_args(self, *extra: str) -> List[str]:
        return [self.python, "-m", "emu.live.server_agent", "--repo", self.repo, *extra]

    # ---------------------------------------------------------- pre-flight
    def preflight(self) -> None:
        """Check every server before anything exists on any; raise naming the
        server and what is missing."""
        from emu.live.server_agent import probe
        local = probe(self.repo)
        self.servers[0].facts = local
        for server in self.remote_servers:
            try:
                out = subprocess.run(self.ssh(server, self.agent_args("--probe")),
                                     capture_output=True, text=True, timeout=SSH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                raise ClusterError(f"server {server.name}: ssh -o BatchMode=yes did not "
                                   f"answer in {SSH_TIMEOUT_S:.0f} s") from None
            if out.returncode == 255:
                raise ClusterError(f"server {server.name}: does not answer ssh -o "
                                   f"BatchMode=yes as {self.user}@{server.address} "
                                   f"({out.stderr.strip()[:300] or 'no message'}); give it "
                                   "this user's key (README: Beyond one machine)")
            if out.returncode != 0:
                raise ClusterError(f"server {server.name}: the testbed does not run at "
                                   f"{self.repo} with {self.python} there "
                                   f"({out.stderr.strip()[-300:]}); clone the same commit "
                                   "to the same path and run ./bootstrap.sh")
            facts = json.loads(out.stdout)
            server.facts = facts
            missing = []
            if facts["version"] != local["version"]:
                missing.append(f"the same testbed version (it has {facts['version']}, this "
                               f"machine {local['version']})")
            if not facts["ovs_running"]:
                missing.append("Open vSwitch running (ovs-ctl start)")
            if not facts["mnexec"]:
                missing.append("mnexec (Debian's mininet package)")
            if not facts["iperf3"]:
                missing.append("iperf3")
            if not facts["lock_free"]:
                missing.append("a free run lock (another emulation is running there)")
            if missing:
                raise ClusterError(f"server {server.name} lacks " + "; ".join(missing))
            self.underlay[(LOCALHOST, server.name)] = (source_address(server.address),
                                                       server.address)
            self.underlay[(server.name, LOCALHOST)] = (server.address,
                                                       source_address(server.address))
        for a in self.remote_servers:
            for b in self.remote_servers:
                if a.name != b.name:
                    self.underlay[(a.name, b.name)] = (a.address, b.address)

    # ---------------------------------------------------------- agents
    def start(self, description: str, run_dir: Optional[Path] = None) -> None:
        """An agent on every other server (its lock taken, leftovers removed),
        then the clock offsets.  Raise if a server's clock cannot be read
        closely enough: cross-server timings would be wrong."""
        for server in self.remote_servers:
            agent = RemoteAgent(server, self.ssh,
                                self.agent_args("--description", description[:200]))
            self.agents[server.name] = agent
            event = agent.wait_ready()
            if event.get("cleaned"):
                self.log(f"server {server.name}: removed {len(event['cleaned'])} leftover(s) "
                         "of an earlier run")
            agent.call("mkdir", path=state.RUN_DIR)
            if run_dir is not None:
                agent.call("log", path=str(Path(run_dir) / "servers" / f"{server.name}.log"))
            self.cpu_start[server.name] = agent.call("cpu")["jiffies"]
        from emu.live.server_agent import cpu_jiffies
        self.cpu_start[LOCALHOST] = cpu_jiffies()
        self.clock[LOCALHOST] = {"offset_s": 0.0, "rtt_s": 0.0}
        for server in self.remote_servers:
            samples = []
            for _ in range(CLOCK_SAMPLES):
                sent = time.time()
                remote = self.agents[server.name].call("clock")["time"]
                samples.append((sent, remote, time.time()))
            offset, rtt = clock_offset(samples)
            if rtt > CLOCK_MAX_RTT_S:
                raise ClusterError(f"server {server.name}: its clock offset cannot be "
                                   f"measured (best round trip {rtt * 1000:.0f} ms, above "
                                   f"{CLOCK_MAX_RTT_S * 1000:.0f} ms); cross-server timings "
                                   "would be wrong")
            self.clock[server.name] = {"offset_s": offset, "rtt_s": rtt}
            self.log(f"server {server.name}: clock {offset * 1000:+.2f} ms "
                     f"(+/- {rtt * 500:.2f} ms)")

    def offset_s(self, server: str) -> float:
        return self.clock.get(server, {}).get("offset_s", 0.0)

    def stop(self) -> List[str]:
        removed = []
        for proc in self.forwards:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.forwards = []
        for path in self.sync_sockets:
            if os.path.exists(path):
                os.unlink(path)
        for name, agent in list(self.agents.items()):
            removed += [f"{name}: {item}" for item in agent.quit()]
        self.agents = {}
        return removed

    # ---------------------------------------------------------- capacity
    def measure_capacity(self, pairs: Sequence[Tuple[str, str]]) -> None:
        """iperf3 over the underlay between each pair of servers that carries
        tunnels, one direction, ``CAPACITY_SECONDS`` each."""
        for a, b in sorted({tuple(sorted(p)) for p in pairs}):
            # Measured from the first server where it is one end: its agent
            # is this process.
            src, dst = (LOCALHOST, b if a == LOCALHOST else a) if LOCALHOST in (a, b) \
                else (a, b)
            bind, target = self.underlay[(src, dst)]
            try:
                self.agents[dst].call("iperf_server", bind=target, port=CAPACITY_PORT)
                if src == LOCALHOST:
                    out = subprocess.run(["iperf3", "-c", target, "-B", bind, "-p",
                                          str(CAPACITY_PORT), "-t", f"{CAPACITY_SECONDS:g}",
                                          "-J"], capture_output=True, text=True,
                                         timeout=CAPACITY_SECONDS + 20).stdout
                else:
                    out = self.agents[src].call("iperf_client", bind=bind, dst=target,
                                                port=CAPACITY_PORT,
                                                seconds=CAPACITY_SECONDS)["json"]
                bps = json.loads(out)["end"]["sum_received"]["bits_per_second"]
                self.capacity_mbps[(a, b)] = bps / 1e6
                self.log(f"underlay {a} <-> {b}: {bps / 1e6:.0f} Mbit/s measured")
            except (ClusterError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
                self.capacity_mbps[(a, b)] = None
                self.log(f"underlay {a} <-> {b}: capacity not measured ({exc})")

    # ---------------------------------------------------------- controller
    def forward_controller(self, ofp_port: int) -> None:
        """Each other server reaches the controller on its own loopback, and the
        controller reaches each ovs-vswitchd's unixctl socket on this one."""
        for server in self.remote_servers:
            remote_port = self.agents[server.name].call("free_port")["port"]
            extra = ["-N", "-o", "ExitOnForwardFailure=yes",
                     "-R", f"127.0.0.1:{remote_port}:127.0.0.1:{ofp_port}"]
            ctl = server.facts.get("vswitchd_ctl")
            if ctl:
                local = os.path.join(state.RUN_DIR, f"vswitchd-{server.address}.ctl")
                if os.path.exists(local):
                    os.unlink(local)
                extra += ["-o", "StreamLocalBindUnlink=yes", "-L", f"{local}:{ctl}"]
            args = ["ssh"] + self.ssh_options() + extra + [f"{self.user}@{server.address}"]
            proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)
            self.forwards.append(proc)
            state.record_pid(proc.pid, f"ssh forward to {server.name}")
            if ctl:
                wait_until(lambda: proc.poll() is not None or os.path.exists(local),
                           SSH_TIMEOUT_S, f"the ssh forward to {server.name}")
                if proc.poll() is None:
                    os.chmod(local, 0o600)
                    self.sync_sockets.append(local)
            if proc.poll() is not None:
                raise ClusterError(f"server {server.name}: the ssh forward to the controller "
                                   f"failed: {proc.stderr.read().strip()[:300]}")
            self._check_forward_is_loopback(server, proc, remote_port)
            self.controller_ports[server.name] = remote_port

    def _check_forward_is_loopback(self, server: Server, proc: subprocess.Popen,
                                   port: int) -> None:
        """Wait until the server listens on the forward's port, and refuse a
        forward bound anywhere but its loopback.  ``-R 127.0.0.1:...`` asks
        for loopback, but sshd decides: with ``GatewayPorts yes`` it binds the
        wildcard address whatever the client asked, which would open the
        controller to that server's whole network."""
        agent = self.agents[server.name]
        sockets: List[dict] = []

        def bound() -> bool:
            nonlocal sockets
            sockets = agent.call("listening", port=port)["sockets"]
            return bool(sockets) or proc.poll() is not None

        try:
            wait_until(bound, SSH_TIMEOUT_S, f"the ssh forward's port {port} on {server.name}")
        except WaitTimeout as exc:
            raise ClusterError(f"server {server.name}: {exc}") from None
        if proc.poll() is not None:
            raise ClusterError(f"server {server.name}: the ssh forward to the controller "
                               f"failed: {proc.stderr.read().strip()[:300]}")
        exposed = [f"{s['address']}:{port}" for s in sockets if not s["loopback"]]
        if exposed:
            raise ClusterError(f"server {server.name}: its sshd bound the controller's "
                               f"forward on {', '.join(exposed)}, not only 127.0.0.1 "
                               "(GatewayPorts yes?); set GatewayPorts to no or "
                               "clientspecified in its sshd_config")

    # ---------------------------------------------------------- per node
    def record_pids(self, server: str, pids: List[Tuple[int, str, bool]]) -> None:
        self.agents[server].call("record", pids=[list(p) for p in pids])

    def run_batches(self, server: str, tool: str, batches: Dict[Optional[int], List[str]],
                    what: str) -> None:
        self.agents[server].call("batches", tool=tool, what=what,
                                 batches=[[pid, lines] for pid, lines in batches.items()],
                                 timeout_s=120.0)

    def set_controller(self, server: str, bridges: List[str]) -> None:
        self.agents[server].call("set_controller", bridges=bridges,
                                 target=f"tcp:127.0.0.1:{self.controller_ports[server]}")

    def dump(self, server: str, commands: List[List[str]]) -> str:
        return self.agents[server].call("dump", commands=commands)["text"]

    def root_interfaces(self, server: str) -> Dict[int, str]:
        """Interface index -> name in ``server``'s root namespace."""
        out = subprocess.run(self.ssh(self.server(server), ["ip", "-json", "link", "show"]),
                             capture_output=True, text=True, timeout=SSH_TIMEOUT_S)
        try:
            return {link["ifindex"]: link["ifname"] for link in json.loads(out.stdout)}
        except (ValueError, KeyError):
            raise ClusterError(f"server {server}: cannot list its interfaces: "
                               f"{out.stderr.strip()[:300]}") from None

    def popen_until_input_ends(self, server: str, args: List[str],
                               what: str) -> subprocess.Popen:
        """``args`` in ``server``'s root namespace, stopped with SIGINT (as
        tcpdump must be, to write its counts) when the returned process's
        stdin is closed, or its ssh session ends."""
        wrapper = '"$@" & child=$!; read -r _; kill -INT "$child"; wait "$child"'
        proc = subprocess.Popen(self.ssh(self.server(server), ["sh", "-c", wrapper, "sh",
                                                               *args]),
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        state.record_pid(proc.pid, what)
        return proc

    def fetch(self, server: str, path: Path) -> None:
        """Copy one file the run wrote on ``server`` to the same path here."""
        path = Path(path)
        with open(path, "wb") as stream:
            done = subprocess.run(self.ssh(self.server(server), ["cat", str(path)]),
                                  stdout=stream, stderr=subprocess.PIPE, timeout=300)
        if done.returncode != 0:
            raise ClusterError(f"server {server}: cannot fetch {path}: "
                               f"{done.stderr.decode(errors='replace')[:300]}")

    # ---------------------------------------------------------- the end
    def sample_cpu(self) -> None:
        from emu.live.server_agent import cpu_jiffies
        for server in self.servers:
            now = cpu_jiffies() if server.local else \
                self.agents[server.name].call("cpu")["jiffies"]
            before = self.cpu_start.get(server.name)
            if before and now[1] > before[1]:
                self.cpu_pct[server.name] = round(100.0 * (now[0] - before[0]) /
                                                  (now[1] - before[1]), 1)
            else:
                self.cpu_pct[server.name] = None

    def gather(self, run_dir: Path) -> List[str]:
        """Copy what the run wrote under ``run_dir`` on every other server into
        the same place here (a file this machine wrote too is kept as it is).
        Returns the files copied."""
        copied: List[str] = []
        run_dir = Path(run_dir)
        for server in self.remote_servers:
            listing = subprocess.run(self.ssh(server, ["find", str(run_dir), "-type", "f",
                                                       "-printf", "%P\\n"]),
                                     capture_output=True, text=True, timeout=60)
            names = [n for n in listing.stdout.splitlines() if n]
            if not names:
                continue
            tar = subprocess.Popen(self.ssh(server, ["tar", "-C", str(run_dir), "-cf", "-",
                                                     "."]), stdout=subprocess.PIPE)
            untar = subprocess.run(["tar", "-C", str(run_dir), "--skip-old-files", "-xf", "-"],
                                   stdin=tar.stdout, capture_output=True, timeout=300)
            tar.stdout.close()
            tar.wait(timeout=60)
            if untar.returncode != 0:
                self.log(f"server {server.name}: could not gather its files: "
                         f"{untar.stderr.decode(errors='replace')[:300]}")
                continue
            copied += [f"{server.name}:{name}" for name in names]
        return copied

    def plan_tunnels(self, placement, fabric, bw_factor: float):
        """The tunnel kind of each server pair (recorded with why), the
        capacity between the pairs that carry tunnels, measured now, and the
        guardrail's warnings: ({(a, b): kind}, [warning])."""
        names = [server.name for server in self.servers]
        kinds = {}
        for a in self.servers:
            for b in self.servers:
                if a.name < b.name:
                    kind, why = tunnel_kind(a.facts, b.facts)
                    kinds[(a.name, b.name)] = kind
                    self.tunnel_kinds[f"{a.name} <-> {b.name}"] = f"{kind}: {why}"
        planned = [Tunnel((u, v), (names[placement.server_of[u]],
                                   names[placement.server_of[v]]), "")
                   for u, v in placement.tunnels]
        self.measure_capacity(sorted({t.servers for t in planned}))
        link_mbps = {(u, v): min(d["gbps"] for d in fabric.graph.get_edge_data(u, v).values())
                     * 1000 * bw_factor for u, v in placement.tunnels}
        return kinds, demand_warnings(planned, link_mbps, self.capacity_mbps)

    def record(self, tunnels: Sequence[Tunnel], placement) -> dict:
        """The run's record of its servers, read while the network stands:
        every tunnel with the byte counters of both its ends, each server's
        CPU since the start, the placement."""
        self.tunnels = list(tunnels)
        by_server: Dict[str, List[str]] = {}
        for tunnel in self.tunnels:
            for server, name in zip(tunnel.servers, tunnel.interfaces):
                by_server.setdefault(server, []).append(name)
        counted: Dict[Tuple[str, str], List[int]] = {}
        for server, interfaces in by_server.items():
            for name, values in self.interface_bytes(server, interfaces).items():
                counted[(server, name)] = values
        try:
            self.sample_cpu()
        except ClusterError as exc:
            self.log(f"warning: per-server CPU not read: {exc}")
        record = self.describe()
        for row, tunnel in zip(record["tunnels"], self.tunnels):
            row["bytes"] = {}
            for server, name in zip(tunnel.servers, tunnel.interfaces):
                tx, rx = counted.get((server, name), (None, None))
                row["bytes"][f"{server}:{name}"] = {"tx": tx, "rx": rx}
        record["placement"] = placement.describe()
        record["hosts_per_server"] = dict(zip([s.name for s in self.servers],
                                              placement.hosts_per_server))
        return record

    def describe(self) -> dict:
        return {"tunnel_kinds": dict(self.tunnel_kinds),
                "servers": [{"name": s.name, "address": s.address,
                             "version": s.facts.get("version"),
                             "clock_offset_ms": round(self.clock.get(s.name, {})
                                                      .get("offset_s", 0.0) * 1000, 3),
                             "clock_rtt_ms": round(self.clock.get(s.name, {})
                                                   .get("rtt_s", 0.0) * 1000, 3),
                             "cpu_pct": self.cpu_pct.get(s.name)} for s in self.servers],
                "tunnels": [{"link": list(t.link), "servers": list(t.servers), "kind": t.kind,
                             "interfaces": list(t.interfaces), "vni": t.vni}
                            for t in self.tunnels],
                "capacity_mbps": [{"servers": list(pair), "mbps": mbps}
                                  for pair, mbps in sorted(self.capacity_mbps.items())]}
