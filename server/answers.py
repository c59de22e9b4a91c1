"""The pieces of an answer of `tinyt serve`: a request's Jobs and what the engine made for each
(Sample), OpenAI's choices, streamed chunks, usage and logprobs objects, server-sent events."""
from __future__ import annotations

import json
from dataclasses import dataclass
from dataclasses import field as dataclass_field

from tinyt.errors import ApiError
from tinyt.runtime.constrain import GrammarConstraint
from tinyt.runtime.engine import Done, Scored, Token
from tinyt.runtime.sampling import SamplingParams

from .logprobs import Legacy, TokenTexts, chat_entry

# The engine's finish reasons as OpenAI names them (others, 'error', pass as they are).
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length"}

Event = tuple[int, Token | Done | Scored]  # (job index, engine event)


@dataclass
class Job:
    """One sample of a request: its prompt ids and what it is asked to make."""
    ids: list[int]
    params: SamplingParams
    prompt: int = 0  # which of the request's prompts
    echo: str = ""  # the prompt's text, where the answer repeats it (completions' echo)
    logprobs: int | None = None  # the engine's logprobs / prompt_logprobs for it
    prompt_logprobs: int | None = None
    constraint: GrammarConstraint | None = None  # what its tokens follow (structured output)
    options: dict = dataclass_field(default_factory=dict)  # the engine's own (tgt_lang)


@dataclass
class Sample:
    """What the engine made for one Job."""
    tokens: list[Token] = dataclass_field(default_factory=list)
    prompt: list | None = None  # Scored.prompt
    done: Done | None = None

    def score(self) -> float:
        """The sum of its tokens' logprobs: best_of keeps the highest."""
        return sum(t.logprob.logprob for t in self.tokens if t.logprob is not None)


def finish_reason(reason: str) -> str:
    return FINISH.get(reason, reason)


def choice(chat: bool, i: int, text: str, reason: str, logprobs: dict | None = None,
           message: dict | None = None) -> dict:
    """One choice of a whole (not streamed) answer (chat: `message` where it is not plain
    text, e.g. tool calls)."""
    if chat:
        return {"index": i, "message": message or {"role": "assistant", "content": text},
                "logprobs": logprobs, "finish_reason": reason}
    return {"index": i, "text": text, "logprobs": logprobs, "finish_reason": reason}


def chunk_choice(chat: bool, i: int, text: str, reason: str | None,
                 logprobs: dict | None = None) -> dict:
    """One choice of a streamed chunk: a piece of text (reason None) or the choice's end."""
    if chat:
        return {"index": i, "delta": {} if reason else {"content": text},
                "logprobs": logprobs, "finish_reason": reason}
    return {"index": i, "text": text, "logprobs": logprobs, "finish_reason": reason}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def sse(data: dict) -> str:
    """One server-sent event."""
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def logprobs_of(texts: TokenTexts, chat: bool, job: Job, prompt: list | None,
                tokens: list[Token]) -> dict:
    """A choice's logprobs object: chat's content list, or the completions' legacy object
    (echo: the prompt's tokens first)."""
    if chat:
        return {"content": [chat_entry(texts, t.logprob) for t in tokens
                            if t.logprob is not None], "refusal": None}
    legacy = Legacy(texts)  # offsets in the choice's text, the echoed prompt included
    if prompt is not None:  # echo: the prompt's tokens first, the first without one
        for token, lp in zip(job.ids, prompt):
            legacy.add(token, lp)
    for t in tokens:
        legacy.add(t.id, t.logprob)
    return legacy.json()


def grammar_failed(error: str, calls: bool) -> ApiError:
    """A grammar that could not be followed to its end (llguidance's per-step limits)."""
    field = "tools" if calls else "response_format"
    return ApiError(400, f"{field}: the reply could not follow the schema to its end: {error}; "
                         "a simpler schema (fewer or shorter patterns, smaller enums) can be "
                         "followed", param=field)
