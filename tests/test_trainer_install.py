"""The trainer side installs and runs without SGLang.

A Megatron image has its own torch and Python; the base install of sglang-r3 must not drag SGLang or
a torch pin into it, and the client / record / trainer modules must work with SGLang unimportable.
"""

from __future__ import annotations

import email.parser
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from tests.support.blocked_imports import SERVER_ONLY, ok, run

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]

# Small Glm4Moe config: layers 0 dense, 1-2 MoE, one MTP layer; 8 experts, top-2.
LAYOUT_AND_RECORD = """
import msgpack, numpy as np
from sglang_r3.core.layout import layout_from_hf_config
from sglang_r3.core.record import RoutingRecord, token_digest
layout = layout_from_hf_config({
    "architectures": ["Glm4MoeForCausalLM"], "num_hidden_layers": 3, "n_routed_experts": 8,
    "num_experts_per_tok": 2, "first_k_dense_replace": 1, "num_nextn_predict_layers": 1,
    "hidden_size": 16,
})
tokens = [5, 9, 2, 7, 11]
rng = np.random.default_rng(0)
experts = np.stack([rng.permutation(8)[:2] for _ in range(4 * 2)]).reshape(4, 2, 2).astype(np.uint8)
record = RoutingRecord(layout=layout.fingerprint, start=0, layers=layout.moe_layer_ids, experts=experts,
                       weight_version="v1", tokens_digest=token_digest(tokens))
json_form = RoutingRecord.from_wire(json.loads(json.dumps(record.to_wire(binary=False))))
binary_form = RoutingRecord.from_wire(msgpack.unpackb(msgpack.packb(record.to_wire(binary=True))))
for back in (json_form, binary_form):
    assert np.array_equal(back.experts, experts) and back.tokens_digest == record.tokens_digest
"""


def test_the_blocker_makes_sglang_unimportable():
    # Without this, the tests below could pass only because SGLang was quietly imported after all.
    proc = run("import sglang", SERVER_ONLY)
    assert proc.returncode != 0 and "blocked by the test" in proc.stderr


def test_client_and_records_work_without_sglang_or_torch():
    out = ok(run(LAYOUT_AND_RECORD + """
import sglang_r3.trainer.client
from sglang_r3.trainer.client import RoutingClient, decode_routing
meta = {"routing": record.to_wire(binary=True)}
assert np.array_equal(decode_routing(meta).experts, experts)
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & (BLOCKED | {"torch"}))))
""", SERVER_ONLY + ("torch", "megatron")))
    assert json.loads(out.splitlines()[-1]) == []


def test_trainer_checks_and_joins_records_without_sglang():
    out = ok(run(LAYOUT_AND_RECORD + """
import sglang_r3.trainer.client, sglang_r3.trainer
from sglang_r3.trainer import check_records
from sglang_r3.trainer.join import RecordPart, join_records
assert check_records([binary_form], [tokens], layout, weight_version="v1") == [5]
first = RoutingRecord(layout=layout.fingerprint, start=0, layers=layout.moe_layer_ids,
                      experts=experts[:2], weight_version="v1", tokens_digest=token_digest(tokens[:3]))
rest = RoutingRecord(layout=layout.fingerprint, start=2, layers=layout.moe_layer_ids,
                     experts=experts[2:], weight_version="v1", tokens_digest=token_digest(tokens))
joined = join_records([RecordPart(first, tokens[:3]), RecordPart(rest, tokens)])
assert np.array_equal(joined.record.experts, experts)
check_records([joined.record], [joined.tokens], layout, weight_version="v1")
print(json.dumps(sorted({m.split(".")[0] for m in sys.modules} & BLOCKED)))
""", SERVER_ONLY + ("megatron",)))
    assert json.loads(out.splitlines()[-1]) == []


def _pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)


def _names(reqs) -> set:
    return {Requirement(r).name.lower().replace("_", "-") for r in reqs}


def test_base_install_carries_no_sglang_torch_or_server_packages():
    base = _names(_pyproject()["project"]["dependencies"])
    assert base == {"numpy", "msgpack", "httpx"}


def test_server_extra_admits_every_served_sglang_release_and_the_test_extra_pins_the_newest():
    # A rollout image that has SGLang installed keeps it (and its torch): the server extra states the window
    # the adapter serves; the README's `.[test]` stays deterministic at the newest release.
    from sglang_r3.seam.versions import SERVED

    extras = _pyproject()["project"]["optional-dependencies"]
    server = {Requirement(r).name: Requirement(r).specifier for r in extras["server"]}
    assert all(server["sglang"].contains(v) for v in SERVED)
    assert not server["sglang"].contains("0.5.15") and not server["sglang"].contains("0.5.24")
    assert all(server["torch"].contains(v) for v in ("2.11.0", "2.14.1"))
    test = {Requirement(r).name: str(Requirement(r).specifier) for r in extras["test"]}
    assert (test["sglang"], test["torch"]) == (f"=={SERVED[-1]}", "==2.14.1")
    assert {"fastapi", "pydantic", "safetensors", "tokenizers", "aiohttp"} <= set(server)


def test_trainer_extra_asks_megatron_core_without_pinning_torch():
    trainer = [Requirement(r) for r in _pyproject()["project"]["optional-dependencies"]["trainer"]]
    assert [(r.name, str(r.specifier)) for r in trainer] == [("megatron-core", ">=0.16.1")]


def test_test_extra_is_server_plus_trainer_plus_pytest():
    project = _pyproject()["project"]
    test = [Requirement(r) for r in project["optional-dependencies"]["test"]]
    self_ref = [r for r in test if r.name == project["name"]]
    assert len(self_ref) == 1 and self_ref[0].extras == {"server", "trainer"}
    assert {"pytest", "pytest-asyncio", "pytest-timeout"} <= {r.name for r in test}


def test_python_310_to_312_may_install_the_trainer_side():
    spec = SpecifierSet(_pyproject()["project"]["requires-python"])
    assert all(v in spec for v in ("3.10", "3.11", "3.12"))


def test_sglang_plugin_entry_point_is_kept():
    eps = _pyproject()["project"]["entry-points"]["sglang.srt.plugins"]
    assert eps == {"sglang_r3": "sglang_r3.serving.plugin:plugin"}


def test_built_metadata_requires_sglang_only_under_the_server_extra(tmp_path):
    # setuptools, not our reading of the TOML, decides what pip will see.
    pytest.importorskip("setuptools.build_meta")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, tmp_path / name)
    tool = _pyproject()["tool"]["setuptools"]
    for pkg in tool["packages"]:
        top, *rest = pkg.split(".")
        folder = tmp_path / tool["package-dir"].get(top, top) / Path(*rest)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "__init__.py").write_text("")
    out = tmp_path / "meta"
    out.mkdir()
    proc = subprocess.run(
        [sys.executable, "-c", f"from setuptools import build_meta; print(build_meta.prepare_metadata_for_build_wheel({str(out)!r}))"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    meta = email.parser.Parser().parsestr((out / proc.stdout.split()[-1] / "METADATA").read_text())
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    unconditional = {r.name for r in reqs if r.marker is None}
    under_server = {r.name for r in reqs if r.marker is not None and r.marker.evaluate({"extra": "server"})}
    assert unconditional == {"numpy", "msgpack", "httpx"}
    assert {"sglang", "torch"} <= under_server
    # Apache-2.0, as SGLang and slime: the SPDX expression and the text itself go into the wheel.
    assert meta["License-Expression"] == "Apache-2.0" and meta.get_all("License-File") == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().startswith(" " * 33 + "Apache License\n" + " " * 27 + "Version 2.0, January 2004")
