"""Chat pieces as token ids, rendered with the tokenizer's own chat template: a fresh context, what follows a closed
assistant turn, and the template's closing of a turn. Trajectories and demonstrations are both built from these."""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

from r1trade.errors import UsageError
from r1trade.models.baked_tools import baked_tools
from r1trade.models.chat_template import render_chat, template_file


class ChatTokens:
    """Token ids for chat pieces, rendered with the tokenizer's own chat template.

    Only text the environment wrote is tokenized (each piece once); the model's own turns are kept as ids. Every
    render is bounded in time (`r1trade.models.chat_template.render_chat`).
    Tool results (`tool`) are sent as `user` turns, except with a template that has tools baked in
    (`r1trade.models.baked_tools`: a model warm-started for TRL): there the env's answer to a turn is one `tool`
    message, as TRL's GRPOTrainer shows it, so such a model is played in the conversation it trained on.
    """

    _PROBE = "\u2063r1trade-probe\u2063"

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.tool_messages = baked_tools(tokenizer.chat_template) is not None
        self._stub = [{"role": "system", "content": "x"}]
        head = self._render(self._stub, generation_prompt=False)
        with_turn = self._render([*self._stub, {"role": "assistant", "content": self._PROBE}], False)
        if self._PROBE not in with_turn:
            raise UsageError(f"{template_file(tokenizer)}: the chat template leaves out the text of an assistant turn")
        self.turn_closing = self._ids(with_turn[with_turn.index(self._PROBE) + len(self._PROBE) :])
        self._head_len = len(head)
        eos = tokenizer.convert_tokens_to_ids(tokenizer.eos_token) if tokenizer.eos_token else None
        self.stop_ids = {i for i in (eos, self.turn_closing[0] if self.turn_closing else None) if i is not None}

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return render_chat(self.tokenizer, [self._role(m) for m in messages], add_generation_prompt=generation_prompt)

    def _role(self, message: dict) -> dict:
        if message["role"] in ("system", "user", "assistant") or (self.tool_messages and message["role"] == "tool"):
            return message
        return {**message, "role": "user"}

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def context(self, messages: list[dict]) -> list[int]:
        """A whole fresh context, ending with the assistant generation prompt."""
        return self._ids(self._render(messages, generation_prompt=True))

    def continuation(self, messages: list[dict]) -> list[int]:
        """Messages appended after a closed assistant turn, ending with the generation prompt."""
        if self.tool_messages:
            messages = [{"role": "tool", "content": "\n\n".join(message["content"] for message in messages)}]
        full = self._render([*self._stub, *messages], generation_prompt=True)
        return self._ids(full[self._head_len :])

    def closing(self, sampled: Sequence[int]) -> list[int]:
        """What the template puts after an assistant turn, minus what the model already sampled of it."""
        closing = self.turn_closing
        overlap = next(
            (k for k in range(min(len(closing), len(sampled)), 0, -1) if list(sampled[-k:]) == closing[:k]), 0
        )
        return closing[overlap:]
