"""A streamed answer of `tinyt serve`: the server-sent chunks of a completion or chat completion
as the engine makes its tokens, then a usage chunk if asked for, then [DONE].

    (chat: each choice's role chunk) ─▶ echo without logprobs: the prompt
      ─▶ per engine event: Scored (echo with logprobs: the prompt, scored) | Token (a piece
         of text, its logprobs) | Done (what was held back, tool calls, the finish reason)
      ─▶ usage (stream_options.include_usage) ─▶ data: [DONE]
"""
from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterator

from tinyt.runtime.engine import Done, Scored, Token

from .answers import (
    Event,
    Job,
    chunk_choice,
    finish_reason,
    grammar_failed,
    logprobs_of,
    sse,
    usage,
)
from .logprobs import Legacy, TokenTexts, chat_entry
from .schema import Outputs
from .structured import ToolStream


class ChunkStream:
    """One streamed answer: what each sample has sent so far. calls: a tools grammar: text is
    sent until a call may begin (ToolStream), the calls as one tool_calls delta at the end."""

    def __init__(self, jobs: list[Job], head: dict, *, chat: bool, want: Outputs,
                 texts: TokenTexts, calls: bool = False):
        self.jobs, self.head, self.chat, self.want, self.texts = jobs, head, chat, want, texts
        self.calls = calls
        self.made = 0  # tokens generated, for usage
        self.shown = [0] * len(jobs)  # characters of each sample's text sent
        self.offsets = [0] * len(jobs)  # completions' text_offset so far
        self.tool_streams = [ToolStream() for _ in jobs] if calls else None

    async def chunks(self, events: AsyncGenerator[Event, None], first: Event, *,
                     include_usage: bool, prompt_tokens: int) -> AsyncIterator[str]:
        """Every chunk of the answer, `first` (the event already awaited) and then `events`,
        which are closed at the end, or when the client goes."""
        try:
            for chunk in self.opening():
                yield chunk
            pending = [first]
            while True:
                i, ev = pending.pop() if pending else await events.__anext__()
                for chunk in self.event(i, ev):
                    yield chunk
        except StopAsyncIteration:
            pass
        finally:
            await events.aclose()
        if include_usage:
            yield sse({**self.head, "choices": [], "usage": usage(prompt_tokens, self.made)})
        yield "data: [DONE]\n\n"

    def piece(self, i: int, text: str, lps: dict | None = None) -> str:
        """A chunk of choice i's text (and its logprobs)."""
        return sse({**self.head, "choices": [chunk_choice(self.chat, i, text, None, lps)]})

    def opening(self) -> Iterator[str]:
        """Chat: each choice's role; then each prompt echoed without logprobs."""
        if self.chat:
            for i in range(len(self.jobs)):
                yield sse({**self.head, "choices": [{"index": i, "delta": {
                    "role": "assistant", "content": ""}, "logprobs": None,
                    "finish_reason": None}]})
        for i, job in enumerate(self.jobs):  # echo without logprobs: the prompt now
            if job.echo and job.prompt_logprobs is None:
                yield self.piece(i, job.echo)
                self.offsets[i] = len(job.echo)

    def event(self, i: int, ev: Token | Done | Scored) -> Iterator[str]:
        """The chunks of one engine event of job i."""
        job = self.jobs[i]
        if isinstance(ev, Scored):  # echo with logprobs: the prompt, scored
            lps = logprobs_of(self.texts, False, job, ev.prompt, [])
            self.offsets[i] = len(job.echo)
            yield self.piece(i, job.echo, lps)
        elif isinstance(ev, Token):
            yield from self.token(i, ev)
        else:
            yield from self.done(i, job, ev)

    def token(self, i: int, ev: Token) -> Iterator[str]:
        """A token: its text (what a tool call may begin with is held back) and logprobs."""
        self.made += 1
        lps = None
        if self.want.logprobs is not None and ev.logprob is not None:
            if self.chat:
                lps = {"content": [chat_entry(self.texts, ev.logprob)], "refusal": None}
            else:
                legacy = Legacy(self.texts, self.offsets[i])
                legacy.add(ev.id, ev.logprob)
                self.offsets[i] = legacy.offset
                lps = legacy.json()
        text = ev.text if self.tool_streams is None else self.tool_streams[i].add(ev.text)
        if text or lps is not None:
            self.shown[i] += len(text)
            yield self.piece(i, text, lps)

    def done(self, i: int, job: Job, ev: Done) -> Iterator[str]:
        """A sample's end: a grammar's failure, the text held back, the tool calls, the
        finish reason."""
        reason = finish_reason(ev.finish_reason)
        if job.constraint is not None and job.constraint.error is not None:
            e = grammar_failed(job.constraint.error, self.calls)
            yield sse({"error": {"message": e.message, "type": e.kind,
                                 "param": e.param, "code": None}})
        if self.tool_streams is None:
            rest = ev.text[self.shown[i]:]  # what was held back (a stop's possible
            if rest:                        # start) and did not become one
                yield self.piece(i, rest)
        else:
            rest, tool_calls = self.tool_streams[i].finish(ev.text)
            if rest:
                yield self.piece(i, rest)
            if tool_calls:
                yield sse({**self.head, "choices": [{
                    "index": i, "delta": {"tool_calls": tool_calls},
                    "logprobs": None, "finish_reason": None}]})
                reason = "tool_calls" if reason == "stop" else reason
        yield sse({**self.head, "choices": [chunk_choice(self.chat, i, "", reason)]})
