"""``python -m benchmarks.gpu.kit build OUTDIR``: the one archive to bring to a bare GPU host.

Downloads from the registry (``pip download --only-binary=:all: --no-deps``, CPython 3.12 manylinux x86_64) the
pinned list in ``benchmarks/gpu/contents.py``, trims sglang-kernel 0.4.4 to what an H100 / H200 loads, builds
sglang-r3 itself as a wheel from this working tree (its dist-info carries the ``sglang.srt.plugins`` entry point
SGLang's child processes load the capture through), unpacks them all into one tree with ``pip install --target``
(no dependency resolution: the list is the resolution), adds the named stand-ins for flashinfer and
nvidia-cutlass-dsl and the JIT kernels SGLang's GPU path builds with nvcc, built here for sm90
(``benchmarks/gpu/jit.py``; left out, saying why, without an SGLang 0.5.15.post1 install or nvcc), and packs
``OUTDIR/sglang-r3-gpu-kit.tar.xz``. It prints the archive's size (and fails over ``SIZE_LIMIT_MIB``) and what it
holds.

Every build rewrites ``benchmarks/gpu/requires.json``: the ``Requires-Dist`` lines of every wheel it read, which
``tests/test_gpu_kit.py`` checks the list against without downloading. A build that reads other lines than the
committed file holds fails, naming the wheels, after writing the new file (review it, run the test, commit it).

Build into ``.gpu-kit`` (git-ignored; ``benchmarks.gpu.run`` looks there by default). Downloads stay in
``OUTDIR/downloads`` and are reused. ``python -m benchmarks.gpu.kit list`` prints the list.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from benchmarks.gpu import contents as C
from benchmarks.gpu import jit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
REQUIRES = HERE / "requires.json"


class KitError(RuntimeError):
    pass


def canonical(name: str) -> str:
    import re

    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_version(path: Path) -> Tuple[str, str]:
    """(canonical distribution name, version) from a wheel's file name."""
    parts = path.name[: -len(".whl")].split("-")
    return canonical(parts[0]), parts[1]


def _pip_target_args(python: str = C.PYTHON) -> List[str]:
    args = ["--only-binary=:all:", "--python-version", python, "--implementation", "cp"]
    for p in C.PLATFORMS:
        args += ["--platform", p]
    return args


def download(dest: Path, python: str = C.PYTHON) -> Dict[str, Path]:
    """canonical name -> wheel for every KIT entry, downloading only the ones not already in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    pins = {canonical(n): v for n, v in C.kit_pins().items()}

    def have() -> Dict[str, Path]:
        found = {}
        for w in dest.glob("*.whl"):
            name, version = wheel_name_version(w)
            if pins.get(name) == version:
                found[name] = w
        return found

    missing = sorted(set(pins) - set(have()))
    if missing:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-d", str(dest),
               *_pip_target_args(python), *(f"{n}=={pins[n]}" for n in missing)]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    found = have()
    if set(found) != set(pins):
        raise KitError(f"no wheel downloaded for {sorted(set(pins) - set(found))}")
    return found


def requires_dist(wheel: Path) -> List[str]:
    """The wheel's ``Requires-Dist`` lines, as its METADATA has them."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        msg = email.parser.Parser().parsestr(z.read(meta).decode("utf-8"), headersonly=True)
    return list(msg.get_all("Requires-Dist") or [])


def record_requires(wheels: Dict[str, Path], own: Path) -> bool:
    """Write requires.json ({"name==version": [lines]}); True when it changed from what was there."""
    data = {}
    for name, w in sorted(wheels.items()):
        data[f"{name}=={wheel_name_version(w)[1]}"] = requires_dist(w)
    data[f"{C.OWN}=={wheel_name_version(own)[1]}"] = requires_dist(own)
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    old = REQUIRES.read_text() if REQUIRES.exists() else None
    REQUIRES.write_text(text)
    if old is not None and old != text:
        before = json.loads(old)
        changed = sorted(k for k in set(before) | set(data) if before.get(k) != data.get(k))
        print(f"requires.json changed for {changed}", file=sys.stderr)
    return old is not None and old != text


def trim_kernel(wheel: Path, out_dir: Path, drop: Tuple[str, ...] = C.KERNEL_DROP) -> Path:
    """sglang-kernel without ``drop``'s files (RECORD rewritten to match), as a wheel of the same name."""
    out = out_dir / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        names = src.namelist()
        dropped = [n for n in names if n.startswith(drop)]
        if not any(n.startswith("sgl_kernel/sm90/common_ops") for n in names):
            raise KitError(f"{wheel.name} has no sgl_kernel/sm90/common_ops: the trim rule no longer fits it")
        for n in names:
            if n in dropped:
                continue
            data = src.read(n)
            if n.endswith(".dist-info/RECORD"):
                data = "".join(line + "\n" for line in data.decode().splitlines()
                               if not line.split(",", 1)[0].startswith(drop)).encode()
            dst.writestr(src.getinfo(n), data)
    print(f"sglang-kernel trimmed: dropped {len(dropped)} files ({', '.join(sorted(dropped))})")
    return out


