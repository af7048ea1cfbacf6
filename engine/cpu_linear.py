"""The CPU step's linears: "kernels" (the C++ kernels of engine/cpu_kernels.py: the gemv kernel for fp32
steps of up to 16 token rows, and the panel kernel for bf16 over panel copies of the weights where the
CPU has the AVX-512 BF16 dot product; "gemv" is its old name, still accepted by EngineConfig),
"onednn" (bf16 over weights prepacked for oneDNN, on CPUs that multiply bf16 natively) or "torch"
(F.linear). The kind is decided once per model (`EngineConfig.resolve_linear`, `LlamaModel.fuse`).

fp32 "kernels", the gemv kernel: at decode sizes an fp32 linear is a matrix-vector product that streams the weights once; the
BLAS's sgemv read them at 8-10 GiB/s on one core of the Zen 3 where the kernel reads 10-14
(benchmarks/linear_kernel.py), a fifth of a batch-1 step. It is a torch operator with a shape
function, so the compiled step calls it as it is.

bf16 "kernels", the panel kernel: `panel(w)` keeps w repacked in panels of 16 output rows beside it, and the step passes
that copy in w's place (engine/model.py); each 64-byte load then feeds one vdpbf16ps for 16 outputs,
so a decode step's weights stream sequentially and no horizontal sums are left
(engine/csrc/linear.cpp `panel_linear`, any number of rows).

"onednn": `F.linear` in bf16 takes a generic path at decode sizes (a few rows): measured 1.7-2x slower per
step than oneDNN's linear over a weight reordered once into its blocked layout
(docs/BENCHMARKS.md "Decode step account"). `pack(weight)` keeps that reordered copy beside the
weight (keyed by the weight's storage, dropped when the weight is freed) and `linear(x, w, b)` uses
it when there is one. The call goes through the custom op `inferledger::packed_linear`, which the
compiler treats as an opaque kernel taking the ordinary weight (its reordered copy is looked up at
run time), so the same code runs eager and compiled. Prepacking fp32 measured no faster; bf16 where
it is emulated keeps `F.linear`.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

_PACKED: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # weight data_ptr -> (weight, reordered copy)
_PANELS: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # weight data_ptr -> (weight, panel copy)


def _kept(store: dict, w: torch.Tensor, can: bool, make) -> torch.Tensor | None:
    """w's copy in `store`, made once by make(w) where `can` (keyed by w's storage, dropped when w is
    freed); None where w has none and cannot have one."""
    ptr = w.data_ptr()
    hit = store.get(ptr)
    if hit is not None and hit[0]() is w:
        return hit[1]
    if not can:
        return None
    with torch.inference_mode():
        copy = make(w.detach())
    store[ptr] = (weakref.ref(w), copy)
    weakref.finalize(w, store.pop, ptr, None)
    return copy


def packable(w: torch.Tensor) -> bool:
    from .cpu_host import native_bf16

    return w.device.type == "cpu" and w.dtype == torch.bfloat16 and w.dim() == 2 and native_bf16()[0]


def pack(w: torch.Tensor) -> bool:
    """Reorder w [out, in] for oneDNN once (idempotent): -> whether linear(x, w) now uses it."""
    return _kept(_PACKED, w, packable(w), lambda d: torch.ops.mkldnn._reorder_linear_weight(d, 1)) is not None


def is_packed(w: torch.Tensor) -> bool:
    hit = _PACKED.get(w.data_ptr())
    return hit is not None and hit[0]() is not None


def _through_packed(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    hit = _PACKED.get(w.data_ptr())
    if hit is None or hit[0]() is None:  # not packed (or freed): the plain op, same result shape
        return F.linear(x, w, b)
    return torch.ops.mkldnn._linear_pointwise(x, hit[1], b, "none", [], "")


# Defined through torch.library directly rather than `torch.library.custom_op`, whose per-call checks
# (output aliasing, in Python) cost about 5 % of a compiled step's 151 custom-op calls.
_LIB = torch.library.Library("inferledger", "DEF")
_LIB.define("packed_linear(Tensor x, Tensor w, Tensor? b) -> Tensor")
_LIB.impl("packed_linear", _through_packed, "CPU")


@torch.library.register_fake("inferledger::packed_linear")
def _(x, w, b):
    return x.new_empty((*x.shape[:-1], w.shape[0]))


packed_linear = torch.ops.inferledger.packed_linear


def panelable(w: torch.Tensor) -> bool:
    """Whether panel_linear can take w: a contiguous bf16 [N, K] CPU matrix, N % 16 == 0, K even, on a
    CPU that multiplies bf16 natively and whose kernels were built with the AVX-512 BF16 dot product."""
    from .cpu_host import native_bf16
    from .cpu_kernels import panel_kernel

    return (w.device.type == "cpu" and w.dtype == torch.bfloat16 and w.dim() == 2 and w.shape[0] % 16 == 0
            and w.shape[1] % 2 == 0 and native_bf16()[0] and panel_kernel())


def panel(w: torch.Tensor) -> torch.Tensor | None:
    """w [N, K] repacked once as [N / 16, K / 2, 16, 2] (engine/csrc/linear.cpp `panel_linear`), kept
    beside w; None where the kernel cannot take w."""
    def repack(d: torch.Tensor) -> torch.Tensor:
        n, k = d.shape
        return d.view(n // 16, 16, k // 2, 2).permute(0, 2, 1, 3).contiguous()

    return _kept(_PANELS, w, panelable(w), repack)


def as_taken(kind: str, *mats: torch.Tensor) -> tuple[str, tuple[torch.Tensor, ...]]:
    """(the kind that runs, the matrices as it takes them): bf16 "kernels" takes their panel copies (made
    once); "torch" and the matrices themselves where "onednn" has no reordered copy of one of them (none
    was made, or a load replaced the weights) or "kernels" cannot take bf16 matrices here."""
    if kind == "onednn" and not all(is_packed(w) for w in mats):
        return "torch", mats
    if kind == "kernels" and mats[0].dtype == torch.bfloat16:
        panels = tuple(panel(w) for w in mats)
        return ("torch", mats) if any(p is None for p in panels) else ("kernels", panels)
    return kind, mats


KINDS = ("torch", "onednn", "kernels")


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, kind: str) -> torch.Tensor:
    """F.linear the `kind` way (decided once per model, not per call). "onednn", eager, calls the
    oneDNN op directly: the custom op's Python dispatch cost 8 us a call, about 1 ms of a decode step's
    121 linears; the compiler sees the custom op."""
    if kind == "kernels":  # w: fp32 [N, K], or bf16 in panels [N / 16, K / 2, 16, 2] (panel())
        if w.dim() == 4:
            return torch.ops.inferledger_cpu.panel_linear(x, w, b)
        return torch.ops.inferledger_cpu.small_linear(x, w, b)
    if kind != "onednn":
        return F.linear(x, w, b)
    return packed_linear(x, w, b) if torch.compiler.is_compiling() else _through_packed(x, w, b)
