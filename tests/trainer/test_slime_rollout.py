"""slime's path fails closed by name: a sample whose routing cannot be replayed stops the step, naming slime's
sample index, the code and the fix, before slime's own code meets it with a message that names neither.

slime is not on PyPI: ``slime_rollout_reference`` (slime's ``Sample`` and its ``_apply_meta_info``, its
``generate`` / ``generate_rollout``, ``RolloutManager``'s conversion and split, ``validate_rollout_routed_experts
_for_replay``), ``slime_actor_reference`` and ``slime_reference`` are stand-ins written from THUDM/slime 624b824,
registered under slime's module names. The rollout server's answers are built by sglang-r3's own response
builder (``sglang_r3.serving.response.build``: upstream's ``routed_experts``, or ``routing_error``), for the
payload slime's ``generate`` sends.

Oracles: slime's own paths (the stand-ins, without our functions) show what happens today: ``torch.as_tensor
(None)`` in ``_convert_samples_to_train_data``, every sample's rows dropped when the first has none, the shapes-only
assertion of ``prepare_routed_experts_for_routing_replay``, a rollout across a weight update trained silently.
With ``--rollout-function-path sglang_r3.trainer.slime.generate_rollout`` (and the installed fill on the trainer
side) the same rollouts are refused with the sample's index, the code and the fix.
"""

from __future__ import annotations

import collections

import numpy as np
import pybase64
import pytest
import torch

import slime_reference as slime
import slime_rollout_reference as srr
from slime_actor_helpers import (  # noqa: F401  (fixtures)
    MICRO_BATCH_INDICES,
    NUM_MICROBATCHES,
    hf_checkpoints,
    slime_trainer,
    start_actor,
)
from sglang_r3.core.codes import ROUTING_ERROR_CODES
from sglang_r3.core.layout import ROLE_DENSE, layout_from_model_path
from sglang_r3.core.record import RecordError
from sglang_r3.trainer.slime import (
    ERRORS_ATTR,
    ROLLOUT_FUNCTION_PATH,
    ROUTING_ERROR_FIXES,
    SlimeInstallError,
    SlimeSampleError,
    check_rollout,
    watch_responses,
)

pytestmark = pytest.mark.fast

torch.set_num_threads(1)

PROMPT_LENGTHS = [5, 7, 9, 4, 6]  # sample i's prompt starts with token i (the server's key)
NEW_TOKENS = 4


class Server:
    """The rollout server's ``/generate`` for slime's payload: ``NEW_TOKENS`` completion tokens with log
    probabilities, SGLang's ``weight_version``, and the routing of prompt + completion as sglang-r3 builds it
    (``response.build``, upstream's field asked): ``routed_experts``, or ``routing_error`` for the samples in
    ``errors`` (sample index -> code). ``versions[i]``: the weight version of sample i's turns, in order."""

    def __init__(self, layout, errors=None, versions=None):
        self.layout, self.errors, self.versions = layout, dict(errors or {}), dict(versions or {})
        self.turns = collections.Counter()

    def __call__(self, payload):
        from sglang_r3.serving.capture.payload import EncodedRouting, encode_payload
        from sglang_r3.serving.response import Asked, build, unavailable

        ids = [int(t) for t in payload["input_ids"]]
        sample, turn = ids[0], self.turns[ids[0]]
        self.turns[sample] += 1
        new = [(7 * sum(ids) + 13 * j + len(ids)) % 128 for j in range(NEW_TOKENS)]
        version = self.versions.get(sample, ["1"] * (turn + 1))[turn]
        meta = {"finish_reason": {"type": "stop"}, "weight_version": version, "prompt_tokens": len(ids),
                "completion_tokens": len(new), "output_token_logprobs": [[-0.5, t, None] for t in new]}
        if payload.get("return_routed_experts"):
            rows, moe, k = len(ids) + len(new) - 1, len(self.layout.moe_layer_ids), self.layout.topk
            code = self.errors.get(sample)
            if code is None:
                rng = np.random.default_rng(sum(ids) + len(ids))
                experts = np.stack([rng.permutation(self.layout.num_experts)[:k] for _ in range(rows * moe)])
                experts, error = experts.reshape(rows, moe, k).astype(np.uint8), None
            else:
                experts = np.zeros((0, moe, k), np.uint8)
                error = unavailable(code, f"{rows} of {rows} rows have no routing ({code})", rows)
            raw = pybase64.b64encode(encode_payload(0, experts, error=error)).decode("ascii")
            build(meta, EncodedRouting(raw), Asked(upstream=True), self.layout)
        return {"text": "", "meta_info": meta}


def data_source(rollout_id):
    g = torch.Generator().manual_seed(rollout_id)
    return [[srr.Sample(group_index=i, index=i, prompt=[i] + torch.randint(0, 128, (n - 1,), generator=g).tolist())]
            for i, n in enumerate(PROMPT_LENGTHS)]


