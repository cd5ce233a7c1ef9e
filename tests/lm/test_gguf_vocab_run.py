"""End to end: ``iron run`` on small random-weight GGUF files that carry real vocabularies
(``benchmarks/make_gguf.py --vocab``) tokenizes its prompt as llama.cpp's vocabulary tests
expect, with the BOS the file asks for, and so do the server's completions; the reply's text
continues the prompt's."""

import importlib.util
import sys
from pathlib import Path

import pytest

import llama_vocab
from buildtools import iron_run_json
from iron.lm.gguf_tokenizer import GGUFVocab, build_tokenizer

REPO = Path(__file__).resolve().parents[2]
TEXT = "Hello, y'all! How are you 😁 ?我想在apple工作1314151天～"  # a case of every .inp


# text with the file's own special tokens, which a prompt's tokenization matches whole
SPECIAL_TEXT = {
    "llama-spm": "<s>[INST] Hi there [/INST]</s>  two  spaces",
    "llama-bpe": "<|start_header_id|>user<|end_header_id|>\n\nHi there<|eot_id|>",
}


def _benchmark(name: str):
    """A module of benchmarks/ (the GGUF writer, the llama.cpp wrapper), loaded by path."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.parametrize("name,bos", [("llama-spm", 1), ("llama-bpe", 128000)])
def test_iron_run_tokenizes_the_prompt_as_llama_cpp(tmp_path: Path, name: str, bos: int):
    vocab = llama_vocab.vocab_file(REPO / "build", name)
    want = llama_vocab.cases(vocab)[TEXT]
    make = _benchmark("make_gguf")
    model = make.write(tmp_path / f"tiny-{name}.gguf", make.Shape(
        hidden=256, layers=2, heads=4, kv_heads=2, ffn=256, context=256), "Q8_0", vocab=vocab)
    ran = iron_run_json(model, TEXT, tmp_path / "build", REPO / "build" / "ops")
    assert ran["prompt_ids"] == [bos] + want
    assert ran["prompt_tokens"] == len(want) + 1 and ran["new_tokens"] == 2
    # the reply's text is what its tokens add to the prompt's (its first space kept)
    tok = build_tokenizer(GGUFVocab.from_metadata(llama_vocab.metadata(vocab), str(vocab)),
                          str(vocab))
    before = tok.decode(ran["prompt_ids"], skip_special_tokens=True)
    after = tok.decode(ran["prompt_ids"] + ran["tokens"], skip_special_tokens=True)
    assert after.startswith(before) and ran["text"] == after[len(before):]

    # the server's completions tokenize the same way (the bundle iron run built)
    from iron.lm.serve import Server
    from iron.lm.serve.request import completion_prompt

    bundle, = (tmp_path / "build" / "llama").glob("cpu-*")
    server = Server(bundle, slots=1)
    try:
        assert completion_prompt({"prompt": TEXT}, server.view) == [bos] + want
    finally:
        server.workers.shutdown()

    # and the bundle's tokenizer agrees with llama.cpp itself on the same file, with special
    # tokens added and parsed as llama.cpp's server does, on every case and on special text
    pytest.importorskip("xllamacpp")
    from tokenizers import Tokenizer

    bundled = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    texts = [t for t in llama_vocab.cases(vocab) if t] + [SPECIAL_TEXT[name]]
    with _benchmark("llamacpp").LlamaCpp(model, n_ctx=256, warmup=False) as llama_cpp:
        for text in texts:
            assert bundled.encode(text).ids == llama_cpp.tokenize(
                text, add_special=True, parse_special=True), text
