"""Token layout of replayed rows follows slime (one pad row per sample, pack, CP/SP slices)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from sglang_r3.trainer import TokenLayout, pack_rows

pytestmark = pytest.mark.fast

E = 16




def _slime_slice_with_cp(tokens: torch.Tensor, cp_rank: int, cp_size: int) -> torch.Tensor:
    """slime's slice_with_cp for token ids (pad value 0), written out from slime/backends/megatron_utils/cp_utils.py."""
    if cp_size == 1:
        return tokens
    chunk = (len(tokens) + 2 * cp_size - 1) // (2 * cp_size)
    tokens = F.pad(tokens, (0, 2 * cp_size * chunk - len(tokens)), value=0)
    s1, e1 = chunk * cp_rank, chunk * (cp_rank + 1)
    s2, e2 = chunk * (2 * cp_size - cp_rank - 1), chunk * (2 * cp_size - cp_rank)
    return torch.cat([tokens[s1:e1], tokens[s2:e2]])


def _positions(lengths, layout: TokenLayout):
    """What the trainer's packed microbatch holds at each row: (sample, position) or None for padding."""
    per = []
    for i, T in enumerate(lengths):
        ids = torch.arange(T) + 1000 * (i + 1)  # token ids encoding (sample, position); 0 = pad
        per.append(_slime_slice_with_cp(ids, layout.cp_rank, layout.cp_size))
    packed = torch.cat(per)
    pad_size = layout.tp_size * layout.data_pad_size_multiplier
    packed = F.pad(packed, (0, (pad_size - len(packed) % pad_size) % pad_size), value=0)
    if layout.sequence_parallel:
        n = len(packed) // layout.tp_size
        packed = packed[n * layout.tp_rank : n * (layout.tp_rank + 1)]
    return [None if int(v) == 0 else (int(v) // 1000 - 1, int(v) % 1000) for v in packed]


def _encoded_rows(lengths):
    """experts[t] of sample i = [i, t % E, ...] so every row says where it came from (t < E here)."""
    out = []
    for i, T in enumerate(lengths):
        r = np.zeros((T - 1, 1, 2), dtype=np.int64)
        r[:, 0, 0] = i
        r[:, 0, 1] = np.arange(T - 1)
        out.append(r)
    return out


@pytest.mark.parametrize(
    "layout",
    [
        TokenLayout(),
        TokenLayout(tp_size=2, tp_rank=1, data_pad_size_multiplier=4),
        TokenLayout(tp_size=2, tp_rank=0, sequence_parallel=True),
        TokenLayout(tp_size=2, tp_rank=1, sequence_parallel=True, data_pad_size_multiplier=2),
        TokenLayout(cp_size=2, cp_rank=0),
        TokenLayout(cp_size=2, cp_rank=1),
        TokenLayout(cp_size=3, cp_rank=2, tp_size=2, tp_rank=1, sequence_parallel=True),
    ],
)
def test_rows_line_up_with_slimes_token_layout(layout):
    lengths = [7, 12, 3, 9]
    packed = pack_rows(_encoded_rows(lengths), num_experts=E, layout=layout)
    positions = _positions(lengths, layout)
    assert packed.num_rows == len(positions)
    for row, (pos, real) in enumerate(zip(positions, packed.real)):
        if pos is None or pos[1] == lengths[pos[0]] - 1:
            assert not real, row  # trainer padding or a sample's last token: pad row
            continue
        assert real, row
        sample, t = pos
        assert packed.experts[row, 0, 0] == sample and packed.experts[row, 0, 1] == t, (row, pos)


def test_one_pad_row_per_sample_and_pad_rows_are_valid_distinct_experts():
    lengths = [5, 6]
    packed = pack_rows([np.zeros((T - 1, 3, 4), np.uint8) for T in lengths], num_experts=E)
    assert packed.num_rows == sum(lengths)
    assert packed.real.tolist() == [True] * 4 + [False] + [True] * 5 + [False]
    pads = packed.experts[~packed.real]
    assert pads.max() < E
    assert all(len(set(row.tolist())) == 4 for row in pads.reshape(-1, 4))


def test_allgather_cp_packs_then_splits_evenly():
    lengths = [5, 6, 4]
    a = pack_rows(_encoded_rows(lengths), E, TokenLayout(cp_size=2, cp_rank=0, allgather_cp=True))
    b = pack_rows(_encoded_rows(lengths), E, TokenLayout(cp_size=2, cp_rank=1, allgather_cp=True))
    whole = pack_rows(_encoded_rows(lengths), E, TokenLayout(data_pad_size_multiplier=2))
    assert np.array_equal(np.concatenate([a.experts, b.experts]), whole.experts)
    assert a.num_rows == b.num_rows == 8


def test_from_megatron_reads_parallel_state(megatron_cpu):
    tl = TokenLayout.from_megatron(data_pad_size_multiplier=8)
    assert (tl.tp_size, tl.cp_size, tl.tp_rank, tl.cp_rank, tl.data_pad_size_multiplier) == (1, 1, 0, 0, 8)


@pytest.mark.parametrize("dtype,topk", [(np.uint8, 8), (np.uint8, 4), (np.uint8, 6), (np.uint16, 8), (np.uint16, 2)])
def test_layer_major_equals_numpys_own_transpose(dtype, topk):
    # Word-wise (top-8/4 uint8, top-2 uint16) and void-item (top-6 uint8, top-8 uint16) paths alike.
    from sglang_r3.trainer.packing import PackedRows, layer_major

    ids = np.random.default_rng(topk).integers(0, 200, (37, 5, topk)).astype(dtype)
    got = layer_major(ids)
    assert got.flags.c_contiguous and got.dtype == ids.dtype
    assert np.array_equal(got, ids.transpose(1, 0, 2))
    tensors = PackedRows(ids, np.ones(37, dtype=bool)).layer_tensors()
    assert all(t.dtype == torch.int64 and t.is_contiguous() for t in tensors)
    assert all(np.array_equal(t.numpy(), ids[:, c, :]) for c, t in enumerate(tensors))
