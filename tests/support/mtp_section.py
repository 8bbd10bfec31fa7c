"""Checks of a record's MTP section (the draft routing SGLang's speculative decoding adds), for every server."""

from __future__ import annotations

import numpy as np


def check_mtp_marks(seq, mtp, start_main_rows):
    """Every accepted draft entry routed a token that is in the sequence; rejections are monotone per round."""
    assert mtp.tokens is not None and mtp.rounds is not None
    for i in range(mtp.num_entries):
        p, tok, step, ok = int(mtp.positions[i]), int(mtp.tokens[i]), int(mtp.step[i]), bool(mtp.accepted[i])
        # An MTP forward at position p consumes the hidden state of token p and the embedding of token p+1.
        if ok:
            assert p + 1 < len(seq) and seq[p + 1] == tok, (i, p, tok, step)
    for r in np.unique(mtp.rounds[mtp.step > 0]):
        sel = (mtp.rounds == r) & (mtp.step > 0)
        order = np.argsort(mtp.step[sel], kind="stable")
        acc = mtp.accepted[sel][order]
        # once a draft is rejected, every later draft of the round is rejected
        assert not np.any(acc[1:] & ~acc[:-1]), acc