@pytest.fixture
def rollout_process(slime_trainer):
    """slime's rollout process beside its training actor: the stand-ins under slime's module names."""
    undo = srr.install_rollout()
    try:
        yield
    finally:
        undo()
        srr.SERVER = None


def layout_args(layout, **overrides):
    kw = dict(num_layers=layout.num_hidden_layers, moe_router_topk=layout.topk,
              moe_layer_freq=[0 if l.role == ROLE_DENSE else 1 for l in layout.layers[: layout.num_hidden_layers]])
    kw.update(overrides)
    return kw


def rollout(hf_checkpoints, server, ours=True, **overrides):
    """slime's RolloutManager.generate(0) against ``server``; ``ours``: with our --rollout-function-path."""
    layout = layout_from_model_path(hf_checkpoints[1])
    kw = dict(hf_checkpoint=hf_checkpoints[1], mtp_num_layers=1, **layout_args(layout))
    if ours:
        kw["rollout_function_path"] = ROLLOUT_FUNCTION_PATH
    kw.update(overrides)
    srr.SERVER = server
    manager = srr.RolloutManager(srr.rollout_args(**kw), data_source, MICRO_BATCH_INDICES, NUM_MICROBATCHES)
    return manager


@pytest.fixture
def layout(hf_checkpoints):
    return layout_from_model_path(hf_checkpoints[1])


# -- routing_error: today, and with our rollout function -------------------------------------------------------

def test_slimes_own_rollout_meets_a_later_samples_routing_error_with_torch_as_tensor_none(
    rollout_process, hf_checkpoints, layout
):
    manager = rollout(hf_checkpoints, Server(layout, errors={3: "capture_off"}), ours=False)
    with pytest.raises(RuntimeError, match=r"^Could not infer dtype of NoneType$"):  # no sample, no code
        manager.generate(0)


def test_slimes_own_rollout_drops_every_samples_rows_when_the_first_has_a_routing_error(
    rollout_process, hf_checkpoints, layout
):
    """The first sample (index 0) without rows: slime keeps no sample's rows, and its own fill says only that the
    key is required. The installed fill says why and how to have the sample named."""
    data = rollout(hf_checkpoints, Server(layout, errors={0: "missing_rows"}), ours=False).generate(0)
    assert "rollout_routed_experts" not in data and len(data["tokens"]) == len(PROMPT_LENGTHS)
    actor = start_actor(hf_checkpoints, 1, custom_megatron_init_path=None)  # slime's own fill
    with pytest.raises(ValueError, match=r"^rollout_routed_experts is required in rollout_data when "
                                         r"use_rollout_routing_replay is set\.$"):
        actor.train_actor(0, dict(data))
    actor = start_actor(hf_checkpoints, 1)  # with our install
    with pytest.raises(RecordError, match=r"keeps the rollout's routed_experts only when its first sample has them .*"
                                          r"routing_error \(one of missing_rows, capture_off, image_attention, "
                                          r"mtp_drafted_on_prefill, store_full, .*--rollout-function-path sglang_r3\.trainer\.slime\."
                                          r"generate_rollout"):
        actor.train_actor(0, dict(data))


@pytest.mark.parametrize("index", [0, 3], ids=["first_sample", "later_sample"])
@pytest.mark.parametrize("code", ROUTING_ERROR_CODES)
def test_our_rollout_function_refuses_a_routing_error_naming_sample_code_and_fix(
    rollout_process, hf_checkpoints, layout, code, index
):
    manager = rollout(hf_checkpoints, Server(layout, errors={index: code}))
    with pytest.raises(SlimeSampleError) as e:
        manager.generate(0)
    (problem,) = e.value.problems
    assert (problem.index, problem.code, problem.fix) == (index, code, ROUTING_ERROR_FIXES[code])
    msg = str(e.value)
    assert msg.startswith(f"R3 (slime): 1 of {len(PROMPT_LENGTHS)} samples of rollout 0 cannot be replayed")
    rows = PROMPT_LENGTHS[index] + NEW_TOKENS - 1
    assert (f"sample {index} [{code}]: its /generate response carried routing_error {code} ({rows} of {rows} rows "
            f"missing), so it has no routed_experts: {rows} of {rows} rows have no routing ({code}). "
            f"Fix: {ROUTING_ERROR_FIXES[code]}") in msg


def test_every_routing_error_code_has_its_fix():
    assert set(ROUTING_ERROR_FIXES) == set(ROUTING_ERROR_CODES)


def test_several_refused_samples_are_named_together(rollout_process, hf_checkpoints, layout):
    manager = rollout(hf_checkpoints, Server(layout, errors={1: "capture_off", 4: "image_attention"}))
    with pytest.raises(SlimeSampleError, match=r"2 of 5 samples .*sample 1 \[capture_off\].*; "
                                               r"sample 4 \[image_attention\]") as e:
        manager.generate(0)
    assert [(p.index, p.code) for p in e.value.problems] == [(1, "capture_off"), (4, "image_attention")]


