"""Pre-training and task heads on top of BertModel (paper §3.1 pre-training tasks, §4 fine-tuning),
named as in Hugging Face, and `load_model`, which builds the class a checkpoint names."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .config import BertConfig
from .errors import BertkitError
from .hub.resolve import resolve_model
from .kernels import HoldsKernelOptions, KernelOptions, Linear, linear
from .model import BertModel, BertPreTrainedModel, ModelOutput, activation
from .hub.tf_bert import BERT_CONFIG_NAME, OriginalCheckpoint, is_original_checkpoint


def returned(output: ModelOutput, return_dict: bool):
    """The output object, or with `return_dict=False` its tuple (loss first), as transformers."""
    return output if return_dict else output.to_tuple()


class BertPredictionHeadTransform(nn.Module):
    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = Linear(config.hidden_size, config.hidden_size)
        self.act = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(self.act(self.dense(x)))


class BertLMPredictionHead(HoldsKernelOptions, nn.Module):
    """Transform, then project onto the (tied) token-embedding matrix plus an output bias."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.word_embeddings = [word_embeddings]  # a list: tied, not registered twice
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x):
        return linear(self.transform(x), self.word_embeddings[0].weight, self.bias, self.kernels)  # (..., H) -> (..., V)


class BertOnlyMLMHead(nn.Module):
    def __init__(self, config, word_embeddings):
        super().__init__()
        self.predictions = BertLMPredictionHead(config, word_embeddings)


class BertPreTrainingHeads(BertOnlyMLMHead):
    def __init__(self, config, word_embeddings):
        super().__init__(config, word_embeddings)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


PREDICTION_ROWS_MULTIPLE = 64


def masked_lm_loss(head: BertLMPredictionHead, sequence_output, labels):
    """Logits only where labels != -100: the vocabulary projection dominates small models' cost.

    Returns (loss, logits (N, V)) for the N predicted positions.
    """
    selected = labels != -100  # (B, T)
    hidden = sequence_output[selected]  # (N, H)
    n = hidden.shape[0]
    # N changes from batch to batch; oneDNN builds (and keeps) a GEMM for every new shape, which
    # grew a pre-training process by gigabytes. Zero rows up to a multiple of 64 keep the shapes few.
    rows = -(-n // PREDICTION_ROWS_MULTIPLE) * PREDICTION_ROWS_MULTIPLE
    if rows != n:
        hidden = F.pad(hidden, (0, 0, 0, rows - n))
    logits = head(hidden)[:n]  # (N, V)
    targets = labels[selected]
    if targets.numel() == 0:
        return logits.sum() * 0.0, logits
    return F.cross_entropy(logits.float(), targets), logits


class BertForPreTraining(BertPreTrainedModel):
    """MLM + NSP (paper §3.1, Tasks #1 and #2). loss = mean MLM cross-entropy + NSP cross-entropy."""

    def __init__(self, config: BertConfig, kernels: KernelOptions | None = None):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, initialize=False, kernels=kernels)
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings)
        self.post_init(self.bert.kernels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                labels=None, next_sentence_label=None, output_hidden_states=None, return_dict=True, **kw):
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states, **kw)
        seq_relationship_logits = self.cls.seq_relationship(out.pooler_output)  # (B, 2)
        mlm_loss = nsp_loss = None
        if labels is not None:
            mlm_loss, prediction_logits = masked_lm_loss(self.cls.predictions, out.last_hidden_state, labels)
        else:
            prediction_logits = self.cls.predictions(out.last_hidden_state)  # (B, T, V)
        if next_sentence_label is not None:
            nsp_loss = F.cross_entropy(seq_relationship_logits.float(), next_sentence_label.view(-1))
        losses = [l for l in (mlm_loss, nsp_loss) if l is not None]
        return returned(ModelOutput(
            loss=sum(losses) if losses else None,
            prediction_logits=prediction_logits,
            seq_relationship_logits=seq_relationship_logits,
            hidden_states=out.hidden_states,
            attentions=out.attentions,
            mlm_loss=mlm_loss,  # after transformers' fields, so tuples line up with theirs
            nsp_loss=nsp_loss,
        ), return_dict)


