"""Cluster mode's pure parts: server lists, ssh argv, clock offsets, the tunnel
guardrail, the data plane choice, agent clocks and the server agent's refusals."""

from __future__ import annotations

import io
import json
import shlex

import pytest

from emu import scenario
from emu.live import agents, cluster, dataplane, server_agent, state
from emu.live.cluster import ClusterError, Tunnel


# ---------------------------------------------------------------- server lists
def test_an_empty_list_is_one_machine():
    assert cluster.check_servers([]) == []


def test_localhost_first_then_names_or_addresses():
    assert cluster.check_servers(["localhost", "10.254.1.2", "gpu-box.lab"]) == \
        ["localhost", "10.254.1.2", "gpu-box.lab"]


@pytest.mark.parametrize("servers,expected", [
    (["10.0.0.2", "localhost"], "write it as 'localhost'"),
    (["localhost"], "at least one other server"),
    (["localhost", "a", "a"], "named twice"),
    (["localhost", "a;reboot"], "not a host name"),
    (["localhost", "-oProxyCommand=x"], "not a host name"),
    (["localhost", "localhost"], "named twice"),
])
def test_bad_server_lists_are_refused_by_name(servers, expected):
    with pytest.raises(ClusterError, match=expected) as info:
        cluster.check_servers(servers)
    assert "testbed.servers" in str(info.value)


def test_a_scenario_with_a_bad_server_list_names_file_and_key():
    with pytest.raises(scenario.ScenarioError) as info:
        scenario.load("allreduce", ["testbed.servers=['10.0.0.2']"])
    message = str(info.value)
    assert "allreduce.toml" in message and "testbed.servers" in message and \
        "localhost" in message


def test_a_scenario_takes_a_server_list():
    loaded = scenario.load("allreduce", ["testbed.servers=['localhost', '10.254.1.2']"])
    assert loaded.config["testbed"]["servers"] == ["localhost", "10.254.1.2"]
    assert scenario.load("allreduce").config["testbed"]["servers"] == []


# ---------------------------------------------------------------- ssh
def test_ssh_quotes_every_remote_word_and_takes_the_config(tmp_path, monkeypatch):
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n")
    monkeypatch.setattr(cluster, "run_user", lambda: "root")
    monkeypatch.setattr(cluster.getpass, "getuser", lambda: "root")
    bed = cluster.Cluster(["localhost", "10.254.1.2"], ssh_config=str(config))
    argv = bed.ssh(bed.server("10.254.1.2"), ["echo", "a b", "$(id)"])
    assert argv[0] == "ssh" and ["-F", str(config)] == argv[argv.index("-F"):argv.index("-F") + 2]
    assert "BatchMode=yes" in argv and argv[-2] == "root@10.254.1.2"
    assert shlex.split(argv[-1]) == ["echo", "a b", "$(id)"]


def test_a_user_who_is_not_root_takes_root_with_sudo_there(monkeypatch):
    monkeypatch.setattr(cluster, "run_user", lambda: "alice")
    monkeypatch.setattr(cluster.getpass, "getuser", lambda: "root")
    bed = cluster.Cluster(["localhost", "10.254.1.2"])
    argv = bed.ssh(bed.server("10.254.1.2"), ["true"])
    assert argv[:4] == ["sudo", "-E", "-u", "alice"]
    assert shlex.split(argv[-1])[:3] == ["sudo", "-n", "-E"]


def test_a_missing_ssh_config_is_refused():
    with pytest.raises(ClusterError, match="ssh_config"):
        cluster.Cluster(["localhost", "10.254.1.2"], ssh_config="/nonexistent/ssh_config")


# ---------------------------------------------------------------- clocks
def test_the_clock_offset_comes_from_the_shortest_round_trip():
    # The remote clock is 2.5 s ahead; the first sample's reply was held up
    # on the way back, which would read the offset 40 ms early.
    samples = [(100.0, 102.51, 100.1), (200.0, 202.501, 200.002), (300.0, 302.53, 300.05)]
    offset, rtt = cluster.clock_offset(samples)
    assert offset == pytest.approx(2.5, abs=1e-9) and rtt == pytest.approx(0.002)


