"""Hostile fabric spec strings (``zcube,n=4``): `topologies.registry` parses,
checks and builds them, or refuses them with a FabricError that names the spec,
the fabric or the key; never another exception, and never a fabric built from a
value nobody could mean (a repeated key, a rate of nan)."""

from __future__ import annotations

import inspect
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fuzzing import assert_clear, hostile_text, share
from topologies import fabric as fabric_module
from topologies import registry
from topologies.fabric import Fabric, FabricError

NAMES = registry.names()
PARAMETERS = {name: list(registry.parameters(name)) for name in NAMES}


def check(spec: str) -> dict:
    """What a scenario's check does with a spec: parse it and type its arguments."""
    name, kwargs = registry.parse_spec(spec)
    return registry.check_args(name, kwargs)


# ------------------------------------------------------------ any text at all
@given(hostile_text)
def test_any_text_is_checked_or_refused_naming_the_spec(spec):
    try:
        check(spec)
    except FabricError as exc:
        name = spec.split(",")[0].strip()
        assert_clear(str(exc), repr(spec), repr(name), f"{name}:")


# ------------------------------------------------------------ specs that look right
# Values as a command line gives them: numbers of every sign and size, the
# float words Python accepts, booleans, nothing, and text.
number_text = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "1e400", "NaN", "0", "-0", "0.0", "4.5", "1_0",
                     " 4 ", "true", "false", "", "x", "=", "4=4", "9" * 5000]),
    st.integers(-3, 6).map(str),
    st.integers(-2**64, 2**64).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    hostile_text.filter(lambda text: "," not in text))


@st.composite
def specs(draw):
    """A registered fabric with some of its own keys (mostly), each given a
    value; sometimes one key twice.  (Unknown names: the test above.)"""
    name = draw(st.sampled_from(NAMES))
    keys = draw(st.lists(st.sampled_from(PARAMETERS[name])
                         | st.from_regex(r"[a-z_]{1,8}", fullmatch=True), max_size=4))
    pairs = [f"{key}={draw(number_text)}" for key in keys]
    if pairs and draw(st.booleans()):
        pairs.append(draw(st.sampled_from(pairs)))       # a key repeated
    return ",".join([name] + pairs)


@given(specs())
def test_a_spec_is_typed_or_refused_by_name(spec):
    name, *pairs = spec.split(",")
    keys = [pair.split("=", 1)[0].strip() for pair in pairs]
    try:
        arguments = check(spec)
    except FabricError as exc:
        assert_clear(str(exc), repr(spec), repr(name), f"{name}:")
        return
    assert len(set(keys)) == len(keys), f"{spec!r}: a repeated key was accepted"
    for key, value in arguments.items():
        assert f"{key}=" in spec
        if isinstance(value, float):
            assert value == value and abs(value) != float("inf"), \
                f"{spec!r}: {key}={value!r} accepted"


NUMERIC = {name: [key for key, default in registry.parameters(name).items()
                  if default is None or (isinstance(default, (int, float))
                                         and not isinstance(default, bool))]
           for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
@share(0.25)
@given(data=st.data())
def test_small_counts_build_a_fabric_or_are_refused_by_name(name, data):
    """Every fabric, its counts and rates set to small numbers of either sign
    (a large one builds for minutes before the node cap refuses it:
    `test_a_fabric_too_large_to_build_is_refused_early`)."""
    arguments = data.draw(st.dictionaries(st.sampled_from(NUMERIC[name]), st.integers(-2, 4),
                                          max_size=3), label="arguments")
    spec = ",".join([name] + [f"{key}={value}" for key, value in arguments.items()])
    try:
        fabric = registry.build(spec)
    except FabricError as exc:
        # The fabric's name (a builder may name the part that refused: "clos:"
        # inside fattree-os), or the key.
        assert_clear(str(exc), *[f"{fabric}:" for fabric in NAMES], *arguments)
        return
    assert fabric.hosts, f"{spec!r} built a fabric without hosts"
    for _, _, link in fabric.links():
        assert 0 < link["gbps"] < float("inf"), f"{spec!r}: a link of {link['gbps']} Gbit/s"
    for node, attributes in fabric.graph.nodes(data=True):
        for coordinate in ("pod", "server", "rail"):
            value = attributes.get(coordinate)
            assert not isinstance(value, int) or value >= 0, \
                f"{spec!r}: {node} has {coordinate} {value}"


# ------------------------------------------------------------ the bugs it found
def test_a_repeated_key_is_refused_naming_it():
    with pytest.raises(FabricError, match=re.escape(
            "fabric spec 'fattree,k=4,k=8': key 'k' is given more than once "
            "(k='4' and k='8')")):
        registry.parse_spec("fattree,k=4,k=8")
    with pytest.raises(FabricError, match="key 'n' is given more than once"):
        registry.build("zcube, n=4 ,gbps=100, n =4")      # even with the same value


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "1e400"])
def test_a_rate_that_is_no_finite_number_is_refused(value):
    """nan passed every bound a builder checks; it was built into the links."""
    with pytest.raises(FabricError, match=re.escape(f"fattree: gbps={float(value)!r} is not "
                                                    "a finite number")):
        check(f"fattree,gbps={value}")


