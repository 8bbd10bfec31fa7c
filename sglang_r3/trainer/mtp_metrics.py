"""Per-head MTP losses from Megatron's MTPLossLoggingHelper, for any number of heads.

slime logged ``tracker["values"] * scale).item()``, which only works for one
head and crashed MiMo-7B (3 heads). Here every head gets ``mtp_{k}_loss`` and
``mtp_loss`` is their total (for one head: the old single key, same value).
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

import torch

# megatron-core 0.16 keeps the per-head sums in "values"; 0.19 renamed it "loss_values".
_VALUE_KEYS = ("loss_values", "values")


def _tracker() -> Mapping[str, Any]:
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    return MTPLossLoggingHelper.tracker


def mtp_loss_values(tracker: Optional[Mapping[str, Any]] = None) -> Optional[torch.Tensor]:
    tracker = _tracker() if tracker is None else tracker
    for key in _VALUE_KEYS:
        if key in tracker and tracker[key] is not None:
            return tracker[key]
    return None


def mtp_loss_metrics(
    loss_scale: float = 1.0,
    tracker: Optional[Mapping[str, Any]] = None,
    reduce: bool = True,
    clean: bool = True,
    prefix: str = "",
) -> Dict[str, float]:
    """{prefix}mtp_1_loss ... mtp_K_loss and {prefix}mtp_loss (sum); {} when no MTP loss was tracked.

    loss_scale: usually 1 / num_microbatches. reduce: all-reduce over the
    tracker's reduce/avg groups as Megatron's own logging does. clean: zero
    the tracker afterwards so the next step starts from 0.
    """
    tracker = _tracker() if tracker is None else tracker
    values = mtp_loss_values(tracker)
    if values is None:
        return {}
    if reduce:
        values = _reduced(values, tracker)
    per_head = (values.detach().float().reshape(-1) * loss_scale).cpu().tolist()
    out = {f"{prefix}mtp_{k + 1}_loss": float(v) for k, v in enumerate(per_head)}
    out[f"{prefix}mtp_loss"] = float(sum(per_head))
    if clean:
        values_in_tracker = mtp_loss_values(tracker)
        if values_in_tracker is not None:
            values_in_tracker.zero_()
    return out


def _reduced(values: torch.Tensor, tracker: Mapping[str, Any]) -> torch.Tensor:
    values = values.detach().clone()
    groups = (("reduce_group", None), ("avg_group", "AVG"))
    for key, op in groups:
        group = tracker.get(key)
        if group is None or not torch.distributed.is_initialized():
            continue
        if torch.distributed.get_world_size(group) == 1:
            continue
        if op == "AVG":
            torch.distributed.all_reduce(values, group=group, op=torch.distributed.ReduceOp.AVG)
        else:
            torch.distributed.all_reduce(values, group=group)
    return values
