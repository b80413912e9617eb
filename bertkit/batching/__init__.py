"""Batching and windowing, below training, inference and the tasks, which all import it: padding
(`collate` to the longest, `pad_rows` to a bucketed length, `pack_rows` several inputs in one row),
batch order (`length_sorted_batches`, `length_grouped_batches` under a token budget), the seeded,
resumable training source (`FeatureSource`) and the sliding windows over a long passage
(`doc_spans`, `check_is_max_context`)."""

from .order import length_grouped_batches, length_sorted_batches
from .padding import LENGTH_BUCKET, SINGLE_LENGTH_BUCKET, bucketed, collate, pack_rows, pad_rows, padded_length
from .source import FeatureSource
from .windows import check_is_max_context, doc_spans

__all__ = ["LENGTH_BUCKET", "SINGLE_LENGTH_BUCKET", "FeatureSource", "bucketed", "check_is_max_context", "collate",
           "doc_spans", "length_grouped_batches", "length_sorted_batches", "pack_rows", "pad_rows", "padded_length"]
