"""`emu.live.linkstate` on a real kernel: a namespace of its own, held by a
sleeping process, with a veth pair in it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest

from emu.live.linkstate import LinkStateError, LinkSwitch

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                                reason="needs root for a network namespace of its own")


@pytest.fixture
def namespace():
    """The pid of a process alone in a new network namespace with a veth pair d0-d1, up."""
    holder = subprocess.Popen(["unshare", "--net", "sleep", "60"])
    try:
        for _ in range(100):      # unshare has moved into its namespace once it execs sleep
            if os.readlink(f"/proc/{holder.pid}/ns/net") != os.readlink("/proc/self/ns/net"):
                break
            time.sleep(0.01)
        # A veth pair: this kernel has veth, not the dummy driver.
        _ip(holder.pid, "link", "add", "d0", "type", "veth", "peer", "name", "d1")
        for name in ("d0", "d1"):
            _ip(holder.pid, "link", "set", name, "up")
        yield holder.pid
    finally:
        holder.kill()
        holder.wait()


def _ip(pid, *args):
    return subprocess.run(["nsenter", "-t", str(pid), "-n", "ip", *args], check=True,
                          capture_output=True, text=True, timeout=10).stdout


def _is_up(pid, name):
    return "UP" in json.loads(_ip(pid, "-j", "link", "show", name))[0]["flags"]


def test_interfaces_go_down_and_up_in_their_namespace_and_only_those(namespace):
    switch = LinkSwitch()
    try:
        switch.ready([(namespace, "d0")])
        switch.change([(namespace, "d0")], up=False)
        assert not _is_up(namespace, "d0"), "d0 down in its own namespace"
        assert _is_up(namespace, "d1"), "an interface not named stays as it was"
        switch.change([(namespace, "d0"), (namespace, "d1")], up=False)
        assert not _is_up(namespace, "d1")
        switch.change([(namespace, "d0"), (namespace, "d1")], up=True)
        assert _is_up(namespace, "d0") and _is_up(namespace, "d1")
    finally:
        switch.close()


def test_a_missing_interface_is_named_with_its_namespace_before_anything_changes(namespace):
    switch = LinkSwitch()
    try:
        with pytest.raises(LinkStateError,
                           match=f"no interface nope in the namespace of pid {namespace}"):
            switch.change([(namespace, "d0"), (namespace, "nope")], up=False)
        assert _is_up(namespace, "d0"), "nothing changed: every interface is found first"
    finally:
        switch.close()
