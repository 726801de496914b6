"""Experiment kinds a scenario can name in ``[scenario] kind``: one `Experiment` each."""

from typing import Dict

from emu.experiments import (allreduce, cost, fabrics, failure_scale, lab, ocs_reconfig,
                             orchestrrl, pd_calc, pd_failure, pd_inference, pd_pairing,
                             rfabric, rfabric_scale, rotor)
from emu.experiments.base import Experiment

EXPERIMENTS: Dict[str, Experiment] = {module.EXPERIMENT.kind: module.EXPERIMENT for module in (
    ocs_reconfig, allreduce, cost, fabrics, pd_calc, lab, rfabric, pd_inference, pd_failure,
    pd_pairing, rfabric_scale, failure_scale, rotor, orchestrrl)}
