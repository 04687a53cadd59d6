"""The decoding step on the device: stop text found by a table on token ids exactly where decoding and searching
would find it, and turns equal to a plain token-by-token decode of each row (no cache, no batch)."""

from __future__ import annotations

import random

import pytest
import torch

from r1trade.models.chat import ChatTokens
from r1trade.models.tokenizer import build_tiny_tokenizer
from r1trade.rollout.backend import Prompt, SamplingConfig
from r1trade.rollout.loop import STOP_TEXT
from r1trade.rollout.stops import StopMatcher, token_bytes
from r1trade.rollout.transformers_backend import TransformersBackend


def test_stop_table_by_hand():
    """Stop text `ab` (states: 0 nothing matched, 1 `a`, 2 complete).
    From 0: `xa` ends with `a` -> 1; `b!` -> 0; `ab` -> 2; `a` -> 1; `b` -> 0; `aab` -> 2.
    From 1: `xa` -> `x` resets, `a` -> 1; `b!` -> `b` completes -> 2 (and stays); `ab` -> `a` falls back to `a` -> 1,
    then `b` -> 2; `a` -> 1; `b` -> 2; `aab` -> 2. From 2: complete stays complete."""
    matcher = StopMatcher([b"xa", b"b!", b"ab", b"a", b"b", b"aab"], "ab", torch.device("cpu"))
    assert matcher.table.tolist() == [[1, 0, 2, 1, 0, 2], [1, 2, 2, 1, 2, 2], [2, 2, 2, 2, 2, 2]]
    state = torch.tensor([0, 1, 0])
    assert matcher.advance(state, torch.tensor([0, 1, 1])).tolist() == [1, 2, 0]


def test_a_border_of_the_stop_text_is_kept():
    """Stop text `aab`: after `a`,`a`,`a` the output still ends with `aa` (state 2), so `b` completes it."""
    matcher = StopMatcher([b"a", b"b"], "aab", torch.device("cpu"))
    state = torch.tensor([0])
    for token in (0, 0, 0):
        state = matcher.advance(state, torch.tensor([token]))
    assert int(state) == 2
    assert int(matcher.advance(state, torch.tensor([1]))) == 3


def test_token_bytes_rebuild_decoded_text():
    tokenizer = build_tiny_tokenizer()
    pieces = token_bytes(tokenizer)
    text = 'Up 3 % é <tool_call>{"name": "hold"}</tool_call>\n<|im_end|>'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert b"".join(pieces[i] for i in ids).decode() == tokenizer.decode(ids, skip_special_tokens=False) == text


def test_stop_found_where_decoding_finds_it():
    """On random token sequences made of pieces of the stop text (whole, split, near misses) and random tokens,
    the table stops at the first token after which the decoded output holds `</tool_call>`, and never earlier."""
    tokenizer = build_tiny_tokenizer()
    matcher = StopMatcher.for_tokenizer(tokenizer, STOP_TEXT, torch.device("cpu"))
    texts = [STOP_TEXT, "</tool", "_call>", "</", "tool_call", ">", "<", " ", "x", "call>\n", '"}</tool_call>\n']
    fragments = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    rng = random.Random(0)
    stops = 0
    for _ in range(300):
        ids = [token for _ in range(6)
               for token in (rng.choice(fragments) if rng.random() < 0.9 else [rng.randrange(len(tokenizer))])]
        expected = next((n for n in range(1, len(ids) + 1) if STOP_TEXT in tokenizer.decode(ids[:n])), None)
        state, found = torch.zeros(1, dtype=torch.long), None
        for n, token in enumerate(ids, start=1):
            state = matcher.advance(state, torch.tensor([token]))
            if found is None and int(state) == matcher.full:
                found = n
        assert found == expected, tokenizer.decode(ids)
        stops += expected is not None
    assert 30 < stops < 270  # both outcomes are exercised


def test_ids_past_the_tokenizer_spell_no_text():
    """A model's output can be wider than its tokenizer (Qwen2.5: 151,936 logits for 151,665 tokens): an id past
    the tokenizer leaves a row's progress through the stop text as it was."""
    tokenizer = build_tiny_tokenizer()
    matcher = StopMatcher.for_tokenizer(tokenizer, STOP_TEXT, torch.device("cpu"), vocab_size=len(tokenizer) + 14)
    assert matcher.table.shape == (len(STOP_TEXT) + 1, len(tokenizer) + 14)
    state = torch.tensor([0, 3, matcher.full])
    assert matcher.advance(state, torch.tensor([len(tokenizer) + 13, len(tokenizer), len(tokenizer) + 1])).tolist() \
        == [0, 3, matcher.full]


