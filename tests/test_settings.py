"""``sglang_r3.core.settings``: every SGLANG_R3_* variable parsed once per process, bad values named, published
values seen by this process and its children; the capture-needs table our launcher adds from."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sglang_r3.core import settings
from sglang_r3.core.settings import Settings, SettingsError, StoreSettings, parse

pytestmark = pytest.mark.fast

NAMES = [settings.ENABLED, settings.CPU, settings.FORCE_CPU, settings.CACHE, settings.DEFAULT_ROUTING,
         settings.HEALTH, settings.RECORD_STORE, settings.RAY_NAMESPACE, settings.ENGINE_ID,
         settings.ENGINE_INCARNATION, settings.RAY_ADDRESS]


def test_every_name_is_ours_and_described():
    assert all(n.startswith("SGLANG_R3_") for n in NAMES)
    assert sorted(settings.MEANING) == sorted(NAMES)


def test_an_empty_environment_is_every_default():
    assert parse({}) == Settings()
    assert parse({"PATH": "/bin", "SGLANG_USE_CPU_ENGINE": "1"}) == Settings()  # not ours


SWITCHES = [(settings.ENABLED, "enabled"), (settings.CPU, "cpu"), (settings.FORCE_CPU, "force_cpu"),
            (settings.HEALTH, "health")]
ON = ["1", "true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", " 1", "true\n"]
OFF = ["0", "false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", "", " "]


@pytest.mark.parametrize("name, field", SWITCHES)
def test_each_switch_takes_the_usual_spellings_in_any_case(name, field):
    assert all(getattr(parse({name: v}), field) is True for v in ON)
    assert all(getattr(parse({name: v}), field) is False for v in OFF)
    assert getattr(parse({}), field) is False  # unset


@pytest.mark.parametrize("name, field", SWITCHES)
@pytest.mark.parametrize("value", ["2", "-1", "y", "n", "enable", "disabled", "onn", "true1", "1.0", "t", "f"])
def test_each_switch_refuses_any_other_value_naming_the_variable(name, field, value):
    with pytest.raises(SettingsError) as info:
        parse({name: value})
    assert (info.value.name, info.value.value) == (name, value)
    assert str(info.value).startswith(
        f"{name} must be 1/true/yes/on (on) or 0/false/no/off / unset (off), in any case, got {value!r} ({name}: ")


def test_a_bad_switch_is_named_by_the_opt_in_launch_check(monkeypatch):
    # SGLang's own launchers (the user sets SGLANG_R3_ENABLED): the variable is named with what it takes.
    from sglang_r3.serving.adapter.opt_in import missing_settings

    monkeypatch.setenv(settings.ENABLED, "enable")
    settings.current.cache_clear()
    try:
        (missing,) = missing_settings(object())  # read before the configuration: what it means depends on it
    finally:
        monkeypatch.undo()
        settings.current.cache_clear()
    assert missing.flag == f"{settings.ENABLED} (environment variable)"
    assert missing.reason.startswith("must be 1/true/yes/on (on) or 0/false/no/off / unset (off), in any case, "
                                     "got 'enable'; it says routing capture on")


def test_cache_folder():
    assert parse({settings.CACHE: "/tmp/r3"}).cache == "/tmp/r3"
    assert parse({settings.CACHE: ""}).cache is None


@pytest.mark.parametrize("value", settings.DEFAULT_ROUTING_CHOICES)
def test_default_routing_choices(value):
    assert parse({settings.DEFAULT_ROUTING: value}).default_routing == value


def test_a_bad_default_routing_is_named_with_its_choices():
    with pytest.raises(SettingsError) as info:
        parse({settings.DEFAULT_ROUTING: "everything"})
    assert str(info.value).startswith("SGLANG_R3_DEFAULT_ROUTING must be main|main+mtp|ref, got 'everything'")
    assert info.value.expected == "main|main+mtp|ref"


def test_store_settings_only_with_a_store_and_defaults_for_the_rest():
    assert parse({settings.ENGINE_ID: "e0"}).store is None  # no store: not a fleet engine
    assert parse({settings.RECORD_STORE: "s"}).store == StoreSettings(
        store="s", namespace="sglang_r3", engine="s", incarnation=0, ray_address="auto")
    full = StoreSettings(store="s", namespace="ns", engine="f-e1", incarnation=3, ray_address="10.0.0.1:6379")
    assert parse(full.environ()).store == full  # what a fleet engine actor publishes, read back


def test_a_bad_incarnation_is_named():
    with pytest.raises(SettingsError, match="SGLANG_R3_ENGINE_INCARNATION must be an integer, got 'two'"):
        parse({settings.RECORD_STORE: "s", settings.ENGINE_INCARNATION: "two"})


def _clean(monkeypatch):
    """Our variables unset, and restored after the test (publish writes os.environ)."""
    for name in NAMES:
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


def test_current_is_read_once_and_publish_reads_again(monkeypatch):
    _clean(monkeypatch)
    first = settings.current()
    monkeypatch.setenv(settings.DEFAULT_ROUTING, "main")
    assert settings.current() is first  # read once per process
    assert settings.publish({settings.DEFAULT_ROUTING: "main+mtp"}).default_routing == "main+mtp"
    assert settings.current().default_routing == "main+mtp" == os.environ[settings.DEFAULT_ROUTING]


def test_publish_refuses_a_name_that_is_not_ours():
    with pytest.raises(KeyError, match="not an sglang-r3 setting: SGLANG_R3_ENABLE"):
        settings.publish({"SGLANG_R3_ENABLE": "1"})
    assert "SGLANG_R3_ENABLE" not in os.environ


def test_published_settings_reach_a_child_process(monkeypatch):
    _clean(monkeypatch)
    store = StoreSettings(store="s", namespace="ns", engine="e", incarnation=2, ray_address="a:1")
    settings.publish({settings.ENABLED: "1", settings.DEFAULT_ROUTING: "ref"}, **store.environ())
    code = ("from sglang_r3.core import settings; s = settings.current(); "
            "print(s.enabled, s.default_routing, s.store.engine, s.store.incarnation, s.cpu)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["True", "ref", "e", "2", "False"]


# -- the settings capture needs ----------------------------------------------------------------------------


def test_capture_needs_table_is_what_our_launcher_adds():
    flags = [n.flag for n in settings.CAPTURE_NEEDS]
    assert flags == ["--enable-return-routed-experts", "--device cpu", "--attention-backend torch_native",
                     "--disable-overlap-schedule", "--disable-cuda-graph", "--disable-hybrid-swa-memory"]
    assert [n.flag for n in settings.flags_to_add(cpu=False)] == ["--enable-return-routed-experts"]
    assert [n.flag for n in settings.flags_to_add(cpu=True)] == flags  # the hybrid-SWA one too, model unknown
    assert {n.when for n in settings.CAPTURE_NEEDS} == {settings.ALWAYS, settings.ON_CPU, settings.ON_CPU_HYBRID_SWA}


def test_each_need_says_whether_a_resolved_record_meets_it():
    class Cfg:
        enable_return_routed_experts = True
        device = "cpu"
        attention_backend = "torch_native"
        decode_attention_backend = prefill_attention_backend = None
        disable_overlap_schedule = disable_cuda_graph = disable_hybrid_swa_memory = True
        cuda_graph_config = None

    assert all(n.met(Cfg) for n in settings.CAPTURE_NEEDS)
    Cfg.device, Cfg.decode_attention_backend = "cuda", "triton"
    unmet = {n.flag: n.why(Cfg) for n in settings.CAPTURE_NEEDS if not n.met(Cfg)}
    assert list(unmet) == ["--device cpu", "--attention-backend torch_native"]
    assert unmet["--device cpu"].endswith("(device: 'cuda')")
    assert unmet["--attention-backend torch_native"].endswith("(resolved: torch_native, triton)")
