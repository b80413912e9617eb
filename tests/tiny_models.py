"""Tiny task models with random weights, saved in the Hugging Face layout, for the inference tests
(pipelines, predict, serve): bertkit and transformers load the same folder."""

import torch

from bertkit import BertConfig


def save_tiny_task_model(cls, tokenizer, directory, max_positions=128, **config):
    torch.manual_seed(0)
    model = cls(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=max_positions, **config))
    # Larger head weights so that the scores are far from uniform (ties would make orders arbitrary).
    for name, parameter in model.named_parameters():
        if "classifier" in name or "qa_outputs" in name:
            torch.nn.init.normal_(parameter, std=2.0)
    model.save_pretrained(directory, tokenizer=tokenizer)
    return directory
