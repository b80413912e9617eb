"""report.md and report.json of `bertkit reproduce`.

What the report shows, in order: how pre-training went (held-out MLM / NSP accuracy per variant,
each under the same budget); per task, the pre-trained BERT against the same architecture from
random init over fine-tuning seeds (mean, sd, and whether the gap exceeds the noise by
metrics/seeds.py's rule); every model in a table laid out like the paper's Table 5; and a paragraph
on which of the paper's findings hold at this scale, written from those numbers (`findings`).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

from ..version import __version__
from ..outputs import atomic_write_text
from ..metrics.seeds import NOISE_RULE, Gap, compare_seeds, seed_stats
from ..pretraining.objectives import OBJECTIVES
from ..tasks.registry import BENCHMARKS

VARIANT_LABELS = {**{name: objective.label for name, objective in OBJECTIVES.items()},
                  "ltr+bilstm": "+ BiLSTM", "random-init": "random init (no pre-training)",
                  "reference": "all-MiniLM-L6-v2 (real pre-trained weights)"}
SHORT_LABELS = {**{name: objective.short_label for name, objective in OBJECTIVES.items()}, "ltr+bilstm": "LTR + BiLSTM",
                "random-init": "random init", "reference": "all-MiniLM-L6-v2"}
# What the variants' objectives change is the table's subject, not a deviation to list under it.
OBJECTIVE_DEVIATIONS = {objective.deviation for objective in OBJECTIVES.values() if objective.deviation}
# The paper's Table 5 (BERT-BASE, dev): the metric each column reports.
PAPER_TABLE5 = {
    "bert": {"mnli": 84.4, "qnli": 88.4, "mrpc": 86.7, "sst-2": 92.7, "squad": 88.5},
    "no-nsp": {"mnli": 83.9, "qnli": 84.9, "mrpc": 86.5, "sst-2": 92.6, "squad": 87.9},
    "ltr": {"mnli": 82.1, "qnli": 84.3, "mrpc": 77.5, "sst-2": 92.1, "squad": 77.8},
    "ltr+bilstm": {"mnli": 82.1, "qnli": 84.1, "mrpc": 75.7, "sst-2": 91.6, "squad": 84.9},
}


# ---------------------------------------------------------------- seeds and comparisons


def seed_values(summary: dict | None) -> list[float]:
    """A model's dev scores on a task over its fine-tuning seeds (percent): the runs of the setting
    (learning rate, epochs, batch) with the best mean; every run when the settings were not recorded."""
    if not summary:
        return []
    scores = list(summary.get("run_scores") or [])
    if not scores:
        return [] if summary.get("value") is None else [summary["value"]]
    configs = summary.get("run_configs") or []
    if len(configs) != len(scores) or any(not isinstance(c, dict) for c in configs):
        return scores
    groups: dict[str, list[float]] = {}
    for score, config in zip(scores, configs):
        key = json.dumps({k: v for k, v in config.items() if k != "seed"}, sort_keys=True, default=str)
        groups.setdefault(key, []).append(score)
    return max(groups.values(), key=statistics.fmean)


def model_gap(results: dict, a: str, b: str, task: str) -> Gap | None:
    """Model a against model b on a task over their seeds; None when either did not run it. Two single
    runs are judged against the largest seed sd any model has on that task."""
    va, vb = seed_values(results.get(a, {}).get(task)), seed_values(results.get(b, {}).get(task))
    if not va or not vb:
        return None
    spreads = [seed_stats(v).sd for m in results if m != "reference"
               if len(v := seed_values(results[m].get(task))) > 1]
    return compare_seeds(va, vb, fallback_sd=max(spreads, default=None))


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"{statistics.fmean(values):.1f} ± {statistics.stdev(values):.1f}"


# ---------------------------------------------------------------- findings in plain words


def _gap_text(task: str, gap: Gap, a: str) -> str:
    """'SST-2 (by 8.0; noise 4.0)' for a model ahead, 'SQuAD (+1.0 for BERT; noise 4.0)' otherwise."""
    noise = "" if gap.threshold is None else f"; noise {gap.threshold:.1f}"
    size = f"by {abs(gap.difference):.1f}" if gap.beyond_noise else f"{gap.difference:+.1f} for {a}"
    return f"{_task_label(task)} ({size}{noise})"


def _sort_gaps(gaps: dict[str, Gap]) -> dict[str, list[str]]:
    """Tasks by verdict: 'a' ahead beyond the noise, 'b' ahead, 'within', 'unknown'."""
    out: dict[str, list[str]] = {"a": [], "b": [], "within": [], "unknown": []}
    for task, gap in gaps.items():
        out[gap.verdict].append(task)
    return out


def _comparison_sentence(gaps: dict[str, Gap], a: str, b: str) -> str:
    """Which tasks put a ahead of b beyond the noise, b ahead of a, or neither (gaps are a - b)."""
    by = _sort_gaps(gaps)

    def listing(tasks: list[str]) -> str:
        return ", ".join(_gap_text(t, gaps[t], a) for t in tasks)

    parts = []
    if by["a"]:
        parts.append(f"{a} is ahead beyond the noise on {listing(by['a'])}")
    if by["b"]:
        parts.append(f"{b} is ahead beyond the noise on {listing(by['b'])}")
    if by["within"]:
        parts.append(f"the gap is within the noise on {listing(by['within'])}")
    if by["unknown"]:
        parts.append(f"there is no noise estimate (one run each) on {listing(by['unknown'])}")
    return "; ".join(parts) + "."


def _verdict(gaps: dict[str, Gap], holds_when: str) -> str:
    """'holds' when the paper's direction (holds_when: 'a' or 'b') wins somewhere and never loses,
    'reversed' for the opposite, 'mixed' for both, 'not visible' when nothing exceeds the noise."""
    by = _sort_gaps(gaps)
    other = "b" if holds_when == "a" else "a"
    if by[holds_when] and by[other]:
        return "mixed"
    if by[holds_when]:
        return "holds on every task" if len(by[holds_when]) == len(gaps) else \
            f"holds on {len(by[holds_when])} of {len(gaps)} tasks"
    if by[other]:
        return "reversed"
    return "not visible" if by["within"] else "no verdict"


def _pretraining_finding(results: dict, tasks: list[str]) -> str | None:
    gaps = {t: g for t in tasks if (g := model_gap(results, "bert", "random-init", t)) is not None}
    if not gaps:
        return None
    verdict = _verdict(gaps, "a")
    opening = {"mixed": "Only in part, and not everywhere in the same direction",
               "reversed": "No", "not visible": "Not measurably", "no verdict": "It cannot be told here"}
    first = "Yes" if verdict.startswith("holds") else opening[verdict]
    return (f"Does pre-training beat random initialisation of the same model (the paper's premise)? {first}: "
            f"{_comparison_sentence(gaps, 'BERT', 'random init')} Verdict: {verdict}.")


def _nsp_finding(results: dict, pretraining: dict, tasks: list[str], nsp_majority: float | None) -> str | None:
    gaps = {t: g for t in tasks if (g := model_gap(results, "bert", "no-nsp", t)) is not None}
    if not gaps:
        return None
    nsp = (pretraining.get("bert", {}).get("final_eval") or {}).get("nsp_accuracy")
    majority = "" if nsp_majority is None else f"; always answering the held-out data's majority class scores " \
                                               f"{100 * nsp_majority:.1f}%"
    held_out = "" if nsp is None else f" The BERT variant's held-out NSP accuracy is {100 * nsp:.1f}%{majority}."
    return ("Does next-sentence prediction help (the paper: removing it costs 3.5 points on QNLI, 0.5 on MNLI, "
            f"0.6 on SQuAD)? Comparing BERT with No NSP, {_comparison_sentence(gaps, 'BERT', 'No NSP')} "
            f"Verdict: {_verdict(gaps, 'a')}.{held_out}")


def _ltr_finding(results: dict, tasks: list[str]) -> str | None:
    """The paper: a left-to-right model (both without NSP) loses most on SQuAD (87.9 -> 77.8 F1), and a
    BiLSTM on top recovers part of it (84.9). Judged on SQuAD when it ran, else on every task."""
    squad = [t for t in tasks if t in ("squad", "squad2")]
    shown = squad or tasks
    gaps = {t: g for t in shown if (g := model_gap(results, "no-nsp", "ltr", t)) is not None}
    if not gaps:
        return None
    where = "On SQuAD" if squad else "SQuAD did not run here; on the other tasks"
    text = ("Does a left-to-right model hurt token-level tasks (the paper: 10.1 F1 lost on SQuAD against the "
            f"MLM model without NSP)? {where}, {_comparison_sentence(gaps, 'No NSP (MLM)', 'LTR')} "
            f"Verdict: {_verdict(gaps, 'a')}.")
    bilstm = {t: g for t in shown if (g := model_gap(results, "ltr+bilstm", "ltr", t)) is not None}
    if bilstm:
        text += (" Adding a BiLSTM to the LTR model (the paper: +7.1 F1 on SQuAD): "
                 f"{_comparison_sentence(bilstm, 'LTR + BiLSTM', 'LTR')}")
    return text


def _mlm_finding(pretraining: dict) -> str | None:
    accuracy = {v: (r.get("final_eval") or {}).get("mlm_accuracy") for v, r in pretraining.items()}
    masked = [f"{SHORT_LABELS[v]} {100 * a:.1f}%" for v, a in accuracy.items() if a is not None and OBJECTIVES[v].masked]
    if not masked:
        return None
    text = f"Held-out masked-token accuracy after pre-training: {', '.join(masked)}"
    for v, a in accuracy.items():
        if a is not None and not OBJECTIVES[v].masked:
            objective = OBJECTIVES[v]
            text += f" ({objective.short_label}'s {objective.accuracy_name}, another task: {100 * a:.1f}%)"
    return text + "."


def findings(results: dict, pretraining: dict, tasks: list[str], nsp_majority: float | None = None) -> list[str]:
    """Sentences on the paper's findings at this scale, each from this run's numbers (`nsp_majority`:
    the share of the held-out pairs in the more frequent NSP class)."""
    out = [s for s in (_pretraining_finding(results, tasks), _nsp_finding(results, pretraining, tasks, nsp_majority),
                       _ltr_finding(results, tasks), _mlm_finding(pretraining)) if s]
    single = [m for m in results if m != "reference" and any(len(seed_values(r)) == 1 for r in results[m].values())]
    if single and len(out) > 1:
        names = ", ".join(SHORT_LABELS.get(m, m) for m in single)
        out.append(f"Models with one fine-tuning run ({names}) are single draws, judged against the seed sd of the "
                   "models with several runs on the same task.")
    return out or ["No pair of models ran on the same task, so there is nothing to compare."]


# ---------------------------------------------------------------- the report


def write_report(out: Path, budget: dict, data_dir: Path, stages, corpus: dict, data: dict,
                 model_dirs: dict, tasks: list[str], results: dict, seconds: float, precision: str) -> dict:
    """report.md and report.json in `out`; returns report.json's content. `stages` is the run's cache
    (its `records` and the names it `ran` this time)."""
    pre = {v: stages.records[f"pretrain-{v}"]["result"] for v in OBJECTIVES if f"pretrain-{v}" in stages.records}
    comparison = {t: model_gap(results, "bert", "random-init", t) for t in tasks}
    not_next = data.get("heldout_counts", {}).get("not_next_fraction")
    said = findings(results, pre, tasks, None if not_next is None else max(not_next, 1 - not_next))
    lines = [f"# bertkit reproduction — budget `{budget['name']}`", "", budget.get("about", ""), ""]
    lines += _environment(budget, data_dir, stages, seconds, precision)
    lines += _pretraining_section(out, corpus, data, pre)
    lines += _comparison_section(comparison)
    lines += _table5_section(model_dirs, tasks, results, pre)
    lines += ["", "## What the numbers say", "", " ".join(said)]
    if "reference" in results:
        lines += _reference_section(budget, tasks, results)
    lines += ["", "### Runs and seeds", ""]
    for m in model_dirs:
        for t in tasks:
            r = results.get(m, {}).get(t)
            if r and r.get("run_scores"):
                s = r["run_scores"]
                lines.append(f"- {VARIANT_LABELS.get(m, m)} / {t}: {len(s)} run(s), dev {r.get('metric', 'score')} "
                             f"{_cell(s)} (runs: {', '.join(f'{x:.1f}' for x in s)})")
    lines += ["", "## Wall time per stage", "", "| stage | seconds |", "|---|---|"]
    for name, rec in stages.records.items():
        lines.append(f"| {name} | {rec['seconds']:.1f} |")
    lines += ["", "## What this budget can and cannot show", "", _limits_text(corpus, pre), ""]
    atomic_write_text(out / "report.md", "\n".join(lines) + "\n")
    report = {"budget": budget["name"], "seconds": seconds, "precision": precision, "corpus": corpus,
              "pretraining": pre, "finetune": results, "tasks": tasks,
              "models": {k: str(v) for k, v in model_dirs.items()},
              "pretrained_vs_random_init": {t: _gap_record(g) for t, g in comparison.items()},
              "noise_rule": NOISE_RULE, "findings": said,
              "stages": {k: {"seconds": v["seconds"], "key": v["key"]} for k, v in stages.records.items()},
              "stages_run_this_time": stages.ran, "paper_table5": PAPER_TABLE5}
    atomic_write_text(out / "report.json", json.dumps(report, indent=2, default=str) + "\n")
    return report


def _environment(budget: dict, data_dir: Path, stages, seconds: float, precision: str) -> list[str]:
    gpu = "CUDA " + torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    command = (" ".join(sys.argv) if sys.argv and "bertkit" in sys.argv[0]
               else f"bertkit reproduce --budget {budget['name']}")
    return ["## Environment and command", "",
            f"- bertkit {__version__}, Python {platform.python_version()}, torch {torch.__version__}, "
            f"{os.cpu_count()} CPU core(s), {gpu}, precision {precision}",
            f"- command: `{command}`",
            f"- budget file: `{budget['_path']}`; data: `{data_dir}`",
            f"- total wall time {seconds / 60:.1f} min (stages taken from cache this time: "
            f"{len(stages.records) - len(stages.ran)} of {len(stages.records)})", ""]


def _pretraining_section(out: Path, corpus: dict, data: dict, pre: dict) -> list[str]:
    budgets = {r.get("time_budget_seconds") for r in pre.values()}
    if len(budgets) == 1 and None not in budgets:
        schedule = (f"Every variant pre-trained under the same wall-clock budget of {_duration(budgets.pop())} "
                    "(data loading, evaluations and checkpoints included), with the recipe measured for it; "
                    "a variant whose step costs more (LTR predicts every position) takes fewer steps.")
    else:
        steps = {r["steps"] for r in pre.values()}
        schedule = (f"Every variant pre-trained for the same {steps.pop():,} steps." if len(steps) == 1
                    else "Variants pre-trained for different step counts.")
    lines = ["## Pre-training", "",
             f"Corpus slice: {corpus['train_documents']} documents ({corpus['train_words']:,} words) for training, "
             f"{corpus['heldout_documents']} held out. Instances: {data['train_counts'].get('instances', '?')} train, "
             f"{data['heldout_counts'].get('instances', '?')} held-out. {schedule}", "",
             "| variant | time budget | steps | sequences | seq/s | held-out MLM acc. | MLM perplexity | "
             "held-out NSP acc. |", "|---|---|---|---|---|---|---|---|"]
    for v, r in pre.items():
        ev = r.get("final_eval", {})
        budget = r.get("time_budget_seconds")
        sequences = r.get("sequences")
        lines.append(f"| {VARIANT_LABELS[v]} | {'-' if budget is None else _duration(budget)} | {r['steps']:,} | "
                     f"{'-' if sequences is None else f'{sequences:,}'} | {r['seq_per_s']:.1f} | "
                     f"{_pct(ev.get('mlm_accuracy'))} | {_num(ev.get('mlm_perplexity'))} | "
                     f"{_pct(ev.get('nsp_accuracy'))} |")
    for v in pre:
        if not OBJECTIVES[v].masked:
            lines += ["", f"({OBJECTIVES[v].short_label}'s 'MLM' numbers are {OBJECTIVES[v].predicts} on the held-out "
                          "text.)"]
    deviations = next((r.get("deviations_from_paper") for r in pre.values() if r.get("deviations_from_paper")), None)
    if deviations:
        lines += ["", "Deviations from the paper's pre-training (as each run's config.json names them): "
                  + "; ".join(d for d in deviations if d not in OBJECTIVE_DEVIATIONS) + "."]
    lines.append("")
    for v, r in pre.items():
        for png in r.get("plots", []):
            lines.append(f"![{v} {Path(png).stem}]({os.path.relpath(png, out)})")
    return lines


def _comparison_section(comparison: dict[str, Gap | None]) -> list[str]:
    rows = {t: g for t, g in comparison.items() if g is not None}
    if not rows:
        return []
    lines = ["", "## Pre-trained against random init (same architecture, same fine-tuning)", "",
             "Dev scores (percent) over fine-tuning seeds at the setting with the best mean: mean, sample standard "
             f"deviation and number of runs. The gap exceeds the noise when {NOISE_RULE} (a: BERT, b: random "
             "init).", "",
             "| task | BERT mean | sd | n | random init mean | sd | n | gap | 2 x larger sd | beyond the noise? |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for t, g in rows.items():
        beyond = {"a": "yes, BERT ahead", "b": "yes, random init ahead", "within": "no",
                  "unknown": "no verdict (one run each)"}[g.verdict]
        lines.append(f"| {_task_label(t)} | {g.a.mean:.1f} | {_num(g.a.sd)} | {g.a.n} | {g.b.mean:.1f} | "
                     f"{_num(g.b.sd)} | {g.b.n} | {g.difference:+.1f} | {_num(g.threshold)} | {beyond} |")
    return lines


def _table5_section(model_dirs: dict, tasks: list[str], results: dict, pre: dict) -> list[str]:
    budgets = {r.get("time_budget_seconds") for r in pre.values()}
    equal = (f" Every pre-trained variant had the same budget ({_duration(budgets.pop())})."
             if len(budgets) == 1 and None not in budgets else "")
    lines = ["", "## Fine-tuning: a table laid out like the paper's Table 5", "",
             "Dev-set scores (percent; accuracy, or F1 for SQuAD and NER, Matthews corr. for CoLA, Spearman for "
             "STS-B): the mean over a model's fine-tuning seeds (± sd with more than one), at the setting with the "
             "best mean; the best single run of each (the paper's selection) is in report.json. One row per "
             "pre-trained variant, plus the same architecture with no pre-training and a real pre-trained encoder."
             + equal, ""]
    lines += ["| model | runs | " + " | ".join(_task_label(t) for t in tasks) + " |", "|---|---|" + "---|" * len(tasks)]
    for m in model_dirs:
        values = [seed_values(results.get(m, {}).get(t)) for t in tasks]
        runs = max((len(v) for v in values), default=0)
        lines.append(f"| {VARIANT_LABELS.get(m, m)} | {runs} | " + " | ".join(_cell(v) for v in values) + " |")
    lines += ["", "The paper's Table 5 (BERT-BASE, 1M steps on 3.3B words; dev):", "",
              "| model | MNLI-m | QNLI | MRPC | SST-2 | SQuAD F1 |", "|---|---|---|---|---|---|"]
    for v, cols in PAPER_TABLE5.items():
        lines.append(f"| {VARIANT_LABELS[v]} | "
                     + " | ".join(f"{cols[c]:.1f}" for c in ("mnli", "qnli", "mrpc", "sst-2", "squad")) + " |")
    return lines


def _reference_section(budget: dict, tasks: list[str], results: dict) -> list[str]:
    """What full-scale pre-training buys: the real all-MiniLM-L6-v2 beside this run's BERT and random init."""
    ref_cfg = budget.get("reference_model", {})
    ft = {**budget["finetune"], **{k: v for k, v in ref_cfg.items() if k not in ("enabled", "tasks")}}
    lines = ["", "## A real pre-trained encoder: all-MiniLM-L6-v2", "",
             "The same fine-tuning code on the real all-MiniLM-L6-v2 weights (6 layers, hidden 384, distilled from a "
             "model pre-trained on billions of words, then tuned for sentence embeddings; its own uncased vocabulary). "
             "The gap to this run's BERT is what full-scale pre-training buys at this fine-tuning budget.", "",
             "| task | BERT (this run) | random init | all-MiniLM-L6-v2 | MiniLM - BERT | MiniLM training data |",
             "|---|---|---|---|---|---|"]
    for t in tasks:
        mine, rand, ref = (results.get(m, {}).get(t) for m in ("bert", "random-init", "reference"))
        if not ref:
            continue
        gap = ref["value"] - mine["value"] if mine and ref["value"] is not None and mine["value"] is not None else None
        cfg = {**budget["tasks"][t], **ref_cfg.get("tasks", {}).get(t, {})}
        unit = "sentences" if t == "ner" else "examples"  # NER's quick runs keep the first N sentences
        size = f"{cfg['max_train_examples']:,} {unit}" if cfg.get("max_train_examples") else "all"
        lines.append(f"| {_task_label(t)} | {_fmt(mine and mine['value'])} | {_fmt(rand and rand['value'])} | "
                     f"{_fmt(ref['value'])} | {'-' if gap is None else f'{gap:+.1f}'} | {size} |")
    lines += ["", f"Settings: learning rate(s) {', '.join(f'{x:g}' for x in ft['learning_rates'])}, epochs "
              f"{', '.join(str(x) for x in ft['epochs'])}, seeds {', '.join(str(x) for x in ft['seeds'])}, "
              f"batch {ft.get('batch_size', '-')}; best single run per task."]
    return lines


