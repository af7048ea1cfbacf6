"""inferledger.costmodel: the workload model (docs/MODEL.md).

From a model's shape (`probes/model_shape.py`) and one engine step's composition: FLOPs (linear and attention apart), bytes per
memory level, KV bytes per token (`work.py`); device roofs, each with where its number came from
(`roofs.py`); the lower bound per serial stage, summed over stages (`bounds.py`); and the step-time
fit trained on some shapes and reported on held-out ones (`fit.py`). It imports nothing of ours but
the contract, and no torch: the ledger uses it on any run directory.
"""
from .bounds import StageBound, StepBound, stage_bounds
from .roofs import Roof, Roofs, spec_roofs
from .work import StageWork, StepRow, StepWork, gemm_work, step_work

__all__ = ["StepRow", "StageWork", "StepWork", "step_work", "gemm_work", "Roof", "Roofs",
           "spec_roofs", "StageBound", "StepBound", "stage_bounds"]
