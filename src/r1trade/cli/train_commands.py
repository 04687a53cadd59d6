"""Commands that train a policy or look at one: the env check, an episode, the warm start, RL, its curves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from r1trade.cli.app import ConfigOption, SetOption, app, console, print_wrote, resolve_config
from r1trade.config import load_config
from r1trade.errors import TrainingInterrupted, UsageError
from r1trade.outputs import resolve_output, write_file


@app.command("check-env")
def check_env(
    config: ConfigOption = "btc_momentum",
    set_: SetOption = None,
    episodes: Annotated[int, typer.Option(help="episodes per scripted policy")] = 5,
    split: Annotated[str, typer.Option(help="data split to replay")] = "train",
) -> None:
    """Run scripted policies (random, malformed, momentum) through the env and check determinism."""
    resolved = resolve_config(config, set_)
    from r1trade.env.check import render_check_report, run_check_env

    report = run_check_env(resolved, episodes=episodes, seed=resolved.seed, split=split)
    console.print(render_check_report(report))


@app.command("show-rollout")
def show_rollout(
    config: ConfigOption = "smoke",
    set_: SetOption = None,
    checkpoint: Annotated[Path | None, typer.Option(help="checkpoint directory (default: the untrained model)")] = None,
    split: Annotated[str, typer.Option(help="data split to replay")] = "train",
    greedy: Annotated[bool, typer.Option(help="greedy decoding instead of sampling")] = False,
) -> None:
    """Play one episode and print it: sampled tokens highlighted, masked tokens dimmed, rewards per turn.

    With a checkpoint the episode follows the run's own config (--config is not read), with --set applied to it,
    so `--set seed=N` shows another episode of the same policy."""
    import torch

    from r1trade.env.trading_env import make_envs
    from r1trade.models.loading import load_agent_models
    from r1trade.rl.checkpoint import load_trained_agent
    from r1trade.rollout.backend import sampling_from_config
    from r1trade.rollout.build import transformers_engine
    from r1trade.rollout.viewer import render_trajectory

    if checkpoint is not None:
        resolved, models = load_trained_agent(checkpoint, set_ or [])
    else:
        resolved = resolve_config(config, set_)
        models = load_agent_models(resolved.model, seed=resolved.seed)
    engine = transformers_engine(models.policy, models.tokenizer, sampling_from_config(resolved.rollout, greedy=greedy))
    generator = torch.Generator().manual_seed(resolved.seed)
    (trajectory,) = engine.run(make_envs(resolved, 1, split), [resolved.seed], generator=generator)
    console.print(render_trajectory(models.tokenizer, trajectory))


@app.command()
def warmstart(
    config: ConfigOption = "btc_momentum",
    set_: SetOption = None,
) -> None:
    """Supervised warm start on demonstrations in the tool-call format (TRL SFTTrainer); writes a model.

    `--set warmstart.policy=random` demonstrates uniformly random trades (format only, entropy over actions kept);
    the default `rule` demonstrates a trend rule. With `--set train.engine=trl` the demonstrations are rendered as
    TRL's GRPOTrainer renders an episode, the env's tool schemas in the system turn, and the model keeps them."""
    resolved = resolve_config(config, set_)
    from r1trade.warmstart import warmstart as run_warmstart  # torch and the models, once the config is good

    run_dir = Path(resolved.output_dir) / f"{resolved.name}-warmstart"
    resolved.save(run_dir)
    tools = None
    if resolved.train.engine == "trl":
        from r1trade.integrations.trl import tool_schemas

        tools = tool_schemas(resolved)
    model_dir = run_warmstart(resolved, run_dir, tools=tools, console=console)
    console.print(f"warm-started model: [bold]{escape(str(model_dir))}[/bold]")
    console.print(f"train from it with: r1trade train --config ... --set model.name_or_path={model_dir}",
                  markup=False, highlight=False, soft_wrap=True)


@app.command("action-stats")
def action_stats_command(
    config: ConfigOption = "btc_momentum",
    set_: SetOption = None,
    checkpoint: Annotated[Path | None, typer.Option(help="RL checkpoint (default: model.name_or_path)")] = None,
    split: Annotated[str, typer.Option(help="data split to play")] = "test",
    episodes: Annotated[int, typer.Option(min=1, help="held-out episodes (env.episode_decisions each)")] = 16,
    out: Annotated[Path | None, typer.Option(help="write the figures as JSON here")] = None,
) -> None:
    """A policy on held-out decisions: valid calls, action mix, entropy at the decision token."""
    from r1trade.eval.action_stats import action_stats
    from r1trade.models.loading import load_base_model
    from r1trade.rl.checkpoint import load_trained_agent

    resolved = resolve_config(config, set_)
    if checkpoint is not None:
        trained, models = load_trained_agent(checkpoint)
        resolved = resolved.model_copy(update={"rollout": trained.rollout})
        policy, tokenizer = models.policy, models.tokenizer
    else:
        policy, tokenizer = load_base_model(resolved.model)
    stats = action_stats(policy, tokenizer, resolved, split=split, episodes=episodes, seed=resolved.seed)
    table = Table(title=f"{checkpoint or resolved.model.name_or_path} on {episodes} {split} episodes")
    table.add_column("figure")
    table.add_column("greedy", justify="right")
    table.add_column(f"sampled (T={resolved.rollout.temperature:g})", justify="right")
    table.add_row("valid calls", f"{stats.valid_call_rate:.1%}", f"{stats.sampled_valid_call_rate:.1%}")
    for kind, share in stats.mix.items():
        table.add_row(f"  {kind}", f"{share:.1%}", f"{stats.sampled_mix[kind]:.1%}")
    table.add_row("direction accuracy", f"{stats.direction_accuracy:.1%}", f"{stats.sampled_direction_accuracy:.1%}")
    console.print(table)
    console.print(
        f"{stats.decisions} greedy trade decisions: entropy at the decision token {stats.decision_token_entropy:.3f} "
        f"nats; after 'Action:' ({stats.action_prompt_share:.0%} of them) the action choice's entropy is "
        f"{stats.action_entropy:.3f} nats (ln 4 = 1.386), P = "
        + ", ".join(f"{a} {p:.2f}" for a, p in stats.action_probabilities.items())
        + f"; expected direction accuracy there {stats.expected_direction_accuracy:.1%}"
    )
    for label, use in (("greedy", stats.information), (f"sampled (T={resolved.rollout.temperature:g})",
                                                      stats.sampled_information)):
        tools = ", ".join(f"{name} {rate:.0%}" for name, rate in use["tool_rates"].items()) or "none"
        console.print(f"{label}: information calls before {use['info_call_rate']:.0%} of trades ({tools})")
    if out is not None:
        write_file(out, json.dumps(stats.to_dict(), indent=1) + "\n")


@app.command()
def train(
    config: ConfigOption = "btc_momentum",
    set_: SetOption = None,
    resume: Annotated[Path | None, typer.Option(help="run directory to continue from its last checkpoint")] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="start over in a run directory that holds an earlier run (deletes what the run wrote, all or "
            "nothing; a symbolic link there is removed as a link, never what it points to)",
        ),
    ] = False,
) -> None:
    """Train the agent with multi-turn RL (PPO, GRPO, Dr. GRPO, RLOO or REINFORCE++); writes runs/<name>/
    (with train.walk_forward K, one agent per fold in runs/<name>/fold-<k>/)."""
    if resume is not None:
        if force:
            raise UsageError("--force starts a run over and --resume continues one: give one of them")
        if not (resume / "config.yaml").is_file():
            raise UsageError(f"cannot resume: '{resume}' is not a run directory (no config.yaml)")
        resolved = load_config(resume / "config.yaml", set_ or [])
        run_dir = resolve_output(resume)
    else:
        resolved = resolve_config(config, set_)
        run_dir = resolve_output(Path(resolved.output_dir) / resolved.name)  # `..` and links followed
    from r1trade.train import train_run  # torch and the models, once the options are known to be good

    try:
        checkpoint = train_run(resolved, run_dir, resume=resume is not None, force=force, console=console)
    except TrainingInterrupted as stop:
        again = f"r1trade train --resume {run_dir}" if stop.checkpoint is not None else "the same command"
        raise stop.continued_by(again) from None
    if resolved.train.walk_forward is None:
        console.print(f"final checkpoint: [bold]{escape(str(checkpoint))}[/bold]")
    else:
        shown = escape(str(run_dir))
        console.print(f"fold agents: [bold]{shown}[/bold] (r1trade backtest --checkpoint {shown})")


@app.command("plot-run")
def plot_run(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `r1trade train`")],
    out: Annotated[Path | None, typer.Option(help="where to write the PNGs (default: the run directory)")] = None,
) -> None:
    """Draw a run's learning curves (return, PnL, valid calls, entropy, KL, each reward component) as PNGs."""
    from r1trade.rl.plots import plot_learning_curves

    for path in plot_learning_curves(run_dir, out):
        print_wrote(str(path))