def _gap_record(gap: Gap | None) -> dict | None:
    if gap is None:
        return None
    return {"bert": vars(gap.a), "random_init": vars(gap.b), "difference": gap.difference,
            "threshold": gap.threshold, "beyond_noise": gap.beyond_noise}


def _limits_text(corpus: dict, pre: dict) -> str:
    seen = [r.get("sequences") or r["steps"] * r.get("batch_size", 0) for r in pre.values()]
    seqs = max(seen, default=0)
    return (f"Pre-training here saw at most {seqs:,} sequences per variant from {corpus['train_words']:,} words; the "
            f"paper's BERT-BASE saw 256 x 1,000,000 = 256M sequences from 3.3B words, roughly "
            f"{256_000_000 / max(seqs, 1):,.0f} times more, on a much larger model. Read the findings above "
            "as what this scale shows, not as a replication of the paper's numbers: with a handful of fine-tuning "
            "seeds the noise threshold is itself uncertain, and a variant row with one run is a single draw. Task "
            "training sets are subsampled as the budget file says, so absolute scores sit below the paper's.")


def _duration(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 and seconds % 60 == 0 else f"{seconds:g} s"


def _task_label(task: str) -> str:
    return BENCHMARKS[task].label if task in BENCHMARKS else task


def _fmt(x) -> str:
    return "-" if x is None else f"{x:.1f}"


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x) -> str:
    return "-" if x is None else f"{x:.2f}"


__all__ = ["VARIANT_LABELS", "PAPER_TABLE5", "seed_values", "model_gap", "findings", "write_report"]
