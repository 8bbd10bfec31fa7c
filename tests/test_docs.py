"""The documentation stays true to the tree: README.md and docs/*.md are read as text and every name, path,
command, flag, variable, section link and error code they show is checked against the code (no server, no
SGLang import: SGLang's own flags are read from its installed sources as text). docs/architecture.md names
every module, its manifest table is the manifest and its import floors are pyproject.toml's contracts.

The stale claims issue 35 found each have a check of their own below (``test_stale_claim_*``), so that
reintroducing one fails here.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import importlib.metadata
import re
import shlex
import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

import pytest

from sglang_r3.core import codes, settings
from sglang_r3.tools import manifest_check

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "architecture.md").read_text()
README = ROOT / "README.md"
DOCS: List[Path] = [README, *sorted((ROOT / "docs").glob("*.md"))]
TEXT: Dict[Path, str] = {p: p.read_text() for p in DOCS}

_FENCE = re.compile(r"^```[^\n]*\n(.*?)^```[^\n]*$", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]+)`")


def _name(p: Path) -> str:
    return str(p.relative_to(ROOT))


def _blocks(text: str) -> List[str]:
    """The contents of the fenced code blocks."""
    return _FENCE.findall(text)


def _prose(text: str) -> str:
    """The text outside fenced code blocks."""
    return _FENCE.sub("", text)


def _spans(text: str) -> List[str]:
    """Inline code spans outside fenced blocks (table pipes escaped as ``\\|`` read as ``|``)."""
    return [s.replace("\\|", "|") for s in _SPAN.findall(_prose(text))]


def _code(text: str) -> List[str]:
    """Everything a reader would copy: fenced blocks and inline spans."""
    return _blocks(text) + _spans(text)


def _paragraphs(text: str) -> List[str]:
    """Paragraphs, a table's rows each one of its own."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        if para.lstrip().startswith("|"):
            out += [row for row in para.splitlines() if row.strip()]
        elif para.strip():
            out.append(para)
    return out


def _where(p: Path, text: str, needle: str) -> str:
    line = text[: max(text.find(needle), 0)].count("\n") + 1
    return f"{_name(p)}:{line}"


# -- the tree ---------------------------------------------------------------------------------------------

_TOPS = {"sglang_r3": ROOT / "sglang_r3", "sglang_r3_server": ROOT / "server", "tests": ROOT / "tests",
         "benchmarks": ROOT / "benchmarks"}


def _module_file(dotted: str) -> Optional[Path]:
    """The file of module ``dotted`` in this checkout (a package: its ``__init__.py``), or None."""
    top, *rest = dotted.split(".")
    if top not in _TOPS:
        return None
    path = _TOPS[top].joinpath(*rest)
    if path.parent.joinpath(path.name + ".py").is_file():
        return path.parent / (path.name + ".py")
    if (path / "__init__.py").is_file():
        return path / "__init__.py"
    return None


@lru_cache(maxsize=None)
def _defined(path: Path, owner: Optional[str] = None) -> frozenset:
    """Names a module file binds at top level (or a class of it binds in its body), read without importing
    it: definitions, assignments, imports, ``__all__`` and a lazy-export table (``_EXPORTS``)."""
    tree = ast.parse(path.read_text())
    body = tree.body
    if owner is not None:
        cls = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner]
        if not cls:
            return frozenset()
        body = cls[0].body
    names: Set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
                if isinstance(t, ast.Name) and t.id in ("__all__", "_EXPORTS") and node.value is not None:
                    names |= {c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)
                              and isinstance(c.value, str)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.If, ast.Try)):  # try/except ImportError fallbacks
            for sub in ast.walk(node):
                if isinstance(sub, (ast.Import, ast.ImportFrom)):
                    names |= {(a.asname or a.name).split(".")[0] for a in sub.names}
                elif isinstance(sub, (ast.FunctionDef, ast.ClassDef)):
                    names.add(sub.name)
    return frozenset(names)


