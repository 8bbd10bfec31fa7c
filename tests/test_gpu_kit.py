"""The GPU kit (benchmarks/gpu): its pinned list against SGLang 0.5.15.post1's requirements, without downloading, and
the GPU script's own code on CPU (unpack, probe, results file, the comparisons on made-up answers).

``benchmarks/gpu/requires.json`` is what the last ``python -m benchmarks.gpu.kit build`` read from the wheels'
METADATA (the build fails when it reads other lines than the committed file); these tests hold the list in
``benchmarks/gpu/contents.py`` to it. Nothing here proves anything about a GPU.
"""

from __future__ import annotations

import base64
import importlib.metadata as md
import io
import json
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import numpy as np
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from benchmarks.gpu import contents as C
from benchmarks.gpu import jit, kit, run
from sglang_r3.core.record import RoutingRecord
from sglang_r3.core.record.records import MtpRouting

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
REQUIRES = json.loads((ROOT / "benchmarks" / "gpu" / "requires.json").read_text())


def _own_version() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def _required_names() -> set:
    names = set()
    for lines in REQUIRES.values():
        for line in lines:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(C.HOST_MARKERS):
                names.add(canonicalize_name(req.name))
    return names


def test_requires_json_is_what_the_build_read_for_this_list():
    """One entry per kit wheel at its pinned version, and sglang-r3's own: the committed requirement lines are
    those of exactly the wheels contents.KIT names (a changed pin without a rebuild fails here)."""
    want = {f"{canonicalize_name(n)}=={v}" for n, v in C.kit_pins().items()} | {f"{C.OWN}=={_own_version()}"}
    assert set(REQUIRES) == want


def test_sglang_requirements_are_0_5_15_post1s():
    lines = REQUIRES[f"sglang=={C.SGLANG}"]
    pins = {canonicalize_name(Requirement(l).name): str(Requirement(l).specifier) for l in lines}
    # the pins the kit is built around (shared/README.md): torch the host's, the kernel wheel trimmed
    assert pins["torch"] == "==2.11.0" and pins["sglang-kernel"] == "==0.4.4" and pins["transformers"] == "==5.12.1"
    assert C.HOST["torch"] == "2.11.0"
    try:
        installed = md.version("sglang")
    except md.PackageNotFoundError:
        installed = None
    if installed == C.SGLANG:  # the release environment (.ci/release-env): the installed metadata, line for line
        assert md.requires("sglang") == lines


def test_every_requirement_of_every_kit_wheel_is_accounted_for():
    """In the kit at a version it allows, on the host, a stand-in at a version it allows, or named as not needed."""
    assert C.unaccounted(REQUIRES) == []


def test_unaccounted_names_what_is_missing_or_out_of_bounds():
    fake = {"x==1": ["nonexistent-package>=1", "transformers==5.19.0", "torch>=2.12", "flashinfer-python==0.6.11",
                     "other; sys_platform == 'win32'", "extra-only; extra == 'test'"]}
    problems = C.unaccounted(fake)
    assert len(problems) == 4, problems
    assert "nonexistent-package" in problems[0] and "kit has 5.12.1" in problems[1]
    assert "host has 2.11.0" in problems[2] and "stand-in has 0.6.12+sglangr3.standin" in problems[3]


def test_no_entry_excuses_nothing_and_no_package_is_in_two_places():
    """Every host entry beyond the named ones, and every not-needed one, is a requirement of some kit wheel."""
    required = _required_names()
    named = {canonicalize_name(n) for n in C.HOST_NAMED}
    stale = sorted(n for n in list(C.HOST) + list(C.NOT_NEEDED)
                   if canonicalize_name(n) not in required and canonicalize_name(n) not in named)
    assert stale == []
    groups = [set(map(canonicalize_name, g)) for g in (C.KIT, C.HOST, C.STAND_INS, C.NOT_NEEDED)]
    for i, a in enumerate(groups):
        for b in groups[i + 1:]:
            assert not a & b, a & b


def test_every_host_entry_is_in_the_hosts_image():
    """What the kit leaves to the host is what the device tool lists in the host's image (an alias names the
    image's distribution holding a metapackage's modules)."""
    image = {canonicalize_name(n) for n in C.HOST_IMAGE}
    assert sorted(n for n in C.HOST if canonicalize_name(C.HOST_ALIASES.get(n, n)) not in image) == []