# -- the identity slime can check without a record ---------------------------------------------------------------

TOOL_SAMPLES = {4}


async def tool_after_last_turn(args, sample, sampling_params):
    """A --custom-generate-function-path agent: slime's generate, then (for TOOL_SAMPLES) a tool's output appended
    as slime's API says (trainable=False, no meta_info), with no generated turn after it."""
    sample = await srr.generate(args, sample, sampling_params)
    if sample.index in TOOL_SAMPLES:
        sample.append_response_tokens(args, tokens=[5, 6, 7], trainable=False)
    return sample


async def two_turns(args, sample, sampling_params):
    """A two-turn --custom-generate-function-path: the second request sends the whole conversation so far."""
    sample = await srr.generate(args, sample, sampling_params)
    return await srr.generate(args, sample, sampling_params)


def test_rows_other_than_tokens_minus_one_are_refused_by_sample_index(rollout_process, hf_checkpoints, layout):
    gen = dict(custom_generate_function_path="test_slime_rollout.tool_after_last_turn")
    data = rollout(hf_checkpoints, Server(layout), ours=False, **gen).generate(0)  # slime's rollout lets it through
    tokens, routed = data["tokens"][4], data["rollout_routed_experts"][4]
    assert routed.shape[0] == len(tokens) - 1 - 3
    with pytest.raises(AssertionError, match=r"^torch\.Size\(\[\d+, 4, 4\]\), torch\.Size\(\[\d+\]\)$"):
        slime.prepare_routed_experts_for_routing_replay([routed], [tokens], num_experts=layout.num_experts)
    want = (r"sample 4 \[rows\]: routed_experts has 9 rows, but the sample has 13 tokens \(12 rows expected, one per "
            r"token but the last\): tokens were appended after the last /generate response that returned routing "
            r"\(tool or environment tokens added without meta_info\).*\. Fix: keep sample\.tokens exactly")
    actor = start_actor(hf_checkpoints, 1)  # the installed fill names slime's sample index too
    with pytest.raises(SlimeSampleError, match=r"1 of 5 samples of this data-parallel rank's rollout_data .*" + want):
        actor.train_actor(0, data)
    with pytest.raises(SlimeSampleError, match=r"1 of 5 samples of rollout 0 .*" + want):
        rollout(hf_checkpoints, Server(layout), **gen).generate(0)


def test_a_sample_generated_across_a_weight_update_is_refused_where_slime_trains_it(
    rollout_process, hf_checkpoints, layout
):
    gen = dict(custom_generate_function_path="test_slime_rollout.two_turns")
    server = lambda: Server(layout, versions={1: ["1", "2"]})  # noqa: E731  (sample 1's second turn: new weights)
    data = rollout(hf_checkpoints, server(), ours=False, **gen).generate(0)
    assert all(r.shape[0] == len(t) - 1 for r, t in zip(data["rollout_routed_experts"], data["tokens"]))
    actor = start_actor(hf_checkpoints, 1)
    actor.train_actor(0, data)  # nothing in slime, nor the trainer (no weight_versions there), refuses it
    with pytest.raises(SlimeSampleError, match=r"1 of 5 samples of rollout 0 .*sample 1 \[weight_versions\]: it was "
                                               r"generated under weight versions \['1', '2'\].*Fix: regenerate it "
                                               r"under one version; if resuming .* pass slime's --partial-rollout"):
        rollout(hf_checkpoints, server(), **gen).generate(0)
    # With --partial-rollout the user asked for samples resumed under new weights: accepted (each row is what its own
    # forward routed), the rows checked all the same.
    from sglang_r3.trainer.slime.installer import sample_problems

    again = rollout(hf_checkpoints, server(), ours=False, **gen).generate(0)  # (the actor consumed ``data``)
    tokens, routed = again["tokens"][1], again["rollout_routed_experts"][1]
    assert sample_problems(1, len(tokens), routed, layout, weight_versions=["1", "2"], mixed_versions=True) == []
    assert [p.code for p in sample_problems(1, len(tokens), routed[:-1], layout, weight_versions=["1", "2"],
                                            mixed_versions=True)] == ["rows"]


