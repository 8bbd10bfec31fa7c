"""``sglang_r3.__version__`` is the version pip recorded for the distribution, pyproject.toml's."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest

import sglang_r3

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_version() -> str:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["version"]


def test_the_package_says_its_installed_version():
    assert sglang_r3.__version__ == importlib.metadata.version("sglang-r3") == _pyproject_version()


def test_a_checkout_that_is_not_installed_reads_pyproject(monkeypatch):
    def not_installed(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert sglang_r3._version() == _pyproject_version()
