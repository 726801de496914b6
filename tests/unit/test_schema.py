"""Scenario files and emu.schema: built-ins load, dict (table) fields, --set overrides,
and every error names the file, the dotted key and what is allowed."""

import re
import textwrap

import pytest

from emu import scenario
from emu.experiments import EXPERIMENTS
from emu.schema import Field, ScenarioError, apply_overrides, parse_override, validate

ALLREDUCE = """
[scenario]
kind = "allreduce"

[fabric]
spec = "fattree,k=4"

[scale]
link_mbps = 10.0
tdf = 400.0

[allreduce]
hosts = 8
bytes_real = 1e9
"""

OCS = """
[scenario]
kind = "ocs-reconfig"

[fabric]
spec = "hybrid,tors=2,hosts_per_tor=1"

[ocs_reconfig]
presets = ["mems", "lc"]
"""


def write(tmp_path, text, name="case.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def edit(text, old, new):
    assert old in text, f"test setup: {old!r} not in the template"
    return text.replace(old, new)


def load_error(path, overrides=()) -> str:
    with pytest.raises(ScenarioError) as info:
        scenario.load(str(path), overrides)
    message = str(info.value)
    return message


def assert_names(message, *parts):
    for part in parts:
        assert part in message, f"error should mention {part!r}, got: {message}"


# ---------------------------------------------------------------- built-ins
def test_builtin_scenarios_include_the_two_emulations():
    assert {"ocs-reconfig", "allreduce"} <= set(scenario.builtin_names())


@pytest.mark.parametrize("name", scenario.builtin_names())
def test_builtin_scenario_loads(name):
    loaded = scenario.load(name)
    assert loaded.name == name
    assert loaded.kind in EXPERIMENTS
    assert loaded.experiment is EXPERIMENTS[loaded.kind]
    assert set(loaded.config) == set(scenario.schema_for(loaded.kind))
    assert scenario.describe(name), f"{name} has no description for --list"


def test_builtin_allreduce_resolves_values_and_defaults():
    loaded = scenario.load("allreduce")
    assert loaded.config["fabric"]["spec"] == "fattree,k=4,gbps=400"
    assert loaded.config["scale"] == {"link_mbps": 10.0, "tdf": 400.0}
    assert loaded.section == {"hosts": 8, "bytes_real": 1e9, "ring": [], "transport": "persistent"}
    assert loaded.config["fidelity"] == {"saturation_pct": 90.0, "softirq_pct": 50.0,
                                         "goodput_floor": 0.9}, \
        "a section the file leaves out gets its defaults"


def test_builtin_ocs_reconfig_resolves_its_section():
    loaded = scenario.load("ocs-reconfig")
    assert loaded.section["presets"] == ["rotornet", "mems", "piezo", "lc"]
    assert loaded.section["probe_pps"] == 10000 and loaded.section["src"] == "h1"


def test_a_file_of_ints_is_coerced_to_floats(tmp_path):
    path = write(tmp_path, edit(ALLREDUCE, "tdf = 400.0", "tdf = 400"))
    value = scenario.load(str(path)).config["scale"]["tdf"]
    assert value == 400.0 and isinstance(value, float)


# ---------------------------------------------------------------- file errors
def test_unknown_section(tmp_path):
    path = write(tmp_path, ALLREDUCE + "\n[bogus]\nx = 1\n")
    assert_names(load_error(path), str(path), "unknown section 'bogus'",
                 "allowed sections: allreduce, fabric, fidelity, scale, scenario")


def test_unknown_key(tmp_path):
    path = write(tmp_path, edit(ALLREDUCE, "tdf = 400.0", "tdf = 400.0\nspeed = 3"))
    assert_names(load_error(path), str(path), "unknown key 'scale.speed'",
                 "allowed keys in [scale]: link_mbps, tdf")


@pytest.mark.parametrize("line,key,expected", [
    ('tdf = "fast"', "scale.tdf", "must be float, >= 0.001, <= 1e+06, got 'fast'"),
    ("tdf = nan", "scale.tdf", "must be float"),
    ("tdf = true", "scale.tdf", "must be float"),
])
def test_wrong_type(tmp_path, line, key, expected):
    path = write(tmp_path, edit(ALLREDUCE, "tdf = 400.0", line))
    assert_names(load_error(path), str(path), f"key '{key}'", expected)


def test_bool_is_not_an_int(tmp_path):
    path = write(tmp_path, edit(ALLREDUCE, "hosts = 8", "hosts = true"))
    assert_names(load_error(path), str(path), "key 'allreduce.hosts' must be int, >= 2, got True")


def test_list_items_are_typed(tmp_path):
    path = write(tmp_path, edit(OCS, '["mems", "lc"]', '["mems", 3]'))
    assert_names(load_error(path), "key 'ocs_reconfig.presets' must be list of str")


@pytest.mark.parametrize("old,new,message", [
    ("link_mbps = 10.0", "link_mbps = 0.01", "key 'scale.link_mbps' is 0.01; must be >= 0.1"),
    ("link_mbps = 10.0", "link_mbps = 5000.0",
     "key 'scale.link_mbps' is 5000.0; must be <= 1000"),
    ("hosts = 8", "hosts = 1", "key 'allreduce.hosts' is 1; must be >= 2"),
])
def test_out_of_range(tmp_path, old, new, message):
    path = write(tmp_path, edit(ALLREDUCE, old, new))
    assert_names(load_error(path), str(path), message)


def test_bad_choice(tmp_path):
    path = write(tmp_path, edit(OCS, '["mems", "lc"]', '["mems", "warp"]'))
    assert_names(load_error(path), str(path), "key 'ocs_reconfig.presets' has 'warp'",
                 "allowed: rotornet, mems, piezo, lc, robotic, custom")


def test_bad_experiment_kind(tmp_path):
    path = write(tmp_path, edit(ALLREDUCE, 'kind = "allreduce"', 'kind = "teleport"'))
    assert_names(load_error(path), str(path), "key 'scenario.kind' is 'teleport'",
                 "allowed: " + ", ".join(sorted(EXPERIMENTS)))


def test_missing_required_key(tmp_path):
    path = write(tmp_path, edit(ALLREDUCE, 'spec = "fattree,k=4"', ""))
    assert_names(load_error(path), str(path), "missing required key 'fabric.spec'")


def test_section_must_be_a_table(tmp_path):
    text = ALLREDUCE.replace("[scale]\nlink_mbps = 10.0\ntdf = 400.0\n", "")
    path = write(tmp_path, "scale = 3\n" + text)
    assert_names(load_error(path), str(path), "'scale' must be a [section] table")


def test_top_level_key_outside_any_section(tmp_path):
    path = write(tmp_path, 'title = "my run"\n' + ALLREDUCE)
    assert_names(load_error(path), str(path), "unknown section 'title'")


def test_unknown_fabric_in_spec(tmp_path):
    path = write(tmp_path, edit(ALLREDUCE, '"fattree,k=4"', '"torus,n=4"'))
    assert_names(load_error(path), str(path), "key 'fabric.spec'", "unknown fabric 'torus'",
                 "known fabrics:", "fattree", "hybrid")


@pytest.mark.parametrize("spec,message", [
    ("fattree,q=4", "fattree: unknown parameter 'q'; allowed: k, gbps, hosts_per_edge"),
    ("fattree,k=four", "fattree: k='four' is not a int"),
    ("fattree,k", "'k' is not key=value"),
])
def test_bad_fabric_parameter_in_spec(tmp_path, spec, message):
    path = write(tmp_path, edit(ALLREDUCE, '"fattree,k=4"', f'"{spec}"'))
    assert_names(load_error(path), str(path), "key 'fabric.spec'", message)


def test_fabric_parameter_refused_by_the_builder(tmp_path):
    path = write(tmp_path, edit(ALLREDUCE, '"fattree,k=4"', '"fattree,k=3"'))
    assert_names(load_error(path), str(path), "fattree: k must be an even number >= 2, got 3")


@pytest.mark.parametrize("template,old,new,message", [
    (ALLREDUCE, "hosts = 8", "hosts = 20",
     "allreduce.hosts=20 but the fabric has only 16 hosts"),
    (ALLREDUCE, "hosts = 8", 'ring = ["h1", "h99"]', "allreduce.ring names hosts ['h99']"),
    (OCS, '"hybrid,tors=2,hosts_per_tor=1"', '"fattree,k=4"', "needs the 'hybrid' fabric"),
])
def test_cross_field_checks_of_the_experiment(tmp_path, template, old, new, message):
    path = write(tmp_path, edit(template, old, new))
    assert_names(load_error(path), str(path), message)


def test_invalid_toml(tmp_path):
    path = write(tmp_path, "[scenario\nkind = 'allreduce'\n")
    assert_names(load_error(path), str(path), "not valid TOML")


def test_unknown_scenario_name():
    message = load_error("no-such-scenario")
    assert_names(message, "unknown scenario 'no-such-scenario'", "built-in scenarios:",
                 "allreduce", "ocs-reconfig", "(or give a .toml path)")


def test_missing_scenario_file(tmp_path):
    missing = tmp_path / "absent.toml"
    assert_names(load_error(missing), f"{missing}: no such scenario file")


# ---------------------------------------------------------------- --set overrides
@pytest.mark.parametrize("text,expected", [
    ("a=1", ("a", 1)),
    ("a = 1.5", ("a", 1.5)),
    ("a=true", ("a", True)),
    ("a=h1", ("a", "h1")),
    ("a='quoted'", ("a", "quoted")),
    ("a=1,2", ("a", [1, 2])),
    ("a=mems, lc", ("a", ["mems", "lc"])),
    ("a=[1, 2]", ("a", [1, 2])),
    ("s.k=x=y", ("s.k", "x=y")),
])
def test_parse_override(text, expected):
    assert parse_override(text) == expected


@pytest.mark.parametrize("text,message", [
    ("hosts", "expected key=value"),
    ("=3", "empty key"),
])
def test_parse_override_refuses(text, message):
    with pytest.raises(ScenarioError, match=message):
        parse_override(text)


def test_set_section_key(tmp_path):
    path = write(tmp_path, ALLREDUCE)
    loaded = scenario.load(str(path), ["allreduce.hosts=4", "scale.tdf=10"])
    assert loaded.section["hosts"] == 4
    assert loaded.config["scale"]["tdf"] == 10.0, "an int override of a float key is coerced"


def test_set_unique_key_without_section(tmp_path):
    path = write(tmp_path, ALLREDUCE)
    loaded = scenario.load(str(path), ["hosts=6", "link_mbps=20"])
    assert loaded.section["hosts"] == 6 and loaded.config["scale"]["link_mbps"] == 20.0


def test_set_lists(tmp_path):
    path = write(tmp_path, OCS)
    assert scenario.load(str(path), ["presets=piezo,rotornet"]).section["presets"] == [
        "piezo", "rotornet"]
    assert scenario.load(str(path), ["presets=lc"]).section["presets"] == ["lc"], \
        "a single value for a list key becomes a one-item list"
    ring = scenario.load(str(write(tmp_path, ALLREDUCE, "a.toml")), ["ring=h3,h1,h2"])
    assert ring.section["ring"] == ["h3", "h1", "h2"]


def test_set_string_keeps_commas_as_typed(tmp_path):
    path = write(tmp_path, ALLREDUCE)
    loaded = scenario.load(str(path), ["fabric.spec=fattree,k=4,hosts_per_edge=1"])
    assert loaded.config["fabric"]["spec"] == "fattree,k=4,hosts_per_edge=1"


def test_set_values_are_validated_like_the_file(tmp_path):
    path = write(tmp_path, ALLREDUCE)
    assert_names(load_error(path, ["hosts=abc"]), str(path),
                 "key 'allreduce.hosts' must be int")
    assert_names(load_error(path, ["presets=mems"]), "--set presets: no such key", str(path))
    assert_names(load_error(path, ["scale.speed=1"]), "unknown key 'scale.speed'")
    assert_names(load_error(path, ["bogus.x=1"]), "unknown section 'bogus'")


def test_set_cannot_change_the_experiment_kind(tmp_path):
    path = write(tmp_path, ALLREDUCE)
    assert_names(load_error(path, ["scenario.kind=ocs-reconfig"]), str(path),
                 "cannot change 'scenario.kind'")


def test_ambiguous_key_is_rejected():
    schema = {"alpha": {"rate": Field(float, 1.0)}, "beta": {"rate": Field(float, 2.0)}}
    with pytest.raises(ScenarioError, match=re.escape(
            "--set rate: ambiguous, use one of alpha.rate, beta.rate in here.toml")):
        apply_overrides("here.toml", {}, ["rate=3"], schema)
    merged = apply_overrides("here.toml", {}, ["beta.rate=3"], schema)
    assert validate("here.toml", merged, schema) == {"alpha": {"rate": 1.0},
                                                     "beta": {"rate": 3.0}}


def test_override_does_not_change_the_given_data():
    data = {"alpha": {"rate": 1.0}}
    schema = {"alpha": {"rate": Field(float, 1.0)}}
    merged = apply_overrides("here.toml", data, ["rate=5"], schema)
    assert merged == {"alpha": {"rate": 5}} and data == {"alpha": {"rate": 1.0}}


# ---------------------------------------------------------------- dict (table) fields
TABLE_SCHEMA = {
    "cost": {
        "prices": Field(dict, {}, "price overrides", item=float,
                        choices=["ocs.port", "optics.fiber", "eps.chassis"], minimum=0.0),
        "spec": Field(str, "clos", "a spec string"),
    },
}


def test_a_table_is_flattened_to_dotted_keys_and_coerced():
    config = validate("f.toml", {"cost": {"prices": {"ocs": {"port": 800},
                                                     "optics.fiber": 1.5}}}, TABLE_SCHEMA)
    assert config["cost"]["prices"] == {"ocs.port": 800.0, "optics.fiber": 1.5}
    assert validate("f.toml", {}, TABLE_SCHEMA)["cost"]["prices"] == {}


@pytest.mark.parametrize("prices,message", [
    ({"ocs": {"prot": 1}}, "f.toml: unknown key 'cost.prices.ocs.prot'; allowed keys in "
                           "'cost.prices': ocs.port, optics.fiber, eps.chassis"),
    ({"ocs.port": "cheap"},
     "f.toml: key 'cost.prices.ocs.port' must be float, >= 0, got 'cheap'"),
    ({"ocs.port": -1}, "f.toml: key 'cost.prices.ocs.port' is -1.0; must be >= 0"),
    ([1, 2], "f.toml: key 'cost.prices' must be table of float, keys one of ocs.port, "),
])
def test_table_errors_name_the_file_and_the_dotted_key(prices, message):
    with pytest.raises(ScenarioError) as error:
        validate("f.toml", {"cost": {"prices": prices}}, TABLE_SCHEMA)
    assert str(error.value).startswith(message)


def test_set_one_entry_of_a_table_wins_over_the_file():
    data = {"cost": {"prices": {"ocs": {"port": 500}, "eps.chassis": 1}}}
    merged = apply_overrides("f.toml", data, ["cost.prices.ocs.port=800"], TABLE_SCHEMA)
    assert validate("f.toml", merged, TABLE_SCHEMA)["cost"]["prices"] == \
        {"ocs.port": 800.0, "eps.chassis": 1.0}
    assert data == {"cost": {"prices": {"ocs": {"port": 500}, "eps.chassis": 1}}}


def test_set_a_whole_table_and_a_string_with_commas():
    merged = apply_overrides("f.toml", {}, ["cost.prices={ocs.port = 700}",
                                            "cost.spec=zcube,n=4"], TABLE_SCHEMA)
    config = validate("f.toml", merged, TABLE_SCHEMA)
    assert config["cost"] == {"prices": {"ocs.port": 700.0}, "spec": "zcube,n=4"}


def test_a_description_says_what_this_run_does():
    """The fabrics header names the GPU count asked for, not the file's default."""
    default = scenario.load("fabrics")
    assert "every fabric at 16,384 GPUs" in default.description
    asked = scenario.load("fabrics", ["gpus=1024"])
    assert "every fabric at 1,024 GPUs" in asked.description
    assert "{gpus" in asked.config["scenario"]["description"], "the file keeps its template"
    assert "every fabric at 16,384 GPUs" in scenario.describe("fabrics"), \
        "--list fills the template from the file's own settings"


@pytest.mark.parametrize("text,expected", [
    ("plain text", "plain text"),
    ("{hosts} hosts", "8 hosts"),
    ("{unknown} stays", "{unknown} stays"),
    ("a {} brace", "a {} brace"),
    ("{hosts:,.x} bad format", "{hosts:,.x} bad format"),
])
def test_descriptions_fill_only_settings_they_name(text, expected):
    assert scenario.fill_description(text, {"hosts": 8}) == expected
