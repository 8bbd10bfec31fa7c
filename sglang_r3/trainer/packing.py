"""Lay per-sample routing rows out as slime lays out the training tokens (slime's
``prepare_routed_experts_for_routing_replay``): one pad row per sample, context-parallel slicing, packing,
TP padding, sequence-parallel slice; pad rows hold slime's valid, distinct ``arange % num_experts`` ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch


@dataclass(frozen=True)
class TokenLayout:
    tp_size: int = 1
    tp_rank: int = 0
    cp_size: int = 1
    cp_rank: int = 0
    sequence_parallel: bool = False
    data_pad_size_multiplier: int = 1  # slime's --data-pad-size-multiplier
    allgather_cp: bool = False  # slime's --allgather-cp: pack first, then split evenly over CP

    @classmethod
    def from_megatron(
        cls,
        sequence_parallel: Optional[bool] = None,
        data_pad_size_multiplier: int = 1,
        allgather_cp: bool = False,
        config: Any = None,
    ) -> "TokenLayout":
        """This rank's layout from megatron's parallel_state (sizes 1 when it is not initialised)."""
        from megatron.core import parallel_state as ps

        if sequence_parallel is None:
            sequence_parallel = bool(getattr(config, "sequence_parallel", False))
        if not ps.model_parallel_is_initialized():
            return cls(sequence_parallel=sequence_parallel, data_pad_size_multiplier=data_pad_size_multiplier)
        return cls(
            tp_size=ps.get_tensor_model_parallel_world_size(),
            tp_rank=ps.get_tensor_model_parallel_rank(),
            cp_size=ps.get_context_parallel_world_size(),
            cp_rank=ps.get_context_parallel_rank(),
            sequence_parallel=sequence_parallel,
            data_pad_size_multiplier=data_pad_size_multiplier,
            allgather_cp=allgather_cp,
        )


@dataclass(frozen=True)
class PackedRows:
    experts: np.ndarray  # [rows on this rank, layers, topk], the records' compact dtype (uint8/uint16)
    real: np.ndarray  # bool [rows]: True where the row is a record row, False for padding

    @property
    def num_rows(self) -> int:
        return int(self.experts.shape[0])

    def layer_tensors(self) -> List[torch.Tensor]:
        """One contiguous int64 [rows, topk] tensor per layer column, as RouterReplay takes them."""
        return list(torch.from_numpy(layer_major(self.experts)).to(torch.int64).unbind(0))


# A (row, layer) group of topk ids moved as one machine word by the layer-major transpose.
_WORDS = {1: np.int8, 2: np.int16, 4: np.int32, 8: np.int64}


def layer_major(experts: np.ndarray) -> np.ndarray:
    """[rows, layers, topk] -> contiguous [layers, rows, topk] (each layer's rows one compact block).

    Each (row, layer) group of topk ids moves as one machine word, through torch's blocked transpose
    copy, which beats numpy's ``ascontiguousarray(w.T)`` and one strided gather per layer
    (benchmarks/README.md, decode + bind).
    """
    rows, layers, topk = experts.shape
    word = _WORDS.get(topk * experts.itemsize)
    flat = np.ascontiguousarray(experts).reshape(rows, layers * topk)
    if word is None:  # a group that is no machine word (e.g. top-6 uint8): numpy moves it as a void item
        words = flat.view(np.dtype((np.void, topk * experts.itemsize)))
        return np.ascontiguousarray(words.T).view(experts.dtype).reshape(layers, rows, topk)
    moved = torch.from_numpy(flat.view(word)).t().contiguous().numpy()
    return moved.view(experts.dtype).reshape(layers, rows, topk)


def _pad_rows(
    x: np.ndarray, pad: int, num_experts: int, pad_layers: Optional[Tuple[Sequence[int], int]] = None
) -> np.ndarray:
    if pad <= 0:
        return x
    _, layers, topk = x.shape
    if pad_layers is None:
        fill = (np.arange(pad * layers * topk, dtype=np.int64) % num_experts).reshape(pad, layers, topk)
    else:
        # slime pads its [rows, num_layers, topk] array with arange over all layers and then takes each
        # layer's column: row r of layer l holds (r * num_layers * topk + l * topk + j) % num_experts.
        layer_ids, num_layers = pad_layers
        r = np.arange(pad, dtype=np.int64)[:, None, None] * (num_layers * topk)
        l = np.asarray(layer_ids, dtype=np.int64)[None, :, None] * topk
        fill = (r + l + np.arange(topk, dtype=np.int64)[None, None, :]) % num_experts
    return np.concatenate([x, fill.astype(x.dtype)], axis=0)


def _pad_mask(m: np.ndarray, pad: int) -> np.ndarray:
    return np.concatenate([m, np.zeros(pad, dtype=bool)]) if pad > 0 else m


def _cp_slice(x: np.ndarray, pad_fn: Callable[[np.ndarray, int], np.ndarray], cp_size: int, cp_rank: int) -> np.ndarray:
    if cp_size == 1:
        return x
    chunk = (len(x) + 2 * cp_size - 1) // (2 * cp_size)
    x = pad_fn(x, 2 * cp_size * chunk - len(x))
    a = x[chunk * cp_rank : chunk * (cp_rank + 1)]
    b = x[chunk * (2 * cp_size - cp_rank - 1) : chunk * (2 * cp_size - cp_rank)]
    return np.concatenate([a, b], axis=0)


def pack_rows(
    per_sample: Sequence[np.ndarray],
    num_experts: int,
    layout: TokenLayout = TokenLayout(),
    pad_layers: Optional[Tuple[Sequence[int], int]] = None,
) -> PackedRows:
    """per_sample[i]: [T_i - 1, layers, topk] -> this rank's rows of the packed microbatch.

    pad_layers: ``(layer id of each column, num_hidden_layers)`` to fill pad rows exactly as slime
    does (its pattern runs over every decoder layer of the upstream array); by default the pattern
    runs over the columns given. Either way pad rows are valid, distinct ids.
    """
    if not per_sample:
        raise ValueError("pack_rows needs at least one sample")
    # Stay in the records' compact dtype until the per-layer int64 tensors are made (layer_tensors).
    dtype = np.result_type(*[np.asarray(r).dtype for r in per_sample])
    rows = [np.ascontiguousarray(r, dtype=dtype) for r in per_sample]
    masks = [np.ones(len(r), dtype=bool) for r in rows]
    pad_x = lambda x, n: _pad_rows(x, n, num_experts, pad_layers)  # noqa: E731

    rows = [pad_x(r, 1) for r in rows]
    masks = [_pad_mask(m, 1) for m in masks]
    pad_size = layout.tp_size * layout.data_pad_size_multiplier

    def pack(xs: List[np.ndarray], ms: List[np.ndarray], multiple: int) -> Tuple[np.ndarray, np.ndarray]:
        x, m = np.concatenate(xs, axis=0), np.concatenate(ms)
        pad = (multiple - len(x) % multiple) % multiple
        return pad_x(x, pad), _pad_mask(m, pad)

    if layout.allgather_cp:
        x, m = pack(rows, masks, layout.cp_size * pad_size)
        x = np.array_split(x, layout.cp_size)[layout.cp_rank]
        m = np.array_split(m, layout.cp_size)[layout.cp_rank]
    else:
        rows = [_cp_slice(r, pad_x, layout.cp_size, layout.cp_rank) for r in rows]
        masks = [_cp_slice(mm, _pad_mask, layout.cp_size, layout.cp_rank) for mm in masks]
        x, m = pack(rows, masks, pad_size)

    if layout.sequence_parallel and layout.tp_size > 1:
        n = len(x)
        if n % layout.tp_size:
            raise ValueError(f"{n} packed rows do not split over tp_size={layout.tp_size}")
        per = n // layout.tp_size
        x = x[per * layout.tp_rank : per * (layout.tp_rank + 1)]
        m = m[per * layout.tp_rank : per * (layout.tp_rank + 1)]
    return PackedRows(experts=np.ascontiguousarray(x), real=m)
