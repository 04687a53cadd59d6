"""`r1trade seeds`: does a recipe learn? One config through the whole pipeline once per seed, then each
held-out figure over the seeds: mean, standard deviation, worst seed and interquartile mean
(`r1trade.eval.seed_spread`).

Seed S runs in `OUT/seed-S/`, one seed after another, every stage with `seed=S` and `model.tiny_seed=S` on top
of the config and its `--set` overrides:
- `warmstart/`: the warm start (`r1trade warmstart`), when asked; finished once `warmstart.json` is written.
  With `warm_from` (`--warmstart-from OTHER`), seed S starts from `OTHER/seed-S/warmstart/` instead, once that
  warm start is finished and its config equals this one in all that a warm start reads (`warm_start_unread`
  lists the rest): variants of a recipe's RL then start from the same models, a paired comparison;
- `run/`: RL training from the warm start's model (`r1trade train`); finished once the checkpoint of step
  `train.updates` is in place. A run stopped after a checkpoint continues from its last one (`train
  --resume`); one stopped before its first checkpoint starts over. A run of the same config for another
  `train.updates` is this recipe's run (`same_run`): resumed to a larger budget, its first steps kept for a
  smaller one;
- `run/selected_step.json`: the step chosen on the validation split (`r1trade select-step`), among the
  checkpoints up to `train.updates`;
- `restart-K/`: with restarts (`seeds.restarts` in the config), the K-th restart's `warmstart/` and `run/`, its
  overrides on top of the config (its warm start borrowed from `OTHER/seed-S/restart-K/` with `warm_from`). With
  `seeds.restart_until`, a restart runs only while none of the seed's runs before it reached that validation
  score (`wants_another_run`);
- `test/`: the chosen step backtested on the test split beside the model RL started from (`backtest
  --baseline base-model`: the warm start); finished once its `metrics.json` is there. With restarts, only the
  run whose chosen step scored best on validation is tested (the earliest of equals, the config's own first).
  `kept.json`, written after the report, names the run and step tested.
Each of those files is the last its stage writes, and is renamed into place whole (a checkpoint and a report
are whole folders), so a command stopped at any point and run again skips what had finished and does the rest.
A stage runs again when a stage before it ran. A stage folder that holds another config's work is refused
rather than mixed with it. The per-seed figures and their spread go to `OUT/seeds.json`: those of every finished
seed in `OUT` that ran this recipe, so seeds added by later calls join the ones before (`recipe_seeds_elsewhere`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from r1trade.backtest.paired_seeds import SUMMARY_FILE
from r1trade.backtest.report_runs import LOWER_IS_BETTER, MANDATE_PENALTY, REALISED_VOLATILITY
from r1trade.backtest.runner import run_backtest
from r1trade.backtest.step_selection import (
    DEFAULT_METRIC,
    StepSelection,
    best_step,
    check_selectable,
    read_selection,
    select_step,
)
from r1trade.config import Config, RolloutConfig, TrainConfig, load_config
from r1trade.errors import R1TradeError, UsageError
from r1trade.eval.ladder import AGENT_PREFIX, SIGNAL_ROW, Level, add_record, ladder_record
from r1trade.eval.seed_spread import SeedSpread, spread_by_figure
from r1trade.outputs import locked_run_folder, write_file
from r1trade.rl.checkpoint_paths import list_checkpoints
from r1trade.safe_load import read_json_object

MAX_SEEDS = 100
WARMSTART_DIR, RUN_DIR, TEST_DIR = "warmstart", "run", "test"
KEPT_FILE = "kept.json"
"""With restarts, which candidate's run the seed's test report is of; written after that report."""
WARMSTART_LOG = "warmstart.json"
"""What `warmstart` writes last, once the model is saved."""
WARM_START_UNREAD: dict[str, Any] = {
    "train": True, "rewards": True, "backtest": True, "rollout": set(RolloutConfig.model_fields) - {"max_new_tokens"},
}
"""What a warm start does not read: RL, its rewards, the backtest and the rollout's sampling (its
`max_new_tokens` bounds the demonstrated turns, so it is read). Imitation scores tokens, not rewards, so a reward
ablation may start from the recipe's own warm start, and so may a recipe that retired an RL key."""
STARTING_ROW = "base model"
"""The report's row of the model RL started from (`--baseline base-model`)."""
ACCURACY, GAIN, RETURN, INFO_CALLS = (
    "Direction Accuracy [%]", "Direction Accuracy Gain [pp]", "Return [%]", "Info Calls [%]",
)
FIGURES = (ACCURACY, GAIN, RETURN, INFO_CALLS, SIGNAL_ROW, MANDATE_PENALTY, REALISED_VOLATILITY)
"""The held-out figures of each seed; the gain is over the model RL started from, in percentage points. The
mandate's rows are there only under `env.mandate: vol_target`."""


