"""A checkpoint's own chat template, rendered the way transformers renders it.

Hugging Face checkpoints carry their prompt format as a Jinja template: ``chat_template`` in
``tokenizer_config.json`` (a string, or a list of named templates of which "default" is used),
or the file ``chat_template.jinja`` that newer transformers versions write; llama.cpp keeps the
same text in a GGUF's ``tokenizer.chat_template`` (which ``iron.lm.gguf_import`` copies into
``tokenizer_config.json``). As transformers does (``apply_chat_template``), the template runs
in Jinja's immutable sandbox, with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
extension, a ``tojson`` filter and ``raise_exception``, and gets ``messages``,
``add_generation_prompt``, ``bos_token`` and ``eos_token``. The sandbox keeps a template from
calling anything but the plain data it is given: rendering never executes code from the
checkpoint.

``ChatTemplate.tokenize`` turns a conversation into token ids with the text of every message
kept as text: a special token written in a message (``<|im_end|>`` typed by a user) is
tokenized as its characters, so a message cannot close its turn and write another role's; only
the template's own markers are control tokens.
"""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from typing import Any

from ..errors import IronError
from ..jsonfile import loads
from ..util import read_bounded
from .special_tokens import frame

ROLES = ("system", "user", "assistant")

#: a message's content stands in the template's second rendering as a run of this private-use
#: character, the message's index and ``PLACEHOLDER_END``
PLACEHOLDER_RUN = re.compile("\ue000+")
PLACEHOLDER_END = "\ue001"


class ChatError(IronError, ValueError):
    """A chat template is missing or broken, or a conversation is malformed."""


def _token_text(value: Any) -> str:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else ""


class ChatTemplate:
    """A compiled chat template and the special tokens it may refer to."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "",
                 where: str = "chat template"):
        import jinja2
        import jinja2.ext
        import jinja2.sandbox

        def raise_exception(message):
            raise ChatError(f"{where}: the template refused the conversation: {message}")

        def tojson(value, indent=None):
            return json.dumps(value, indent=indent, ensure_ascii=False)

        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        try:
            self.template = env.from_string(source)
        except jinja2.TemplateError as e:
            raise ChatError(f"{where}: not a valid Jinja template ({e})") from None
        self.source, self.bos_token, self.eos_token, self.where = (source, bos_token, eos_token,
                                                                   where)
        # (a tokenizer, its copy for message text, a pattern of its special tokens' text)
        self._plain: tuple[Any, Any, re.Pattern] | None = None
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

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt text of ``messages`` (each {"role": system|user|assistant, "content":
        str}), ending with the assistant's turn opened when ``add_generation_prompt``."""
        check_messages(messages)
        import jinja2

        try:
            return self.template.render(messages=messages, bos_token=self.bos_token,
                                        eos_token=self.eos_token,
                                        add_generation_prompt=add_generation_prompt)
        except jinja2.TemplateError as e:
            raise ChatError(f"{self.where}: rendering failed ({type(e).__name__}: {e})") from None


    def tokenize(self, messages: list[dict[str, Any]], tokenizer,
                 add_generation_prompt: bool = True) -> list[int]:
        """The token ids of ``render(messages)`` (a ``tokenizers.Tokenizer``), with every
        message's text tokenized as text, special token strings in it included.

        The template is rendered a second time with each message's content replaced by a
        placeholder: what lies between the placeholders is the template's own text, whose
        special tokens stay special. Where a template rewrites the content (trims it, or
        branches on it) so that the two renderings do not line up, the plain tokenization is
        kept as long as no message holds a special token's text, and refused otherwise (one
        line naming the message and the token)."""
        text = self.render(messages, add_generation_prompt)
        plain, specials = self._plain_tokenizer(tokenizer)
        found = [(i, hit.group()) for i, hit in ((i, specials.search(m["content"]))
                                                 for i, m in enumerate(messages)) if hit]
        if not found:
            return frame(tokenizer, tokenizer.encode(text, add_special_tokens=False).ids)
        pieces = self._split(messages, text, add_generation_prompt)
        if pieces is None:
            i, s = found[0]
            raise ChatError(f"messages[{i}].content holds the control token {s!r}, and "
                            f"{self.where} rewrites message text, so it cannot be kept as "
                            "text: remove it from the message")
        # even pieces are the template's, odd ones a message's content
        ours = tokenizer.encode_batch(pieces[0::2], add_special_tokens=False)
        theirs = plain.encode_batch(pieces[1::2], add_special_tokens=False)
        ids: list[int] = []
        for k, encoding in enumerate(ours):
            ids += encoding.ids
            if k < len(theirs):
                ids += theirs[k].ids
        return frame(tokenizer, ids)

    def _split(self, messages: list[dict[str, Any]], text: str, add_generation_prompt: bool
               ) -> list[str] | None:
        """``text`` cut into template text and message content, alternately (template first):
        the template rendered with placeholders for the contents gives its own text, and each
        content must appear between two pieces as it is or trimmed, as templates write it.

        One pass over each text: the placeholders are found by one regular expression (a
        rescan of the text per placeholder made a conversation of n messages take n^3)."""
        # the placeholder's lead: longer than any run of its character in a message
        longest = max((len(run) for m in messages for run in PLACEHOLDER_RUN.findall(
            m["content"])), default=0)
        tag = PLACEHOLDER_RUN.pattern[0] * (longest + 1)
        marked = self.render([{**m, "content": f"{tag}{i}{PLACEHOLDER_END}"}
                              for i, m in enumerate(messages)], add_generation_prompt)
        # the template's pieces, and which message each placeholder stands for (a template may
        # drop or repeat messages)
        pieces, order, last = [], [], 0
        for hit in re.finditer(re.escape(tag) + r"(\d+)" + PLACEHOLDER_END, marked):
            i = int(hit.group(1))
            if i >= len(messages):
                return None
            pieces.append(marked[last:hit.start()])
            order.append(i)
            last = hit.end()
        pieces.append(marked[last:])
        out, pos = [pieces[0]], len(pieces[0])
        if not text.startswith(pieces[0]):
            return None
        for i, after in zip(order, pieces[1:]):
            content = messages[i]["content"]
            for form in dict.fromkeys((content, content.strip(), content.rstrip(),
                                       content.lstrip())):
                if text.startswith(form, pos) and text.startswith(after, pos + len(form)):
                    out += [form, after]
                    pos += len(form) + len(after)
                    break
            else:
                return None
        return out if pos == len(text) else None

    def _plain_tokenizer(self, tokenizer):
        """A copy of ``tokenizer`` that encodes special token strings as text, and a pattern
        finding its special tokens' text (made once per tokenizer)."""
        with self._lock:
            if self._plain is None or self._plain[0] is not tokenizer:
                from tokenizers import Tokenizer

                plain = Tokenizer.from_str(tokenizer.to_str())
                plain.encode_special_tokens = True
                specials = sorted({t.content for t in tokenizer.get_added_tokens_decoder()
                                   .values() if t.special and t.content}, key=len, reverse=True)
                pattern = re.compile("|".join(map(re.escape, specials)) or "(?!)")
                self._plain = (tokenizer, plain, pattern)
            return self._plain[1:]


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