def test_a_model_wider_than_its_tokenizer_decodes_past_it():
    """Every logit 0 but those of the 64 ids past the tokenizer: greedy turns sample only those, and run to their
    limit (no text, so no stop text)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tiny_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer) + 64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight[: len(tokenizer)] = 0
    chat = ChatTokens(tokenizer)
    backend = TransformersBackend(model, tokenizer, SamplingConfig(max_new_tokens=6, greedy=True),
                                  stop_ids=chat.stop_ids, stop_text=STOP_TEXT)
    context = chat.context([{"role": "user", "content": "Price 100"}])
    with backend.session():
        [turn] = backend.generate([Prompt(0, tuple(context), fresh=True)], None)
    assert len(turn.token_ids) == 6 and not turn.stopped
    assert min(turn.token_ids) >= len(tokenizer)


def reference_turn(model, ids: list[int], stop_ids: set[int], tokenizer, limit: int) -> tuple[list[int], list[float]]:
    """One row, greedy, the whole context run again at every token: what the batch decode must reproduce."""
    context, out, logprobs = list(ids), [], []
    for _ in range(limit):
        logits = model(input_ids=torch.tensor([context])).logits[0, -1].float()
        logp = torch.log_softmax(logits, dim=-1)
        token = int(logp.argmax())
        out.append(token)
        logprobs.append(float(logp[token]))
        context.append(token)
        if token in stop_ids or STOP_TEXT in tokenizer.decode(out, skip_special_tokens=False):
            break
    return out, logprobs


@pytest.mark.parametrize("read_every", [1, 3])
def test_batched_turns_equal_a_plain_decode_of_each_row(tiny_agent, read_every):
    """Rows of different lengths in one batch (left-padded, one stopping early): every turn equals the plain
    decode, however often the host reads whether all rows have stopped."""
    model, tokenizer = tiny_agent
    chat = ChatTokens(tokenizer)
    backend = TransformersBackend(model, tokenizer, SamplingConfig(max_new_tokens=12, greedy=True),
                                  stop_ids=chat.stop_ids | {7}, stop_text=STOP_TEXT)
    backend.read_every = read_every
    contexts = [chat.context([{"role": "user", "content": text}]) for text in ("Price 100", "Up 2 % in 4 bars, hold?")]
    with backend.session():
        turns = backend.generate([Prompt(i, tuple(ids), fresh=True) for i, ids in enumerate(contexts)], None)
        for ids, turn in zip(contexts, turns, strict=True):
            with torch.no_grad():
                tokens, logprobs = reference_turn(model, ids, chat.stop_ids | {7}, tokenizer, 12)
            assert list(turn.token_ids) == tokens
            assert turn.stopped == (len(tokens) < 12 or tokens[-1] in chat.stop_ids | {7})
            assert torch.allclose(torch.tensor(turn.logprobs), torch.tensor(logprobs), atol=1e-4)


@pytest.mark.parametrize("compact_below", [0.5, 1.0])
def test_rows_set_apart_change_no_turn(tiny_agent, monkeypatch, compact_below):
    """Sampled multi-turn episodes whose turns end at scattered lengths (every ninth token id stops a turn), some
    contexts reset: setting finished rows apart (at half, at once) leaves every token, every log-prob and the
    cache the next turns read unchanged."""
    from agent_fixtures import ScriptedEnv

    from r1trade.rollout.loop import RolloutEngine
    from r1trade.rollout.transformers_backend import _BatchCache

    model, tokenizer = tiny_agent
    chat = ChatTokens(tokenizer)
    copies = []
    rows_copy = _BatchCache.rows_copy
    monkeypatch.setattr(_BatchCache, "rows_copy", lambda self, rows, room: copies.append(len(rows)) or rows_copy(
        self, rows, room=room))
    runs = []
    for setting in (0.0, compact_below):
        sampling = SamplingConfig(max_new_tokens=24, temperature=1.0, compact_below=setting)
        backend = TransformersBackend(model, tokenizer, sampling, stop_ids=chat.stop_ids | set(range(0, 586, 9)),
                                      stop_text=STOP_TEXT)
        envs = [ScriptedEnv(turns=3), ScriptedEnv(turns=4, reset_every=2), ScriptedEnv(turns=2), ScriptedEnv(turns=3)]
        runs.append(RolloutEngine(backend, tokenizer).run(envs, seeds=[0, 1, 2, 3],
                                                          generator=torch.Generator().manual_seed(5)))
        if setting == 0.0:
            assert not copies
    assert copies  # rows were set apart
    for plain, apart in zip(*runs, strict=True):
        assert [s.token_ids for s in plain.segments] == [s.token_ids for s in apart.segments]
        for a, b in zip(plain.segments, apart.segments, strict=True):
            assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
