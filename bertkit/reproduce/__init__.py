"""The paper end to end at a compute budget (`bertkit reproduce`): budgets/*.json, the named stages
(`stages`: corpus, vocabulary, data, pre-training of each variant, fine-tuning, report), the report
(`report`), the learning curve of pre-trained BERT against random init (`learning_curve`,
`learning_curve_report`) and the command line (`command`)."""

from .stages import (
    BUDGET_DIR,
    available_tasks,
    finetune_settings,
    load_budget,
    model_config,
    plan,
    reference_model_dir,
    reproduce,
)

__all__ = ["BUDGET_DIR", "available_tasks", "finetune_settings", "load_budget", "model_config", "plan",
           "reference_model_dir", "reproduce"]
