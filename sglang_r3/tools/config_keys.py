"""``python -m sglang_r3.tools.config_keys [ARCH ...]``: which config keys a family's reference implementation reads,
read from the installed sources by AST, and how the family accounts for each (``KEYS`` in each family module of ``core/families/``).

The reference is transformers' classes of the family's model type (the release each served SGLang pins: 5.19.0 beside
0.5.23, 5.12.1 beside 0.5.15.post1 read different keys): the fields its config class declares, and every attribute
its modeling file reads off a config object (``config.x``, ``self.config.x``, ``text_config.x``, ``getattr(config,
"x")``), aliases folded to the stored name by the class's ``attribute_map``. Keys the modeling file reads off another
config class of the same file (a vision tower's) belong to that class, not this one.

SGLang's side: the keys its model file reads off ``config`` unconditionally (``config.x`` outside a ``hasattr`` /
``getattr`` of the same key): where transformers' config class neither declares nor saves one, a checkpoint written by
transformers stops SGLang's scheduler on an AttributeError (``Family.required_keys`` refuses it at start-up).

Reads sources only: imports neither transformers' models nor SGLang's (``importlib.util.find_spec`` locates them).
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Dict, FrozenSet, Iterable, Optional, Tuple

# Attributes every config object has that are the framework's, not the model's (PretrainedConfig's own fields and
# methods a modeling file calls through ``config.``).
FRAMEWORK_ATTRIBUTES = frozenset({
    "get_text_config", "to_dict", "to_json_string", "architectures", "model_type", "name_or_path", "text_config",
    "vision_config", "audio_config", "sub_configs", "is_encoder_decoder", "return_dict", "output_attentions",
    "output_hidden_states", "use_return_dict", "torch_dtype", "dtype", "quantization_config", "chunk_size_feed_forward",
    "problem_type", "id2label", "label2id", "num_labels", "is_decoder", "add_cross_attention", "tie_encoder_decoder",
    "pruned_heads", "tokenizer_class", "task_specific_params", "base_model_tp_plan", "base_model_pp_plan",
    "base_model_ep_plan", "keys_to_ignore_at_inference", "attribute_map", "base_config_key",
})


def _package_dir(name: str) -> Optional[Path]:
    """An installed package's folder, found through its distribution's files: nothing is imported (a trainer host
    or a fast test that must not import SGLang can read its sources)."""
    try:
        folder = Path(importlib.metadata.distribution(name).locate_file(name))
    except importlib.metadata.PackageNotFoundError:
        folder = None
    if folder is not None and (folder / "__init__.py").exists():
        return folder
    spec = importlib.util.find_spec(name)  # an editable or source install the metadata does not locate
    return Path(spec.origin).parent if spec is not None and spec.origin else None


@dataclass(frozen=True)
class ConfigClass:
    """One config class as its source declares it."""

    name: str
    model_type: str
    fields: FrozenSet[str]
    aliases: Tuple[Tuple[str, str], ...]  # attribute_map: alias -> stored name
    # Attributes its methods compute that are no field (``self.qk_head_dim = qk_nope + qk_rope`` in
    # ``__post_init__``): never read from a file, made of keys that are accounted for themselves.
    derived: FrozenSet[str] = frozenset()


def _literal(node: ast.AST):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return None


def config_classes(path: Path) -> Tuple[ConfigClass, ...]:
    out = []
    for node in ast.parse(path.read_text(encoding="utf-8-sig")).body:
        if not isinstance(node, ast.ClassDef):
            continue
        model_type, aliases, fields, assigned = "", {}, set(), set()
        for fn in (st for st in node.body if isinstance(st, ast.FunctionDef)):
            for n in ast.walk(fn):
                if (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name)
                        and n.value.id == "self"):
                    assigned.add(n.attr)
        for st in node.body:
            if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                if st.targets[0].id == "model_type":
                    model_type = _literal(st.value) or ""
                elif st.targets[0].id == "attribute_map":
                    aliases = _literal(st.value) or {}
            elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and not st.target.id.startswith("_"):
                if "ClassVar" not in ast.unparse(st.annotation):
                    fields.add(st.target.id)
        if model_type:
            derived = frozenset(assigned - fields - set(aliases) - set(aliases.values()))
            out.append(ConfigClass(node.name, model_type, frozenset(fields), tuple(sorted(aliases.items())), derived))
    return tuple(out)


def _is_config(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "config" or node.id.endswith("_config")
    if isinstance(node, ast.Attribute):
        return node.attr == "config" or node.attr.endswith("_config")
    return False


# The names SGLang's model files give the model's own config (``config``, ``self.config``, ``text_config``, ...):
# a ``quant_config``, ``vision_config`` or ``lora_config`` there is another object.
_MODEL_CONFIG_NAMES = frozenset({"config", "text_config", "hf_config", "hf_text_config"})


def _is_model_config(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return node.id in _MODEL_CONFIG_NAMES
    return isinstance(node, ast.Attribute) and node.attr in _MODEL_CONFIG_NAMES


def config_reads(path: Path, *, unconditional: bool = False, model_config_only: bool = False) -> FrozenSet[str]:
    """Attribute names a source file reads off a config object. ``unconditional``: only ``config.x`` loads (no
    getattr), and not a key the file also tests with hasattr / getattr anywhere (a guarded read).
    ``model_config_only``: off the model's own config only (``_MODEL_CONFIG_NAMES``), not a ``quant_config``'s."""
    is_config = _is_model_config if model_config_only else _is_config
    tree = ast.parse(path.read_text(encoding="utf-8-sig"))
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)}
    direct, guarded, stored = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and is_config(node.value) and id(node) not in called:
            (stored if isinstance(node.ctx, ast.Store) else direct).add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
              and len(node.args) >= 2 and is_config(node.args[0]) and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str)):
            guarded.add(node.args[1].value)
    keys = (direct - guarded - stored) if unconditional else (direct | guarded)
    return frozenset(k for k in keys if not k.startswith("_") and k not in FRAMEWORK_ATTRIBUTES)


@lru_cache(maxsize=None)
def _transformers_index() -> Dict[str, Tuple[Path, ConfigClass, Tuple[ConfigClass, ...]]]:
    """model_type -> (its model folder, its config class, the other config classes of that file)."""
    root = _package_dir("transformers")
    index = {}
    for path in sorted((root / "models").glob("*/configuration_*.py")) if root else ():
        classes = config_classes(path)
        for c in classes:
            index.setdefault(c.model_type, (path.parent, c, tuple(o for o in classes if o is not c)))
    return index


def transformers_keys(model_type: str) -> Optional[FrozenSet[str]]:
    """The keys transformers' class of ``model_type`` reads (None: the installed transformers has no such class)."""
    found = _transformers_index().get(model_type)
    if found is None:
        return None
    folder, cls, others = found
    modeling = folder / f"modeling_{folder.name}.py"
    reads = config_reads(modeling) if modeling.exists() else frozenset()
    aliases = dict(cls.aliases)
    others_only = set().union(*(o.fields for o in others)) - cls.fields if others else set()
    keys = {aliases.get(k, k) for k in cls.fields} | {aliases.get(k, k) for k in reads
                                                     if aliases.get(k, k) not in others_only}
    return frozenset(k for k in keys if k not in FRAMEWORK_ATTRIBUTES and k not in cls.derived)


