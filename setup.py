"""Packaging for the LLM-fabric emulation testbed."""

from setuptools import find_packages, setup

setup(
    name="llm-fabric-emu",
    version="0.1.0",
    description=("Mininet + Open vSwitch + os-ken testbed for the network fabrics "
                 "of disaggregated LLM RL and prefill/decode inference"),
    packages=find_packages(include=["emu*", "controllers*", "topologies*", "traffic*"]),
    package_data={"emu": ["scenarios/*.toml"], "topologies": ["prices.toml"],
                  "traffic": ["model/calibration.toml", "decode.toml"]},
    python_requires=">=3.10",
    install_requires=[
        "os-ken>=4.2",
        "ovs>=2.17",
        "mininet>=2.3.0.dev6",
        "iperf3>=0.1.11",
        "scapy>=2.5",
        "networkx>=3.0",
        "numpy>=1.24",
        "scipy>=1.10",
        "numba>=0.60",
        "matplotlib>=3.7",
        "psutil>=5.9",
        "pyroute2>=0.9",
        "markdown-it-py>=3.0",
    ],
    entry_points={"console_scripts": ["fabric-emu=emu.run:main"]},
)
