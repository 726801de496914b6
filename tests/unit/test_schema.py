"""emu.schema: dict (table) fields and --set overrides."""

import pytest

from emu.schema import Field, ScenarioError, apply_overrides, validate

SCHEMA = {
    "cost": {
        "prices": Field(dict, {}, "price overrides", item=float,
                        choices=["ocs.port", "optics.fiber", "eps.chassis"], minimum=0.0),
        "spec": Field(str, "clos", "a spec string"),
    },
}


def test_a_table_is_flattened_to_dotted_keys_and_coerced():
    config = validate("f.toml", {"cost": {"prices": {"ocs": {"port": 800},
                                                     "optics.fiber": 1.5}}}, SCHEMA)
    assert config["cost"]["prices"] == {"ocs.port": 800.0, "optics.fiber": 1.5}
    assert validate("f.toml", {}, SCHEMA)["cost"]["prices"] == {}


@pytest.mark.parametrize("prices,message", [
    ({"ocs": {"prot": 1}}, "f.toml: unknown key 'cost.prices.ocs.prot'; allowed keys in "
                           "'cost.prices': ocs.port, optics.fiber, eps.chassis"),
    ({"ocs.port": "cheap"}, "f.toml: key 'cost.prices.ocs.port' must be float, >= 0, got 'cheap'"),
    ({"ocs.port": -1}, "f.toml: key 'cost.prices.ocs.port' is -1.0; must be >= 0"),
    ([1, 2], "f.toml: key 'cost.prices' must be table of float, keys one of ocs.port, "),
])
def test_table_errors_name_the_file_and_the_dotted_key(prices, message):
    with pytest.raises(ScenarioError) as error:
        validate("f.toml", {"cost": {"prices": prices}}, SCHEMA)
    assert str(error.value).startswith(message)


def test_set_one_entry_of_a_table_wins_over_the_file():
    data = {"cost": {"prices": {"ocs": {"port": 500}, "eps.chassis": 1}}}
    merged = apply_overrides("f.toml", data, ["cost.prices.ocs.port=800"], SCHEMA)
    assert validate("f.toml", merged, SCHEMA)["cost"]["prices"] == \
        {"ocs.port": 800.0, "eps.chassis": 1.0}
    assert data == {"cost": {"prices": {"ocs": {"port": 500}, "eps.chassis": 1}}}


def test_set_a_whole_table_and_a_string_with_commas():
    merged = apply_overrides("f.toml", {}, ["cost.prices={ocs.port = 700}",
                                            "cost.spec=zcube,n=4"], SCHEMA)
    config = validate("f.toml", merged, SCHEMA)
    assert config["cost"] == {"prices": {"ocs.port": 700.0}, "spec": "zcube,n=4"}
