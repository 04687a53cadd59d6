"""Tool schemas baked into a chat template: the template renders them without `tools=` exactly as TRL's
GRPOTrainer renders them with it, r1trade's own renderer then shows the env's answers as TRL does, and a warm start
for TRL keeps them in its demonstrations and its saved tokenizer."""

from __future__ import annotations

import pytest
from trl_fixtures import TRL, trl_config

from r1trade.config import load_config
from r1trade.errors import ConfigError
from r1trade.integrations.trl import environment_factory, tool_schemas
from r1trade.integrations.trl.engine import without_tools_of
from r1trade.integrations.trl.environment import tool_names
from r1trade.models.baked_tools import bake_tools, baked_tools, without_baked_tools
from r1trade.models.chat import ChatTokens
from r1trade.models.tokenizer import build_tiny_tokenizer
from r1trade.warmstart import collect_demonstrations

CONVERSATION = [
    {"role": "system", "content": "You trade. é"},
    {"role": "user", "content": "Price 100.00."},
]


@pytest.fixture(scope="module")
def qwen_tokenizer():
    return build_tiny_tokenizer(tool_template=True)


def test_the_baked_template_renders_the_tools_as_trl_passes_them(qwen_tokenizer) -> None:
    config = trl_config()
    env = environment_factory(config)()
    methods = [getattr(env, name) for name in tool_names(type(env))]  # what GRPOTrainer passes as tools=
    template = qwen_tokenizer.chat_template
    by_trl = qwen_tokenizer.apply_chat_template(CONVERSATION, tools=methods, tokenize=False, add_generation_prompt=True)

    baked = bake_tools(template, tool_schemas(config))
    rendered = qwen_tokenizer.apply_chat_template(CONVERSATION, chat_template=baked, tokenize=False,
                                                  add_generation_prompt=True)
    assert rendered == by_trl and '"name": "place_order"' in rendered  # the tools block, not just the prompt
    again = qwen_tokenizer.apply_chat_template(CONVERSATION, tools=methods, chat_template=baked, tokenize=False,
                                               add_generation_prompt=True)
    assert again == by_trl  # TRL passing the tools itself changes nothing
    assert baked_tools(baked) == tool_schemas(config)
    assert without_baked_tools(baked) == template  # the text TRL recognises the template by
    assert baked_tools(template) is None and without_baked_tools(template) == template and baked_tools(None) is None


def test_baking_refuses_a_second_bake_and_a_null() -> None:
    baked = bake_tools("{{ messages }}", [{"name": "a", "flag": True, "n": 1.5}])
    assert baked_tools(baked) == [{"name": "a", "flag": True, "n": 1.5}]
    with pytest.raises(ValueError, match="already"):
        bake_tools(baked, [])
    with pytest.raises(ValueError, match="null"):
        bake_tools("{{ messages }}", [{"default": None}])
    for damaged in (baked.replace('"name": "a"', '"name": '), baked.replace("end of r1trade baked tools", "x")):
        with pytest.raises(ConfigError, match="damaged block of baked tools"):
            baked_tools(damaged)


def test_with_baked_tools_the_envs_answer_is_one_tool_message_as_trl_shows_it(qwen_tokenizer) -> None:
    schemas = tool_schemas(trl_config())
    plain = ChatTokens(qwen_tokenizer)
    answer = [{"role": "tool", "content": "Candles: 3 bars."}, {"role": "user", "content": "Decision 2/2."}]
    assert not plain.tool_messages
    assert "<tool_response>" not in qwen_tokenizer.decode(plain.continuation(answer))  # plain user turns

    qwen_tokenizer.chat_template = bake_tools(without_baked_tools(qwen_tokenizer.chat_template), schemas)
    try:
        chat = ChatTokens(qwen_tokenizer)
        turn = '<tool_call>{"name": "get_candles", "arguments": {"n": 3}}</tool_call>'
        sampled = qwen_tokenizer(turn, add_special_tokens=False)["input_ids"]
        ids = chat.context(CONVERSATION) + sampled + chat.closing(sampled) + chat.continuation(answer)
        # TRL: the env's answer to a call is one tool message, the next observation after the tool's result
        trl_view = [*CONVERSATION, {"role": "assistant", "content": turn},
                    {"role": "tool", "name": "get_candles", "content": "Candles: 3 bars.\n\nDecision 2/2."}]
        expected = qwen_tokenizer.apply_chat_template(trl_view, tokenize=False, add_generation_prompt=True)
        assert chat.tool_messages and qwen_tokenizer.decode(ids) == expected
    finally:
        qwen_tokenizer.chat_template = without_baked_tools(qwen_tokenizer.chat_template)


def test_a_warm_start_for_trl_renders_its_demonstrations_with_the_tools(qwen_tokenizer) -> None:
    config = load_config("smoke", [*TRL, "warmstart.policy=random", "warmstart.max_info_calls=1"])
    qwen_tokenizer.chat_template = bake_tools(without_baked_tools(qwen_tokenizer.chat_template), tool_schemas(config))
    try:
        examples = collect_demonstrations(config, ChatTokens(qwen_tokenizer), episodes=4, seed=0)
        texts = [qwen_tokenizer.decode(example["input_ids"]) for example in examples]
    finally:
        qwen_tokenizer.chat_template = without_baked_tools(qwen_tokenizer.chat_template)
    assert all("<tools>" in text and '"name": "place_order"' in text for text in texts)
    answered = [text for text in texts if "<tool_response>" in text]
    assert answered  # an information call's result reached the model as TRL shows it
    for example in examples:  # the model learns its own turns only
        taught = qwen_tokenizer.decode([i for i, m in zip(example["input_ids"], example["completion_mask"],
                                                          strict=True) if m])
        assert "<tools>" not in taught and "<tool_response>" not in taught and "<tool_call>" in taught


def test_trl_gets_the_template_it_recognises_and_only_for_the_envs_tools(qwen_tokenizer) -> None:
    config = trl_config()
    template = qwen_tokenizer.chat_template
    assert without_tools_of(qwen_tokenizer, config) is qwen_tokenizer  # nothing baked: the model's own
    qwen_tokenizer.chat_template = bake_tools(template, tool_schemas(config))
    try:
        for_trl = without_tools_of(qwen_tokenizer, config)
        assert for_trl.chat_template == template and baked_tools(qwen_tokenizer.chat_template) is not None
        price_only = trl_config("env.observation=price_only")  # one more tool: get_changes
        with pytest.raises(ConfigError, match="warm-started for other tools"):
            without_tools_of(qwen_tokenizer, price_only)
    finally:
        qwen_tokenizer.chat_template = template
