"""A checkpoint's own chat template, rendered the way transformers renders it.

Hugging Face checkpoints carry their prompt format as a Jinja template: ``chat_template`` in
``tokenizer_config.json`` (a string, or a list of named templates of which "default" is used),
or the file ``chat_template.jinja`` that newer transformers versions write; llama.cpp keeps the
same text in a GGUF's ``tokenizer.chat_template`` (which ``iron.lm.gguf_import`` copies into
``tokenizer_config.json``). As transformers does (``apply_chat_template``), the template runs
in Jinja's immutable sandbox, with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
extension, the ``{% generation %}`` block, a ``tojson`` filter, ``raise_exception`` and
``strftime_now``, and gets ``messages``, ``add_generation_prompt``, ``bos_token``,
``eos_token``, and ``tools`` and ``documents`` set to None. The sandbox keeps a
template from calling anything but the plain data it is given: rendering never executes code
from the checkpoint. It renders in a worker process, within a budget of CPU time, memory and
text (``iron.lm.render``): a template that loops or grows without end is one ``ChatError``.

``ChatTemplate.tokenize`` turns a conversation into token ids with the text of every message
kept as text: a special token written in a message (``<|im_end|>`` typed by a user) is
tokenized as its characters, so a message cannot close its turn and write another role's; only
the template's own markers are control tokens.
"""

from __future__ import annotations

import threading
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import IronError
from ..jsonfile import loads
from ..util import read_bounded
from .render import Budget, Renderer, TemplateFailed, compile_template
from .special_tokens import frame

ROLES = ("system", "user", "assistant")

#: what transformers' ``apply_chat_template`` gives a template for a conversation without
#: tools or documents: the variables, set to None (a template that loops over ``tools``
#: without checking it fails in both alike)
NO_TOOLS = {"tools": None, "documents": None}

#: Unicode's private-use ranges: a message's content stands in the template's second rendering
#: as its index between two characters of these that no message holds
PRIVATE_USE = ((0xE000, 0xF8FF), (0xF0000, 0xFFFFD), (0x100000, 0x10FFFD))


class ChatError(IronError, ValueError):
    """A chat template is missing or broken, or a conversation is malformed."""


