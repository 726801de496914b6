"""emu.view.server and python -m emu.view: the web view served on 127.0.0.1 behind
its signed session id, over the three synthetic runs of `test_view_state`.

Real Bokeh servers on free loopback ports; nothing leaves the machine.
"""

import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from emu.view.__main__ import EXIT_BAD_INPUT, main
from emu.view.page import FabricPage
from emu.view.server import ADDRESS, Source, WebView
from emu.view.state import ViewState
from tests.unit.test_view_state import DARK_UNTIL, RUNS, T0, ocs_run, pd_run, rfabric_run

REPO = Path(__file__).resolve().parents[2]
HTTP_TIMEOUT_S = 10.0


def get(url: str):
    """(status, body) of a GET; an HTTP error is a status like any other."""
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def get_json(url: str) -> dict:
    status, body = get(url)
    assert status == 200, (status, body)
    return json.loads(body)


def state_of(events) -> ViewState:
    state = ViewState()
    state.extend(events)
    return state


@pytest.fixture(scope="module", params=sorted(RUNS))
def served(request):
    """(run name, its WebView over a replayed Source)."""
    make, _spec = RUNS[request.param]
    view = WebView(Source(state_of(make()), live=False), title=request.param).start()
    yield request.param, view
    view.stop()


def base_url(view: WebView) -> str:
    return f"http://{ADDRESS}:{view.port}/"


# ------------------------------------------------------------ /data
def test_data_with_the_session_id_is_the_snapshot(served):
    name, view = served
    assert view.url == f"{base_url(view)}?bokeh-session-id={view.session_id}"
    snap = get_json(view.data_url())
    expected = view.source.snapshot(None)
    assert snap == json.loads(json.dumps(expected))
    # A replay's default moment is its last event (rfabric's testbed closed by then).
    assert snap["t"] == view.source.span[1]
    assert (snap["testbed"] or {}).get("fabric") == {"ocs": "hybrid", "rfabric": None,
                                                     "pd": "zcube"}[name]
    assert len(snap["nodes"]) == {"ocs": 5, "rfabric": 0, "pd": 40}[name]


def test_data_t_picks_the_moment(served):
    name, view = served
    first = get_json(view.data_url(T0 + 0.1))
    assert first["t"] == T0 + 0.1 and first["elapsed_s"] == pytest.approx(0.1)
    assert first["status"] == "running"
    if name == "ocs":
        assert [c["state"] for c in first["circuits"]] == ["lit"]
        dark = get_json(view.data_url(T0 + 4.0))
        assert sorted(c["state"] for c in dark["circuits"]) == ["about to light", "dark"]
        assert [c["remaining_s"] for c in dark["circuits"] if c["a"] == 1] == [
            pytest.approx(DARK_UNTIL - (T0 + 4.0))]
        link = [k for k in dark["links"] if (k["a"], k["a_port"]) == ("o1", 2)][0]
        assert link["circuit"] == "dark" and link["util"] == pytest.approx(0.75)
        assert get_json(view.data_url())["status"] == "ended"
    elif name == "rfabric":
        assert first["testbed"]["label"] == "rfabric"
        phase = get_json(view.data_url(T0 + 2.5))["phase"]
        assert phase["name"] == "gen-pd" and phase["template"] == "gen"
        assert phase["circuits"] == {"o1": [[1, 4], [2, 3]]}
        assert get_json(view.data_url())["testbed"] is None     # closed at the end
    else:
        busy = get_json(view.data_url(T0 + 1.5))
        assert [r["id"] for r in busy["requests"]["in_flight"]] == ["r0", "r1", "r2"]
        assert {c["d"]: (c["used"], c["total"], c["streams"]) for c in busy["credits"]} == {
            "h5": (2, 2, 3), "h13": (1, 2, 2)}
        end = get_json(view.data_url())["requests"]
        assert (end["done"], end["failed"]) == (1, 1)


def test_data_without_the_right_session_id_is_refused(served):
    _name, view = served
    data = f"{base_url(view)}data"
    assert get(data)[0] == 403
    assert get(f"{data}?t={T0}")[0] == 403
    assert get(f"{data}?bokeh-session-id=forged")[0] == 403
    other = WebView(view.source)        # a session id signed with another key
    assert get(f"{data}?bokeh-session-id={other.session_id}")[0] == 403
    assert get(view.data_url()[:-1])[0] == 403            # one character short


def test_data_with_a_bad_time_is_a_bad_request(served):
    _name, view = served
    for bad in ("abc", "nan", "inf"):
        status, body = get(f"{view.data_url()}&t={bad}")
        assert status == 400, (bad, status)
        assert "t must be" in body