@dataclass(frozen=True)
class SeedResult:
    """One seed's chosen step and its held-out figures (None where the report has no such row); `validation`:
    each candidate's figure at its chosen step (the config's own run first, then each restart's), and `kept`:
    the candidate tested."""

    seed: int
    step: int
    checkpoint: Path
    report: Path
    figures: dict[str, float | None]
    validation: tuple[float | None, ...] = ()
    kept: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "step": self.step, "checkpoint": str(self.checkpoint),
                "report": str(self.report), "figures": self.figures, "kept": self.kept,
                "validation": list(self.validation)}


@dataclass(frozen=True)
class SeedsOutcome:
    """The results of this call's seeds and of every seed the summary holds (this call's and the recipe's earlier
    seeds in the folder, by seed), each figure's spread over the summary's seeds, and where they were written."""

    out_dir: Path
    results: list[SeedResult]
    summarised: list[SeedResult]
    spreads: dict[str, SeedSpread | None]
    file: Path


@dataclass(frozen=True)
class Recipe:
    """What every seed of one `r1trade seeds` command runs: the config and its overrides, the candidates (the
    config as written, then each restart's overrides), whether to warm-start, and how the step is chosen."""

    config: str
    overrides: tuple[str, ...]
    candidates: tuple[list[str], ...]
    warm: bool
    metric: str
    every: int
    until: float | None = None

    def stage_config(self, seed: int, candidate: int, *more: str) -> Config:
        """The config of seed `seed`'s stages for `candidate`: the overrides, the candidate's, no restarts of
        its own (a run is one candidate), then the seed, then `more`."""
        return load_config(self.config, [*self.overrides, *self.candidates[candidate], "seeds.restarts=[]",
                                         "seeds.restart_until=null", f"seed={seed}", f"model.tiny_seed={seed}",
                                         *more])

    def wants_another_run(self, validation: Sequence[float | None]) -> bool:
        """Whether a seed whose runs so far scored `validation` runs its next candidate (see the function)."""
        return len(validation) < len(self.candidates) and wants_another_run(validation, self.until, self.metric)


def candidates(config: Config) -> list[list[str]]:
    """The runs each seed makes: the config as written (no overrides of its own), then each restart's."""
    return [[], *config.seeds.restarts]


def wants_another_run(validation: Sequence[float | None], until: float | None, metric: str) -> bool:
    """Whether a seed whose runs so far chose steps scoring `validation` runs its next restart: always without
    `until`; else only while none reached `until` (at least it, or at most it where lower is better). A run
    that learned needs no restart, and one that did not is visible on validation, so the test split is not read.

    >>> [wants_another_run([value], 60.0, "Direction Accuracy [%]") for value in (52.4, 73.6)]
    [True, False]
    >>> wants_another_run([0.40], 0.35, "Mandate Penalty"), wants_another_run([0.35], 0.35, "Mandate Penalty")
    (True, False)
    """
    if until is None:
        return True
    lower = metric in LOWER_IS_BETTER
    return not any(value is not None and (value <= until if lower else value >= until) for value in validation)


