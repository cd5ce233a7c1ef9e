"""GGUF vocabularies tokenize as llama.cpp does: every case of llama.cpp's own tokenizer tests
(``models/ggml-vocab-*.gguf`` with ``.inp``/``.out``, test-tokenizer-0's format) for every
vocabulary iron accepts, a one-line refusal for the others, and BOS/EOS as the file says."""

import functools
import os
from pathlib import Path

import pytest
from tokenizers import Tokenizer

import llama_vocab
from iron.errors import CheckpointError
from iron.lm.gguf_tokenizer import GGUFVocab, build_tokenizer
from iron.lm.special_tokens import frame

REPO = Path(__file__).resolve().parents[2]

# vocabulary -> (kind, BOS the tokenizer adds with special tokens, or None)
ACCEPTED = {
    "llama-spm": ("llama", 1), "phi-3": ("llama", 1), "llama-bpe": ("gpt2", 128000),
    "gpt-2": ("gpt2", None), "qwen2": ("gpt2", None), "qwen35": ("gpt2", None),
    "deepseek-llm": ("gpt2", 100000), "deepseek-coder": ("gpt2", 32013),
    "starcoder": ("gpt2", None), "falcon": ("gpt2", None), "refact": ("gpt2", None),
    "mpt": ("gpt2", None), "command-r": ("gpt2", 5),
}
# the largest files (100k-256k tokens, several seconds each to read and build): the slow lane
LARGE = {"qwen2", "qwen35", "deepseek-llm", "command-r"}
NAMES = [pytest.param(n, marks=pytest.mark.slow) if n in LARGE else n for n in sorted(ACCEPTED)]
# vocabulary -> what the refusal names
REFUSED = {"bert-bge": "'bert'", "gemma-4": "'gemma4'", "gpt-neox": "tokenizer.ggml.pre is missing",
           "aquila": "tokenizer.ggml.pre is missing"}


@pytest.fixture(scope="module")
def vocab_dir() -> Path:
    try:
        return llama_vocab.vocab_dir(REPO / "build")
    except llama_vocab.Unavailable as e:
        if os.environ.get("CI") == "true":
            pytest.fail(f"llama.cpp's vocabulary test data is required in CI: {e}")
        pytest.skip(f"llama.cpp's vocabulary test data unavailable offline: {e}")


def _vocab(vocab_dir: Path, name: str) -> tuple[Path, GGUFVocab]:
    path = vocab_dir / f"ggml-vocab-{name}.gguf"
    return path, GGUFVocab.from_metadata(llama_vocab.metadata(path), str(path))


@functools.lru_cache(maxsize=None)
def _tokenizer(vocab_dir: Path, name: str):
    """The vocabulary and its tokenizer, built once per test session."""
    path, vocab = _vocab(vocab_dir, name)
    return vocab, build_tokenizer(vocab, str(path))


@pytest.mark.parametrize("name", NAMES)
def test_every_case_of_llama_cpps_vocabulary_tests_matches(vocab_dir: Path, name: str):
    vocab, tok = _tokenizer(vocab_dir, name)
    assert vocab.model == ACCEPTED[name][0]
    tok = Tokenizer.from_str(tok.to_str())
    tok.encode_special_tokens = True  # test-tokenizer-0 parses no special tokens in the text
    cases = llama_vocab.cases(vocab_dir / f"ggml-vocab-{name}.gguf")
    assert len(cases) >= 40
    wrong = [(text, want, got) for text, want in cases.items()
             if (got := tok.encode(text, add_special_tokens=False).ids) != want]
    assert not wrong, f"{len(wrong)}/{len(cases)} cases differ, first: {wrong[0]}"


@pytest.mark.parametrize("name", NAMES)
def test_bos_as_the_file_says(vocab_dir: Path, name: str):
    """add_bos_token, or llama.cpp's default without it (on for SentencePiece and llama-bpe)."""
    vocab, tok = _tokenizer(vocab_dir, name)
    plain = tok.encode("Hello world", add_special_tokens=False).ids
    bos = ACCEPTED[name][1]
    assert tok.encode("Hello world").ids == ([bos] if bos is not None else []) + plain
    # a chat rendering that already starts with the BOS keeps one; one without gets it
    assert frame(tok, plain) == tok.encode("Hello world").ids
    if bos is not None:
        assert frame(tok, [bos] + plain) == [bos] + plain


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_other_vocabularies_are_refused_in_one_line(vocab_dir: Path, name: str):
    path = vocab_dir / f"ggml-vocab-{name}.gguf"
    with pytest.raises(CheckpointError) as e:
        GGUFVocab.from_metadata(llama_vocab.metadata(path), str(path))
    msg = str(e.value)
    assert "\n" not in msg and path.name in msg and REFUSED[name] in msg
    assert "not implemented" in msg


