"""Open vSwitch's kernel datapath (``system``) and netem on a k=4 fat-tree, run for real.

This machine's kernel has neither the openvswitch module nor sch_netem, so
these run in a qemu VM whose Debian kernel has both (`make vm-test`,
vm/run-test); anywhere else without the module they skip
(tests/conftest.py).  Under qemu's software emulation every figure is slow
by an unknown factor: they check what happens, never how fast.
"""

from __future__ import annotations

import re
import subprocess

import pytest

# The testbed's modules are imported by the tests that use them: where these
# tests skip (tests/conftest.py), collecting them must cost next to nothing.

pytestmark = [pytest.mark.vm, pytest.mark.require_root]

# Software emulation runs everything tens of times slower than a core would:
# bounds here are on logic (did it happen), and the waits are generous.
PING_TIMEOUT_S = 5
NETEM_DELAY_MS = 100.0


def _ovs(*args: str) -> str:
    done = subprocess.run(list(args), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{' '.join(args)}: {done.stderr}"
    return done.stdout


def _bridge_datapath_types() -> dict:
    out = _ovs("ovs-vsctl", "--format=csv", "--data=bare", "--no-headings",
               "--columns=name,datapath_type", "list", "Bridge")
    return dict(line.split(",", 1) for line in out.splitlines() if line)


def _kernel_datapath_ports() -> set:
    """Port names of the kernel's ``system@ovs-system`` datapath (ovs-dpctl show)."""
    out = _ovs("ovs-dpctl", "show")
    assert "system@ovs-system" in out, f"no kernel datapath in ovs-dpctl show:\n{out}"
    return set(re.findall(r"^\s+port \d+: (\S+)", out, re.MULTILINE))


def _min_rtt_ms(host, ip: str, count: int = 5) -> float:
    out = host.cmd(f"ping -c {count} -i 0.2 -W {PING_TIMEOUT_S} {ip}")
    match = re.search(r"= ([\d.]+)/[\d.]+/[\d.]+/[\d.]+ ms", out)
    assert match, f"ping {ip} gave no round-trip times:\n{out}"
    return float(match.group(1))


@pytest.fixture(scope="module")
def fattree_bed(tmp_path_factory):
    """One k=4 fat-tree on the data plane ``auto`` picks, shared by the tests
    that only look at it (a build under emulation takes minutes)."""
    from emu.live.testbed import Testbed
    from tests.integration.utils import assert_no_leftovers
    from topologies import registry
    from traffic.scale import Scale

    fabric = registry.build("fattree,k=4")
    run_dir = tmp_path_factory.mktemp("fattree") / "run"
    with Testbed(fabric, Scale.from_rates(400, 50), run_dir, log=print) as bed:
        yield bed
        log = bed.controller_log()
    assert "Traceback" not in log, f"controller log holds a traceback:\n{log}"
    assert_no_leftovers()


def test_auto_picks_the_kernel_datapath(fattree_bed):
    bed = fattree_bed
    assert bed.dataplane.kind == "ovs", bed.dataplane.choice.describe()
    assert bed.dataplane.datapath == "system", bed.dataplane.describe()
    assert bed.describe()["datapath"] == "system"
    bridges = [s.name for s in bed.net.switches]
    types = _bridge_datapath_types()
    # Mininet leaves datapath_type empty for its kernel datapath: OVS's default, system.
    wrong = {b: types.get(b) for b in bridges if types.get(b) not in ("", "system")}
    assert not wrong, f"bridges not on the kernel datapath: {wrong}"
    ports = _kernel_datapath_ports()
    missing = [b for b in bridges if b not in ports]
    assert not missing, f"bridges not in the kernel datapath: {missing}; it has {sorted(ports)}"
    veths = [i.name for s in bed.net.switches for i in s.intfList() if i.name != "lo"]
    assert not [v for v in veths if v not in ports], "switch ports missing from the datapath"


def test_pingall_over_fattree_on_the_kernel_datapath(fattree_bed):
    loss = fattree_bed.net.pingAll(timeout=PING_TIMEOUT_S)
    assert loss == 0, f"pingall over the k=4 fat-tree lost {loss}% of pings"


def test_netem_delay_shows_in_the_round_trip(fattree_bed):
    """A link given a netem delay: every round trip over it takes at least that
    long.  The delay sits under the host's HTB data class (`emu.live.shaping`,
    where ICMP goes), so the link keeps its rate and queue as well."""
    bed = fattree_bed
    assert bed.dataplane.netem, "netem did not load in this kernel"
    src, dst = "h1", bed.fabric.hosts[-1]
    host, target = bed.host(src), bed.fabric.graph.nodes[dst]["ip"]
    intf = host.defaultIntf().name
    before_ms = _min_rtt_ms(host, target)
    assert before_ms < NETEM_DELAY_MS, f"{src} -> {dst} already takes {before_ms} ms"
    # Another handle than the pfifo's 20:, or the kernel refuses the change of
    # kind ("Invalid qdisc name"); grafted under the same class, it replaces it.
    qdisc = f"tc qdisc replace dev {intf} parent 5:20 handle"
    out = host.cmd(f"{qdisc} 21: netem delay {NETEM_DELAY_MS:g}ms limit 1000 2>&1")
    assert not out.strip(), f"netem on {intf}: {out}"
    try:
        assert "netem" in host.cmd(f"tc qdisc show dev {intf}")
        delayed_ms = _min_rtt_ms(host, target)
    finally:
        host.cmd(f"{qdisc} 20: pfifo limit {bed.queue_packets}")
    assert delayed_ms >= NETEM_DELAY_MS, \
        f"{src} -> {dst}: {delayed_ms} ms with {NETEM_DELAY_MS} ms of netem on {intf}"
    assert _min_rtt_ms(host, target) < NETEM_DELAY_MS, "the delay outlived its qdisc"