def build_own(out_dir: Path) -> Path:
    """sglang-r3 as a wheel, built from a copy of this working tree's tracked files (the tree is left alone)."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    with tempfile.TemporaryDirectory(prefix="sglang-r3-src-") as tmp:
        for rel in filter(None, files.decode().split("\0")):
            src = ROOT / rel
            if src.is_file():
                (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, Path(tmp) / rel)
        # build isolation: pyproject's own build requirements (setuptools>=77), not whatever this venv holds
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-q",
                        "-w", str(out_dir), tmp], check=True)
    own = [w for w in out_dir.glob("*.whl") if wheel_name_version(w)[0] == C.OWN]
    if len(own) != 1:
        raise KitError(f"building {C.OWN} left {own}")
    with zipfile.ZipFile(own[0]) as z:
        eps = next((z.read(n).decode() for n in z.namelist() if n.endswith(".dist-info/entry_points.txt")), "")
    if "[sglang.srt.plugins]" not in eps:
        raise KitError(f"{own[0].name} carries no sglang.srt.plugins entry point")
    return own[0]


STANDIN_INIT = '''"""Stand-in for {dist} {version} in sglang-r3's GPU kit (benchmarks/gpu): not the real package.

{why}. Importing it and any submodule works, and so does decorating with it; calling anything, or what it
decorated, raises StandInCalled naming what was called.
"""
import functools
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "{version}"
STAND_IN = True


class StandInCalled(RuntimeError):
    pass


class _Thing:
    """Any attribute of a stand-in module: attributes, indexing and subclassing work, calls raise."""

    def __init__(self, path):
        self._path = path

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Thing(self._path + "." + name)

    def __getitem__(self, item):
        return self

    def __mro_entries__(self, bases):
        return (object,)

    def __call__(self, *args, **kwargs):
        # Decorating is not using: modules that are imported but never run (on the CUDA path, glm4_moe ->
        # deepseek_v2 -> dsa_indexer -> jit_kernel.dsa) apply ``@x`` and ``@x(key=...)`` at import. Those hand
        # back what raises when called; any other call raises now.
        if len(args) == 1 and not kwargs and isinstance(args[0], (types.FunctionType, type)):
            return _decorated(self._path, args[0])
        if not args and kwargs:
            return _Thing(self._path + "(...)")
        raise StandInCalled(_called(self._path))

    def __repr__(self):
        return "<stand-in %s>" % self._path


def _called(what):
    return ("%s was called, but {dist} in this environment is a stand-in from sglang-r3's GPU kit "
            "(benchmarks/gpu/contents.py: STAND_INS); {why}" % what)


def _decorated(path, obj):
    what = "%s (decorated by %s)" % (getattr(obj, "__qualname__", obj), path)
    if isinstance(obj, type):
        return _Thing(what)

    @functools.wraps(obj)
    def stand_in(*args, **kwargs):
        raise StandInCalled(_called(what))

    return stand_in


def _module_getattr(prefix):
    def __getattr__(name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Thing(prefix + "." + name)
    return __getattr__


__getattr__ = _module_getattr(__name__)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = types.ModuleType(spec.name, "stand-in from sglang-r3's GPU kit")
        mod.__path__ = []
        mod.__getattr__ = _module_getattr(spec.name)
        mod.STAND_IN = True
        return mod

    def exec_module(self, module):
        pass


sys.meta_path.append(_Finder())
'''


def write_stand_ins(site: Path) -> List[str]:
    """Each stand-in's modules and dist-info (Name, the version it claims + STANDIN_LOCAL) into ``site``."""
    made = []
    for dist, (version, modules, why) in C.STAND_INS.items():
        full = f"{version}+{C.STANDIN_LOCAL}"
        for mod in modules:
            (site / mod).mkdir(parents=True, exist_ok=True)
            (site / mod / "__init__.py").write_text(STANDIN_INIT.format(dist=dist, version=version, why=why))
        info = site / f"{dist.replace('-', '_')}-{full}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {full}\n"
            f"Summary: stand-in from sglang-r3's GPU kit, not the real {dist}: imports, raises when called\n")
        (info / "top_level.txt").write_text("".join(m + "\n" for m in modules))
        (info / "INSTALLER").write_text("sglang-r3 benchmarks.gpu.kit\n")
        (info / "RECORD").write_text("")
        made.append(f"{dist}=={full}")
    return made


