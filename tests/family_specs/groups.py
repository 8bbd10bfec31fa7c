"""The tiny checkpoints' servers: each server's flags (``SERVERS``, ``server_flags``), the groups that start
together (``GROUPS``; pytest's ``served`` fixture in tests/test_families.py runs one at a time, starting the next
ones ahead: ``serve_group``) and the groups served on SGLang 0.5.15.post1 too (``RELEASE_FAMILIES``).
"""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence

from tests.family_specs.build import build
from tests.family_specs.specs import FLIPPED, SPECS

# Flags every family server runs with: the user's launch (our launcher, fp32 for exactness), a KV pool
# of a fixed size (sized from free host memory otherwise, which other processes on a shared machine
# move) and a static fraction that keeps SGLang's memory profiling from refusing a model of a few MB
# when other processes allocate during its load.
SERVE_FLAGS = ["--dtype", "float32", "--max-total-tokens", "4096", "--mem-fraction-static", "0.99"]


# MTP speculation as the embedded model runs it (NextN drafts, a chain of 3, 4 draft tokens verified).
MTP_FLAGS = ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
             "--speculative-num-draft-tokens", "4"]

# Linear-attention families: SGLang sizes the recurrent-state pool from free host memory otherwise (GBs for a
# tiny model, which the host's other servers then compete for).
HYBRID_FLAGS = ["--max-mamba-cache-size", "64"]

# server name -> (family, extra flags): every family plain, and DeepSeek-V3 again with MTP speculation on.
SERVED_SPECS = [n for n, f in SPECS.items() if not f.not_served]
SERVERS: Dict[str, tuple] = {**{n: (n, []) for n in SERVED_SPECS}, "deepseek_v3_mtp": ("deepseek_v3", MTP_FLAGS),
                              # GLM-4.7-Flash: one server, MTP speculation on (its main rows against transformers)
                              "glm4_moe_lite": ("glm4_moe_lite", MTP_FLAGS),
                              # GLM-5: the same, its NextN layer drafting through the DSA model's MTP path
                              "glm_moe_dsa": ("glm_moe_dsa", MTP_FLAGS),
                              "deepseek_v32": ("deepseek_v32", MTP_FLAGS),
                              # Kimi-K2.5: its processor is the checkpoint's own code, as the release's is
                              "kimi_k25": ("kimi_k25", ["--trust-remote-code"]),
                              # Intern-S1: its config class is the checkpoint's own code, as the release's is
                              "interns1": ("interns1", ["--trust-remote-code"]),
                              # JoyAI-LLM-Flash: likewise (a stand-in for it)
                              "joyai_llm_flash": ("joyai_llm_flash", ["--trust-remote-code"]),
                              # Ling 2.0: its config class is the checkpoint's own code (a stand-in); MTP speculation
                              # on (its NextN layer drafting)
                              "bailing_moe_v2": ("bailing_moe_v2", MTP_FLAGS + ["--trust-remote-code"]),
                              # ERNIE-4.5: one server, MTP speculation on (its dense MTP layer drafts)
                              "ernie4_5_moe": ("ernie4_5_moe", MTP_FLAGS),
                              # the hybrid (linear-attention) families: a bounded state pool, and MTP speculation
                              # on (their MTP layer drafting): main rows against transformers, as GLM-4.7-Flash's
                              **{n: (n, HYBRID_FLAGS + MTP_FLAGS)
                                 for n in ("qwen3_next", "qwen3_5_moe_text", "qwen3_5_moe")},
                              # Nemotron-H: a bounded state pool, and MTP speculation on (Nemotron-3-Ultra's MTP
                              # head drafting: attention then MoE blocks)
                              "nemotron_h": ("nemotron_h", HYBRID_FLAGS + MTP_FLAGS),
                              # LFM2-MoE: its short convolutions' state pool bounded likewise (unbounded, one
                              # server's scheduler held ~5 GB and was killed for memory beside the suite's others)
                              "lfm2_moe": ("lfm2_moe", HYBRID_FLAGS)}
# A flipped checkpoint is served as its family is, but without MTP speculation: the flip is of the target model.
SERVERS.update({n: (n, [f for f in SERVERS[n[:-8]][1] if f not in MTP_FLAGS])
                for n in SPECS if n.endswith("_flipped")})
