"""Pre-training data: corpus reading, sentence-pair instances, masking, shards and their loader."""

from .corpus import CorpusStats, iter_documents, read_corpus_file, split_sentences
from .create import add_arguments, create_pretraining_data, run_from_args
from .instances import PairSpan, TrainingInstance, create_instances_from_document, plan_instances_from_document
from .masking import mask_batch, mask_tokens, parse_mask_mix
from .shards import PretrainingBatchSource, PretrainingDataset

__all__ = [
    "CorpusStats", "iter_documents", "read_corpus_file", "split_sentences", "create_pretraining_data",
    "add_arguments", "run_from_args", "PairSpan", "TrainingInstance", "create_instances_from_document",
    "plan_instances_from_document", "mask_tokens", "mask_batch", "parse_mask_mix", "PretrainingDataset",
    "PretrainingBatchSource",
]