class BertForMaskedLM(BertPreTrainedModel):
    """MLM only: the No-NSP ablation, and with config.is_decoder the LTR language model
    (labels are then the next token at every position)."""

    def __init__(self, config: BertConfig, kernels: KernelOptions | None = None):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=False, initialize=False, kernels=kernels)
        self.cls = BertOnlyMLMHead(config, self.bert.embeddings.word_embeddings)
        self.post_init(self.bert.kernels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                labels=None, output_hidden_states=None, return_dict=True, **kw):
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states, **kw)
        loss = None
        if labels is not None:
            loss, logits = masked_lm_loss(self.cls.predictions, out.last_hidden_state, labels)
        else:
            logits = self.cls.predictions(out.last_hidden_state)
        return returned(ModelOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                    attentions=out.attentions, mlm_loss=loss, prediction_logits=logits), return_dict)


class BiLSTMOnTop(nn.Module):
    """The paper's "+ BiLSTM" ablation: a randomly initialised BiLSTM over the final layer."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.lstm = nn.LSTM(config.hidden_size, config.bilstm_hidden_size, batch_first=True, bidirectional=True)
        self.proj = nn.Linear(2 * config.bilstm_hidden_size, config.hidden_size)

    def forward(self, x):
        return self.proj(self.lstm(x)[0])  # (B, T, H) -> (B, T, 2L) -> (B, T, H)


class _TaskModel(BertPreTrainedModel):
    """Shared plumbing of the fine-tuning heads: encoder, optional BiLSTM, dropout."""

    uses_pooler = True

    def __init__(self, config: BertConfig, kernels: KernelOptions | None = None):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=self.uses_pooler, initialize=False, kernels=kernels)
        if config.bilstm_hidden_size:
            self.bilstm = BiLSTMOnTop(config)
        p = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(p)

    def encode(self, input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states, kw):
        out = self.bert(input_ids, attention_mask, token_type_ids, position_ids, output_hidden_states, **kw)
        if self.config.bilstm_hidden_size:
            seq = self.bilstm(out.last_hidden_state)
            pooled = self.bert.pool(seq, attention_mask) if self.bert.pooler is not None else None
            return seq, pooled, out.hidden_states, out.attentions
        return out.last_hidden_state, out.pooler_output, out.hidden_states, out.attentions


class BertForSequenceClassification(_TaskModel):
    """Linear K x H on the pooled [CLS]; cross-entropy, or MSE regression when num_labels == 1."""

    def __init__(self, config: BertConfig, kernels: KernelOptions | None = None):
        super().__init__(config, kernels)
        self.num_labels = config.num_labels
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init(self.bert.kernels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                labels=None, output_hidden_states=None, return_dict=True, **kw):
        _, pooled, hidden_states, attentions = self.encode(input_ids, attention_mask, token_type_ids, position_ids,
                                               output_hidden_states, kw)
        logits = self.classifier(self.dropout(pooled))  # (B, K)
        loss = None
        if labels is not None:
            problem = self.config.problem_type or (
                "regression" if self.num_labels == 1
                else "single_label_classification" if labels.dtype in (torch.long, torch.int) else "multi_label_classification"
            )
            if problem == "regression":
                loss = F.mse_loss(logits.float().squeeze(-1), labels.float().view(-1)) if self.num_labels == 1 \
                    else F.mse_loss(logits.float(), labels.float())
            elif problem == "single_label_classification":
                loss = F.cross_entropy(logits.float().view(-1, self.num_labels), labels.view(-1))
            else:
                loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
        return returned(ModelOutput(loss=loss, logits=logits, hidden_states=hidden_states, attentions=attentions),
                        return_dict)


class BertForQuestionAnswering(_TaskModel):
    """Start and end vectors S, E (paper §4.2): logits S.T_i and E.T_i; loss (CE(start) + CE(end)) / 2."""

    uses_pooler = False

    def __init__(self, config: BertConfig, kernels: KernelOptions | None = None):
        # transformers sizes qa_outputs by num_labels: keep it 2 so checkpoints load there too
        # (on a copy: the caller's config is left as it was).
        if config.num_labels != 2 or config.id2label is not None:
            config = config.replace(num_labels=2, id2label=None)
        super().__init__(config, kernels)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init(self.bert.kernels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                start_positions=None, end_positions=None, output_hidden_states=None, return_dict=True, **kw):
        seq, _, hidden_states, attentions = self.encode(input_ids, attention_mask, token_type_ids, position_ids,
                                            output_hidden_states, kw)
        start_logits, end_logits = self.qa_outputs(seq).unbind(-1)  # (B, T) each
        loss = None
        if start_positions is not None and end_positions is not None:
            T = start_logits.shape[1]
            # Positions outside the sequence are ignored, as in transformers.
            start = start_positions.view(-1).clamp(0, T)
            end = end_positions.view(-1).clamp(0, T)
            loss = (F.cross_entropy(start_logits.float(), start, ignore_index=T)
                    + F.cross_entropy(end_logits.float(), end, ignore_index=T)) / 2
        return returned(ModelOutput(loss=loss, start_logits=start_logits, end_logits=end_logits,
                                    hidden_states=hidden_states, attentions=attentions), return_dict)


class BertForTokenClassification(_TaskModel):
    """Linear layer on every token's final vector (NER); labels -100 are ignored."""

    uses_pooler = False

    def __init__(self, config: BertConfig, kernels: KernelOptions | None = None):
        super().__init__(config, kernels)
        self.num_labels = config.num_labels
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init(self.bert.kernels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                labels=None, output_hidden_states=None, return_dict=True, **kw):
        seq, _, hidden_states, attentions = self.encode(input_ids, attention_mask, token_type_ids, position_ids,
                                            output_hidden_states, kw)
        logits = self.classifier(self.dropout(seq))  # (B, T, K)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.float().view(-1, self.num_labels), labels.view(-1), ignore_index=-100)
        return returned(ModelOutput(loss=loss, logits=logits, hidden_states=hidden_states, attentions=attentions),
                        return_dict)