def test_layer_count_and_topk_other_than_the_layouts_are_refused(rollout_process, hf_checkpoints, layout):
    """--num-layers 8 --moe-router-topk 2 for a 4-layer top-4 checkpoint: slime reshapes the same ints into
    [T-1, 8, 2] (its count check holds); ours names the layout's shape and slime's two flags."""
    wrong = dict(num_layers=8, moe_router_topk=2, moe_layer_freq=[0, 0] + [1] * 6)
    data = rollout(hf_checkpoints, Server(layout), ours=False, **wrong).generate(0)
    assert tuple(data["rollout_routed_experts"][0].shape[1:]) == (8, 2)
    want = (r"sample 0 \[shape\]: routed_experts has shape \(8, 8, 2\), but the layout of --hf-checkpoint "
            r"\(Glm4MoeForCausalLM, [0-9a-f]{16}\) has 4 layers and top-4: \[T-1, 4, 4\] expected")
    with pytest.raises(SlimeSampleError, match=r"5 of 5 samples of rollout 0 .*" + want +
                                               r"; slime reshapes the array with --num-layers 8 and "
                                               r"--moe-router-topk 2\. Fix: train the checkpoint"):
        rollout(hf_checkpoints, Server(layout), **wrong).generate(0)
    actor = start_actor(hf_checkpoints, 1)
    with pytest.raises(SlimeSampleError, match=r"5 of 5 samples of this data-parallel rank's .*" + want):
        actor.train_actor(0, data)


def test_a_sample_without_rows_and_without_routing_error_is_named(rollout_process, hf_checkpoints, layout):
    """A custom generate that dropped return_routed_experts: no rows, and nothing the server said."""
    with pytest.raises(SlimeSampleError, match=r"sample 0 \[no_routed_experts\]: it has no routed_experts, and no "
                                               r"/generate response of it carried routing_error\. Fix: send "
                                               r"return_routed_experts"):
        check_rollout(srr.rollout_args(hf_checkpoint=hf_checkpoints[1]), [[srr.Sample(index=0, tokens=[1, 2, 3])]], 7)


# -- what our rollout function leaves as it was ------------------------------------------------------------------

def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if torch.is_tensor(a):
        return torch.equal(a, b)
    return a == b


def test_a_clean_rollout_is_slimes_own_and_trains(rollout_process, hf_checkpoints, layout):
    theirs = rollout(hf_checkpoints, Server(layout), ours=False).generate(0)
    ours = rollout(hf_checkpoints, Server(layout)).generate(0)
    assert _same(ours, theirs)
    actor = start_actor(hf_checkpoints, 1)
    actor.train_actor(0, ours)
    assert "rollout_routed_experts" not in ours  # the fill took them, as slime's does


def test_evaluation_rollouts_are_not_checked(rollout_process, hf_checkpoints, layout):
    manager = rollout(hf_checkpoints, Server(layout, errors={2: "capture_off"}))
    out = manager.eval(0)
    samples = out.data["eval"]["samples"]
    assert getattr(samples[2], ERRORS_ATTR)[0]["code"] == "capture_off"  # kept, not acted on: nothing is replayed


def test_the_kept_routing_error_survives_slimes_debug_rollout_save_and_load(rollout_process, hf_checkpoints, layout):
    """slime's --save-debug-rollout-data writes Sample.to_dict(), --load-debug-rollout-data reads from_dict: the
    routing_error rides along, so a replayed debug rollout is refused the same way."""
    watch_responses()
    s = srr.Sample(index=6, tokens=[1, 2, 3, 4])
    s.append_response_tokens(srr.rollout_args(), tokens=[9], log_probs=[-1.0],
                             meta_info={"finish_reason": {"type": "stop"}, "weight_version": "3",
                                        "routing_error": {"code": "capture_off", "message": "off", "missing_rows": 4,
                                                          "rows": 4}})
    loaded = srr.Sample.from_dict(s.to_dict())
    with pytest.raises(SlimeSampleError, match=r"sample 6 \[capture_off\]: .*\(4 of 4 rows missing\)"):
        check_rollout(srr.rollout_args(hf_checkpoint=hf_checkpoints[1]), [loaded], 0)


def test_watching_is_once_per_process_and_refuses_a_slime_without_apply_meta_info(rollout_process):
    watch_responses()
    watched = srr.Sample._apply_meta_info
    watch_responses()
    assert srr.Sample._apply_meta_info is watched and watched._r3_slime_original is not watched
    srr.Sample._apply_meta_info = lambda self, meta_info: None  # another slime's (the fixture gives slime's back)
    with pytest.raises(SlimeInstallError, match=r"slime\.utils\.types\.Sample has no _apply_meta_info\('self', "
                                                r"'args', 'meta_info'\)"):
        watch_responses()


def test_our_rollout_function_without_r3_is_slimes_own(rollout_process, hf_checkpoints, layout):
    manager = rollout(hf_checkpoints, Server(layout, errors={3: "capture_off"}), use_rollout_routing_replay=False,
                      use_routing_replay=False)
    data = manager.generate(0)  # slime sends no return_routed_experts: no rows, nothing to check
    assert "rollout_routed_experts" not in data
    assert not hasattr(srr.Sample._apply_meta_info, "_r3_watching")  # nothing of slime's was wrapped