def test_stand_ins_import_and_raise_naming_themselves_when_called(tmp_path):
    made = kit.write_stand_ins(tmp_path)
    assert made == ["flashinfer-python==0.6.12+sglangr3.standin", "nvidia-cutlass-dsl==4.5.2+sglangr3.standin"]
    code = """
import importlib.metadata as md, json, sys
import flashinfer
from flashinfer.sampling import top_k_top_p_sampling_from_probs
import cutlass.cute as cute
from cutlass.utils import HardwareInfo
from cutlass.cutlass_dsl import dsl_user_op
class K(HardwareInfo): pass
# decorating at import, as SGLang's jit_kernel/cutedsl_fp8_paged_mqa_logits.py does on the CUDA path
@dsl_user_op
def op(x):
    return x
@cute.jit(preprocess=False)
def fn(x):
    return x
class Kernel:
    @cute.kernel
    def run(self, *a):
        return a
out = {"version": md.version("flashinfer-python"), "cutlass": md.version("nvidia-cutlass-dsl"),
       "stand_in": flashinfer.STAND_IN, "flashinfer_version": flashinfer.__version__}
for f in (top_k_top_p_sampling_from_probs, cute.jit, op, fn, Kernel().run):
    try:
        f(1, 2)
    except Exception as e:
        out.setdefault("errors", []).append([type(e).__name__, str(e)])
print(json.dumps(out))
"""
    # -S: no site-packages (a real nvidia-cutlass-dsl there puts itself first on the path with a .pth file)
    proc = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["version"] == "0.6.12+sglangr3.standin" and out["cutlass"] == "4.5.2+sglangr3.standin"
    assert out["stand_in"] is True and out["flashinfer_version"] == "0.6.12"
    (n1, m1), (n2, m2), (n3, m3), (n4, m4), (n5, m5) = out["errors"]
    assert n1 == n2 == n3 == n4 == n5 == "StandInCalled"
    assert m1.startswith("flashinfer.sampling.top_k_top_p_sampling_from_probs was called") and "stand-in" in m1
    assert m2.startswith("cutlass.cute.jit was called") and "nvidia-cutlass-dsl" in m2
    assert m3.startswith("op (decorated by cutlass.cutlass_dsl.dsl_user_op) was called")
    assert m4.startswith("fn (decorated by cutlass.cute.jit(...)) was called")
    assert m5.startswith("Kernel.run (decorated by cutlass.cute.kernel) was called")


def test_kernel_trim_keeps_python_sm90_and_spatial_ops(tmp_path):
    src = tmp_path / "sglang_kernel-0.4.4-cp310-abi3-manylinux2014_x86_64.whl"
    names = ["sgl_kernel/__init__.py", "sgl_kernel/flash_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so",
             "sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so", "sgl_kernel/spatial_ops.abi3.so"]
    with zipfile.ZipFile(src, "w") as z:
        for n in names:
            z.writestr(n, b"x")
        z.writestr("sglang_kernel-0.4.4.dist-info/RECORD", "".join(f"{n},sha256=x,1\n" for n in names))
    (tmp_path / "out").mkdir()
    out = kit.trim_kernel(src, tmp_path / "out")
    with zipfile.ZipFile(out) as z:
        kept = sorted(z.namelist())
        record = z.read("sglang_kernel-0.4.4.dist-info/RECORD").decode()
    assert kept == sorted(["sgl_kernel/__init__.py", "sgl_kernel/sm90/common_ops.abi3.so",
                           "sgl_kernel/spatial_ops.abi3.so", "sglang_kernel-0.4.4.dist-info/RECORD"])
    assert "flash_ops" not in record and "sm100" not in record and "sm90/common_ops" in record