def parse_seeds(text: str) -> list[int]:
    """`0-4` (a range, both ends included), `0,2,5` (a list) or `3`, as distinct seeds in the order given."""
    seeds: list[int] = []
    for part in text.split(","):
        match = re.fullmatch(r"\s*(\d{1,10})\s*(?:-\s*(\d{1,10})\s*)?", part)
        first, last = (int(match[1]), int(match[2] or match[1])) if match else (0, -1)
        if last < first:
            raise UsageError(f"bad --seeds '{text}': use a range (0-4), a list (0,2,5) or one seed")
        if last >= 2**32:
            raise UsageError(f"bad --seeds '{text}': seeds go from 0 to {2**32 - 1}")
        if len(seeds) + last - first + 1 > MAX_SEEDS:
            raise UsageError(f"bad --seeds '{text}': more than {MAX_SEEDS} seeds in one command")
        seeds += range(first, last + 1)
    if len(set(seeds)) != len(seeds):
        raise UsageError(f"bad --seeds '{text}': a seed is named twice")
    return seeds


def default_out_dir(config: Config) -> Path:
    return Path(config.output_dir) / f"{config.name}-seeds"


def wants_warmstart(config: Config, asked: bool | None) -> bool:
    """`asked` (--warmstart / --no-warmstart), else whether the config (file or --set) sets `warmstart`."""
    return "warmstart" in config.model_fields_set if asked is None else asked


def run_seeds(
    config: str,
    overrides: Sequence[str],
    seeds: Sequence[int],
    *,
    warm: bool | None = None,
    out_dir: Path | None = None,
    metric: str = DEFAULT_METRIC,
    every: int = 1,
    warm_from: Path | None = None,
    on_tested: Callable[[SeedResult], None] | None = None,
    console: Console | None = None,
) -> SeedsOutcome:
    """Run config `config` with `overrides` for each of `seeds` into `out_dir` (default: `default_out_dir`),
    skipping what an earlier call finished, then write `OUT/seeds.json`; `warm`: see `wants_warmstart`;
    `warm_from`: another seeds folder whose warm starts to start from (see the module's docstring);
    `on_tested`: called with each seed's result as soon as it is tested (its ladder record, say), so that a
    command stopped during a later seed has kept what the finished ones found."""
    console = console or Console()
    base = load_config(config, list(overrides))
    check_selectable(base, f"config '{config}'")
    warm = wants_warmstart(base, warm)
    if warm_from is not None and not warm:
        raise UsageError("--warmstart-from needs a warm start: drop --no-warmstart, or give the config a warmstart")
    recipe = Recipe(config, tuple(overrides), tuple(candidates(base)), warm=warm, metric=metric, every=every,
                    until=base.seeds.restart_until)
    out_dir = out_dir or default_out_dir(base)
    for seed in seeds:  # every config is valid, and every borrowed warm start fits, before anything runs
        for candidate in range(len(recipe.candidates)):
            trained = recipe.stage_config(seed, candidate)
            borrowed = None if warm_from is None else _warm_dir(warm_from / f"seed-{seed}", candidate)
            # a restart that runs only on a failed run may have no warm start to borrow: checked if it runs
            if borrowed is not None and (candidate == 0 or recipe.until is None or borrowed.exists()):
                borrowed_warm_start(borrowed, trained)
    results = []
    with locked_run_folder(out_dir):
        for number, seed in enumerate(seeds, start=1):
            console.print(f"[bold]seed {seed}[/bold] ({number} of {len(seeds)})")
            results.append(_run_seed(recipe, seed, out_dir / f"seed-{seed}", warm_from=warm_from, console=console))
            if on_tested is not None:
                on_tested(results[-1])
        earlier = recipe_seeds_elsewhere(recipe, out_dir, skip=set(seeds), console=console)
        summarised = sorted(results + earlier, key=lambda result: result.seed)
        spreads = spread_by_figure({r.seed: r.figures for r in summarised}, FIGURES, lower_is_better=LOWER_IS_BETTER)
        summary = {
            "config": config, "overrides": list(overrides), "warmstart": warm,
            "restarts": [list(restart) for restart in recipe.candidates[1:]], "restart_until": recipe.until,
            "chosen_on": "validation",
            "metric": metric, "tested_on": "test", "seeds": [r.to_dict() for r in summarised],
            "summary": {name: spread and spread.to_dict() for name, spread in spreads.items()},
        }
        file = write_file(out_dir / SUMMARY_FILE, json.dumps(summary, indent=1) + "\n")
    return SeedsOutcome(out_dir, results, summarised, spreads, file)


