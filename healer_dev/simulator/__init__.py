"""Fleet simulator: dcgm-exporter and node_exporter (InfiniBand) scrapes for N GPU nodes, with faults.

Build a :class:`Fleet` from a :class:`FleetConfig` and a :class:`Scenario` (YAML, see
:mod:`healer_dev.simulator.scenario`), then serve it with :class:`SimulatorServer` and a clock::

    fleet = Fleet(FleetConfig(nodes=64, seed=1), load_scenario("demo"))
    with SimulatorServer(fleet, clock=ElapsedClock(), port=9400) as server:
        server.write_file_sd("targets.json")

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
