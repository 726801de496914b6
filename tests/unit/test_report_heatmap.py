"""The link-load heat map: drawn by emu.report from each load.csv a run wrote."""

import csv

import numpy as np
import pytest

from emu.live.loadlog import wired_ports
from emu.report import load_heatmap, write_report
from emu.report.load import LOAD_COLUMNS, load_link_load
from emu.report.load_heatmap import (HEATMAP_PNG, MAX_LINKS, active_links, busiest,
                                     colour_values, configured_rates, write_load_heatmaps)
from test_report import PNG_SIGNATURE, write_run
from topologies import registry
from traffic.scale import Scale

# s1 is the spine (ports 1, 2 -> leaves s2, s3, 200 Gbit/s); s2 and s3 the leaves
# (ports 1, 2 -> hosts, 100 Gbit/s; port 3 -> s1).  At bw_factor 1e-3: 200 and
# 100 Mbit/s emulated.  The directions emu.live.loadlog samples: each switch
# port's, and a host's side right after the switch port that faces it.
SPEC = "leafspine,leaves=2,spines=1,hosts_per_leaf=2,gbps=100"
WIRED = [("s1", 1, "s2", 3), ("s1", 2, "s3", 3),
         ("s2", 1, "h1", 1), ("h1", 1, "s2", 1), ("s2", 2, "h2", 1), ("h2", 1, "s2", 2),
         ("s2", 3, "s1", 1),
         ("s3", 1, "h3", 1), ("h3", 1, "s3", 1), ("s3", 2, "h4", 1), ("h4", 1, "s3", 2),
         ("s3", 3, "s1", 2)]
T0 = 1_700_000_000.0


def result(spec=SPEC):
    return {"scenario": "allreduce", "scale": {"bw_factor": 1e-3, "tdf": 1.0},
            "fabric": {"spec": spec, "hosts": 4, "switches": 3, "ocs": 0,
                       "link_mbps": 100.0}}


def rate_of(node, port, sample):
    """A load pattern: the spine sends 100 Mbit/s to s2 for 10 samples, s2 sends
    a trickle (0.5 Mbit/s, under 1 % of 100) to h2, s3 sends 60 Mbit/s to h3,
    and h1 sends 30 Mbit/s into s2."""
    if (node, port) == ("s1", 1):
        return 100.0 if sample < 10 else 0.0
    if (node, port) == ("s2", 2):
        return 0.5
    if (node, port) == ("s3", 1):
        return 60.0
    if (node, port) == ("h1", 1):
        return 30.0
    return 0.0


def write_load(folder, samples=20, wired=WIRED, rate=rate_of):
    """A load.csv as emu.live.loadlog writes it, sampled every 0.5 s."""
    folder.mkdir(parents=True, exist_ok=True)
    sent = {(node, port): 0 for node, port, _, _ in wired}
    with (folder / "load.csv").open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(LOAD_COLUMNS)
        for sample in range(samples):
            t = T0 + 0.5 * (sample + 1)
            for node, port, peer, peer_port in wired:
                mbps = rate(node, port, sample)
                sent[(node, port)] += int(mbps * 1e6 / 8 * 0.5)
                writer.writerow([f"{t:.6f}", node, port, peer, peer_port,
                                 sent[(node, port)], mbps])
    return folder / "load.csv"


def inlined_images(page):
    return page.count('<img src="data:image/png;base64,')


def test_the_run_folders_load_csv_becomes_a_heat_map_in_its_own_section(tmp_path):
    run = write_run(tmp_path / "run", result=result(), flows=None)
    write_load(run)
    written = write_report(run)
    assert [p.name for p in written] == ["report.md", "timeline.png", HEATMAP_PNG,
                                         "report.html"]
    png = run / HEATMAP_PNG
    assert png.read_bytes()[:8] == PNG_SIGNATURE and png.stat().st_size > 10_000
    report = written[0].read_text()
    section = report[report.index("## Link load over time"):report.index("## Flows")]
    assert "port counters" in section and "every 0.5 s" in section
    # The trickle to h2 (0.5 % of its rate) is left out: 3 of 12 directions drawn.
    assert "3 of the 12 links in [load.csv](load.csv)" in section
    assert "`h1:1->s1`" in section                     # the rows' labels, hosts' too
    assert "share of the link's emulated rate" in section
    assert f"![{HEATMAP_PNG}]({HEATMAP_PNG})" in section
    assert HEATMAP_PNG not in report[report.index("## Files"):]    # not an "other plot"
    assert "## Plots" in report and HEATMAP_PNG not in \
        report[report.index("## Plots"):report.index("## Link load")]
    assert inlined_images(written[-1].read_text()) == 2


