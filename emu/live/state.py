"""What this testbed owns on the machine, the run lock, and cleanup.

Everything we create is either named with our prefix (OVS bridges ``fe*``
and their ``fe*-eth*`` ports) or recorded in ``/run/fabric-emu/owned.jsonl``
(process ids with their start time, so a recycled pid is never killed).
Cleanup removes exactly that; it never pattern-kills by command line.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import subprocess
from typing import List, Optional

from emu.live.waiting import WaitTimeout, wait_until
from topologies.naming import SWITCH_PREFIX

RUN_DIR = os.environ.get("FABRIC_EMU_RUN_DIR", "/run/fabric-emu")
LOCK_PATH = os.path.join(RUN_DIR, "lock")
OWNED_PATH = os.path.join(RUN_DIR, "owned.jsonl")
BRIDGE_RE = re.compile(rf"^{SWITCH_PREFIX}[so]\d+$")
PORT_RE = re.compile(rf"^{SWITCH_PREFIX}[so]\d+-eth\d+$")


class AlreadyRunning(RuntimeError):
    """Another emulation holds the lock."""


def ensure_run_dir() -> None:
    os.makedirs(RUN_DIR, mode=0o700, exist_ok=True)
    os.chmod(RUN_DIR, 0o700)


class RunLock:
    """An exclusive flock: Mininet is global state, one emulation at a time."""

    def __init__(self, path: str = LOCK_PATH):
        self.path = path
        self._fd: Optional[int] = None

    def acquire(self, description: str = "") -> "RunLock":
        ensure_run_dir()
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
            os.close(fd)
            raise AlreadyRunning("another emulation is running on this machine "
                                 f"({holder or 'holder unknown'}); wait for it to finish, "
                                 "or stop it with Ctrl-C") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()}: {description}".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self):
        if self._fd is None:
            self.acquire()
        return self

    def __exit__(self, *exc):
        self.release()


# ---------------------------------------------------------------- ownership
def process_start_time(pid: int) -> Optional[int]:
    """Start time of a live process; None once it is gone or a zombie (it has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as stream:
            fields = stream.read().rsplit(")", 1)[1].split()
        return None if fields[0] in ("Z", "X") else int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def record_pid(pid: int, what: str) -> None:
    ensure_run_dir()
    entry = {"pid": pid, "start": process_start_time(pid), "what": what}
    with open(OWNED_PATH, "a") as stream:
        stream.write(json.dumps(entry) + "\n")


def owned_pids() -> List[dict]:
    try:
        with open(OWNED_PATH) as stream:
            return [json.loads(line) for line in stream if line.strip()]
    except FileNotFoundError:
        return []


def _alive_and_ours(entry: dict) -> bool:
    start = process_start_time(entry["pid"])
    return start is not None and start == entry.get("start")


def kill_owned(grace_s: float = 3.0) -> List[str]:
    """Terminate every recorded process still alive; returns what was killed."""
    alive = [e for e in owned_pids() if _alive_and_ours(e)]
    for entry in alive:
        signal_process(entry["pid"], signal.SIGTERM)
    try:
        wait_until(lambda: not any(_alive_and_ours(e) for e in alive), grace_s,
                   "recorded processes to exit")
    except WaitTimeout:
        pass  # the stragglers get SIGKILL below
    for entry in alive:
        if _alive_and_ours(entry):
            signal_process(entry["pid"], signal.SIGKILL)
    return [f"{e['what']} (pid {e['pid']})" for e in alive]


def signal_process(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _run(args) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=60)


def our_bridges() -> List[str]:
    result = _run(["ovs-vsctl", "--timeout=10", "list-br"])
    if result.returncode != 0:
        return []
    return [b for b in result.stdout.split() if BRIDGE_RE.match(b)]


def our_links(listing: Optional[str] = None) -> List[str]:
    """Interfaces of this namespace named like our switch ports (``fes3-eth1``),
    from iproute2's JSON listing (``listing``: that JSON, for tests)."""
    if listing is None:
        result = _run(["ip", "-json", "link", "show"])
        listing = result.stdout if result.returncode == 0 else "[]"
    try:
        links = json.loads(listing or "[]")
    except ValueError:
        return []
    return [link["ifname"] for link in links
            if isinstance(link, dict) and PORT_RE.match(link.get("ifname", ""))]


def clean(log=print) -> List[str]:
    """Remove everything this testbed owns on the machine; returns what it removed."""
    removed = kill_owned()
    bridges = our_bridges()
    if bridges:
        args = ["ovs-vsctl", "--timeout=60"]
        for bridge in bridges:
            args += ["--", "--if-exists", "del-br", bridge]
        _run(args)
        removed += [f"OVS bridge {b}" for b in bridges]
    for link in our_links():
        _run(["ip", "link", "delete", link])
        removed.append(f"link {link}")
    for path in (OWNED_PATH,):
        if os.path.exists(path):
            os.unlink(path)
    for name in os.listdir(RUN_DIR) if os.path.isdir(RUN_DIR) else []:
        # .ctl: another server's ovs-vswitchd socket, forwarded (cluster mode).
        if name.endswith((".sock", ".json", ".ctl", ".tmp")):
            os.unlink(os.path.join(RUN_DIR, name))
    for item in removed:
        log(f"cleaned: {item}")
    return removed
