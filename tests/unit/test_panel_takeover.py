"""A successor takes over a dead controller's BPF patch panel in place.

The kernel's answer to RTM_GETTFILTER is parsed for the attached program's
name and id (pyroute2 does not decode TCA_BPF_ID), and a `Resync` on an OCS
whose panel was taken over only darkens the ports that must be dark: no
qdisc is deleted, nothing is attached again, the lit entries stay.
"""

from __future__ import annotations

import struct

from controllers.intents import Lightpath, Resync
from controllers.netlink.applier import NetlinkApplier
from controllers.netlink import bpfpanel
from controllers.netlink.wire import HEADER, attr
from controllers.service import FabricService
from tests.unit.fake_kernel import FakeKernel
from topologies import registry


def _reply(name: str, program_id: int = None) -> bytes:
    options = attr(bpfpanel.TCA_BPF_NAME, name.encode() + b"\0") + \
        attr(bpfpanel.TCA_BPF_FLAGS, struct.pack("=I", 1))
    if program_id is not None:
        options += attr(bpfpanel.TCA_BPF_ID, struct.pack("=I", program_id))
    body = bpfpanel._TCMSG.pack(0, 7, 1, bpfpanel.INGRESS_PARENT, 0) + \
        attr(bpfpanel.TCA_KIND, b"bpf\0") + attr(bpfpanel.TCA_OPTIONS, options, nested=True)
    return HEADER.pack(HEADER.size + len(body), bpfpanel.RTM_NEWTFILTER, 0, 1, 0) + body


def test_the_attached_programs_name_and_id_are_read_from_the_kernels_answer():
    assert bpfpanel.program_of_filter(_reply("ocs_panel", 477)) == ("ocs_panel", 477)
    assert bpfpanel.program_of_filter(_reply("tor_uplink", 12)) == ("tor_uplink", 12)
    assert bpfpanel.program_of_filter(_reply("ocs_panel")) == ("ocs_panel", None)


def test_a_filter_request_names_the_port_and_the_first_handle():
    data = bpfpanel.filter_get(5, ifindex=9)
    length, kind, _, seq, _ = HEADER.unpack_from(data)
    assert (length, kind, seq) == (len(data), bpfpanel.RTM_GETTFILTER, 5)
    _, ifindex, handle, parent, _ = bpfpanel._TCMSG.unpack_from(data, HEADER.size)
    assert (ifindex, handle, parent) == (9, 1, bpfpanel.INGRESS_PARENT)


class _TakenOverPanel:
    """A BPF panel over a dead controller's maps: records what is written."""

    kernel_timed = True
    taken_over = True
    kind = "bpf"

    def __init__(self, lit):
        self.entries = dict(lit)
        self.calls = []

    def light(self, ifindex, peer, prio=1):
        self.calls.append(("light", ifindex, peer))
        self.entries[ifindex] = peer
        return 0.0, 0.0

    def dark(self, ifindex, prio=1):
        self.calls.append(("dark", ifindex))
        self.entries.pop(ifindex, None)
        return 0.0, 0.0

    def attach_ports(self, ifindexes):
        raise AssertionError("a panel taken over is attached already")


def test_an_ocs_resync_over_a_taken_over_panel_only_darkens_the_dark_ports():
    fabric = registry.build("hybrid,tors=2,hosts_per_tor=1")
    kernel = FakeKernel(fabric)
    applier = NetlinkApplier(fabric)
    service = FabricService(fabric, applier)
    sock = kernel.sockets["o1"]
    index = {port: i for port, i in enumerate(range(100, 100 + len(fabric.ports_of("o1"))),
                                              start=1)}
    lit = {p for c in fabric.circuits["o1"] for p in c}
    stale = sorted(set(fabric.ports_of("o1")) - lit)[:2]
    # What the dead controller left: a circuit its reconfiguration had lit
    # before it died, which the state it saved does not hold.
    panel = _TakenOverPanel({index[stale[0]]: index[stale[1]],
                             index[stale[1]]: index[stale[0]]})
    applier.attach("o1", sock, patch=panel)
    applier.indexes["o1"] = {port: index[port] for port in fabric.ports_of("o1")}
    service.resuming = True
    intents = service.start("o1")
    assert isinstance(intents[0], Resync)
    sock.calls.clear()
    applier.apply({"o1": intents})
    assert set(panel.entries) == {index[p] for p in lit}, panel.entries
    assert all(("dark", index[p]) in panel.calls for p in stale), panel.calls
    assert not [c for c in sock.calls if c[0] == "tc"], "no qdisc or filter was touched"
    assert all(isinstance(i, Lightpath) and i.lit for i in intents[1:])
