"""The names every task module shares, gathered from where they live (kept so that
`from bertkit.tasks.common import ...` goes on working):

- examples.py: the data folder, `Examples`, `BadRows` (malformed rows), `subsample`;
- runs.py: one run's configuration, name and `RunResult`; `grid`;
- sweep.py: the paper's protocol (`run_sweep`, `run_protocol`, `train_one`);
- sweep_state.py: resuming a sweep (`SweepState`: JSON and safetensors, nothing unpickled);
- results.py: `TaskResult`, results.json's layout, prediction files;
- benchmarks.py: what `bertkit reproduce` runs (`Benchmark`, `BenchmarkSettings`);
- arguments.py: the flags every task spells the same way.
"""

from __future__ import annotations

from .arguments import (FINETUNE_DROPOUT, MIN_SEQ_LENGTH, add_data_dir_argument, add_dropout_argument,  # noqa: F401
                        add_max_examples_arguments, add_overwrite_argument, add_resume_argument,
                        add_sweep_arguments, check_finetune_output, deprecated, dropout_overrides, number,
                        parse_list, sweep_options)
from .benchmarks import Benchmark, BenchmarkSettings  # noqa: F401
from .examples import BadRows, Examples, resolve_data_dir, subsample  # noqa: F401
from .results import (PERCENT, TaskResult, publish_best_metrics, results_document, summarize,  # noqa: F401
                      write_predictions)
from .runs import RunResult, config_text, grid, run_name  # noqa: F401
from .sweep import predict_precision, run_protocol, run_sweep, train_one  # noqa: F401
from .sweep_state import SweepState  # noqa: F401
