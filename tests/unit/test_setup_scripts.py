"""The shell scripts a user runs first must at least parse."""

import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["bootstrap.sh", "vagrant/provision.sh", ".ci/run",
                                    "vm/run-test", "vm/build-rootfs", "vm/copy-project",
                                    "vm/guest-init"])
def test_shell_script_syntax(script):
    done = subprocess.run(["bash", "-n", str(REPO / script)], capture_output=True, text=True)
    assert done.returncode == 0, f"{script}: {done.stderr}"


def test_provision_uses_the_same_bootstrap_as_make_run():
    provision = (REPO / "vagrant" / "provision.sh").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert "make test" in provision and "bootstrap.sh" not in provision.replace("#", "")
    assert "./bootstrap.sh" in makefile and "run: setup" in makefile and "test: setup" in makefile


def test_the_vm_runs_the_same_bootstrap_and_is_not_part_of_make_test():
    build = (REPO / "vm" / "build-rootfs").read_text()
    guest = (REPO / "vm" / "guest-init").read_text()
    makefile = (REPO / "Makefile").read_text()
    assert "./bootstrap.sh" in build and "./bootstrap.sh" in guest
    assert "vm-test:" in makefile
    test_target = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "vm" not in test_target, test_target
