"""``python -m sglang_r3.tools.report RECORDS... | --server URL [--png load.png]``: expert load of a batch of routing
records, per layer, and a layers x experts heatmap.

The table needs numpy only (the base install); ``--png`` needs matplotlib: ``pip install "sglang-r3[report]"``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Iterable, List, Optional, Sequence

import numpy as np

from sglang_r3.core.load import ExpertLoad, LoadCounter, LoadError, infer_num_experts
from sglang_r3.core.record import RecordError, RoutingRecord

PROMPTS = (
    "Explain how a mixture-of-experts layer routes a token.",
    "Write a short story about a lighthouse keeper.",
    "List five prime numbers and say why they are prime.",
    "Describe the water cycle to a child.",
    "Translate 'good morning' into three languages.",
    "What is the capital of Australia, and why not Sydney?",
    "Summarize the rules of chess in a paragraph.",
    "Give a recipe for a simple tomato soup.",
)


def _progress(items: Iterable[Any], total: Optional[int] = None, desc: str = "records"):
    try:
        from tqdm import tqdm
    except ImportError:
        return items
    return tqdm(items, total=total, desc=desc, unit="rec", disable=None)  # None: off when not a terminal


def fetch_from_server(url: str, prompts: int, new_tokens: int, batch_size: int = 16):
    """(layout, records) of ``prompts`` generations routed by the server at ``url``."""
    from sglang_r3.trainer.client import RoutingClient

    records: List[RoutingRecord] = []
    with RoutingClient(url) as client:
        layout = client.layout()
        todo = [PROMPTS[i % len(PROMPTS)] + f" ({i})" for i in range(prompts)]
        batches = [todo[i : i + batch_size] for i in range(0, len(todo), batch_size)]
        for batch in _progress(batches, desc="generate"):
            results = client.generate(batch, {"max_new_tokens": new_tokens, "temperature": 1.0})
            records += [r.record for r in results]
    return layout, records


PNG_EXTRA = "report"  # pyproject.toml's extra that brings matplotlib (the base install is numpy only)


class MissingExtraError(RuntimeError):
    """``--png`` without matplotlib: names the extra that installs it."""


def _matplotlib():
    try:
        import matplotlib
    except ImportError as e:
        raise MissingExtraError(
            f"--png draws with matplotlib, which is not installed ({e}); install it with "
            f"pip install \"sglang-r3[{PNG_EXTRA}]\" (or pip install matplotlib), or leave out --png for the table"
        ) from None
    return matplotlib


def heatmap(load: ExpertLoad, path: Path, title: str = "") -> None:
    matplotlib = _matplotlib()

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mean = load.counts.sum(axis=1, keepdims=True) / load.num_experts
    rel = np.divide(load.counts, mean, out=np.zeros(load.counts.shape), where=mean > 0)
    L, E = rel.shape
    fig, ax = plt.subplots(figsize=(min(4 + E * 0.12, 24), min(2 + L * 0.25, 30)), dpi=110)
    im = ax.imshow(rel, aspect="auto", cmap="magma", interpolation="nearest")
    ax.set_xlabel("expert")
    ax.set_ylabel("MoE layer")
    step = max(1, L // 24)
    ax.set_yticks(range(0, L, step), [str(x) for x in load.layers[::step]])
    ax.set_title(title or f"expert load / layer mean ({load.rows} token rows)")
    fig.colorbar(im, ax=ax, label="load / mean (1 = balanced)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def count(records: Sequence[RoutingRecord], num_experts: int) -> ExpertLoad:
    counter = LoadCounter(records[0].layers, num_experts)
    for r in _progress(records, total=len(records)):
        counter.add(r.experts, r.layers)
    return counter.result()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sglang_r3.tools.report", description=__doc__.splitlines()[0])
    ap.add_argument("records", nargs="*", type=Path, help="record files (.r3 msgpack or .json)")
    ap.add_argument("--server", help="fetch records from this running sglang-r3 server instead")
    ap.add_argument("--prompts", type=int, default=32, help="with --server: how many generations")
    ap.add_argument("--new-tokens", type=int, default=32, help="with --server: new tokens per generation")
    ap.add_argument("--experts", type=int, help="experts per layer (default: the layout's, else largest id + 1)")
    ap.add_argument("--png", type=Path, help=f"write a layers x experts heatmap here (needs matplotlib: sglang-r3[{PNG_EXTRA}])")
    ap.add_argument("--save", type=Path, help="write the records read or fetched to this .r3 file")
    args = ap.parse_args(argv)
    if bool(args.server) == bool(args.records):
        ap.error("give record files or --server URL (one of them)")
    if args.png:
        try:
            _matplotlib()  # before records are read or fetched
        except MissingExtraError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2

    from sglang_r3.core.record.file import open_records, save_records

    layout = None
    records: List[RoutingRecord] = []
    try:
        if args.server:
            layout, records = fetch_from_server(args.server, args.prompts, args.new_tokens)
        else:
            for path in args.records:
                file_layout, it = open_records(path)
                if file_layout is not None:
                    if layout is not None and file_layout.fingerprint != layout.fingerprint:
                        raise RecordError(f"{path}: layout {file_layout.fingerprint}, earlier files {layout.fingerprint}")
                    layout = file_layout
                records += list(_progress(it, desc=path.name))
        if not records:
            raise LoadError("no records")
        num_experts = args.experts or (layout.num_experts if layout is not None else infer_num_experts(records))
        load = count(records, num_experts)
    except (RecordError, LoadError, OSError, RuntimeError) as e:  # RuntimeError: RoutingClientError
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.save:
        save_records(args.save, records, layout)
        print(f"wrote {len(records)} records to {args.save}")
    if layout is None and not args.experts:
        print(f"(no layout: {num_experts} experts assumed from the largest id; --experts sets it)")
    print(load.table())
    if args.png:
        heatmap(load, args.png)
        print(f"wrote {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