def transformers_fields(model_type: str) -> FrozenSet[str]:
    """What transformers' class of ``model_type`` declares and so saves (aliases included: it saves them stored)."""
    found = _transformers_index().get(model_type)
    if found is None:
        return frozenset()
    cls = found[1]
    return cls.fields | frozenset(a for a, _ in cls.aliases)


@lru_cache(maxsize=None)
def sglang_model_files() -> Dict[str, Path]:
    """architecture -> the SGLang model file whose EntryClass serves it."""
    root = _package_dir("sglang")
    out: Dict[str, Path] = {}
    for path in sorted((root / "srt" / "models").glob("*.py")) if root else ():
        for node in ast.parse(path.read_text(encoding="utf-8-sig")).body:
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "EntryClass"
                                                    for t in node.targets):
                names = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
                for n in names:
                    if isinstance(n, ast.Name):
                        out.setdefault(n.id, path)
    return out


def _base_class_files(path: Path, name: str, seen: set) -> set:
    """The SGLang model files defining ``name``'s base classes, transitively (GLM-5's GlmMoeDsaForCausalLM, in
    glm4_moe.py, is deepseek_v2.py's DeepseekV2ForCausalLM)."""
    tree = ast.parse(path.read_text(encoding="utf-8-sig"))
    imported = {a.asname or a.name: path.parent / f"{n.module.rpartition('.')[2]}.py" for n in tree.body
                if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("sglang.srt.models.") for a in n.names}
    local = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    out = set()
    for base in (b.id for b in getattr(local.get(name), "bases", ()) if isinstance(b, ast.Name)):
        where = imported.get(base, path if base in local else None)
        if where is not None and where.exists() and (where, base) not in seen:
            seen.add((where, base))
            out |= {where} | _base_class_files(where, base, seen)
    return out


def sglang_unconditional_keys(architecture: str) -> FrozenSet[str]:
    path = sglang_model_files().get(architecture)
    return config_reads(path, unconditional=True) if path else frozenset()


def _folder_fields(model_type: str) -> FrozenSet[str]:
    """Every field (aliases too) of every config class in the transformers folder of ``model_type``: a
    multimodal release's vision and audio towers' keys are theirs."""
    found = _transformers_index().get(model_type)
    if found is None:
        return frozenset()
    out = set()
    for path in found[0].glob("configuration_*.py"):
        for c in config_classes(path):
            out |= c.fields | {a for a, _ in c.aliases}
    return frozenset(out)


