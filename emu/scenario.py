"""Scenario files: TOML, validated against the schema before anything runs.

A scenario names an *experiment kind* (``[scenario] kind``), a fabric spec
and the scale, plus a section of its kind's own settings.  Built-in
scenarios live in ``emu/scenarios/*.toml``; a user's own file is passed by
path.  Everything is checked here, including the fabric parameters, so a
bad file fails before any namespace, bridge or process exists.
"""

from __future__ import annotations

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (Ubuntu 22.04)
    import tomli as tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Sequence

from emu.experiments import EXPERIMENTS
from emu.fidelity import SOFTIRQ_PCT
from emu.live import dataplane
from emu.schema import Field, Schema, ScenarioError, apply_overrides, validate
from topologies import registry
from topologies.fabric import FabricError

BUILTIN_DIR = Path(__file__).resolve().parent / "scenarios"


def _check_spec(spec: str) -> None:
    name, kwargs = registry.parse_spec(spec)
    registry.check_args(name, kwargs)


def _check_servers(servers) -> None:
    from emu.live.cluster import ClusterError, check_servers
    try:
        check_servers(servers, where="servers")
    except ClusterError as exc:
        raise ValueError(str(exc).removeprefix("servers: ")) from None


def _check_calibration(path: str) -> None:
    if path:
        from traffic.model import calibration

        calibration.load(Path(path))      # ValueError naming the file and the key


COMMON: Schema = {
    "scenario": {
        "kind": Field(str, None, "experiment to run", choices=sorted(EXPERIMENTS)),
        "description": Field(str, "", "one line shown by --list"),
    },
    "fabric": {
        "spec": Field(str, None, "fabric spec string, e.g. 'fattree,k=4'", check=_check_spec),
    },
    "scale": {
        "link_mbps": Field(float, 10.0, "emulated Mbit/s of the fabric's host links",
                           minimum=0.1, maximum=1000.0),
        "tdf": Field(float, 1.0, "time-dilation factor: emulated s per real s",
                     minimum=1e-3, maximum=1e6),
    },
    "testbed": {
        "dataplane": Field(str, dataplane.AUTO, "what forwards the packets: 'ovs' (Open "
                           "vSwitch over OpenFlow), 'linux' (kernel routers and tc patch "
                           "panels), or 'auto' (OVS where its kernel module exists, else "
                           "linux)", choices=list(dataplane.CHOICES)),
        "congestion": Field(str, "cubic", "TCP congestion control of every flow (the "
                            "machine's default would leak in otherwise); dctcp only where "
                            "the kernel has it", choices=list(dataplane.CONGESTION_CONTROLS)),
        "panel": Field(str, "auto", "the OCS patch panel of the linux data plane: 'bpf' "
                       "(a tc BPF program whose map holds each circuit's switch times: "
                       "the kernel times dark windows and schedules), 'mirred' (a tc "
                       "filter per circuit, changed when the controller's process wakes "
                       "up), or 'auto' (bpf where it loads, else mirred, saying why)",
                       choices=["auto", "bpf", "mirred"]),
        "engine": Field(str, "emulate", "'emulate': a testbed with real TCP (root); 'model': "
                      "the flow-level model of the same flows on the same fabric "
                      "(traffic.model: max-min fair rates, no root, any scale)",
                      choices=["emulate", "model"]),
        "model_overheads": Field(bool, True, "engine = 'model': charge the emulator's own "
                                 "overheads (iperf3's set-up per flow, the controller's "
                                 "rounds), calibrated, to compare with an emulation; false "
                                 "for the texts' fabrics at their real rates"),
        "model_calibration": Field(str, "", "engine = 'model': the model's constants from "
                                   "this TOML file (as bench/model --calibrate writes it) "
                                   "instead of the frozen traffic/model/calibration.toml "
                                   "(''), say another machine's", check=_check_calibration),
        "servers": Field(list, [], "cluster mode: the servers the fabric is built across with "
                         "Mininet Cluster Edition, 'localhost' first (it runs the controller), "
                         "then host names or IPv4 addresses reached by ssh; [] for one "
                         "machine", item=str, check=_check_servers),
        "ssh_config": Field(str, "", "cluster mode: an ssh_config file (ssh -F) for reaching "
                            "the servers; '' for the user's own ~/.ssh/config"),
        "ecmp_seed": Field(int, 1, "draws every flow's TCP ports and the kernel routers' "
                           "multipath hash key, so a run's ECMP paths repeat and another "
                           "seed draws others; 0: the kernel's (ephemeral ports, a random "
                           "key per boot)", minimum=0, maximum=2**31 - 1),
    },
    "fidelity": {
        "saturation_pct": Field(float, 90.0, "CPU share that counts as saturated",
                                minimum=1.0, maximum=100.0),
        "softirq_pct": Field(float, SOFTIRQ_PCT, "share of all cores in softirq (the "
                             "kernel forwarding) that counts as saturated", minimum=1.0,
                             maximum=100.0),
        "goodput_floor": Field(float, 0.9, "a lone flow below this share of its rate warns",
                               minimum=0.0, maximum=1.0),
    },
}


