#!/usr/bin/env bash
# Provision the lab VM: the same bootstrap as `make run`, then the tests.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# The kernel datapath and netem live in the kernel's extra modules.
apt-get install -y -qq "linux-modules-extra-$(uname -r)" make python3-venv >/dev/null || true
modprobe openvswitch || true
modprobe sch_netem || true
cd /testbed
# The VM's own virtual environment: /testbed is the host's folder, whose .venv
# (if any) was built for the host's Python.
export VENV=/opt/fabric-emu-venv
make test
