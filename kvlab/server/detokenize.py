"""Text from tokens as they come, one sample at a time.

A byte-level BPE token may end inside a character: a Hangul syllable is three UTF-8 bytes, and a
token may hold one or two of them. Decoding then ends in U+FFFD, the replacement character, which the
next token would have turned into the syllable. So text is sent only once it decodes whole (the
incremental detokenizing of Hugging Face's TextStreamer and vLLM): the tokens since the last clean
cut are decoded with those of the piece before them, and what that adds past the piece's own text is
the new text, held back while it ends in U+FFFD. Each decode covers a few tokens, not the whole
answer. At the end, whatever is left is sent as it decodes; the pieces add up to the text of every
token (the cuts fall between whole characters). Special tokens (the eos that ends a sample) are not
text.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalText:
    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.piece_start = 0  # where the last piece sent began (a clean cut)
        self.sent_end = 0  # where the text sent ends (a clean cut)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, ids) -> str:
        """Take new tokens; returns the text they complete (maybe none yet)."""
        self.ids += ids
        text = self.decode(self.ids[self.piece_start:])
        if text.endswith(REPLACEMENT):
            return ""
        return self._emit(text)

    def flush(self) -> str:
        """The rest, as it decodes (a character cut at the end stays U+FFFD)."""
        return self._emit(self.decode(self.ids[self.piece_start:]))

    def _emit(self, text: str) -> str:
        before = self.decode(self.ids[self.piece_start:self.sent_end])
        delta = text[len(before):]
        if delta:
            self.piece_start, self.sent_end = self.sent_end, len(self.ids)
        return delta