def test_special_tokens_are_parsed_in_prompts_and_end_of_generation(vocab_dir: Path):
    """A prompt's control tokens are matched whole (llama.cpp with parse_special); the reply
    ends at EOS and at the end-of-turn tokens llama.cpp stops on."""
    vocab, tok = _tokenizer(vocab_dir, "llama-bpe")
    ids = tok.encode("<|start_header_id|>user<|end_header_id|>", add_special_tokens=False).ids
    assert ids[0] == 128006 and ids[-1] == 128007 and len(ids) == 3
    eog = vocab.end_of_generation_ids()
    assert eog[0] == vocab.eos_id == 128001 and 128009 in eog  # <|eot_id|>
    assert tok.decode(tok.encode("Hello world, it's 2024!").ids,
                      skip_special_tokens=True) == "Hello world, it's 2024!"
    vocab, tok = _tokenizer(vocab_dir, "llama-spm")
    assert tok.decode(tok.encode(" Hello  world\n").ids, skip_special_tokens=True) \
        == " Hello  world\n"


def test_unknown_pre_tokenizer_is_refused_naming_it():
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "brand-new",
            "tokenizer.ggml.tokens": ["a"], "tokenizer.ggml.merges": []}
    with pytest.raises(CheckpointError, match=r"tokenizer.ggml.pre = 'brand-new' is not "):
        GGUFVocab.from_metadata(meta, "x.gguf")


@pytest.mark.parametrize("name,source", [
    ("llama-bpe", "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}"
                  "<|end_header_id|>\n\n{{ m['content'] }}<|eot_id|>{% endfor %}"),
    ("phi-3", "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
              "{% endfor %}<|assistant|>\n"),
])
def test_a_chat_prompt_starts_with_one_bos(vocab_dir: Path, name: str, source: str):
    """As llama.cpp: a template that writes the BOS keeps one, one that does not gets it."""
    from iron.lm.chat import ChatTemplate

    vocab, tok = _tokenizer(vocab_dir, name)
    template = ChatTemplate(source, bos_token=vocab.tokens[vocab.bos_id])
    messages = [{"role": "user", "content": "Hello"}]
    ids = template.tokenize(messages, tok)
    assert ids[0] == vocab.bos_id and ids[1] != vocab.bos_id
    assert ids[1:] == tok.encode(template.render(messages).removeprefix(vocab.tokens[vocab.bos_id]),
                                 add_special_tokens=False).ids


def test_add_eos_token_puts_the_eos_behind(vocab_dir: Path):
    path = vocab_dir / "ggml-vocab-llama-spm.gguf"
    meta = {**llama_vocab.metadata(path), "tokenizer.ggml.add_eos_token": True,
            "tokenizer.ggml.add_bos_token": False}
    tok = build_tokenizer(GGUFVocab.from_metadata(meta, str(path)), str(path))
    plain = tok.encode("Hello world", add_special_tokens=False).ids
    assert tok.encode("Hello world").ids == plain + [2]
    assert frame(tok, plain) == plain + [2] and frame(tok, plain + [2]) == plain + [2]


@pytest.mark.parametrize("name", ["llama-spm", "llama-bpe"])
def test_streamed_text_continues_the_prompt(vocab_dir: Path, name: str):
    """A reply streamed after a prompt keeps its first space (a SentencePiece decoder drops
    the leading space of a text, which a reply's first token is not) and its characters."""
    from iron.lm.generate import StopText

    _, tok = _tokenizer(vocab_dir, name)
    prompt = tok.encode("Hello, y'all! 😁").ids
    reply = tok.encode(" world 😁 again", add_special_tokens=False).ids
    if name == "llama-spm":
        assert tok.id_to_token(reply[0]) == "\u2581"  # the prefix space, then "▁world"
        reply = reply[1:]
    stream = StopText(tok, context=prompt)
    assert "".join(stream.push(t) for t in reply) + stream.flush() == " world 😁 again"
