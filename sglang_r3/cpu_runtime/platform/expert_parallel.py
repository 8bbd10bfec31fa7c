"""Expert parallelism (``--ep-size N``, all-to-all backend ``none``) on the CPU runtime, as SGLang's CUDA path computes it.

With ``--ep-size N`` each rank holds ``num_experts / N`` experts. SGLang's ``StandardDispatcher.dispatch``
(``layers/moe/token_dispatcher/standard.py``) maps the router's global expert ids to this rank's local ones and
gives every expert of another rank the id ``-1``; the ranks' partial outputs are then summed across the group.
Two steps of that path have no CPU version in SGLang (0.5.15.post1 and 0.5.23 alike):

* **Experts.** On CUDA the Triton ``fused_moe`` kernel (``kernels/ops/moe/fused_moe_triton_kernels.py``:
  ``off_experts == -1`` → ``write_zeros_to_output``) writes zeros for a ``-1`` slot, so an expert of another
  rank adds nothing to this rank's sum over the top-k. The CPU path, ``fused_moe_native.moe_forward_native``
  (reached from ``UnquantizedFusedMoEMethod.forward_cpu``), scatters the ids into a count table and stops on
  the first ``-1`` (``index -1 is out of bounds``). Here SGLang's own function computes each kept (token,
  slot) pair's expert output (called on the pairs, one slot each), a ``-1`` slot's output is zero, as the
  kernel writes it, and the slots are summed with SGLang's own weighted sum over the top-k. (Mapping ``-1``
  to some local expert with weight 0 is not enough: its count table is built with ``scatter_``, so two
  slots of one token with the same id are counted once.)
* **The sum.** With DP attention and ``ep_size == attn_dp_size`` (0.5.23: and ``== tp_size``) SGLang returns the MoE output with
  ``GroupCoordinator.reduce_scatterv`` (``moe.utils.should_use_dp_reduce_scatterv``) instead of an all-reduce
  and a DP scatter; it runs only on pynccl (``pynccl_comm.change_state`` on ``None`` on the CPU runtime, whose
  groups are gloo: ``cpu_runtime/platform/ranks.py``). Here it is the all-reduce of the whole gathered batch and this rank's
  ``sizes[rank]`` rows at ``sum(sizes[:rank])``: what SGLang 0.5.23's own ``_deterministic_reduce_scatterv``
  does, on the group's all-reduce.

Every rank's routers still see the whole gathered batch (the ids they route are global; the mapping happens
after the capture site), so capture is unchanged: ``tests/test_dp_attention.py`` serves ``--ep-size 2`` with DP
attention and compares rows with a one-rank server's.
"""

from __future__ import annotations

import torch


def experts_with_dropped_slots(original, layer, x, topk_output, moe_runner_config):
    """``moe_forward_native`` with ``-1`` (another rank's expert) slots contributing zero, as the CUDA kernel."""
    ids, weights = topk_output.topk_ids, topk_output.topk_weights
    dropped = ids < 0
    if not bool(dropped.any()):
        return original(layer, x, topk_output, moe_runner_config)
    tokens, k = ids.shape
    kept = (~dropped).reshape(-1).nonzero().squeeze(1)  # flat (token, slot) positions this rank serves
    # Experts that weigh their input (apply_router_weight_on_input, top-1): the pair's weight goes in with the
    # pair, to whichever hook applies it (cpu_runtime/families/llama4.py), and the sum below weighs nothing again.
    on_input = moe_runner_config.apply_router_weight_on_input
    slots = x.new_zeros((tokens * k, x.shape[-1]))  # a -1 slot's output: zero, as the kernel writes it
    if kept.numel():
        pair_weights = weights.reshape(-1, 1)[kept] if on_input else weights.new_ones((kept.numel(), 1))
        pairs = topk_output._replace(topk_ids=ids.reshape(-1, 1)[kept], topk_weights=pair_weights)
        slots[kept] = original(layer, x[kept // k], pairs, moe_runner_config)
    combine = torch.ones_like(weights) if on_input else weights
    # moe_forward_native's own weighted sum over the top-k.
    return slots.view(tokens, k, -1).type(weights.dtype).mul_(combine.unsqueeze(dim=-1)).sum(dim=1).type(slots.dtype)


def reduce_scatterv_without_pynccl(original, self, input_, output=None, sizes=None):
    """``GroupCoordinator.reduce_scatterv`` on a group without pynccl: all-reduce, then this rank's rows."""
    if self.pynccl_comm is not None:
        return original(self, input_, output=output, sizes=sizes)
    rank, world = self.rank_in_group, self.world_size
    if sizes is not None:
        assert len(sizes) == world and input_.shape[0] == sum(sizes), (sizes, input_.shape)
        offset, rows = sum(sizes[:rank]), sizes[rank]
    else:
        assert input_.shape[0] % world == 0, (input_.shape, world)
        rows = input_.shape[0] // world
        offset = rows * rank
    if output is None:
        output = torch.empty((rows,) + tuple(input_.shape[1:]), dtype=input_.dtype, device=input_.device)
    assert output.shape[0] == rows, (output.shape, rows)
    reduced = self.all_reduce(input_.clone())  # the group's all-reduce may work in place
    output.copy_(reduced.narrow(0, offset, rows))
    return output


HOOKS = [("sglang.srt.layers.moe.fused_moe_native.moe_forward_native", experts_with_dropped_slots),
         ("sglang.srt.distributed.parallel_state.GroupCoordinator.reduce_scatterv", reduce_scatterv_without_pynccl)]