def test_each_link_is_coloured_by_its_own_rate(tmp_path):
    write_load(tmp_path)
    maps = write_load_heatmaps(result(), tmp_path, Scale(bw_factor=1e-3))
    assert len(maps) == 1 and maps[0].utilisation
    assert (maps[0].links_total, maps[0].links_active, maps[0].links_shown) == (12, 3, 3)
    assert maps[0].samples == 20 and maps[0].interval_s == pytest.approx(0.5)
    rates = configured_rates(result(), Scale(bw_factor=1e-3))
    assert rates[("s1", 1)] == ("s2", 3, 200.0) and rates[("s3", 1)] == ("h3", 1, 100.0)
    # Both ends of every link: a host's side is looked up like a switch's.
    assert rates[("s2", 3)] == ("s1", 1, 200.0) and rates[("h3", 1)] == ("s3", 1, 100.0)
    values, top, label = colour_values(np.array([[100.0, 0.0], [60.0, 60.0]]),
                                       [200.0, 100.0])
    assert values.tolist() == [[50.0, 0.0], [60.0, 60.0]] and top == 100.0
    assert "%" in label


def test_without_the_fabric_the_map_is_in_mbit_per_s(tmp_path):
    write_load(tmp_path)
    no_fabric = {"scenario": "allreduce"}
    other_fabric = result(spec="leafspine,leaves=4,spines=2,hosts_per_leaf=2")
    for case in (no_fabric, other_fabric, result(spec="no-such-fabric")):
        maps = write_load_heatmaps(case, tmp_path, Scale())
        assert not maps[0].utilisation and maps[0].png is not None
        # Rates unknown, the links are idle under 1 % of the busiest one's peak.
        assert maps[0].links_shown == 3
    values, top, label = colour_values(np.array([[100.0, np.nan]]), None)
    assert np.isnan(values[0, 1]) and top == 100.0 and "Mbit/s" in label


def test_per_testbed_folders_get_one_map_each_titled_with_the_label(tmp_path, monkeypatch):
    run = write_run(tmp_path / "run", result=result(), flows=None)
    write_load(run / "zcube")
    write_load(run / "roft", samples=4)
    titles = []
    draw = load_heatmap.plot_load_heatmap

    def recording(title, *args):
        titles.append(title)
        return draw(title, *args)

    monkeypatch.setattr(load_heatmap, "plot_load_heatmap", recording)
    written = write_report(run)
    assert [p.relative_to(run).as_posix() for p in written[2:-1]] == [
        f"roft/{HEATMAP_PNG}", f"zcube/{HEATMAP_PNG}"]
    assert titles == ["allreduce: link load over time (roft)",
                      "allreduce: link load over time (zcube)"]
    for png in written[2:-1]:
        assert png.read_bytes()[:8] == PNG_SIGNATURE
    report = written[0].read_text()
    section = report[report.index("## Link load over time"):report.index("## Flows")]
    assert section.index("### roft") < section.index("### zcube")
    assert f"![roft/{HEATMAP_PNG}](roft/{HEATMAP_PNG})" in section
    assert "[zcube/load.csv](zcube/load.csv)" in section
    # A labelled testbed's fabric is its experiment's: rates unknown, Mbit/s.
    assert "emulated Mbit/s" in section and "share of the link's" not in section
    assert inlined_images(written[-1].read_text()) == 3


def test_a_folder_without_load_csv_gets_no_section(tmp_path):
    run = write_run(tmp_path / "run", result=result(), flows=None)
    written = write_report(run)
    assert [p.name for p in written] == ["report.md", "timeline.png", "report.html"]
    assert "Link load" not in written[0].read_text()


def set_field(line_number, column, value):
    """A damage: one field of one line (numbered from 1, the header's) replaced."""
    def damage(lines):
        fields = lines[line_number - 1].split(",")
        fields[LOAD_COLUMNS.index(column)] = value
        return lines[:line_number - 1] + [",".join(fields)] + lines[line_number:]
    return damage


