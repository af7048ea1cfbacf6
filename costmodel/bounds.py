"""Lower bounds: max(F/P, Q/B) per serial stage, summed over the stages (docs/MODEL.md "Bounds").

Stages that run one after another cannot hide each other's time, so the step's bound is the sum of
the stage bounds. The max over the step's totals (`aggregated_ms`) is kept beside it only to show
how much looser it is: it lets a compute-bound stage overlap a memory-bound one.
"""
from __future__ import annotations

from dataclasses import dataclass

from .roofs import Roofs
from .work import StageWork, StepWork


@dataclass(frozen=True)
class StageBound:
    name: str
    compute_ms: float
    memory_ms: float

    @property
    def bound_ms(self) -> float:
        return max(self.compute_ms, self.memory_ms)

    @property
    def binding(self) -> str:
        """The roof that sets this stage's bound: compute or memory (memory on a tie)."""
        return "compute" if self.compute_ms > self.memory_ms else "memory"


@dataclass(frozen=True)
class StepBound:
    stages: tuple[StageBound, ...]
    aggregated_ms: float  # max(total F / P, total Q / B): looser, shown for comparison only

    @property
    def bound_ms(self) -> float:
        return sum(s.bound_ms for s in self.stages)

    def stage(self, name: str) -> StageBound:
        return next(s for s in self.stages if s.name == name)

    @property
    def binding(self) -> str:
        """The roof behind most of the bound: compute or memory."""
        compute = sum(s.bound_ms for s in self.stages if s.binding == "compute")
        return "compute" if compute > self.bound_ms - compute else "memory"


def stage_bounds(work: StepWork | list[StageWork] | tuple[StageWork, ...], roofs: Roofs) -> StepBound:
    """Each stage's bound on `roofs` (peak roofs give a lower bound) and their sum."""
    stages = work.stages if isinstance(work, StepWork) else tuple(work)
    p, b = roofs.compute.per_s, roofs.memory.per_s
    bounds = tuple(StageBound(s.name, s.flops / p * 1e3, s.bytes / b * 1e3) for s in stages)
    flops, nbytes = sum(s.flops for s in stages), sum(s.bytes for s in stages)
    return StepBound(bounds, max(flops / p, nbytes / b) * 1e3)
