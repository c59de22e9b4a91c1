"""An encoder-decoder artifact (translation, summarisation) on ONNX Runtime (torch-free): the
three graphs of Optimum's seq2seq layout (tinyt.contract.SEQ2SEQ_FILES).

    sources ──encode_prompt, right-pad──▶ encoder_model.onnx (once per batch) ──▶ memory
    decoder start ──decoder_model.onnx──▶ logits, self cache, cross keys / values (per source)
        ──choose (greedy, sampling: runtime/sampling.py; beams: runtime/beam.py)──▶ token
                ▲                                                                   │
                └── decoder_with_past_model.onnx: rows reordered, caches read ◀─────┘

Each row stops at an end-of-sequence token or max_new_tokens; the decoder never runs past
block_size positions (its start token at 0). transformers' rules apply in every loop
(runtime/rules.py): no_repeat_ngram_size, generation_config.json's bad_words_ids, a forced
first token (tgt_lang: NLLB's / M2M100's target language) and forced_eos_token_id.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from tinyt.contract import (
    CROSS_GROUPS,
    SEQ2SEQ_FILES,
    SEQ2SEQ_ORT_FILES,
    refuse_speech,
    seq2seq_cache_names,
)
from tinyt.errors import ConfigError, ManifestError, NonFiniteError
from tinyt.tokenizer import Tokenizer

from .arguments import prompt_text, token_rows
from .beam import BeamParams, beam_search
from .fallback import token_logprob
from .generate import GenerationResult
from .greedy import stopped
from .heads import BeamHead
from .rules import Rules, StepRules
from .sampling import SamplingParams, next_token
from .session import Artifact, create_session

# Language tokens as multilingual tokenizers spell them: NLLB's deu_Latn, M2M100's __de__
LANGUAGE_TOKEN = re.compile(r"^(?:[a-z]{2,3}_[A-Z][a-z]{3}|__[a-z]{2,3}(?:_[A-Za-z]+)?__)$")


@dataclass(frozen=True)
class GenerationConfig:
    """What generation_config.json says about decoding (transformers' names): the decoder's
    first token, the tokens that end a sequence, padding, the default length, and the rules
    the model was published with."""
    decoder_start: int
    eos: tuple[int, ...]
    pad: int
    max_length: int | None = None  # decoder tokens, its start included
    forced_bos: int | None = None
    forced_eos: tuple[int, ...] = ()
    bad_words: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def read(cls, artifact: Artifact, tokenizer: Tokenizer) -> GenerationConfig:
        """generation_config.json of the artifact (the config and tokenizer where a key or
        the file is missing)."""
        path = artifact.path / "generation_config.json"
        try:
            data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        except (OSError, ValueError) as e:
            raise ManifestError(f"{path} is not readable JSON ({e})") from None

        def ids(key, default=()) -> tuple[int, ...]:
            v = data.get(key)
            if v is None:
                return tuple(default)
            return tuple(int(i) for i in (v if isinstance(v, list) else [v]))

        eos = ids("eos_token_id", () if tokenizer.eos_id is None else (tokenizer.eos_id,))
        pad = data.get("pad_token_id")
        bad = tuple(tuple(int(t) for t in w) for w in data.get("bad_words_ids") or ()
                    if w and list(w) not in ([e] for e in eos))  # as NoBadWords: never an eos
        return cls(decoder_start=int(data.get("decoder_start_token_id",
                                              artifact.config.decoder_start_id)),
                   eos=eos, pad=int(pad) if pad is not None else (eos[0] if eos else 0),
                   max_length=data.get("max_length"),
                   forced_bos=data.get("forced_bos_token_id", artifact.config.forced_bos_id),
                   forced_eos=ids("forced_eos_token_id"), bad_words=bad)


KEYWORDS = ("max_new_tokens", "num_beams", "length_penalty", "no_repeat_ngram_size",
            "early_stopping", "temperature", "top_k", "seed", "tgt_lang", "forced_bos_token_id")


@dataclass(frozen=True)
class Settings:
    """One call's checked settings: its length, the sampling, the beams and the rules."""
    max_new_tokens: int
    sampling: SamplingParams
    beams: BeamParams
    rules: StepRules  # Rules, or a model's own (runtime/transcribe.py's WhisperRules)


class DecoderSteps:
    """The decoder's caches over a set of rows (runtime/beam.py's StepFn): first() runs
    decoder_model.onnx on each source's start token, making the per-source cross keys /
    values; each call then continues rows `parents` with `tokens` on
    decoder_with_past_model.onnx, the self-attention cache gathered by parent (a beam's
    reorder, a finished row dropped) and the cross cache expanded to the rows' sources only
    when they change."""

    def __init__(self, model: Seq2SeqModel, memory: np.ndarray, mask: np.ndarray | None):
        self.model, self.memory, self.mask_src = model, memory, mask
        n = model.config.decoder_layers
        self._past = seq2seq_cache_names(n, "past_key_values", ("decoder", "encoder"))
        # a speech decoder (Whisper's) reads every encoder frame: it takes no source mask
        self._masked = any(i.name == "encoder_attention_mask"
                           for i in model.sessions["decoder"].get_inputs())
        self._first_out = [o.name for o in model.sessions["decoder"].get_outputs()]
        self._next_out = [o.name for o in model.sessions["decoder_with_past"].get_outputs()]

    def first(self, start: int | Sequence[int]) -> np.ndarray:
        """Logits [B, V] at the last of each source's first tokens: the start token, or a
        prompt of several (Whisper's start, language and task) run at once."""
        B = len(self.memory)
        prompt = np.asarray([start] if isinstance(start, (int, np.integer)) else start,
                            dtype=np.int64)
        feeds = {"input_ids": np.tile(prompt, (B, 1)), "encoder_hidden_states": self.memory}
        if self._masked and self.mask_src is not None:
            feeds["encoder_attention_mask"] = self.mask_src
        out = self.model.sessions["decoder"].run(self._first_out, feeds)
        caches = out[1:]  # per layer: decoder key, value, encoder key, value
        self.own = [c for i, c in enumerate(caches) if i % 4 < 2]
        self.cross_src = [c for i, c in enumerate(caches) if i % 4 >= 2]
        self.cross, self.mask, self.src = self.cross_src, self.mask_src, np.arange(B)
        return self.model.choosable(out[0][:, -1])

    def __call__(self, parents: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """Logits [R, V] of rows that continue rows `parents` with `tokens`."""
        if len(parents) != len(self.src) or (parents != np.arange(len(parents))).any():
            self.own = [c[parents] for c in self.own]
            src = self.src[parents]
            if not np.array_equal(src, self.src):
                self.cross = self._cross(src)
                self.mask = None if self.mask_src is None else self.mask_src[src]
            self.src = src
        position = self.own[0].shape[2]  # the fed token's
        if position >= self.model.context:
            raise ConfigError(f"the decoder has no position {position}: this model reads at "
                              f"most {self.model.context} target tokens")
        feeds = {"input_ids": tokens[:, None]}
        if self._masked and self.mask is not None:
            feeds["encoder_attention_mask"] = self.mask
        caches = iter(self.own), iter(self.cross)
        for i, name in enumerate(self._past):
            feeds[name] = next(caches[i % 4 >= 2])
        out = self.model.sessions["decoder_with_past"].run(self._next_out, feeds)
        self.own = out[1:]
        return self.model.choosable(out[0][:, -1])

    def _cross(self, src: np.ndarray) -> list[np.ndarray]:
        """The cross caches for rows of sources `src`: each source's once where the graph
        takes them so (Seq2SeqModel.cross_groups) and every source has k consecutive rows
        (a beam search's, the first step past), else one a row."""
        if self.model.cross_groups and self.mask_src is None:
            k = int(np.count_nonzero(src == src[0]))
            order = src[::k]
            if len(src) % k == 0 and np.array_equal(np.repeat(order, k), src):
                if np.array_equal(order, np.arange(len(self.memory))):
                    return self.cross_src  # (no copy at all)
                return [c[order] for c in self.cross_src]
        return [c[src] for c in self.cross_src]


class Seq2SeqModel:
    """An encoder-decoder artifact: generate(texts) translates (or summarises) each text.
    Thread-safe: calls share only the sessions."""

    def __init__(self, artifact: Artifact, sessions: dict[str, ort.InferenceSession],
                 tokenizer: Tokenizer, *, max_context: int | None = None):
        self.artifact, self.sessions, self.tokenizer = artifact, sessions, tokenizer
        self.config = artifact.config
        self.provider = sessions["encoder"].get_providers()[0]
        self.generation = GenerationConfig.read(artifact, tokenizer)
        # decoder positions: its start token and every generated token but the last
        self.context = min(self.config.block_size, max_context or self.config.block_size)
        # A vocabulary padded beyond the tokenizer: the padded ids are never chosen, since no
        # text stands for them (as LanguageModel)
        self._choosable = (tokenizer.vocab_size if tokenizer.vocab_size < self.config.vocab_size
                           else None)
        self.beam_head = BeamHead()
        # decoder_with_past takes a source's cross caches once for its k rows
        # (export/cross_groups.py)
        self.cross_groups = CROSS_GROUPS in sessions["decoder_with_past"].get_modelmeta() \
            .custom_metadata_map

    def choosable(self, logits: np.ndarray) -> np.ndarray:
        """Logits [R, V] cut to the ids the tokenizer has."""
        return logits if self._choosable is None else logits[:, :self._choosable]

    # -- public API ------------------------------------------------------------------------
    def generate(self, texts, **kwargs) -> str | list[str]:
        """The output text for `texts` (a str, or a list of them: a batch). Keywords:
        max_new_tokens (default: generation_config.json's max_length less the start token,
        at most the model's block_size), num_beams, length_penalty, no_repeat_ngram_size,
        early_stopping (True, False, 'never'), temperature (0: greedy), top_k, seed,
        tgt_lang (a multilingual model's target language), forced_bos_token_id."""
        if isinstance(texts, (list, tuple)):
            return [r.text for r in self.generate_details(texts, **kwargs)]
        return self.generate_details([texts], **kwargs)[0].text

    def generate_details(self, texts: Sequence, **kwargs) -> list[GenerationResult]:
        """Text, token ids and finish reason ('eos', 'length') for each text of a batch."""
        if not isinstance(texts, (list, tuple)) or not texts:
            raise ConfigError("texts must be a non-empty list of strings")
        return self.generate_ids([self.tokenizer.encode_prompt(prompt_text(t))
                                  for t in texts], **kwargs)

    def generate_ids(self, token_ids, **kwargs) -> list[GenerationResult]:
        """Generation from source token ids (a list of ints, a list of rows or a 1-D / 2-D
        array), the special tokens already in them; keywords as generate's. Each result's
        token_ids are the generated tokens, the decoder start and the final eos left out."""
        settings = self.settings(**kwargs)
        rows = token_rows(token_ids, vocab_size=self.config.vocab_size,
                          context=self.config.block_size, room=0)
        if settings.max_new_tokens == 0:
            return [GenerationResult("", [], "length") for _ in rows]
        memory, mask = self.encode(rows)
        steps = DecoderSteps(self, memory, mask)
        first = steps.first(self.generation.decoder_start)
        if settings.beams.num_beams > 1:
            prefix = [[self.generation.decoder_start]] * len(rows)
            out = beam_search(first, steps, prefix, settings.beams, eos=self.generation.eos,
                              max_new_tokens=settings.max_new_tokens, rules=settings.rules,
                              head=self.beam_head)
        else:
            out = self._sample(first, steps, len(rows), settings)
        skip = {"skip_special_tokens": True}
        return [GenerationResult(self.tokenizer.hf.decode(ids, **skip), ids, reason)
                for ids, reason in out]

    def encode(self, rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
        """The encoder's hidden states [B, E, C] of right-padded source rows, and the mask
        [B, E] (1: a token)."""
        B, E = len(rows), max(map(len, rows))
        ids = np.full((B, E), self.generation.pad, dtype=np.int64)
        mask = np.zeros((B, E), dtype=np.int64)
        for r, row in enumerate(rows):
            ids[r, :len(row)], mask[r, :len(row)] = row, 1
        (memory,) = self.sessions["encoder"].run(["last_hidden_state"],
                                                 {"input_ids": ids, "attention_mask": mask})
        return memory, mask

    # -- settings ----------------------------------------------------------------------------
    def settings(self, **kwargs) -> Settings:
        """A call's keywords (generate's), checked; ConfigError naming the bad value and what
        is allowed."""
        unknown = sorted(set(kwargs) - set(KEYWORDS))
        if unknown:
            raise ConfigError(f"unknown generation argument(s) {unknown}; allowed: "
                              f"{', '.join(KEYWORDS)}")
        return self._settings(**kwargs)

    def _settings(self, *, max_new_tokens: int | None = None, num_beams: int = 1,
                 length_penalty: float = 1.0, no_repeat_ngram_size: int = 0,
                 early_stopping: bool | str = False, temperature: float = 0.0,
                 top_k: int | None = None, seed: int | None = None, tgt_lang: str | None = None,
                 forced_bos_token_id: int | None = None) -> Settings:
        n = self._max_new_tokens(max_new_tokens)
        beams = BeamParams(num_beams, length_penalty, early_stopping)
        sampling = SamplingParams(max_new_tokens=n, temperature=temperature, top_k=top_k,
                                  seed=seed)
        if num_beams > 1 and temperature > 0:
            raise ConfigError(f"num_beams={num_beams} with temperature={temperature}: beam "
                              "search here is deterministic; use temperature=0 with beams, or "
                              "num_beams=1 to sample")
        forced = self._forced_bos(tgt_lang, forced_bos_token_id)
        rules = Rules(max_new_tokens=n, no_repeat_ngram_size=no_repeat_ngram_size,
                      bad_words=self.generation.bad_words, forced_bos=forced,
                      forced_eos=self.generation.forced_eos)
        return Settings(n, sampling, beams, rules)

    def _max_new_tokens(self, n: int | None) -> int:
        limit = self.context
        if n is None:
            length = self.generation.max_length
            return limit if length is None else max(0, min(limit, int(length) - 1))
        if not (isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= limit):
            raise ConfigError(f"max_new_tokens={n!r} is invalid: an integer in 0..{limit} (the "
                              f"decoder reads at most {limit} positions; None for "
                              "generation_config.json's max_length)")
        return n

    def _forced_bos(self, tgt_lang: str | None, forced: int | None) -> int | None:
        """The forced first token: tgt_lang's id, or forced_bos_token_id, or the
        generation config's."""
        if tgt_lang is not None and forced is not None:
            raise ConfigError("give tgt_lang or forced_bos_token_id, not both (tgt_lang is "
                              "the language token's id as forced_bos_token_id)")
        if tgt_lang is not None:
            return language_id(self.tokenizer, tgt_lang)
        if forced is not None:
            V = self.config.vocab_size
            if not (isinstance(forced, int) and not isinstance(forced, bool) and 0 <= forced < V):
                raise ConfigError(f"forced_bos_token_id={forced!r} is invalid: a token id in "
                                  f"0..{V - 1}")
            return forced
        return self.generation.forced_bos

    # -- greedy and sampling -------------------------------------------------------------------
    def _sample(self, first: np.ndarray, steps: DecoderSteps, B: int, settings: Settings,
                prefix: Sequence[int] | None = None, logprobs: list[list[float]] | None = None,
                ) -> list[tuple[list[int], str]]:
        """One token a row a step (greedy at temperature 0); a finished row leaves the
        batch. Each source samples with its own generator seeded by `seed`, so it draws
        the same tokens alone or in a batch. prefix: the decoder's tokens before the
        generated ones (default: its start token), as the rules see them. logprobs: a list
        a source, given, gets each chosen token's log-softmax of the rule-applied logits at
        temperature 1 (an end-of-sequence token's too: Whisper's fallback reads them)."""
        prefix = [self.generation.decoder_start] if prefix is None else list(prefix)
        params, rules, eos = settings.sampling, settings.rules, set(self.generation.eos)
        n = settings.max_new_tokens
        rngs: list = [np.random.default_rng(params.seed) if params.temperature > 0 else None
                      for _ in range(B)]  # greedy draws nothing
        out: list[list[int]] = [[] for _ in range(B)]
        reasons: list[str | None] = ["length" if n == 0 else None] * B
        rows, logits = list(range(B)), first  # the source of each running row
        for made in range(n):
            # a copy only where the rules write into it: a step's logits are its own array,
            # and 32 rows of a 58,101-token vocabulary are 7.4 MB a step
            z = logits.astype(np.float32, copy=rules.active)
            if rules.active:
                rules.apply(z, [[*prefix, *out[s]] for s in rows], made)
            keep, tokens = [], []
            for r, s in enumerate(rows):
                try:
                    tok = next_token(z[r], params, rngs[s], [])
                except NonFiniteError as e:
                    raise stopped(made, s, e) from None
                if logprobs is not None:
                    logprobs[s].append(token_logprob(z[r], tok))
                if tok in eos:
                    reasons[s] = "eos"
                    continue
                out[s].append(tok)
                if made + 1 == n:
                    reasons[s] = "length"
                else:
                    keep.append(r)
                    tokens.append(tok)
            rows = [rows[r] for r in keep]
            if not rows:
                break
            logits = steps(np.asarray(keep, dtype=np.int64), np.asarray(tokens, dtype=np.int64))
        return [(o, r or "length") for o, r in zip(out, reasons)]


def language_id(tokenizer: Tokenizer, lang: str) -> int:
    """The id of a target language's token: `lang` as the vocabulary spells it (NLLB's
    "deu_Latn", M2M100's "__de__") or M2M100's short form ("de"); ConfigError listing the
    language tokens the tokenizer has otherwise."""
    if not isinstance(lang, str) or not lang:
        raise ConfigError(f"tgt_lang={lang!r} is invalid: a language code as the model's "
                          "tokenizer spells it")
    for token in (lang, f"__{lang}__"):
        idx = tokenizer.hf.token_to_id(token)
        if idx is not None and LANGUAGE_TOKEN.match(token):
            return idx
    known = sorted(t for t in tokenizer.hf.get_vocab(with_added_tokens=True)
                   if LANGUAGE_TOKEN.match(t))
    if not known:
        raise ConfigError(f"tgt_lang={lang!r}: this model's tokenizer has no language tokens "
                          "(NLLB's deu_Latn, M2M100's __de__); it translates into one language "
                          "only, so leave tgt_lang out")
    shown = ", ".join(known[:12]) + (f", ... ({len(known)} in all)" if len(known) > 12 else "")
    raise ConfigError(f"tgt_lang={lang!r} is not a language of this model; its tokenizer "
                      f"spells them {shown}")


def load_seq2seq(artifact: Artifact, tokenizer: Tokenizer, *, provider: str, threads: int,
                 spinning: bool | None, level: str | None,
                 max_context: int | None = None) -> Seq2SeqModel:
    """The three sessions of an encoder-decoder artifact, each checked against its contract
    (runtime/session.py), as one Seq2SeqModel; an ORT-format package's .ort files."""
    refuse_speech(artifact.config, "tinyt's runtime")
    if artifact.manifest.package_format == "transformers-js":
        made_from = artifact.manifest.source.get("path", "its source")
        raise ManifestError(f"{artifact.path} is a transformers.js package (tinyt package "
                            "--format transformers-js): load it with transformers.js, or "
                            "Optimum's ORTModelForSeq2SeqLM with subfolder='onnx'; "
                            f"tinyt.runtime loads the artifact it was made from ({made_from})")
    files = SEQ2SEQ_ORT_FILES if artifact.manifest.package_format == "ort" else SEQ2SEQ_FILES
    # The encoder and the first decoder step run once a call, then decoder_with_past steps
    # back to back: their threads sleep as soon as a run ends ('prompt'), instead of spinning
    # beside the steps' own (measured at Opus-MT's shape, 2 threads, AMD EPYC AVX2: one
    # sentence greedy 151 -> 118 ms with no spinning at all, which is the bound)
    sessions = {role: create_session(artifact, provider=provider, threads=threads,
                                     spinning=spinning, level=level, graph=file,
                                     phase="step" if role == "decoder_with_past" else "prompt")
                for role, file in files.items()}
    return Seq2SeqModel(artifact, sessions, tokenizer, max_context=max_context)
