"""Stop text compiled into a table on token ids, so a decoding step finds a turn's end without detokenising.

A turn ends once its text holds the stop text (`</tool_call>`). Byte-level BPE spells that text in many ways
(one token `</tool_call>`, or `</`, `tool`, `_call`, `>\\n`, ...), and it may end inside a token. So each row keeps
how much of the stop text its output ends with: the state of a Knuth–Morris–Pratt matcher over the output's bytes.
`StopMatcher.table[state, token]` is the state after the token's bytes; reaching `len(stop)` means the stop text is
complete. One gather per step on the device, for all rows; the table has (len(stop) + 1) × vocabulary entries.

For example with stop text `ab`: after a token `xa` the state is 1 (the output ends with `a`); a following token
`b!` reaches 2 within its bytes, so the row stops there, as decoding the output and searching it would say.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase
from transformers.convert_slow_tokenizer import bytes_to_unicode


def token_bytes(tokenizer: PreTrainedTokenizerBase) -> list[bytes]:
    """Each token id's bytes as they appear in decoded text: an added token's content, a byte-level piece mapped
    back to its bytes, else the token decoded alone (a SentencePiece piece)."""
    byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
    added = {index: token.content for index, token in tokenizer.added_tokens_decoder.items()}
    pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    out = []
    for index, piece in enumerate(pieces):
        if index in added:
            out.append(added[index].encode())
        elif piece is not None and all(char in byte_of for char in piece):
            out.append(bytes(byte_of[char] for char in piece))
        else:
            out.append(tokenizer.decode([index], skip_special_tokens=False).encode())
    return out


def _failure(stop: bytes) -> list[int]:
    """KMP failure function: for each prefix length q, the longest proper border of stop[:q]."""
    fail = [0] * (len(stop) + 1)
    border = 0
    for q in range(1, len(stop)):
        while border and stop[q] != stop[border]:
            border = fail[border]
        if stop[q] == stop[border]:
            border += 1
        fail[q + 1] = border
    return fail


class StopMatcher:
    """Per-row progress through the stop text, advanced one sampled token at a time on the device."""

    def __init__(self, pieces: list[bytes], stop: str, device: torch.device) -> None:
        target = stop.encode()
        fail = _failure(target)
        self.full = full = len(target)
        byte_step = torch.zeros(full + 1, 256, dtype=torch.long)  # (S, 256): the matcher's move on one byte
        for state in range(full):
            for byte in range(256):
                q = state
                while q and target[q] != byte:
                    q = fail[q]
                byte_step[state, byte] = q + 1 if target[q] == byte else 0
        byte_step[full] = full  # a complete match stays complete
        # every token's bytes at once, one byte position at a time; -1 pads the shorter pieces
        width = max(map(len, pieces), default=0)
        padded = torch.full((len(pieces), width), -1, dtype=torch.long)  # (V, W)
        for token, piece in enumerate(pieces):
            padded[token, : len(piece)] = torch.tensor(list(piece), dtype=torch.long)
        table = torch.arange(full + 1)[:, None].expand(full + 1, len(pieces)).clone()  # (S, V)
        for column in padded.T:  # (V,)
            moved = byte_step[table, column.clamp(min=0)[None, :]]
            table = torch.where(column[None, :] >= 0, moved, table)
        self.table = table.to(torch.uint8 if full < 256 else torch.long).to(device)

    @classmethod
    def for_tokenizer(
        cls, tokenizer: PreTrainedTokenizerBase, stop: str, device: torch.device, *, vocab_size: int = 0
    ) -> StopMatcher:
        """The matcher for `tokenizer`'s tokens, over `vocab_size` ids where the model's output is wider than the
        tokenizer (Qwen2.5's 151,936 logits for 151,665 tokens): the ids past the tokenizer spell no text."""
        pieces = token_bytes(tokenizer)
        return cls(pieces + [b""] * (vocab_size - len(pieces)), stop, device)

    def advance(self, state: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """States (R,) after each row's token (R,); a state equal to `full` means the stop text is complete."""
        return self.table[state.long(), tokens]
