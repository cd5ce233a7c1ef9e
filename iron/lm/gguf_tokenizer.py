"""A ``tokenizers.Tokenizer`` rebuilt from a GGUF file's vocabulary, tokenizing as llama.cpp does.

A GGUF file carries no ``tokenizer.json``: its ``tokenizer.ggml.*`` metadata lists the tokens,
their types and scores or merges, and names the algorithm. llama.cpp's ``src/llama-vocab.cpp``
gives each name its meaning, and this module follows it:

- ``tokenizer.ggml.model = llama`` (SentencePiece BPE: Llama 2, Mistral, TinyLlama, Phi-3): each
  stretch of text between special tokens gets a space in front (``add_space_prefix``, on unless
  the file says otherwise), spaces become U+2581, then the adjacent pair whose joined text is
  the highest-scoring token merges first; pieces that form no token fall back to ``<0xXX>``
  byte tokens. A BPE model whose merges are every such pair, ranked by the joined token's score,
  does exactly that.
- ``tokenizer.ggml.model = gpt2`` (byte-level BPE): the text is split by the regular expressions
  llama.cpp uses for the file's ``tokenizer.ggml.pre`` (one after the other, each match and each
  gap between matches a piece), mapped to GPT-2's byte alphabet and merged by the file's merges.
  ``llama-bpe`` (Llama 3) also takes a piece that is itself a token whole (``ignore_merges``).

Token types decide what is matched whole in the text: control and unknown tokens become special
added tokens (``<s>``, ``<|eot_id|>``), user-defined ones plain added tokens. ``add_bos_token``
and ``add_eos_token`` (defaulting as llama.cpp defaults them: on for SentencePiece and for Llama
3's ``llama-bpe``) become the tokenizer's post-processor, so ``encode(text)`` with its special
tokens adds what llama.cpp's ``llama_tokenize(..., add_special=true)`` adds. Any other model or
pre-tokenizer is refused in one line naming it. The reference is llama.cpp's own test data, its
``models/ggml-vocab-*.gguf`` files with their ``.inp``/``.out`` cases.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from iron.errors import CheckpointError

# llama.cpp's llama_token_type
TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 2, 3, 4
TOKEN_UNUSED, TOKEN_BYTE = 5, 6

# ---------------------------------------------------------------------------------------------
# pre-tokenizers: llama.cpp's regular expressions per tokenizer.ggml.pre (llm_tokenizer_bpe)

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
           r"|\s*[\r\n]+|\s+(?!\S)|\s+")
# Written as escapes: the characters themselves would not survive Unicode normalization.
_DEEPSEEK_LETTERS = (
    "A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293"
    "\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c"
    "\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5"
    "\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59"
    "\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc"
    "\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107"
    "\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee"
    "\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e"
    "\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a"
    "\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943")
_DEEPSEEK_PUNCT = "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+"
_CJK = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DIGIT_FIRST = (r"\p{N}", _GPT2)


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp splits text before byte-level BPE for one ``tokenizer.ggml.pre`` value."""

    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a piece that is a token is taken whole
    add_bos: bool = False  # llama.cpp's default when the file has no add_bos_token


_LLAMA3_PRE = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_PRE = PreTokenizer((_QWEN2,))
_STARCODER_PRE = PreTokenizer(_DIGIT_FIRST)
_GPT2_PRE = PreTokenizer((_GPT2,))

PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "llama-bpe": _LLAMA3_PRE, "llama3": _LLAMA3_PRE, "llama-v3": _LLAMA3_PRE,
    "dbrx": PreTokenizer((_LLAMA3,)), "smaug-bpe": PreTokenizer((_LLAMA3,)),
    "deepseek-llm": PreTokenizer(("[\r\n]", rf"\s?[{_DEEPSEEK_LETTERS}]+",
                                  _DEEPSEEK_PUNCT, r"\s+$", _CJK, r"\p{N}+")),
    "deepseek-coder": PreTokenizer(("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}")),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")),
    "gpt-2": _GPT2_PRE, "mpt": _GPT2_PRE, "olmo": _GPT2_PRE, "phi-2": _GPT2_PRE,
    "starcoder": _STARCODER_PRE, "refact": _STARCODER_PRE, "smollm": _STARCODER_PRE,
    "command-r": _STARCODER_PRE, "codeshell": _STARCODER_PRE,
    "qwen2": _QWEN2_PRE, "deepseek-r1-qwen": _QWEN2_PRE, "stablelm2": _QWEN2_PRE,
    "qwen35": PreTokenizer((_QWEN35,)),
}


# ---------------------------------------------------------------------------------------------
# the vocabulary as the file states it

