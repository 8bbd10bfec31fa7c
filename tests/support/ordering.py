"""Run order: every test of one module-scoped server group runs in one block, so the group's servers start once.

pytest keeps a module-scoped parameter's tests together by the parameter's index in each parametrize list, not
by its value: a test that parametrizes ``served`` indirectly with its own few families (tests/test_families.py)
lands beside other families' tests of the same index, and pytest tears the group down and starts it again
later (7 groups started two or three times). Registered by tests/conftest.py; runs after pytest's own
reordering and after deselection.
"""

from __future__ import annotations

from typing import List

import pytest

GROUPED = ("served",)  # module-scoped, parametrized fixtures whose every setup starts servers


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: List[pytest.Item]) -> None:
    for argname in GROUPED:
        one_block_per_value(items, argname)


def values_in_order(items: List[pytest.Item], argname: str) -> list:
    """The values of parameter ``argname`` in the order ``items`` run them (each once: one block per value)."""
    return list(dict.fromkeys(item.callspec.params[argname] for item in items
                              if argname in getattr(getattr(item, "callspec", None), "params", {})))


def one_block_per_value(items: List[pytest.Item], argname: str) -> None:
    """Reorder ``items`` in place: the tests with parameter ``argname`` keep the positions they hold, refilled
    with one block per value (in the order values first appear; a block keeps its tests' order)."""
    slots = [i for i, item in enumerate(items) if argname in getattr(getattr(item, "callspec", None), "params", {})]
    blocks: dict = {}
    for i in slots:
        blocks.setdefault(items[i].callspec.params[argname], []).append(items[i])
    for slot, item in zip(slots, [item for block in blocks.values() for item in block]):
        items[slot] = item
