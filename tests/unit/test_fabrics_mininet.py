"""The Mininet adapter and `mn --custom` entry point (building a Topo needs no root)."""

import json
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from topologies import registry, report

pytest.importorskip("mininet.topo")
from topologies.mininet_topo import FabricTopo  # noqa: E402

MN_CUSTOM = Path(__file__).resolve().parents[2] / "topologies" / "mn_custom.py"


def load_mn_custom():
    """Read the file the way `mn --custom` does: exec without __file__."""
    customs = {}
    exec(compile(MN_CUSTOM.read_text(), str(MN_CUSTOM), "exec"), customs, customs)
    return customs


def test_topo_has_the_fabric_nodes_names_ports_and_rates():
    fabric = registry.build("zcube,n=4")
    topo = FabricTopo(fabric, bw_factor=0.001, link_opts={"delay": "1ms"})
    assert len(topo.hosts()) == 32 and len(topo.switches()) == 8 and len(topo.links()) == 48
    assert topo.nodeInfo("fes1")["dpid"] == "0000000000000001"
    assert topo.nodeInfo("h1")["ip"] == "10.0.0.1/8"
    assert topo.nodeInfo("h1")["mac"] == "02:fe:00:00:00:01"
    for u, v, data in fabric.links():
        info = topo.linkInfo(*sorted(("fe" + n if n[0] != "h" else n) for n in (u, v)))
        ends = {info["node1"]: info["port1"], info["node2"]: info["port2"]}
        assert ends == {("fe" + n if n[0] != "h" else n): p for n, p in data["ports"].items()}
        assert info["bw"] == pytest.approx(200.0) and info["delay"] == "1ms"


def test_ocs_become_prefixed_switches_and_switch_opts_pass_through():
    fabric = registry.build("rfabric")
    topo = FabricTopo(fabric, switch_opts={"protocols": "OpenFlow13"})
    assert {"feo1", "feo2"} <= set(topo.switches())
    assert topo.nodeInfo("feo1")["protocols"] == "OpenFlow13"
    assert "bw" not in topo.linkInfo(*topo.links()[0])


def test_mn_custom_offers_every_registered_fabric():
    topos = load_mn_custom()["topos"]
    assert set(topos) == set(registry.names())
    topo = topos["zcube"](n=3, bw_factor=0.01)          # what --topo zcube,n=3 passes
    assert len(topo.hosts()) == 18
    assert topo.linkInfo(*topo.links()[0])["bw"] == pytest.approx(2000.0)
    assert len(topos["railfly"](2, 3).hosts()) == 6     # positional: rails, servers
    with pytest.raises(Exception, match="unknown parameter"):
        topos["zcube"](m=3)


def test_builders_do_not_import_mininet():
    modules = ("registry", "catalog", "cost", "report", "counts", "clos", "zcube", "rfabric",
               "sip_ocs", "hpn", "roft", "rail_only", "railfly", "rail_fabric", "fattree_os")
    code = (f"import sys\nimport {', '.join('topologies.' + m for m in modules)}\n"
            "print('mininet' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "False"


def test_export_graphml_flattens_ports_and_json_round_trips(tmp_path):
    fabric = registry.build("rail-fabric")
    graphml = report.export(fabric, tmp_path / "f.graphml")
    loaded = nx.read_graphml(graphml, force_multigraph=True)
    assert loaded.number_of_edges() == fabric.graph.number_of_edges()
    for _, _, data in loaded.edges(data=True):
        u, v = data["end_a"], data["end_b"]
        assert fabric.ports_of(u)[data["port_a"]][0] == v
    assert json.loads(loaded.graph["params"])["switches"] == 8
    text = report.export(fabric, tmp_path / "f.txt", fmt="json").read_text()
    assert json.loads(text)["name"] == "rail-fabric"