def _fake_kit(path: Path) -> Path:
    """A kit archive of the real layout holding one tiny package."""
    archive = path / C.ARCHIVE
    with tarfile.open(archive, "w:xz") as tar:
        for name, data in ((f"{C.KIT_DIR}/site/kitprobe_pkg/__init__.py", b"VALUE = 7\n"),
                           (f"{C.KIT_DIR}/MANIFEST.json", json.dumps({"packages": {"kitprobe-pkg": "1"}}).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


def test_the_gpu_script_dry_run_unpacks_probes_and_writes_its_results(tmp_path):
    archive = _fake_kit(tmp_path)
    out, target = tmp_path / "out", tmp_path / "target"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu.run", "--dry-run", "--kit", str(archive),
                           "--out", str(out), "--target", str(target)], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads((out / "gpu_dryrun.json").read_text())
    steps = res["steps"]
    assert res["dry_run"] is True and steps["unpack"]["ok"] and steps["probe"]["ok"], steps
    assert steps["unpack"]["packages"] == {"kitprobe-pkg": "1"}
    assert (target / C.KIT_DIR / "site" / "kitprobe_pkg" / "__init__.py").exists()
    assert steps["probe"]["host_packages_checked"] == len(C.HOST) and isinstance(steps["probe"]["missing"], list)
    gpu = [s for s in steps if s not in ("unpack", "probe")]
    assert gpu and all(steps[s]["ok"] is None and "dry run" in steps[s]["skipped"] for s in gpu)
    # the children's path: the repository, then the kit, then the host's own
    env = run.kit_env(target / C.KIT_DIR / "site")
    assert env["PYTHONPATH"].split(":")[:2] == [str(ROOT), str(target / C.KIT_DIR / "site")]
    assert env["SGLANG_IS_FLASHINFER_AVAILABLE"] == "false" and env["TVM_FFI_DISABLE_TORCH_C_DLPACK"] == "1"
    assert env["TVM_FFI_CACHE_DIR"] == str(target / C.KIT_DIR / jit.CACHE_DIR)  # the kit's JIT kernels
    assert steps["unpack"]["jit"] == {"modules": []}  # a kit built without them


@pytest.mark.sglang
@pytest.mark.release  # the kit's SGLang is 0.5.15.post1: .ci/run's second stage builds with its loaders
def test_jit_kernels_built_here_are_what_sglangs_loaders_load_on_the_host_without_nvcc(tmp_path):
    """A kernel ``jit.prebuild`` builds for sm90 is found by SGLang's own ``load_jit`` under the name its serving
    path computes, with no compiler on the path; the same call without the kit's cache tries to build and fails.
    Which kernels a GPU run reaches is read from SGLang's code (``jit.MODULES``); the GPU run reports it."""
    why = jit.unavailable(Path(sys.executable))
    if why:
        pytest.skip(why)
    cache = tmp_path / "cache"
    name = "clamp_position"  # the quickest to build; the kit builds all of jit.MODULES the same way
    built = jit.prebuild(cache, Path(sys.executable), [name])
    assert len(built["modules"]) == 1 and built["modules"][0].endswith("__arch_9.0__tvmffi_" + md.version("apache-tvm-ffi"))
    assert [p.name for p in (cache / built["modules"][0]).iterdir()] == [built["modules"][0].split("__")[0] + ".so"]
    # SGLang's own loaders again, with no nvcc to be found: a module they return is one they loaded from
    # TVM_FFI_CACHE_DIR (its build would fail), and a folder they built in holds build.ninja
    spec = json.dumps({name: jit.MODULES[name][:3]})
    bare = {"PATH": "/usr/bin:/bin", "CUDA_HOME": str(tmp_path / "no-cuda"), "HOME": str(tmp_path)}
    for cache_dir, loads in ((cache, True), (tmp_path / "empty", False)):
        proc = subprocess.run([sys.executable, "-c", jit.CALL_LOADERS, json.dumps(jit.ARCH), spec],
                              env={**bare, "TVM_FFI_CACHE_DIR": str(cache_dir)}, capture_output=True, text=True,
                              timeout=300)
        loaded = proc.returncode == 0 and f'"{name}"' in proc.stdout
        assert loaded is loads, (cache_dir, proc.stdout, proc.stderr[-2000:])
    assert jit.accounting(cache, built["modules"]) == {
        "carried": built["modules"], "built_on_host": [], "carried_not_rebuilt": built["modules"],
        "not_carried_built": [], "carried_failed_to_load": 0}
    tried = jit.folders(tmp_path / "empty")
    assert len(tried) == 1 and jit.accounting(tmp_path / "empty", [])["not_carried_built"] == tried


@pytest.mark.sglang
@pytest.mark.release  # the GPU run's release is 0.5.15.post1: .ci/run's second stage parses with its parser
def test_sglangs_own_parser_takes_every_argv_the_gpu_script_starts_plain_sglang_with():
    """The installed SGLang's own argument parser (what ``sglang.launch_server`` parses with) on the argv of each
    configuration's plain-SGLang server: our launcher's flags (``--disable-speculation``) stay with our launcher,
    and no flag is one release's only (0.5.23 dropped 0.5.15's alias ``--cuda-graph-max-bs``)."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    assert any("--disable-speculation" in extra for extra, _ in run.CONFIGS.values())  # what there is to strip
    for name, (extra, _) in run.CONFIGS.items():
        argv = run.plain_upstream_argv("/models/embedded", extra)
        assert argv[0] == "sglang.launch_server", name
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        _, unknown = parser.parse_known_args(argv[1:])
        assert unknown == [], (name, unknown)
    # the CPU rehearsal's plain server is ours without capture, which takes our launcher's flags
    assert run.plain_upstream_argv("/m", ["--disable-speculation"], run.REHEARSAL)[:2] == [
        "benchmarks.plain_server", "--upstream-capture"]


def test_unpack_refuses_paths_outside_the_kit_folder(tmp_path):
    archive = tmp_path / "bad.tar.xz"
    with tarfile.open(archive, "w:xz") as tar:
        info = tarfile.TarInfo("elsewhere/x.py")
        tar.addfile(info, io.BytesIO(b""))
    with pytest.raises(ValueError, match="outside"):
        run.unpack(archive, tmp_path / "t")


def _answer(rows, output_ids, mtp=None, upstream=None):
    rec = RoutingRecord("fp", 0, (1, 2, 3), np.asarray(rows, np.uint8), mtp=mtp)
    meta = {"routing": rec.to_wire()}
    if upstream is not None:
        meta["routed_experts"] = base64.b64encode(np.asarray(upstream, np.int32).tobytes()).decode()
    return {"output_ids": output_ids, "meta_info": meta}


def test_rows_compared_with_near_ties_counted_apart():
    rng = np.random.default_rng(0)
    prompt = [[1, 2, 3]]
    ref_rows = np.stack([[rng.permutation(16)[:4] for _ in range(3)] for _ in range(5)])  # 3 + 3 tokens - 1 rows
    got_rows = ref_rows.copy()
    got_rows[1, 0, 0] = next(e for e in range(16) if e not in ref_rows[1, 0])  # a near tie
    got_rows[3, 2, 1] = next(e for e in range(16) if e not in ref_rows[3, 2])  # not one
    got_rows[4] = got_rows[4][:, ::-1]  # the same sets in another order: equal
    gaps = [np.full((5, 3), 0.5)]
    gaps[0][1, 0] = 0.001
    res = run.compare_rows([_answer(ref_rows, [4, 5, 6])], [_answer(got_rows, [4, 5, 6])], prompt, gaps)
    assert (res["pairs_compared"], res["pairs_differing"], res["near_tie_pairs"], res["other_pairs"]) == (15, 2, 1, 1)
    assert res["pass"] is False and res["max_gap_differing"] == 0.5 and res["output_ids_equal"] == "1/1"
    # a continuation that departs at its second token: rows compared up to the shared tokens only
    res = run.compare_rows([_answer(ref_rows, [4, 5, 6])], [_answer(ref_rows, [4, 9, 6])], prompt, None)
    assert res["pairs_compared"] == 4 * 3 and res["pass"] is True and res["near_tie_measure"] == "unavailable"


def test_plain_sglang_rows_compared_with_ours_and_the_mtp_section_checked():
    rng = np.random.default_rng(1)
    rows = np.stack([[np.sort(rng.permutation(16)[:4]) for _ in range(3)] for _ in range(4)])
    upstream = np.concatenate([np.zeros((4, 1, 4), np.int32), rows[:, :, ::-1]], axis=1)  # dense layer 0 first
    mtp = MtpRouting(positions=np.array([3, 4, 4], np.int32), depth=np.ones(3, np.uint8),
                     step=np.array([0, 0, 1], np.uint8), accepted=np.array([1, 1, 0], np.uint8),
                     experts=np.zeros((3, 4), np.uint8), tokens=np.array([5, 6, 7], np.int32),
                     rounds=np.array([0, 1, 1], np.int32))
    ours = _answer(rows, [7, 8], mtp=mtp, upstream=upstream)
    res = run.compare_upstream([ours], [_answer(rows, [7, 8], upstream=upstream)])
    assert res["pass"] and res["routed_experts_equal"] == "1/1" and res["record_equal_plain_columns"] == "1/1"
    other = upstream.copy()
    other[2, 1, 0] = 15 if other[2, 1, 0] != 15 else 14
    assert run.compare_upstream([ours], [_answer(rows, [7, 8], upstream=other)])["pass"] is False
    layout = {"layers": [{"id": 4, "role": "mtp", "depth": 1}]}
    assert run.mtp_tagged([ours], layout)["pass"] is True
    assert run.mtp_tagged([_answer(rows, [7, 8])], layout)["pass"] is False


def test_overhead_is_ours_over_plain_tokens_per_second_per_round():
    rounds = {"rounds": 4, "same": {"decode_heavy": {"main": 4}},
              "wall": {"decode_heavy": {"plain": [1.0, 1.0, 2.0, 1.0], "main": [1.0, 1.25, 2.0, 1.0]}},
              "cpu": {"decode_heavy": {"plain": [1.0] * 4, "main": [1.1] * 4}}}
    res = run.overhead_summary(rounds, {"decode_heavy": (16, 24, 64)})
    tps = res["decode_heavy"]["tokens_per_s_ours_over_plain"]
    assert tps["value"] == 1.0 and tps["lo"] <= 0.8 + 1e-9 and tps["n"] == 4
    assert res["decode_heavy"]["cpu_s_ours_over_plain"]["value"] == 1.1


def test_device_names_and_prompts():
    assert run.device_slug("NVIDIA H100 80GB HBM3") == "h100" and run.device_slug("NVIDIA H200") == "h200"
    assert run.device_slug(None) == "dryrun"
    ids = run.prompts()
    assert [len(p) for p in ids] == list(run.PROMPT_CHARS) and all(max(p) < 256 for p in ids)
    assert len({tuple(p[:4]) for p in ids}) == len(ids)  # no shared prefix: no prefix-cache hits between them