@pytest.mark.parametrize("value", ["0", "-1", "-0.5"])
def test_a_link_rate_of_zero_or_less_is_refused_naming_the_link(value):
    with pytest.raises(FabricError, match=r"fattree: link \S+-\S+: gbps=-?0?\.?\d*\.?\d*; "
                                          "a link's rate must be a positive"):
        registry.build(f"fattree,gbps={value}")


@pytest.mark.parametrize("spec, message", [
    ("clos,gpus_per_server=0", "clos: gpus_per_server must be >= 1, got 0"),
    ("fattree-os,gpus_per_server=0", "fattree-os: gpus_per_server must be >= 1, got 0"),
    ("fattree-os-edge,gpus_per_server=-1", "fattree-os: gpus_per_server must be >= 1, got -1"),
    ("rfabric,gpus_per_server=0", "rfabric: gpus_per_server must be >= 1, got 0"),
    ("zcube,gpus_per_server=0", "zcube: gpus_per_server must be >= 1, got 0"),
    ("zcube,gpus_per_server=-2", "zcube: gpus_per_server must be >= 1, got -2"),
    ("hpn,gpus=0", "hpn: need an even radix and whole servers, got gpus=0"),
    ("rail-fabric,downlinks=0", "rail-fabric: downlinks must be >= 1, got 0"),
    ("rail-fabric,fast_lanes=-1", "rail-fabric: fast_lanes must be >= 0, got -1"),
    ("rail-fabric,fast_lanes=8,d_switches=0", "rail-fabric: 8 fast lanes on each of 8 switches"),
])
def test_counts_that_divided_by_zero_or_built_nothing_are_refused(spec, message):
    """Each was a ZeroDivisionError or NetworkXError traceback, negative server
    numbers, or a fabric without hosts, before the fuzzing found it."""
    with pytest.raises(FabricError, match=re.escape(message)):
        registry.build(spec)


def test_a_fabric_without_hosts_is_refused_whatever_the_builder(monkeypatch):
    monkeypatch.setitem(registry.FABRICS, "empty", registry.FabricEntry(lambda: Fabric("empty")))
    with pytest.raises(FabricError, match=re.escape("empty: these parameters (the defaults) "
                                                      "build a fabric without hosts")):
        registry.build("empty")


def test_a_ratio_of_nan_is_refused_not_built():
    with pytest.raises(FabricError, match="oversubscription=nan is not a finite number"):
        registry.build("leafspine,oversubscription=nan")


def test_an_optional_count_that_is_no_number_is_refused_by_name():
    """hosts_per_edge (default None) reached the builder as text: a TypeError."""
    with pytest.raises(FabricError, match=re.escape("fattree: hosts_per_edge='' is not a number")):
        check("fattree,k=4,hosts_per_edge=")
    with pytest.raises(FabricError, match="hosts_per_edge='two' is not a number"):
        registry.build("fattree,hosts_per_edge=two")


def test_a_fabric_too_large_to_build_is_refused_early(monkeypatch):
    """fattree,k=1000 would take hours and all the memory: the cap stops it."""
    monkeypatch.setattr(fabric_module, "MAX_NODES", 50)
    with pytest.raises(FabricError, match=re.escape("fattree: more than 50 nodes; these "
                                                    "parameters (k=8, gbps=400.0")):
        registry.build("fattree,k=8")
    assert len(registry.build("fattree,k=4").graph) == 36      # 16 hosts + 20 switches


def test_the_node_cap_leaves_room_for_the_largest_fabric_built_here():
    largest = 16384 + 16384 // 2     # the model's 16,384 GPUs, with switches to spare
    assert fabric_module.MAX_NODES >= 8 * largest


def test_every_builder_parameter_has_a_default_the_coercion_understands():
    """`_coerce` types a value by its default: a new builder whose parameter has
    a default of another kind (a list, a dict) would pass text through."""
    for name in NAMES:
        for key, parameter in inspect.signature(registry.entry(name).build).parameters.items():
            assert parameter.default is None or isinstance(parameter.default,
                                                           (bool, int, float, str)), \
                f"{name}.{key} = {parameter.default!r}"
