"""The guided labs in docs/labs, checked without root so that they cannot rot.

Every lab has its sections; every ```cli block is its .cli file, verbatim;
every ```sh line is an ``emu.run`` command that parses, whose scenario passes
``--check`` and whose ``sudo`` matches whether it builds a network; and
every line of a CLI script is a command the lab CLI knows, naming hosts,
OCS, ports and presets that exist on that command's fabric (``ocs set`` is
replayed on a copy of the fabric, so later ``route`` and ``replay`` lines
are checked against the circuits of that moment).
``tests/integration/test_labs.py`` runs the same commands as root.
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

import pytest

from controllers.ocs_core import CUSTOM, delay_ms_for
from emu import run as emu_run
from emu import scenario as scenarios
from emu.experiments.base import build_fabric
from topologies import routing

REPO = Path(__file__).resolve().parents[2]
LABS_DIR = REPO / "docs" / "labs"
LABS = ("01-circuits.md", "02-oversubscription.md", "03-rfabric-weight-sync.md",
        "04-zcube-vs-roft-kv.md", "05-pd-sizing.md", "06-failures.md")
SECTIONS = ("Goal", "Commands", "Observe", "Question")
ROOT_PREFIX = ("sudo", ".venv/bin/python", "-m", "emu.run")
USER_PREFIX = (".venv/bin/python", "-m", "emu.run")
FENCE = re.compile(r"^```\s*([\w-]*)\s*$")
CLI_FILE = re.compile(r"`(docs/labs/[\w.-]+\.cli)`")


@dataclass
class Block:
    lang: str
    text: str          # the lines between the fences, joined with "\n"
    line: int          # 1-based line of the opening fence
    before: str        # the last non-blank line before the opening fence


@dataclass
class Command:
    source: str                  # the line as written in the lab
    root: bool                   # written with sudo
    argv: List[str]              # the arguments after ``python -m emu.run``
    args: argparse.Namespace     # emu.run's parse of argv

    @property
    def script(self) -> Optional[Path]:
        return REPO / self.args.cli_script if self.args.cli_script else None

    def check_argv(self) -> List[str]:
        """The same scenario and overrides, validated only (no --cli, --out)."""
        argv = [self.args.scenario]
        for override in self.args.set:
            argv += ["--set", override]
        return argv + ["--check"]

    def run_argv(self, out: Path) -> List[str]:
        """argv with its results sent to `out` (any --out of the lab replaced)."""
        argv, skip = [], False
        for word in self.argv:
            if skip:
                skip = False
            elif word == "--out":
                skip = True
            elif not word.startswith("--out="):
                argv.append(word)
        return argv + ["--out", str(out)]


def blocks(text: str) -> List[Block]:
    """Fenced blocks of a Markdown text, with the line just before each."""
    found, lines = [], text.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        before = next((l for l in reversed(lines[:index]) if l.strip()), "")
        end = index + 1
        while end < len(lines) and lines[end].strip() != "```":
            end += 1
        assert end < len(lines), f"unclosed ``` fence at line {index + 1}"
        found.append(Block(opening.group(1), "\n".join(lines[index + 1:end]), index + 1, before))
        index = end + 1
    return found


def parse_command(line: str) -> Command:
    words = shlex.split(line)
    for prefix, root in ((ROOT_PREFIX, True), (USER_PREFIX, False)):
        if tuple(words[:len(prefix)]) == prefix:
            argv = words[len(prefix):]
            try:
                args = emu_run.build_parser().parse_args(argv)
            except SystemExit:
                raise AssertionError(f"emu.run cannot parse: {line}") from None
            return Command(line, root, argv, args)
    raise AssertionError(f"not an emu.run command line (start with "
                         f"{' '.join(ROOT_PREFIX)} or {' '.join(USER_PREFIX)}): {line}")


def lab_commands(lab: Path) -> List[Command]:
    return [parse_command(line) for block in blocks(lab.read_text()) if block.lang == "sh"
            for line in block.text.splitlines() if line.strip()]


def cli_blocks(lab: Path) -> List[Block]:
    return [b for b in blocks(lab.read_text()) if b.lang == "cli"]


def script_lines(path: Path) -> List[str]:
    return [line.strip() for line in path.read_text().splitlines() if line.strip()]


def _lab_path(name: str) -> Path:
    path = LABS_DIR / name
    assert path.is_file(), f"{path} is missing"
    return path


# ------------------------------------------------------------ structure
@pytest.mark.parametrize("name", LABS)
def test_lab_has_goal_commands_observe_and_question_in_order(name):
    text = _lab_path(name).read_text()
    headings = [m.group(1) for m in re.finditer(r"^## +(.+?)\s*$", text, re.M)]
    positions = []
    for section in SECTIONS:
        assert section in headings, f"{name}: no '## {section}' section; it has {headings}"
        positions.append(headings.index(section))
    assert positions == sorted(positions), f"{name}: sections out of order: {headings}"
    question = text.split("## Question", 1)[1]
    assert "Hint" in question, f"{name}: the question gives no hint"


@pytest.mark.parametrize("name", LABS)
def test_lab_has_commands(name):
    assert lab_commands(_lab_path(name)), f"{name}: no ```sh command"


# ------------------------------------------------------------ cli blocks and files
@pytest.mark.parametrize("name", LABS)
def test_every_cli_block_is_its_file_verbatim(name):
    for block in cli_blocks(_lab_path(name)):
        named = CLI_FILE.search(block.before)
        assert named, (f"{name}:{block.line}: the line before a ```cli block must name its "
                       f"file as `docs/labs/NN-name.cli`, got {block.before!r}")
        path = REPO / named.group(1)
        assert path.is_file(), f"{name}:{block.line}: {named.group(1)} does not exist"
        assert path.read_text().rstrip("\n") == block.text.rstrip("\n"), \
            f"{name}:{block.line}: the ```cli block differs from {named.group(1)}"


@pytest.mark.parametrize("name", LABS)
def test_every_cli_script_is_shown_and_every_shown_script_is_run(name):
    lab = _lab_path(name)
    shown = {CLI_FILE.search(b.before).group(1) for b in cli_blocks(lab)
             if CLI_FILE.search(b.before)}
    used = {c.args.cli_script for c in lab_commands(lab) if c.args.cli_script}
    assert used <= shown, f"{name}: scripts run but not shown in a ```cli block: {used - shown}"
    assert shown <= used, f"{name}: scripts shown but run by no command: {shown - used}"


def test_no_cli_script_is_orphaned():
    used = {c.args.cli_script for name in LABS for c in lab_commands(_lab_path(name))
            if c.args.cli_script}
    present = {f"docs/labs/{p.name}" for p in LABS_DIR.glob("*.cli")}
    assert present <= used, f"scripts no lab runs: {sorted(present - used)}"


# ------------------------------------------------------------ commands
@pytest.mark.parametrize("name", LABS)
def test_every_command_parses_and_its_scenario_validates(name, capsys):
    for command in lab_commands(_lab_path(name)):
        assert command.args.scenario and not command.args.list, command.source
        code = emu_run.main(command.check_argv())
        captured = capsys.readouterr()
        assert code == 0, f"{command.source}\n--check said: {captured.err or captured.out}"
        emulates = scenarios.load(command.args.scenario, command.args.set).experiment.needs_emulation
        if not command.args.check:
            assert command.root == emulates, (
                f"{command.source}: " + ("builds a network, so it needs sudo" if emulates
                                         else "builds no network: drop sudo"))
        if command.args.cli:
            assert emulates, f"{command.source}: --cli needs a scenario that builds a network"
            assert command.args.cli_script, (
                f"{command.source}: give --cli-script so that the command runs unattended "
                "(the integration test runs it)")
        if command.args.cli_script:
            assert command.args.cli, f"{command.source}: --cli-script does nothing without --cli"
            assert command.script.is_file(), f"{command.source}: no file {command.script}"


# ------------------------------------------------------------ cli script lines
def _cli_commands():
    return [(name, c) for name in LABS for c in lab_commands(_lab_path(name)) if c.args.cli_script]


def _check_script_line(line: str, fabric, cli, down: set) -> None:
    """Raise AssertionError if the lab CLI would refuse `line` on `fabric` (whose
    circuits follow the script's ``ocs set`` lines, and whose ``down`` links
    its ``fail`` and ``restore`` lines)."""
    from emu.live.cli import FabricCLI, failure_links, parse_circuits

    assert "#" not in line, ("no comments in CLI scripts: Mininet's source runs '#' lines "
                             "as commands and prints '*** Unknown command'")
    word, *args = line.split()
    if word in fabric.hosts:
        assert args, "a host command needs a command after the host name"
        return
    assert hasattr(FabricCLI, f"do_{word}"), f"unknown CLI command {word!r}"
    logical = routing.base_graph(fabric)
    for u, v in down:
        while logical.has_edge(u, v):
            logical.remove_edge(u, v)

    def reachable(src, dst):
        assert routing.shortest_paths(logical, src, dst), \
            f"{src} cannot reach {dst} over the circuits lit at this point"

    if word == "route":
        assert len(args) == 2, "usage: route SRC DST"
        src, dst = cli._hosts(",".join(args))
        reachable(src, dst)
    elif word == "replay":
        dag = cli._pattern(shlex.split(line)[1:])
        for flow in dag.flows:
            reachable(flow.src, flow.dst)
    elif word in ("fail", "restore"):
        links = set(failure_links(fabric, args))
        if word == "fail":
            assert not links & down, f"{sorted(links & down)} already down"
            down |= links
        else:
            assert links <= down, f"{sorted(links - down)} are not down"
            down -= links
    elif word == "load":
        assert len(args) <= 1 and (not args or 0 < float(args[0]) <= 60), "usage: load [SECONDS]"
    elif word == "ocs" and args:
        assert args[0] in ("set", "preset"), "usage: ocs | ocs set OCS a-b ... | ocs preset OCS NAME"
        assert len(args) >= 2 and args[1] in fabric.ocs_switches, \
            f"no OCS {args[1:2]}; OCS here: {fabric.ocs_switches}"
        if args[0] == "set":
            fabric.set_circuits(args[1], parse_circuits(args[2:]))
        else:
            assert len(args) in (3, 4), "usage: ocs preset OCS NAME [MS]"
            delay = float(args[3]) if len(args) == 4 else None
            delay_ms_for(args[2], delay)
            assert delay is None or args[2] == CUSTOM, \
                "a delay after a preset name is only used by 'custom'"


@pytest.mark.parametrize("name,command", _cli_commands(),
                         ids=[c.args.cli_script for _, c in _cli_commands()])
def test_every_cli_script_line_fits_its_fabric(name, command):
    from emu.live.cli import FabricCLI

    fabric = build_fabric(scenarios.load(command.args.scenario, command.args.set))
    cli = FabricCLI.__new__(FabricCLI)  # its argument checks only: no network, no Mininet CLI
    cli.fabric = fabric
    lines = script_lines(command.script)
    assert lines, f"{command.script} is empty"
    down = set()
    for number, line in enumerate(lines, 1):
        try:
            _check_script_line(line, fabric, cli, down)
        except (AssertionError, ValueError, KeyError) as exc:
            raise AssertionError(f"{command.args.cli_script} line {number} ({line!r}) on "
                                 f"{fabric.name}: {exc}") from None
