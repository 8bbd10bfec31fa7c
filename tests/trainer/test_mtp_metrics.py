"""mtp_loss_metrics: per-head MTP losses for any number of heads (the MiMo-7B 3-head crash)."""

from __future__ import annotations

import pytest
import torch

from replay_helpers import synthetic_batch
from megatron_cpu import forward_loss
from sglang_r3.trainer import ReplayFiller
from sglang_r3.trainer.diagnostics import mtp_loss_metrics

pytestmark = pytest.mark.fast

LENGTHS = [9, 7]


def _tracker():
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    return MTPLossLoggingHelper


def test_seed_000_three_mtp_heads_train_with_replay_and_log_three_losses(gpt_mtp3, mtp3_layout):
    filler = ReplayFiller(gpt_mtp3, mtp3_layout)
    assert [(s.layer_id, s.depth) for s in filler.mtp_sites] == [(4, 1), (5, 2), (6, 3)]
    filler.fill(*synthetic_batch(mtp3_layout, LENGTHS, seed=10))
    g = torch.Generator().manual_seed(0)
    for _ in range(2):  # two microbatches accumulate in Megatron's tracker
        loss = forward_loss(gpt_mtp3, torch.randint(0, 128, (sum(LENGTHS),), generator=g), train=True)
        loss.mean().backward()
    filler.clear()

    helper = _tracker()
    assert helper.tracker["values"].shape == (3,)
    ours = mtp_loss_metrics(loss_scale=0.5, clean=False)
    assert sorted(ours) == ["mtp_1_loss", "mtp_2_loss", "mtp_3_loss", "mtp_loss"]
    assert all(v > 0 for v in ours.values())
    assert ours["mtp_loss"] == pytest.approx(ours["mtp_1_loss"] + ours["mtp_2_loss"] + ours["mtp_3_loss"])

    # Same numbers as Megatron's own logger (which names them "mtp_{k} loss").
    theirs = {}
    helper.track_mtp_metrics(0.5, 0, None, None, theirs)
    for k in (1, 2, 3):
        assert ours[f"mtp_{k}_loss"] == pytest.approx(float(theirs[f"mtp_{k} loss"]))


def test_seed_000_the_old_single_head_assumption_crashes_ours_does_not(gpt_mtp3, mtp3_layout):
    forward_loss(gpt_mtp3, torch.arange(12) % 128, train=True).mean().backward()
    values = _tracker().tracker["values"]
    with pytest.raises(RuntimeError):
        values.item()  # what slime did: "here we assume only one mtp layer"
    metrics = mtp_loss_metrics(prefix="train/")
    assert set(metrics) == {"train/mtp_1_loss", "train/mtp_2_loss", "train/mtp_3_loss", "train/mtp_loss"}
    assert float(_tracker().tracker["values"].abs().sum()) == 0.0  # cleaned for the next step


def test_seed_000_one_head_keeps_the_old_single_key(gpt_mtp1, glm_layout):
    forward_loss(gpt_mtp1, torch.arange(10) % 128, train=True).mean().backward()
    old = float((_tracker().tracker["values"] * 1.0).item())  # slime's single-head value
    metrics = mtp_loss_metrics()
    assert set(metrics) == {"mtp_1_loss", "mtp_loss"}
    assert metrics["mtp_loss"] == pytest.approx(old) == pytest.approx(metrics["mtp_1_loss"])


def test_megatron_019_tracker_key_loss_values():
    tracker = {"loss_values": torch.tensor([1.0, 2.0, 4.0, 8.0]), "reduce_group": None, "avg_group": None}
    m = mtp_loss_metrics(loss_scale=0.25, tracker=tracker)
    assert m == {"mtp_1_loss": 0.25, "mtp_2_loss": 0.5, "mtp_3_loss": 1.0, "mtp_4_loss": 2.0, "mtp_loss": 3.75}
    assert float(tracker["loss_values"].sum()) == 0.0


def test_no_mtp_loss_tracked_gives_no_metrics():
    assert mtp_loss_metrics(tracker={}) == {}
