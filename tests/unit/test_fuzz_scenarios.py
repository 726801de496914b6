"""Hostile scenario files and ``--set`` values: `emu.scenario.load` accepts them or
raises a ScenarioError naming the file and the key, and ``emu.run SCENARIO
--check`` exits 0 or 2 with that message and no traceback.

Every example goes through ``--check`` or the loader only (a fuzzed input may
turn out valid, and a real run would start an emulation): `emu.run.execute` and
`emu.run.lab` are trip wires here, as is anything that would create testbed
state (`fuzzing.no_run_state`).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from emu import run as emu_run
from emu import scenario as scenarios
from emu.schema import ScenarioError
from fuzzing import (assert_clear, capture_stderr, hostile_text, no_run_state, share,
                     with_fixtures)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[2]
# The scenarios whose check takes milliseconds; the others (cost, *-scale) take
# seconds per example and are covered by the same loader.
FAST = ["allreduce", "fabrics", "lab", "ocs-reconfig", "orchestrrl", "pd-calc", "pd-failure",
        "pd-inference", "pd-pairing", "rfabric", "rotor"]
RAW = {name: tomllib.loads((scenarios.BUILTIN_DIR / f"{name}.toml").read_text())
       for name in FAST}


class Tripped(AssertionError):
    """A fuzzed input reached a real run."""


@pytest.fixture
def guarded(monkeypatch, tmp_path):
    """No real run, no testbed state: `emu.run`'s run entry points trip."""
    def trip(*args, **kwargs):
        raise Tripped("a fuzzed input reached a real run; only --check is allowed here")

    monkeypatch.setattr(emu_run, "execute", trip)
    monkeypatch.setattr(emu_run, "lab", trip)
    with no_run_state(monkeypatch, tmp_path) as directory:
        yield directory


def refusal(exc: Exception) -> str:
    """The kind of a refusal, for the statistics (--hypothesis-show-statistics)."""
    text = re.sub(r"^\S+\.toml: ", "", str(exc))
    return re.sub(r"'[^']*'|\"[^\"]*\"|\d+", "_", text)[:50]


def check_command(*argv: str) -> tuple:
    """``python -m emu.run ARGV --check`` in this process: (exit code, stderr)."""
    assert "--check" in argv
    return capture_stderr(emu_run.main, list(argv))


def assert_checked(argv, where: str, *names: str) -> None:
    """0 (valid), or 2 with a message naming ``where`` and one of ``names``."""
    code, stderr = check_command(*argv)
    assert code in (0, 2), f"{argv}: exit {code}; {stderr}"
    if code == 2:
        assert stderr.startswith("emu.run: "), stderr
        assert_clear(stderr, where)
        if names:
            assert_clear(stderr, *names)


# ------------------------------------------------------------ TOML written back
def toml_key(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)


