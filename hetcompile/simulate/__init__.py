"""The plan simulator: replay arrivals through a plan's replicas and router weights (`hetcompile simulate`)."""

from hetcompile.simulate.doc import SIMULATION_FORMAT, SimulationDoc
from hetcompile.simulate.run import SimulationError, poisson_arrivals, simulate, staged_arrivals, steady_arrivals, trace_arrivals

__all__ = ["SIMULATION_FORMAT", "SimulationDoc", "SimulationError", "poisson_arrivals", "simulate", "staged_arrivals", "steady_arrivals", "trace_arrivals"]
