"""Mininet Cluster Edition's nodes, links and placer, as the testbed uses them.

    server 1                                    server 2
    fes5 (agg, pod 0) ==== tunnel link ====  fes17 (core)
       fes5-eth3: vxlan id 4201                 fes17-eth1: vxlan id 4201
       local 10.254.1.1 remote 10.254.1.2       local 10.254.1.2 remote 10.254.1.1

`ClusterHost` and `ClusterSwitch` are Mininet's `RemoteHost` and
`RemoteOVSSwitch` with three changes:

* ssh is run with the run's options (BatchMode, an ``ssh_config`` file)
  and without ``sudo`` when the run's user is the one already running;
* a process started on another server (``popen``) has every word quoted,
  because ssh hands the remote side one shell line, and is tied to its ssh
  session (``setpriv --pdeathsig TERM``): stopping it here stops it there,
  as tcpdump must stop to write its capture out;
* Mininet's cluster cleanup (``mn -c`` on every server) is never armed.

`TunnelLink` is a `RemoteLink` whose two ends on different servers are a
VXLAN or a GRE (``gretap``) device pair over the servers' own network
(`emu.live.cluster` says which and why); on one server it is the usual veth
pair.  `FabricPlacer` is a Mininet `Placer` that answers from
`topologies.partition`: a pod per server, only top-tier links cut.
"""

from __future__ import annotations

import getpass
import os
import signal
import shlex
from itertools import groupby
from operator import attrgetter
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from mininet.examples.cluster import (ClusterCleanup, Placer, RemoteHost, RemoteLink,
                                      RemoteOVSSwitch)
from mininet.link import Link
from mininet.node import OVSSwitch
from mininet.util import errRun

from emu.live.cluster import ClusterError, Tunnel
from emu.live.server_agent import AgentError
from topologies.partition import Placement

FIRST_VNI = 4201