def candidate_folder(folder: Path, candidate: int) -> Path:
    """Where a seed's candidate runs: the seed's folder for the config as written, `restart-K/` for restart K."""
    return folder if candidate == 0 else folder / f"restart-{candidate}"


def kept_candidate(values: Sequence[float], metric: str) -> int:
    """The candidate whose chosen step scored best on validation, the earliest of equals (`best_step`).

    >>> kept_candidate([52.4, 73.6], "Direction Accuracy [%]")
    1
    >>> kept_candidate([73.6, 73.6], "Direction Accuracy [%]")
    0
    """
    return best_step(dict(enumerate(values)), lower_is_better=metric in LOWER_IS_BETTER)


def recipe_seeds_elsewhere(
    recipe: Recipe, out_dir: Path, *, skip: set[int], console: Console
) -> list[SeedResult]:
    """The finished seeds in `out_dir` outside `skip` that ran this recipe: every candidate's run config is the
    one this command gives it (with a warm start, from whichever warm start it started), its step was chosen as
    this command chooses, and the test report of the one kept is in place. Each other seed folder is named and
    left out."""
    found = []
    named = (re.fullmatch(r"seed-(0|[1-9]\d{0,9})", path.name) for path in out_dir.glob("seed-*"))
    for seed in sorted(int(match[1]) for match in named if match):
        if seed in skip:
            continue
        result = _finished_recipe_seed(recipe, seed, out_dir / f"seed-{seed}")
        if isinstance(result, str):
            _say(console, seed, f"left out of {SUMMARY_FILE}: {result}")
        else:
            found.append(result)
    return found


def _finished_recipe_seed(recipe: Recipe, seed: int, folder: Path) -> SeedResult | str:
    """Seed `seed`'s result in `folder` when it ran this recipe and finished every stage; otherwise why not."""
    report = folder / TEST_DIR
    selections: list[StepSelection] = []
    try:
        while recipe.wants_another_run(_validation(selections)):
            run_dir = candidate_folder(folder, len(selections)) / RUN_DIR
            if not (run_dir / "config.yaml").is_file():
                return "no run"
            saved = load_config(run_dir / "config.yaml", [])
            started = [f"model.name_or_path={json.dumps(saved.model.name_or_path)}"] if recipe.warm else []
            asked = recipe.stage_config(seed, len(selections), *started)
            if not same_run(saved, asked):
                return "it ran another config"
            selection = read_selection(run_dir)
            if not _still_chosen(selection, run_dir, metric=recipe.metric, every=recipe.every,
                                 updates=asked.train.updates):
                return "not finished (run this seed to finish it)"
            selections.append(selection)
        kept = kept_candidate([s.figures[s.step] for s in selections], recipe.metric)
        if not _tested(report, _kept_note(selections, kept), restarts=len(recipe.candidates) > 1):
            return "not finished (run this seed to finish it)"
        figures = seed_figures(read_json_object(report / "metrics.json"))
    except R1TradeError as error:  # a damaged file of that seed leaves it out, not this call's summary
        return str(error)
    return _result(seed, selections, kept, report, figures)


def borrowed_warm_start(warm_dir: Path, config: Config) -> Path:
    """The model of the finished warm start in `warm_dir`, which must have run `config` in all that a warm start
    reads (everything but `warm_start_unread`); otherwise a UsageError saying what does not fit."""
    if not (warm_dir / WARMSTART_LOG).is_file():
        raise UsageError(f"--warmstart-from: '{warm_dir}' holds no finished warm start (no {WARMSTART_LOG})")
    try:
        fits = same_warm_start(warm_dir / "config.yaml", config)
    except UsageError as error:
        raise UsageError(f"--warmstart-from: {error}") from None
    if not fits:
        raise UsageError(
            f"--warmstart-from: the warm start in '{warm_dir}' ran another config (one that differs in "
            "what a warm start reads), so it is not this recipe's warm start"
        )
    return warm_dir / "model"


