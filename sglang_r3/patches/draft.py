"""Draft (MTP) capture wiring. Filled in with MTP capture; for now: run draft forwards under the draft guard."""

from __future__ import annotations


def attach_draft_runner(cap, runner, routers) -> None:
    original_forward = runner.forward

    def forward(*args, **kwargs):
        cap.enter_draft_forward()
        try:
            return original_forward(*args, **kwargs)
        finally:
            cap.exit_draft_forward()

    runner.forward = forward