def test_a_live_source_shows_now_by_default():
    state = state_of(pd_run())
    view = WebView(Source(state, live=True)).start()
    try:
        before = time.time()
        snap = get_json(view.data_url())
        assert before <= snap["t"] <= time.time()
        assert (snap["requests"]["done"], snap["requests"]["failed"]) == (1, 1)
        state.add({"kind": "warning", "t": time.time(), "text": "just now"})
        assert get_json(view.data_url())["warnings"][-1] == "just now"
    finally:
        view.stop()


# ------------------------------------------------------------ the page
def test_the_page_needs_the_session_id(served):
    _name, view = served
    assert get(base_url(view))[0] == 403
    assert get(f"{base_url(view)}?bokeh-session-id=forged")[0] == 403
    sessions = view.sessions
    status, page = get(view.url)
    assert status == 200
    assert view.sessions == sessions + 1          # the page's document was built
    assert "<html" in page.lower() and "/static/" in page
    # Everything the page loads comes from this server: no address outside it,
    # no protocol-relative one.
    for url in re.findall(r"""https?://[^\s"'<>)]+""", page):
        assert url.startswith(f"http://{ADDRESS}:{view.port}/"), url
    for target in re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", page):
        assert target.startswith("/") and not target.startswith("//"), target
    assert 'src="/static/js/bokeh.min.js' in page


def test_the_static_files_are_served_locally(served):
    _name, view = served
    _status, page = get(view.url)
    script = re.search(r'src="(/static/js/bokeh\.min\.js[^"]*)"', page).group(1)
    status, body = get(f"http://{ADDRESS}:{view.port}{script}")
    assert status == 200 and len(body) > 100_000


def test_the_server_listens_on_loopback_only(served):
    _name, view = served
    sockets = list(view._server._http._sockets.values())
    assert sockets and {s.getsockname()[0] for s in sockets} == {ADDRESS}
    # Another loopback address reaches a server bound to all addresses, not this one.
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.2", view.port), timeout=HTTP_TIMEOUT_S).close()


def test_a_chosen_port_is_used_and_stop_ends_the_thread():
    with socket.socket() as probe:
        probe.bind((ADDRESS, 0))
        port = probe.getsockname()[1]
    view = WebView(Source(state_of(ocs_run()), live=False), port=port).start()
    assert view.port == port and view.url.startswith(f"http://{ADDRESS}:{port}/?")
    assert get(view.data_url())[0] == 200
    view.stop()
    assert not view._thread.is_alive()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((ADDRESS, port), timeout=HTTP_TIMEOUT_S).close()
    view.stop()                                   # harmless twice


def test_a_port_in_use_is_an_error_at_start():
    with socket.socket() as taken:
        taken.bind((ADDRESS, 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match="could not start"):
            WebView(Source(state_of(ocs_run()), live=False), port=port).start()


@pytest.mark.parametrize("make", [ocs_run, rfabric_run, pd_run])
def test_the_page_draws_every_moment_of_a_run(make):
    state = state_of(make())
    start, end = state.span
    page = FabricPage(state.snapshot, replay_span=(start, end))
    seen = set()
    t = start - 1.0
    while t <= end + 1.0:
        page.show(state.snapshot(t))
        seen.update(page.circuits.data["state"])
        if page.links.data:
            assert len(page.links.data["color"]) == len(page.links.data["label"])
        t += 0.25
    if make is pd_run:
        assert page.credit_plot.visible
        assert list(page.credit_plot.x_range.factors) == ["h13", "h5"]
    else:
        assert {"lit", "dark"} <= seen
    page.slider.value = 4.0
    page.refresh()
    assert "since the first event" in page.header.text


# ------------------------------------------------------------ python -m emu.view
def test_replaying_a_missing_folder_exits_2_naming_it(tmp_path):
    missing = tmp_path / "no-such-run"
    done = subprocess.run([sys.executable, "-m", "emu.view", str(missing)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_BAD_INPUT == 2
    assert f"emu.view: {missing}: no such results folder" in done.stderr
    assert done.stdout == ""


def test_replaying_a_folder_without_events_exits_2(tmp_path, capsys):
    assert main([str(tmp_path)]) == EXIT_BAD_INPUT
    assert f"{tmp_path}: no events.jsonl" in capsys.readouterr().err
    assert main([str(tmp_path), "--port", "70000"]) == EXIT_BAD_INPUT
    assert "--port 70000: must be 0-65535" in capsys.readouterr().err

