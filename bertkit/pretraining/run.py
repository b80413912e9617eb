"""`bertkit pretrain`: MLM + NSP pre-training by the paper's recipe (§3.1, appendix A.2), or its ablations.

Objectives (objectives/, one object each: its batch, head and metrics, on the one model and loop):
  bert     BertForPreTraining: MLM + NSP            (--objective mlm)
  no-nsp   BertForMaskedLM: MLM only                (--objective mlm --no-nsp)
  ltr      BertForMaskedLM with causal attention, predicting the next token at every position
Two phases: phase 1 on `--train-data` (length 128), the last `--phase2-fraction` of the steps on
`--phase2-data` (length 512); one linear warm-up/decay schedule spans both.
`--time-budget 15m` turns the budget into a step count measured on this machine, and fills every
setting not given with the recipe that measured best for that budget (recipe.py).
`--init-from DIR` continues from any BERT checkpoint in the Hugging Face layout, keeping its
vocabulary (the original's `--init_checkpoint`, e.g. for domain adaptation).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import time
from pathlib import Path

from .. import flags, settings
from ..config import BertConfig
from ..errors import BertkitError
from ..hub.resolve import resolve_model
from ..metrics import perplexity
from ..outputs import atomic_write_text, check_not_an_input_folder
from ..settings import setting
from ..tokenizer import BertTokenizer
from ..train import Phase, TrainArgs, fit
from ..train.loop import dist_info, set_seed
from ..train.plan import parse_duration
from .init import POSITION_INITS, neighbour_heads_, sinusoidal_positions_
from .objectives import MLM_NSP, OBJECTIVES, Objective, resolve_objective
from .recipe import PAPER, deviations_from_paper, resolve_recipe
from .shards import PretrainingBatchSource, PretrainingDataset

log = logging.getLogger("bertkit")


def build_pretraining_model(config: BertConfig, objective: Objective | str = "mlm", nsp: bool = True):
    """The objective's head on `config` (BertForPreTraining for MLM + NSP, BertForMaskedLM for No-NSP
    and LTR, whose config gets left-to-right attention)."""
    return resolve_objective(objective, nsp).build_model(config)


def split_phases(phases: list[tuple], max_steps: int | None) -> list[Phase]:
    """Phases from (source, name, share of all steps or None for the rest): with `max_steps` as step
    counts, without (a time budget sets the steps later) as fractions."""
    given = sum(share for _, _, share in phases if share is not None)
    if given >= 1:
        raise BertkitError(f"the phases' shares of the steps add up to {given:g}; they must leave room for "
                           "phase 1 (below 1)")
    shares = [share if share is not None else 1 - given for _, _, share in phases]
    if max_steps is None:
        return [Phase(src, name=name, fraction=share) for (src, name, _), share in zip(phases, shares)]
    counts = [max(1, round(max_steps * share)) for share in shares]
    rest = shares.index(1 - given)
    counts[rest] = max(1, max_steps - sum(c for i, c in enumerate(counts) if i != rest))
    return [Phase(src, steps=count, name=name) for (src, name, _), count in zip(phases, counts)]


def pretraining_batch_metrics(batch: dict, out, objective: Objective = MLM_NSP) -> dict:
    """Running MLM and NSP accuracy for the training logs: (correct, total) pairs (the objective's)."""
    return objective.batch_metrics(batch, out)


def make_evaluator(eval_source: PretrainingBatchSource, max_batches: int):
    """Held-out MLM loss / accuracy / perplexity and NSP accuracy, on the same masks every time (the
    metrics the source's objective names)."""
    objective = eval_source.options["objective"]

    def evaluate(model) -> dict:
        device = next(model.parameters()).device
        mlm_loss_sum = mlm_correct = mlm_total = nsp_correct = nsp_total = 0.0
        for i, batch in enumerate(eval_source.batches(0)):
            if i >= max_batches:
                break
            batch = {k: v.to(device) for k, v in batch.items()}
            out = model(**batch)
            n = int((batch["labels"] != -100).sum())
            mlm_loss_sum += float(out["mlm_loss"]) * n
            metrics = objective.batch_metrics(batch, out)
            correct, total = metrics["mlm_accuracy"]
            mlm_correct, mlm_total = mlm_correct + correct, mlm_total + total
            if "nsp_accuracy" in (m := metrics):
                nsp_correct, nsp_total = nsp_correct + m["nsp_accuracy"][0], nsp_total + m["nsp_accuracy"][1]
        mean_loss = mlm_loss_sum / max(mlm_total, 1)
        result = {"mlm_loss": mean_loss, "mlm_accuracy": mlm_correct / max(mlm_total, 1),
                  "mlm_perplexity": perplexity(mean_loss), "eval_predictions": int(mlm_total)}
        if nsp_total:
            result["nsp_accuracy"] = nsp_correct / nsp_total
        return result

    return evaluate


@dataclasses.dataclass
class PretrainOptions:
    """What `bertkit pretrain` takes besides the data and the output folder: one field per flag, its
    type, help and default written here once (the command line is made from these fields,
    bertkit/settings.py). Settings left as None come from the recipe (the paper's, or with
    `time_budget` the one measured best for that budget, recipe.py)."""

    model_config: str | BertConfig | None = setting(
        None, help="size preset (tiny, mini, small, medium, base, large) or config.json (default: mini, or the "
                   "budget's recipe)")  # or a BertConfig, from Python
    max_steps: int | None = setting(None, type=flags.positive_int,
                                    help="optimizer steps (default 1000; set by --time-budget when given)")
    time_budget: str | float | None = setting(
        None, type=flags.duration,
        help="wall-clock budget: N seconds, Ns, Nm, Nh or NhNm (e.g. 900, 15m, 1.5h, 1h30m; at most a week): the step "
             "count is measured to fit it, the learning rate reaches zero at its end, and settings not given come "
             "from the recipe measured best for it")
    batch_size: int | None = setting(None, type=flags.positive_int,
                                     help="global batch: per-rank batch x ranks x grad-accum (default 256)")
    grad_accum: int = setting(1, type=flags.positive_int, help="micro-batches per optimizer step")
    learning_rate: float | None = setting(None, type=flags.non_negative_float, help="peak learning rate (default 1e-4)")
    warmup_steps: int | None = setting(None, type=flags.non_negative_int,
                                       help="default 10000, or a share of the steps with --time-budget")
    warmup_ratio: float | None = setting(None, type=flags.probability,
                                         help="warm-up as a share of the steps (with --time-budget)")
    weight_decay: float | None = setting(None, type=flags.non_negative_float, help="AdamW weight decay (default 0.01)")
    max_grad_norm: float | None = setting(None, type=flags.non_negative_float, help="gradient clipping (default 1.0)")
    dropout: float | None = setting(
        None, type=flags.probability,
        help="hidden and attention dropout while pre-training (default 0.1; 0 with --time-budget); the saved config "
             "keeps 0.1 for fine-tuning")
    masked_lm_prob: float | None = setting(None, type=flags.open_fraction,
                                           help="masking rate drawn at load time (default: the data's)")
    precision: str = setting("auto", choices=("auto", "fp32", "bf16"), help="bf16 autocast where native with auto")
    seed: int = setting(12345, type=flags.seed, help="initialisation and data order")
    logging_steps: int = setting(50, type=flags.positive_int, help="training loss to metrics.jsonl every N steps")
    save_steps: int = setting(1000, type=flags.non_negative_int,
                              help="checkpoint every N steps (with --time-budget: 4 checkpoints over the run)")
    eval_steps: int = setting(0, type=flags.non_negative_int,
                              help="evaluate every N steps (with --time-budget: 10 evaluations over the run)")
    eval_data: str | None = setting(None, help="held-out pre-training data directory for MLM/NSP evaluation")
    eval_batches: int = setting(20, type=flags.positive_int, help="batches of --eval-data per evaluation")
    resume: bool = setting(False, action="store_true", help="continue from the latest checkpoint in --output")
    overwrite: bool = setting(False, action="store_true", help="replace a run already in --output")
    nsp: bool | None = setting(None, flag="--no-nsp", action="store_false",
                               help="MLM only (the paper's No-NSP ablation)")  # False: MLM only (objective "mlm")
    objective: Objective | str = setting(
        "mlm", choices=("mlm", *OBJECTIVES),
        help="mlm: masked LM with NSP (without: --no-nsp); ltr: left-to-right LM, no NSP; or any objective by name "
             "(bert = mlm, no-nsp = mlm --no-nsp)")  # or an Objective (objectives.OBJECTIVES), from Python
    mask_mix: str | None = setting(None, help="[MASK]/same/random percentages, e.g. 80,10,10 (dynamic masking)")
    masking: str | None = setting(None, choices=("static", "dynamic"), help="override the data's masking mode")
    phase2_data: str | None = setting(None, help="data directory for phase 2 (length 512)")
    phase2_fraction: float = setting(0.1, type=flags.open_fraction, help="share of the steps in phase 2")
    init_from: str | None = setting(
        None, help="continue pre-training from this BERT checkpoint (Hugging Face layout, with vocab.txt); the data "
                   "must use its vocabulary")
    device: str = setting("auto", type=flags.device, help="auto | cpu | cuda | cuda:N")
    progress: bool | None = setting(None, action=argparse.BooleanOptionalAction,
                                    help="a progress bar (default: when stderr is a terminal)")
    position_init: str | None = setting(
        None, choices=POSITION_INITS,
        help="how learned position embeddings start: normal (the paper's), sinusoidal, or neighbours (a sine table "
             "whose first layer's heads start as previous- and next-token heads; default: the budget's recipe)")
    short_seq_length: int | None = setting(
        None, type=flags.non_negative_int,
        help="train the first --short-seq-fraction of the steps on pairs cut to this length from --train-data (0: "
             "off; default: the budget's recipe)")
    short_seq_fraction: float | None = setting(None, type=flags.open_fraction,
                                               help="share of the steps at --short-seq-length")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "PretrainOptions":
        """The options of `bertkit pretrain`'s parsed flags (the fields' own flags)."""
        return settings.from_args(cls, args)


def pretrain(data: str, output: str, options: PretrainOptions | None = None, **settings):
    """Pre-train and return the TrainResult; the model lands in `output` in the Hugging Face layout.

    `options` (PretrainOptions), or its fields as keywords (`pretrain(data, out, max_steps=10)`);
    `objective` "mlm" is MLM + NSP, or MLM only with `nsp=False` (or a recipe without NSP). With
    `time_budget` the run ends on time: data loading, the measuring steps, evaluations, checkpoints
    and the final save are inside it.
    """
    clock_start = time.time()
    o = dataclasses.replace(options or PretrainOptions(), **settings)
    resolve_objective(o.objective)  # a bad name fails before any work
    budget = parse_duration(o.time_budget) if o.time_budget is not None else None
    check_inputs(data, output, o)
    first_data = PretrainingDataset(data)
    recipe, deviations = fit_recipe(o, first_data, budget, data)
    objective = resolve_objective(o.objective, nsp=recipe.nsp)
    if objective.deviation and objective.deviation not in deviations:
        deviations.append(objective.deviation)
    rank, world = dist_info()
    per_rank, rest = divmod(recipe.batch_size, world * o.grad_accum)
    if rest or per_rank < 1:
        raise BertkitError(f"--batch-size {recipe.batch_size} must be a multiple of ranks x grad-accum = "
                           f"{world * o.grad_accum}")
    dataset1, phases = training_phases(data, o, recipe, objective, per_rank, budget)
    tokenizer = data_tokenizer(dataset1)
    set_seed(o.seed)  # the initial weights too are a function of --seed
    model = initial_model(o, recipe, objective, dataset1, deviations, budget)
    evaluate = evaluator(o, dataset1, objective)
    args = TrainArgs(output_dir=output, learning_rate=recipe.learning_rate, warmup_steps=recipe.warmup_steps,
                     warmup_ratio=recipe.warmup_ratio, min_warmup_steps=recipe.min_warmup_steps,
                     weight_decay=recipe.weight_decay,
                     max_grad_norm=recipe.max_grad_norm, grad_accum=o.grad_accum, precision=o.precision,
                     device=o.device, seed=o.seed, logging_steps=o.logging_steps, save_steps=o.save_steps,
                     eval_steps=o.eval_steps, resume=o.resume, progress=o.progress, tokenizer=tokenizer,
                     time_budget=budget, clock_start=clock_start,
                     existing_output="overwrite" if o.overwrite else "refuse",
                     identity=run_identity(data, o, model, objective, recipe, budget))
    run_record = {"data": str(data), "data_not_next_partners": dataset1.not_next_partners,
                  "phase2_data": o.phase2_data, "eval_data": o.eval_data,
                  "model_config": model.config.to_dict(), "recipe": dataclasses.asdict(recipe),
                  "deviations_from_paper": deviations, "time_budget_seconds": budget, "grad_accum": o.grad_accum,
                  "world_size": world, "objective": objective.flag, "nsp": objective.nsp, "mask_mix": o.mask_mix,
                  "seed": o.seed, "precision": o.precision, "init_from": o.init_from}
    result = fit(model, phases, args, evaluate=evaluate, batch_metrics=objective.batch_metrics)
    if rank == 0:
        # A run whose dropout was switched off for pre-training saves the paper's for fine-tuning.
        restore = PAPER.dropout if (o.dropout is not None or budget or o.init_from) else None
        finish_output(Path(output), model, restore, recipe, deviations, result, run_record)
    return result


def check_inputs(data: str, output: str, o: PretrainOptions) -> None:
    """No output folder that is an input; --init-from brings its own config and weights."""
    check_not_an_input_folder(output, {"--init-from": o.init_from, "--train-data": data, "--eval-data": o.eval_data,
                                       "--phase2-data": o.phase2_data})
    if o.init_from is not None and o.model_config is not None:
        raise BertkitError("give --init-from or --model-config, not both (the checkpoint brings its own config)")
    if o.init_from is not None and o.position_init is not None:
        raise BertkitError("give --init-from or --position-init, not both (the checkpoint brings its own weights)")


def fit_recipe(o: PretrainOptions, first_data: PretrainingDataset, budget: float | None, data: str):
    """The recipe (the options given, the rest the paper's or the budget's) fitted to the data, and its
    deviations from the paper: a short-sequence phase only where the data can be cut shorter."""
    model_config = o.model_config
    recipe, deviations = resolve_recipe(dict(
        model_config=model_config if isinstance(model_config, str) or model_config is None else
        f"custom ({model_config.num_hidden_layers} layers x {model_config.hidden_size})", batch_size=o.batch_size,
        learning_rate=o.learning_rate, warmup_steps=o.warmup_steps, warmup_ratio=o.warmup_ratio,
        max_steps=o.max_steps, weight_decay=o.weight_decay, max_grad_norm=o.max_grad_norm, dropout=o.dropout,
        masked_lm_prob=o.masked_lm_prob, nsp=o.nsp, position_init=o.position_init,
        short_seq_length=o.short_seq_length, short_seq_fraction=o.short_seq_fraction), budget,
        vocab_size=first_data.vocab_size)
    if recipe.fitted_to_vocab_size:
        log.info(next(d for d in deviations if d.startswith("batch halved")))
    if o.init_from is not None:  # a continued run starts from the checkpoint's weights, whatever the recipe's init
        recipe = dataclasses.replace(recipe, position_init=PAPER.position_init)
        deviations = deviations_from_paper(recipe, budget)
    return fit_short_phase(o, recipe, deviations, first_data, budget, data)


def fit_short_phase(o: PretrainOptions, recipe, deviations: list[str], first_data: PretrainingDataset,
                    budget: float | None, data: str):
    """The recipe's short-sequence phase, kept only where the data's pairs can be cut shorter."""
    longest = first_data.max_seq_length
    static = o.objective == "mlm" and recipe.masked_lm_prob is None and (o.masking or first_data.masking) == "static"
    if recipe.short_seq_length and static and recipe.short_seq_length < longest:
        # Cutting pairs shorter puts masked tokens back, so a short phase needs masks drawn at load time.
        if o.short_seq_length is not None:
            raise BertkitError(f"--short-seq-length {o.short_seq_length} cuts pairs shorter, which needs dynamic "
                               "masking: this data stores static masks; add --masking dynamic", path=data)
        # The budget recipe fits the data it is given: no short phase, said in the log and the config.
        log.info("the data stores static masks, which a shorter cut would undo: the recipe's short-sequence phase "
                 "(len %d) is skipped; pass --masking dynamic to keep it", recipe.short_seq_length)
        recipe = dataclasses.replace(recipe, short_seq_length=0, short_seq_fraction=0.0)
        deviations = deviations_from_paper(recipe, budget)
        deviations.append("the budget recipe's short-sequence phase skipped: the data stores static masks")
    if recipe.short_seq_length and recipe.short_seq_length >= longest:
        if o.short_seq_length is not None:
            raise BertkitError(f"--short-seq-length {o.short_seq_length} cuts nothing: the data's pairs are at most "
                               f"{longest} tokens", path=data)
        # The recipe's short phase has nothing to cut in this data: no phase, and no deviation to name.
        log.info("the data's pairs are at most %d tokens: no short-sequence phase", longest)
        recipe = dataclasses.replace(recipe, short_seq_length=0, short_seq_fraction=0.0)
        deviations = deviations_from_paper(recipe, budget)
    if recipe.short_seq_length and not 0 < recipe.short_seq_fraction < 1:
        raise BertkitError("--short-seq-length needs --short-seq-fraction between 0 and 1")
    if o.short_seq_fraction is not None and not recipe.short_seq_length:
        raise BertkitError("--short-seq-fraction needs --short-seq-length")
    return recipe, deviations


def training_phases(data: str, o: PretrainOptions, recipe, objective: Objective, per_rank: int,
                    budget: float | None) -> tuple[PretrainingDataset, list[Phase]]:
    """Phase 1's data (and its batch source), the recipe's short-sequence phase before it and
    --phase2-data after it, as the loop's phases."""
    rank, world = dist_info()
    train_options = dict(objective=objective, mask_mix=o.mask_mix, masking=o.masking)
    if recipe.masked_lm_prob is not None:
        train_options.update(masking="dynamic", masked_lm_prob=recipe.masked_lm_prob, max_predictions=None)

    def source(directory, seed_offset=0):
        dataset = PretrainingDataset(directory)
        options = dict(train_options)
        if recipe.masked_lm_prob is not None:  # room for the extra predictions a higher rate makes
            options["max_predictions"] = max(dataset.max_predictions,
                                             math.ceil(dataset.max_seq_length * recipe.masked_lm_prob))
        return dataset, PretrainingBatchSource(dataset, per_rank, o.seed + seed_offset, rank=rank, world_size=world,
                                               **options)

    dataset1, source1 = source(data)
    phases = []  # (source, name, share of all steps)
    if recipe.short_seq_length:
        short = PretrainingBatchSource(dataset1, per_rank, o.seed + 2, rank=rank, world_size=world,
                                       max_length=recipe.short_seq_length, **train_options)
        phases.append((short, f"short sequences (len {recipe.short_seq_length})", recipe.short_seq_fraction))
    phases.append((source1, f"phase1 (len {dataset1.max_seq_length})", None))
    if o.phase2_data:
        if not 0 < o.phase2_fraction < 1:
            raise BertkitError("--phase2-fraction must be between 0 and 1")
        dataset2, source2 = source(o.phase2_data, seed_offset=1)
        if dataset2.manifest["vocab"]["sha256"] != dataset1.manifest["vocab"]["sha256"]:
            raise BertkitError("phase-2 data was built with a different vocabulary than phase-1 data",
                               path=o.phase2_data)
        phases.append((source2, f"phase2 (len {dataset2.max_seq_length})", o.phase2_fraction))
    return dataset1, split_phases(phases, None if budget else recipe.max_steps)


def initial_model(o: PretrainOptions, recipe, objective: Objective, dataset1: PretrainingDataset,
                  deviations: list[str], budget: float | None):
    """The model to pre-train: --init-from's checkpoint, or the recipe's config at the data's vocabulary
    with the recipe's position initialisation (the caller has set the seed)."""
    if o.init_from is not None:
        model, _ = continued_model(o.init_from, dataset1, objective, recipe.dropout)
        deviations.append(f"continued from {o.init_from}")
        return model
    config = o.model_config if isinstance(o.model_config, BertConfig) else BertConfig.from_name_or_file(
        recipe.model_config)
    config = objective.configure(config.replace(vocab_size=dataset1.vocab_size, pad_token_id=dataset1.pad_id))
    if o.dropout is not None or budget:  # else a given config.json keeps its own dropout
        config = config.replace(hidden_dropout_prob=recipe.dropout, attention_probs_dropout_prob=recipe.dropout)
    model = objective.build_model(config)
    if recipe.position_init == "sinusoidal":
        sinusoidal_positions_(model.bert.embeddings.position_embeddings, config.initializer_range)
    elif recipe.position_init == "neighbours":
        neighbour_heads_(model, config.initializer_range, cls_token_id=dataset1.cls_id)
    return model


def evaluator(o: PretrainOptions, dataset1: PretrainingDataset, objective: Objective):
    """Held-out MLM / NSP evaluation on --eval-data (None without it)."""
    if not o.eval_data:
        return None
    eval_dataset = PretrainingDataset(o.eval_data)
    if eval_dataset.manifest["vocab"]["sha256"] != dataset1.manifest["vocab"]["sha256"]:
        raise BertkitError("--eval-data was built with a different vocabulary than --train-data", path=o.eval_data)
    eval_source = PretrainingBatchSource(eval_dataset, min(64, max(1, len(eval_dataset))), seed=0,
                                         drop_last=False, objective=objective, mask_mix=o.mask_mix,
                                         masking=o.masking)
    return make_evaluator(eval_source, o.eval_batches)


def run_identity(data: str, o: PretrainOptions, model, objective: Objective, recipe, budget: float | None) -> dict:
    """What a resumed run must have been started with (checked against its checkpoint)."""
    return {"data": str(Path(data).resolve()), "phase2_data": str(Path(o.phase2_data).resolve()) if o.phase2_data
            else None, "model": {k: v for k, v in model.config.to_dict().items() if k != "architectures"},
            "seed": o.seed, "objective": objective.flag, "nsp": objective.nsp, "batch_size": recipe.batch_size,
            "learning_rate": recipe.learning_rate, "time_budget": budget, "max_steps": recipe.max_steps,
            "init_from": str(o.init_from) if o.init_from else None}


def data_tokenizer(dataset: PretrainingDataset) -> BertTokenizer:
    """The tokenizer the data was made with, saved beside the model so the output folder is complete."""
    tokenizer = BertTokenizer.from_pretrained(dataset.directory / dataset.manifest["vocab"]["file"])
    if "do_lower_case" in dataset.manifest["vocab"]:
        tokenizer.do_lower_case = dataset.manifest["vocab"]["do_lower_case"]
    return tokenizer


def continued_model(init_from: str, dataset: PretrainingDataset, objective: Objective, dropout: float):
    """A pre-training model initialised from a checkpoint (a folder or a Hub id) whose vocabulary matches
    the data's."""
    directory = resolve_model(init_from)
    vocab_path = directory / "vocab.txt"
    if not vocab_path.is_file():
        raise BertkitError("--init-from needs the checkpoint's vocab.txt (its tokenizer is kept)", path=str(directory))
    model_tokens = vocab_path.read_text(encoding="utf-8").splitlines()
    data_tokens = (dataset.directory / dataset.manifest["vocab"]["file"]).read_text(encoding="utf-8").splitlines()
    if model_tokens != data_tokens:
        raise BertkitError(f"the pre-training data was made with another vocabulary ({len(data_tokens)} tokens) "
                           f"than the checkpoint's vocab.txt ({len(model_tokens)} tokens); rebuild the data with "
                           f"--vocab {vocab_path}", path=str(dataset.directory))
    config = BertConfig.from_json_file(directory / "config.json")
    config = objective.configure(config.replace(hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout,
                                                architectures=None))
    model = objective.head().from_pretrained(directory, config=config)
    if model.loading_info["missing_keys"]:
        log.warning("--init-from %s: newly initialised (not in the checkpoint): %s", init_from,
                    ", ".join(model.loading_info["missing_keys"]))
    return model, config


def finish_output(output: Path, model, restore_dropout: float | None, recipe, deviations: list[str], result,
                  run_record: dict) -> None:
    """The output folder as a complete model for fine-tuning: config.json with the fine-tuning dropout
    (pre-training may have run without it) and the recipe's deviations from the paper named, as in
    pretrain_args.json."""
    config = model.config
    if restore_dropout is not None:
        config = config.replace(hidden_dropout_prob=restore_dropout, attention_probs_dropout_prob=restore_dropout)
    record = {"deviations_from_paper": deviations, "dropout_while_pretraining": recipe.dropout,
              "steps": result.global_step}
    # A copy: the model's own config is left as it was.
    config = config.replace(architectures=[type(model).__name__],
                            extra={**config.extra, "bertkit_pretraining": record})
    config.save(output)
    run_record = {**run_record, "steps": result.global_step,
                  "plan": result.plan.to_dict() if result.plan is not None else None,
                  "stopped_early": result.stopped_early}
    atomic_write_text(output / "pretrain_args.json", json.dumps(run_record, indent=2) + "\n")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--train-data", dest="train_data", required=True,
                   help="pre-training data directory (bertkit create-pretraining-data); the held-out one is --eval-data")
    p.add_argument("--output", required=True, help="run directory: model, checkpoints, metrics.jsonl")
    p.add_argument("--vocab", help="a check only: refused when it disagrees with the data's vocabulary (the data "
                                   "carries its own)")
    settings.add_arguments(p, PretrainOptions)


def run_from_args(args) -> int:
    if args.vocab:
        dataset = PretrainingDataset(args.train_data)
        data_vocab = (dataset.directory / dataset.manifest["vocab"]["file"]).read_bytes()
        vocab_path = Path(args.vocab) / "vocab.txt" if Path(args.vocab).is_dir() else Path(args.vocab)
        if not vocab_path.is_file():
            raise BertkitError("vocabulary file not found", path=str(vocab_path))
        if vocab_path.read_bytes() != data_vocab:
            raise BertkitError("--vocab differs from the vocabulary the data was built with", path=str(vocab_path))
    result = pretrain(args.train_data, args.output, PretrainOptions.from_args(args))
    rank, _ = dist_info()
    if rank == 0:
        final = result.eval_history[-1] if result.eval_history else result.last_logs
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in final.items()}
        print(json.dumps({"global_step": result.global_step, "seq_per_s": round(result.sequences_per_second, 2),
                          "elapsed_s": round(result.elapsed_seconds, 1), **shown}))
    return 0


__all__ = ["pretrain", "PretrainOptions", "build_pretraining_model", "make_evaluator"]