def resolve(dotted: str) -> Optional[str]:
    """None when ``dotted`` (``sglang_r3...``) names a module of this tree or an attribute of one, else why not.

    The longest prefix that is a module file is the module; the rest are attributes, looked up on the
    imported module, or, where importing it needs what this host lacks (SGLang in the fast tier, Ray,
    megatron-core), in its source: top-level names, then a class's body."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        path = _module_file(".".join(parts[:i]))
        if path is not None:
            break
    else:
        return "no such module"
    module, attrs = ".".join(parts[:i]), parts[i:]
    if not attrs:
        return None
    try:
        obj = importlib.import_module(module)
    except Exception:  # noqa: BLE001 -- SGLang refused in the fast tier, Ray or megatron-core missing, ...
        obj = None
    if obj is not None:
        for a in attrs:
            try:
                obj = getattr(obj, a)
            except AttributeError:
                return f"{module} has no attribute path {'.'.join(attrs)}"
        return None
    if attrs[0] not in _defined(path):
        return f"{module} does not define {attrs[0]}"
    if len(attrs) > 1 and attrs[1] not in _defined(path, attrs[0]):
        return f"{module}.{attrs[0]} does not define {attrs[1]}"
    return None


@lru_cache(maxsize=1)
def _tree_paths() -> Tuple[str, ...]:
    """Every file and folder of the tree, relative to the root (folders with a trailing /)."""
    out = []
    for p in ROOT.rglob("*"):
        rel = p.relative_to(ROOT)
        if any(part.startswith(".") and part != ".ci" for part in rel.parts) or "__pycache__" in rel.parts:
            continue
        if rel.parts[0] in ("build", "dist") or rel.parts[0].endswith(".egg-info") or rel.parts[0].startswith(".venv"):
            continue
        out.append(str(rel) + ("/" if p.is_dir() else ""))
    return tuple(out)


# A path in backticks is this repository's when it starts at the root or at one of the packages or folders the
# docs name relative paths from (`core/settings.py`, `adapter/served_layout.py`, `trainer/slime/`); others
# (`slime/backends/...`, `docker/...`, `disaggregation/utils.py`) are slime's, SGLang's or an image's.
_ROOT_TOPS = ("sglang_r3", "server", "tests", "docs", "benchmarks", ".ci")
_INNER_TOPS = ("core", "serving", "trainer", "tools", "dev", "adapter", "seam", "refusals", "cpu_runtime", "capture",
                "fleet", "record", "client")
_PATH = re.compile(r"^[\w.-]+(?:/[\w.-]+)*/?$")


def _path_tokens(p: Path) -> Iterator[str]:
    for span in _spans(TEXT[p]):
        for token in span.split():
            token = token.strip("()[],;:'\"")
            if "/" not in token or "://" in token or not _PATH.match(token):
                continue
            first = token.split("/")[0]
            if first in _ROOT_TOPS or first in _INNER_TOPS:
                yield token


def _path_exists(token: str) -> Optional[str]:
    paths = _tree_paths()
    first = token.split("/")[0]
    if first in _ROOT_TOPS:
        if token in paths or token + "/" in paths or token.rstrip("/") in paths:
            return None
    elif any(p == token or p.endswith("/" + token) or p.endswith("/" + token + "/") for p in paths):
        return None
    # `serving/launch.prepare`, `serving/refusals/startup.check_supported`: a module and a name in it
    stem, dot, name = token.rpartition(".")
    if dot and name.isidentifier():
        for p in paths:
            if p == stem + ".py" or p.endswith("/" + stem + ".py"):
                return None if name in _defined(ROOT / p) else f"{p} does not define {name}"
    return "no such file or folder"


# -- flags ------------------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def sglang_flags() -> Optional[frozenset]:
    """Every long flag SGLang's ``ServerArgs`` parser takes, read from the installed SGLang's sources as text
    (fields of the argument classes, spelled as flags, and literal flag strings such as aliases); None where
    SGLang is not installed (a trainer host)."""
    try:
        base = Path(importlib.metadata.distribution("sglang").locate_file("sglang/srt"))
    except importlib.metadata.PackageNotFoundError:
        return None
    files = [base / "server_args.py", *sorted((base / "arg_groups").rglob("*.py"))]
    flags: Set[str] = set()
    for f in files:
        if not f.is_file():
            continue
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ClassDef):
                for st in node.body:
                    if isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and not st.target.id.startswith("_"):
                        flags.add("--" + st.target.id.replace("_", "-"))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"--[a-z0-9][a-z0-9-]*", node.value):
                flags.add(node.value)
    return frozenset(flags)


def launcher_own_flags() -> frozenset:
    """The flags ``python -m sglang_r3.launch_server`` adds to SGLang's."""
    from sglang_r3.serving import launch

    own = {launch.DEFAULT_ROUTING_FLAG, "--disable-speculation"}
    source = (ROOT / "sglang_r3" / "serving" / "launch.py").read_text()
    assert all(f'"{f}"' in source for f in own - {launch.DEFAULT_ROUTING_FLAG})
    return frozenset(own)