def _token_text(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


class ChatTemplate:
    """A compiled chat template and the special tokens it may refer to, rendered by its own
    worker process within ``budget`` (``iron.lm.render``)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "",
                 where: str = "chat template", budget: Budget = Budget(),
                 now: datetime | None = None):
        try:
            compile_template(source, where)
        except TemplateFailed as e:
            raise ChatError(str(e)) from None
        self.source, self.bos_token, self.eos_token, self.where = (source, bos_token, eos_token,
                                                                   where)
        self.now = now  # what strftime_now reports; None: the current time
        self.renderer = Renderer(source, where, budget)
        # (a tokenizer, its copy for message text, the text of its special tokens)
        self._plain: tuple[Any, Any, list[str]] | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_dir(cls, directory: str | Path) -> ChatTemplate:
        """The template of a checkpoint directory or a bundle; a clear error if it has none."""
        directory = Path(directory)
        config_path = directory / "tokenizer_config.json"
        config: dict[str, Any] = {}
        if config_path.is_file():
            try:
                config = loads(read_bounded(config_path, "a tokenizer config"))
            except OSError as e:
                raise ChatError(f"{config_path}: cannot read it ({e.strerror})") from None
            except ValueError as e:
                raise ChatError(f"{config_path}: not valid JSON ({e})") from None
            if not isinstance(config, dict):
                raise ChatError(f"{config_path}: must be a JSON object")
        source, where = config.get("chat_template"), f"{config_path}: chat_template"
        if isinstance(source, list):  # [{"name": ..., "template": ...}, ...]
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source, where = named.get("default"), where + '["default"]'
        jinja_file = directory / "chat_template.jinja"
        if not source and jinja_file.is_file():
            try:
                source = read_bounded(jinja_file, "a chat template").decode("utf-8")
            except OSError as e:
                raise ChatError(f"{jinja_file}: cannot read it ({e.strerror})") from None
            except UnicodeDecodeError as e:
                raise ChatError(f"{jinja_file}: not UTF-8 text ({e.reason} at byte "
                                f"{e.start})") from None
            where = str(jinja_file)
        if not isinstance(source, str) or not source:
            raise ChatError(f"{directory}: no chat template (neither chat_template in "
                            "tokenizer_config.json nor chat_template.jinja); this checkpoint "
                            "is not a chat model, or give the prompt as plain text")
        return cls(source, _token_text(config.get("bos_token")),
                   _token_text(config.get("eos_token")), where)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               max_chars: int | None = None) -> str:
        """The prompt text of ``messages`` (each {"role": system|user|assistant, "content":
        str}), ending with the assistant's turn opened when ``add_generation_prompt``; a
        ``ChatError`` if it passes ``max_chars`` characters or the render budget."""
        return self._render([messages], add_generation_prompt, max_chars)[0]

    def _render(self, conversations: list[list[dict[str, Any]]], add_generation_prompt: bool,
                max_chars: int | None) -> list[str]:
        for messages in conversations:
            check_messages(messages)
        try:
            return self.renderer.render(
                [{"messages": m} for m in conversations],
                {"bos_token": self.bos_token, "eos_token": self.eos_token, **NO_TOOLS,
                 "add_generation_prompt": add_generation_prompt}, max_chars, self.now)
        except TemplateFailed as e:
            raise ChatError(str(e)) from None

    def tokenize(self, messages: list[dict[str, Any]], tokenizer,
                 add_generation_prompt: bool = True, max_chars: int | None = None
                 ) -> list[int]:
        """The token ids of ``render(messages)`` (a ``tokenizers.Tokenizer``), with every
        message's text tokenized as text, special token strings in it included.

        The template is rendered a second time with each message's content replaced by a
        placeholder: what lies between the placeholders is the template's own text, whose
        special tokens stay special. Where a template rewrites the content (trims it, or
        branches on it) so that the two renderings do not line up, the plain tokenization is
        kept as long as no message holds a special token's text, and refused otherwise (one
        line naming the message and the token). Every step is one pass over the conversation:
        a rescan of the rendered text per message made n messages take n^3."""
        check_messages(messages)
        plain, specials = self._plain_tokenizer(tokenizer)
        # the first special token's text in a message, found by one search per token over
        # all the messages at once
        joined = "\0".join(m["content"] for m in messages)
        found = min(((at, text) for text in specials if (at := joined.find(text)) >= 0),
                    default=None)
        if found is None:
            text = self.render(messages, add_generation_prompt, max_chars)
            return frame(tokenizer, tokenizer.encode(text, add_special_tokens=False).ids)
        mark = placeholder(messages)
        text, marked = self._render(
            [messages, [{**m, "content": f"{mark}{i}{mark}"} for i, m in enumerate(messages)]],
            add_generation_prompt, max_chars)
        pieces = split(messages, text, marked, mark)
        if pieces is None:
            at, token = found
            raise ChatError(f"messages[{joined.count(chr(0), 0, at)}].content holds the control "
                            f"token {token!r}, and {self.where} rewrites message text, so it "
                            "cannot be kept as text: remove it from the message")
        # even pieces are the template's, odd ones a message's content
        ours = tokenizer.encode_batch_fast(pieces[0::2], add_special_tokens=False)
        theirs = plain.encode_batch_fast(pieces[1::2], add_special_tokens=False)
        ids: list[int] = []
        for k, encoding in enumerate(ours):
            ids += encoding.ids
            if k < len(theirs):
                ids += theirs[k].ids
        return frame(tokenizer, ids)

    def warm(self, tokenizer) -> None:
        """Start the renderer and make ``tokenizer``'s plain copy now (about a second), so
        that the first conversations do not wait for them."""
        self.renderer.start()
        self._plain_tokenizer(tokenizer)

    def _plain_tokenizer(self, tokenizer):
        """A copy of ``tokenizer`` that encodes special token strings as text, and the text of
        its special tokens (made once per tokenizer)."""
        with self._lock:
            if self._plain is None or self._plain[0] is not tokenizer:
                from tokenizers import Tokenizer

                plain = Tokenizer.from_str(tokenizer.to_str())
                plain.encode_special_tokens = True
                specials = sorted({t.content for t in tokenizer.get_added_tokens_decoder()
                                   .values() if t.special and t.content})
                self._plain = (tokenizer, plain, specials)
            return self._plain[1:]


def placeholder(messages: list[dict[str, Any]]) -> str:
    """A private-use character no message holds: it marks where the messages' contents go."""
    used = set().union(*(m["content"] for m in messages))
    for first, last in PRIVATE_USE:
        for code in range(first, last + 1):
            if chr(code) not in used:
                return chr(code)
    raise ChatError("the messages hold every private-use character of Unicode, and one is "
                    "needed to mark where their texts go: remove them")


def split(messages: list[dict[str, Any]], text: str, marked: str, mark: str
          ) -> list[str] | None:
    """``text`` cut into template text and message content, alternately (template first):
    ``marked`` (the template rendered with ``{mark}{index}{mark}`` for each content) gives the
    template's own text, and each content must appear between two pieces as it is or
    trimmed, as templates write it. None where the two do not line up."""
    # the template's pieces, and which message each placeholder stands for (a template may
    # drop or repeat messages)
    cut = marked.split(mark)
    if len(cut) % 2 == 0:
        return None
    pieces, order = cut[0::2], cut[1::2]
    if not all(i.isdigit() and int(i) < len(messages) for i in order):
        return None
    out, pos = [pieces[0]], len(pieces[0])
    if not text.startswith(pieces[0]):
        return None
    for i, after in zip(order, pieces[1:]):
        content = messages[int(i)]["content"]
        for form in dict.fromkeys((content, content.strip(), content.rstrip(),
                                   content.lstrip())):
            if text.startswith(form, pos) and text.startswith(after, pos + len(form)):
                out += [form, after]
                pos += len(form) + len(after)
                break
        else:
            return None
    return out if pos == len(text) else None


def check_messages(messages: Any) -> None:
    """Raise ``ChatError`` naming the first malformed message."""
    if not isinstance(messages, list) or not messages:
        raise ChatError("messages must be a non-empty list of {role, content} objects")
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise ChatError(f"messages[{i}] must be an object with role and content")
        if m.get("role") not in ROLES:
            raise ChatError(f"messages[{i}].role={m.get('role')!r}: must be one of "
                            f"{', '.join(ROLES)}")
        if not isinstance(m.get("content"), str):
            raise ChatError(f"messages[{i}].content must be a string, got "
                            f"{type(m.get('content')).__name__}")
