"""Damaged results folders given to ``python -m emu.report`` and ``python -m emu.view``.

A folder starts as one a run leaves (result.json of several kinds, flows.csv,
load.csv, events.jsonl), then has a value anywhere in result.json replaced by
any JSON, a file cut short, overwritten with noise or removed.  `emu.report`
writes its report or exits 2 naming the file (never a traceback); `emu.view`
loads the run or raises a ReplayError naming the file, and a run it loaded
shows every moment of itself without an error (the page asks for any moment).
The view's server is never started: loading is what reads the folder.
"""

from __future__ import annotations

import copy
import csv
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import matplotlib.figure
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from emu.live.feed import EVENTS_FILE
from emu.report import FLOW_COLUMNS
from emu.report.cli import main as report_main
from emu.view.replay import LOAD_FILE, ReplayError, load_run
from fuzzing import assert_clear, capture_stderr, hostile_text, json_values, share
from test_orchestrrl_plots import _result as orchestrrl_result
from test_report import FLOWS, synthetic_result
from test_report_plots import cost_result, fabrics_result
from test_rl_plots import RFABRIC_RESULT
from test_view_state import T0, ocs_run, pd_run, record_run, rfabric_run

REPO = Path(__file__).resolve().parents[2]
RESULTS = {"ocs-reconfig": synthetic_result(), "cost": cost_result(),
           "fabrics": fabrics_result(), "rfabric": RFABRIC_RESULT,
           "orchestrrl": orchestrrl_result()}
LOAD_ROWS = [[f"{T0 + 1 + i * 0.5:.6f}", "s1", 3, "o1", 2, 1000 * i, 15.0 + i]
             for i in range(4)] + [[f"{T0 + 1 + i * 0.5:.6f}", "s2", 1, "h2", 1, 900 * i, 9.5]
                                   for i in range(4)]
RUNS = {"ocs": ocs_run, "rfabric": rfabric_run, "pd": pd_run}


# ------------------------------------------------------------ damage
def json_paths(value, prefix=()):
    """Every place in a JSON document, as a tuple of keys and indexes."""
    yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from json_paths(child, prefix + (key,))
    elif isinstance(value, list):
        for index, child in enumerate(value[:4]):         # a table's first rows stand for all
            yield from json_paths(child, prefix + (index,))


near_numbers = st.sampled_from([0, -1, 1e308, -1e308, math.nan, math.inf, -math.inf, 2**64,
                                "1", "", None, True, [], {}])


@st.composite
def damaged_result(draw, result: dict):
    """``result`` with one to three of its values replaced or removed."""
    result = copy.deepcopy(result)
    places = list(json_paths(result))[1:]
    for _ in range(draw(st.integers(1, 3))):
        place = draw(st.sampled_from(places))
        parent = result
        try:
            for step in place[:-1]:
                parent = parent[step]
            if draw(st.integers(0, 4)) == 0:
                del parent[place[-1]]
            else:
                parent[place[-1]] = draw(near_numbers | json_values)
        except (KeyError, IndexError, TypeError):
            continue                    # an earlier change took this place away
    return result


@st.composite
def damaged_text(draw, text: bytes) -> bytes:
    """A file cut short, overwritten in places, or noise."""
    how = draw(st.sampled_from(["cut", "overwrite", "noise", "empty"]))
    if how == "cut":
        return text[:draw(st.integers(0, len(text)))]
    if how == "overwrite":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.binary(max_size=12)) + text[at + 4:]
    if how == "noise":
        return draw(st.binary(max_size=200) | hostile_text.map(str.encode))
    return b""


def flows_csv() -> bytes:
    lines = [",".join(FLOW_COLUMNS)] + [",".join(str(row[c]) for c in FLOW_COLUMNS)
                                        for row in FLOWS]
    return ("\n".join(lines) + "\n").encode()


def load_csv() -> bytes:
    header = "t,node,port,peer,peer_port,bytes,mbps"
    return ("\n".join([header] + [",".join(map(str, row)) for row in LOAD_ROWS]) + "\n").encode()


@st.composite
def report_folders(draw):
    """(kind, {file name: bytes, or None for a file removed})."""
    kind = draw(st.sampled_from(sorted(RESULTS)))
    result = json.dumps(draw(damaged_result(RESULTS[kind]))).encode()
    files = {"result.json": result, "flows.csv": flows_csv(), "load.csv": load_csv()}
    victim = draw(st.sampled_from(["none", "result.json", "flows.csv", "load.csv"]))
    if victim != "none":
        files[victim] = None if draw(st.integers(0, 5)) == 0 else draw(damaged_text(files[victim]))
    return kind, files


def write_folder(folder: Path, files: dict) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name, data in files.items():
        if data is not None:
            (folder / name).write_bytes(data)
    return folder