class _Parsed(Exception):
    def __init__(self, namespace):
        self.namespace = namespace


def parse_with(main, argv: List[str]):
    """Run a tool's ``main(argv)`` only as far as its argparse parser: the namespace it parsed, or
    ``SystemExit`` when the parser refuses ``argv``."""
    real = argparse.ArgumentParser.parse_args

    def stop(self, args=None, namespace=None):
        raise _Parsed(real(self, args, namespace))

    argparse.ArgumentParser.parse_args = stop
    try:
        main(argv)
    except _Parsed as p:
        return p.namespace
    finally:
        argparse.ArgumentParser.parse_args = real
    raise AssertionError(f"{main.__module__}.main parsed nothing")


@lru_cache(maxsize=1)
def _tool_parsers() -> Dict[str, argparse.ArgumentParser]:
    """module -> its parser, for the tools whose ``main`` builds one."""
    from sglang_r3.tools import releases, report

    out = {}
    for module in (report, releases):
        real = argparse.ArgumentParser.parse_args

        def grab(self, args=None, namespace=None, _m=module.__name__):
            out[_m] = self
            raise _Parsed(None)

        argparse.ArgumentParser.parse_args = grab
        try:
            module.main([])
        except _Parsed:
            pass
        finally:
            argparse.ArgumentParser.parse_args = real
    return out


def _options(parser: argparse.ArgumentParser) -> Set[str]:
    return {s for a in parser._actions for s in a.option_strings if s.startswith("--")}


def fleet_flags() -> Set[str]:
    from sglang_r3.serving.fleet import __main__ as fleet_main

    parser = None
    real = argparse.ArgumentParser.parse_args

    def grab(self, args=None, namespace=None):
        nonlocal parser
        parser = self
        return real(self, args, namespace)

    argparse.ArgumentParser.parse_args = grab
    try:
        fleet_main.parse([])
    finally:
        argparse.ArgumentParser.parse_args = real
    return _options(parser)


@lru_cache(maxsize=1)
def our_flags() -> frozenset:
    """Flags of our command-line tools, from their parsers, and flag literals of the checkout's code (the
    benchmarks' and tests' entry points)."""
    flags = set(launcher_own_flags()) | fleet_flags() | {"--markdown"}  # the manifest's (no parser)
    for parser in _tool_parsers().values():
        flags |= _options(parser)
    for top in ("sglang_r3", "server", "benchmarks", "tests"):
        for f in (ROOT / top).rglob("*.py"):
            flags |= set(re.findall(r"""["'](--[a-z0-9][a-z0-9-]*)""", f.read_text()))
    return frozenset(flags)


# Flags of other programs the docs show, by owner. They cannot be checked against a parser here (slime and
# Megatron are not installed; git and Ray are not ours); a new one is added here on purpose.
OTHER_PROGRAMS = {
    "slime (slime/utils/arguments.py, 624b824)": (
        "--use-rollout-routing-replay", "--use-routing-replay", "--custom-megatron-init-path", "--hf-checkpoint",
        "--mtp-num-layers", "--enable-mtp-training", "--mtp-loss-scaling-factor", "--data-pad-size-multiplier",
        "--allgather-cp", "--custom-convert-samples-to-train-data-path", "--custom-generate-function-path",
        "--rollout-function-path", "--partial-rollout",
    ),
    "Megatron-LM (slime's training arguments)": (
        "--sequence-parallel", "--moe-router-fusion", "--moe-router-load-balancing-type",
        "--moe-expert-capacity-factor",
    ),
    "ray job submit": ("--runtime-env-json",),
    "git apply": ("--unidiff-zero",),
    "a placeholder in a message format": ("--flag",),
}
_OTHER = {f for flags in OTHER_PROGRAMS.values() for f in flags}
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*\*?")


def flag_problem(flag: str) -> Optional[str]:
    """None when some parser the docs can mean takes ``flag``: ours, SGLang's (``--sglang-X`` is slime's
    spelling of SGLang's ``--X``), or another program's listed above."""
    sglang = sglang_flags()
    if flag.endswith("*"):  # `--speculative-*`: a family of flags
        prefix = flag[:-1]
        known = set(our_flags()) | set(sglang or ())
        return None if any(f.startswith(prefix) for f in known) or sglang is None else f"no flag starts {prefix}"
    if flag in our_flags() or flag in _OTHER:
        return None
    if sglang is None:
        return None  # cannot tell without SGLang's sources
    if flag in sglang or (flag.startswith("--sglang-") and "--" + flag[len("--sglang-"):] in sglang):
        return None
    return "no parser takes it"