# Token texts llama.cpp's llama_vocab::load takes as ending generation, whatever their ids.
_END_OF_GENERATION = frozenset((
    "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<EOT>", "_<EOT>", "<end_of_utterance>", "</s>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>"))

@dataclass(frozen=True)
class GGUFVocab:
    """The ``tokenizer.ggml.*`` metadata a tokenizer is built from, with llama.cpp's defaults."""

    model: str
    pre: str | None
    tokens: tuple[str, ...]
    types: tuple[int, ...]
    scores: tuple[float, ...]
    merges: tuple[str, ...]
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    unk_id: int | None
    pad_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], source: str) -> GGUFVocab:
        """Read ``meta`` (GGUF keys -> decoded values); refuse what iron does not implement."""
        t = "tokenizer.ggml."
        model = meta.get(t + "model")
        if model not in ("llama", "gpt2"):
            raise CheckpointError(
                f"{source}: tokenizer.ggml.model = {model!r} is not implemented; iron runs "
                "'llama' (SentencePiece BPE) and 'gpt2' (byte-level BPE) vocabularies")
        pre = meta.get(t + "pre")
        if model == "gpt2" and pre is None:
            raise CheckpointError(
                f"{source}: tokenizer.ggml.pre is missing, so how to split text before BPE is "
                "not implemented (llama.cpp guesses, warning that quality degrades); convert "
                "the model again with a current llama.cpp")
        if model == "gpt2" and pre not in PRE_TOKENIZERS:
            raise CheckpointError(
                f"{source}: tokenizer.ggml.pre = {pre!r} is not implemented; iron's "
                f"byte-level pre-tokenizers are {', '.join(sorted(PRE_TOKENIZERS))}")
        tokens = tuple(_required(meta, t + "tokens", source))
        n = len(tokens)
        types = tuple(int(x) for x in meta.get(t + "token_type", (TOKEN_NORMAL,) * n))
        scores = tuple(float(x) for x in meta.get(t + "scores", (0.0,) * n))
        merges = tuple(meta.get(t + "merges", ()))
        for key, got in (("token_type", len(types)), ("scores", len(scores))):
            if got != n:
                raise CheckpointError(f"{source}: tokenizer.ggml.{key} has {got} entries for "
                                      f"{n} tokens; each token needs one")
        if model == "llama" and not any(scores):
            raise CheckpointError(f"{source}: tokenizer.ggml.scores is missing or all zero; a "
                                  "SentencePiece vocabulary merges by its scores")

        def token_id(key: str) -> int | None:
            value = meta.get(t + key)
            if value is None:
                return None
            if not 0 <= int(value) < n:
                raise CheckpointError(f"{source}: tokenizer.ggml.{key} = {value} is outside "
                                      f"the vocabulary (0 .. {n - 1})")
            return int(value)

        spm = model == "llama"
        pre_default = PRE_TOKENIZERS[pre].add_bos if not spm else True
        return cls(
            model=model, pre=pre, tokens=tokens, types=types, scores=scores, merges=merges,
            bos_id=token_id("bos_token_id"), eos_id=token_id("eos_token_id"),
            eot_id=token_id("eot_token_id"), unk_id=token_id("unknown_token_id"),
            pad_id=token_id("padding_token_id"),
            add_bos=bool(meta.get(t + "add_bos_token", pre_default)),
            add_eos=bool(meta.get(t + "add_eos_token", False)),
            add_space_prefix=bool(meta.get(t + "add_space_prefix", spm)))

    def end_of_generation_ids(self) -> tuple[int, ...]:
        """The tokens that end a reply, as llama.cpp collects them: EOS, EOT, and the tokens
        whose text marks an end of turn in the common chat formats (``<|eot_id|>``,
        ``<|im_end|>``, ...), EOS first."""
        ids = [i for i in (self.eos_id, self.eot_id) if i is not None]
        ids += [i for i, t in enumerate(self.tokens) if t in _END_OF_GENERATION]
        return tuple(dict.fromkeys(ids))


def _required(meta: Mapping[str, Any], key: str, source: str) -> Any:
    if key not in meta:
        raise CheckpointError(f"{source}: GGUF metadata key {key!r} is missing; the file has no "
                              "complete vocabulary")
    return meta[key]


def tokenizer_metadata(reader: Any) -> dict[str, Any]:
    """The ``tokenizer.*`` metadata of an open GGUF file (``iron.lm.gguf_file.GGUFFile``),
    decoded (the chat templates too)."""
    return {k: f.contents() for k, f in reader.fields.items() if k.startswith("tokenizer.")}


# ---------------------------------------------------------------------------------------------
# building the tokenizer

