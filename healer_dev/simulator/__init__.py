"""Fleet simulator: dcgm-exporter and node_exporter (InfiniBand) scrapes for N GPU nodes, with faults.

Build a :class:`Fleet` from a :class:`FleetConfig` and a :class:`Scenario` (YAML, see
:mod:`healer_dev.simulator.scenario`), then serve it with :class:`SimulatorServer` and a clock::

    fleet = Fleet(FleetConfig(nodes=64, seed=1), load_scenario("demo"))
    with SimulatorServer(fleet, clock=ElapsedClock(), port=9400) as server:
        server.write_file_sd("targets.json")

The dcgm-exporter side comes in the 3.x or 4.x output shape (``FleetConfig.exporter_version``:
field 112's name, label order, Xid series absent until the first Xid on 4.x), with GPU sharing (a
series per pod) and MIG (a series per GPU instance) as scenario faults. The InfiniBand side is served
by the simulator itself or, closer to reality, written as a sysfs tree per node that the real
node_exporter reads (:mod:`healer_dev.simulator.sysfs`).

The CLI is ``healer simulate`` (:mod:`healer.cli.simulate`).
"""

from healer_dev.simulator.fleet import Fleet, FleetConfig, LabelStyle, Scrape
from healer_dev.simulator.scenario import FAULT_KINDS, Scenario, ScenarioError, load_scenario, parse_scenario
from healer_dev.simulator.server import ElapsedClock, ManualClock, SimulatorServer

__all__ = [
    "FAULT_KINDS",
    "ElapsedClock",
    "Fleet",
    "FleetConfig",
    "LabelStyle",
    "ManualClock",
    "Scenario",
    "ScenarioError",
    "Scrape",
    "SimulatorServer",
    "load_scenario",
    "parse_scenario",
]
