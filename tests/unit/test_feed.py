"""emu.live.feed: a run's events recorded to events.jsonl and handed to listeners."""

import itertools
import json
import logging
import re
import threading
from pathlib import Path

import pytest

from emu.live.feed import EVENTS_FILE, RunFeed, read_events

T0 = 1_700_000_000.0


def ticking_clock(start: float = T0, step: float = 0.5):
    """A clock that moves ``step`` seconds at every reading."""
    counter = itertools.count()
    return lambda: start + step * next(counter)


def recorded_lines(path: Path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def feed(tmp_path):
    feed = RunFeed(tmp_path / "run" / EVENTS_FILE, clock=ticking_clock())
    yield feed
    feed.close()


def test_every_event_but_load_is_one_json_line(feed):
    feed.emit("testbed", fabric={"name": "hybrid"}, dataplane="ovs")
    feed.emit("load", links=[["s1", 1, "h1", 1, 2.5]], interval_s=0.5)
    feed.emit("circuit", ocs="o1", step="start", tear=[[2, 3]], light=[[1, 4]])
    feed.emit("warning", text="slow", t=T0 + 100.0)

    lines = recorded_lines(feed.path)        # the run folder was made on the first event
    assert [line["kind"] for line in lines] == ["testbed", "circuit", "warning"]
    assert lines[0] == {"kind": "testbed", "t": T0, "fabric": {"name": "hybrid"},
                        "dataplane": "ovs"}
    assert lines[1]["t"] == T0 + 1.0          # the load event read the clock in between
    assert lines[1]["tear"] == [[2, 3]] and lines[1]["light"] == [[1, 4]]
    assert lines[2]["t"] == T0 + 100.0        # an event's own time is kept


def test_a_feed_without_a_path_records_nothing_but_still_tells(tmp_path):
    feed = RunFeed(clock=ticking_clock())
    heard = []
    feed.subscribe(heard.append)
    event = feed.emit("warning", text="x")
    assert heard == [event] == [{"kind": "warning", "t": T0, "text": "x"}]
    assert list(tmp_path.iterdir()) == []


def test_the_open_testbeds_label_is_stamped_on_its_events(feed):
    feed.emit("run", status="started")
    feed.label = "zcube"
    feed.emit("testbed", fabric={})
    feed.emit("link", a="s1", b="s5", up=False, label="mine")   # its own label is kept
    feed.label = None
    feed.emit("testbed-closed")

    lines = recorded_lines(feed.path)
    assert [line.get("label") for line in lines] == [None, "zcube", "mine", None]
    assert "label" not in lines[0] and "label" not in lines[3]


def test_listeners_hear_every_event_load_included_until_they_unsubscribe(feed):
    heard = []
    unsubscribe = feed.subscribe(heard.append)
    first = feed.emit("load", links=[], interval_s=0.5)
    second = feed.emit("phase", state="start", name="rollout", iteration=1)
    unsubscribe()
    feed.emit("phase", state="end", name="rollout", iteration=1)
    assert heard == [first, second]
    assert heard[1]["name"] == "rollout" and heard[1]["t"] == T0 + 0.5


def test_a_raising_listener_is_dropped_and_the_run_goes_on(feed, caplog):
    calls, heard = [], []

    def broken(event):
        calls.append(event["kind"])
        raise RuntimeError("watcher bug")

    feed.subscribe(broken)
    feed.subscribe(heard.append)
    with caplog.at_level(logging.ERROR, logger="emu.feed"):
        feed.emit("warning", text="one")
        feed.emit("warning", text="two")
    assert calls == ["warning"]                          # called once, then dropped
    assert [e["text"] for e in heard] == ["one", "two"]  # the others still hear
    assert [e["text"] for e in recorded_lines(feed.path)] == ["one", "two"]
    assert "dropped" in caplog.text


def test_odd_values_are_written_as_json_and_a_bad_one_writes_nothing(feed):
    feed.emit("circuit", ocs="o1", keep={(3, 4), (1, 2)}, pair=(5, 6), where=Path("/x/y"))
    line = recorded_lines(feed.path)[0]
    assert line["keep"] == [[1, 2], [3, 4]] and line["pair"] == [5, 6]
    assert line["where"] == "/x/y"
    with pytest.raises(TypeError, match="object is not JSON"):
        feed.emit("warning", text=object())
    assert len(recorded_lines(feed.path)) == 1          # no torn line left behind


def test_events_from_many_threads_are_whole_lines(feed):
    def emit_many(n):
        for i in range(200):
            feed.emit("request", id=f"{n}-{i}", state="kv")

    threads = [threading.Thread(target=emit_many, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    ids = {line["id"] for line in recorded_lines(feed.path)}
    assert len(ids) == 800


def test_close_then_emit_appends_to_the_same_file(feed):
    feed.emit("warning", text="before")
    feed.close()
    feed.emit("warning", text="after")
    feed.close()
    assert [e["text"] for e in recorded_lines(feed.path)] == ["before", "after"]


# ------------------------------------------------------------ read_events
def write_lines(path: Path, lines) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_read_events_returns_them_oldest_first(tmp_path):
    path = write_lines(tmp_path / EVENTS_FILE, [
        json.dumps({"kind": "phase", "t": T0 + 2}),
        "",
        json.dumps({"kind": "testbed", "t": T0}),
        json.dumps({"kind": "circuit", "t": T0 + 1}),
    ])
    assert [e["kind"] for e in read_events(path)] == ["testbed", "circuit", "phase"]


def test_read_events_skips_a_torn_last_line(tmp_path):
    path = tmp_path / EVENTS_FILE
    path.write_text(json.dumps({"kind": "testbed", "t": T0}) + "\n"
                    + '{"kind": "warning", "t": 17000')       # the run was killed mid-write
    assert [e["kind"] for e in read_events(path)] == ["testbed"]


def test_read_events_rejects_a_bad_line_before_the_last_naming_it(tmp_path):
    path = write_lines(tmp_path / EVENTS_FILE, [
        json.dumps({"kind": "testbed", "t": T0}),
        '{"kind": "warn',
        json.dumps({"kind": "warning", "t": T0 + 1, "text": "x"}),
    ])
    with pytest.raises(ValueError, match=re.escape(f"{path}: line 2 is not JSON")):
        read_events(path)


def test_read_events_rejects_a_line_that_is_not_an_event(tmp_path):
    path = write_lines(tmp_path / EVENTS_FILE, [
        json.dumps({"kind": "testbed", "t": T0}),
        json.dumps({"kind": "warning"}),
    ])
    with pytest.raises(ValueError, match=re.escape(f"{path}: line 2 is not an event")):
        read_events(path)


def test_read_events_of_a_missing_file_is_empty(tmp_path):
    assert read_events(tmp_path / EVENTS_FILE) == []


def test_what_a_feed_records_reads_back(feed):
    feed.emit("warning", text="late", t=T0 + 50)
    feed.emit("testbed", fabric={})
    feed.emit("load", links=[], interval_s=0.5)
    feed.close()
    assert [(e["kind"], e["t"]) for e in read_events(feed.path)] == [
        ("testbed", T0), ("warning", T0 + 50)]
