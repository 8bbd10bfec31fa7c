"""What the GPU kit holds, and why every requirement of SGLang 0.5.15.post1 it does not hold may stay behind.

Data only (no downloads, no imports beyond the standard library): ``benchmarks.gpu.kit`` builds from it and
``tests/test_gpu_kit.py`` checks it against the requirement lines the build read (``requires.json`` beside this
file, rewritten by every build: a build that reads other lines fails until the new file is committed).

Every requirement (``Requires-Dist`` without an extra, markers taken for CPython 3.12 on Linux x86_64) of every
wheel in the kit is one of: in ``KIT`` (at a version it allows), on the host (``HOST``), replaced by a named
stand-in (``STAND_INS``), or named in ``NOT_NEEDED`` with the reason it is not imported on the kit's path.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

SGLANG = "0.5.15.post1"  # slime's release (shared/README.md, "SGLang 0.5.15.post1 -- what slime's image runs")
PYTHON = "3.12"  # the host's CPython (3.12.3)
# SGLang 0.5.15.post1 is a cp312 manylinux_2_34 wheel; the host's glibc takes it (Ubuntu 24.04's is 2.39).
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "any")
SIZE_LIMIT_MIB = 60  # the host takes at most 64 MiB per run, the repository (~3 MiB) included
ARCHIVE = "sglang-r3-gpu-kit.tar.xz"
KIT_DIR = "sglang-r3-gpu-kit"  # the archive's one top folder; its site/ goes on PYTHONPATH
OWN = "sglang-r3"  # built here as a wheel (its dist-info carries the sglang.srt.plugins entry point)

# distribution -> (version, why it comes along). Downloaded from the registry as wheels, --no-deps.
KIT: Dict[str, Tuple[str, str]] = {
    "sglang": (SGLANG, "the release slime's image runs; pins torch 2.11.0, the host's"),
    "sglang-kernel": ("0.4.4", "SGLang's pin, imported unconditionally on CUDA; trimmed (KERNEL_DROP)"),
    "transformers": ("5.12.1", "SGLang's pin: the host's 5.17 stops SGLang 0.5.15 at import ('qwen3_asr' is already used)"),
    "tokenizers": ("0.22.2", "transformers 5.12.1 wants tokenizers <= 0.23.0 (0.23.0 is not published)"),
    "apache-tvm-ffi": ("0.1.11", "SGLang's pin: its JIT kernels (silu_and_mul, rope, KV store, ...) build with nvcc"),
    "orjson": ("3.13.0", "SGLang's request parser and responses"),
    "pybase64": ("1.5.1", "SGLang's responses; sglang_r3.serving.capture's transport"),
    "fastapi": ("0.165.0", "SGLang's HTTP server"),
    "annotated-doc": ("0.0.7", "fastapi 0.165"),
    "starlette": ("1.10.0", "fastapi"),
    "opentelemetry-api": ("1.45.3", "fastapi 0.165"),
    "python-multipart": ("0.0.34", "fastapi 0.165; SGLang's requirement"),
    "uvicorn": ("0.55.0", "SGLang's HTTP server"),
    "pydantic": ("2.14.4", "SGLang's protocol types, fastapi"),
    "pydantic-core": ("2.50.5", "pydantic 2.14.4's pin"),
    "annotated-types": ("0.8.0", "pydantic"),
    "typing-inspection": ("0.4.5", "pydantic"),
    "pyzmq": ("27.3.0", "SGLang's inter-process queues"),
    "msgspec": ("0.23.0", "SGLang's IO structs"),
    "setproctitle": ("1.3.8", "SGLang names its processes"),
    "partial-json-parser": ("0.2.1.1.post7", "SGLang's function-call parsers, imported by the OpenAI entry points"),
    "dill": ("0.4.1", "sglang.srt.sampling.custom_logit_processor"),
    "openai": ("2.6.1", "SGLang's pin (a newer openai pulls httpx2)"),
    "jiter": ("0.19.0", "openai"),
    "distro": ("1.9.0", "openai; SGLang's requirement"),
    "sniffio": ("1.3.1", "openai"),
    "jsonschema": ("4.26.0", "sglang.srt.entrypoints.openai.serving_chat"),
    "referencing": ("0.37.0", "jsonschema"),
    "rpds-py": ("2026.9.1", "jsonschema's referencing"),
    "jsonschema-specifications": ("2025.9.1", "jsonschema"),
    "compressed-tensors": ("0.18.0", "SGLang's quantization registry imports it at load"),
    "loguru": ("0.7.3", "compressed-tensors"),
    "gguf": ("0.19.0", "SGLang's model loader"),
    "soundfile": ("0.13.1", "SGLang's pin; its audio helpers import it"),
    "cffi": ("2.1.1", "soundfile"),
    "pycparser": ("3.12", "cffi"),
    "ipython": ("9.19.1", "sglang/__init__ -> sglang.utils: from IPython.display import HTML, display"),
    "traitlets": ("5.16.1", "ipython"),
    "megatron-core": ("0.16.1", "benchmarks.gpu_check's replay check (as carried to the H200 on 2026-12-04)"),
}

# sglang-kernel 0.4.4's files left out: an H100 / H200 loads sm90/common_ops and spatial_ops only.
KERNEL_DROP = ("sgl_kernel/flash_ops.abi3.so",  # FA3 only, 1.76 GB unpacked; SGLang serves triton attention here
               "sgl_kernel/flashmla_ops.abi3.so",  # FlashMLA (DeepSeek MLA); flash_mla.py imports it guarded
               "sgl_kernel/sm100/")  # Blackwell's common_ops

# distribution -> (version it claims, top-level modules, why the real one stays behind). A stand-in imports
# (any submodule, any attribute) and raises StandInCalled naming itself when anything of it is called.
STAND_INS: Dict[str, Tuple[str, Tuple[str, ...], str]] = {
    "flashinfer-python": ("0.6.12", ("flashinfer",),
                          "13 MiB of Python, 75 MB of cutlass-dsl and 427 MiB of cubins; imported at module level by "
                          "flashinfer.sampling / flashinfer.prefill users, never called with "
                          "SGLANG_IS_FLASHINFER_AVAILABLE=false, --sampling-backend pytorch, --attention-backend triton"),
    "nvidia-cutlass-dsl": ("4.5.2", ("cutlass",),
                           "imported only on DeepSeek-V3.2's DSA path (deepseek_v2 -> dsa_indexer -> jit_kernel.dsa)"),
}
STANDIN_LOCAL = "sglangr3.standin"  # the stand-ins' local version label: 0.6.12+sglangr3.standin

# The GPU host's image ('cuda'), as the device tool lists its Python packages (KINDS.md, "Python packages already
# there", read on a machine running it on 2026-11-17). benchmarks.gpu.rehearse builds a venv of exactly these
# (those the kit does not bring); tests/test_gpu_kit.py holds every HOST entry to this list.
HOST_IMAGE: Tuple[str, ...] = (
    "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal", "annotated-doc", "anyio",
    "attrs", "botorch", "build", "certifi", "charset-normalizer", "chex", "click", "cloudpickle", "cmake",
    "colorama", "contourpy", "coverage", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit",
    "cupy-cuda13x", "cycler", "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet", "filelock",
    "flatbuffers", "flax", "fonttools", "formulaic", "frozenlist", "fsspec", "gpytorch", "grpcio", "h11", "h5py",
    "hf-xet", "httpcore", "httpx", "huggingface-hub", "humanize", "hypothesis", "idna", "imageio", "iniconfig",
    "interface-meta", "jax", "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib", "jaxtyping", "jinja2", "joblib",
    "kiwisolver", "lazy-loader", "lightning", "lightning-utilities", "linear-operator", "lineax", "llvmlite", "lxml",
    "markdown", "markdown-it-py", "markupsafe", "matplotlib", "mdurl", "meson", "ml-dtypes", "mpi4py", "mpmath",
    "msgpack", "multidict", "multipledispatch", "mypy-extensions", "nanobind", "narwhals", "networkx", "ninja",
    "numba", "numba-cuda", "numpy", "numpyro", "nvidia-cublas", "nvidia-cuda-cupti", "nvidia-cuda-nvrtc",
    "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-cufft", "nvidia-cufile", "nvidia-curand", "nvidia-cusolver",
    "nvidia-cusparse", "nvidia-cusparselt-cu13", "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nvjitlink",
    "nvidia-nvshmem-cu13", "nvidia-nvtx", "onnx", "onnx-ir", "onnxruntime", "onnxscript", "opencv-python-headless",
    "optax", "opt-einsum", "opt-einsum-fx", "optimistix", "orbax-checkpoint", "packaging", "pandas", "pathspec",
    "patsy", "peft", "pillow", "pip", "pluggy", "portalocker", "prometheus-client", "propcache", "protobuf",
    "psutil", "pyarrow", "pybind11", "py-cpuinfo", "pygments", "pyparsing", "pyproject-hooks", "pyre-extensions",
    "pytest", "pytest-benchmark", "pytest-cov", "pytest-mock", "pytest-timeout", "pytest-xdist", "python-dateutil",
    "pytorch-lightning", "pyyaml", "regex", "requests", "rich", "sacrebleu", "safetensors", "scikit-build-core",
    "scikit-image", "scikit-learn", "scipy", "seaborn", "sentencepiece", "sentence-transformers", "setuptools",
    "shellingham", "simplejson", "six", "sortedcontainers", "statsmodels", "sympy", "tabulate", "tensorboard",
    "tensorboard-data-server", "tensorstore", "threadpoolctl", "tifffile", "tiktoken", "timm", "tokenizers", "toolz",
    "torch", "torchaudio", "torchdiffeq", "torch-geometric", "torchmetrics", "torchvision", "tqdm", "transformers",
    "treescope", "triton", "typer", "typing-extensions", "typing-inspect", "urllib3", "uvloop", "wadler-lindig",
    "werkzeug", "wheel", "wrapt", "xarray", "xxhash", "yarl", "zipp",
)

# What the bare GPU host has: distribution -> version where a requirement's bound is checked against it, None
# where only presence is known. HOST_NAMED: named in shared/README.md ("A GPU run of SGLang 0.5.15.post1 fits a
# bare GPU host": CPython 3.12.3 in /opt/torch/.venv, torch 2.11.0+cu130, triton 3.6.0, transformers 5.17.0 --
# shadowed by the kit's 5.12.1 --, nvcc, ninja) and benchmarks/README.md ("GPU check": numpy, msgpack), or what
# benchmarks.gpu.run and gpu_check import (httpx, psutil). The rest are required by a kit wheel and in HOST_IMAGE;
# benchmarks.gpu.run probes every entry first on the host and writes what is missing.
HOST_NAMED: Dict[str, Optional[str]] = {
    "torch": "2.11.0", "triton": "3.6.0", "numpy": None, "msgpack": None, "ninja": None, "httpx": None, "psutil": None,
}
HOST: Dict[str, Optional[str]] = {
    **HOST_NAMED,
    # transformers' and huggingface-hub's own requirements (the host has transformers 5.17):
    "huggingface-hub": None, "packaging": None, "pyyaml": None, "regex": None, "safetensors": None, "tqdm": None,
    "typer": None, "typing-extensions": None, "anyio": None, "h11": None, "click": None,
    # SGLang's:
    "aiohttp": None, "einops": None, "pillow": None, "requests": None, "prometheus-client": None,
    "uvloop": None, "torchvision": None, "torchaudio": None, "scipy": None, "sentencepiece": None,
    "tiktoken": None, "nvidia-ml-py": None, "attrs": None,
    # cuda-python 13 is a metapackage over cuda-bindings, which the image holds (SGLang imports cuda.bindings.*)
    "cuda-python": None,
    # ipython 9's (sglang.utils imports IPython.display, which loads none of IPython's shell):
    "pygments": None,
}
HOST_ALIASES: Dict[str, str] = {"cuda-python": "cuda-bindings"}  # HOST entry -> the HOST_IMAGE name holding it
# Module names of HOST entries whose import name is not the distribution's (for the run's probe).
HOST_MODULES: Dict[str, str] = {
    "huggingface-hub": "huggingface_hub", "pyyaml": "yaml", "typing-extensions": "typing_extensions",
    "pillow": "PIL", "prometheus-client": "prometheus_client", "cuda-python": "cuda", "openai-harmony": "openai_harmony",
    "nvidia-ml-py": "pynvml", "torch-memory-saver": "torch_memory_saver", "matplotlib-inline": "matplotlib_inline",
    "prompt-toolkit": "prompt_toolkit", "stack-data": "stack_data", "ipython-pygments-lexers": "ipython_pygments_lexers",
}

# Requirements neither brought nor on the host: distribution -> why nothing on the kit's path imports them.
NOT_NEEDED: Dict[str, str] = {
    "flashinfer-cubin": "flashinfer's precompiled kernels; the flashinfer stand-in loads none",
    "flash-attn-4": "FA4 (Blackwell attention); --attention-backend triton",
    "xgrammar": "--grammar-backend none",
    "llguidance": "a grammar backend; --grammar-backend none",
    "outlines": "a grammar backend; --grammar-backend none",
    "tilelang": "DeepSeek-V3.2 / V4 sparse-attention kernels; the embedded model is GLM-4.5-shaped",
    "sgl-deep-gemm": "FP8 GEMMs; the run serves bfloat16",
    "tokenspeed-mla": "MLA decode kernels; the embedded model has no MLA",
    "quack-kernels": "CuTe-DSL kernels for Blackwell paths",
    "nvidia-mathdx": "cuBLASDx / cuFFTDx headers for CuTe-DSL kernels",
    "torchao": "quantization; the run serves bfloat16",
    "torchcodec": "video decoding for multimodal models",
    "timm": "vision towers of multimodal models",
    "mistral-common": "Mistral tokenizers; the embedded model has its own",
    "anthropic": "the Anthropic-compatible API route, imported when called",
    "kernels": "Hub kernels, imported when a model asks",
    "smg-grpc-servicer": "the gRPC server (--grpc-mode), not started",
    "modelscope": "SGLANG_USE_MODELSCOPE downloads; the model is local",
    "blobfile": "remote (GCS / Azure) weights; the model is local",
    "py-spy": "a profiler binary SGLang calls on a hang dump",
    "build": "SGLang's own build",
    "easydict": "a multimodal config (DeepSeek-OCR)",
    # Not in the host's image, and not imported on the kit's path (benchmarks.gpu.rehearse serves without them):
    "zstandard": "SGLang's request-decompression middleware, added only with SGLANG_ENABLE_REQUEST_DECOMPRESSION",
    "watchfiles": "SSL certificate reloading (--ssl-*) and uvicorn's --reload",
    "openai-harmony": "gpt-oss's Harmony format: without it SGLang logs /v1/responses as disabled",
    "torch-memory-saver": "imported under try: --enable-memory-saver only",
    "interegular": "the outlines grammar backend; --grammar-backend none",
    "datasets": "SGLang's benchmarks and evals",
    "jedi": "IPython's completer, not loaded by IPython.display",
    "matplotlib-inline": "IPython's inline plots",
    "pexpect": "IPython's shell commands",
    "prompt-toolkit": "IPython's terminal",
    "stack-data": "IPython's tracebacks",
    "ipython-pygments-lexers": "IPython's highlighting",
}


def kit_pins() -> Dict[str, str]:
    """distribution -> version for every wheel downloaded into the kit."""
    return {name: version for name, (version, _) in KIT.items()}


# The host's interpreter, for the requirement lines' markers.
HOST_MARKERS = {
    "python_version": "3.12", "python_full_version": "3.12.3", "implementation_name": "cpython",
    "implementation_version": "3.12.3", "platform_python_implementation": "CPython", "os_name": "posix",
    "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "platform_release": "",
    "platform_version": "", "extra": "",
}


def unaccounted(requires: Dict[str, list]) -> list:
    """One line per requirement of a kit wheel (``requires.json``'s form: {"name==version": [Requires-Dist]})
    that is neither in KIT at a version it allows, nor on the host (at a version it allows, where known),
    nor a stand-in claiming a version it allows, nor named in NOT_NEEDED. Empty: the list accounts for all."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    kit = {canonicalize_name(n): v for n, v in kit_pins().items()}
    kit[OWN] = None  # built here, any version
    stand = {canonicalize_name(n): f"{v}+{STANDIN_LOCAL}" for n, (v, _, _) in STAND_INS.items()}
    host = {canonicalize_name(n): v for n, v in HOST.items()}
    skip = {canonicalize_name(n) for n in NOT_NEEDED}
    problems = []
    for who, lines in sorted(requires.items()):
        for line in lines:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate(HOST_MARKERS):
                continue  # another platform's, or an extra's
            name = canonicalize_name(req.name)
            version = next((src[name] for src in (kit, stand, host) if name in src), "absent")
            if name in skip and version == "absent":
                continue
            if version == "absent":
                problems.append(f"{who} requires {line!r}: not in the kit, not on the host, no stand-in, "
                                f"not named as not needed")
            elif version is not None and not req.specifier.contains(version, prereleases=True):
                where = "kit" if name in kit else "stand-in" if name in stand else "host"
                problems.append(f"{who} requires {line!r}: the {where} has {version}")
    return problems
