"""Compile the patch panel's BPF program: ``python -m controllers.bpf.build``.

The object is a build product of the machine it runs on (clang's BPF target,
the kernel headers of its libc), so it is never committed: `bootstrap.sh`
compiles it into the virtual environment (`object_path`) when the source is
newer, and the runtime loads it from there.  The unit tests compile their own
copy into a temporary folder (``build(output=...)``).

clang writes to a temporary file that replaces the object only once it is
complete, so a loader never reads half an object, and a failed build leaves
the previous one in place.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import List, Optional

SOURCE = Path(__file__).resolve().with_name("panel.bpf.c")


class BuildError(RuntimeError):
    """The program could not be compiled: a tool is missing, or clang said why."""


def object_path() -> Path:
    """Where bootstrap.sh puts the object and the runtime loads it from."""
    return Path(sys.prefix) / "share" / "fabric-emu" / "bpf" / "panel.bpf.o"


def _multiarch_include() -> List[str]:
    # <linux/bpf.h> includes <asm/types.h>, which Debian keeps under the
    # multiarch folder; clang's BPF target does not look there by itself.
    triplet = sysconfig.get_config_var("MULTIARCH") or f"{platform.machine()}-linux-gnu"
    folder = Path("/usr/include") / triplet
    return [f"-I{folder}"] if folder.is_dir() else []


def command(output: Path, clang: str = "clang") -> List[str]:
    """The clang command line (-g: libbpf needs the BTF it writes to find the maps' types)."""
    return [clang, "-O2", "-g", "-target", "bpf", *_multiarch_include(),
            "-c", str(SOURCE), "-o", str(output)]


def build(output: Optional[os.PathLike] = None) -> Path:
    """Compile `SOURCE` to ``output`` (default `object_path`); the path written."""
    clang = shutil.which("clang")
    if clang is None:
        raise BuildError("clang not found: install clang (bootstrap.sh installs it) "
                         "to build the BPF patch panel")
    output = Path(output) if output is not None else object_path()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    try:
        done = subprocess.run(command(partial, clang), capture_output=True, text=True)
        if done.returncode != 0:
            hint = ""
            if "bpf/bpf_helpers.h" in done.stderr:
                hint = " (libbpf-dev is missing: it has the bpf/*.h headers)"
            elif "asm/types.h" in done.stderr:
                hint = " (the kernel's uapi headers are missing: linux-libc-dev)"
            raise BuildError(f"clang could not compile {SOURCE}{hint}:\n{done.stderr.strip()}")
        os.replace(partial, output)
    finally:
        if partial.exists():
            partial.unlink()
    return output


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m controllers.bpf.build",
                                     description="Compile the BPF patch panel.")
    parser.add_argument("--output", type=Path, default=None,
                        help=f"the object to write (default: {object_path()})")
    args = parser.parse_args(argv)
    try:
        print(build(args.output))
    except BuildError as exc:
        print(f"controllers.bpf.build: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
