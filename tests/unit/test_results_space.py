"""emu.results_space: what a run needs on disk, and the results folder refused
before anything exists when it cannot take it (`emu.run` exits 2).

No emulation runs here: `emu.run`'s run entry points, the run folder's making
and the testbed state are trip wires (a refusal must come before them)."""

from __future__ import annotations

import collections
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from emu import results, results_space
from emu import run as emu_run
from emu import scenario as scenarios
from emu.experiments import EXPERIMENTS
from emu.experiments.base import build_fabric
from emu.live.dataplane import Choice
from emu.results_space import (CAPTURE_SECONDS, CAPTURED_SHARE, RESULTS_BYTES,
                               ResultsFolderError, capture_kind, check_results_folder,
                               estimate_run_bytes)
from fuzzing import assert_clear, capture_stderr, no_run_state

REPO = Path(__file__).resolve().parents[2]
DiskUsage = collections.namedtuple("DiskUsage", "total used free")


# ------------------------------------------------------------ the estimate
def test_a_run_without_captures_needs_only_its_files():
    for name in ("allreduce", "fabrics", "lab", "rfabric", "pd-failure"):
        assert estimate_run_bytes(scenarios.load(name)) == RESULTS_BYTES, name
    model = scenarios.load("allreduce", ["engine=model"])
    assert capture_kind(model) is None


def test_receiver_captures_count_every_host_link_at_its_rate():
    """ocs-reconfig: every host link, both directions, at link_mbps (its hosts'
    links are the fabric's reference rate)."""
    scenario = scenarios.load("ocs-reconfig")
    assert capture_kind(scenario) == "hosts"
    hosts = len(build_fabric(scenario).hosts)
    rate = scenario.config["scale"]["link_mbps"] * 1e6 / 8
    expected = RESULTS_BYTES + int(hosts * 2 * rate * CAPTURED_SHARE * CAPTURE_SECONDS)
    assert estimate_run_bytes(scenario) == pytest.approx(expected, rel=1e-6)
    faster = scenarios.load("ocs-reconfig", ["link_mbps=40"])
    assert estimate_run_bytes(faster) - RESULTS_BYTES == \
        pytest.approx(2 * (expected - RESULTS_BYTES), rel=1e-6)


def test_link_capture_counts_every_link_and_only_when_on():
    on = scenarios.load("pd-inference")
    assert on.section["link_capture"] and capture_kind(on) == "links"
    off = scenarios.load("pd-inference", ["link_capture=false"])
    assert estimate_run_bytes(off) == RESULTS_BYTES < estimate_run_bytes(on)


def test_the_kinds_that_capture_are_the_ones_the_estimate_knows():
    """A new experiment that captures must be counted: RECEIVER_CAPTURES, or a
    link_capture setting for the fabric-wide capture (`pd_serve`'s links_dir)."""
    for kind, experiment in EXPERIMENTS.items():
        source = inspect.getsource(sys.modules[experiment.run.__module__])
        if re.search(r"\bCapture\(", source):
            assert kind in results_space.RECEIVER_CAPTURES, kind
        if "links_dir=" in source:
            assert "link_capture" in experiment.fields, kind


# ------------------------------------------------------------ the folder
def test_a_writable_folder_with_room_passes_and_nothing_is_made(tmp_path):
    out = tmp_path / "results" / "deeper"
    check_results_folder(out, needed=1)
    assert not (tmp_path / "results").exists()


def test_a_folder_that_is_a_file_is_refused(tmp_path):
    out = tmp_path / "results"
    out.write_text("not a folder")
    with pytest.raises(ResultsFolderError, match=re.escape(f"results folder {out} is a file, "
                                                           "not a folder")):
        check_results_folder(out, needed=1)


