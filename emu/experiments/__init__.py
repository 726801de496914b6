"""Experiment kinds a scenario can name in ``[scenario] kind``."""

from emu.experiments import (allreduce, cost, fabrics, lab, ocs_reconfig, pd_calc, pd_failure,
                             pd_inference, pd_pairing, rfabric)

EXPERIMENTS = {
    "ocs-reconfig": ocs_reconfig,
    "allreduce": allreduce,
    "cost": cost,
    "fabrics": fabrics,
    "pd-calc": pd_calc,
    "lab": lab,
    "rfabric": rfabric,
    "pd-inference": pd_inference,
    "pd-failure": pd_failure,
    "pd-pairing": pd_pairing,
}
