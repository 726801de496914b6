"""The emulation lifecycle: one context manager owns every resource.

    with Testbed(fabric, scale, run_dir, dataplane="linux") as bed:
        bed.net.get("h1").cmd("ping -c1 10.0.0.2")
        bed.reconfigure("o1", [[1, 4]])

On entry: take the run lock, remove a killed run's leftovers, pick the data
plane (`emu.live.dataplane`), start OVS if it is the one, start the
controller process (control channel on a 0600 Unix socket; OpenFlow on
127.0.0.1 for OVS), build the Mininet network (Open vSwitch bridges, or
namespaces that route in the kernel and tc patch panels), shape every link
in batches (`emu.live.shaping`), switch offloads off on host interfaces,
give hosts static neighbours, hand the namespaces to the controller (kernel
data plane) and wait until the controller confirmed every switch.  On exit,
whatever happened (exception, SIGINT, SIGTERM), everything is stopped and
removed in ``finally`` blocks.
"""

from __future__ import annotations

import os
import platform
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Callable, Dict, FrozenSet, List, Optional, Sequence, Set, Tuple

from controllers.control import ChannelError, ControlClient, ControlError
from controllers.pause import pause_at
from controllers.service import CHANGING_OPS
from emu.live import dataplane as planes
from emu.live import drops, hostroutes, interrupts, ovs, shaping, state
from emu.live.cluster import Cluster, ClusterError
from emu.live.feed import RunFeed
from emu.live.keeper import ControllerKeeper
from emu.live.linkstate import LinkStateError, LinkSwitch
from emu.live.loadlog import LOAD_FILE, LoadSampler
from emu.live.watch import ControllerWatch
from emu.live.waiting import wait_until
from topologies.fabric import HOST, Fabric
from topologies.naming import ROUTER_MAC, SWITCH_PREFIX, machine_name
from traffic import ports
from traffic.scale import Scale

# The start-up waits are sized for a machine's own cores.  Under software
# emulation (`make vm-test`: qemu TCG, one vCPU) everything runs tens of
# times slower, and the controller alone took over 30 s to start there, so
# vm/guest-init scales them with FABRIC_EMU_TIMEOUT_FACTOR (default 1).
TIMEOUT_FACTOR = float(os.environ.get("FABRIC_EMU_TIMEOUT_FACTOR") or 1.0)
CONTROLLER_START_TIMEOUT_S = 30.0 * TIMEOUT_FACTOR
SWITCHES_READY_TIMEOUT_S = 120.0 * TIMEOUT_FACTOR
LINK_CHANGE_TIMEOUT_S = 10.0 * TIMEOUT_FACTOR
QUEUE_MS = 50.0
# Measured here: 9000-byte frames did not lower ovs-vswitchd's CPU for
# eight concurrent flows (its userspace datapath copies every byte) and made
# reverse-mode iperf3 senders spin, so the default stays at Ethernet's 1500.
DEFAULT_MTU = 1500
MIN_QUEUE_PACKETS = 10


class TestbedError(RuntimeError):
    """The emulation could not be brought up; the message says why."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM, turned into an exception so that finally blocks run."""


_raise_interrupted = interrupts.raising(lambda signum: Interrupted(f"signal {signum}"))


class _DropHtbQuantum:
    """tc warns that HTB's quantum is big at rates of tens of Mbit/s: harmless.

    Mininet prints every tc output as an error, so that line would bury real
    errors; only it is dropped.
    """

    @staticmethod
    def filter(record) -> bool:
        return "quantum of class" not in record.getMessage()


def _quiet_htb_quantum_warnings() -> None:
    from mininet.log import lg
    if not any(isinstance(f, _DropHtbQuantum) for f in lg.filters):
        lg.addFilter(_DropHtbQuantum())


# Mininet types commands into each node's shell through a pty, whose line
# discipline cuts lines at 4096 characters: batches stay well below that.
MAX_COMMAND_LINE = 3000


def _run_batch(node, commands, what: str) -> None:
    """Run commands in a node's shell in as few round trips as fit a line;
    any output is an error."""
    batch: list = []
    for command in list(commands) + [None]:
        if batch and (command is None or len(" ; ".join(batch + [command])) > MAX_COMMAND_LINE):
            out = node.cmd(" ; ".join(batch))
            if out.strip():
                raise TestbedError(f"{node.name}: could not {what}: {out.strip()[:500]}")
            batch = []
        if command is not None:
            batch.append(command)


def machine_to_fabric(name: str) -> str:
    """A Mininet node name back to its fabric node (``fes3`` -> ``s3``; hosts as they are)."""
    return name[len(SWITCH_PREFIX):] if name.startswith(SWITCH_PREFIX) else name


def _counters(channel: ControlClient, keeper=None) -> Dict[str, Dict[int, dict]]:
    reply = call_through_restarts(channel, keeper, "counters")
    return {switch: {int(port): values for port, values in ports.items()}
            for switch, ports in reply["switches"].items()}


