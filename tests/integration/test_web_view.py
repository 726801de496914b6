"""The web view in a real browser: Debian's chromium, headless, through chromedriver.

A run of ``ocs-reconfig --web`` with a 2.5 s custom circuit change is watched
while it goes on: the circuit being changed must be shown dark, then lit, the
links on the TCP flow's path must show load, and a request without the token
must be refused.  The test saves a screenshot into the run's folder, which the
report embeds.  Then the finished run is replayed (``python -m emu.view``)
and its slider moved.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.integration.utils import REPO, assert_no_leftovers

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DELAY_MS = 2500.0
SCREENSHOT = "web-view.png"


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        assert os.path.exists(path), f"{path} missing: `make test` installs chromium and " \
                                     "chromium-driver (bootstrap.sh --with-browser)"
    options = Options()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1400,900"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def model_data(driver, name: str):
    """A Bokeh model's data as the browser holds it (None until the page is up)."""
    return driver.execute_script(
        "const doc = window.Bokeh && Bokeh.documents && Bokeh.documents[0];"
        "if (!doc) return null;"
        f"const model = doc.get_model_by_name({json.dumps(name)});"
        "return model ? model.data : null;")


def poll(driver, name, condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        seen = model_data(driver, name)
        if seen and condition(seen):
            return seen
        time.sleep(0.1)   # the page itself refreshes every 250 ms
    raise AssertionError(f"the page never showed {what} within {timeout_s:.0f} s; last: {seen}")


def read_until(process, pattern: str, timeout_s: float) -> re.Match:
    deadline = time.monotonic() + timeout_s
    lines = []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        found = re.search(pattern, line)
        if found:
            return found
    raise AssertionError(f"no line matching {pattern!r} in the run's output:\n{''.join(lines)}")


def refused(url: str) -> int:
    try:
        urllib.request.urlopen(url, timeout=5)
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


def test_live_page_shows_a_circuit_change(tmp_path, dataplane):
    command = [sys.executable, "-m", "emu.run", "ocs-reconfig", "--web", "--out", str(tmp_path),
               "--set", "presets=custom", "--set", f"custom_delay_ms={DELAY_MS}",
               "--set", "settle_s=3", "--set", f"dataplane={dataplane}"]
    run = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True)
    driver = None
    try:
        run_dir = Path(read_until(run, r"results -> (\S+)", 60).group(1))
        url = read_until(run, r"web view: (http://127\.0\.0\.1:\d+/\?bokeh-session-id=\S+)",
                         120).group(1)
        base = url.split("?")[0]
        assert refused(base) == 403, "the page answered without its token"
        assert refused(base + "data") == 403, "the data endpoint answered without its token"
        assert refused(base + "?bokeh-session-id=forged") == 403

        driver = browser()
        driver.get(url)
        # The reconfiguration starts after 3 s of settling: the old circuit goes
        # dark and the new one waits 2.5 s, dark, before it lights.
        rows = lambda d: zip(d["ocs"], d["ports"], d["state"])  # noqa: E731
        changing = poll(driver, "circuits",
                        lambda d: "dark" in d["state"] and "about to light" in d["state"], 90,
                        "a circuit dark and one about to light")
        lighting = {(o, p) for o, p, s in rows(changing) if s == "about to light"}
        poll(driver, "circuits",
             lambda d: not {"dark", "about to light"} & set(d["state"])
             and lighting <= {(o, p) for o, p, s in rows(d) if s == "lit"},
             30, f"the new circuit {sorted(lighting)} lit")

        links = poll(driver, "links", lambda d: any(m > 1.0 for m in d["mbps"]), 30,
                     "load on a link")
        busy = {label for label, mbps in zip(links["label"], links["mbps"]) if mbps > 1.0}
        # The TCP flow (h1 -> h2) leaves h1 by its ToR and crosses the OCS.
        assert any("h1" in label for label in busy), busy
        assert any("o1" in label for label in busy), busy
        driver.save_screenshot(str(run_dir / SCREENSHOT))
    finally:
        if driver is not None:
            driver.quit()
        output, _ = run.communicate(timeout=180)
    assert run.returncode == 0, output
    assert "web view stopped" in output, output
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ok" and result["web_view"] is True
    assert (run_dir / "load.csv").is_file() and (run_dir / "events.jsonl").is_file()
    assert SCREENSHOT in (run_dir / "report.md").read_text()
    assert_no_leftovers()
    if dataplane == "linux":
        replay_and_move_the_slider(run_dir)


def replay_and_move_the_slider(run_dir: Path):
    view = subprocess.Popen([sys.executable, "-m", "emu.view", str(run_dir)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    driver = None
    try:
        url = read_until(view, r"open (http://127\.0\.0\.1:\d+/\?bokeh-session-id=\S+)",
                         60).group(1)
        assert refused(url.split("?")[0]) == 403
        driver = browser()
        driver.get(url)
        poll(driver, "circuits", lambda d: len(d["state"]) > 0, 30, "the circuits")
        events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
        first = min(e["t"] for e in events)
        dark_at = next(e["t"] for e in events
                       if e["kind"] == "circuit" and e.get("step") == "dark") - first
        for seconds, expected in ((dark_at + 0.5, "dark"),
                                  (dark_at + DELAY_MS / 1000 + 1.0, "lit")):
            driver.execute_script(
                "const slider = Bokeh.documents[0].get_model_by_name('time');"
                f"slider.value = {seconds};")
            states = poll(driver, "circuits",
                          lambda d, want=expected: (want == "dark") == ("dark" in d["state"]),
                          15, f"the circuits {expected} at {seconds:.1f} s")
            assert states
    finally:
        if driver is not None:
            driver.quit()
        view.terminate()
        view.communicate(timeout=30)