def toml_value(value) -> str:
    """A TOML literal for a value of `toml_values` (JSON's string escapes are TOML's)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"


def toml_document(data: dict) -> str:
    lines = []
    for section, table in data.items():
        if isinstance(table, dict):
            lines.append(f"[{toml_key(section)}]")
            lines += [f"{toml_key(key)} = {toml_value(value)}" for key, value in table.items()]
        else:
            lines.insert(0, f"{toml_key(section)} = {toml_value(table)}")
    return "\n".join(lines) + "\n"


toml_scalars = (st.booleans() | st.integers(-2**63, 2**63 - 1) | st.integers(-3, 20)
                | st.floats(allow_nan=True, allow_infinity=True) | hostile_text
                | st.sampled_from(["", "auto", "model", "emulate", "zcube,n=4", "fattree,k=4,k=8",
                                   "hybrid,gbps=nan", "../../etc/passwd", "h1", "o1"]))
toml_values = st.recursive(toml_scalars, lambda children: st.lists(children, max_size=3)
                           | st.dictionaries(hostile_text, children, max_size=3), max_leaves=6)


def near_values(field):
    """Values of a schema field's own type, at and past its bounds and choices,
    and now and then of another type."""
    kind = field.item if field.kind in (list, dict) else field.kind
    if kind is bool:
        typed = st.booleans()
    elif kind is int:
        edges = [b for b in (field.minimum, field.maximum) if b is not None]
        typed = (st.integers(-3, 40) | st.sampled_from([0, -1, 2**31, 2**63 - 1, -2**63])
                 | st.sampled_from(edges or [0]).flatmap(
                     lambda b: st.sampled_from([int(b) - 1, int(b), int(b) + 1])))
    elif kind is float:
        typed = (st.floats(allow_nan=True, allow_infinity=True)
                 | st.floats(-10, 1e4) | st.sampled_from([0.0, -0.0, 1e-300, 1e300]))
    else:
        typed = (st.sampled_from(list(field.choices or []) + ["", "zcube,n=4", "hybrid",
                                                               "fattree,k=4,k=8", "h1", "o1"])
                 | hostile_text)
    if field.kind is list:
        typed = st.lists(typed | st.sampled_from(list(field.choices or [""])), max_size=4)
    elif field.kind is dict:
        typed = st.dictionaries(st.sampled_from(list(field.choices or ["x"])) | hostile_text,
                                typed, max_size=3)
    return typed | toml_values


@st.composite
def mutated_scenarios(draw):
    """A built-in scenario with one to three keys changed (mostly to values of
    their own type), removed, or added where no key belongs."""
    name = draw(st.sampled_from(FAST))
    data = {section: dict(table) if isinstance(table, dict) else table
            for section, table in RAW[name].items()}
    schema = scenarios.schema_for(data["scenario"]["kind"])
    for _ in range(draw(st.integers(1, 3))):
        section = draw(st.sampled_from(sorted(schema)))
        key = draw(st.sampled_from(sorted(schema[section])))
        table = data.setdefault(section, {})
        if not isinstance(table, dict):
            continue
        what = draw(st.integers(0, 19))
        if what == 0:
            table.pop(key, None)
        elif what == 1:
            table[draw(hostile_text)] = draw(toml_values)
        elif what == 2:
            data[draw(hostile_text)] = draw(toml_values)
        else:
            table[key] = draw(near_values(schema[section][key]))
    if draw(st.integers(0, 19)) == 0:
        data[draw(st.sampled_from(sorted(schema)))] = draw(toml_scalars)   # a section that is no table
    return name, data


@with_fixtures
@given(mutated_scenarios())
def test_a_mutated_scenario_file_is_valid_or_refused_naming_file_and_key(guarded, tmp_path,
                                                                         case):
    name, data = case
    path = tmp_path / f"{name}.toml"
    path.write_text(toml_document(data), encoding="utf-8")
    _loaded_or_refused_naming(path)


def _loaded_or_refused_naming(path) -> None:
    """The file loads, or is refused naming it, in the loader and in --check alike."""
    try:
        scenarios.load(str(path))
        event("accepted")
    except ScenarioError as exc:
        event(f"refused: {refusal(exc)}")
        assert_clear(str(exc), str(path))
    assert_checked([str(path), "--check"], str(path))


# ------------------------------------------------------------ any bytes at all
file_bytes = st.one_of(
    st.binary(max_size=200),
    hostile_text.map(lambda text: text.encode("utf-8")),
    st.sampled_from(FAST).map(lambda n: (scenarios.BUILTIN_DIR / f"{n}.toml").read_bytes())
    .flatmap(lambda data: st.integers(0, len(data)).map(lambda cut: data[:cut])),
    st.sampled_from([b"\xff\xfe[scenario]\n", b"[scenario]\nkind = \"lab\"\n\x80\n",
                     b"\x00" * 8, "[scenario]\nkind = \"lab\"\n\ufeff".encode()]))


@with_fixtures
@given(file_bytes)
def test_any_bytes_as_a_scenario_file_are_refused_naming_the_file(guarded, tmp_path, data):
    path = tmp_path / "bytes.toml"
    path.write_bytes(data)
    _loaded_or_refused_naming(path)


# ------------------------------------------------------------ --set values
@st.composite
def overrides(draw):
    """A built-in scenario and one to three --set arguments: the schema's own
    keys (dotted or not) or others, with values as a shell passes them."""
    name = draw(st.sampled_from(FAST))
    schema = scenarios.schema_for(RAW[name]["scenario"]["kind"])
    keys = [f"{section}.{key}" for section, fields in schema.items() for key in fields] + \
        [key for fields in schema.values() for key in fields]
    texts = []
    fields = {f"{section}.{key}": field for section, table in schema.items()
              for key, field in table.items()}
    fields.update({key: field for table in schema.values() for key, field in table.items()})
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from(keys))
        near = near_values(fields[key]) if draw(st.integers(0, 3)) else toml_values
        value = draw(near)
        if isinstance(value, list) and all(not isinstance(v, (list, dict)) for v in value):
            shown = ",".join(toml_value(v) if isinstance(v, (bool, float)) else str(v)
                             for v in value)     # a,b,c as a shell passes a list
        else:
            shown = value if isinstance(value, str) else toml_value(value)
        what = draw(st.integers(0, 9))
        if what == 0:
            texts.append(draw(hostile_text))
        elif what == 1:
            texts.append(draw(st.sampled_from([f"{key}", f"={shown}", f"{key}.x={shown}",
                                               f"{draw(hostile_text)}={shown}"])))
        else:
            texts.append(f"{key}={shown}")
    return name, texts


@with_fixtures
@given(overrides())
def test_set_values_are_applied_or_refused_naming_the_key(guarded, case):
    name, texts = case
    try:
        scenarios.load(name, texts)
        event("accepted")
    except ScenarioError as exc:
        event(f"refused: {refusal(exc)}")
        assert_clear(str(exc), "--set", str(scenarios.BUILTIN_DIR / f"{name}.toml"))
    argv = [name] + [arg for text in texts for arg in ("--set", text)] + ["--check"]
    code, stderr = check_command(*argv)
    assert code in (0, 2), f"{argv}: exit {code}; {stderr}"
    if code == 2:
        assert_clear(stderr, "--set", name)


# ------------------------------------------------------------ the command line itself
def run_check(*argv: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """The real command line, with its testbed state pointed into ``tmp_path``."""
    env = dict(os.environ, FABRIC_EMU_RUN_DIR=str(tmp_path / "run-state"))
    return subprocess.run([sys.executable, "-m", "emu.run", *argv], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("argv, names", [
    (["lab", "--set", "fabric.spec=fattree,k=4,k=8", "--check"], ["key 'k' is given more than once"]),
    (["allreduce", "--set", "hosts=\udcff", "--check"], ["allreduce.hosts"]),
])
def test_the_command_line_exits_2_without_a_traceback(tmp_path, argv, names):
    done = run_check(*argv, tmp_path=tmp_path)
    assert done.returncode == 2, done.stderr
    assert_clear(done.stderr, *names)
    assert not (tmp_path / "run-state").exists()


def test_a_scenario_file_that_is_not_utf8_exits_2_naming_it(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes('[scenario]\nkind = "lab"\ndescription = "caf\xe9"\n'.encode("latin-1"))
    done = run_check(str(path), "--check", tmp_path=tmp_path)
    assert done.returncode == 2, done.stderr
    assert_clear(done.stderr, f"{path}: not UTF-8 text")
    assert not (tmp_path / "run-state").exists()
