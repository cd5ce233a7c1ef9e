"""Real models' chat templates (llama.cpp's ``models/templates/*.jinja``, in the llama-cpp-python
sdist) rendered by iron (``ChatTemplate``, in its worker process) and by transformers'
``apply_chat_template``: the same text for every conversation, or the same refusal.

The conversations carry no tools (the tools-free path): a user turn, a system prompt, several
turns, and a finished exchange without the generation prompt. ``strftime_now`` reports one
fixed date in both, so templates that write today's date (Llama 3.2, Mistral Small, Granite,
gpt-oss, ...) render reproducibly."""

import datetime
from pathlib import Path

import pytest

from iron.lm.chat import ChatError, ChatTemplate

transformers = pytest.importorskip("transformers")
import transformers.utils.chat_template_utils as transformers_templates  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402
from tokenizers.models import WordLevel  # noqa: E402

import llama_vocab  # noqa: E402

pytestmark = pytest.mark.slow  # a worker process per template: ~30 s on a busy 2-core host

REPO = Path(__file__).resolve().parents[2]
#: the date strftime_now reports: not this year's, so that a clock left unfixed shows
NOW = datetime.datetime(2031, 3, 14, 15, 9, 26)
BOS, EOS = "<s>", "</s>"
SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "What is iron?"}
ANSWER = {"role": "assistant", "content": "A metal, Fe."}
AGAIN = {"role": "user", "content": "And steel?"}
#: name -> (messages, add_generation_prompt)
CONVERSATIONS = {"user": ([USER], True), "system": ([SYSTEM, USER], True),
                 "multi-turn": ([SYSTEM, USER, ANSWER, AGAIN], True),
                 "finished": ([USER, ANSWER], False)}

#: templates that refuse a conversation here, in transformers and iron alike, and why
REFUSING = {
    "CohereForAI-c4ai-command-r-plus-tool_use": (
        set(CONVERSATIONS), "'NoneType' object is not iterable"),  # its tool-use variant: tools
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": (
        set(CONVERSATIONS), "'NoneType' object is not iterable"),  # its tool-use variant: tools
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": (
        set(CONVERSATIONS), "'NoneType' object is not iterable"),  # its tool-use variant: tools
    "fireworks-ai-llama-3-firefunction-v2": (
        set(CONVERSATIONS), "'functions' is undefined"),  # needs its own `functions` variable
    "google-gemma-2-2b-it": ({"system", "multi-turn"}, "System role not supported"),
}
#: templates iron does not accept at all (none since ``{% generation %}`` is supported)
NOT_ACCEPTED: dict[str, str] = {}


class FixedClock(datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return NOW


@pytest.fixture(scope="module")
def templates():
    try:
        folder = llama_vocab.templates_dir(REPO / "build")
    except llama_vocab.Unavailable as e:
        pytest.skip(str(e))
    found = {p.stem: p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.jinja"))}
    assert len(found) >= 19, sorted(found)
    return found


@pytest.fixture(scope="module")
def reference():
    """transformers' renderer: a fast tokenizer with only BOS and EOS (all a template reads of
    it), its ``strftime_now`` reporting ``NOW``."""
    from transformers import PreTrainedTokenizerFast

    patch = pytest.MonkeyPatch()
    patch.setattr(transformers_templates, "datetime", FixedClock)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"[UNK]": 0, BOS: 1, EOS: 2}, unk_token="[UNK]")),
        bos_token=BOS, eos_token=EOS)
    year = tokenizer.apply_chat_template([USER], chat_template="{{ strftime_now('%Y') }}",
                                         tokenize=False)
    assert year == "2031", f"transformers' strftime_now was not fixed: {year}"
    yield tokenizer
    patch.undo()


def test_the_clock_is_fixed_in_both(reference):
    source = "{{ strftime_now('%d %b %Y %H:%M') }}"
    ours = ChatTemplate(source, now=NOW).render([USER])
    assert ours == reference.apply_chat_template([USER], chat_template=source, tokenize=False)
    assert ours == "14 Mar 2031 15:09"


def test_every_template_renders_as_transformers_renders_it(templates, reference):
    mismatched, refusals = [], {}
    for name, source in templates.items():
        try:
            ours = ChatTemplate(source, BOS, EOS, where=name, now=NOW)
        except ChatError as e:
            assert name in NOT_ACCEPTED, f"{name}: not accepted: {e}"
            continue
        assert name not in NOT_ACCEPTED, f"{name}: accepted now; take it off NOT_ACCEPTED"
        for label, (messages, generation) in CONVERSATIONS.items():
            try:
                want = reference.apply_chat_template(messages, chat_template=source,
                                                     tokenize=False,
                                                     add_generation_prompt=generation)
            except Exception as e:  # the template refuses the conversation
                with pytest.raises(ChatError) as caught:
                    ours.render(messages, generation)
                assert str(e) in str(caught.value), (name, label, str(e), str(caught.value))
                refusals.setdefault(name, (set(), str(e)))[0].add(label)
                continue
            got = ours.render(messages, generation)
            if got != want:
                mismatched.append(f"{name} ({label}): {got[:300]!r} != {want[:300]!r}")
    assert not mismatched, "\n".join(mismatched)
    assert refusals == REFUSING
    rendered = len(templates) - len(NOT_ACCEPTED) - sum(
        len(labels) == len(CONVERSATIONS) for labels, _ in REFUSING.values())
    assert rendered >= 19  # the count of real templates rendered alike, at least
