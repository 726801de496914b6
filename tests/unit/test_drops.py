"""Where packets were lost: the counters read from the kernel and ovs-vswitchd's log."""

from emu.fidelity import assess
from emu.live import drops


def test_softnet_columns_are_summed_over_cpus(tmp_path):
    stat = tmp_path / "softnet_stat"
    stat.write_text("00000100 0000000a 00000003 0 0\n00000200 00000001 00000010 0 0\n")
    assert drops.softnet(stat) == (11, 19)
    assert drops.softnet(tmp_path / "missing") == (0, 0)


def test_hidden_ovs_drops_are_counted_from_where_the_log_was(tmp_path):
    log = tmp_path / "ovs-vswitchd.log"
    log.write_text("old: error sending Ethernet packet on x: Resource temporarily unavailable\n")
    start = drops.log_size(log)
    with open(log, "a") as stream:
        stream.write("netdev_linux|WARN|error sending Ethernet packet on fes1-eth2: "
                     "Resource temporarily unavailable\n" * 3 + "something else\n")
    count, size = drops.vswitchd_hidden_drops(start, log)
    assert (count, size) == (3, log.stat().st_size), "only lines written since the start"
    log.write_text("rotated\n")
    assert drops.vswitchd_hidden_drops(size, log)[0] == 0, "a rotated log starts over"
    assert drops.vswitchd_hidden_drops(0, tmp_path / "none") == (0, 0)


def test_delta_counts_what_a_testbed_added():
    before = drops.Counters(queue_drops=5, veth_drops=1, softnet_drops=2, time_squeezes=7)
    after = drops.Counters(queue_drops=9, veth_drops=1, softnet_drops=4, time_squeezes=7,
                           vswitchd_hidden=3, vswitchd_log_bytes=100)
    assert drops.delta(before, after).to_dict() == {
        "queue_drops": 4, "veth_drops": 0, "softnet_drops": 2, "time_squeezes": 0,
        "vswitchd_hidden": 3, "failed_link_drops": 0}


def test_drops_outside_the_emulated_queues_flag_a_saturated_run():
    congested = assess([], None, drops={"queue_drops": 40, "veth_drops": 0,
                                        "softnet_drops": 0, "time_squeezes": 3,
                                        "vswitchd_hidden": 0})
    assert not congested["saturated"], "queue drops are the fabric's congestion"
    assert congested["drops"]["queue_drops"] == 40
    early = assess([], None, drops={"queue_drops": 0, "veth_drops": 2, "softnet_drops": 1,
                                    "time_squeezes": 0, "vswitchd_hidden": 0})
    assert early["saturated"] and "dropped 3 packet(s) before any emulated queue" in \
        early["warnings"][0]
    hidden = assess([], None, drops={"queue_drops": 0, "veth_drops": 0, "softnet_drops": 0,
                                     "time_squeezes": 0, "vswitchd_hidden": 12})
    assert hidden["saturated"] and "at least 12 packet(s)" in hidden["warnings"][0]


def test_softirq_share_flags_kernel_forwarding_saturation():
    cpu = {"machine_cpu_pct": {"mean": 40.0, "max": 60.0}, "cores": 2, "processes": {},
           "softirq_pct": {"mean": 30.0, "max": 55.0}, "samples": 4, "interval_s": 0.5}
    hot = assess([], cpu, softirq_pct=50.0)
    assert hot["saturated"] and hot["warnings"][0].startswith("kernel forwarding saturated")
    assert not assess([], cpu, softirq_pct=60.0)["saturated"]
    assert hot["thresholds"]["softirq_pct"] == 50.0


def test_namespace_drops_of_this_namespace_read_iproute2(monkeypatch):
    replies = {"tc": [{"kind": "htb", "root": True, "drops": 4},
                      {"kind": "pfifo", "parent": "5:1", "drops": 4},
                      {"kind": "noqueue", "root": True, "drops": 0}],
               "ip": [{"ifname": "lo", "stats64": {"rx": {"dropped": 9}}},
                      {"ifname": "fes1-eth1", "link_netnsid": 0,
                       "stats64": {"rx": {"dropped": 2}, "tx": {"dropped": 1}}},
                      {"ifname": "eth0", "stats64": {"rx": {"dropped": 50}}}]}
    seen = []

    def fake(command, pid):
        seen.append((command[0], pid))
        return replies[command[0]]

    monkeypatch.setattr(drops, "_json_of", fake)
    assert drops.namespace_drops(42) == (4, 3, 0), \
        "root qdiscs only (they hold their leaves' drops); veths only"
    assert seen == [("tc", 42), ("ip", 42)]
    assert drops.namespace_drops(42, failed={"fes1-eth1"}) == (4, 0, 3), \
        "a link taken down drops what it held: the failure's loss, counted apart"


def test_drops_of_links_taken_down_do_not_flag_the_run():
    failed = assess([], None, drops={"queue_drops": 10, "veth_drops": 0, "softnet_drops": 0,
                                     "time_squeezes": 0, "vswitchd_hidden": 0,
                                     "failed_link_drops": 59})
    assert not failed["saturated"] and failed["drops"]["failed_link_drops"] == 59
    before = drops.Counters(veth_drops=1)
    after = drops.Counters(veth_drops=1, failed_link_drops=59)
    assert drops.delta(before, after).failed_link_drops == 59