@pytest.fixture
def quick_plots(monkeypatch):
    """Figures are built and filled but not rasterised: a report in 0.3 s, not 2 s.
    (`test_a_damaged_result_is_drawn_in_full_or_refused` draws them.)"""
    def savefig(figure, path, *args, **kwargs):
        Path(path).write_bytes(b"\x89PNG\r\n\x1a\n")

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)


def assert_reported(folder: Path) -> None:
    code, stderr = capture_stderr(report_main, [str(folder)])
    assert code in (0, 2), f"exit {code}: {stderr}"
    if code == 2:
        assert stderr.startswith("error: "), stderr
        assert_clear(stderr, str(folder))
        event(f"refused: {re.sub(r'[0-9]+', '_', stderr.split(str(folder))[-1])[:40]}")
    else:
        assert (folder / "report.md").is_file() and (folder / "report.html").is_file()
        event("reported")


@share(0.75)
@given(report_folders())
def test_a_damaged_results_folder_is_reported_or_refused_naming_the_file(quick_plots, tmp_path,
                                                                          case):
    kind, files = case
    assert_reported(write_folder(tmp_path / kind, files))


@share(0.1)
@given(report_folders())
def test_a_damaged_result_is_drawn_in_full_or_refused(tmp_path, case):
    kind, files = case
    assert_reported(write_folder(tmp_path / kind, files))


# ------------------------------------------------------------ emu.view
KINDS = ["testbed", "testbed-closed", "load", "circuit", "link", "schedule", "preset",
         "iteration", "phase", "request", "credits", "cpu", "warning", "run", "nope"]
EVENT_KEYS = ["fabric", "scale", "label", "links", "ocs", "step", "tear", "light", "delay_ms",
              "dark_until", "dark_s", "a", "b", "up", "stopped", "slot_emulated_s", "technology",
              "iteration", "name", "state", "id", "p", "d", "streams", "used", "total",
              "machine_pct", "text", "status", "error"]


@st.composite
def view_folders(draw):
    """(run, events as written, how, noise): one event damaged, one of any kind
    added, or the events or load file broken in the middle."""
    name = draw(st.sampled_from(sorted(RUNS)))
    events = RUNS[name]()
    how = draw(st.sampled_from(["event", "event", "event", "extra", "events-file",
                                "load-file"]))
    if how == "event":
        index = draw(st.integers(0, len(events) - 1))
        events[index] = draw(damaged_result(events[index]))
    elif how == "extra":
        extra = draw(st.dictionaries(st.sampled_from(EVENT_KEYS), near_numbers | json_values,
                                     max_size=5))
        events.append({**extra, "kind": draw(st.sampled_from(KINDS)),
                       "t": T0 + draw(st.floats(-1, 10))})
    return name, events, "event" if how == "extra" else how, draw(damaged_text(b"x" * 40))


