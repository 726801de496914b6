"""Every command of the guided labs in docs/labs, run for real, so the docs cannot rot.

Each ```sh line of a lab runs from the repository root as its own process
(``sudo`` dropped: the tests already run as root), with ``--out`` pointing
to a temporary folder.  Labs that drive the CLI do so with ``--cli-script``,
so nothing waits for a keyboard.  A command must exit 0; a scenario run must
leave a result.json whose status is ok; a CLI run must print none of the
CLI's ``*** `` error lines, and every ``route``, ``replay``, ``ocs set`` and
``ping`` of its script must have printed its result.  The static checks
(sections, blocks equal to files, ``--check``) are in
tests/unit/test_labs_docs.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.utils import REPO, assert_no_leftovers
from tests.unit.test_labs_docs import LABS, LABS_DIR, Command, lab_commands, script_lines

pytestmark = pytest.mark.require_root

COMMAND_TIMEOUT_S = 900
CLI_BANNER = "type help, or exit to leave"     # printed by emu.run.lab before the CLI starts


def _run(command: Command, out: Path) -> subprocess.CompletedProcess:
    # stdin is a pipe nobody writes to and that stays open: Mininet's CLI polls
    # stdin while a host command runs, and /dev/null (always readable) would
    # make that loop spin on a 2-core machine.  stderr is merged into stdout,
    # unbuffered, so lines keep their order.
    read_end, write_end = os.pipe()
    try:
        return subprocess.run([sys.executable, "-m", "emu.run", *command.run_argv(out)],
                              cwd=REPO, stdin=read_end, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=COMMAND_TIMEOUT_S,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
    finally:
        os.close(read_end)
        os.close(write_end)


def _count(lines, pattern: str) -> int:
    return sum(1 for line in lines if re.match(pattern, line))


def _check_cli_output(command: Command, output: str) -> None:
    script = script_lines(command.script)
    lines = output.splitlines()
    assert CLI_BANNER in output, "the CLI never started"
    errors = [line for line in lines if line.startswith("*** ")]
    assert not errors, f"the CLI printed errors: {errors}"
    assert "cannot reach" not in output, "a route found no path"
    expected = {
        r"route ": r".* equal-cost path\(s\) of \d+ hops",
        r"replay ": r"\d+/\d+ flows ok; completion",
        r"ocs set ": r"\S+: tore \d+, lit \d+, kept \d+ circuit\(s\)",
        r"fail ": r"\S+ down: \d+ link\(s\); the controller rerouted in",
        r"restore ": r"\S+ up: \d+ link\(s\); the controller restored its routes in",
        r"h\d+ ping ": r"\d+ packets transmitted, \d+ received",
    }
    for command_re, result_re in expected.items():
        wanted = _count(script, command_re)
        printed = _count(lines, result_re)
        assert printed == wanted, (f"{wanted} line(s) matching {command_re!r} in the script "
                                   f"but {printed} result(s) matching {result_re!r}")
    for done, total in re.findall(r"^(\d+)/(\d+) flows ok", output, re.M):
        assert done == total, f"a replay lost flows: {done}/{total} ok"
    assert not re.search(r", 0 received", output), "a ping got no reply"


def _check_run_folder(out: Path) -> None:
    runs = [p for p in out.iterdir() if p.is_dir()] if out.exists() else []
    assert len(runs) == 1, f"expected one run folder in {out}, found {runs}"
    result = json.loads((runs[0] / "result.json").read_text())
    assert result["status"] == "ok", result["status"]
    assert (runs[0] / "report.md").is_file(), f"no report.md in {runs[0]}"


@pytest.mark.parametrize("name", LABS)
def test_lab_commands_run(name, tmp_path):
    commands = lab_commands(LABS_DIR / name)
    assert commands, f"{name} has no commands"
    for index, command in enumerate(commands):
        assert not command.args.cli or command.args.cli_script, \
            f"{command.source}: --cli without --cli-script would wait for a keyboard"
        out = tmp_path / f"command-{index}"
        done = _run(command, out)
        where = f"{name}: {command.source}\n--- output ---\n{done.stdout}"
        assert done.returncode == 0, f"exit code {done.returncode}\n{where}"
        try:
            if command.args.cli:
                _check_cli_output(command, done.stdout)
            elif not command.args.check:
                _check_run_folder(out)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{where}") from None
    assert_no_leftovers()