def test_agent_times_move_to_this_machine_and_back():
    event = {"event": "result", "id": "f1",
             "result": {"start": 10.0, "end": 12.0, "result": {"end": {"sum": {}}}}}
    local = agents.on_local_clock(event, 0.5)
    assert (local["result"]["start"], local["result"]["end"]) == (9.5, 11.5)
    assert local["result"]["result"] == {"end": {"sum": {}}}
    command = {"op": "done", "id": "f1", "end": 11.5, "t0": 9.0}
    assert agents.on_agent_clock(command, 0.5) == {"op": "done", "id": "f1", "end": 12.0,
                                                   "t0": 9.5}
    assert agents.on_local_clock(event, 0.0) is event


# ---------------------------------------------------------------- tunnels
def test_gre_only_where_both_kernels_have_it():
    assert cluster.tunnel_kind({"gre": True}, {"gre": True})[0] == "gre"
    kind, why = cluster.tunnel_kind({"gre": True}, {"gre": False})
    assert kind == "vxlan" and "one of the kernels" in why


def _tunnels(count, servers=("localhost", "b")):
    return [Tunnel((f"s{i}", f"s{i + 100}"), servers, "vxlan") for i in range(count)]


def test_the_guardrail_warns_when_tunnels_may_carry_more_than_measured():
    tunnels = _tunnels(8)
    rates = {t.link: 100.0 for t in tunnels}
    assert cluster.demand_warnings(tunnels, rates, {("b", "localhost"): 900.0}) == []
    warnings = cluster.demand_warnings(tunnels, rates, {("b", "localhost"): 700.0})
    assert len(warnings) == 1 and "800 Mbit/s" in warnings[0] and "700 Mbit/s" in warnings[0]
    unmeasured = cluster.demand_warnings(tunnels, rates, {})
    assert "not measured" in unmeasured[0]


# ---------------------------------------------------------------- data plane
def test_cluster_runs_are_ovs_and_refuse_linux():
    assert dataplane.cluster_choice("auto", installed=True).dataplane == dataplane.OVS
    assert dataplane.cluster_choice("ovs", installed=True).dataplane == dataplane.OVS
    with pytest.raises(dataplane.DataplaneError, match="does not run across servers"):
        dataplane.cluster_choice("linux", installed=True)
    with pytest.raises(dataplane.DataplaneError, match="Open vSwitch"):
        dataplane.cluster_choice("auto", installed=False)


# ---------------------------------------------------------------- server agent
@pytest.fixture
def agent_run_dir(run_dir, monkeypatch):
    """The run directory of `run_dir`, with no bridges or links to clean."""
    monkeypatch.setattr(state, "our_bridges", lambda: [])
    monkeypatch.setattr(state, "our_links", lambda listing=None: [])
    return run_dir


@pytest.mark.parametrize("request_,expected", [
    ({"op": "reboot"}, "unknown op"),
    ({"op": "batches", "tool": "sh", "batches": []}, "allowed: ip, tc"),
    ({"op": "set_controller", "bridges": ["eth0"], "target": "tcp:127.0.0.1:6653"}, "refused"),
    ({"op": "set_controller", "bridges": ["fes1"], "target": "tcp:10.0.0.1:6653"}, "refused"),
    ({"op": "dump", "commands": [["rm", "-rf", "/"]]}, "not a listing tool"),
    ({"op": "dump", "commands": [["mnexec", "-a", "1", "sh"]]}, "not a listing tool"),
    ({"op": "mkdir", "path": "relative/dir"}, "not absolute"),
    ({"op": "iperf_server", "bind": "$(id)", "port": 5201}, "not an IPv4"),
])
def test_the_agent_refuses_what_it_should_not_run(agent_run_dir, request_, expected):
    with pytest.raises(server_agent.AgentError, match=expected):
        server_agent.ServerAgent("/repo").handle(request_)


def test_the_agent_holds_the_lock_records_pids_and_cleans_at_the_end_of_input(agent_run_dir):
    requests = [{"op": "clock"}, {"op": "record", "pids": [[999999, "mininet node h1", True]]},
                {"op": "bogus"}]
    stdin = io.StringIO("".join(json.dumps(r) + "\n" for r in requests))
    stdout = io.StringIO()
    assert server_agent.serve(server_agent.ServerAgent("/repo"), "test", stdin, stdout) == 0
    replies = [json.loads(line) for line in stdout.getvalue().splitlines()]
    assert replies[0]["event"] == "ready"
    assert replies[1]["ok"] and isinstance(replies[1]["time"], float)
    assert replies[2]["ok"]
    assert not replies[3]["ok"] and "unknown op" in replies[3]["error"]
    assert replies[-1]["event"] == "finished"
    assert server_agent.lock_free()                # given back at the end of input
    assert not (agent_run_dir / "owned.jsonl").exists()  # and its records cleaned