def sglang_only_keys(architecture: str, model_types: Iterable[str]) -> FrozenSet[str]:
    """The keys SGLang's model file for ``architecture`` (and those of its base classes) reads off the model's
    config (``config.x``, ``getattr(config, "x", default)``) that transformers' classes of ``model_types`` neither
    read nor declare (nor another config class of their folders): what a checkpoint may carry that SGLang honours
    and the reference ignores. Each is accounted for in its family's ``KEYS`` like the reference's own
    (tests/test_key_accounting.py). Not followed: modules a model builds its parts from without subclassing them
    (Qwen3-VL-MoE's decoder layers from qwen3_moe.py); their keys are listed by hand where known."""
    path = sglang_model_files().get(architecture)
    if path is None:
        return frozenset()
    known = set()
    for mt in model_types:
        known |= (transformers_keys(mt) or frozenset()) | transformers_fields(mt) | _folder_fields(mt)
    reads = set()
    for source in {path} | _base_class_files(path, architecture, set()):
        reads |= config_reads(source, model_config_only=True)
    return frozenset(reads - known)


def family_sglang_only_keys(fam) -> FrozenSet[str]:
    """``sglang_only_keys`` over every architecture of a family (none where no transformers class is its reference)."""
    from sglang_r3.core import families

    model_types = [mt for mt in fam.facts if transformers_keys(mt) is not None]
    if not model_types:
        return frozenset()
    return frozenset().union(*(sglang_only_keys(a, [*model_types, families.model_type_of(a)])
                               for a in fam.architectures))


_CATEGORIES = ("ruled", "neutral", "proven", "irrelevant", "via", "PENDING", "UNACCOUNTED")


def _count(fam, keys) -> Dict[str, int]:
    from sglang_r3.core import families

    how = families.account(fam, keys)
    return {c: sum(1 for k in keys if how.get(k, "UNACCOUNTED").split(":")[0] == c) for c in _CATEGORIES}


def accounting_rows() -> list:
    """Per family with a rule and a transformers class: (family, model type, how many keys its class reads, how many
    of them are ruled / neutral / proven / irrelevant / via / pending / unaccounted, and the same for the keys only
    SGLang's model file reads)."""
    from sglang_r3.core import families

    rows = []
    for fam in families.FAMILIES:
        if fam.rule is None:
            continue
        for model_type in fam.facts:
            keys = transformers_keys(model_type)
            if keys is None:
                continue
            theirs = family_sglang_only_keys(fam)
            rows.append((fam.name, model_type, len(keys), _count(fam, keys), len(theirs), _count(fam, theirs)))
    return rows


def markdown() -> str:
    import transformers

    lines = [f"Keys read by transformers {transformers.__version__}'s classes (the test checks 5.12.1's too), and "
             f"those only SGLang 0.5.23's model file reads (`sglang_only_keys`):", "",
             "| family | model type | keys | ruled | neutral | proven | irrelevant | pending | SGLang's only: keys | "
             "neutral or ruled | irrelevant | via | pending |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, model_type, n, c, n_sg, sg in accounting_rows():
        lines.append(f"| {name} | `{model_type}` | {n} | {c['ruled']} | {c['neutral']} | {c['proven']} | "
                     f"{c['irrelevant'] + c['via']} | {c['PENDING'] + c['UNACCOUNTED']} | {n_sg} | "
                     f"{sg['neutral'] + sg['ruled']} | {sg['irrelevant']} | {sg['via']} | "
                     f"{sg['PENDING'] + sg['UNACCOUNTED']} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[Iterable[str]] = None) -> int:
    from sglang_r3.core import families

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("architectures", nargs="*", help="architectures (default: every family with a rule)")
    parser.add_argument("--markdown", action="store_true", help="the per-family counts docs/models.md shows")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.markdown:
        print(markdown(), end="")
        return 0
    wanted = set(args.architectures)
    for fam in families.FAMILIES:
        if fam.rule is None or (wanted and not wanted & set(fam.architectures)):
            continue
        for model_type in fam.facts:
            keys = transformers_keys(model_type)
            if keys is None:
                print(f"{fam.name} ({model_type}): the installed transformers has no such config class")
                continue
            how = families.account(fam, keys)
            print(f"{fam.name} ({model_type}): {len(keys)} keys")
            for key in sorted(keys):
                print(f"  {key:32s} {how.get(key, 'UNACCOUNTED')}")
        theirs = family_sglang_only_keys(fam)
        how = families.account(fam, theirs)
        print(f"{fam.name}: {len(theirs)} keys only SGLang's model file reads")
        for key in sorted(theirs):
            print(f"  {key:32s} {how.get(key, 'UNACCOUNTED')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
