"""Text from tokens as they come, one sample at a time.

A byte-level BPE token may end inside a character: a Hangul syllable is three UTF-8 bytes, and a
token may hold one or two of them. Decoding the tokens so far then ends in U+FFFD, the replacement
character, which the next token would have turned into the syllable. So the text is decoded whole
each time and only what lies past the text already sent is emitted, and nothing while it ends in
U+FFFD (the incremental detokenizing of Hugging Face's TextStreamer and vLLM). At the end, whatever is
left is sent as it decodes: the streamed pieces always add up to the text of every token.
Special tokens (the eos that ends a sample) are not text.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalText:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.sent = ""

    def text(self) -> str:
        return self.tokenizer.decode(self.ids, skip_special_tokens=True)

    def add(self, ids) -> str:
        """Take new tokens; returns the text they complete (maybe none yet)."""
        self.ids += ids
        text = self.text()
        if text.endswith(REPLACEMENT) or not text.startswith(self.sent):
            return ""
        return self._emit(text)

    def flush(self) -> str:
        """The rest, as it decodes (a character cut at the end stays U+FFFD)."""
        return self._emit(self.text())

    def _emit(self, text: str) -> str:
        delta = text[len(self.sent):]
        self.sent = text
        return delta