def test_a_folder_under_a_file_cannot_be_made(tmp_path):
    """Root writes anywhere, but not under a regular file."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(ResultsFolderError, match=re.escape(
            f"results folder {blocker / 'a' / 'b'} cannot be made: {blocker} is a file")):
        check_results_folder(blocker / "a" / "b", needed=1)


def test_a_folder_on_a_read_only_file_system_is_refused(tmp_path, monkeypatch):
    real = os.statvfs

    class ReadOnly:
        def __init__(self, result):
            self._result = result
            self.f_flag = result.f_flag | os.ST_RDONLY

        def __getattr__(self, name):
            return getattr(self._result, name)

    monkeypatch.setattr(results_space.os, "statvfs", lambda path: ReadOnly(real(path)))
    with pytest.raises(ResultsFolderError, match=re.escape(
            f"results folder {tmp_path / 'new'} cannot be written ({tmp_path}, where it would "
            "be made, is on a read-only file system)")):
        check_results_folder(tmp_path / "new", needed=1)
    with pytest.raises(ResultsFolderError, match="it is on a read-only file system"):
        check_results_folder(tmp_path, needed=1)


def test_a_folder_the_user_cannot_write_is_refused(tmp_path, monkeypatch):
    """As a user without write permission (access() says so; root passes it)."""
    monkeypatch.setattr(results_space.os, "access", lambda path, mode: False)
    with pytest.raises(ResultsFolderError, match=re.escape(
            f"results folder {tmp_path} cannot be written: it is not writable")):
        check_results_folder(tmp_path, needed=1)


def test_a_folder_with_less_room_than_the_run_needs_is_refused_naming_both(tmp_path,
                                                                             monkeypatch):
    monkeypatch.setattr(results_space.shutil, "disk_usage",
                        lambda path: DiskUsage(10**12, 10**12 - 5_000_000, 5_000_000))
    needed = 200 * 2**20
    with pytest.raises(ResultsFolderError) as caught:
        check_results_folder(tmp_path / "results", needed)
    message = str(caught.value)
    for part in (f"results folder {tmp_path / 'results'}", "4.8 MiB free (5,000,000 bytes)",
                 f"needs about 200.0 MiB ({needed:,} bytes"):
        assert part in message, message


# ------------------------------------------------------------ emu.run refuses before state
class Tripped(AssertionError):
    """The run got past the results folder check."""


@pytest.fixture
def guarded(monkeypatch, tmp_path):
    def trip(*args, **kwargs):
        raise Tripped("the run went on past a results folder it cannot use")

    for name in ("execute", "lab"):
        monkeypatch.setattr(emu_run, name, trip)
    monkeypatch.setattr(results, "new_run_dir", trip)
    monkeypatch.setattr(emu_run, "dataplane_of", lambda scenario: Choice("linux", "auto", "test"))
    with no_run_state(monkeypatch, tmp_path) as directory:
        yield directory


@pytest.mark.parametrize("name", ["fabrics", "ocs-reconfig"])
def test_emu_run_exits_2_for_a_folder_under_a_file(guarded, tmp_path, monkeypatch, name):
    if scenarios.load(name).emulates:
        monkeypatch.setattr(emu_run.os, "geteuid", lambda: 0)     # past the root check
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, stderr = capture_stderr(emu_run.main, [name, "--out", str(blocker / "results")])
    assert code == emu_run.EXIT_BAD_INPUT, stderr
    assert_clear(stderr, f"emu.run: results folder {blocker / 'results'} cannot be made")


def test_emu_run_exits_2_when_the_captures_would_not_fit(guarded, tmp_path, monkeypatch):
    monkeypatch.setattr(emu_run.os, "geteuid", lambda: 0)
    monkeypatch.setattr(results_space.shutil, "disk_usage",
                        lambda path: DiskUsage(10**9, 10**9 - 50 * 2**20, 50 * 2**20))
    needed = estimate_run_bytes(scenarios.load("ocs-reconfig"))
    code, stderr = capture_stderr(emu_run.main, ["ocs-reconfig", "--out", str(tmp_path)])
    assert code == emu_run.EXIT_BAD_INPUT, stderr
    assert_clear(stderr, f"results folder {tmp_path} has 50.0 MiB free")
    assert f"({needed:,} bytes" in stderr
    assert list(tmp_path.iterdir()) == [], "the refusal created something"


def test_the_command_line_exits_2_without_a_traceback(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    env = dict(os.environ, FABRIC_EMU_RUN_DIR=str(tmp_path / "run-state"))
    done = subprocess.run([sys.executable, "-m", "emu.run", "fabrics", "--out",
                           str(blocker / "results")], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert_clear(done.stderr, f"results folder {blocker / 'results'} cannot be made")
    assert not (tmp_path / "run-state").exists()
