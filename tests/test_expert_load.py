"""Expert load from records (sglang_r3.core.load), record files, ``python -m sglang_r3.tools.report``, and the
per-layer load-imbalance gauges on ``/metrics``.

Oracles: a plain ``collections.Counter`` over the decoded rows (and the textbook formulas over it);
the real server (``nospec_server``, started with ``--enable-metrics``) for records and /metrics.
"""

from __future__ import annotations

import collections
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from sglang_r3.core.layout import layout_from_hf_config
from sglang_r3.core.load import LoadCounter, LoadError, expert_load
from sglang_r3.core.record import RoutingRecord, token_digest
from sglang_r3.core.record.file import load_records, save_records
from tests.support.blocked_imports import SERVER_ONLY, ok, run
from tests.support.routing_http import TIMEOUT, fetch_layout, generate, ids

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]


def _layout(experts: int, topk: int, layers: int = 4):
    return layout_from_hf_config({
        "architectures": ["Glm4MoeForCausalLM"], "num_hidden_layers": layers, "n_routed_experts": experts,
        "num_experts_per_tok": topk, "first_k_dense_replace": 1, "num_nextn_predict_layers": 0, "hidden_size": 16,
    })


def _synthetic(layout, lengths, seed=0, skew=0.0):
    """Records with distinct ids per row; ``skew`` > 0 favours low expert ids (an unbalanced load)."""
    rng = np.random.default_rng(seed)
    E, k, L = layout.num_experts, layout.topk, len(layout.moe_layer_ids)
    w = np.exp(-skew * np.arange(E))
    w /= w.sum()
    out = []
    for n in lengths:
        rows = np.stack([rng.choice(E, k, replace=False, p=w) for _ in range(n * L)]).reshape(n, L, k)
        out.append(RoutingRecord(layout=layout.fingerprint, start=0, layers=layout.moe_layer_ids,
                                 experts=rows.astype(layout.expert_dtype), tokens_digest=token_digest(list(range(n + 1)))))
    return out


def _plain_counts(records):
    """(layer id, expert) -> slots, counted one id at a time."""
    c = collections.Counter()
    for r in records:
        for row in r.experts.tolist():
            for lid, ids_ in zip(r.layers, row):
                for e in ids_:
                    c[(lid, e)] += 1
    return c


@pytest.mark.parametrize("experts,topk", [(16, 4), (160, 8), (384, 8)])  # uint8 and uint16 ids
def test_histogram_equals_a_plain_count_of_the_rows(experts, topk):
    layout = _layout(experts, topk)
    records = _synthetic(layout, [1, 17, 40, 3], seed=experts, skew=0.05)
    load = expert_load(records, experts)
    plain = _plain_counts(records)
    for i, lid in enumerate(layout.moe_layer_ids):
        assert load.counts[i].tolist() == [plain[(lid, e)] for e in range(experts)]
    assert load.rows == 61 and load.counts.sum() == 61 * len(layout.moe_layer_ids) * topk


def test_layer_statistics_follow_their_definitions():
    layout = _layout(16, 4)
    records = _synthetic(layout, [30, 50], seed=3, skew=0.2)
    load = expert_load(records, 16)
    plain = _plain_counts(records)
    for l in load.per_layer():
        c = [plain[(l.layer, e)] for e in range(16)]
        mean = sum(c) / 16
        assert l.max_over_mean == pytest.approx(max(c) / mean)
        assert l.cv == pytest.approx(math.sqrt(sum((x - mean) ** 2 for x in c) / 16) / mean)
        h = -sum(x / sum(c) * math.log2(x / sum(c)) for x in c if x)
        assert l.entropy_bits == pytest.approx(h) and l.entropy_norm == pytest.approx(h / 4)
        assert l.idle_experts == c.count(0)
    assert load.metrics()["load/max_over_mean/layer_1"] == load.layer(1).max_over_mean
    uniform = LoadCounter((1,), 4)
    uniform.add(np.array([[[0, 1]], [[2, 3]]]))
    u = uniform.result().layer(1)
    assert (u.max_over_mean, u.cv, u.entropy_norm) == (1.0, 0.0, 1.0)


def test_counter_refuses_rows_it_cannot_count():
    c = LoadCounter((1, 2), 8)
    with pytest.raises(LoadError, match="outside 0..7"):
        c.add(np.full((2, 2, 2), 8, np.uint8))
    with pytest.raises(LoadError, match=r"not \[tokens, 2 layers, topk\]"):
        c.add(np.zeros((2, 3, 2), np.uint8))
    with pytest.raises(LoadError, match="cover layers"):
        c.add(np.zeros((2, 2, 2), np.uint8), layers=(1, 3))
    assert c.rows == 0 and c.counts.sum() == 0


def test_record_file_round_trips_and_reads_generate_bodies(tmp_path):
    layout = _layout(160, 8)
    records = _synthetic(layout, [5, 9, 2], seed=1)
    assert save_records(tmp_path / "b.r3", records, layout) == 3
    got_layout, got = load_records(tmp_path / "b.r3")
    assert got_layout == layout
    assert [r.experts.tolist() for r in got] == [r.experts.tolist() for r in records]
    assert [r.tokens_digest for r in got] == [r.tokens_digest for r in records]
    body = [{"text": "x", "meta_info": {"routing": r.to_wire()}} for r in records]  # what /generate returns
    (tmp_path / "b.json").write_text(json.dumps(body))
    assert [r.experts.tolist() for r in load_records(tmp_path / "b.json")[1]] == [r.experts.tolist() for r in records]