@pytest.mark.parametrize("damage,expected", [
    (set_field(4, "mbps", "fast"), "load.csv: line 4, column 'mbps': 'fast' is not a number"),
    (set_field(3, "port", "two"), "load.csv: line 3, column 'port': 'two' is not an integer"),
    (set_field(9, "t", "nan"), "load.csv: line 9, column 't': 'nan' is not a finite number"),
    (set_field(2, "mbps", "-3.0"), "load.csv: line 2, column 'mbps': -3.0 is negative"),
    (lambda lines: ["time,switch,port"] + lines[1:],
     "load.csv: line 1: missing column(s) ['t', 'node', 'peer', 'peer_port', 'bytes', "
     "'mbps']"),
    (lambda lines: lines[:5] + ["x,y"] + lines[5:],
     "load.csv: line 6: 2 fields where the header has 7"),
    (lambda lines: [], "load.csv: line 1: empty file"),
    (lambda lines: lines[:2] + [f"{T0:.6f}," + "x" * 200_000 + ",1,s2,3,0,0.0"] + lines[2:],
     "load.csv: line 3: field larger than field limit"),
])
def test_a_malformed_load_csv_is_reported_not_raised(tmp_path, damage, expected):
    run = write_run(tmp_path / "run", result=result(), flows=None)
    path = write_load(run)
    path.write_text("".join(line + "\n" for line in damage(path.read_text().splitlines())))
    written = write_report(run)
    assert not (run / HEATMAP_PNG).exists()
    section = written[0].read_text().split("## Link load over time")[1].split("## Flows")[0]
    assert "**Not drawn:** " + expected in section


def test_a_last_line_cut_short_by_an_interrupted_run_is_left_out(tmp_path):
    path = write_load(tmp_path, samples=3)
    text = path.read_text()
    path.write_text(text + f"{T0 + 2:.6f},s1,1,s2")           # torn mid-row
    links = load_link_load(path)
    assert [len(link.times) for link in links] == [3] * len(WIRED)
    assert links[0].label == "s1:1->s2" and links[0].mbps == (100.0, 100.0, 100.0)
    host = links[3]
    assert (host.node, host.port, host.peer, host.peer_port) == ("h1", 1, "s2", 1)
    assert host.label == "h1:1->s2" and host.mbps == (30.0, 30.0, 30.0)


def test_an_empty_or_idle_load_csv_says_why_there_is_no_map(tmp_path):
    run = write_run(tmp_path / "run", result=result(), flows=None)
    write_load(run / "idle", rate=lambda *_: 0.0)
    write_load(run / "short", samples=0)
    report = write_report(run)[0].read_text()
    assert "No link in [idle/load.csv](idle/load.csv) carried more than 1%" in report
    assert "[short/load.csv](short/load.csv) holds no samples" in report
    assert not list(run.rglob(HEATMAP_PNG))


def test_the_busiest_links_are_kept_in_file_order():
    links = MAX_LINKS + 10
    matrix = np.array([[float(row), 0.0] for row in range(links)])   # row r carries r
    matrix[5, 1] = np.nan                                             # a missed sample
    active = active_links(matrix, [1000.0] * links)   # 1 % of 1000 = 10: rows 11..49
    assert np.flatnonzero(active).tolist() == list(range(11, links))
    assert busiest(active, matrix, np.array([0.5, 0.5])) == list(range(11, links))
    everyone = np.ones(links, dtype=bool)
    assert busiest(everyone, matrix, np.array([0.5, 0.5])) == list(range(10, links))


def test_the_rows_are_the_directions_the_sampler_writes():
    assert WIRED == wired_ports(registry.build(SPEC))


def test_a_hosts_side_is_a_row_coloured_by_its_links_rate(tmp_path, monkeypatch):
    drawn = []
    draw = load_heatmap.plot_load_heatmap

    def recording(title, links, matrix, edges, link_rates, path):
        drawn.append(([link.label for link in links], link_rates, matrix))
        return draw(title, links, matrix, edges, link_rates, path)

    monkeypatch.setattr(load_heatmap, "plot_load_heatmap", recording)
    # Only the hosts send: h1 at 30 Mbit/s, h4 at a trickle under 1 % of 100.
    write_load(tmp_path, rate=lambda node, port, sample: {"h1": 30.0, "h4": 0.5}.get(node, 0.0))
    maps = write_load_heatmaps(result(), tmp_path, Scale(bw_factor=1e-3))
    assert maps[0].png is not None and maps[0].utilisation
    assert (maps[0].links_total, maps[0].links_active, maps[0].links_shown) == (12, 1, 1)
    [(labels, link_rates, matrix)] = drawn
    assert labels == ["h1:1->s2"] and link_rates == [100.0]        # h1's link: 100 Mbit/s
    values, top, _ = colour_values(matrix, link_rates)
    assert np.allclose(values, 30.0) and top == 100.0               # 30 % of its rate


def test_a_hosts_row_the_fabric_does_not_wire_so_gives_mbit_per_s(tmp_path):
    # h1 named on s3's port: not this fabric's wiring, so no utilisation.
    wired = WIRED[:3] + [("h1", 1, "s3", 1)] + WIRED[4:]
    write_load(tmp_path, wired=wired)
    maps = write_load_heatmaps(result(), tmp_path, Scale(bw_factor=1e-3))
    assert not maps[0].utilisation and maps[0].png is not None