def call_through_restarts(channel: ControlClient, keeper, op: str, timeout=None, **args) -> dict:
    """A control request that survives a controller crash: if the channel
    fails because the controller died, wait for its successor
    (`emu.live.keeper`) and ask again.  A changing request carries a
    ``request_id``, so the successor carries it out once at most."""
    try:
        return channel.call(op, timeout=timeout, **args)
    except ChannelError:
        if keeper is None or not keeper.wait_after_failure(
                CONTROLLER_START_TIMEOUT_S + SWITCHES_READY_TIMEOUT_S):
            raise
    return channel.call(op, timeout=timeout, **args)


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def versions(ovs_version: str = "") -> Dict[str, str]:
    """Versions of what a run used: Python, the kernel, the pinned packages, OVS, iperf3."""
    found = {"python": platform.python_version(), "kernel": platform.release()}
    for package in ("os-ken", "mininet", "iperf3", "scapy", "networkx", "matplotlib"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "not installed"
    if ovs_version:
        found["openvswitch"] = ovs_version
    try:
        found["iperf3 (binary/libiperf)"] = subprocess.run(
            ["iperf3", "--version"], capture_output=True, text=True, timeout=5
        ).stdout.split("\n")[0].strip()
    except (OSError, subprocess.TimeoutExpired):
        found["iperf3 (binary/libiperf)"] = "not found"
    return found


@dataclass(frozen=True)
class LinkChange:
    """Links taken down or up (`Testbed.change_links`), and when."""
    links: FrozenSet[Tuple[str, str]]
    up: bool
    started: float      # time.monotonic() when the change was made


class Testbed:
    """Owns the lock, OVS, the controller process and the Mininet network."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self, fabric: Fabric, scale: Scale, run_dir: Path,
                 log: Callable[[str], None] = print, description: str = "",
                 mtu: int = DEFAULT_MTU, dataplane: str = planes.AUTO,
                 congestion: str = "cubic", ecmp_seed: int = 1, feed: Optional[RunFeed] = None,
                 panel: str = "auto", servers: Sequence[str] = (), ssh_config: str = ""):
        self.mtu = mtu
        # Cluster mode (`emu.live.cluster`): the servers after "localhost"
        # hold part of the fabric, reached with Mininet Cluster Edition.
        self.servers = list(servers or [])
        self.ssh_config = ssh_config
        self.cluster: Optional[Cluster] = None
        self.placement = None
        self.cluster_record: Dict = {}
        self._mirrored: Dict[str, Set[str]] = {}     # server -> folders made there
        self._tunnel_plan = None                     # the links between servers, once built
        # What the run tells its watchers (`emu.live.feed`); one that records
        # nowhere when the caller gave none, so emitting is always safe.
        self.feed = feed if feed is not None else RunFeed()
        self.asked_dataplane = dataplane
        self.congestion = congestion
        # The OCS patch panel on the linux data plane (`controllers.netlink.bpfpanel`):
        # asked for, then what the controller runs (``panel_kind``) and why.
        self.panel = panel
        self.panel_kind: Dict[str, str] = {}
        self.panel_note = ""
        # Flows' ports and the routers' multipath hash key come from it, so
        # a run's ECMP paths repeat (`traffic.ports`); 0: the kernel's own.
        self.ecmp_seed = ecmp_seed
        self.multipath_hash_seed: Optional[int] = None   # what the namespaces were given
        self.fabric = fabric
        self.scale = scale
        self.run_dir = Path(run_dir)
        self.log = log
        self.description = description or fabric.name
        self.net = None
        self.control: Optional[ControlClient] = None
        self.controller: Optional[subprocess.Popen] = None
        self.keeper: Optional[ControllerKeeper] = None     # once the network is up
        self._watch: Optional[ControllerWatch] = None
        self._counters_channel: Optional[ControlClient] = None
        self._request_serial = 0
        self._serial_lock = threading.Lock()
        self.dataplane: Optional[planes.DataPlane] = None
        self.warnings = []
        # Interfaces of links taken down on purpose: what they drop is the
        # failure's own loss (`emu.live.drops`), not the machine running short.
        self.failed_interfaces: Set[str] = set()
        self._links: Optional[LinkSwitch] = None   # netlink in the namespaces, once needed
        self._stack = ExitStack()
        self._old_sigterm = None

    # ------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Testbed":
        self._old_sigterm = signal.signal(signal.SIGTERM, _raise_interrupted)
        try:
            if self.servers:
                # The placement, then every server, checked before anything
                # exists on any of them.
                from topologies.partition import PlacementError, place_fabric
                try:
                    self.cluster = Cluster(self.servers, self.ssh_config, log=self.log)
                    planes.cluster_choice(self.asked_dataplane)
                    self.placement = place_fabric(self.fabric, len(self.servers))
                    self.cluster.preflight()
                except (ClusterError, PlacementError) as exc:
                    raise TestbedError(str(exc)) from None
            lock = state.RunLock().acquire(self.description)
            self._stack.callback(lock.release)
            leftovers = state.clean(log=lambda m: self.log(f"previous run left {m[9:]}"))
            if leftovers:
                self.log(f"removed {len(leftovers)} leftover(s) of an earlier run")
            self._stack.callback(self._final_clean)
            if self.cluster is not None:
                self._stack.callback(self._stop_cluster)
                try:
                    self.cluster.start(self.description, self.run_dir)
                except ClusterError as exc:
                    raise TestbedError(str(exc)) from None
            choice = planes.cluster_choice(self.asked_dataplane) if self.cluster \
                else planes.choose(self.asked_dataplane)
            planes.check_congestion(self.congestion)
            pause_at("ovs-start")
            info = ovs.ensure_ovs() if choice.dataplane == planes.OVS else None
            self.dataplane = planes.DataPlane(choice, netem=ovs.netem_available(), ovs=info)
            self.log(f"{choice.describe()}: {self.dataplane.describe()}"
                     f"{'' if self.dataplane.netem else ', no netem (no delay/loss emulation)'}"
                     f"; TCP {self.congestion}")
            self._start_controller()
            self._build_network()
            self._wait_ready()
            self._start_watching()
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def __exit__(self, *exc) -> None:
        try:
            # A second Ctrl-C must not cut the teardown short: it is held,
            # and delivered once everything is removed.
            with interrupts.deferred():
                pause_at("teardown")
                self._stack.close()
        finally:
            if self._old_sigterm is not None:
                signal.signal(signal.SIGTERM, self._old_sigterm)
                self._old_sigterm = None

    def _final_clean(self) -> None:
        state.clean(log=lambda m: None)

    # ------------------------------------------------------------ controller
    def _start_controller(self) -> None:
        state.ensure_run_dir()
        fabric_path = os.path.join(state.RUN_DIR, "fabric.json")
        with open(fabric_path, "w") as stream:
            stream.write(self.fabric.to_json())
        self.socket_path = os.path.join(state.RUN_DIR, "control.sock")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log_file = open(self.run_dir / "controller.log", "w")
        self._stack.callback(log_file.close)
        self._controller_log_file = log_file
        args = [sys.executable, "-m", "controllers.launcher", "--fabric", fabric_path,
                "--socket", self.socket_path, "--tdf", repr(self.scale.tdf),
                "--dataplane", self.dataplane.kind, "--panel", self.panel,
                # Its decisions, for a successor should it die (`emu.live.keeper`).
                "--state", os.path.join(state.RUN_DIR, "controller-state.json")]
        if self.dataplane.kind == planes.OVS:
            self.ofp_port = free_loopback_port()
            args += ["--ofp-port", str(self.ofp_port), "--dataplane-sync"]
            if self.cluster is not None:
                # The other servers' switches reach it over ssh, and it
                # flushes their datapaths through their forwarded sockets.
                try:
                    self.cluster.forward_controller(self.ofp_port)
                except ClusterError as exc:
                    raise TestbedError(str(exc)) from None
                for path in self.cluster.sync_sockets:
                    args += ["--dataplane-sync-socket", path]
        self._controller_args = args
        self.controller = self._spawn_controller(args)
        self._stack.callback(self._stop_controller)
        self.check_controller()
        self.control = ControlClient(self.socket_path)
        self._stack.callback(self.control.close)
        self.log(f"controller pid {self.controller.pid}" + (
            f", OpenFlow 127.0.0.1:{self.ofp_port}" if self.dataplane.kind == planes.OVS
            else ", netlink"))

    def _spawn_controller(self, args) -> subprocess.Popen:
        """Start a controller process and wait for its control socket."""
        repo_root = str(Path(__file__).resolve().parent.parent.parent)
        env = dict(os.environ, PYTHONPATH=repo_root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        process = subprocess.Popen(
            args, stdout=self._controller_log_file, stderr=subprocess.STDOUT, env=env,
            cwd=repo_root, start_new_session=True)
        state.record_pid(process.pid, "controller")
        wait_until(lambda: process.poll() is not None or os.path.exists(self.socket_path),
                   CONTROLLER_START_TIMEOUT_S, "the controller's control socket")
        return process

    def _restart_controller(self) -> Tuple[subprocess.Popen, float]:
        """A successor for a controller that died (`emu.live.keeper`): it takes
        over the state file and resynchronises every switch; returns it, and
        when it answered, once every switch is confirmed again."""
        try:
            os.unlink(self.socket_path)     # the dead one's: not a sign of life
        except FileNotFoundError:
            pass
        self._controller_log_file.write("\n--- the controller died; a successor resumes ---\n")
        self._controller_log_file.flush()
        process = self._spawn_controller(self._controller_args + ["--resume"])
        if process.poll() is not None:
            raise TestbedError(f"the successor exited with code {process.returncode}")
        answered = time.time()
        channel = ControlClient(self.socket_path)
        try:
            if self.dataplane.kind == planes.LINUX:
                # Kernel routers have no connection to come back on: hand the
                # namespaces over again, and the successor resyncs each.
                pids = {machine_to_fabric(s.name): s.pid for s in self.net.switches}
                channel.call("attach", namespaces=pids, timeout=SWITCHES_READY_TIMEOUT_S)
            wait_until(lambda: process.poll() is not None or channel.call("status")["ready"],
                       SWITCHES_READY_TIMEOUT_S, "every switch to be resynchronised",
                       interval_s=0.05)
        finally:
            channel.close()
        if process.poll() is not None:
            raise TestbedError(f"the successor exited with code {process.returncode}")
        self.controller = process
        # Connections made to the dead one would fail once more on their
        # next request: they connect to the successor instead.
        for client in (self.control, self._counters_channel):
            if client is not None:
                client.drop_connection()
        self._watch_controller()
        return process, answered

    def _start_watching(self) -> None:
        """Tell the run's feed about this testbed, and keep telling it: the
        controller's circuit and link events as they happen, and the load of
        every link from the port counters (``load.csv``), every 0.5 s."""
        self.feed.emit("testbed", fabric=self.fabric.to_dict(), scale=self.scale.to_dict(),
                       dataplane=self.dataplane.kind, description=self.description)
        self._stack.callback(self.feed.emit, "testbed-closed")
        self._stack.callback(lambda: self._watch is not None and self._watch.stop())
        self._watch_controller()
        # Its own connection: a counters request must never queue behind a
        # reconfiguration, or a timed one behind it.
        counters_channel = self._counters_channel = ControlClient(self.socket_path)
        self._stack.callback(counters_channel.close)
        sampler = LoadSampler(lambda: _counters(counters_channel, self.keeper), self.fabric,
                              self.run_dir / LOAD_FILE,
                              on_sample=lambda sample: self.feed.emit("load", **sample))
        self._stack.callback(sampler.stop)
        sampler.start()
        # Last on the stack, so first off: once the run ends, a controller
        # that exits is meant to.
        self.keeper = ControllerKeeper(self.controller, self._restart_controller,
                                       log=self.log).start()
        self._stack.callback(self.keeper.stop)

    def _watch_controller(self) -> None:
        """Stream the controller's events into the run's feed (again, after a
        successor took over: the dead one's stream ended with it)."""
        if self._watch is not None:
            self._watch.stop()
        self._watch = ControllerWatch(self.socket_path,
                                      lambda event: self.feed.emit(event.pop("kind"), **event))
        self._watch.start()

    def check_controller(self) -> None:
        """Raise if the controller process died (its handlers exit on error)
        and no successor took over (`emu.live.keeper`); wait while one is
        being started."""
        if self.keeper is not None:
            self.keeper.wait_settled(CONTROLLER_START_TIMEOUT_S + SWITCHES_READY_TIMEOUT_S)
            if self.keeper.failed:
                raise TestbedError(f"{self.keeper.failed}; see "
                                   f"{self.run_dir / 'controller.log'}:\n" +
                                   self.controller_log(20))
        if self.controller is not None and self.controller.poll() is not None:
            raise TestbedError(f"the controller exited with code {self.controller.returncode}; "
                               f"see {self.run_dir / 'controller.log'}:\n" + self.controller_log(20))

    def controller_log(self, lines: int = 0) -> str:
        try:
            text = (self.run_dir / "controller.log").read_text()
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:]) if lines else text

    def _stop_controller(self) -> None:
        if self.controller is None or self.controller.poll() is not None:
            return
        self.controller.terminate()
        try:
            self.controller.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.controller.kill()
            self.controller.wait(timeout=10)

    # ------------------------------------------------------------ network
    @property
    def queue_packets(self) -> int:
        """Egress queue of about QUEUE_MS at the slowest emulated link rate.

        Mininet's default (the 1000-packet txqueuelen) holds over a second of
        traffic at a few Mbit/s, and the bufferbloat would dominate timing.
        """
        slowest_mbps = min(d["gbps"] for _, _, d in self.fabric.links()) * 1000 * self.scale.bw_factor
        packets = slowest_mbps * 1e6 * QUEUE_MS / 1000 / 8 / (self.mtu + 14)
        return max(MIN_QUEUE_PACKETS, int(packets))

    def _build_network(self) -> None:
        from mininet.link import Link
        from mininet.log import setLogLevel
        from mininet.net import Mininet
        from mininet.node import OVSSwitch
        from topologies.mininet_topo import FabricTopo

        setLogLevel("warning")
        _quiet_htb_quantum_warnings()
        kind = self.dataplane.kind
        switch_opts = {}
        if kind == planes.OVS:
            switch_opts = {"datapath": self.dataplane.ovs.mininet_datapath,
                           "protocols": "OpenFlow13", "failMode": "secure"}
        # Links are plain veths: shaping is applied in batches below, not by TCLink.
        topo = FabricTopo(self.fabric, switch_opts=switch_opts, dataplane=kind)
        started = time.monotonic()
        if self.cluster is not None:
            self.net = self._cluster_network(topo)
        else:
            self.net = Mininet(topo=topo, switch=OVSSwitch, link=Link, controller=None,
                               autoSetMacs=False, autoStaticArp=False, build=False)
        self._stack.callback(self._stop_network)
        # Stopped before the network goes: links vanishing under it are not failures.
        self._stack.callback(self._stop_controller)
        self.net.build()
        self._record_nodes()
        pause_at("network-build")
        self.net.start()
        if kind == planes.OVS:
            self._set_controllers()
        # Measured here: with segmentation offloads on, TCP stalls on OVS's
        # userspace datapath, and per-flow fairness falls under kernel routers
        # at tens of Mbit/s; every host interface sends plain MTU frames.
        for host in self.net.hosts:
            _run_batch(host, [ovs.disable_offloads_cmd(i.name) + " >/dev/null"
                              for i in host.intfList()], "switch offloads off")
        self._seed_ecmp()
        self._shape()
        if kind == planes.LINUX:
            self._attach_namespaces()
        if hostroutes.needs_host_routes(self.fabric):
            self.refresh_host_routes()
        else:
            self._static_arp()
        self.build_s = time.monotonic() - started
        self.log(f"network built: {len(self.net.hosts)} hosts, {len(self.net.switches)} switches, "
                 f"{len(self.net.links)} links in {self.build_s:.1f} s")

    # ------------------------------------------------------------ cluster
    def _server_of(self, node) -> Optional[str]:
        """The other server a Mininet node runs on; None for this machine."""
        return node.server if getattr(node, "isRemote", False) else None

    def _cluster_network(self, topo):
        """A `MininetCluster` over the run's servers: nodes placed a pod per
        server (`topologies.partition`), links between servers as tunnels, the
        servers' network measured for them first."""
        from emu.live.cluster_nodes import cluster_network

        self.log(f"placement: {self.placement.describe()}")
        kinds, warnings = self.cluster.plan_tunnels(self.placement, self.fabric,
                                                    self.scale.bw_factor)
        for pair, why in self.cluster.tunnel_kinds.items():
            self.log(f"tunnels {pair}: {why}")
        self.log("tunnel links: " + " ".join(f"{u}-{v}" for u, v in self.placement.tunnels))
        for warning in warnings:
            self.log(f"warning: {warning}")
            self.warnings.append(warning)
        net, self._tunnel_plan = cluster_network(
            self.cluster, topo, self.placement, kinds, self.mtu, machine_to_fabric,
            ovs_datapath=self.dataplane.kind == planes.OVS)
        return net

    def _record_nodes(self) -> None:
        """Every node's shell, recorded where it runs, for cleanup after a kill."""
        remote: Dict[str, list] = {}
        for node in self.net.hosts + self.net.switches:
            server = self._server_of(node)
            if server is not None:
                remote.setdefault(server, []).append(
                    (node.pid, f"mininet node {node.name}", bool(node.inNamespace)))
            elif node.inNamespace:
                state.record_pid(node.pid, f"mininet node {node.name}")
        for server, pids in remote.items():
            self.cluster.record_pids(server, pids)

    def _set_controllers(self) -> None:
        by_server: Dict[Optional[str], List[str]] = {}
        for switch in self.net.switches:
            by_server.setdefault(self._server_of(switch), []).append(switch.name)
        for server, bridges in by_server.items():
            if server is None:
                ovs.set_controller(bridges, f"tcp:127.0.0.1:{self.ofp_port}")
            else:
                self.cluster.set_controller(server, bridges)

    def _run_batches(self, tool: str, batches: Dict, what: str) -> None:
        """``tool -batch`` per namespace, each on its server; ``batches`` maps
        (server or None, namespace pid or None) to lines."""
        per_server: Dict[Optional[str], Dict[Optional[int], List[str]]] = {}
        for (server, pid), lines in batches.items():
            if lines:
                per_server.setdefault(server, {})[pid] = lines
        try:
            for server, by_pid in per_server.items():
                if server is None:
                    shaping.run_batches(tool, by_pid, what)
                else:
                    self.cluster.run_batches(server, tool, by_pid, f"{server}: {what}")
        except (shaping.BatchError, ClusterError) as exc:
            raise TestbedError(str(exc)) from None

    def _stop_cluster(self) -> None:
        """Every other server's files gathered here, then each agent cleans its
        server and gives its lock back."""
        cluster = self.cluster
        try:
            if cluster.agents:
                self.cluster_record["gathered"] = cluster.gather(self.run_dir)
        finally:
            removed = cluster.stop()
            if removed:
                self.log(f"cluster: the servers' agents removed {len(removed)} item(s)")

    def finish_cluster(self) -> dict:
        """What the run records of its servers (while the network still
        stands): tunnels with their byte counters, each server's CPU."""
        if self.cluster is None:
            return {}
        self.cluster_record.update(self.cluster.record(self._tunnel_plan.tunnels,
                                                       self.placement))
        return self.cluster_record

    def switches_by_server(self) -> Dict[Optional[str], List[str]]:
        """The fabric's switches by the server they run on (None: this one)."""
        found: Dict[Optional[str], List[str]] = {}
        for switch in self.fabric.switches:
            node = self.net.get(machine_name(self.fabric, switch))
            found.setdefault(self._server_of(node), []).append(switch)
        return found

    def clock_offset(self, host: str) -> float:
        """What to subtract from an epoch time taken on ``host``'s server to put
        it on this machine's clock (0 on this machine)."""
        if self.cluster is None or self.net is None:
            return 0.0
        server = self._server_of(self.net.get(host))
        return self.cluster.offset_s(server) if server else 0.0

    def _seed_ecmp(self) -> None:
        """What a run's ECMP seed needs of the namespaces (`traffic.ports`).

        Every namespace that routes (hosts, kernel routers) gets the
        multipath hash key drawn from the seed, where the kernel lets it be
        set.  Hosts keep no TIME_WAIT (``tcp_max_tw_buckets=0``): a flow
        takes the same four-tuple in every replay, and a client that closed
        first would otherwise hold its port for 60 s, so that the next
        replay's client could not bind it.  With seed 0 (ephemeral ports,
        the boot's random key) nothing changes.
        """
        if self.ecmp_seed == ports.KERNEL_SEED:
            return
        key = ports.multipath_hash_seed(self.ecmp_seed)
        keyed = ports.MULTIPATH_SEED_SYSCTL.exists()
        set_key = [f"sysctl -q -w net.ipv4.fib_multipath_hash_seed={key}"] if keyed else []
        for host in self.net.hosts:
            _run_batch(host, ["sysctl -q -w net.ipv4.tcp_max_tw_buckets=0"] + set_key,
                       "seed ECMP")
        for switch in (s for s in self.net.switches if s.inNamespace):
            _run_batch(switch, set_key, "seed ECMP")
        if keyed:
            self.multipath_hash_seed = key

    def _namespace_pid(self, node) -> Optional[int]:
        return node.pid if node.inNamespace else None

    def _shape(self) -> None:
        """MTU on every interface, and the link's rate and two bounded queues on
        every sending end (`emu.live.shaping`): one tc and one ip batch per
        namespace.

        On OVS this runs after the bridges took their ports, because Open
        vSwitch clears a port's qdisc when it first configures it.
        """
        by_server: Dict[Optional[str], list] = {}
        for node in self.net.hosts + self.net.switches:
            by_server.setdefault(self._server_of(node), []).append(
                (self._namespace_pid(node), machine_to_fabric(node.name),
                 [i.name for i in node.intfList() if i.name != "lo"]))
        for server, nodes in by_server.items():
            batches = shaping.namespace_batches(nodes, self.fabric, self.scale.bw_factor,
                                                self.dataplane.kind, self.queue_packets,
                                                self.mtu)
            for tool, what in (("ip", "set MTUs"), ("tc", "shape links")):
                self._run_batches(tool, {(server, pid): batch[tool]
                                         for pid, batch in batches.items()}, what)

    def _attach_namespaces(self) -> None:
        """Hand every switch's namespace to the controller, which programs it."""
        pids = {machine_to_fabric(s.name): s.pid for s in self.net.switches}
        self.check_controller()
        try:
            self.control.call("attach", namespaces=pids, timeout=SWITCHES_READY_TIMEOUT_S)
        except ControlError as exc:
            self.check_controller()
            raise TestbedError(f"the controller could not program the namespaces: {exc}") \
                from None

    def _static_arp(self, hosts=None) -> None:
        """Every host knows the MAC for every other host: no ARP crosses the fabric.

        On OVS, switches forward by IP destination and keep the MAC, so a host
        sends to the destination host's own MAC; on the kernel data plane a
        host sends to its router, whose ports all carry `ROUTER_MAC`.  One ip
        batch per host (Mininet's staticArp takes a command per pair, 16,000 of
        them on a k=8 fat-tree).
        """
        pause_at("static-arp")
        linux = self.dataplane.kind == planes.LINUX
        entries = [(h.IP(), ROUTER_MAC if linux else h.MAC()) for h in self.net.hosts]
        for host in hosts or self.net.hosts:
            intf = host.defaultIntf().name
            lines = [f"neigh replace {ip} lladdr {mac} dev {intf} nud permanent"
                     for ip, mac in entries if ip != host.IP()]
            self._run_batches("ip", {(self._server_of(host), host.pid): lines},
                              f"{host.name}: install static ARP")

    def refresh_host_routes(self) -> None:
        """Program forwarding GPUs (SiP-OCS) for the fabric's current circuits."""
        def mac_of(host, port):
            return self.net.get(host).intf(f"{host}-eth{port}").MAC()

        for host, commands in hostroutes.host_route_commands(self.fabric, mac_of).items():
            _run_batch(self.net.get(host), commands, "program host routes")

    def _wait_ready(self) -> None:
        def ready():
            # Ports may flap while the network starts (OVS reopening them);
            # the controller reroutes around each, so wait for every link up.
            self.check_controller()
            return self.control.call("status")["ready"] and \
                not self.control.call("state")["down_links"]

        def detail():
            status = self.control.call("status")
            return f"missing {status['missing']}, errors {status['errors']}"

        wait_until(ready, SWITCHES_READY_TIMEOUT_S, "every switch to be programmed",
                   interval_s=0.1, detail=detail)
        status = self.control.call("status")
        self.panel_kind = status.get("panel") or {}
        self.panel_note = status.get("panel_note") or ""
        if self.panel_kind:
            kinds = sorted(set(self.panel_kind.values()))
            self.log(f"OCS patch panel: {', '.join(kinds)}"
                     + (" (dark windows timed by the kernel)" if kinds == ["bpf"] else ""))
        if self.panel_note:
            self.log(f"warning: {self.panel_note}")
            self.warnings.append(self.panel_note)

    def _stop_network(self) -> None:
        if self.net is None:
            return
        from mininet.log import setLogLevel
        setLogLevel("error")
        started = time.monotonic()
        try:
            self.net.stop()
        finally:
            self.stop_s = time.monotonic() - started
            self.net = None

    # ------------------------------------------------------------ failures
    def set_links(self, links, up: bool, timeout_s: float = LINK_CHANGE_TIMEOUT_S) -> float:
        """Take fabric links down (or up), as a failure would, and wait until
        the controller saw it (`change_links`, then `wait_links_seen`).
        Returns what the control plane took to notice, in seconds."""
        return self.wait_links_seen(self.change_links(links, up), timeout_s)

    def change_links(self, links, up: bool) -> "LinkChange":
        """Take fabric links down (or up) without waiting for the controller.

        Both interfaces of each link change state, as Mininet's
        ``configLinkStatus`` does, but all at once, over netlink sockets
        opened ahead (`emu.live.linkstate`; `ready_links` opens them before
        a failure is due): a switch that fails loses its links together,
        not one process start or shell round trip after another.  The
        switches report the port status to the controller, which reroutes
        on its own.
        """
        links = list(links)
        if self.cluster is not None:
            raise TestbedError("taking links down is not built for cluster runs: the "
                               "links of another server are in its namespaces")
        interfaces = self._interfaces(links)
        switch = self._link_switch()
        try:
            switch.ready(interfaces)
            started = time.monotonic()
            switch.change(interfaces, up)
        except LinkStateError as exc:
            raise TestbedError(str(exc)) from None
        self.failed_interfaces.update(name for _, name in interfaces)
        return LinkChange(frozenset(tuple(sorted(link)) for link in links), up, started)

    def ready_links(self, links) -> None:
        """Open now what taking these links down (or up) will need, so that a
        failure due later costs it nothing when it comes."""
        try:
            self._link_switch().ready(self._interfaces(links))
        except LinkStateError as exc:
            raise TestbedError(str(exc)) from None

    def _interfaces(self, links) -> List[Tuple[Optional[int], str]]:
        """Both interfaces of each fabric link, as (namespace pid, name)."""
        interfaces = []
        for u, v in sorted({tuple(sorted(link)) for link in links}):
            if not self.fabric.graph.has_edge(u, v):
                raise TestbedError(f"no link {u}-{v} in the fabric")
            nodes = [self.net.get(machine_name(self.fabric, n)) for n in (u, v)]
            for link in self.net.linksBetween(*nodes):
                for intf in (link.intf1, link.intf2):
                    interfaces.append((self._namespace_pid(intf.node), intf.name))
        return interfaces

    def _link_switch(self) -> LinkSwitch:
        if self._links is None:
            self._links = LinkSwitch()
            self._stack.callback(self._close_link_switch)
        return self._links

    def _close_link_switch(self) -> None:
        if self._links is not None:
            self._links.close()
            self._links = None

    def wait_links_seen(self, change: "LinkChange",
                        timeout_s: float = LINK_CHANGE_TIMEOUT_S) -> float:
        """Wait until the controller's state agrees with ``change``; returns the
        seconds since the links changed (what the control plane took to notice).
        For links taken down this only asks the controller, so another thread
        than the one driving the run may wait (the control channel serialises
        calls); links brought up also get their hosts' neighbours back."""
        wanted, up = set(change.links), change.up

        def agreed():
            self.check_controller()
            down = {tuple(link) for link in self.control.call("state")["down_links"]}
            return not (wanted & down) if up else wanted <= down

        # Asked every 5 ms: a failure's flows move once this returns, so the
        # interval is jitter on their restart (a call costs the controller
        # well under a millisecond).
        wait_until(agreed, timeout_s, f"the controller to see {len(wanted)} link(s) go "
                   f"{'up' if up else 'down'}", interval_s=0.005)
        noticed_s = time.monotonic() - change.started
        if up:
            # A host interface that went down lost its neighbour entries and
            # routes with it, static ones included.
            hosts = {n for link in wanted for n in link if self.fabric.kind(n) == HOST}
            if hostroutes.needs_host_routes(self.fabric):
                self.refresh_host_routes()
            elif hosts:
                self._static_arp([self.net.get(h) for h in sorted(hosts)])
        return noticed_s

    def switch_links(self, switch: str) -> Set[Tuple[str, str]]:
        """Every link of ``switch``: what fails with it."""
        if switch not in self.fabric.switches:
            raise TestbedError(f"{switch!r} is not a switch of {self.fabric.name}")
        return {tuple(sorted((switch, peer))) for peer in self.fabric.graph.neighbors(switch)}

    def fail_switch(self, switch: str, up: bool = False) -> float:
        """Every link of ``switch`` down (or back up): a switch failure."""
        return self.set_links(self.switch_links(switch), up)

    # ------------------------------------------------------------ circuits
    def reconfigure(self, ocs: str, circuits, timeout_s: float = 60.0, **args) -> dict:
        """Reconfigure one OCS through the controller (``technology``, ``delay_ms``
        as the control channel's ``reconfigure`` op takes them), then bring the
        runner's side up to date: its copy of the fabric gets the new circuits
        and, where GPUs forward (SiP-OCS), the hosts' routes follow them.
        Returns the controller's reply (the plan and each step's timestamp)."""
        self.check_controller()
        circuits = [list(c) for c in circuits]
        result = self.call("reconfigure", ocs=ocs, circuits=circuits, timeout=timeout_s, **args)
        self.fabric.set_circuits(ocs, circuits)
        if hostroutes.needs_host_routes(self.fabric):
            self.refresh_host_routes()
        return result

    def schedule(self, schedule: dict, start_in_s: float = 0.05) -> dict:
        """Start a cyclic OCS schedule (`controllers.schedule`: slot and guard in
        real microseconds, dilated by the scale's tdf); the controller's reply
        says when slot 0 starts (``epoch``, epoch seconds) and its emulated
        slot and guard.  Needs the linux data plane's BPF panel."""
        self.check_controller()
        return self.control.call("schedule", schedule=schedule, start_in_s=start_in_s)

    def stop_schedule(self) -> dict:
        """The OCSes back to their steady circuits."""
        self.check_controller()
        return self.control.call("schedule", stop=True)

    # ------------------------------------------------------------ records
    def describe(self) -> dict:
        """What ``result.json`` records of the data plane and the software."""
        plane = self.dataplane
        return {"dataplane": plane.kind, "dataplane_reason": plane.choice.reason,
                "datapath": plane.datapath, "netem": plane.netem,
                "congestion_control": self.congestion,
                "ocs_panel": sorted(set(self.panel_kind.values())) or None,
                "ocs_panel_note": self.panel_note or None,
                "ecmp_seed": self.ecmp_seed,
                # None: the kernel's own random key (seed 0, or a kernel
                # without the setting; OVS hashes with a fixed one).
                "multipath_hash_seed": self.multipath_hash_seed,
                "servers": [s.name for s in self.cluster.servers] if self.cluster else None,
                # Each time the controller died and a successor took over.
                "controller_outages": list(self.keeper.outages) if self.keeper else [],
                "versions": versions(plane.ovs.version if plane.ovs else "")}

    def dump_tables(self, directory: Path) -> None:
        """Every switch's forwarding state at teardown, for post-mortems: flow and
        group tables (OVS), or routes, rules, neighbours and tc filters (linux)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for switch in self.net.switches:
            commands = self.dataplane.dump_commands(
                switch.name, switch.pid, [i.name for i in switch.intfList() if i.name != "lo"])
            server = self._server_of(switch)
            if server is not None:
                text = self.cluster.dump(server, commands)
                (directory / f"{switch.name}.txt").write_text(f"# on {server}\n{text}")
                continue
            parts = []
            for command in commands:
                out = subprocess.run(command, capture_output=True, text=True, timeout=30)
                shown = " ".join(command[3:] if command[0] == "mnexec" else command)
                parts.append(f"# {shown}\n{out.stdout}{out.stderr}")
            (directory / f"{switch.name}.txt").write_text("\n".join(parts))

    def drop_counters(self, log_since: int = 0) -> drops.Counters:
        """Where packets were lost so far (`emu.live.drops`), over every namespace
        of the testbed: hosts, kernel routers and patch panels, and the root one
        where Open vSwitch's ports live."""
        ovs_plane = self.dataplane.kind == planes.OVS
        # This machine's namespaces only: another server's are counted there.
        pids = [node.pid for node in self.net.hosts + self.net.switches
                if node.inNamespace and self._server_of(node) is None]
        return drops.read(pids + ([None] if ovs_plane else []), ovs=ovs_plane,
                          log_since=log_since, failed=self.failed_interfaces)

    def flow_paths(self, flows) -> Tuple[List[Optional[List[str]]], List[Optional[List[int]]]]:
        """For each flow, in order: the nodes its data crosses now, as the data
        plane picks them (the kernel's multipath hash of the flow's ports), and
        the port each of those nodes sends it out of; None for a flow it cannot
        tell (Open vSwitch's select groups, unknown ports)."""
        flows = list(flows)
        known = [i for i, f in enumerate(flows) if f.status == "ok" and f.sport and f.dport]
        paths: List[Optional[List[str]]] = [None] * len(flows)
        ports: List[Optional[List[int]]] = [None] * len(flows)
        if not known:
            return paths, ports
        self.check_controller()
        reply = self.call("paths", flows=[[flows[i].src, flows[i].dst, flows[i].sport,
                                                   flows[i].dport] for i in known])
        told_ports = reply.get("ports") or [None] * len(known)
        for i, path, out_ports in zip(known, reply["paths"], told_ports):
            paths[i], ports[i] = path or None, out_ports or None
        return paths, ports

    def counters(self) -> Dict[str, Dict[int, dict]]:
        """Every switch's port counters, from the controller (OpenFlow port stats,
        or the kernel's link statistics): ``{switch: {port: {"tx_bytes": ..., ...}}}``."""
        self.check_controller()
        return _counters(self.control, self.keeper)

    def call(self, op: str, timeout: Optional[float] = None, **args) -> dict:
        """A control request on the runner's channel, through a controller crash
        (`call_through_restarts`).  A request that changes the switches gets
        an id of its own, so that a retry is carried out once."""
        self.check_controller()
        if op in CHANGING_OPS:
            with self._serial_lock:
                self._request_serial += 1
                args["request_id"] = f"{op}-{os.getpid()}-{self._request_serial}"
        return call_through_restarts(self.control, self.keeper, op, timeout=timeout, **args)

    # ------------------------------------------------------------ helpers
    def host(self, name: str):
        return self.net.get(name)

    def popen(self, host: str, args, what: str, **kwargs) -> subprocess.Popen:
        """A process in a host's namespace, recorded for cleanup.  On another
        server (cluster mode) the folders its path arguments name are made
        there first: what it writes lands at the same path, and is gathered
        into the run folder at the end."""
        node = self.net.get(host)
        server = self._server_of(node)
        if server is not None and isinstance(args, (list, tuple)):
            self._mirror_folders(server, args)
        proc = node.popen(args, **kwargs)
        state.record_pid(proc.pid, what)
        return proc

    def _mirror_folders(self, server: str, args) -> None:
        mirrored = self._mirrored.setdefault(server, set())
        for word in (str(a) for a in args):
            if not word.startswith("/"):
                continue
            path = Path(word)
            folder = path if path.is_dir() else path.parent
            if folder.is_dir() and str(folder) not in mirrored:
                try:
                    self.cluster.agents[server].call("mkdir", path=str(folder))
                except ClusterError as exc:
                    raise TestbedError(str(exc)) from None
                mirrored.add(str(folder))

    def status(self) -> dict:
        self.check_controller()
        try:
            return self.call("status")
        except ControlError as exc:
            self.check_controller()
            raise TestbedError(str(exc)) from None