def same_warm_start(saved: Path, config: Config) -> bool:
    """Whether the warm start whose config is the file `saved` ran `config` in all that a warm start reads."""
    unread = warm_start_unread(config)
    theirs = load_config(saved, [], unread=unread)
    return theirs.model_dump(exclude=unread) == config.model_dump(exclude=unread)


def warm_start_unread(config: Config) -> dict[str, Any]:
    """What `config`'s warm start does not read: `WARM_START_UNREAD`, less what its check samples with when it has
    one (`warmstart.min_action_share`: the rollout's settings, and the first update's groups)."""
    if config.warmstart.min_action_share is None:
        return WARM_START_UNREAD
    unread = {section: keys for section, keys in WARM_START_UNREAD.items() if section != "rollout"}
    return {**unread, "train": set(TrainConfig.model_fields) - {"group_size"}}


def _warm_dir(seed_folder: Path, candidate: int) -> Path:
    return candidate_folder(seed_folder, candidate) / WARMSTART_DIR


def _run_seed(
    recipe: Recipe, seed: int, folder: Path, *, warm_from: Path | None, console: Console
) -> SeedResult:
    """One seed's candidates, then the test of the one kept; each stage skipped when its last file is there and
    no stage before it ran."""
    ran = False
    selections: list[StepSelection] = []
    while recipe.wants_another_run(_validation(selections)):
        candidate = len(selections)
        if len(recipe.candidates) > 1:
            _say(console, seed, "the config as written" if candidate == 0 else
                 f"restart {candidate}: {' '.join(recipe.candidates[candidate])}")
        selection, candidate_ran = _run_candidate(recipe, seed, candidate, folder, warm_from=warm_from,
                                                  console=console)
        selections.append(selection)
        ran = ran or candidate_ran
    kept = kept_candidate([s.figures[s.step] for s in selections], recipe.metric)
    if len(selections) > 1:
        where = "the config as written" if kept == 0 else f"restart {kept}"
        _say(console, seed, f"kept {where}: step-{selections[kept].step} scored best on validation")

    report = folder / TEST_DIR
    note = _kept_note(selections, kept)
    if ran or not _tested(report, note, restarts=len(recipe.candidates) > 1):
        _say(console, seed, f"backtesting step-{selections[kept].step} on the test split")
        tested = load_config(selections[kept].run_dir / "config.yaml", ["backtest.split=test"])
        run_backtest(tested, checkpoint=selections[kept].checkpoint, base_model=True, out_dir=report, force=True)
        write_file(folder / KEPT_FILE, json.dumps(note, indent=1) + "\n")
    else:
        _say(console, seed, f"test backtest finished ({report}), skipped")
    figures = seed_figures(read_json_object(report / "metrics.json"))
    return _result(seed, selections, kept, report, figures)