def build_tokenizer(vocab: GGUFVocab, source: str) -> Any:
    """The ``tokenizers.Tokenizer`` that tokenizes as llama.cpp does with ``vocab``."""
    ids = {t: i for i, t in enumerate(vocab.tokens)}
    if len(ids) != len(vocab.tokens):
        dup = next(t for i, t in enumerate(vocab.tokens) if ids[t] != i)
        raise CheckpointError(f"{source}: the GGUF vocabulary holds the token {dup!r} twice; "
                              "each token string must be unique")
    tok = _spm(vocab, ids) if vocab.model == "llama" else _byte_level(vocab, ids, source)
    _add_special_tokens(tok, vocab, ids, source)
    tok.post_processor = _post_processor(vocab)
    return tok


def _spm(vocab: GGUFVocab, ids: dict[str, int]) -> Any:
    from tokenizers import Tokenizer, decoders, models, normalizers

    tok = Tokenizer(models.BPE(vocab=ids, merges=spm_merges(vocab, ids), byte_fallback=True,
                               fuse_unk=True, unk_token=_token(vocab, vocab.unk_id)))
    steps = [normalizers.Replace(" ", "\u2581")]
    if vocab.add_space_prefix:  # each stretch of text between added tokens, as llama.cpp
        steps.insert(0, normalizers.Prepend(" "))
    tok.normalizer = normalizers.Sequence(steps)
    dec = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if vocab.add_space_prefix:
        dec.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(dec)
    return tok


def spm_merges(vocab: GGUFVocab, ids: dict[str, int]) -> list[tuple[str, str]]:
    """Every split of every token into two tokens, best first: llama.cpp's SentencePiece
    session merges the adjacent pair whose joined text is the highest-scoring token."""
    ranked = []
    for token, i in ids.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            if left in ids and right in ids:
                ranked.append((-vocab.scores[i], i, ids[left], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _byte_level(vocab: GGUFVocab, ids: dict[str, int], source: str) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    merges = []
    for n, m in enumerate(vocab.merges):
        left, sep, right = m.partition(" ")  # llama.cpp splits at the first space
        if not sep or not left or not right:
            raise CheckpointError(f"{source}: tokenizer.ggml.merges[{n}] = {m!r:.40} is not "
                                  "two tokens separated by a space")
        merges.append((left, right))
    pre = PRE_TOKENIZERS[vocab.pre]
    tok = Tokenizer(models.BPE(vocab=ids, merges=merges, fuse_unk=False,
                               ignore_merges=pre.ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    return tok


def _add_special_tokens(tok: Any, vocab: GGUFVocab, ids: dict[str, int], source: str) -> None:
    """Control and unknown tokens as special added tokens, user-defined ones as plain added
    tokens: llama.cpp matches all of them whole in a prompt (with special tokens parsed)."""
    from tokenizers import AddedToken

    def added(kinds: tuple[int, ...], special: bool) -> list[Any]:
        return [AddedToken(t, special=special, normalized=False)
                for t, k in zip(vocab.tokens, vocab.types) if k in kinds]

    special = added((TOKEN_CONTROL, TOKEN_UNKNOWN), True)
    user = added((TOKEN_USER_DEFINED,), False)
    tok.add_special_tokens(special)
    tok.add_tokens(user)
    for t in special + user:
        if tok.token_to_id(t.content) != ids[t.content]:
            raise CheckpointError(f"{source}: added token {t.content!r} got id "
                                  f"{tok.token_to_id(t.content)}, the GGUF gives {ids[t.content]}")
    if tok.get_vocab_size(with_added_tokens=True) != len(vocab.tokens):
        raise CheckpointError(f"{source}: the rebuilt tokenizer has "
                              f"{tok.get_vocab_size(with_added_tokens=True)} tokens, the GGUF "
                              f"{len(vocab.tokens)}")


def _post_processor(vocab: GGUFVocab) -> Any:
    """BOS and EOS around a prompt encoded with special tokens, as the file asks."""
    from tokenizers import processors

    single, specials = "$A", []
    for wanted, tid, at_start in ((vocab.add_bos, vocab.bos_id, True),
                                  (vocab.add_eos, vocab.eos_id, False)):
        if wanted and tid is not None:
            text = vocab.tokens[tid]
            single = f"{text} {single}" if at_start else f"{single} {text}"
            specials.append((text, tid))
    template = processors.TemplateProcessing(
        single=single, pair=f"{single} $B:1", special_tokens=specials)
    if vocab.model == "gpt2":
        return processors.Sequence([processors.ByteLevel(trim_offsets=False), template])
    return template


def _token(vocab: GGUFVocab, tid: int | None) -> str | None:
    return None if tid is None else vocab.tokens[tid]