def _report(*args):
    return subprocess.run([sys.executable, "-m", "sglang_r3.tools.report", *map(str, args)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def test_report_prints_the_table_and_writes_a_heatmap(tmp_path):
    layout = _layout(16, 4)
    records = _synthetic(layout, [12, 30, 7], seed=5, skew=0.1)
    save_records(tmp_path / "b.r3", records, layout)
    proc = _report(tmp_path / "b.r3", "--png", tmp_path / "load.png")
    assert proc.returncode == 0, proc.stderr
    png = (tmp_path / "load.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000
    load = expert_load(records, 16)
    for l in load.per_layer():  # one line per MoE layer: id, slots, max/mean
        assert re.search(rf"^\s*{l.layer}\s+{l.slots}\s+{l.max_over_mean:.3f}\s", proc.stdout, re.M), proc.stdout
    assert "49 token rows, 3 MoE layers, 16 experts" in proc.stdout


def test_report_png_without_matplotlib_names_the_extra_before_reading_anything(tmp_path):
    # The base install (numpy only) prints the table; --png needs matplotlib, which the report extra brings.
    import tomllib

    layout = _layout(16, 4)
    save_records(tmp_path / "b.r3", _synthetic(layout, [5, 6], seed=2), layout)
    code = f"""
import sys
from sglang_r3.tools.report import main
sys.exit(main([{str(tmp_path / 'b.r3')!r}, "--png", {str(tmp_path / 'load.png')!r}]))
"""
    proc = run(code, ("matplotlib",))
    assert proc.returncode == 2, proc.stderr
    assert 'error: --png draws with matplotlib, which is not installed' in proc.stderr
    assert 'pip install "sglang-r3[report]"' in proc.stderr
    assert not (tmp_path / "load.png").exists() and proc.stdout == ""  # refused before any record was read
    table = run(code.replace(', "--png", ' + repr(str(tmp_path / "load.png")), ""), ("matplotlib",))
    assert ok(table).count("token rows") == 1  # without --png, the table alone
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [r.split(">")[0] for r in extras["report"]] == ["matplotlib"]


def test_report_refuses_a_file_that_is_not_records(tmp_path):
    (tmp_path / "x.r3").write_bytes(b"\x93\x01\x02\x03")
    proc = _report(tmp_path / "x.r3")
    assert proc.returncode == 2 and "not a sglang_r3.records file" in proc.stderr


def test_load_and_record_files_need_neither_torch_nor_sglang(tmp_path):
    out = ok(run("""
import numpy as np
from sglang_r3.core.load import LoadCounter
from sglang_r3.core.record.file import save_records, load_records
import sglang_r3.tools.report
c = LoadCounter((1, 2), 8)
c.add(np.array([[[0, 1], [2, 3]]], np.uint8))
assert c.result().counts.sum() == 4
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & (BLOCKED | {"torch"}))))
""", SERVER_ONLY + ("torch", "megatron", "matplotlib")))
    assert json.loads(out.splitlines()[-1]) == []


# -- against the real server ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(nospec_server):
    prompts = [ids(f"expert load probe {i}") for i in range(6)]
    out = generate(nospec_server, input_ids=prompts, return_routing=True,
                   sampling_params={"max_new_tokens": 8, "temperature": 1.0})
    return [RoutingRecord.from_wire(o["meta_info"]["routing"]) for o in out]


def test_histogram_of_served_records_equals_a_plain_count(served, nospec_server):
    layout = fetch_layout(nospec_server)
    load = expert_load(served, layout.num_experts)
    plain = _plain_counts(served)
    assert load.layers == layout.moe_layer_ids
    assert {(lid, e): int(load.counts[i, e]) for i, lid in enumerate(load.layers) for e in range(layout.num_experts)
            if load.counts[i, e]} == dict(plain)


def test_report_reads_records_from_a_running_server(nospec_server, tmp_path):
    proc = _report("--server", nospec_server, "--prompts", 4, "--new-tokens", 6,
                   "--png", tmp_path / "live.png", "--save", tmp_path / "live.r3")
    assert proc.returncode == 0, proc.stderr
    layout, records = load_records(tmp_path / "live.r3")
    assert layout == fetch_layout(nospec_server) and len(records) == 4
    assert f"{sum(r.num_tokens for r in records)} token rows, 3 MoE layers, 16 experts" in proc.stdout
    assert (tmp_path / "live.png").stat().st_size > 1000


def test_metrics_carry_one_load_imbalance_series_per_moe_layer(served, nospec_server):
    text = httpx.get(nospec_server + "/metrics", timeout=TIMEOUT).text
    series = re.findall(r'^sglang_r3:expert_load_imbalance\{(.*)\} ([0-9.e+]+)$', text, re.M)
    layout = fetch_layout(nospec_server)
    assert sorted(labels for labels, _ in series) == sorted(f'layer="{l}"' for l in layout.moe_layer_ids)
    for _, value in series:  # max over mean: at least 1, at most every slot on one expert
        assert 1.0 <= float(value) <= layout.num_experts
