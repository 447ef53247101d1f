"""A Hugging Face tokenizer folder, read with the `tokenizers` library (no transformers).

The folder holds `tokenizer.json` and, optionally, `tokenizer_config.json` with
the bos/eos tokens and a Jinja `chat_template`. The template is rendered in a
sandboxed Jinja environment, the way transformers renders it, so a template
cannot reach Python internals. Without a template, ChatML is used.
"""

from __future__ import annotations

import json
from pathlib import Path

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError
from tokenizers import Tokenizer as HFTokenizer

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# What a byte-level tokenizer's decoder gives for bytes that make no whole character (U+FFFD).
BROKEN = "\ufffd"


class TokenizerError(ValueError):
    """A tokenizer folder that cannot be used, with a one-line reason naming it."""


def _token_text(value) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value


def _sandbox() -> ImmutableSandboxedEnvironment:
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(value, indent=None, ensure_ascii=False, sort_keys=False):
        return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


class Tokenizer:
    def __init__(self, folder):
        self.folder = Path(folder)
        tokenizer_file = self.folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise TokenizerError(f"{self.folder}: no tokenizer.json in the tokenizer folder")
        try:
            self._tok = HFTokenizer.from_file(str(tokenizer_file))
        except Exception as err:
            raise TokenizerError(f"{tokenizer_file}: not a Hugging Face tokenizer.json ({err})") from None
        config_file = self.folder / "tokenizer_config.json"
        config = {}
        if config_file.is_file():
            try:
                config = json.loads(config_file.read_text(encoding="utf-8"))
            except json.JSONDecodeError as err:
                raise TokenizerError(f"{config_file}: invalid JSON ({err})") from None
        self.bos_token = _token_text(config.get("bos_token")) or "<|im_start|>"
        self.eos_token = _token_text(config.get("eos_token")) or "<|im_end|>"
        self.bos_id = self._special_id(self.bos_token, "bos_token")
        self.eos_id = self._special_id(self.eos_token, "eos_token")
        template = config.get("chat_template")
        self.has_chat_template = bool(template)
        self.chat_template = template or CHATML_TEMPLATE
        try:
            self._template = _sandbox().from_string(self.chat_template)
        except TemplateError as err:
            raise TokenizerError(f"{config_file}: chat_template does not parse ({err})") from None

    def _special_id(self, token: str, key: str) -> int:
        token_id = self._tok.token_to_id(token)
        if token_id is None:
            raise TokenizerError(f"{self.folder}: {key} {token!r} is not in the vocabulary")
        return token_id

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, no special tokens added."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """The text of `ids`; bytes that make no whole character (a byte-level piece alone, or a
        character cut short) decode to U+FFFD (BROKEN)."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def chat_text(self, messages: list[dict], add_generation_prompt: bool = True, **extra) -> str:
        """Render the chat template (sandboxed), e.g. ChatML's '<|im_start|>user\\n…<|im_end|>\\n…'."""
        try:
            return self._template.render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except SecurityError as err:
            raise TokenizerError(f"{self.folder}: chat_template refused by the sandbox ({err})") from None
        except TemplateError as err:
            raise TokenizerError(f"{self.folder}: chat_template failed to render ({err})") from None


def load_tokenizer(folder) -> Tokenizer:
    return Tokenizer(folder)


# Checkpoints often pad the embedding to a multiple of this (MiniMind's own does not; others do).
VOCAB_PADDING = 128


def vocab_mismatch(tokenizer_vocab: int, model_vocab: int) -> str | None:
    """Why a tokenizer of `tokenizer_vocab` ids cannot belong to a checkpoint of `model_vocab` rows,
    or None when they may. Every id needs a row; a few spare rows are padding, many more mean the
    checkpoint was trained with another, larger tokenizer."""
    if tokenizer_vocab > model_vocab:
        return f"the tokenizer has {tokenizer_vocab} ids but the checkpoint only vocab_size={model_vocab}"
    padded = -(-tokenizer_vocab // VOCAB_PADDING) * VOCAB_PADDING
    if model_vocab > padded:
        return (f"the checkpoint has vocab_size={model_vocab}, far more than the tokenizer's {tokenizer_vocab} ids "
                f"(padding to a multiple of {VOCAB_PADDING} would give {padded}): it was trained with another tokenizer")
    return None
