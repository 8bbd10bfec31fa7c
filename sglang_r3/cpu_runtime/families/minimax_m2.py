"""MiniMax-M2's QK norm on the CPU runtime.

SGLang's ``models/minimax_m2.py`` normalises q and k over the whole attention width (all TP shards) in two
Triton kernels, ``rms_sumsq_serial`` (per token: the sum of squares of its q row, then of its k row, into one
float32 vector ``[q sums | k sums]`` padded to a multiple of 4, all-reduced over attention TP) and
``rms_apply_serial`` (``x * rsqrt(sum / width / tp + eps) * w``, float32 inside, the input dtype out). Both
assert CUDA tensors; without AMX, ``MiniMaxM2QKRMSNorm`` takes that path on CPU (SGLang 0.5.15.post1 and
0.5.23 alike). Here each is the same arithmetic in torch for CPU tensors (AROUND hooks; CUDA tensors reach
SGLang's kernels). Checked against transformers' ``MiniMaxM2RMSNorm`` in tests/test_cpu_ops.py.
"""

from __future__ import annotations

import torch

_MODULE = "sglang.srt.models.minimax_m2"


def rms_sumsq(x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    b = x1.shape[0]
    out = torch.zeros((b + x2.shape[0] + 3) // 4 * 4, dtype=torch.float32, device=x1.device)
    out[:b] = x1.float().pow(2).sum(-1)
    out[b:b + x2.shape[0]] = x2.float().pow(2).sum(-1)
    return out


def rms_apply(x1, x2, w1, w2, sum_sq, tp_world: int = 1, eps: float = 1e-5):
    b = x1.shape[0]

    def one(x, w, sums):
        inv = torch.rsqrt(sums / x.shape[-1] / tp_world + eps)[:, None]
        return (x.float() * inv * w.float()).to(x.dtype)

    return one(x1, w1, sum_sq[:b]), one(x2, w2, sum_sq[b:b + x2.shape[0]])


def _sumsq_around(original, x1, x2):
    return original(x1, x2) if x1.is_cuda else rms_sumsq(x1, x2)


def _apply_around(original, x1, x2, w1, w2, sum_sq, tp_world=1, eps=1e-5):
    if x1.is_cuda:
        return original(x1, x2, w1, w2, sum_sq, tp_world, eps)
    return rms_apply(x1, x2, w1, w2, sum_sq, tp_world, eps)


HOOKS = [(f"{_MODULE}.rms_sumsq_serial", _sumsq_around), (f"{_MODULE}.rms_apply_serial", _apply_around)]