def _run_candidate(
    recipe: Recipe, seed: int, candidate: int, folder: Path, *, warm_from: Path | None, console: Console
) -> tuple[StepSelection, bool]:
    """One candidate's warm start, RL and step chosen on validation; and whether any of them ran."""
    ran = False
    home = candidate_folder(folder, candidate)
    trained = recipe.stage_config(seed, candidate)
    if recipe.warm and warm_from is not None:
        borrowed = borrowed_warm_start(_warm_dir(warm_from / f"seed-{seed}", candidate), trained)
        _say(console, seed, f"starting from the warm start in {borrowed}")
        trained = recipe.stage_config(seed, candidate, f"model.name_or_path={json.dumps(str(borrowed))}")
    elif recipe.warm:
        warm_dir = home / WARMSTART_DIR
        _refuse_other_work(warm_dir, trained, same_warm_start)
        if (warm_dir / WARMSTART_LOG).is_file():
            _say(console, seed, f"warm start finished ({warm_dir / 'model'}), skipped")
        else:
            _warm_start(trained, warm_dir, console)
            ran = True
        model = json.dumps(str(warm_dir / "model"))  # a JSON string stays a string in YAML
        trained = recipe.stage_config(seed, candidate, f"model.name_or_path={model}")

    run_dir = home / RUN_DIR
    _refuse_other_work(run_dir, trained, lambda saved, config: same_run(load_config(saved, []), config))
    updates = trained.train.updates
    done = max((step for step, _ in list_checkpoints(run_dir)), default=0)
    if not ran and done > updates:
        _say(console, seed, f"{run_dir} was trained further (step-{done}): its first {updates} updates are this run")
        _check_budget_checkpoint(run_dir, updates)
    if ran or done < updates:
        resume = not ran and done > 0
        _say(console, seed, f"training resumed from step-{done}" if resume else "training")
        from r1trade.train import train_run  # torch and the models: only where a seed trains

        train_run(trained, run_dir, resume=resume, force=not resume, console=console)
        ran = True
    else:
        _say(console, seed, f"training finished (step-{updates}), skipped")

    selection = read_selection(run_dir)
    if ran or not _still_chosen(selection, run_dir, metric=recipe.metric, every=recipe.every, updates=updates):
        _say(console, seed, f"choosing the step by {recipe.metric} on the validation split")
        selection = select_step(
            run_dir, split="validation", metric=recipe.metric, every=recipe.every, up_to=updates,
            on_step=lambda step, value: _say(console, seed, f"  step {step}: {recipe.metric} {value:.2f}"),
        )
        ran = True
    else:
        _say(console, seed, f"step-{selection.step} already chosen by {recipe.metric} on validation, skipped")
    return selection, ran


def _kept_note(selections: Sequence[StepSelection], kept: int) -> dict[str, Any]:
    """What `KEPT_FILE` says of a seed's test: the run and step tested, and every run's validation figure."""
    chosen = selections[kept]
    return {"candidate": kept, "run": str(chosen.run_dir), "step": chosen.step, "checkpoint": str(chosen.checkpoint),
            "validation": _validation(selections)}


def _tested(report: Path, note: dict[str, Any], *, restarts: bool) -> bool:
    """Whether the test report is in place and `KEPT_FILE` says `note`: the same run and step tested, after the
    same runs (a seed tested before that file was written for every recipe has none: accepted for a recipe
    without restarts)."""
    if not (report / "metrics.json").is_file():
        return False
    noted = report.parent / KEPT_FILE
    if not noted.is_file():
        return not restarts
    try:
        return read_json_object(noted) == note
    except R1TradeError:  # a damaged note is one to write again: the kept run is tested again
        return False


def _result(
    seed: int, selections: Sequence[StepSelection], kept: int, report: Path, figures: dict[str, float | None]
) -> SeedResult:
    chosen = selections[kept]
    return SeedResult(seed, chosen.step, chosen.checkpoint, report, figures, tuple(_validation(selections)), kept)


def _validation(selections: Sequence[StepSelection]) -> list[float | None]:
    """Each run's figure on validation at its chosen step, in the order the runs ran."""
    return [_number(s.figures[s.step]) for s in selections]


def seed_figures(document: dict[str, Any]) -> dict[str, float | None]:
    """FIGURES of a report's metrics.json: its agent row beside the row of the model RL started from."""
    rows: dict[str, dict] = document.get("strategies", {})
    agents = [name for name in rows if name.startswith(AGENT_PREFIX)]
    if len(agents) != 1 or STARTING_ROW not in rows:
        raise UsageError(
            f"a seed's test report has rows {', '.join(rows)}: expected one agent and '{STARTING_ROW}'"
        )
    agent, start = rows[agents[0]], rows[STARTING_ROW]
    accuracy, before = _number(agent.get(ACCURACY)), _number(start.get(ACCURACY))
    return {
        ACCURACY: accuracy,
        GAIN: None if accuracy is None or before is None else accuracy - before,
        RETURN: _number(agent.get(RETURN)),
        INFO_CALLS: _number(agent.get(INFO_CALLS)),
        SIGNAL_ROW: _number(agent.get(SIGNAL_ROW)),
        MANDATE_PENALTY: _number(agent.get(MANDATE_PENALTY)),
        REALISED_VOLATILITY: _number(agent.get(REALISED_VOLATILITY)),
    }