def test_a_busy_server_says_so_and_leaves_the_other_run_alone(agent_run_dir):
    with state.RunLock(state.LOCK_PATH).acquire("another run"):
        state.record_pid(1, "the other run's process")
        stdout = io.StringIO()
        code = server_agent.serve(server_agent.ServerAgent("/repo"), "test",
                                  io.StringIO(""), stdout)
    assert code == 3
    event = json.loads(stdout.getvalue().splitlines()[0])
    assert event["event"] == "busy" and "another run" in event["error"]
    assert state.owned_pids()[0]["what"] == "the other run's process"


def test_cpu_jiffies_count_busy_within_total():
    busy, total = server_agent.cpu_jiffies()
    assert 0 <= busy <= total


# ---------------------------------------------------------------- tunnel links
class _Node:
    def __init__(self, name, server, in_namespace, pid):
        self.name, self.server, self.inNamespace, self.pid = name, server, in_namespace, pid


def _plan(kind, failing=None):
    from emu.live.cluster_nodes import TunnelPlan
    ends = []

    def make_end(server, **params):
        if server == failing:
            raise ClusterError(f"server {server}: ip link add: File exists")
        ends.append((server, params))

    underlay = {("localhost", "b"): ("10.254.1.1", "10.254.1.2"),
                ("b", "localhost"): ("10.254.1.2", "10.254.1.1")}
    names = {"fes5": "s5", "h9": "h9"}
    return TunnelPlan(underlay, {("b", "localhost"): kind}, 1500, names.get, make_end), ends


def test_a_tunnel_link_is_two_ends_with_one_key_and_each_in_its_node():
    plan, ends = _plan("vxlan")
    switch, host = _Node("fes5", "localhost", False, 100), _Node("h9", "b", True, 4242)
    record = plan.make(None, switch, host, "fes5-eth4", "h9-eth0")
    assert ends == [
        ("localhost", dict(name="fes5-eth4", kind="vxlan", vni=4201, local="10.254.1.1",
                           remote="10.254.1.2", mtu=1500, netns_pid=None)),
        ("b", dict(name="h9-eth0", kind="vxlan", vni=4201, local="10.254.1.2",
                   remote="10.254.1.1", mtu=1500, netns_pid=4242))]
    assert record.link == ("h9", "s5") and record.vni == 4201 and record.kind == "vxlan"
    assert plan.make(None, switch, host, "fes5-eth5", "h9-eth1").vni == 4202
    assert len(plan.tunnels) == 2


def test_a_tunnel_that_cannot_be_made_says_where():
    plan, _ = _plan("vxlan", failing="b")
    with pytest.raises(RuntimeError, match="h9 on b: could not make tunnel h9-eth0"):
        plan.make(None, _Node("fes5", "localhost", False, 1), _Node("h9", "b", True, 2),
                  "fes5-eth4", "h9-eth0")


def test_tunnel_ends_are_ip_commands_of_checked_words():
    vxlan = server_agent.tunnel_end_commands("h9-eth0", "vxlan", 4201, "10.254.1.2",
                                             "10.254.1.1", 1500, 4242)
    assert vxlan == [
        ["ip", "link", "add", "name", "h9-eth0", "type", "vxlan", "id", "4201", "local",
         "10.254.1.2", "remote", "10.254.1.1", "dstport", "4789"],
        ["ip", "link", "set", "h9-eth0", "mtu", "1500", "up"],
        ["ip", "link", "set", "h9-eth0", "netns", "4242"]]
    gre = server_agent.tunnel_end_commands("fes5-eth4", "gre", 7, "10.0.0.1", "10.0.0.2", 1500)
    assert gre[0][5:9] == ["type", "gretap", "local", "10.0.0.1"] and "key" in gre[0]
    assert len(gre) == 2                          # an OVS port stays in the root namespace
    for bad in (dict(name="x; reboot"), dict(kind="geneve"), dict(local="$(id)"),
                dict(vni=0), dict(mtu=20)):
        args = dict(name="h9-eth0", kind="vxlan", vni=1, local="10.0.0.1",
                    remote="10.0.0.2", mtu=1500)
        args.update(bad)
        with pytest.raises(server_agent.AgentError):
            server_agent.tunnel_end_commands(**args)