class ClusterNodeMixin:
    """What the testbed changes in Mininet's `RemoteMixin` (see the module)."""

    def __init__(self, name, ssh_options: Sequence[str] = (), **params):
        self._ssh_options = list(ssh_options)
        super().__init__(name, **params)
        # Mininet's cluster cleanup runs `mn -c` on every server it knows;
        # the testbed cleans by its own prefix and pid files instead.
        ClusterCleanup.serveruser.pop(self.server, None)

    def startShell(self, *args, **kwargs):
        # Called from Mininet's constructor, after RemoteMixin chose its ssh
        # command line: the run's options go in before the first ssh.
        if self.isRemote:
            run_as = [] if self.user == getpass.getuser() else ["sudo", "-E", "-u", self.user]
            self.sshcmd = run_as + ["ssh", "-q"] + self._ssh_options + ["-tt", self.dest]
        return super().startShell(*args, **kwargs)

    def _popen(self, cmd, sudo=True, tt=True, **params):
        if self.isRemote:
            if isinstance(cmd, str):
                cmd = cmd.split()
            cmd = [shlex.quote(str(word)) for word in cmd]
            sudo = sudo and self.user != "root"
        return super()._popen(cmd, sudo=sudo, tt=tt, **params)

    def terminate(self):
        # Mininet stops a shell with SIGHUP.  Under nohup (or any runner that
        # ignores SIGHUP) the ssh that holds a remote shell inherits the
        # ignore and stays; Mininet then waits for it for ever.  ssh quits on
        # SIGTERM, and the server hangs up the shell behind it.
        if self.isRemote and self.shell is not None and self.shell.poll() is None:
            try:
                os.killpg(self.shell.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        super().terminate()

    def rcmd(self, *cmd, **opts):
        """A command in the server's root namespace; its output.  (Mininet's
        own adds bytes to a str on Python 3.)"""
        out, _ = self.rpopen(*cmd, **opts).communicate()
        return out.decode(errors="replace") if isinstance(out, bytes) else out

    def popen(self, *args, **kwargs):
        if self.isRemote and self.pid is not None:
            # No -d: mnexec would fork away from the session and lose the
            # parent-death signal that ties the process to its ssh.
            kwargs.setdefault("mncmd", ["setpriv", "--pdeathsig", "TERM",
                                        "mnexec", "-a", str(self.pid)])
        return super().popen(*args, **kwargs)


class ClusterHost(ClusterNodeMixin, RemoteHost):
    """A GPU's host on one of the servers."""


class ClusterSwitch(ClusterNodeMixin, RemoteOVSSwitch):
    """An Open vSwitch bridge on one of the servers."""

    @classmethod
    def batchStartup(cls, switches, **_kwargs):
        """Each server's bridges in one ovs-vsctl transaction, run as a
        process there.  Mininet's cluster version types it into a switch's
        shell, whose pty cuts a line at 4096 characters: ten bridges'
        commands are longer, and the cut transaction failed silently."""
        by_server = attrgetter("server")
        for _, group in groupby(sorted(switches, key=by_server), by_server):
            group = tuple(group)
            first = group[0]
            run = (lambda command, **_: first.rcmd(["sh", "-c", command])) \
                if first.isRemote else errRun
            OVSSwitch.batchStartup(group, run=run)
        return switches


class TunnelLink(RemoteLink):
    """A fabric link: a veth pair on one server, a tunnel between two.

    Built by Mininet as ``TunnelLink(node1, node2, **options)``; the run's
    tunnel plan comes in through `tunnel_link` (a ``functools.partial``
    would also do, but Mininet checks nothing and a named factory reads
    better in a traceback).
    """

    def __init__(self, node1, node2, plan: "TunnelPlan" = None, **kwargs):
        self.plan = plan
        self.tunnel_record: Optional[Tunnel] = None
        super().__init__(node1, node2, **kwargs)

    def makeIntfPair(self, intfname1, intfname2, addr1=None, addr2=None,
                     node1=None, node2=None, deleteIntfs=True):
        node1 = self.node1 if node1 is None else node1
        node2 = self.node2 if node2 is None else node2
        if node1.server == node2.server:
            return Link.makeIntfPair(intfname1, intfname2, addr1, addr2, node1, node2,
                                     deleteIntfs=deleteIntfs)
        self.tunnel = self.plan.make(self, node1, node2, intfname1, intfname2)
        return self.tunnel

    def stop(self):
        if self.tunnel is not None:
            for intf in (self.intf1, self.intf2):
                intf.delete()
            self.tunnel = None
        else:
            Link.stop(self)


class TunnelPlan:
    """The run's tunnels: kind per server pair, underlay addresses, VNIs.

    ``underlay[(a, b)]`` is (a's address, b's address) on the path between
    servers a and b; ``kinds[(a, b)]`` is "vxlan" or "gre".  Every tunnel
    made is appended to ``tunnels``, for the run's record.
    """

    def __init__(self, underlay: Dict, kinds: Dict, mtu: int, fabric_name_of,
                 make_end: Callable[..., None]):
        self.underlay = underlay
        self.make_end = make_end        # (server, **tunnel end) -> None, or raises
        self.kinds = kinds
        self.mtu = mtu
        self.fabric_name_of = fabric_name_of
        self.tunnels: List[Tunnel] = []
        self._next_vni = FIRST_VNI

    def make(self, link, node1, node2, name1: str, name2: str):
        vni = self._next_vni
        self._next_vni += 1
        kind = self.kinds[tuple(sorted((node1.server, node2.server)))]
        for node, name, peer in ((node1, name1, node2), (node2, name2, node1)):
            local, remote = self.underlay[(node.server, peer.server)]
            try:
                self.make_end(node.server, name=name, kind=kind, vni=vni, local=local,
                              remote=remote, mtu=self.mtu,
                              netns_pid=int(node.pid) if node.inNamespace else None)
            except (ClusterError, AgentError) as exc:
                raise RuntimeError(f"{node.name} on {node.server}: could not make tunnel "
                                   f"{name}: {exc}") from None
        record = Tunnel(link=tuple(sorted((self.fabric_name_of(node1.name),
                                           self.fabric_name_of(node2.name)))),
                        servers=(node1.server, node2.server), kind=kind,
                        interfaces=(name1, name2), vni=vni)
        self.tunnels.append(record)
        return record


def tunnel_link(plan: TunnelPlan):
    """The link class Mininet builds every link with, bound to the run's plan."""
    def make(node1, node2, **options):
        return TunnelLink(node1, node2, plan=plan, **options)
    return make


class FabricPlacer(Placer):
    """Mininet's `Placer` API over the testbed's own placement: Mininet asks
    it for each node's server by node name (switches carry the ``fe``
    prefix)."""

    def __init__(self, placement: Placement, fabric_name_of, **kwargs):
        super().__init__(**kwargs)      # servers, nodes, hosts, switches, links
        self.placement = placement
        self.fabric_name_of = fabric_name_of

    def place(self, node):
        return self.servers[self.placement.server_of[self.fabric_name_of(node)]]


def fabric_placer(placement: Placement, fabric_name_of):
    """The ``placement`` argument of `MininetCluster`, which calls it with the
    servers (in the order the placement numbers them) and the topology's
    nodes, hosts, switches and links."""
    def make(**kwargs):
        return FabricPlacer(placement, fabric_name_of, **kwargs)
    return make


def cluster_network(cluster, topo, placement: Placement, kinds: Dict, mtu: int,
                    fabric_name_of, ovs_datapath: bool = True):
    """A `MininetCluster` of ``topo`` over ``cluster``'s servers, not built yet,
    and the `TunnelPlan` its links between servers will be made with.

    Every node gets the run's ssh user and options; an OVS switch, the
    datapath its server has (the kernel's where the module is, else
    userspace).
    """
    from mininet.examples.cluster import MininetCluster

    names = [server.name for server in cluster.servers]
    for node in topo.nodes():
        info = topo.nodeInfo(node)
        server = cluster.server(names[placement.server_of[fabric_name_of(node)]])
        info.update(user=cluster.user, ssh_options=cluster.ssh_options())
        if ovs_datapath and topo.isSwitch(node):
            info["datapath"] = "kernel" if server.facts.get("kernel_datapath") else "user"
    plan = TunnelPlan(cluster.underlay, kinds, mtu, fabric_name_of, cluster.make_tunnel_end)
    ssh_dir = Path(os.environ.get("HOME", "/root")) / ".ssh" / "mn"
    made_ssh_dir = not ssh_dir.exists()
    net = MininetCluster(topo=topo, servers=names, user=cluster.user,
                         serverIP={s.name: s.address for s in cluster.servers},
                         placement=fabric_placer(placement, fabric_name_of),
                         host=ClusterHost, switch=ClusterSwitch, link=tunnel_link(plan),
                         precheck=False, controller=None, autoSetMacs=False,
                         autoStaticArp=False, build=False)
    if made_ssh_dir:
        # MininetCluster makes it for ssh control sockets the testbed does not
        # use; nothing of the run stays behind.
        for path in (ssh_dir, ssh_dir.parent):
            try:
                path.rmdir()
            except OSError:
                break
    return net, plan