class BertForMultipleChoice(_TaskModel):
    """Each of C choices is one sequence; a vector V scores its pooled [CLS]; softmax over choices."""

    def __init__(self, config: BertConfig, kernels: KernelOptions | None = None):
        super().__init__(config, kernels)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init(self.bert.kernels)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, position_ids=None,
                labels=None, output_hidden_states=None, return_dict=True, **kw):
        B, C, T = input_ids.shape

        def flat(t):  # (B, C, T) -> (B*C, T)
            return None if t is None else t.reshape(B * C, -1)

        _, pooled, hidden_states, attentions = self.encode(flat(input_ids), flat(attention_mask), flat(token_type_ids),
                                               flat(position_ids), output_hidden_states, kw)
        logits = self.classifier(self.dropout(pooled)).view(B, C)
        loss = F.cross_entropy(logits.float(), labels.view(-1)) if labels is not None else None
        return returned(ModelOutput(loss=loss, logits=logits, hidden_states=hidden_states, attentions=attentions),
                        return_dict)


TASK_CLASSES = {
    cls.__name__: cls
    for cls in (BertModel, BertForPreTraining, BertForMaskedLM, BertForSequenceClassification,
                BertForQuestionAnswering, BertForTokenClassification, BertForMultipleChoice)
}


def load_model(directory: str | Path, revision: str | None = None, **config_overrides) -> BertPreTrainedModel:
    """Build whichever bertkit class config.json's `architectures` names (BertModel if none), from a
    local folder or a Hub id (at `revision`)."""
    directory = resolve_model(directory, revision)
    config = (OriginalCheckpoint.open(directory).config(directory / BERT_CONFIG_NAME)
              if is_original_checkpoint(directory) else BertConfig.from_json_file(directory / "config.json"))
    name = (config.architectures or ["BertModel"])[0]
    if name == "BertLMHeadModel":
        name = "BertForMaskedLM"
    if name not in TASK_CLASSES:
        raise BertkitError(f"architecture {name!r} is not a bertkit class", path=str(Path(directory) / "config.json"))
    return TASK_CLASSES[name].from_pretrained(directory, config=config, **config_overrides)
