"""The layer rule, checked on every import the code makes (module level or not).

    topologies  <-  controllers  <-  traffic  <-  emu

Each package imports only the packages to its left.  Besides:

* `traffic` uses the controllers' cores (intents, routes, circuits, pins, the
  proxy), never the runtime that applies them (service, control channel,
  OpenFlow applier, launcher);
* os-ken (or Ryu) is imported only by the OpenFlow applier
  (`controllers.openflow`) and the launcher;
* Mininet is imported only by the one Topo adapter (`topologies.mininet_topo`)
  and by `emu`;
* inside `emu`, the live package (`emu.live`: whatever forks, waits on a host
  or talks to a switch) imports no other part of `emu`, and the reports
  (`emu.report`) are written from a results folder alone: they import neither
  `emu.live` nor the experiments nor the runner.

`traffic` must import where Mininet is not installed at all: a subprocess
imports every module of it with ``sys.modules["mininet"] = None``.
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Dict, Iterator, List, Tuple

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("topologies", "controllers", "traffic", "emu")
CONTROLLER_CORES = ("controllers.intents", "controllers.eps_core", "controllers.ocs_core",
                    "controllers.pins", "controllers.reconfig", "controllers.proxy_core",
                    "controllers.rfabric_templates")
OSKEN = ("os_ken", "ryu")
OSKEN_ALLOWED = ("controllers.openflow", "controllers.launcher")
MININET_ALLOWED = ("topologies.mininet_topo", "emu")
REPORT_MAY_NOT = ("emu.live", "emu.experiments", "emu.run")


def within(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def modules(root: Path = ROOT) -> Dict[str, Path]:
    """Dotted module name -> file, for every module of the four packages."""
    found = {}
    for package in LAYERS:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, imported module) for every import statement of a file."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module
            for alias in node.names:            # `from emu import live` imports emu.live
                yield node.lineno, f"{node.module}.{alias.name}"


def violation(importer: str, imported: str) -> str:
    """Why ``importer`` may not import ``imported``; empty when it may."""
    top = importer.split(".")[0]
    target = imported.split(".")[0]
    if target in LAYERS and target != top and LAYERS.index(target) > LAYERS.index(top):
        return f"{top} is below {target} in the layers {' <- '.join(LAYERS)}"
    if top == "traffic" and target == "controllers" and not within(imported, CONTROLLER_CORES):
        if imported != "controllers":
            return "traffic may use the controllers' cores only, never their appliers"
    if target in OSKEN and not within(importer, OSKEN_ALLOWED):
        return "os-ken is imported only by controllers.openflow and controllers.launcher"
    if target == "mininet" and not within(importer, MININET_ALLOWED):
        return "Mininet is imported only by topologies.mininet_topo and emu"
    if within(importer, ("emu.live",)) and target == "emu" and imported != "emu" \
            and not within(imported, ("emu.live",)):
        return "emu.live imports no other part of emu"
    if within(importer, ("emu.report",)) and within(imported, REPORT_MAY_NOT):
        return "emu.report writes from a results folder alone"
    return ""


def violations(root: Path = ROOT) -> List[str]:
    found = []
    for name, path in modules(root).items():
        reported = set()                      # one report per import statement
        for line, imported in imports(path):
            why = violation(name, imported)
            if why and line not in reported:
                reported.add(line)
                found.append(f"{path.relative_to(root)}:{line}: {name} imports {imported}: "
                             f"{why}")
    return found


def test_the_project_keeps_its_layers():
    found = violations()
    assert not found, "imports against the layer rule:\n" + "\n".join(found)


@pytest.mark.parametrize("module,source,reason", [
    ("traffic/bad.py", "from emu.live import state", "traffic is below emu"),
    ("topologies/bad.py", "import controllers.eps_core", "topologies is below controllers"),
    ("controllers/bad.py", "def f():\n    from traffic import flows", "controllers is below traffic"),
    ("traffic/bad.py", "from controllers.service import FabricService",
     "the controllers' cores only"),
    ("controllers/bad.py", "from os_ken.ofproto import ofproto_v1_3",
     "os-ken is imported only by"),
    ("traffic/measure/bad.py", "import mininet.net", "Mininet is imported only by"),
    ("topologies/bad.py", "from mininet.topo import Topo", "Mininet is imported only by"),
    ("emu/live/bad.py", "from emu import experiments", "emu.live imports no other part"),
    ("emu/report/bad.py", "from emu.live.testbed import Testbed", "results folder alone"),
])
def test_the_checker_reports_each_kind_of_violation(tmp_path, module, source, reason):
    for package in LAYERS:
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    path = tmp_path / module
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source) + "\n")
    found = violations(tmp_path)
    assert len(found) == 1 and reason in found[0], found


@pytest.mark.parametrize("importer,imported", [
    ("traffic.flows", "topologies.fabric"),
    ("traffic.measure.linkload", "controllers.eps_core"),
    ("controllers.openflow.app", "os_ken.controller"),
    ("controllers.launcher", "os_ken"),
    ("emu.live.testbed", "mininet.net"),
    ("emu.live.testbed", "emu.live.state"),
    ("emu.experiments.allreduce", "emu.live.replay"),
    ("emu.report.plots", "traffic.scale"),
    ("topologies.mininet_topo", "mininet.topo"),
])
def test_the_checker_allows_what_the_rule_allows(importer, imported):
    assert violation(importer, imported) == ""


def test_traffic_imports_where_mininet_is_not_installed():
    names = sorted(name for name in modules() if within(name, ("traffic",)))
    assert "traffic.measure.linkload" in names and "traffic.scale" in names, names
    script = ("import sys\nsys.modules['mininet'] = None\n"
              "import importlib\n"
              f"for name in {names!r}:\n    importlib.import_module(name)\n"
              "print('imported', len(sys.modules))\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, f"a traffic module needs Mininet:\n{result.stderr}"


def test_every_traffic_package_is_found_by_pkgutil_too():
    """The file walk above and Python's own package walk agree on traffic's modules."""
    import traffic
    walked = {info.name for info in pkgutil.walk_packages(traffic.__path__, "traffic.")}
    listed = {name for name in modules() if within(name, ("traffic",)) and name != "traffic"}
    assert walked == listed