def ladder_model(config: Config, *, warm: bool) -> str:
    """How the seeds' ladder records name the model: the base model, LoRA or full fine-tuning, warm start."""
    lora = config.model.lora
    text = config.model.name_or_path + (f" + LoRA r{lora.r}" if lora.enabled else " (full fine-tuning)")
    settings = config.warmstart
    text += f", {settings.policy} warm start ({settings.max_steps} steps)" if warm else ""
    runs, until = len(candidates(config)), config.seeds.restart_until
    if runs > 1 and until is not None:
        return text + f"; a restart while no run reached {until:g} on validation (up to {runs} runs a seed), " \
                      "the run best on validation"
    return text + (f"; of {runs} runs a seed (restarts), the one best on validation" if runs > 1 else "")


def add_ladder_record(
    result: SeedResult, ladder: Path, *, level: Level, variant: str, model: str, command: str
) -> list[dict[str, Any]]:
    """A seed's ladder record (`r1trade ladder-record`: its test report beside the model RL started from),
    replacing an older one of its level, variant and seed; returns the ladder's records."""
    record = ladder_record(result.report, result.checkpoint, level=level, variant=variant, model=model,
                           command=command, warmstart=STARTING_ROW, seed=result.seed)
    return add_record(ladder, record)


def _still_chosen(selection: StepSelection | None, run_dir: Path, *, metric: str, every: int, updates: int) -> bool:
    """Whether an earlier selection holds for a run of `updates` updates: same split, metric and spacing, and its
    last step is that of `updates`, whose checkpoint is in place (a run trained further may hold later ones)."""
    asked = ("validation", metric, every)
    if selection is None or (selection.split, selection.metric, selection.every) != asked:
        return False
    return max(selection.figures) == updates and updates in dict(list_checkpoints(run_dir))


def same_run(saved: Config, config: Config) -> bool:
    """Whether a run of `saved` is a run of `config`, perhaps for another number of updates: no schedule reads
    `train.updates`, so a shorter run is the first part of a longer one (resumed to a larger budget, its first
    steps kept for a smaller one)."""
    budget = saved.model_copy(update={"train": saved.train.model_copy(update={"updates": config.train.updates})})
    return budget.model_dump() == config.model_dump()


def _check_budget_checkpoint(run_dir: Path, updates: int) -> None:
    """A run trained further holds a run of `updates` updates only with the checkpoint of that step."""
    if updates not in dict(list_checkpoints(run_dir)):
        raise UsageError(
            f"'{run_dir}' was trained past train.updates {updates} but has no checkpoint of step {updates} "
            "(train.checkpoint_every): give another --out, or a budget it has a checkpoint of"
        )


def _warm_start(config: Config, warm_dir: Path, console: Console) -> None:
    """`r1trade warmstart` into `warm_dir`: TRL-bound models keep the env's tool schemas in their template."""
    tools = None
    if config.train.engine == "trl":
        from r1trade.integrations.trl import tool_schemas

        tools = tool_schemas(config)
    config.save(warm_dir)
    from r1trade.warmstart import warmstart  # torch and the models: only where a seed warm-starts

    warmstart(config, warm_dir, tools=tools, console=console)


def _refuse_other_work(stage_dir: Path, config: Config, same: Callable[[Path, Config], bool]) -> None:
    """A stage folder whose config.yaml is not `config`'s by `same` (the file, the config) holds other work:
    refused, not mixed or replaced. A warm start is compared in what it reads (`same_warm_start`), a run as
    loaded, for any number of updates (`same_run`): a key added to r1trade since (read with its
    default) changes nothing."""
    saved = stage_dir / "config.yaml"
    if saved.is_file() and not same(saved, config):
        raise UsageError(
            f"'{stage_dir}' holds a run of another config (its config.yaml differs from this command's): "
            "give another --out, or delete that folder to run it again"
        )


def _say(console: Console, seed: int, text: str) -> None:
    console.print(f"seed {seed}: {text}", markup=False, highlight=False, soft_wrap=True)


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)
