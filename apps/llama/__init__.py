"""The Llama application: a decoder over any Llama-family checkpoint (Llama, Qwen2, Qwen3; a
Hugging Face folder or a GGUF file); by default the embedded SmolLM2-135M-Instruct (see
iron.lm.gguf_import).

The family's one home, in dependency order: ``config.py`` (``LlamaConfig``, RoPE
frequencies), ``gguf.py`` (GGUF metadata and tensor names to the config's), ``weights.py``
(the checkpoint's tensors and the kernels' weight layout), ``model.py`` (the graphs),
``programs.py`` (the bundle's programs), ``family.py`` (what ``iron.lm`` reads of it) and
``app.py`` (the ``App`` the build uses).

This module only declares the application's build variables, so that ``doit`` can check a
command line without importing numpy; ``App`` is imported on first use.
"""

from __future__ import annotations

from iron.lm.flags import run_options
from iron.pipeline.variables import Variable, choice, positive

#: Most sequences one batched decode step runs (programs for 2, 4, ... up to it).
DEFAULT_BATCH = 8

VARIABLES = {
    "context": Variable(None, positive(1 << 20), "KV cache positions, at most the checkpoint's "
                        "own", tag="ctx{}",
                        shown="the checkpoint's, or what fits memory"),
    "weights": Variable("native", choice("native", "bf16", "uint4"),
                        "native: the checkpoint's own formats (GGUF blocks); bf16; uint4 "
                        "quantized at bundle time", tag="{}"),
    "group": Variable(128, choice("32", "128", as_int=True), "uint4's group size",
                      tag="g{}"),
    "batch": Variable(DEFAULT_BATCH, positive(64), "most sequences one batched decode step "
                      "runs", tag="batch{}"),
}

#: The run command's flags ``doit generate`` passes on (``top_k=40`` becomes ``--top-k=40``).
RUN_OPTIONS = run_options()


def __getattr__(name: str):
    if name in ("App", "DEFAULT_PROMPT", "PREFILL_CHUNK"):
        from . import app

        return getattr(app, name)
    if name == "FAMILY":  # the decoder family (iron.lm.family), for the GGUF importer
        from .family import FAMILY

        return FAMILY
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