# -- commands ---------------------------------------------------------------------------------------------

_COMMAND = re.compile(r"python -m ([A-Za-z_][\w.]*)([^\n]*)")


def _commands(text: str, module: str, *, blocks_only: bool) -> List[List[str]]:
    """The argv of every ``python -m MODULE ...`` the text shows (in fenced blocks; and in spans unless
    ``blocks_only``), cut at a comment, ``&&``, ``|`` or ``;``."""
    lines = [line for block in _blocks(text) for line in block.splitlines()]
    lines += [] if blocks_only else _spans(text)
    out = []
    for line in lines:
        m = _COMMAND.match(re.sub(r"^\s*(?:\$\s+)?(?:\S+ && )?", "", line))
        if m is None or m.group(1) != module:
            continue
        rest = re.split(r"\s(?:#|&&|\||;)", " " + m.group(2))[0]
        try:
            out.append(shlex.split(rest))
        except ValueError:
            out.append(rest.split())
    return out


# -- the tests --------------------------------------------------------------------------------------------


def test_the_architecture_doc_shows_the_manifest_as_it_is():
    table = manifest_check.markdown()
    assert table in DOC, "regenerate the table: python -m sglang_r3.tools.manifest_check --markdown"


def _modules():
    for top in ("sglang_r3", "server"):  # server/ installs as sglang_r3_server
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = path.relative_to(ROOT)
            yield rel


