"""One run of a fine-tuning sweep: its configuration (learning rate, epochs, batch size, seed), its
name on disk, and what it gave (`RunResult`)."""

from __future__ import annotations

import dataclasses
import itertools


@dataclasses.dataclass
class RunResult:
    config: dict  # {"learning_rate", "epochs", "batch_size", "seed"}
    metrics: dict  # dev metrics
    score: float  # the selection score (task score on dev)
    seconds: float = 0.0
    artifacts: object = None  # e.g. the trained model, kept only for the best run
    training: dict = dataclasses.field(default_factory=dict)  # the loop's figures: global_step, train_seconds, ...


def grid(learning_rates, epochs, batch_sizes, seeds) -> list[dict]:
    return [dict(learning_rate=lr, epochs=ep, batch_size=bs, seed=s)
            for lr, ep, bs, s in itertools.product(learning_rates, epochs, batch_sizes, seeds)]


def run_name(config: dict) -> str:
    """The folder name of one run of a sweep: lr5e-05_ep3_bs32_seed42."""
    return f"lr{config['learning_rate']:g}_ep{config['epochs']:g}_bs{config['batch_size']}_seed{config['seed']}"


def config_text(config: dict) -> str:
    return (f"lr {config['learning_rate']:g} epochs {config['epochs']:g} batch {config['batch_size']} "
            f"seed {config['seed']}")
