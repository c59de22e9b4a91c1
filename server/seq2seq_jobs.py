"""/v1/completions on an encoder-decoder (`tinyt serve` of a seq2seq artifact): a request's
fields read as a translation's (the prompt is the source text), checked, and turned into Jobs
for the Seq2SeqEngine (runtime/seq2seq_engine.py).

    body ──refuse what a source cannot do (echo, structured output, beams)──▶ tgt_lang checked
         ──completion_prompts──▶ source ids (at most the encoder's positions)
         ──max_tokens (at most the decoder's positions; default generation_config.json's)
         ──schema.sampling──▶ SamplingParams ──▶ best_of Jobs per source

Chat and embeddings are not served (handlers.OpenAIServer.serves names what is).
"""
from __future__ import annotations

from dataclasses import replace

from tinyt.errors import ApiError, ConfigError
from tinyt.runtime.encoder_decoder import Seq2SeqModel, language_id

from .answers import Job
from .schema import ACCEPTED, Outputs, completion_prompts, field, sampling

# The completions' fields, and a multilingual model's target language (`tinyt translate
# --tgt-lang`'s name); num_beams is read to be refused by name.
SEQ2SEQ_FIELDS = ACCEPTED | {"tgt_lang", "num_beams"}
# Fields a source text cannot honour, each with the reason given back.
REFUSED = {
    "echo": "the prompt is the source text, not the start of the reply",
    "response_format": "structured output is offered for decoder-only models",
    "tools": "tool calls are offered for decoder-only models (chat)",
    "tool_choice": "tool calls are offered for decoder-only models (chat)",
    "parallel_tool_calls": "tool calls are offered for decoder-only models (chat)",
}


def seq2seq_jobs(model: Seq2SeqModel, body: dict, want: Outputs) -> list[Job]:
    """best_of Jobs per source of a /v1/completions request to an encoder-decoder; ApiError
    (400) naming a field it cannot honour or a bad value."""
    for name, why in REFUSED.items():
        if body.get(name) not in (None, False):
            raise ApiError(400, f"'{name}' is not offered for an encoder-decoder: {why}; "
                                "remove it", param=name)
    beams = body.get("num_beams")
    if beams not in (None, 1):
        raise ApiError(400, f"'num_beams'={beams!r}: beam search is not served (num_beams 1 "
                            "only); sample with n / best_of, or run beams with `tinyt translate "
                            "--beams` or rt.load(...).generate(num_beams=...)", param="num_beams")
    lang = field(body, "tgt_lang", (str,), allowed="a language code as the model's tokenizer "
                                                   "spells it (NLLB's deu_Latn, M2M100's de)")
    options = {} if lang is None else {"tgt_lang": lang}
    if lang is not None:
        try:
            language_id(model.tokenizer, lang)
        except ConfigError as e:
            raise ApiError(400, str(e), param="tgt_lang") from None
    jobs = []
    params = _params(model, body)
    for i, prompt in enumerate(completion_prompts(body, model.config.vocab_size)):
        ids = prompt if isinstance(prompt, list) else _encode(model, prompt, i)
        if len(ids) > model.config.block_size:
            raise ApiError(400, f"prompt {i} is {len(ids)} tokens; this encoder reads at most "
                                f"{model.config.block_size} source tokens", param="prompt")
        # best_of ranks samples by their tokens' logprobs: computed even when not shown
        logprobs = want.logprobs if want.logprobs is not None else \
            0 if want.best_of > want.n else None
        for k in range(want.best_of):  # with a seed, sample k draws from seed + k
            seeded = params if k == 0 or params.seed is None else \
                replace(params, seed=params.seed + k)
            jobs.append(Job(ids, seeded, i, "", logprobs, options=options))
    return jobs


def _encode(model: Seq2SeqModel, text: str, i: int) -> list[int]:
    if not text:
        raise ApiError(400, f"prompt {i} is empty; send the source text", param="prompt")
    return model.tokenizer.encode_prompt(text)


def _params(model: Seq2SeqModel, body: dict):
    """The request's SamplingParams: max_tokens at most the decoder's positions (the source
    takes none of them), generation_config.json's max_length where it is not given."""
    context = model.context
    name = "max_tokens" if body.get("max_completion_tokens") is None else \
        "max_completion_tokens"
    most = body.get(name)
    if isinstance(most, int) and not isinstance(most, bool) and most > context:
        raise ApiError(400, f"{name}={most} does not fit: this encoder-decoder's decoder reads "
                            f"at most {context} target tokens", param=name)
    default = model.settings().max_new_tokens
    return sampling(body, 0, context, max(default, 1))
