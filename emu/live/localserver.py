"""A second server on this machine, for testing cluster mode for real.

The testbed's cluster mode (Mininet Cluster Edition: nodes spread over
servers reached by ssh, their links tunnelled between the servers) needs a
second machine to be tested.  A ``LocalServer`` is that machine, built on
this one out of namespaces: its own network stack with an address, its own
sshd, its own Open vSwitch, and its own copies of the directories where a
machine keeps state that must not be shared (OVS sockets and database, the
testbed's lock and pid files, /tmp).  Tests and benches reach it exactly as
they would reach another server: ``ssh -F <server.ssh_config> 10.254.1.2``.

::

      root namespace (this machine)             netns fesrv1 + private mount ns
    +-------------------------------+         +-----------------------------------+
    | main OVS (/run/openvswitch)   |         | anchor: holds both namespaces     |
    | /run/fabric-emu (untouched)   |         | sshd          10.254.1.2:22       |
    |                               |  veth   | ovsdb-server, ovs-vswitchd        |
    | fesrv1-up  10.254.1.1/24  <=========>  fesrv1-eth  10.254.1.2/24          |
    |            mtu 9000           |         |             mtu 9000              |
    |                               |         |                                   |
    | /run/fesrv1/ (0700): keys,    |         | tmpfs: /run/openvswitch,          |
    |   sshd_config, ssh_config,    |         |   /etc/openvswitch,               |
    |   known_hosts, sshd.log       |         |   /var/log/openvswitch,           |
    +-------------------------------+         |   /run/fabric-emu, /tmp,          |
                                              |   /run/netns                      |
                                              +-----------------------------------+

Why each piece is there:

* **The network namespace** ``fesrvN`` gives the server its own interfaces,
  routes and address (10.254.N.2), so traffic between "servers" crosses a
  real link, and a tunnel endpoint on it is a different address from ours.
* **The veth pair** is that link.  Its MTU is 9000 at both ends because
  cluster mode carries the emulated hosts' 1500-byte frames inside tunnels:
  VXLAN adds 50 bytes (outer Ethernet 14, IP 20, UDP 8, VXLAN 8), GRETAP
  38; a 1550-byte packet on a 1500-MTU link would be fragmented or dropped,
  and TCP between emulated hosts on two servers would stall.
* **The private mount namespace** (created by one long-lived *anchor*
  process, ``ip netns exec fesrvN unshare --mount --propagation private``)
  gives the server what a second machine has on its own disk: tmpfs on
  /run/openvswitch, /etc/openvswitch and /var/log/openvswitch, so its OVS
  has its own database, sockets, pid files and logs and ``ovs-vsctl`` inside
  talks to *its* switch; tmpfs on /run/fabric-emu (the testbed's run
  directory, ``emu.live.state``), so the testbed on the server takes its own
  run lock and records its own pids, and cleaning up the server never sees
  this machine's; tmpfs on /tmp; and an empty /run/netns (the copies of this
  machine's named network namespaces are detached first, so the server
  neither sees them nor keeps them alive).  Propagation must be *private*:
  with shared propagation (systemd's default for /) the tmpfs over
  /run/openvswitch would appear in the root namespace too and hide the main
  OVS's sockets.  The anchor refuses to mount anything while any of its
  mounts is still shared, and ``start()`` checks afterwards that the root
  namespace still sees /run/openvswitch/db.sock if it did before.
  Everything else of the server is entered with ``nsenter -t <anchor> -m -n``
  and so shares the anchor's two namespaces.
* **Its own Open vSwitch** (``ovsdb-server`` + ``ovs-vswitchd``, the
  userspace datapath), because each server of a cluster has its own switch
  and the testbed creates bridges on it by name.
* **Its own sshd** (Debian's openssh-server), because cluster mode reaches
  servers by ssh and nothing else; keys are generated per server into a
  private 0700 directory (``/run/fesrvN`` by default) and a client config,
  ``ssh_config``, is written next to them: ``ssh -F <ssh_config> ADDRESS``
  logs in as root with that key only and checks the host key it generated.

Everything is named with the prefix ``fesrv`` (netns ``fesrv1``, veth ends
``fesrv1-up`` in the root namespace and ``fesrv1-eth`` inside, directory
``/run/fesrv1``); nothing else on the machine is touched.  ``stop()``
removes all of it, and ``remove_leftovers()`` removes what a killed run
left behind: by those names, and the server's processes, found by namespace
and never by command line: those in its netns, and those whose mount
namespace holds its tmpfs on /run/fabric-emu (a Mininet host started on the
server with ``mnexec -n`` has a netns of its own but a copy of the server's
mounts).

What it does not isolate: there is no PID namespace, so a process on the
server sees, and as root may signal, every process of the machine; a
``pkill`` or ``mn -c`` run over ssh on the server reaches this machine's
processes too.  The testbed itself stops processes by recorded pid (in the
server's own /run/fabric-emu), so it stays on its side.  Nor is the rest of
the file system private (/root, /etc but OVS's, the repository), and /sys
inside is the fresh sysfs ``ip netns exec`` mounts, without /sys/fs/cgroup
or /sys/fs/bpf under it.

The private directory must not be under a directory the server masks with
tmpfs (/tmp above all: sshd inside would not see its keys), so the default
is /run and ``workdir`` is checked.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from emu.live.state import process_start_time, signal_process
from emu.live.waiting import WaitTimeout, wait_until

PREFIX = "fesrv"
MAX_INDEX = 200
NAME_RE = re.compile(rf"^{PREFIX}(\d+)$")
LINK_RE = re.compile(rf"^{PREFIX}(\d+)-(up|eth)$")
DEFAULT_WORKDIR = "/run"
MTU = 9000
SSHD = "/usr/sbin/sshd"
SSHD_PRIVSEP_DIR = "/run/sshd"
OVS_SCHEMA = "/usr/share/openvswitch/vswitch.ovsschema"
ROOT_DB_SOCK = "/run/openvswitch/db.sock"
# The server's testbed run directory: emu.live.state's default RUN_DIR.  A
# command run over ssh gets sshd's environment, so FABRIC_EMU_RUN_DIR set
# here does not follow it; the server uses the default path.
SERVER_RUN_DIR = "/run/fabric-emu"
# Directories that get an empty tmpfs inside the server, with their modes.
TMPFS = (("/run/openvswitch", "0755"), ("/etc/openvswitch", "0755"),
         ("/var/log/openvswitch", "0755"), (SERVER_RUN_DIR, "0700"),
         ("/tmp", "1777"), ("/run/netns", "0755"))
START_TIMEOUT_S = 10.0
GRACE_S = 2.0

# The anchor: runs in the new mount namespace (and the netns), checks that no
# mount of it is shared, detaches its copies of the root namespace's named
# netns, mounts the tmpfs, says "ready PID" and sleeps until killed.  A path
# given as "+PATH:STAGING" stays visible at PATH although a tmpfs covers
# its parent: the testbed's checkout, which cluster mode runs at the same
# path on every server, when it sits under /tmp (a CI checkout may).
ANCHOR = r"""
import os, signal, subprocess, sys
def mounts():
    with open("/proc/self/mountinfo") as f:
        return [l.split(" - ")[0].split() for l in f]