# Servers that run together (a test compares them); one group at a time: an idle CPU server holds
# ~2-3 GB of host memory, and the suite's own servers run alongside.
GROUPS: Dict[str, List[str]] = {n: [n] for n in SERVED_SPECS if n != "qwen3_5_moe_text"}
GROUPS["deepseek_v3"] = ["deepseek_v3", "deepseek_v3_mtp"]
# Qwen3.5-MoE as published and its text-only checkpoint: the same text model, two servers starting together.
GROUPS["qwen3_5_moe"] = ["qwen3_5_moe", "qwen3_5_moe_text"]
# Each flipped checkpoint starts with its family (start-ups overlap), on the release the main CI stage serves
# (0.5.23). The 0.5.15.post1 stage serves its families as published, not their flips.
for _base in FLIPPED:
    del GROUPS[f"{_base}_flipped"]
    if importlib.metadata.version("sglang") != "0.5.15.post1":
        next(g for g in GROUPS.values() if _base in g).append(f"{_base}_flipped")


# Groups served on SGLang 0.5.15.post1 too (-m release; CI's 0.5.15.post1 stage): families whose routers 0.5.15 builds
# without a layer id (Mixtral, OLMoE: the adapter files their rows under the layer of the experts beside them) and
# one it numbers; what slime's scripts train on 0.5.15's image that its CPU runtime starts (GLM-4.5 / 4.7, GLM-4.7-Flash
# with MTP speculation, DeepSeek-V3 with it on and off, MiniMax-M2); Qwen2-MoE, whose CPU ops are hooked on both.
RELEASE_FAMILIES = ("mixtral", "olmoe", "qwen3_moe", "minimax_m2", "qwen2_moe", "glm4_moe", "glm4_moe_lite",
                    "deepseek_v3")


def server_flags(name: str) -> List[str]:
    family, extra = SERVERS[name]
    return ["--model-path", str(build(SPECS[family])), *SERVE_FLAGS, *extra]


@dataclass
class ServedGroup:
    family: str
    urls: Dict[str, str]  # server name -> base URL

    @property
    def url(self) -> str:
        return self.urls[self.family]

    @property
    def families(self) -> List[str]:
        """The group's servers that serve a family as it is named (not a second server of it, e.g. with MTP)."""
        return [n for n in self.urls if SERVERS[n][0] == n]


# The groups pytest runs next start while this group's tests run: a CPU server's start-up is mostly one process
# importing, and the tests mostly wait on one server's forward (servers and tests run one thread each), so the
# second core is otherwise idle. Bounded by memory: an idle CPU server holds about 1 GB of host memory of its own,
# and the suite's own servers run alongside, so this group and those started ahead run at most AHEAD_MAX_SERVERS.
AHEAD_MAX_SERVERS = 5
_ahead: Dict[str, Dict[str, Any]] = {}  # group -> its servers, started, not yet waited on


def _start_group(family: str) -> Dict[str, Any]:
    from tests.support.servers import ServerProcess

    return {n: ServerProcess(server_flags(n), env=SPECS[SERVERS[n][0]].server_env).start() for n in GROUPS[family]}


def serve_group(family: str, then: Sequence[str] = ()):
    """Start the group's servers together (start-ups overlap), yield them ready, stop them. ``then``: the groups
    that run next, in order; as many as fit start once these are ready (each waited on when its turn comes)."""
    procs = _ahead.pop(family, None) or _start_group(family)
    try:
        urls = {n: p.wait_ready().url for n, p in procs.items()}
        alive = len(procs) + sum(len(g) for g in _ahead.values())
        for group in (g for g in then if g != family and g not in _ahead):
            if alive + len(GROUPS[group]) > AHEAD_MAX_SERVERS:
                break
            _ahead[group] = _start_group(group)
            alive += len(GROUPS[group])
        yield ServedGroup(family, urls)
    finally:
        for p in procs.values():
            p.stop()


def stop_ahead() -> None:
    """Stop the servers of groups started ahead that never ran (a run cut short, or ``-x``)."""
    while _ahead:
        for p in _ahead.popitem()[1].values():
            p.stop()