@app.command("compare-runs")
def compare_runs(
    run_dirs: Annotated[list[Path], typer.Argument(help="two or more run directories written by `r1trade train`")],
    out: Annotated[
        Path, typer.Option(help="the PNG to write (.png is added to a name without a suffix)")
    ] = Path("reports/compare-runs.png"),
    metric: Annotated[
        list[str] | None, typer.Option(help="a metrics.jsonl key to draw (repeatable; default: return, valid"
                                            " calls, PnL, entropy)")
    ] = None,
) -> None:
    """Overlay several runs' learning curves (ablations, algorithm comparisons) in one PNG."""
    from r1trade.rl.plots import plot_comparison

    print_wrote(str(plot_comparison(run_dirs, out, metric)))


@app.command("probe-run")
def probe_run_command(
    run_dir: Annotated[Path, typer.Argument(help="a run directory written by `r1trade train`")],
    every: Annotated[int, typer.Option(min=1, help="probe every N-th checkpoint (and the start and the last)")] = 1,
    points: Annotated[int, typer.Option(min=1, help="held-out decisions, evenly spaced over the split")] = 200,
    split: Annotated[str, typer.Option(help="data split to probe")] = "test",
) -> None:
    """A held-out learning curve: the direction the policy picks at fresh decisions, at its start and checkpoints."""
    from r1trade.eval.probe import probe_run
    from r1trade.rl.plots import plot_probe

    if split not in ("train", "validation", "test"):
        raise UsageError(f"--split must be train, validation or test, not '{split}'")

    def show(record: dict) -> None:
        console.print(
            f"step {record['step']:>4}: expected direction accuracy {record['expected_direction_accuracy']:.1%}, "
            f"greedy {record['greedy_direction_accuracy']:.1%}, P(long) {record['long_share']:.2f}, "
            f"discrimination {_signed(record.get('discrimination'))}, call follows the stated action "
            f"{record['call_follows_word']:.0%} ({record['points']} decisions)"
            + (f"; looked first {record['info_call_rate']:.0%}, at get_changes {record['signal_call_rate']:.0%}"
               if record.get("info_call_rate") is not None else "")
            + ("; by decision " + " ".join(f"{int(k) + 1}: {v:.0%}" for k, v in by_decision.items())
               if len(by_decision := record.get("expected_accuracy_by_decision", {})) > 1 else "")
        )

    records = probe_run(run_dir, every=every, count=points, split=split, on_step=show)
    png = plot_probe(records, run_dir / f"probe-{split}.png")
    print_wrote(f"{run_dir / f'probe-{split}.json'} and {png}")


def _signed(value: float | None) -> str:
    """A probability difference for the console: +0.034, or n/a when it is undefined."""
    return "n/a" if value is None else f"{value:+.3f}"