@dataclass
class Scenario:
    name: str
    where: str
    config: Dict[str, Dict]

    @property
    def kind(self) -> str:
        return self.config["scenario"]["kind"]

    @property
    def experiment(self):
        return EXPERIMENTS[self.kind]

    @property
    def models(self) -> bool:
        """The flow-level model runs it instead of a testbed (``testbed.engine``)."""
        return self.config.get("testbed", {}).get("engine") == "model"

    @property
    def emulates(self) -> bool:
        """It builds a network on this machine (root, one run at a time)."""
        return self.experiment.needs_emulation and not self.models

    @property
    def section(self) -> Dict:
        return self.config.get(self.experiment.section, {})

    @property
    def description(self) -> str:
        """The one-line description, with the settings it names filled in."""
        return fill_description(self.config["scenario"]["description"], self.section)


def fill_description(text: str, settings: Dict) -> str:
    """A description may name its section's settings in braces (``{gpus:,}``), so
    that it says what this run does, not what the file's defaults would; text
    that names no setting, or one the section lacks, is left as written."""
    try:
        return text.format(**settings)
    except (KeyError, IndexError, ValueError, AttributeError):
        return text


def builtin_names() -> List[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


def resolve_path(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ScenarioError(f"{name_or_path}: no such scenario file")
        return path
    builtin = BUILTIN_DIR / f"{name_or_path}.toml"
    if not builtin.is_file():
        raise ScenarioError(f"unknown scenario {name_or_path!r}; built-in scenarios: "
                            f"{', '.join(builtin_names())} (or give a .toml path)")
    return builtin


def schema_for(kind: str) -> Schema:
    experiment = EXPERIMENTS[kind]
    schema = {section: fields for section, fields in COMMON.items()
              if section == "scenario" or experiment.needs_fabric}
    if experiment.section:
        schema[experiment.section] = experiment.fields
    return schema


def load(name_or_path: str, overrides: Sequence[str] = ()) -> Scenario:
    path = resolve_path(name_or_path)
    where = str(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{where}: not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:   # TOML is UTF-8; this was a traceback
        raise ScenarioError(f"{where}: not UTF-8 text ({exc.reason} at byte {exc.start}); "
                            "TOML files are UTF-8") from None
    except OSError as exc:
        raise ScenarioError(f"{where}: cannot be read: {exc.strerror or exc}") from None
    kind = raw.get("scenario", {}).get("kind") if isinstance(raw.get("scenario"), dict) else None
    # A list or table there is no kind either (it failed unhashable in the lookup).
    if not isinstance(kind, str) or kind not in EXPERIMENTS:
        raise ScenarioError(f"{where}: key 'scenario.kind' is {kind!r}; allowed: "
                            f"{', '.join(sorted(EXPERIMENTS))}")
    schema = schema_for(kind)
    merged = apply_overrides(where, raw, overrides, schema)
    if merged.get("scenario", {}).get("kind") != kind:    # the schema was chosen by the kind
        raise ScenarioError(f"{where}: --set cannot change 'scenario.kind' ({kind!r}); "
                            "use a scenario file of the other kind")
    config = validate(where, merged, schema)
    scenario = Scenario(name=path.stem, where=where, config=config)
    if scenario.models and scenario.experiment.model is None:
        modelled = sorted(k for k, e in EXPERIMENTS.items() if e.model is not None)
        raise ScenarioError(f"{where}: testbed.engine = 'model': kind {kind!r} has no model; "
                            f"kinds with one: {', '.join(modelled)}")
    try:
        scenario.experiment.check(scenario)
    except (ValueError, FabricError) as exc:
        raise ScenarioError(f"{where}: {exc}") from None
    return scenario


def describe(name: str) -> str:
    """A scenario file's description for ``--list``, filled from the file's own
    settings and its kind's defaults (without validating the whole file)."""
    try:
        raw = tomllib.loads(resolve_path(name).read_text())
    except (OSError, tomllib.TOMLDecodeError, ScenarioError):
        return "(unreadable)"
    text = raw.get("scenario", {}).get("description", "")
    experiment = EXPERIMENTS.get(raw.get("scenario", {}).get("kind"))
    if experiment is None or not experiment.section:
        return text
    section = raw.get(experiment.section)
    settings = {key: field.default for key, field in experiment.fields.items()}
    settings.update(section if isinstance(section, dict) else {})
    return fill_description(text, settings)
