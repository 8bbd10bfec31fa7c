"""Register sglang-r3's hooks with SGLang's HookRegistry so that each one binds or start-up stops.

SGLang's registry swallows a target module's ImportError and goes on without the hook, which for R3
would serve upstream's behaviour under our name; ``register`` resolves each target itself first and
``raise_if_missing`` / ``verify_applied`` stop start-up naming every target that did not bind.
"""

from __future__ import annotations

from typing import Any, Callable, List, Tuple

from sglang_r3.seam.resolve import describe_error, resolve

_registered: List[str] = []
_missing: List[Tuple[str, str]] = []  # (target, why it did not resolve)


class HookTargetError(RuntimeError):
    """A SGLang function or method sglang-r3 hooks is not there (or its module does not import)."""

    def __init__(self, missing):
        self.targets = [t for t, _ in missing]
        lines = ["sglang-r3 refuses to start: it cannot hook these SGLang targets, and without them routing "
                 "capture would be wrong or missing:"]
        lines += [f"  {t}: {why}" for t, why in missing]
        from sglang_r3.seam.versions import SERVED, installed

        lines.append(f"sglang-r3 is written against SGLang {' and '.join(SERVED)} (installed: {installed()}); check the "
                     "installed SGLang (and, on a CPU-only host, that the CPU runtime was prepared before SGLang "
                     "imported sgl-kernel).")
        super().__init__("\n".join(lines))


def register(target: str, hook: Callable, hook_type: Any) -> bool:
    """Register ``hook`` on ``target`` with SGLang's HookRegistry, or record why ``target`` is missing.
    ``hook_type``: SGLang's ``HookType`` or its name (``"around"``, ``"before"``, ``"after"``, ``"replace"``)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if isinstance(hook_type, str):
        hook_type = HookType[hook_type.upper()]

    from sglang_r3.seam.manifest import problem

    try:
        obj = resolve(target)
    except Exception as exc:  # ImportError, AttributeError, or whatever the module raised on import
        if target not in (t for t, _ in _missing):
            _missing.append((target, describe_error(exc)))
        return False
    why = problem(target, obj, kind="hook")  # listed, and the shape our hook was written against
    if why is not None:
        if target not in (t for t, _ in _missing):
            _missing.append((target, why))
        return False
    HookRegistry.register(target, hook, hook_type)
    if target not in _registered:
        _registered.append(target)
    return True


def check_instance(target: str, method: Any) -> None:
    """Before replacing a method on one live object: ``target`` is listed and ``method`` (the object's
    current one) has the shape our wrapper was written against, or start-up stops naming it."""
    from sglang_r3.seam.manifest import problem

    why = problem(target, getattr(method, "__func__", method), kind="instance")
    if why is not None:
        raise HookTargetError([(target, why)])


def check_uses() -> None:
    """Every SGLang name the project calls or reads (manifest kind ``uses``) resolves, with the signature
    it was written against; a missing or changed one stops start-up like a hook target, naming it.
    Run in the process that launches SGLang (the names are the launcher's and the HTTP server's)."""
    from sglang_r3.seam.manifest import by_target, check

    for target, why in check(tuple(e for e in by_target().values() if e.kind in ("uses", "reads") and e.at_start)):
        if target not in (t for t, _ in _missing):
            _missing.append((target, why))


def raise_if_missing() -> None:
    if _missing:
        raise HookTargetError(_missing)


def verify_applied() -> None:
    """After SGLang applied the registered hooks: every target we registered was patched."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    raise_if_missing()
    unapplied = [(t, "registered, but SGLang's HookRegistry did not apply it (see its log above)")
                 for t in _registered if t not in HookRegistry._patched]
    if unapplied:
        raise HookTargetError(unapplied)


def registered() -> List[str]:
    return list(_registered)
