"""Published BERT checkpoints into tpu_training.bert's model (`initCheckpoint`,
`convert-checkpoint`).

Two layouts are read, told apart by their variable names:

- google-research/bert (TF1, `modeling.py` and `run_pretraining.py`): name-based,
  `bert/embeddings/word_embeddings`, `bert/encoder/layer_<i>/attention/self/query/kernel`,
  …, `bert/pooler/dense/kernel`, and the pre-training heads `cls/predictions/…`
  (`transform/dense`, `transform/LayerNorm`, `output_bias`) and `cls/seq_relationship/
  output_weights` ([2, H], the transpose of a Dense kernel) and `output_bias`.
- tensorflow/models (TF2, official/nlp/modeling/networks/bert_encoder.py BertEncoderV2):
  object-based, `<prefix>/_embedding_layer/embeddings/.ATTRIBUTES/VARIABLE_VALUE`, …,
  `_transformer_layers/<i>/_attention_layer/_query_dense/kernel` ([H, heads, 64]: the
  EinsumDense layout), `_pooler_layer`, and BertPretrainerV2's `masked_lm/dense`,
  `masked_lm/layer_norm`, `masked_lm/output_bias.Sbias`. The prefix is whatever the
  checkpoint was saved under (`encoder/`, `model/encoder_network/`, ...).

Both are brought to the TF1 names and shapes (`published_shapes`), checked, then
assigned: query, key and value concatenated into this package's fused projection. The
encoder must be complete; each head (masked-LM, next-sentence) is loaded when the
checkpoint has it, and must then be complete. Optimizer slots and step counters are
skipped; any other variable the model has no place for, a missing one or a shape that
does not fit is one `CheckpointError` (exit 65) naming them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from tpu_training.exits import CheckpointError

GOOGLE_RESEARCH = "tf1"  # google-research/bert
MODEL_GARDEN = "tf2"  # tensorflow/models
MLM_PREFIX = "cls/predictions/"
NSP_PREFIX = "cls/seq_relationship/"
# Optimizer state and counters, never model weights: AdamWeightDecayOptimizer's slots
# (optimization.py: `<name>/adam_m`, `<name>/adam_v`), TF1's global_step, an
# object-based checkpoint's graph, save counter, step and optimizer.
_SKIPPED = re.compile(r"(^|/)(adam_[mv]|global_step|save_counter|_CHECKPOINTABLE_OBJECT_GRAPH"
                      r"|beta[12]_power)(/|$)|\.OPTIMIZER_SLOT|(^|/)optimizer/|^step/"
                      r"|Adam|LAMB")
_TF2_VALUE = "/.ATTRIBUTES/VARIABLE_VALUE"
_ANY = r"(?:^|.*/)"
# TF2 names (after the prefix) to TF1 names, and how the TF2 tensor is laid out:
# "same", "heads_in" (EinsumDense [H, heads, 64] kernel, [heads, 64] bias), "heads_out"
# ([heads, 64, H] kernel). export and tf2_encoder_checkpoint_converter.py agree.
_LAYER = r"_transformer_layers/(\d+)/"
_TF2_RULES: tuple[tuple[re.Pattern, str, str], ...] = tuple(
    (re.compile(_ANY + pattern + "$"), template, layout) for pattern, template, layout in (
        (r"_embedding_layer/embeddings", "bert/embeddings/word_embeddings", "same"),
        (r"_type_embedding_layer/embeddings", "bert/embeddings/token_type_embeddings", "same"),
        (r"_position_embedding_layer/embeddings", "bert/embeddings/position_embeddings",
         "same"),
        (r"_embedding_norm_layer/(gamma|beta)", r"bert/embeddings/LayerNorm/\1", "same"),
        (_LAYER + r"_attention_layer/_(query|key|value)_dense/(kernel|bias)",
         r"bert/encoder/layer_\1/attention/self/\2/\3", "heads_in"),
        (_LAYER + r"_attention_layer/_output_dense/(kernel|bias)",
         r"bert/encoder/layer_\1/attention/output/dense/\2", "heads_out"),
        (_LAYER + r"_attention_layer_norm/(gamma|beta)",
         r"bert/encoder/layer_\1/attention/output/LayerNorm/\2", "same"),
        (_LAYER + r"_intermediate_dense/(kernel|bias)",
         r"bert/encoder/layer_\1/intermediate/dense/\2", "same"),
        (_LAYER + r"_output_dense/(kernel|bias)", r"bert/encoder/layer_\1/output/dense/\2",
         "same"),
        (_LAYER + r"_output_layer_norm/(gamma|beta)",
         r"bert/encoder/layer_\1/output/LayerNorm/\2", "same"),
        (r"_pooler_layer/(kernel|bias)", r"bert/pooler/dense/\1", "same"),
        (r"masked_lm/dense/(kernel|bias)", r"cls/predictions/transform/dense/\1", "same"),
        (r"masked_lm/layer_norm/(gamma|beta)", r"cls/predictions/transform/LayerNorm/\1",
         "same"),
        (r"masked_lm/output_bias\.Sbias", "cls/predictions/output_bias", "same"),
    ))
# BertPretrainerV2's masked-LM keeps a reference to the word embeddings: the same tensor.
_TF2_SHARED = re.compile(_ANY + r"masked_lm/embedding_table$")
# A TF2 checkpoint is recognised by its encoder's own attribute names.
_TF2_MARKER = re.compile(_ANY + r"_transformer_layers/\d+/")


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the job's model needs: layers, hidden size and vocabulary."""

    layers: int
    hidden: int
    vocab: int
    head_size: int = 64

    @property
    def heads(self) -> int:
        return self.hidden // self.head_size


