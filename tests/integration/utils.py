"""Helpers for integration tests: real OVS, real controller, real flows."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import List

from emu.live import state
from emu.live.waiting import WaitTimeout, wait_until

REPO = Path(__file__).resolve().parents[2]


def mininet_shells() -> List[int]:
    """Mininet host shells still alive (their command line ends in mininet:NAME)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.startswith(b"mininet:") for arg in cmdline):
            pids.append(int(entry))
    return pids


def leftovers() -> List[str]:
    found = [f"bridge {b}" for b in state.our_bridges()]
    found += [f"link {link}" for link in state.our_links()]
    found += [f"mininet shell pid {p}" for p in mininet_shells()]
    found += [f"{e['what']} pid {e['pid']}" for e in state.owned_pids()
              if state._alive_and_ours(e)]
    return found


def assert_no_leftovers(timeout_s: float = 15.0) -> None:
    try:
        wait_until(lambda: not leftovers(), timeout_s, "the testbed's objects to be gone")
    except WaitTimeout:
        raise AssertionError(f"left behind after the run: {leftovers()}") from None


def run_cli(*args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([os.sys.executable, "-m", "emu.run", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout_s)


def assert_ping(bed, src: str, dst: str, count: int = 3) -> None:
    """ping from src to dst; the failure message shows what ping said."""
    target = bed.fabric.graph.nodes[dst]["ip"]
    out = bed.host(src).cmd(f"ping -c {count} -i 0.2 -W 1 {target}")
    assert f"{count} received" in out or " 0% packet loss" in out, \
        f"{src} -> {dst} ({target}) failed:\n{out}"


def only_run(out: Path) -> Path:
    runs = [p for p in Path(out).iterdir() if p.is_dir()]
    assert len(runs) == 1, f"expected one run folder in {out}, found {runs}"
    return runs[0]


def run_ok(scenario: str, out: Path, *overrides: str, files=(), timeout_s: float = 600):
    """Run a scenario through the command line; it must succeed and write ``files``.

    Returns (run folder, result.json as a dict).
    """
    args = [a for o in overrides for a in ("--set", o)]
    done = run_cli(scenario, "--out", str(out), *args, timeout_s=timeout_s)
    assert done.returncode == 0, done.stdout + done.stderr
    run = only_run(out)
    result = json.loads((run / "result.json").read_text())
    assert result["status"] == "ok", result["status"]
    for name in files:
        assert (run / name).is_file(), f"{name} missing from {run}: {sorted(os.listdir(run))}"
    return run, result


def exposed_listeners(kernel_before=(), runner: int = None) -> list:
    """What the testbed's processes, the ``runner`` process among them (and
    the kernel, for the testbed: sockets that were not there before) listen
    on beyond loopback in this machine's root namespace; empty when all is
    well."""
    import psutil

    from emu.live import listening

    pids = listening.our_pids()
    if runner is not None:
        pids |= {runner} | {child.pid for child in psutil.Process(runner).children(True)}
    ours = listening.non_loopback_listeners(pids)
    known = {(item.socket.table, item.socket.address, item.socket.port)
             for item in kernel_before}
    kernel = [item for item in listening.kernel_listeners()
              if (item.socket.table, item.socket.address, item.socket.port) not in known]
    return ours + kernel