def write_view_folder(folder: Path, events, how, noise) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if how == "event":
        with open(folder / EVENTS_FILE, "w") as stream:       # as RunFeed writes it
            for event_ in events:
                stream.write(json.dumps(event_) + "\n")
        write_load(folder / LOAD_FILE)
    else:
        record_run(folder, events)
        target = folder / (EVENTS_FILE if how == "events-file" else LOAD_FILE)
        data = target.read_bytes()
        target.write_bytes(data[:len(data) // 2] + noise + data[len(data) // 2:])
    return folder


def write_load(path: Path) -> None:
    with open(path, "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(["t", "node", "port", "peer", "peer_port", "bytes", "mbps"])
        writer.writerows(LOAD_ROWS)


@share(1.0)
@given(view_folders())
def test_a_damaged_run_replays_at_every_moment_or_is_refused_naming_the_file(tmp_path, case):
    name, events, how, noise = case
    folder = write_view_folder(tmp_path / name, events, how, noise)
    try:
        state = load_run(folder)
    except ReplayError as exc:
        assert_clear(str(exc), str(folder))
        event(f"refused ({how})")
        return
    event(f"replayed ({how})")
    start, end = state.span
    for t in (None, start - 1, start, (start + end) / 2, end, end + 10,
              *[e.get("t") for e in events if isinstance(e, dict)]):
        if t is None or (isinstance(t, (int, float)) and not isinstance(t, bool)
                         and math.isfinite(t)):
            snap = state.snapshot(t)
            json.dumps(snap, allow_nan=True)          # what /data serves


# ------------------------------------------------------------ the bugs it found
def report_error(folder: Path) -> str:
    code, stderr = capture_stderr(report_main, [str(folder)])
    assert code == 2, stderr
    assert_clear(stderr, str(folder))
    return stderr


def test_a_result_json_that_is_not_utf8_is_refused_naming_it(tmp_path):
    """The UnicodeDecodeError's message named no file."""
    folder = write_folder(tmp_path / "run", {"result.json": b'{"scenario": "caf\xe9"}'})
    assert f"{folder / 'result.json'}: not UTF-8 text" in report_error(folder)


@pytest.mark.parametrize("flows, message", [
    (b"id,src\n", "missing column(s)"),
    (flows_csv().replace(b"f4,h7,h8,100000000,18.0,,,,,failed", b"f4,h7"),
     "row 5 has no value for column(s)"),                       # was .strip() of None
    (flows_csv().replace(b"100000000,0.0", b"1e400,0.0"),
     "row 2, column 'bytes': '1e400' is not a finite number"),  # was an OverflowError
    (flows_csv() + b"f5," + b"x" * 200_000 + b",h2,1,0,1,1,1,0,ok\n",
     "flows.csv: not CSV (field larger than field limit"),      # was a csv.Error
    (b"\xff\xfe" + flows_csv(), "flows.csv: not UTF-8 text"),
])
def test_a_damaged_flows_csv_is_refused_naming_it(tmp_path, flows, message):
    folder = write_folder(tmp_path / "run", {"result.json": json.dumps(synthetic_result()).encode(),
                                             "flows.csv": flows})
    assert message in report_error(folder)


@pytest.mark.parametrize("change, message", [
    (lambda r: r["timeline"].update(series=5.0), "key 'timeline.series' must be a JSON list"),
    (lambda r: r["timeline"]["series"][0]["points"].append(True),
     "key 'timeline.series[0]' must be an object"),             # was "cannot unpack bool"
    (lambda r: r["timeline"]["series"][0]["points"].append([1.0, math.inf]),
     "key 'timeline.series[0]' must be an object"),             # "Axis limits cannot be Inf"
    (lambda r: r.update(versions={"openvswitch": {}}, datapath={"x": 1}),
     "report.md cannot be drawn from it (TypeError"),           # was a traceback
    (lambda r: r.update(scenario="rfabric", metrics={"fabrics": 5.0}),
     "the plots cannot be drawn from it (TypeError: 'float' object is not iterable)"),
])
def test_a_value_of_the_wrong_type_deep_in_result_json_names_the_file(tmp_path, change,
                                                                        message):
    result = synthetic_result()
    change(result)
    folder = write_folder(tmp_path / "run", {"result.json": json.dumps(result).encode()})
    stderr = report_error(folder)
    assert str(folder / "result.json") in stderr and message in stderr, stderr


def replay_error(folder: Path) -> str:
    with pytest.raises(ReplayError) as caught:
        load_run(folder)
    assert_clear(str(caught.value), str(folder))
    return str(caught.value)


@pytest.mark.parametrize("change, message", [
    (lambda events: events[0]["fabric"]["links"][0].pop("gbps"),
     "the 'testbed' event at t=1700000000.0: 'fabric.links[0].gbps' must be a finite number"),
    (lambda events: events[3].update(tear=[[2, 3, 4]]),
     "the 'circuit' event at t=1700000003.0: 'tear' must be a list of port pairs"),
    (lambda events: events[2]["links"].append(["s1", "3"]),
     "'links[4]' must be [node, port, peer, peer_port, Mbit/s]"),
    (lambda events: events.append({"kind": "credits", "t": T0, "d": ["h5"], "used": 1}),
     "the 'credits' event at t=1700000000.0: 'd' must be a string"),
    (lambda events: events[1].update(t="soon"), "line 2: 't' must be a finite number"),
])
def test_an_event_the_view_cannot_show_is_refused_when_the_run_loads(tmp_path, change, message):
    """Each loaded without a word and failed later, when the page asked for a
    moment after it (a KeyError, or a ValueError unpacking a port pair)."""
    events = ocs_run()
    change(events)
    folder = write_view_folder(tmp_path / "run", events, "event", b"")
    assert message in replay_error(folder)


@pytest.mark.parametrize("noise, message", [
    (b"\xff\xfe", "not UTF-8 text"),                     # named no file
    (b"x,", "is not a load sample"),                     # a time that is no number: named no file
])
def test_a_damaged_load_csv_is_refused_naming_it(tmp_path, noise, message):
    folder = write_view_folder(tmp_path / "run", ocs_run(), "load-file", noise)
    error = replay_error(folder)
    assert f"{folder / LOAD_FILE}" in error and message in error, error


# ------------------------------------------------------------ the command lines
@pytest.mark.parametrize("module", ["emu.report", "emu.view"])
def test_the_command_lines_exit_2_without_a_traceback(tmp_path, module):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "result.json").write_bytes(b"\xff\xfe{")
    (folder / EVENTS_FILE).write_bytes(b'{"kind": "testbed", "t": "soon"}\n' * 2)
    done = subprocess.run([sys.executable, "-m", module, str(folder)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert_clear(done.stderr, str(folder))