def published_shapes(shape: Shape) -> dict[str, tuple[int, ...]]:
    """Every TF1 name the model can take and its shape (modeling.py's variables, the
    pre-training heads' from run_pretraining.py), the encoder's first."""
    hidden, vocab = shape.hidden, shape.vocab
    names: dict[str, tuple[int, ...]] = {
        "bert/embeddings/word_embeddings": (vocab, hidden),
        "bert/embeddings/token_type_embeddings": (2, hidden),
        "bert/embeddings/position_embeddings": (512, hidden),
        "bert/embeddings/LayerNorm/gamma": (hidden,), "bert/embeddings/LayerNorm/beta": (hidden,),
    }
    for index in range(shape.layers):
        layer = f"bert/encoder/layer_{index}/"
        for part in ("query", "key", "value"):
            names[f"{layer}attention/self/{part}/kernel"] = (hidden, hidden)
            names[f"{layer}attention/self/{part}/bias"] = (hidden,)
        for dense, (rows, columns) in (("attention/output/dense", (hidden, hidden)),
                                       ("intermediate/dense", (hidden, 4 * hidden)),
                                       ("output/dense", (4 * hidden, hidden))):
            names[f"{layer}{dense}/kernel"] = (rows, columns)
            names[f"{layer}{dense}/bias"] = (columns,)
        for norm in ("attention/output/LayerNorm", "output/LayerNorm"):
            names[f"{layer}{norm}/gamma"] = names[f"{layer}{norm}/beta"] = (hidden,)
    names["bert/pooler/dense/kernel"], names["bert/pooler/dense/bias"] = (hidden, hidden), (hidden,)
    names.update({
        f"{MLM_PREFIX}transform/dense/kernel": (hidden, hidden),
        f"{MLM_PREFIX}transform/dense/bias": (hidden,),
        f"{MLM_PREFIX}transform/LayerNorm/gamma": (hidden,),
        f"{MLM_PREFIX}transform/LayerNorm/beta": (hidden,),
        f"{MLM_PREFIX}output_bias": (vocab,),
        f"{NSP_PREFIX}output_weights": (2, hidden),
        f"{NSP_PREFIX}output_bias": (2,),
    })
    return names


def checkpoint_format(names: Iterable[str]) -> str | None:
    """`tf1`, `tf2`, or None when the names are of neither layout."""
    names = list(names)
    if any(name.startswith("bert/") for name in names):
        return GOOGLE_RESEARCH
    if any(_TF2_MARKER.match(name) for name in names):
        return MODEL_GARDEN
    return None


@dataclasses.dataclass(frozen=True)
class NameMap:
    """Where each checkpoint variable goes: `sources[tf1 name] = (checkpoint name,
    layout)`; `unmapped` the checkpoint's model variables that have no place."""

    sources: dict[str, tuple[str, str]]
    unmapped: tuple[str, ...]