def test_the_architecture_doc_names_every_module():
    def named(rel: Path) -> bool:
        # The tables name a module relative to its top package (`record/bitpack.py`, `server/routes.py`),
        # a package (its __init__) by its folder (`capture/`), and the CPU runtime's files by their folder's.
        parts = rel.parts[1:] if rel.parts[0] == "sglang_r3" else rel.parts
        folder = "/".join(parts[:-1]) + "/"
        if parts[-1] == "__init__.py":
            return f"`{folder}`" in DOC or len(parts) == 1
        return f"`{'/'.join(parts)}`" in DOC or (folder.startswith("cpu_runtime/") and f"`{folder}`" in DOC)

    missing = [str(r) for r in _modules() if not named(r)]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_the_architecture_doc_states_the_import_floors_as_the_contracts_do():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    layered = [c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    assert layered
    for contract in layered:
        line = " → ".join(f"`{layer}`" for layer in contract["layers"])
        assert line in DOC, f"docs/architecture.md does not state the floors of {contract['name']!r} as: {line}"


def test_every_dotted_name_resolves():
    bad = []
    for p, text in TEXT.items():
        for name in sorted(set(re.findall(r"\bsglang_r3(?:_server)?(?:\.[A-Za-z_]\w*)+", text))):
            why = resolve(name)
            if why:
                bad.append(f"{_where(p, text, name)}: {name}: {why}")
    assert not bad, "\n".join(bad)


def test_every_repository_path_exists():
    bad = []
    for p in DOCS:
        for token in sorted(set(_path_tokens(p))):
            why = _path_exists(token)
            if why:
                bad.append(f"{_where(p, TEXT[p], token)}: `{token}`: {why}")
    assert not bad, "\n".join(bad)


def test_every_link_and_image_points_at_a_file():
    bad = []
    for p, text in TEXT.items():
        for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", _SPAN.sub("", _prose(text))):
            path = target.split("#", 1)[0]
            if re.match(r"[a-z]+:", path) or not path:
                continue
            if not (p.parent / path).exists():
                bad.append(f"{_name(p)}: ({target}): no such file")
    assert not bad, "\n".join(bad)


# The modules a doc may run with `python -m` that are not this checkout's.
EXTERNAL_MODULES = {"pip", "pytest", "sglang.launch_server"}


def test_every_python_m_target_is_a_module():
    bad = []
    for p, text in TEXT.items():
        for target in sorted(set(re.findall(r"python -m ([A-Za-z_][\w.]*\w)", text))):
            if target in EXTERNAL_MODULES:
                continue
            path = _module_file(target)
            if path is None:
                bad.append(f"{_where(p, text, target)}: python -m {target}: no such module in this checkout")
            elif path.name == "__init__.py" and not (path.parent / "__main__.py").is_file():
                bad.append(f"{_where(p, text, target)}: python -m {target}: a package without __main__.py")
    assert not bad, "\n".join(bad)


def test_every_flag_shown_is_one_a_parser_takes():
    bad = []
    for p, text in TEXT.items():
        for chunk in _code(text):
            for flag in _FLAG.findall(chunk):
                why = flag_problem(flag)
                if why:
                    bad.append(f"{_where(p, text, flag)}: {flag}: {why}")
    assert not bad, "\n".join(sorted(set(bad)))


def test_every_launcher_example_passes_only_launcher_flags():
    sglang = sglang_flags()
    if sglang is None:
        pytest.skip("SGLang is not installed: its flags cannot be read")
    allowed = sglang | launcher_own_flags()
    bad = []
    for p, text in TEXT.items():
        for argv in _commands(text, "sglang_r3.launch_server", blocks_only=False):
            for token in argv:
                flag = token.split("=", 1)[0]
                if flag.startswith("--") and flag.rstrip("*") == flag and flag not in allowed:
                    bad.append(f"{_name(p)}: python -m sglang_r3.launch_server ... {flag}: not a launcher flag")
    assert not bad, "\n".join(bad)


def test_the_fleet_examples_parse_through_the_fleets_parser():
    from sglang_r3.serving.fleet import __main__ as fleet_main

    examples = [(p, argv) for p, text in TEXT.items()
                for argv in _commands(text, "sglang_r3.serving.fleet", blocks_only=True)]
    assert examples, "the docs show no fleet command"
    own = fleet_flags()
    sglang = sglang_flags()
    launcher = (sglang | launcher_own_flags()) if sglang is not None else None
    for p, argv in examples:
        try:
            ns = fleet_main.parse(argv)
        except SystemExit:
            pytest.fail(f"{_name(p)}: python -m sglang_r3.serving.fleet {' '.join(argv)}: the fleet's parser refuses it")
        engine = [a for a in ns.engine_flags if a != "--"]
        for token in engine:
            flag = token.split("=", 1)[0]
            if not flag.startswith("--"):
                continue
            # After `--` a flag goes to every engine's launcher and so to SGLang: a fleet flag there is lost.
            assert launcher is None or flag in launcher, (
                f"{_name(p)}: {flag} after `--` goes to the engines' launcher, which has no such flag"
                + (" (it is the fleet's own: put it before `--`)" if flag in own else ""))
            assert flag not in own - {"--port"}, f"{_name(p)}: the fleet's {flag} after `--` goes to SGLang"


@pytest.mark.parametrize("module", ["sglang_r3.tools.report", "sglang_r3.tools.releases"])
def test_the_tool_examples_parse_through_the_tools_parsers(module):
    tool = importlib.import_module(module)
    examples = [(p, argv) for p, text in TEXT.items() for argv in _commands(text, module, blocks_only=True)]
    for p, argv in examples:
        try:
            parse_with(tool.main, argv)
        except SystemExit:
            pytest.fail(f"{_name(p)}: python -m {module} {' '.join(argv)}: its parser refuses it")


def test_every_settings_variable_is_one_settings_parses():
    tests_source = "\n".join(f.read_text() for f in (ROOT / "tests").rglob("*.py"))
    bad = []
    for p, text in TEXT.items():
        for var in sorted(set(re.findall(r"\bSGLANG_R3_[A-Z0-9_]*[A-Z0-9]\b", text))):
            # The suite's own variables (SGLANG_R3_TEST_URL_<SERVER>) are read in tests/, the rest in core/settings.py.
            test_url = re.fullmatch(r"SGLANG_R3_TEST_URL_(\w+)", var)
            if test_url and f'"{test_url.group(1).lower()}"' in tests_source and "SGLANG_R3_TEST_URL_{" in tests_source:
                continue
            if var not in settings.MEANING:
                bad.append(f"{_where(p, text, var)}: {var} is not an sglang-r3 setting (core/settings.py)")
    assert not bad, "\n".join(bad)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _ dropped, spaces to -."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(text: str) -> Set[str]:
    seen: Dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*$", _prose(text), re.M):
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def _headings(text: str) -> List[str]:
    return [m.group(1).replace("`", "") for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", _prose(text), re.M)]


def test_every_section_link_resolves():
    bad = []
    for p, text in TEXT.items():
        for target in re.findall(r"\]\(([^)\s]*#[^)\s]+)\)", _SPAN.sub("", _prose(text))):
            path, anchor = target.split("#", 1)
            doc = p if not path else (p.parent / path).resolve()
            if re.match(r"[a-z]+:", path):
                continue
            if not doc.is_file():
                bad.append(f"{_name(p)}: ({target}): no such file")
            elif anchor not in _anchors(doc.read_text()):
                bad.append(f"{_name(p)}: ({target}): {doc.name} has no section #{anchor}")
    assert not bad, "\n".join(bad)


def test_every_quoted_section_reference_names_a_section():
    # `"What the fill does" below`, `README, "Refused at start-up"`: a section named in words must exist.
    bad = []
    for p, text in TEXT.items():
        for name, _ in re.findall(r'"([^"\n]{3,80})"\s+(above|below)', _prose(text)):
            if not any(h.lower().startswith(name.lower()) for h in _headings(text)):
                bad.append(f"{_name(p)}: \"{name}\": no such section in {p.name}")
        for name in re.findall(r'README,\s*"([^"\n]+)"', _prose(text)):
            if not any(h.lower().startswith(name.lower()) for h in _headings(TEXT[README])):
                bad.append(f"{_name(p)}: README, \"{name}\": the README has no such section")
    assert not bad, "\n".join(bad)


def test_every_error_code_is_in_the_api_doc():
    api = (ROOT / "docs" / "api.md").read_text()
    every = set(codes.CAPTURE_ERROR_CODES) | set(codes.STORE_ERROR_CODES) | set(codes.ROUTING_ERROR_CODES) \
        | set(codes.HANDLE_ERROR_CODES)
    missing = sorted(c for c in every if f"`{c}`" not in api)
    assert not missing, f"docs/api.md does not document these codes of sglang_r3/core/codes.py: {missing}"


def test_no_document_keeps_a_test_count():
    count = re.compile(r"\b\d[\d,]*\s+(?:strict\s+)?(?:tests?|passed|failed|xfails?|xfailed|xpassed|skipped)\b", re.I)
    bad = [f"{_where(p, text, m.group(0))}: {m.group(0)!r}" for p, text in TEXT.items() for m in count.finditer(text)]
    assert not bad, "test counts go stale on every commit; say what runs, not how many:\n" + "\n".join(bad)


def test_the_readme_keeps_the_two_commands_ci_runs():
    readme = "\n".join(_blocks(TEXT[README]))
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -e ".[test]" && python -m sglang_r3.launch_server' in readme
    # The README's install, at the newest versions its bounds admit (a fresh machine's resolution, not this one's)
    assert 'pip install --upgrade --upgrade-strategy eager -e ".[test]"' in ci
    test_command = "python -m pytest tests -v"
    assert test_command in readme.splitlines()
    assert test_command in [line.strip() for line in ci.splitlines()], ".ci/run must run the README's test command"


def test_the_readme_names_the_served_releases():
    from sglang_r3.seam.versions import SERVED

    assert all(f"**{v}**" in TEXT[README] for v in SERVED)
    said = " ".join(TEXT[README].split()).lower()
    assert "nothing has been run on a gpu" in said, "the README says what has never run on a GPU"


# (README text, file, the code that prints it): the log lines the README tells a user to look for.
LOG_LINES = [
    ("sglang-r3 capture: Glm4MoeForCausalLM: 4 decoder layers (1 dense, 3 MoE), 1 MTP, 16 experts, top-4, ",
     "sglang_r3/serving/adapter/capture_site.py", '"sglang-r3 capture: %s, %d KV slots"'),
    ("sglang-r3 draft capture: 1 MTP router(s) at draft layer ids [0]",
     "sglang_r3/serving/adapter/draft_site.py", '"sglang-r3 draft capture: %d MTP router(s) at draft layer ids %s"'),
    ("R3 (slime): MegatronTrainRayActor.fill_routing_replay replays … decoder MoE layers by identity, 1 MTP layer(s) route live",
     "sglang_r3/trainer/slime/installer.py",
     '"R3 (slime): MegatronTrainRayActor.fill_routing_replay replays %d decoder MoE layers by identity, %d MTP "'),
    ("R3 (slime): … decoder MoE routers replay their own rows (layers […]); 1 MTP router(s) route live",
     "sglang_r3/trainer/slime/binding.py", '"R3 (slime): %d decoder MoE routers replay their own rows (layers %s); %d MTP router(s) route live "'),
    ("R3 (slime): off, --use-rollout-routing-replay was not given: sglang-r3 installed nothing",
     "sglang_r3/trainer/slime/installer.py",
     '"R3 (slime): off, --use-rollout-routing-replay was not given: sglang-r3 installed nothing and slime "'),
]


@pytest.mark.parametrize("shown, path, code", LOG_LINES, ids=[p for _, p, _ in LOG_LINES])
def test_the_log_lines_the_readme_shows_are_the_codes(shown, path, code):
    assert shown in TEXT[README]
    assert code in (ROOT / path).read_text(), f"{path} no longer logs {code}: update the README"


def test_the_hand_written_family_table_agrees_with_the_generated_one():
    text = (ROOT / "docs" / "models.md").read_text()
    begin, end = "<!-- sweep table: generated by", "<!-- end of sweep table -->"
    generated = {}
    for line in text.split(begin, 1)[1].split(end, 1)[0].splitlines():
        m = re.match(r"\| `(\w+)` \(`\w+`\) \| (captured|refused at start-up|ERROR)", line)
        if m:
            generated[m.group(1)] = m.group(2)
    assert len(generated) > 60
    hand = text.split("## Families", 1)[1].split("\n## ", 1)[0]
    bad = []
    for line in hand.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        if len(cells) < 3 or cells[0].startswith(("family", "---")):
            continue
        says = "refused at start-up" if cells[1] == "—" else "captured"
        for arch in re.findall(r"`(\w+)`", cells[0]):
            if arch in generated and generated[arch] != says:
                bad.append(f"{arch}: the hand-written row says {says}, the generated table {generated[arch]}")
    assert not bad, "\n".join(bad)


def _handwritten(p: Path) -> str:
    """A document's prose without what is generated into it (the manifest table, the sweep's table)."""
    text = _prose(TEXT[p]).replace(manifest_check.markdown(), "")
    begin, end = "<!-- sweep table: generated by", "<!-- end of sweep table -->"
    if begin in text:
        text = text.split(begin, 1)[0] + text.split(end, 1)[1]
    return text


# In-house words: not in the README at all; in docs/, defined (in bold) where a document first uses them.
IN_HOUSE = ("house", "wings?", "floors?", "oracles?", "sweep")


def test_in_house_words_are_defined_where_first_used():
    bad = []
    for word in IN_HOUSE:
        rx = re.compile(rf"\b{word}\b", re.I)
        if rx.search(TEXT[README]):
            bad.append(f"README.md uses the in-house word {word!r}: say it in the ecosystem's words")
        for p in DOCS[1:]:
            text = _handwritten(p)
            m = rx.search(text)
            if m and not (text[m.start() - 2:m.start()] == "**" and text[m.end():m.end() + 2] == "**"):
                bad.append(f"{_name(p)}: first use of {m.group(0)!r} is not its **definition**")
    for p, text in TEXT.items():
        if re.search(r"\bthe seed\b", text, re.I):
            bad.append(f"{_name(p)}: 'the seed' (the failing case) is an in-house word")
    assert not bad, "\n".join(bad)


# -- the stale claims of issue 35, one check each -----------------------------------------------------------


def test_stale_claim_msgpack_carries_raw_bytes():
    # msgpack answers bit-pack expert ids (packing.bits): a doc that says "raw bytes" must say that too.
    bad = [f"{_where(p, text, para[:40])}: {para[:120]!r}" for p, text in TEXT.items() for para in _paragraphs(text)
           if "msgpack" in para.lower() and re.search(r"raw\s+bytes", para, re.I)
           and not re.search(r"bit-pack|packing", para, re.I)]
    assert not bad, "msgpack ids are bit-packed, not raw bytes:\n" + "\n".join(bad)


def test_stale_claim_join_records_returns_a_record():
    bad = [f"{_where(p, text, para[:40])}" for p, text in TEXT.items() for para in _paragraphs(text)
           if "join_records" in para and re.search(r"\breturns?\b", para) and "JoinedRecord" not in para]
    assert not bad, "join_records returns a JoinedRecord (its .record is what fill takes):\n" + "\n".join(bad)


def test_stale_claim_sglang_r3_client():
    bad = [f"{_where(p, text, s)}: {s}" for p, text in TEXT.items()
           for s in ("sglang_r3/client", "sglang_r3.client") if re.search(re.escape(s) + r"\b", text)]
    assert not bad, "the client is sglang_r3.trainer.client:\n" + "\n".join(bad)


def test_stale_claim_integrations_slime_in_the_tree():
    old = "integrations" + ".slime"  # spelled apart: this file names it
    hits = []
    for top in ("sglang_r3", "server", "benchmarks", "tests"):
        for f in (ROOT / top).rglob("*.py"):
            if f == Path(__file__).resolve():
                continue
            text = f.read_text()
            if old in text or old.replace(".", "/") in text:
                hits.append(str(f.relative_to(ROOT)))
    hits += [_name(p) for p, text in TEXT.items() if old in text or old.replace(".", "/") in text]
    assert not hits, f"{old} is sglang_r3.trainer.slime since issue 28 (CHANGELOG.md): {hits}"


def test_stale_claim_num_gpus_after_the_double_dash():
    from sglang_r3.serving.fleet import __main__ as fleet_main

    # The parser the check above relies on sends everything after `--` to the engines.
    ns = fleet_main.parse(["--engines", "8", "--", "--model-path", "/ckpt", "--num-gpus", "2"])
    assert ns.num_gpus is None and "--num-gpus" in ns.engine_flags
    for p, text in TEXT.items():
        for argv in _commands(text, "sglang_r3.serving.fleet", blocks_only=False):
            if "--" in argv:
                assert "--num-gpus" not in argv[argv.index("--"):], f"{_name(p)}: --num-gpus after `--` goes to SGLang"


# -- the encodings the docs spell out are what the code writes ------------------------------------------------


def _python_blocks(text: str) -> List[str]:
    return re.findall(r"^```python\n(.*?)^```", text, re.M | re.S)


def test_the_readme_decoding_snippet_reads_the_answer_it_shows():
    import base64

    import numpy as np

    readme = TEXT[README]
    first_row = "CwUDCAQDBQwHAAEI"  # the first 12 bytes of the `experts` the README shows: token 0's row
    assert f'"experts": "{first_row}' in readme
    shown = "`experts[0]` is `[[11, 5, 3, 8], [4, 3, 5, 12], [7, 0, 1, 8]]`"
    assert shown in " ".join(readme.split())
    snippet = next(b for b in _python_blocks(readme) if "b64decode" in b)
    answer = {"meta_info": {"routing": {"experts": first_row, "dtype": "uint8", "num_tokens": 1,
                                        "layers": [1, 2, 3], "topk": 4}}}
    ns = {"answer": answer}
    exec(snippet, ns)
    assert ns["experts"][0].tolist() == [[11, 5, 3, 8], [4, 3, 5, 12], [7, 0, 1, 8]]
    assert list(base64.b64decode(first_row)) == [11, 5, 3, 8, 4, 3, 5, 12, 7, 0, 1, 8]
    assert ns["experts"].dtype == np.uint8


# (ids, bits, the bytes docs/api.md says they pack to)
PACKING_EXAMPLES = [
    ([11, 5, 3, 8, 4, 3, 5, 12, 7, 0, 1, 8], 4, "b5 38 43 5c 70 18"),
    ([5, 3, 7, 1, 0, 6, 2, 4], 3, "af 91 94"),
    ([5, 3, 7], 3, "af 80"),
    ([300, 5], 9, "96 01 40"),
]


@pytest.mark.parametrize("ids, bits, shown", PACKING_EXAMPLES, ids=[s for _, _, s in PACKING_EXAMPLES])
def test_the_bit_packing_spelled_out_in_the_api_doc_is_the_codes(ids, bits, shown):
    import numpy as np

    from sglang_r3.core.record import bits_for, pack_ids

    api = (ROOT / "docs" / "api.md").read_text()
    assert f"`{shown}`" in api
    arr = np.array(ids, dtype=np.uint16 if max(ids) > 255 else np.uint8)
    raw = pack_ids(arr, bits)
    assert raw.hex(" ") == shown
    # The numpy unpacker the doc gives reads it back.
    snippet = next(b for b in _python_blocks(api) if "unpackbits" in b)
    ns = {"np": np, "r": {"packing": {"bits": bits}, "num_tokens": len(ids), "layers": [0], "topk": 1,
                          "experts": raw}}
    exec(snippet, ns)
    assert ns["experts"].reshape(-1).tolist() == ids
    # And the doc's table of widths (`| experts E | 8 | ... |` over `| b | 3 | ... |`) is bits_for's.
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip().strip("|").split("|")[1:]]
            for line in api.splitlines() if line.startswith(("| experts E |", "| b |"))}
    assert len(rows) == 2 and len(rows["experts E"]) == len(rows["b"])
    for experts, b in zip(rows["experts E"], rows["b"]):
        for e in re.split(r"\s*(?:,|–)\s*", experts):  # "160, 256", "257–512": every value and range end
            assert bits_for(int(e)) == int(b), f"docs/api.md: {e} experts pack at {bits_for(int(e))} bits, not {b}"
