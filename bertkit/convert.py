"""`bertkit convert --from-tf DIR --output OUT`: an original TensorFlow checkpoint -> a Hugging Face folder.

OUT gets config.json (from bert_config.json, with `architectures` from the variables present),
model.safetensors (every model variable, see tf_bert's map), vocab.txt and tokenizer_config.json
(do_lower_case given, or inferred from the vocabulary). OUT then loads in bertkit and transformers.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

from safetensors.torch import save_file

from .errors import BertkitError
from .heads import TASK_CLASSES
from .hub.checkpoints import WEIGHTS_NAME, atomic_write, save_tokenizer_files
from .hub.model_card import write_model_card
from .outputs import check_output_dir, check_output_file, folder_files
from .hub.tf_bert import BERT_CONFIG_NAME, OriginalCheckpoint, infer_do_lower_case
from .tokenizer import BertTokenizer

log = logging.getLogger("bertkit")


def vocabulary_fits(tokens: int, rows: int) -> bool:
    """vocab.txt and the embedding matrix agree: equal, or the matrix padded to a multiple of 8 with
    fewer than 128 spare rows (NVIDIA's BERT pads 30,522 tokens to 30,528 rows, Megatron to a multiple
    of 128, for faster GEMMs). Anything else is another model's vocabulary."""
    return tokens == rows or (tokens < rows < tokens + 128 and rows % 8 == 0)


OUTPUT_FILES = (WEIGHTS_NAME, "config.json", "vocab.txt", "tokenizer_config.json")


def convert_tf_checkpoint(source: str | Path, output: str | Path, config_file: str | Path | None = None,
                          vocab_file: str | Path | None = None, do_lower_case: bool | None = None,
                          overwrite: bool = False) -> dict:
    """Convert; returns a summary (architecture, counts, do_lower_case). `source` is a folder or a
    checkpoint prefix; bert_config.json and vocab.txt default to the checkpoint's folder (a
    fine-tuning output folder has neither: pass the pre-trained model's)."""
    checkpoint = OriginalCheckpoint.open(source)
    folder = checkpoint.prefix.parent
    config_file = Path(config_file) if config_file else folder / BERT_CONFIG_NAME
    vocab_file = Path(vocab_file) if vocab_file else folder / "vocab.txt"
    # Before any work: no output file may be an input (converting in place would rewrite vocab.txt), or
    # replace an earlier conversion without --overwrite.
    check_output_dir(output, overwrite=True)
    for name in OUTPUT_FILES:
        check_output_file(Path(output) / name, inputs=[*folder_files(folder), config_file, vocab_file],
                          overwrite=overwrite)
    config = checkpoint.config(config_file)
    if not vocab_file.is_file():
        raise BertkitError("vocab.txt not found (the original model's vocabulary: pass it with --vocab)",
                           path=vocab_file)
    tokenizer = BertTokenizer(vocab_file, do_lower_case=do_lower_case is not False)  # reads and checks the file
    if do_lower_case is None:
        do_lower_case = infer_do_lower_case(tokenizer.ids_to_tokens)
        if not do_lower_case:
            tokenizer = BertTokenizer(vocab_file, do_lower_case=False)
    # The length limit the Hugging Face copies of Google's checkpoints declare: the model's positions.
    tokenizer.model_max_length = config.max_position_embeddings
    if not vocabulary_fits(tokenizer.vocab_size, config.vocab_size):
        raise BertkitError(f"the vocabulary has {tokenizer.vocab_size} tokens but the model's vocab_size is "
                           f"{config.vocab_size} (is this the model's vocab.txt?)", path=vocab_file)
    if tokenizer.vocab_size < config.vocab_size:
        log.info(f"embedding matrix padded: {config.vocab_size} rows for {tokenizer.vocab_size} tokens")

    state = checkpoint.state_dict()
    # Loading into the model checks every shape against the config and that nothing is missing.
    model = TASK_CLASSES[config.architectures[0]](config)
    loaded = model.load_checkpoint_state(state, source=str(checkpoint.bundle.index_path))
    if loaded["missing_keys"]:
        missing = loaded["missing_keys"]
        raise BertkitError(f"the checkpoint lacks {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1
                                                                   else "") + f" for {config.architectures[0]}",
                           path=checkpoint.bundle.index_path)

    output = Path(output)
    output.mkdir(parents=True, exist_ok=True)
    tensors = {name: tensor.contiguous() for name, tensor in state.items()}
    atomic_write(output / WEIGHTS_NAME, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt"}))
    config_json = json.dumps(model.config.to_dict(), indent=2, sort_keys=True) + "\n"
    atomic_write(output / "config.json", lambda tmp: Path(tmp).write_text(config_json, encoding="utf-8"))
    save_tokenizer_files(tokenizer, output, model.config.max_position_embeddings)
    write_model_card(output, model.config)
    return {"output": str(output), "architecture": config.architectures[0], "tensors": len(tensors),
            "skipped": len(checkpoint.bundle.entries) - len(checkpoint.names), "do_lower_case": do_lower_case,
            "num_labels": config.num_labels if config.architectures[0] == "BertForSequenceClassification" else None}


def add_arguments(parser) -> None:
    parser.add_argument("--from-tf", required=True, metavar="DIR",
                        help="original TensorFlow checkpoint: a folder (bert_config.json, vocab.txt, *.ckpt.index) "
                             "or a checkpoint prefix such as DIR/model.ckpt-1000")
    parser.add_argument("--output", required=True, help="folder to write (Hugging Face layout)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier conversion's files in --output (never the checkpoint's own files)")
    parser.add_argument("--config", help="bert_config.json (default: beside the checkpoint)")
    parser.add_argument("--vocab", help="vocab.txt (default: beside the checkpoint)")
    case = parser.add_mutually_exclusive_group()
    case.add_argument("--cased", dest="do_lower_case", action="store_false", default=None,
                      help="keep case (default: inferred from the vocabulary: capitalised tokens mean cased)")
    case.add_argument("--uncased", dest="do_lower_case", action="store_true")


def run_from_args(args) -> dict:
    summary = convert_tf_checkpoint(args.from_tf, args.output, args.config, args.vocab, args.do_lower_case,
                                    overwrite=args.overwrite)
    labels = f", {summary['num_labels']} labels" if summary["num_labels"] else ""
    print(f"wrote {summary['output']}: {summary['architecture']}{labels}, {summary['tensors']} tensors "
          f"({summary['skipped']} optimizer slots / global_step skipped), "
          f"do_lower_case={str(summary['do_lower_case']).lower()}", file=sys.stderr)
    return summary
