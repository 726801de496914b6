#!/usr/bin/env bash
# Idempotent set-up for the testbed: Debian/Ubuntu packages, a pinned virtual
# environment in .venv, and the Open vSwitch daemons.  `make run`, `make test`,
# .ci/run and vagrant/provision.sh all call this one script.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# VENV lets a VM keep its own environment outside a folder synced from the host.
venv="${VENV:-.venv}"
case "$venv" in /*) ;; *) venv="$here/$venv" ;; esac
stamp_dir="$venv/.stamps"

if [ "$(id -u)" -ne 0 ]; then
    echo "bootstrap.sh: run as root (sudo make run / sudo make test)" >&2
    exit 1
fi

apt_packages=(openvswitch-switch mininet iperf3 libiperf0 tcpdump iputils-ping
              ethtool iproute2 procps bridge-utils python3-venv python3-simgrid
              clang llvm libbpf-dev openssh-server sudo)
# openssh-server and sudo are for cluster mode, whose servers are reached by
# ssh (emu.live.localserver runs a second sshd in a namespace to test it).
# clang compiles the BPF patch panel (controllers/bpf); libbpf-dev has its
# headers and pulls in libbpf1, which loads it; llvm (llvm-objdump, llvm-strip)
# is there to look at a program when it misbehaves.  bpftool does that too,
# and lets the tests see that no program outlives a run; Ubuntu 22.04 has no
# package of that name (it ships it in linux-tools), so it is optional.
optional_packages=(bpftool)
# The web view's browser tests need a browser and its driver; `make test`
# asks for them (--with-browser), `make run` does not.
if [ "${1:-}" = "--with-browser" ]; then
    apt_packages+=(chromium chromium-driver)
fi

missing=()
for pkg in "${apt_packages[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
    echo "bootstrap: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # The Debian mininet package would start nothing; we only need its mnexec.
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
for pkg in "${optional_packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            "$pkg" >/dev/null 2>&1 || echo "bootstrap: $pkg is not available here; going on"
    fi
done

python_bin="${PYTHON:-python3}"
req_hash="$(sha256sum "$here/requirements.txt" "$here/setup.py" | sha256sum | cut -c1-16)"
if [ ! -f "$stamp_dir/$req_hash" ]; then
    echo "bootstrap: creating $venv"
    "$python_bin" -m venv "$venv"
    "$venv/bin/pip" install -q --upgrade pip
    "$venv/bin/pip" install -q -r "$here/requirements.txt"
    "$venv/bin/pip" install -q --no-deps -e "$here"
    rm -rf "$stamp_dir"; mkdir -p "$stamp_dir"; touch "$stamp_dir/$req_hash"
fi

# The BPF patch panel's object, compiled into the venv (where
# controllers.bpf.build.object_path looks: sys.prefix/share/...) when missing
# or older than its source.  Without it the netlink data plane runs the
# mirred panel and says so, so a failed compile warns and bootstrap goes on.
bpf_source="$here/controllers/bpf/panel.bpf.c"
bpf_object="$venv/share/fabric-emu/bpf/panel.bpf.o"
if [ ! -f "$bpf_object" ] || [ "$bpf_source" -nt "$bpf_object" ]; then
    echo "bootstrap: compiling the BPF patch panel"
    if ! (cd "$here" && "$venv/bin/python" -m controllers.bpf.build >/dev/null); then
        echo "bootstrap: warning: the BPF patch panel did not compile (clang's message" \
             "above); OCS circuits will use the mirred patch panel, whose dark windows" \
             "the controller's process times" >&2
    fi
fi

# SimGrid (the flow model's oracle in the unit tests) would have to be built
# from source by pip (C++, Boost, minutes); Debian's python3-simgrid ships it
# built, as one extension module in the system dist-packages.  Rather than give .venv every system
# package (--system-site-packages would shadow the pinned ones), a folder of
# the venv holds a symlink to that module alone, and a .pth file puts that
# folder on the venv's path.  Redone every time: cheap, and it follows a
# reinstalled package.
simgrid_site="$venv/simgrid-site"
mkdir -p "$simgrid_site"
find "$simgrid_site" -maxdepth 1 -type l -delete
while IFS= read -r module; do
    ln -sf "$module" "$simgrid_site/"
done < <(dpkg -L python3-simgrid | grep -E '/dist-packages/simgrid[^/]*\.(so|py)$')
venv_site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$simgrid_site" > "$venv_site/simgrid-site.pth"

# Start ovsdb-server and ovs-vswitchd when they are not running (there may be
# no systemd, so use ovs-ctl directly).
if ! ovs-vsctl --timeout=3 show >/dev/null 2>&1; then
    echo "bootstrap: starting Open vSwitch"
    /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random >/dev/null
fi
ovs-vsctl --timeout=5 show >/dev/null