def map_names(names: Iterable[str], layout: str) -> NameMap:
    """Map a checkpoint's variable names (of `layout`) to TF1 names, skipping optimizer
    state; pure, so the rules are tested without TensorFlow."""
    sources: dict[str, tuple[str, str]] = {}
    unmapped = []
    for name in names:
        if _SKIPPED.search(name):
            continue
        if layout == GOOGLE_RESEARCH:
            sources[name] = (name, "same")
            continue
        key = name.removesuffix(_TF2_VALUE)
        if _TF2_SHARED.match(key):
            continue
        for pattern, template, tensor_layout in _TF2_RULES:
            match = pattern.match(key)
            if match:
                sources[match.expand(template)] = (name, tensor_layout)
                break
        else:
            unmapped.append(name)
    return NameMap(sources, tuple(unmapped))


def source_shape(tf1_shape: tuple[int, ...], layout: str, shape: Shape) -> tuple[int, ...]:
    """The shape a variable of `layout` must have to give `tf1_shape`."""
    if layout == "heads_in":
        return (*tf1_shape[:-1], shape.heads, shape.head_size)
    if layout == "heads_out" and len(tf1_shape) == 2:
        return (shape.heads, shape.head_size, tf1_shape[1])
    return tf1_shape


def plan(names_and_shapes: Mapping[str, Iterable[int]], shape: Shape, *, source: str
         ) -> tuple[str, dict[str, tuple[str, str]]]:
    """Check a checkpoint's variables (`name -> shape`) against the model: its layout
    and, per TF1 name, the checkpoint variable and layout to read. One CheckpointError
    naming every missing, unmapped or mis-shaped variable."""
    layout = checkpoint_format(names_and_shapes)
    if layout is None:
        raise CheckpointError.single(source, "is not a google-research/bert (TF1: bert/...) "
                                             "nor a tensorflow/models BERT encoder (TF2: "
                                             "..._transformer_layers/...) checkpoint")
    mapping = map_names(names_and_shapes, layout)
    wanted = published_shapes(shape)
    unmapped = list(mapping.unmapped) + [name for name in mapping.sources if name not in wanted]
    unmapped = [mapping.sources[name][0] if name in mapping.sources else name
                for name in unmapped]
    present = {name for name in wanted if name in mapping.sources}
    required = [name for name in wanted if not name.startswith("cls/")]
    for head in (MLM_PREFIX, NSP_PREFIX):
        if any(name.startswith(head) for name in present):
            required += [name for name in wanted if name.startswith(head)]
    missing = [name for name in required if name not in present]
    misfits = []
    for name in sorted(present):
        checkpoint_name, tensor_layout = mapping.sources[name]
        need = source_shape(wanted[name], tensor_layout, shape)
        have = tuple(names_and_shapes[checkpoint_name])
        if have != need:
            misfits.append(f"{checkpoint_name} {list(have)} (the model needs {list(need)})")
    problems = []
    if missing:
        problems.append(f"missing {_listed(missing)}")
    if unmapped:
        problems.append(f"unmapped (the model has no place for) {_listed(unmapped)}")
    if misfits:
        problems.append(f"shapes that do not fit {_listed(misfits)}")
    if problems:
        raise CheckpointError.single(
            source, f"a {_LAYOUT_NAMES[layout]} checkpoint that does not fit a {shape.layers}-"
                    f"layer, {shape.hidden}-wide model of {shape.vocab} words: "
                    + "; ".join(problems))
    return layout, {name: mapping.sources[name] for name in wanted if name in present}


_LAYOUT_NAMES = {GOOGLE_RESEARCH: "google-research/bert (TF1)",
                 MODEL_GARDEN: "tensorflow/models (TF2)"}


def _listed(names: list[str], most: int = 8) -> str:
    shown = ", ".join(names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def vocab_size(names_and_shapes: Mapping[str, Iterable[int]]) -> int | None:
    """The vocabulary of a checkpoint: the rows of its word embeddings (None: none found)."""
    layout = checkpoint_format(names_and_shapes)
    if layout is None:
        return None
    source = map_names(names_and_shapes, layout).sources.get("bert/embeddings/word_embeddings")
    return None if source is None else int(next(iter(names_and_shapes[source[0]])))