def _tree_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build(outdir: Path, allow_requires_change: bool = False, python: str = C.PYTHON,
          kernel_drop: Tuple[str, ...] = C.KERNEL_DROP, xz_preset: int = 9,
          jit_python: Optional[Path] = jit.DEFAULT_PYTHON) -> Dict:
    """The kit for the host's CPython (``C.PYTHON``). ``python`` another, with ``kernel_drop`` keeping what a
    host without a GPU loads and a light ``xz_preset`` (it never travels): a rehearsal kit of the same pins for
    this machine (``benchmarks.gpu.rehearse``), which leaves requires.json alone (the host's wheels wrote it).
    ``jit_python``: the SGLang 0.5.15.post1 install that builds the JIT kernels; None builds none."""
    outdir = outdir.resolve()
    wheels = download(outdir / "downloads", python)
    work = outdir / "wheels"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    own = build_own(work)
    changed = record_requires(wheels, own) if python == C.PYTHON else False
    to_install = [trim_kernel(w, work, kernel_drop) if n == "sglang-kernel" else w for n, w in wheels.items()] + [own]
    stage = outdir / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    site = stage / C.KIT_DIR / "site"
    site.mkdir(parents=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "-q",
                    "--disable-pip-version-check", "--target", str(site), *_pip_target_args(python),
                    *map(str, to_install)], check=True)
    shutil.rmtree(site / "bin", ignore_errors=True)  # console scripts with this machine's interpreter
    for cache in list(site.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)
    stand_ins = write_stand_ins(site)
    why_not = jit.unavailable(jit_python) if jit_python else "not asked"
    if not why_not:
        try:
            jit_built = jit.prebuild(site.parent / jit.CACHE_DIR, jit_python)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:  # the host can still build them: say so, go on
            shutil.rmtree(site.parent / jit.CACHE_DIR, ignore_errors=True)
            why_not = f"their build here failed: {exc}"
    if why_not:
        jit_built = {"modules": [], "not_built": why_not}
    held = {n: wheel_name_version(w)[1] for n, w in wheels.items()}
    held[C.OWN] = wheel_name_version(own)[1]
    manifest = {
        "sglang": C.SGLANG, "python": python, "platforms": list(C.PLATFORMS),
        "packages": dict(sorted(held.items())), "stand_ins": stand_ins,
        "kernel_dropped": list(kernel_drop), "jit": jit_built,
        "unpacked_bytes": _tree_size(site),
    }
    (stage / C.KIT_DIR / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    archive = outdir / C.ARCHIVE
    with tarfile.open(archive, "w:xz", preset=xz_preset) as tar:
        tar.add(stage / C.KIT_DIR, arcname=C.KIT_DIR)
    size = archive.stat().st_size
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    manifest.update(archive=str(archive), archive_bytes=size, archive_mib=round(size / 2**20, 2), sha256=digest)
    (outdir / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"\n{archive}: {size / 2**20:.2f} MiB (limit {C.SIZE_LIMIT_MIB} MiB), "
          f"{manifest['unpacked_bytes'] / 2**20:.1f} MiB unpacked, sha256 {digest[:16]}")
    print("holds:")
    for name, version in manifest["packages"].items():
        why = C.KIT.get(name, ("", "sglang-r3 itself, built here (sglang.srt.plugins entry point)"))[1]
        print(f"  {name}=={version}  -- {why}")
    for s in stand_ins:
        print(f"  {s}  -- stand-in")
    for m in jit_built["modules"]:
        print(f"  {jit.CACHE_DIR}/{m}  -- SGLang's JIT kernel, built here for sm{jit.ARCH[0]}{jit.ARCH[1]}")
    if why_not:
        print(f"  no JIT kernels: {why_not}; the host builds them with nvcc on first use")
    if size > C.SIZE_LIMIT_MIB * 2**20 and python == C.PYTHON:
        raise KitError(f"the kit is {size / 2**20:.2f} MiB, over the {C.SIZE_LIMIT_MIB} MiB limit")
    if changed and not allow_requires_change:
        raise KitError(f"{REQUIRES.relative_to(ROOT)} changed: the wheels' requirements are not the ones the "
                       "committed list was checked against; review it, run tests/test_gpu_kit.py, commit it")
    return manifest


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("build", help="download, trim, build and pack the kit into OUTDIR")
    b.add_argument("outdir", type=Path)
    b.add_argument("--allow-requires-change", action="store_true",
                   help="do not fail when requires.json changed (it is rewritten either way)")
    b.add_argument("--python", default=C.PYTHON,
                   help=f"the CPython the wheels are for (default {C.PYTHON}, the GPU host's; another makes a "
                        "rehearsal kit for this machine, see benchmarks.gpu.rehearse)")
    b.add_argument("--jit-python", type=Path, default=jit.DEFAULT_PYTHON,
                   help="the Python of an SGLang %s install that builds the JIT kernels for sm90 (default: "
                        "%%(default)s, which .ci/release-env makes)" % C.SGLANG)
    b.add_argument("--no-jit", action="store_true", help="carry no JIT kernels (the host builds them with nvcc)")
    sub.add_parser("list", help="print the pinned list")
    args = ap.parse_args(argv)
    if args.cmd == "list":
        for name, (version, why) in C.KIT.items():
            print(f"{name}=={version}  -- {why}")
        for dist, (version, _, _) in C.STAND_INS.items():
            print(f"{dist}=={version}+{C.STANDIN_LOCAL}  -- stand-in")
        print(f"{C.OWN} -- built from this tree")
        return 0
    try:
        build(args.outdir, allow_requires_change=args.allow_requires_change, python=args.python,
              jit_python=None if args.no_jit else args.jit_python)
    except (KitError, subprocess.CalledProcessError) as exc:
        print(f"kit build FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
