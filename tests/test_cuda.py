"""The agent and the trainer on a CUDA GPU (skipped without one; `make gpu-check` runs these first): the tiny model
loads in bfloat16 without the CPU fast paths, rollouts sample on the GPU and repeat with their seed, an update trains
there and checkpoints, and the GPU gives the CPU's log-probs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from agent_fixtures import TEXTS, ScriptedEnv, batch, perturb_trainable, tiny_config
from test_rl_trainer import VowelEnv

from r1trade.config import load_config
from r1trade.models.loading import CPU_KERNELS_ENV, cpu_kernels, load_agent_models, model_dtype
from r1trade.models.scoring import token_logprobs_and_entropy
from r1trade.rl.trainer import Trainer
from r1trade.rollout.backend import SamplingConfig
from r1trade.rollout.build import transformers_engine

pytestmark = pytest.mark.cuda


@pytest.fixture(autouse=True)
def _kernels_setting_from_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CPU_KERNELS_ENV, raising=False)


def test_the_tiny_model_loads_in_bfloat16_without_the_cpu_fast_paths() -> None:
    config = tiny_config(dtype="auto")  # LoRA on frozen weights: bfloat16 where the GPU multiplies it
    assert cpu_kernels(config.cpu_kernels) is None  # `auto`, and still off
    assert model_dtype(config) == torch.bfloat16
    models = load_agent_models(config, seed=0)
    linears = {type(m).__name__ for m in models.policy.modules() if isinstance(m, torch.nn.Linear)}
    assert linears == {"Linear"}  # torch's, not the oneDNN ones
    assert models.policy.config._attn_implementation == "sdpa"
    policy = models.policy.to("cuda")
    assert policy.get_base_model().model.embed_tokens.weight.dtype == torch.bfloat16
    backend = transformers_engine(policy, models.tokenizer, SamplingConfig()).backend
    assert backend.device.type == "cuda" and backend.cpu is None and not backend.shared_prefix


def test_rollouts_sample_on_the_gpu_and_repeat_with_their_seed() -> None:
    models = load_agent_models(tiny_config(dtype="auto"), seed=0)
    engine = transformers_engine(models.policy.to("cuda"), models.tokenizer, SamplingConfig(max_new_tokens=16))

    def play() -> list:
        envs = [ScriptedEnv(turns=3, reset_every=2) for _ in range(4)]
        return engine.run(envs, seeds=list(range(4)), generator=torch.Generator().manual_seed(7))

    first, second = play(), play()
    for a, b in zip(first, second, strict=True):
        assert [s.token_ids for s in a.segments] == [s.token_ids for s in b.segments]
        assert all(lp <= 0 for s in a.segments for lp in s.logprobs)
    assert sum(t.num_action_tokens for t in first) > 0


@pytest.mark.parametrize(("algorithm", "minibatches"), [("ppo", "rows"), ("grpo", "groups")])
def test_an_update_trains_on_the_gpu_and_checkpoints(tmp_path: Path, algorithm: str, minibatches: str) -> None:
    config = load_config(None, [
        "model.name_or_path=tiny-random", "model.dtype=auto", f"train.algorithm={algorithm}", "train.group_size=2",
        f"train.minibatches={minibatches}", "rollout.num_envs=8", "rollout.max_new_tokens=8", "train.epochs=1",
        "train.minibatch_size=4", "train.micro_batch_size=2", "train.learning_rate=0.003", "train.updates=1",
    ])
    models = load_agent_models(config.model, seed=0)
    trainer = Trainer(config, models, lambda n: [VowelEnv(turns=2) for _ in range(n)], tmp_path)
    assert trainer.distributed.device.type == "cuda"
    adapters = {name: p.detach().cpu().clone() for name, p in models.policy.named_parameters() if p.requires_grad}
    metrics = trainer.update()
    assert {p.device.type for p in models.policy.parameters()} == {"cuda"}
    assert metrics["skipped_steps"] == 0 and metrics["grad_norm"] > 0
    assert all(torch.isfinite(torch.tensor(metrics[key])) for key in ("loss", "kl_ref", "entropy"))
    trained = dict(models.policy.named_parameters())
    assert any(not torch.equal(trained[name].detach().cpu(), before) for name, before in adapters.items())
    trainer.state.step = 1
    assert (trainer.save() / "policy").is_dir()


def test_the_gpu_gives_the_cpus_log_probs() -> None:
    models, in_bf16 = (load_agent_models(tiny_config(dtype=dtype), seed=0) for dtype in ("float32", "bfloat16"))
    for agent in (models, in_bf16):
        perturb_trainable(agent.policy)  # the same LoRA adapter on both, one that changes the outputs
    ids, mask = batch(models, TEXTS)
    on_gpu = copy.deepcopy(models.policy).to("cuda")
    with torch.no_grad():
        cpu = token_logprobs_and_entropy(models.policy, ids, mask)
        gpu = token_logprobs_and_entropy(on_gpu, ids.cuda(), mask.cuda())
        bf16 = token_logprobs_and_entropy(in_bf16.policy.to("cuda"), ids.cuda(), mask.cuda())
    for expected, found in zip(cpu, gpu, strict=True):
        torch.testing.assert_close(found.cpu(), expected, rtol=1e-4, atol=1e-4)
    scored = cpu[0] != 0
    assert scored.any()
    assert (bf16[0].cpu() - cpu[0])[scored].abs().max() < 0.05  # bfloat16 base weights: close, not equal



def test_the_decoding_step_is_captured_as_cuda_graphs_and_gives_the_eager_steps_turns() -> None:
    """By default on CUDA the steps run in fixed-shape workspaces replayed as graphs: captured once per bucket,
    kept across rollouts, and giving the growing cache's eager turns token for token."""
    models = load_agent_models(tiny_config(dtype="float32"), seed=0)
    policy = models.policy.to("cuda")
    sampling = SamplingConfig(max_new_tokens=16, greedy=True)
    captured_engine = transformers_engine(policy, models.tokenizer, sampling)
    eager_engine = transformers_engine(policy, models.tokenizer, sampling, fixed_step=False)

    def play(engine) -> list:
        return engine.run([ScriptedEnv(turns=3, reset_every=2) for _ in range(5)], seeds=list(range(5)))

    captured = play(captured_engine)
    graphs = {key: space.graph for key, space in captured_engine.backend.workspaces._spaces.items()}
    assert graphs and all(graph is not None for graph in graphs.values())
    again, eager = play(captured_engine), play(eager_engine)
    kept = captured_engine.backend.workspaces._spaces
    assert all(kept[key].graph is graph for key, graph in graphs.items() if key in kept)  # replayed, not captured
    for a, b, c in zip(captured, again, eager, strict=True):
        tokens = [s.token_ids for s in a.segments]
        assert tokens == [s.token_ids for s in b.segments] == [s.token_ids for s in c.segments]
        for x, y in zip(a.segments, c.segments, strict=True):
            torch.testing.assert_close(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4, rtol=0)