shared = [m[4] for m in mounts() if any(o.startswith("shared:") for o in m[6:])]
if shared:
    sys.exit("fesrv anchor: mounts still shared, refusing to mount: %s" % shared[:5])
netns = sorted((m[4] for m in mounts() if m[4].startswith("/run/netns/")), key=len, reverse=True)
for target in netns:
    subprocess.run(["umount", "-l", target], check=True)
keeps = [a[1:].rsplit(":", 1) for a in sys.argv[1:] if a.startswith("+")]
for source, staging in keeps:
    os.makedirs(staging, exist_ok=True)
    subprocess.run(["mount", "--bind", source, staging], check=True)
for spec in (a for a in sys.argv[1:] if not a.startswith("+")):
    target, mode = spec.rsplit(":", 1)
    os.makedirs(target, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=" + mode, "fesrv", target], check=True)
for source, staging in keeps:
    os.makedirs(source, exist_ok=True)
    subprocess.run(["mount", "--move", staging, source], check=True)
print("ready", os.getpid(), flush=True)
while True:
    signal.pause()
"""


class LocalServerError(RuntimeError):
    """The server could not be started or stopped; the message says why."""


# ------------------------------------------------------------------ helpers
def _run(args: Sequence[str], timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    return subprocess.run(list(args), check=False, timeout=timeout, **kw)


def _must(args: Sequence[str], timeout: float = 30) -> str:
    done = _run(args, timeout=timeout)
    if done.returncode != 0:
        raise LocalServerError(f"{' '.join(args)} failed ({done.returncode}): "
                               f"{(done.stderr or done.stdout).strip()}")
    return done.stdout


def _netns_names() -> List[str]:
    """Named network namespaces of ours (``ip netns list`` may add ``(id: 3)``)."""
    done = _run(["ip", "netns", "list"])
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    return [n for n in names if NAME_RE.match(n)]


def _netns_pids(name: str) -> List[int]:
    done = _run(["ip", "netns", "pids", name])
    if done.returncode != 0:
        return []
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def _links() -> List[str]:
    """Interfaces of the root namespace named like our veth ends."""
    done = _run(["ip", "-json", "link", "show"])
    try:
        links = json.loads(done.stdout or "[]")
    except ValueError:
        return []
    return [link["ifname"] for link in links
            if isinstance(link, dict) and LINK_RE.match(link.get("ifname", ""))]


def _dirs(root: str = DEFAULT_WORKDIR) -> List[Path]:
    try:
        return [Path(root) / n for n in sorted(os.listdir(root))
                if NAME_RE.match(n) and (Path(root) / n).is_dir()
                and not (Path(root) / n).is_symlink()]
    except OSError:
        return []


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def _run_dir_device(pid: int) -> Optional[int]:
    """The device of /run/fabric-emu as process ``pid`` sees it (through its
    mount namespace), when it is a mount point there and not this machine's."""
    try:
        inner = os.stat(f"/proc/{pid}/root{SERVER_RUN_DIR}").st_dev
        parent = os.stat(f"/proc/{pid}/root{os.path.dirname(SERVER_RUN_DIR)}").st_dev
    except OSError:
        return None
    try:
        ours = os.stat(SERVER_RUN_DIR).st_dev
    except OSError:
        ours = None
    return inner if inner != parent and inner != ours else None


def _server_device(name: str) -> Optional[int]:
    """The device of server ``name``'s tmpfs on /run/fabric-emu, found through
    a live process of its netns (so it is certainly that server's)."""
    for pid in _netns_pids(name):
        device = _run_dir_device(pid)
        if device is not None:
            return device
    return None


def _server_pids(name: str) -> List[int]:
    """Every process of server ``name``: those in its netns, and those whose
    mount namespace holds its /run/fabric-emu tmpfs: processes that made
    namespaces of their own inside it (a Mininet host started there with
    ``mnexec -n`` has its own netns and a copy of the server's mounts)."""
    pids = set(_netns_pids(name))
    device = _server_device(name)
    if device is not None:
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != os.getpid() \
                    and _run_dir_device(int(entry)) == device:
                pids.add(int(entry))
    return sorted(pids)


def _kill_netns_processes(name: str, grace_s: float = GRACE_S) -> List[str]:
    """SIGTERM every process of server ``name`` (``_server_pids``), SIGKILL
    what is left after ``grace_s``; again until none is left (sshd may fork
    while we kill)."""
    killed: List[str] = []
    for _ in range(5):
        pids = _server_pids(name)
        if not pids:
            break
        killed += [f"process {p} ({_comm(p)}) of {name}" for p in pids]
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pids:
                signal_process(pid, sig)
            try:
                wait_until(lambda: not any(process_start_time(p) for p in pids), grace_s,
                           f"the processes of netns {name} to exit")
                break
            except WaitTimeout:
                continue
    return killed


def _delete_link(name: str) -> bool:
    return _run(["ip", "link", "delete", name]).returncode == 0


def _delete_netns(name: str) -> bool:
    return _run(["ip", "netns", "delete", name]).returncode == 0


def check_index(index) -> int:
    if isinstance(index, bool) or not isinstance(index, int) or not 1 <= index <= MAX_INDEX:
        raise ValueError(f"LocalServer index must be an int from 1 to {MAX_INDEX} "
                         f"(it names fesrvN and its network 10.254.N.0/24), not {index!r}")
    return index


def remove_leftovers(log: Callable[[str], None] = print,
                     index: Optional[int] = None) -> List[str]:
    """Remove what servers of an interrupted earlier run left: the processes
    in each ``fesrvN`` netns (SIGTERM, then SIGKILL), the netns, the veth
    ends ``fesrvN-up``/``fesrvN-eth`` and the directories ``/run/fesrvN``
    (a server given another ``workdir`` removes its own when it starts).
    Only server ``index`` when given, every ``fesrv*`` otherwise.  Returns
    (and logs) what was removed."""
    def ours(name: str) -> bool:
        match = NAME_RE.match(name) or LINK_RE.match(name)
        return bool(match) and (index is None or int(match.group(1)) == index)

    removed: List[str] = []
    for name in [n for n in _netns_names() if ours(n)]:
        removed += _kill_netns_processes(name)
        if _delete_netns(name):
            removed.append(f"netns {name}")
    for link in [n for n in _links() if ours(n)]:
        if _delete_link(link):
            removed.append(f"link {link}")
    for path in [p for p in _dirs() if ours(p.name)]:
        shutil.rmtree(path, ignore_errors=True)
        removed.append(f"directory {path}")
    for item in removed:
        log(f"{PREFIX}: removed leftover {item}")
    return removed


def all_leftovers() -> List[str]:
    """Every ``fesrv*`` netns, process in one, veth end and /run directory."""
    found: List[str] = []
    for name in _netns_names():
        found.append(f"netns {name}")
        found += [f"process {p} ({_comm(p)}) of {name}" for p in _server_pids(name)]
    found += [f"link {link}" for link in _links()]
    found += [f"directory {path}" for path in _dirs()]
    return found


# ------------------------------------------------------------------ the server
class LocalServer:
    """A second server on this machine: netns ``fesrvN`` at 10.254.N.2 with
    its own sshd and Open vSwitch (see the module's docstring).

    ``with LocalServer(1) as server: ssh -F server.ssh_config server.address ...``

    The constructor creates nothing; ``start()`` builds the server (after
    removing leftovers of the same index) and returns once ssh into it
    works; ``stop()`` removes all of it and may be called any number of
    times, after a failed start too (start() cleans up after itself when it
    fails).  ``workdir`` (default /run) holds the private directory
    ``<workdir>/fesrvN``; it must not be under a directory the server masks
    (/tmp above all).
    """

    def __init__(self, index: int = 1, workdir: Optional[os.PathLike] = None,
                 log: Callable[[str], None] = lambda message: None):
        self.index = check_index(index)
        self.name = f"{PREFIX}{index}"
        self.netns = self.name
        self.address = f"10.254.{index}.2"
        self.host_address = f"10.254.{index}.1"
        self.prefixlen = 24
        self.host_link = f"{self.name}-up"
        self.server_link = f"{self.name}-eth"
        base = Path(workdir) if workdir is not None else Path(DEFAULT_WORKDIR)
        self.private_dir = base.absolute() / self.name
        self._check_private_dir()
        self.ssh_config = self.private_dir / "ssh_config"
        self.sshd_config = self.private_dir / "sshd_config"
        self.host_key = self.private_dir / "ssh_host_ed25519_key"
        self.client_key = self.private_dir / "id_ed25519"
        self.known_hosts = self.private_dir / "known_hosts"
        self.sshd_log = self.private_dir / "sshd.log"
        self.anchor_pid: Optional[int] = None
        self.log = log
        self.timings: Dict[str, float] = {}
        self._anchor: Optional[subprocess.Popen] = None
        self._sshd: Optional[subprocess.Popen] = None
        self._pids: Dict[int, tuple] = {}       # pid -> (start time, what)
        self._started = False                   # start() began: stop() has work to do

    def __repr__(self) -> str:
        return f"LocalServer({self.index}, {self.address}, anchor={self.anchor_pid})"

    def _check_private_dir(self) -> None:
        real = os.path.realpath(self.private_dir)
        for masked, _ in TMPFS:
            masked = os.path.realpath(masked)
            if real == masked or real.startswith(masked + os.sep):
                raise ValueError(f"LocalServer workdir {self.private_dir.parent} is under "
                                 f"{masked}, which the server masks with tmpfs: its sshd "
                                 "would not see its keys; use a directory elsewhere "
                                 f"(default {DEFAULT_WORKDIR})")

    # ---------------------------------------------------------------- context
    def __enter__(self) -> "LocalServer":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---------------------------------------------------------------- commands
    @property
    def running(self) -> bool:
        return self._anchor is not None and self._anchor.poll() is None

    def nsenter(self, args: Sequence[str]) -> List[str]:
        """The argument list that runs ``args`` inside the server."""
        if self.anchor_pid is None:
            raise LocalServerError(f"{self.name} is not running")
        if isinstance(args, (str, bytes)):
            raise TypeError("LocalServer commands are argument lists, not shell strings")
        return ["nsenter", "-t", str(self.anchor_pid), "-m", "-n", "--", *map(str, args)]

    def run(self, args: Sequence[str], **kw) -> subprocess.CompletedProcess:
        """Run a command inside the server's namespaces (``nsenter``, no
        shell); output captured as text unless ``kw`` says otherwise, no
        check unless ``check=True``, 60 s timeout by default."""
        if self._anchor is not None and self._anchor.poll() is not None:
            raise LocalServerError(f"{self.name}'s anchor exited ({self._anchor.returncode})")
        if not any(k in kw for k in ("stdout", "stderr", "capture_output")):
            kw["capture_output"] = True
        kw.setdefault("text", True)
        kw.setdefault("timeout", 60)
        kw.setdefault("check", False)
        return subprocess.run(self.nsenter(args), **kw)

    def ssh_args(self, *command: str) -> List[str]:
        """``ssh -F <ssh_config> ADDRESS command...`` (the remote side joins
        ``command`` into one shell line, as ssh always does)."""
        return ["ssh", "-F", str(self.ssh_config), self.address, *command]

    def _must(self, args: Sequence[str], timeout: float = 30) -> str:
        done = self.run(args, timeout=timeout)
        if done.returncode != 0:
            raise LocalServerError(f"in {self.name}: {' '.join(map(str, args))} failed "
                                   f"({done.returncode}): {(done.stderr or done.stdout).strip()}")
        return done.stdout

    def _remember(self, pid: int, what: str) -> None:
        start = process_start_time(pid)
        if start is not None:
            self._pids[pid] = (start, what)

    # ---------------------------------------------------------------- start
    def start(self) -> "LocalServer":
        if self._started:
            raise LocalServerError(f"{self.name} is already started")
        began = time.monotonic()
        remove_leftovers(log=self.log, index=self.index)
        self._started = True
        if self.private_dir.exists():
            shutil.rmtree(self.private_dir)
            self.log(f"{self.name}: removed leftover directory {self.private_dir}")
        db_sock_before = os.path.exists(ROOT_DB_SOCK)
        try:
            self._check_network_free()
            self._make_private_dir()
            self._make_network()
            self._start_anchor()
            self._check_root_untouched(db_sock_before)
            self._start_ovs()
            self._make_keys()
            self._start_sshd()
        except BaseException:
            try:
                self.stop()
            except Exception as error:                  # the start's error matters more
                self.log(f"{self.name}: cleaning up after a failed start: {error}")
            raise
        self.timings["start_s"] = time.monotonic() - began
        self.log(f"{self.name}: up at {self.address} in {self.timings['start_s']:.2f} s")
        return self

    def _check_network_free(self) -> None:
        """No interface of this machine may already have an address in 10.254.N.0/24."""
        done = _run(["ip", "-json", "-4", "addr", "show"])
        net = f"10.254.{self.index}."
        for link in json.loads(done.stdout or "[]"):
            for addr in link.get("addr_info", []):
                if str(addr.get("local", "")).startswith(net):
                    raise LocalServerError(
                        f"{link.get('ifname')} already has {addr['local']}, in {self.name}'s "
                        f"network 10.254.{self.index}.0/24; choose another index")

    def _make_private_dir(self) -> None:
        self.private_dir.parent.mkdir(parents=True, exist_ok=True)
        self.private_dir.mkdir(mode=0o700)
        os.chmod(self.private_dir, 0o700)

    def _make_network(self) -> None:
        _must(["ip", "netns", "add", self.netns])
        _must(["ip", "link", "add", self.host_link, "mtu", str(MTU), "type", "veth",
               "peer", "name", self.server_link, "mtu", str(MTU), "netns", self.netns])
        _must(["ip", "addr", "add", f"{self.host_address}/{self.prefixlen}",
               "dev", self.host_link])
        _must(["ip", "link", "set", self.host_link, "up"])
        inside = ["ip", "-n", self.netns]
        _must(inside + ["link", "set", "lo", "up"])
        _must(inside + ["addr", "add", f"{self.address}/{self.prefixlen}",
                        "dev", self.server_link])
        _must(inside + ["link", "set", self.server_link, "up"])

    def _start_anchor(self) -> None:
        specs = [f"{target}:{mode}" for target, mode in TMPFS]
        # The checkout stays where it is inside the server, as on a real
        # second server with the same checkout at the same path.
        checkout = Path(__file__).resolve().parents[2]
        if any(checkout == Path(t) or Path(t) in checkout.parents for t, _ in TMPFS):
            specs.append(f"+{checkout}:{self.private_dir / 'checkout'}")
        args = ["ip", "netns", "exec", self.netns, "unshare", "--mount",
                "--propagation", "private", sys.executable, "-I", "-c", ANCHOR, *specs]
        with open(self.private_dir / "anchor.log", "wb") as errors:
            self._anchor = subprocess.Popen(args, stdin=subprocess.DEVNULL,
                                            stdout=subprocess.PIPE, stderr=errors,
                                            start_new_session=True)
        line = b""
        deadline = time.monotonic() + START_TIMEOUT_S
        while not line.endswith(b"\n") and time.monotonic() < deadline:
            ready, _, _ = select.select([self._anchor.stdout], [], [], 0.1)
            if ready:
                chunk = os.read(self._anchor.stdout.fileno(), 256)
                if not chunk:
                    break
                line += chunk
        self._anchor.stdout.close()
        words = line.split()
        if len(words) != 2 or words[0] != b"ready":
            error = (self.private_dir / "anchor.log").read_text(errors="replace").strip()
            raise LocalServerError(f"{self.name}'s anchor did not come up "
                                   f"(said {line!r}): {error or 'no message'}")
        self.anchor_pid = int(words[1])
        if self.anchor_pid != self._anchor.pid:        # ip netns exec and unshare exec
            raise LocalServerError(f"{self.name}'s anchor is pid {self.anchor_pid}, "
                                   f"not the started {self._anchor.pid}")
        self._remember(self.anchor_pid, "anchor")

    def _check_root_untouched(self, db_sock_before: bool) -> None:
        """The tmpfs mounts must not have reached the root namespace."""
        if db_sock_before and not os.path.exists(ROOT_DB_SOCK):
            raise LocalServerError(f"{ROOT_DB_SOCK} vanished from the root namespace when "
                                   f"{self.name} mounted its tmpfs: propagation is not private")
        inside = self._must(["stat", "-c", "%d", *(t for t, _ in TMPFS)]).split()
        for (target, _), device in zip(TMPFS, inside):
            if os.path.exists(target) and str(os.stat(target).st_dev) == device:
                raise LocalServerError(f"{target} is the same file system inside {self.name} "
                                       "as outside: its tmpfs is visible in the root namespace")

    def _start_ovs(self) -> None:
        self._must(["ovsdb-tool", "create", "/etc/openvswitch/conf.db", OVS_SCHEMA])
        self._must(["ovsdb-server", "--remote=punix:/run/openvswitch/db.sock",
                    "--pidfile", "--detach", "--log-file"])
        self._must(["ovs-vsctl", "--no-wait", "init"])
        # --detach returns once vswitchd has read the database and set up.
        self._must(["ovs-vswitchd", "--pidfile", "--detach", "--log-file"])
        try:
            wait_until(lambda: self.run(["ovs-vsctl", "--timeout=3", "show"]).returncode == 0
                       and self.run(["ovs-appctl", "-t", "ovs-vswitchd",
                                     "version"]).returncode == 0,
                       START_TIMEOUT_S, f"Open vSwitch in {self.name}")
        except WaitTimeout as error:
            raise LocalServerError(f"{error}; {self._log_tail('/var/log/openvswitch')}") \
                from None
        for daemon in ("ovsdb-server", "ovs-vswitchd"):
            pid = self.run(["cat", f"/run/openvswitch/{daemon}.pid"]).stdout.strip()
            if pid.isdigit():
                self._remember(int(pid), daemon)

    def _log_tail(self, directory: str) -> str:
        done = self.run(["sh", "-c", 'tail -n 5 "$1"/*.log', "sh", directory])
        return done.stdout.strip() or "no log"

    def _make_keys(self) -> None:
        for path, comment in ((self.host_key, f"{self.name}-host"),
                              (self.client_key, f"{self.name}-client")):
            _must(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment,
                   "-f", str(path)])
            os.chmod(path, 0o600)
        host_public = self.host_key.with_suffix(".pub").read_text().split()
        self._write(self.known_hosts, f"{self.address} {host_public[0]} {host_public[1]}\n")
        self._write(self.sshd_config, "\n".join([
            f"# {self.name}: written by emu.live.localserver, removed by its stop()",
            f"ListenAddress {self.address}",
            "Port 22",
            f"HostKey {self.host_key}",
            f"PidFile {self.private_dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {self.client_key.with_suffix('.pub')}",
            "PermitRootLogin prohibit-password",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "MaxSessions 100",
            "MaxStartups 100:30:200",
            "AllowTcpForwarding yes",
            "AllowStreamLocalForwarding yes",
            "X11Forwarding no",
            "PrintMotd no",
            # scp speaks SFTP since OpenSSH 9.0: without this it fails.
            "Subsystem sftp /usr/lib/openssh/sftp-server",
        ]) + "\n")
        self._write(self.ssh_config, "\n".join([
            f"# {self.name}: ssh -F {self.ssh_config} {self.address}",
            f"Host {self.address} {self.name}",
            f"    HostName {self.address}",
            f"    HostKeyAlias {self.address}",
            "    User root",
            f"    IdentityFile {self.client_key}",
            "    IdentitiesOnly yes",
            f"    UserKnownHostsFile {self.known_hosts}",
            "    GlobalKnownHostsFile /dev/null",
            "    StrictHostKeyChecking yes",
            "    BatchMode yes",
            "    ConnectTimeout 5",
            "    LogLevel ERROR",
        ]) + "\n")

    @staticmethod
    def _write(path: Path, text: str) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as stream:
            stream.write(text)

    def _start_sshd(self) -> None:
        if not os.path.exists(SSHD):
            raise LocalServerError(f"{SSHD} is missing: apt-get install -y openssh-server "
                                   "(bootstrap.sh installs it)")
        # The privilege separation directory sshd chroots into; /run is the
        # root namespace's (only the tmpfs directories are the server's own).
        os.makedirs(SSHD_PRIVSEP_DIR, mode=0o755, exist_ok=True)
        self._must([SSHD, "-t", "-f", self.sshd_config])
        with open(self.private_dir / "sshd.stderr", "wb") as errors:
            self._sshd = subprocess.Popen(
                self.nsenter([SSHD, "-D", "-f", self.sshd_config, "-E", self.sshd_log]),
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                start_new_session=True)
        self._remember(self._sshd.pid, "sshd")

        def logged_in() -> bool:
            if self._sshd.poll() is not None:
                raise LocalServerError(f"{self.name}'s sshd exited ({self._sshd.returncode}): "
                                       f"{self._sshd_messages()}")
            return _run(self.ssh_args("-o", "ConnectTimeout=2", "true"),
                        timeout=10).returncode == 0
        try:
            wait_until(logged_in, START_TIMEOUT_S, f"ssh into {self.name}", interval_s=0.1)
        except WaitTimeout as error:
            last = _run(self.ssh_args("-o", "ConnectTimeout=2", "-o", "LogLevel=INFO",
                                      "true"), timeout=10)
            said = self._sshd_messages()
            hint = ""
            if "account is locked" in said:
                # With UsePAM no, sshd refuses a locked account ('!' in
                # /etc/shadow) even to a key; '*' (no password) is fine.
                hint = ("; root's account is locked, which sshd with UsePAM no refuses "
                        "even with a key: give root an unusable password instead of a "
                        "locked one (usermod -p '*' root)")
            raise LocalServerError(f"{error}; ssh said: {last.stderr.strip()}; "
                                   f"sshd said: {said}{hint}") from None

    def _sshd_messages(self) -> str:
        text = ""
        for name in ("sshd.stderr", "sshd.log"):
            try:
                text += (self.private_dir / name).read_text(errors="replace")
            except OSError:
                pass
        return " | ".join(text.strip().splitlines()[-5:]) or "nothing"

    # ---------------------------------------------------------------- stop
    def stop(self) -> None:
        """Kill every process of the server (sshd, the OVS daemons, ssh
        sessions, the anchor), delete its netns, veth and private directory.
        Raises LocalServerError if anything is still there afterwards.
        Does nothing unless start() was called since the last stop(), so it
        never removes a server of the same index that another object runs."""
        if not self._started:
            return
        began = time.monotonic()
        try:
            if self._sshd is not None and self._sshd.poll() is None:
                self._sshd.terminate()
            if self.netns in _netns_names():
                _kill_netns_processes(self.netns)
        finally:
            try:
                # Processes of ours that are no longer (or never were) in the netns.
                for pid, (start, _) in list(self._pids.items()):
                    if process_start_time(pid) == start:
                        signal_process(pid, signal.SIGKILL)
                for child in (self._sshd, self._anchor):
                    if child is not None:
                        if child.poll() is None:
                            child.kill()
                        child.wait(timeout=10)
            finally:
                if self.netns in _netns_names():
                    _delete_netns(self.netns)
                for link in (self.host_link, self.server_link):
                    if link in _links():
                        _delete_link(link)
                shutil.rmtree(self.private_dir, ignore_errors=True)
                self._sshd = self._anchor = None
                self.anchor_pid = None
        try:
            # Deleting a netns frees its veth end asynchronously.
            wait_until(lambda: not self.leftovers(), 5.0, f"{self.name} to be gone")
        except WaitTimeout:
            raise LocalServerError(f"{self.name} left behind: {self.leftovers()}") from None
        self._pids.clear()
        self._started = False
        self.timings["stop_s"] = time.monotonic() - began

    def leftovers(self) -> List[str]:
        """What of this server is still on the machine: its netns and the
        processes in it, its veth ends, processes it started that are still
        alive elsewhere, its private directory."""
        found: List[str] = []
        if self.netns in _netns_names():
            found.append(f"netns {self.netns}")
            found += [f"process {p} ({_comm(p)}) of {self.netns}"
                      for p in _server_pids(self.netns)]
        found += [f"link {link}" for link in _links()
                  if link in (self.host_link, self.server_link)]
        for pid, (start, what) in self._pids.items():
            if process_start_time(pid) == start and not any(f"process {pid} " in f for f in found):
                found.append(f"process {pid} ({what})")
        if self.private_dir.exists():
            found.append(f"directory {self.private_dir}")
        return found