def test_the_placer_answers_mininet_by_its_node_names():
    from emu.live.cluster_nodes import fabric_placer
    from emu.live.testbed import machine_to_fabric
    from topologies import registry
    from topologies.partition import place_fabric

    fabric = registry.build("fattree,k=4")
    placement = place_fabric(fabric, 2)
    placer = fabric_placer(placement, machine_to_fabric)(servers=["localhost", "b"],
                                                         nodes=[], hosts=[], switches=[])
    for node, server in placement.server_of.items():
        name = node if fabric.kind(node) == "host" else f"fe{node}"
        assert placer.place(name) == ["localhost", "b"][server]


def test_an_agent_that_stops_answering_is_not_asked_again():
    silent = cluster.Server("b", "10.0.0.2", False)
    agent = cluster.RemoteAgent(silent, lambda server, args: ["sh", "-c", "sleep 30"], [])
    with pytest.raises(ClusterError, match="server b: its agent did not answer"):
        agent.call("clock", timeout_s=0.2)
    # A reader still waits on the first reply: the next call must not take it.
    with pytest.raises(ClusterError, match="did not answer"):
        agent.call("cpu", timeout_s=5)
    assert agent.quit(timeout_s=0.5) == [] and agent.proc.poll() is not None


# ---------------------------------------------------------------- controller forward
class ForwardAgent:
    """A server agent that answers the forward's questions; ``bound`` is where
    the server's sshd put the forwarded port."""

    def __init__(self, bound):
        self.bound = bound
        self.calls = []

    def call(self, op, **args):
        self.calls.append((op, args))
        if op == "free_port":
            return {"port": 40000}
        if op == "listening":
            assert args == {"port": 40000}
            return {"sockets": [{"table": "tcp", "address": a, "loopback": a == "127.0.0.1"}
                                for a in self.bound]}
        raise AssertionError(f"unexpected op {op}")


class RunningSsh:
    def __init__(self, args, **kwargs):
        self.args, self.pid = args, 4242

    def poll(self):
        return None


@pytest.fixture
def forwarding(monkeypatch):
    monkeypatch.setattr(cluster, "run_user", lambda: "root")
    monkeypatch.setattr(cluster.subprocess, "Popen", RunningSsh)
    monkeypatch.setattr(state, "record_pid", lambda pid, what: None)
    return cluster.Cluster(["localhost", "10.254.1.2"], log=lambda m: None)


def test_the_controller_forward_asks_for_the_remote_loopback(forwarding):
    forwarding.agents["10.254.1.2"] = agent = ForwardAgent(["127.0.0.1"])
    forwarding.forward_controller(6653)
    args = forwarding.forwards[0].args
    assert args[args.index("-R") + 1] == "127.0.0.1:40000:127.0.0.1:6653", \
        "both ends of the forward must name 127.0.0.1, never a wildcard"
    assert forwarding.controller_ports == {"10.254.1.2": 40000}
    assert ("listening", {"port": 40000}) in agent.calls, "the bound address is checked there"


def test_a_forward_sshd_bound_on_the_wildcard_is_refused(forwarding):
    forwarding.agents["10.254.1.2"] = ForwardAgent(["0.0.0.0"])
    with pytest.raises(ClusterError, match=r"0\.0\.0\.0:40000.*GatewayPorts"):
        forwarding.forward_controller(6653)
    assert forwarding.controller_ports == {}


def test_the_agent_tells_where_a_port_listens(agent_run_dir, monkeypatch):
    sockets = [server_agent.listening.Socket("tcp", "127.0.0.1", 40000, 0x0A, 1),
               server_agent.listening.Socket("tcp6", "::", 40000, 0x0A, 2),
               server_agent.listening.Socket("tcp", "0.0.0.0", 40001, 0x0A, 3),
               server_agent.listening.Socket("tcp", "10.0.0.1", 40000, 0x01, 4)]
    monkeypatch.setattr(server_agent.listening, "read_sockets", lambda: sockets)
    reply = server_agent.ServerAgent("/repo").handle({"op": "listening", "port": 40000})
    assert reply == {"sockets": [{"table": "tcp", "address": "127.0.0.1", "loopback": True},
                                 {"table": "tcp6", "address": "::", "loopback": False}]}
