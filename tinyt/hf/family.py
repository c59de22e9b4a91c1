"""What a catalogue entry is, and how its tables read and write config.json (torch-free).

    config.json ──config_from_hf(family)──▶ ModelConfig ──hf_config(family)──▶ config.json

An entry (`Family`) is data: config.json keys copied to ModelConfig fields and back, values
tinyt names otherwise (`Spelling`), the options every model of the family has (`features`),
the settings with the one value tinyt's model runs (`fixed`), and named checks for what else it
refuses; its weight names both ways (`Weight`, used by tinyt.hf.weights) and its tokenizer
files. Nothing here is approximated: a setting tinyt's model does not implement is refused with
its name, its value and what tinyt runs.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from tinyt.config import ModelConfig
from tinyt.errors import ConfigError, ConversionError
from tinyt.tokenizer import Tokenizer

FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}
Log = Callable[[str], None]


@dataclass(frozen=True)
class Spelling:
    """A config.json key whose values tinyt names otherwise: HF value -> tinyt value. Several
    HF values may name one tinyt value; the first listed is the one written back."""
    field: str  # the ModelConfig field it sets
    names: Mapping[Any, Any]
    default: Any  # transformers' value when config.json leaves the key out
    why: str = ""  # the reason a value without a tinyt name is refused, in its message

    def written(self, value: Any) -> Any:
        return next(hf for hf, ours in self.names.items() if ours == value)


@dataclass(frozen=True)
class Weight:
    """A tinyt tensor and the Hugging Face tensors it is made of. `{i}` stands for a block's
    index, `{w}` for both `weight` and `bias`. Several HF tensors are stacked by rows in the
    order given (tinyt fuses q, k, v and gate, up into one matmul); `rows` says how many each
    has, to split them back."""
    ours: str
    theirs: tuple[str, ...]
    rows: Callable[[ModelConfig], tuple[int, ...]] | None = None
    conv1d: bool = False  # HF stores it [in, out] (GPT-2's Conv1D), tinyt [out, in]
    when: Callable[[ModelConfig], bool] | None = None  # the models that name it so (T5 v1.1's
    #                   gated wi_0 | wi_1, v1.0's wi); None: every model of the family

    def __post_init__(self) -> None:
        if (len(self.theirs) > 1) != (self.rows is not None):
            raise ValueError(f"{self.ours}: stacking {len(self.theirs)} tensors needs rows, "
                             "and only stacking does")


@dataclass(frozen=True)
class Family:
    """One Hugging Face architecture tinyt reads and writes: a row of the catalogue.

    keys      config.json key -> ModelConfig field, copied both ways
    defaults  transformers' value of a key config.json leaves out; a key without one is required
    spelled   keys whose values tinyt names otherwise (GPT-2's activation_function)
    features  ModelConfig options every model of the family has (Llama: norm='rmsnorm', ...)
    fixed     settings whose one value is what tinyt runs; another value is refused
    refuses   named checks of what else tinyt's model does not run: each returns why, or None
    misfit    why the class cannot hold a tinyt model, said before the features are compared
    reads     readers of what config.json spells its own way (rope_scaling, head_dim, windows,
              layers without rotary): each returns ModelConfig settings, or raises by name
    holds     the options beyond Llama's (config.FAMILY_OPTIONS) the class can express; a
              model using another one is not written as it
    weights   every tinyt tensor's HF names; `base` is the prefix a base-model save (no head)
              lacks, `buffers` the name endings of non-weights older saves hold (skipped)
    zero_biases  the class always has biases: a bias-free model writes zeros, and reads back
              bias-free from the `tinyt` block export-hf writes into config.json
    shared    an encoder-decoder's names of its one embedding table (BART's model.shared and
              each stack's embed_tokens): where the model shares it, a save may hold any of
              them, and those it holds are one tensor
    read_tokenizer, special_tokens  the tokenizer files' kind (tinyt.hf.tokens)
    written   config.json's keys besides the mapped ones, for a config and its end-of-text id
    """
    model_type: str
    architecture: str  # the transformers class read and written
    keys: Mapping[str, str]
    defaults: Mapping[str, Any]
    spelled: Mapping[str, Spelling]
    features: Mapping[str, Any]
    weights: tuple[Weight, ...]
    base: str
    read_tokenizer: Callable[[Path, dict[str, Any], Log], Tokenizer]
    special_tokens: Callable[[Tokenizer], dict[str, Any]]
    written: Callable[[ModelConfig, int | None], dict[str, Any]]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    refuses: tuple[Callable[[dict[str, Any]], str | None], ...] = ()
    misfit: Callable[[ModelConfig], str | None] | None = None
    reads: tuple[Callable[[dict[str, Any]], dict[str, Any]], ...] = ()
    holds: frozenset[str] = frozenset()
    buffers: tuple[str, ...] = ()
    drops: tuple[str, ...] = ()  # name endings of weights tinyt's model has no use for (said)
    zero_biases: bool = False
    task: str = "causal_lm"
    heads: tuple[Head, ...] = ()  # the task classes around the base model (BertFor...)
    outside: tuple[str, ...] = ()  # HF name prefixes of a head's tensors, outside `base`
    shared: tuple[str, ...] = ()
    head: str = "lm_head.weight"  # the output projection's name (Whisper's proj_out.weight)
    absent: tuple[str, ...] = ()  # name endings of parts of a stacked tensor the class lacks,
    #                   zeros in tinyt's (Whisper's k_proj.bias: a key bias adds q.b to every
    #                   key's score alike, which the softmax cancels, so it is left out)

    def __post_init__(self) -> None:
        named = {*self.keys.values(), *self.features, *(s.field for s in self.spelled.values())}
        if named - FIELDS:
            raise ValueError(f"{self.model_type}: {sorted(named - FIELDS)} are not ModelConfig "
                             "fields")


@dataclass(frozen=True)
class Head:
    """A task class around a family's base model (BertForSequenceClassification around
    BertModel): its task, the options it sets (pooling, the pooler's activation), its tensors'
    names, and the prefixes of those outside the base model. keeps_pooler: the base's pooler,
    which the base class's import drops, is this head's."""
    architecture: str
    task: str
    features: Mapping[str, Any]
    weights: tuple[Weight, ...]
    outside: tuple[str, ...] = ("classifier.",)
    keeps_pooler: bool = False
    reads: tuple[Callable[[dict[str, Any]], dict[str, Any]], ...] = ()  # the head's own keys


def read_labels(hf: dict[str, Any]) -> dict[str, Any]:
    """A classifier's num_labels, from id2label (ids 0..n-1); the multi-label and regression
    problem types are refused by name (tinyt's classifiers pick one label by softmax)."""
    labels = labels_of(hf)
    problem = hf.get("problem_type")
    if problem not in (None, "single_label_classification"):
        raise ConversionError(f"problem_type={problem!r} is not implemented by tinyt's "
                              "classifier, which picks one label by softmax "
                              "(single_label_classification)")
    return {"num_labels": len(labels)}


def labels_of(hf: dict[str, Any]) -> list[str]:
    """config.json's label names in id order (transformers' LABEL_i where it names none)."""
    id2label = hf.get("id2label")
    if id2label is None:
        n = hf.get("num_labels", 2)
        if not (isinstance(n, int) and n >= 2):
            raise ConversionError(f"num_labels={n!r}: a classifier needs an integer >= 2 (a "
                                  "single-score head is not implemented)")
        return [f"LABEL_{i}" for i in range(n)]
    if not isinstance(id2label, dict) or \
            sorted(map(str, id2label)) != sorted(str(i) for i in range(len(id2label))):
        raise ConversionError(f"id2label={id2label!r} must map the ids 0..n-1 to names")
    names = [str(id2label[k]) for k in sorted(id2label, key=int)]
    if len(names) < 2:
        raise ConversionError(f"id2label has {len(names)} label(s): a classifier needs >= 2 "
                              "(a single-score head, a cross-encoder's, is not implemented)")
    return names


def for_class(family: Family, hf: dict[str, Any], source: str) -> Family:
    """The entry of config.json's class: the family itself for its base model, or the family
    grown by one of its heads (a task, options, the head's tensors); other classes refused."""
    archs = hf.get("architectures") or [family.architecture]
    if archs == [family.architecture]:
        return family
    head = next((h for h in family.heads if [h.architecture] == archs), None)
    if head is None:
        known = ", ".join([family.architecture, *(h.architecture for h in family.heads)])
        raise ConversionError(f"{source}: architectures {archs}; tinyt imports {known} for "
                              f"model_type {family.model_type!r}")
    return with_head(family, head)


def with_head(family: Family, head: Head) -> Family:
    return dataclasses.replace(
        family, architecture=head.architecture, task=head.task,
        features={**family.features, **head.features}, weights=family.weights + head.weights,
        drops=() if head.keeps_pooler else family.drops, outside=head.outside,
        reads=family.reads + (read_labels, *head.reads), heads=())


def rope_keys(hf: dict[str, Any]) -> dict[str, Any]:
    """transformers 5 spells rope_theta and the scaling inside `rope_parameters`; read them as
    4.x's `rope_theta` and `rope_scaling`."""
    params = hf.get("rope_parameters")
    if not isinstance(params, dict):
        return hf
    out = dict(hf)
    if "rope_theta" in params:
        out["rope_theta"] = params["rope_theta"]
    if params.get("rope_type"):
        out["rope_scaling"] = params
    return out


def config_from_hf(family: Family, hf: dict[str, Any], source: str) -> ModelConfig:
    """The ModelConfig of a config.json of `family`; what tinyt cannot run is refused by name."""
    hf = rope_keys(hf)
    archs = hf.get("architectures") or [family.architecture]
    if archs != [family.architecture]:
        raise ConversionError(f"{source}: architectures {archs}; tinyt imports "
                              f"{family.architecture} for model_type {family.model_type!r}")
    missing = [k for k in family.keys if k not in hf and k not in family.defaults]
    if missing:
        raise ConversionError(f"{source} lacks {missing}: not a complete {family.model_type} "
                              "config")
    for key, value in family.fixed.items():
        if hf.get(key, value) != value:
            raise ConversionError(f"{source}: {key}={hf[key]!r} is not implemented by tinyt's "
                                  f"model (it runs {key}={value!r}); refusing rather than "
                                  "approximating it")
    kwargs = {f: hf.get(key, family.defaults.get(key)) for key, f in family.keys.items()}
    for key, spelling in family.spelled.items():
        value = hf.get(key, spelling.default)
        if value not in spelling.names:
            raise ConversionError(f"{source}: {key}={value!r} is not implemented by tinyt's "
                                  f"model{spelling.why}; allowed: {', '.join(spelling.names)}")
        kwargs[spelling.field] = spelling.names[value]
    for check in family.refuses:
        why = check(hf)
        if why:
            raise ConversionError(f"{source}: {why}")
    for read in family.reads:
        try:
            kwargs.update(read(hf))
        except (ConfigError, ValueError, TypeError, KeyError) as e:
            raise ConversionError(f"{source}: {e}") from None
    if family.zero_biases:  # written by export-hf from a bias-free model: its biases are zeros
        block = hf.get("tinyt")
        kwargs["bias"] = bool(block.get("bias", True)) if isinstance(block, dict) else True
    kwargs = _as_typed(kwargs)
    try:
        return ModelConfig(**{**kwargs, **family.features})
    except ConfigError as e:
        raise ConversionError(f"{source}: {e}") from None


def _as_typed(kwargs: dict[str, Any]) -> dict[str, Any]:
    """config.json spells 100000 for 100000.0 and leaves num_key_value_heads out for "as many
    as the query heads": the config saved is the one the same model always gets."""
    floats = {f.name for f in fields(ModelConfig) if f.type in ("float", float)}
    out = {k: float(v) if k in floats and type(v) is int else v for k, v in kwargs.items()}
    if "n_kv_head" in out and out["n_kv_head"] is None:
        out["n_kv_head"] = out.get("n_head")
    return out


def hf_config(family: Family, cfg: ModelConfig, eos_id: int | None,
              bos_id: int | None = None) -> dict[str, Any]:
    """config.json of the `family` class holding cfg (a model without a BOS of its own begins
    at its end-of-text token, as GPT-2's)."""
    return {"model_type": family.model_type, "architectures": [family.architecture],
            **{key: getattr(cfg, f) for key, f in family.keys.items()},
            **{key: s.written(getattr(cfg, s.field)) for key, s in family.spelled.items()},
            **family.fixed,
            "bos_token_id": eos_id if bos_id is None else bos_id, "eos_token_id": eos_id,
            "torch_dtype": "float32",
            **family.written(cfg, eos_id)}


def misfit(family: Family, cfg: ModelConfig) -> str | None:
    """Why the family's class cannot hold cfg exactly, or None when it can."""
    if family.misfit and (why := family.misfit(cfg)):
        return why
    extra = [o for o in cfg.family_options
             if o.split("=")[0] not in family.holds | set(family.features)]
    if extra:
        return f"a {family.architecture} has no {', '.join(extra)}"
    wanted = {**{name: (value,) for name, value in family.features.items()},
              **{s.field: tuple(dict.fromkeys(s.names.values())) for s in family.spelled.values()}}
    off = [f"{name}={getattr(cfg, name)!r}" for name, allowed in wanted.items()
           if getattr(cfg, name) not in allowed]
    if not off:
        return None
    said = [f"{name}={allowed[0]!r}" if len(allowed) == 1 else f"{name} in {allowed}"
            for name, allowed in wanted.items()]
    return f"a {family.architecture} has {', '.join(said)}; this one has {', '.join(off)}"
