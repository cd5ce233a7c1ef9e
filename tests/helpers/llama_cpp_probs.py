"""llama.cpp's whole next-token distribution, from its own server code in-process (xllamacpp).

llama-server's completion endpoint returns, per generated token, the ``n_probs`` likeliest
tokens with their probabilities; with ``post_sampling_probs`` false they come from
``get_token_probabilities`` (tools/server/server-common.cpp): a softmax over every logit of the
position, sorted, then cut at ``min(n_probs, n_logits)``. There is no other cap, so asking for
``n_probs`` = the vocabulary size returns every token: the KL divergence over the whole
vocabulary, not a top-k bound. The probabilities are float32 (their sum is 1 within 1e-5);
``kl_stats`` renormalizes them through its log-softmax."""

from __future__ import annotations

import numpy as np


def greedy_distributions(llama_cpp, prompt_ids: list[int], n_new: int, n_vocab: int
                         ) -> tuple[list[int], np.ndarray]:
    """llama.cpp's greedy continuation of ``prompt_ids`` by ``n_new`` tokens, and its
    log-probability of every token of the vocabulary before each of them: float64
    ``(n_new, n_vocab)``; ``llama_cpp`` is a ``benchmarks/llamacpp.py`` ``LlamaCpp``."""
    reply = llama_cpp._server.handle_completions(llama_cpp._request(
        prompt_ids, n_new, n_probs=n_vocab, post_sampling_probs=False))
    if "choices" not in reply:
        raise RuntimeError(f"llama.cpp refused the completion: {reply}")
    steps = reply["choices"][0]["logprobs"]["content"]
    out = np.full((len(steps), n_vocab), np.nan)
    for row, step in zip(out, steps):
        top = step["top_logprobs"]
        ids = np.array([t["id"] for t in top])
        row[ids] = [t["logprob"] for t in top]
        if len(top) != n_vocab or np.isnan(row).any():
            raise RuntimeError(f"llama.cpp returned {len(top)} of {n_vocab} tokens' "
                               "probabilities: not the whole vocabulary")
    return [int(s["id"]) for s in steps], out
