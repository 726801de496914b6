"""The lab CLI on a real fabric: every command, wrong arguments included."""

from __future__ import annotations

import re

import pytest

from tests.integration.utils import assert_no_leftovers, run_cli

pytestmark = pytest.mark.require_root

SCRIPT = """\
# a comment line is skipped
fabric
ocs
route h1 h3
ocs preset o1 custom 20
ocs set o1 1-4
route h1 h3
ocs set o1 1-1
ocs preset o1 mems 5
route h1 h99
replay bogus
replay pairs h1:h3,h2:h4 0.5
replay allreduce h1,h2,h3,h4 0.2
load 0.2
h1 ping -c 2 h3
"""


def test_cli_script_runs_every_command_and_survives_bad_input(tmp_path, dataplane):
    script = tmp_path / "lab.cli"
    script.write_text(SCRIPT)
    done = run_cli("lab", "--set", "fabric.spec=hybrid,tors=2,hosts_per_tor=2", "--cli",
                   "--set", f"dataplane={dataplane}",
                   "--cli-script", str(script), "--out", str(tmp_path / "out"))
    out = done.stdout + done.stderr  # Mininet prints its own commands on stderr
    assert done.returncode == 0, out + done.stderr
    assert "o1: mems, radix 4: 2-3" in out, out
    assert "(o1 2-3)" in out and "(o1 1-4)" in out, f"route should show the circuit used:\n{out}"
    assert "injected 20.00 ms" in out, out
    errors = [line for line in out.splitlines() if line.startswith("*** ")]
    assert len(errors) == 4, "expected 4 refused commands, got:\n" + "\n".join(errors)
    assert any("connects a port to itself" in e for e in errors)
    assert any("only with it" in e for e in errors)
    assert any("unknown host" in e for e in errors)
    assert any("name a pattern" in e for e in errors)
    assert "2/2 flows ok" in out and "24/24 flows ok" in out, out
    assert "2 received" in out, out
    assert "Unknown command" not in out, out
    assert_no_leftovers()


def test_lab_scenario_pings_every_connected_pair(tmp_path, dataplane):
    done = run_cli("lab", "--set", "fabric.spec=hpn", "--set", f"dataplane={dataplane}",
                   "--out", str(tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "networks_count = 2" in done.stdout, done.stdout
    assert "ping_loss_pct = 0" in done.stdout, done.stdout
    assert_no_leftovers()


ROTOR_SCRIPT = """\
ocs rotor 100 10
ocs
h1 ping -c 3 -i 0.2 h3
ocs rotor 100 100
ocs stop
ocs stop
h1 ping -c 2 h3
"""


def test_cli_runs_and_stops_a_rotor_schedule(tmp_path):
    """The rotor fabric's schedule from the lab CLI (linux only: the BPF panel):
    hosts on different ToRs still reach each other while the rotors cycle."""
    script = tmp_path / "rotor.cli"
    script.write_text(ROTOR_SCRIPT)
    done = run_cli("lab", "--set", "fabric.spec=rotor,tors=4,hosts_per_tor=1",
                   "--set", "scale.tdf=100", "--set", "dataplane=linux", "--cli",
                   "--cli-script", str(script), "--out", str(tmp_path / "out"))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "rotors cycling: 3 slots of 10 ms emulated, each dark 1 ms first (duty 0.90)" \
        in out, out
    assert "a schedule runs on o1, o2, o3: 3 slots of 10 ms" in out, out
    errors = [line for line in out.splitlines() if line.startswith("*** ")]
    assert len(errors) == 1 and "guard_us" in errors[0], errors
    assert "schedule stopped" in out and "no schedule runs" in out, out
    cycling, stopped = re.findall(r"(\d+) packets transmitted, (\d+) received", out)
    # While the rotors cycle a tenth of the time is dark: a ping may fall into a
    # guard and be lost (one of three was, once), but the hosts reach each other.
    assert cycling[0] == "3" and int(cycling[1]) >= 1, out
    assert stopped == ("2", "2"), "the circuits hold once the schedule stops"
    assert_no_leftovers()
