"""`tinyt serve` of a Whisper artifact: OpenAI's audio endpoints over runtime/transcribe.py
(torch-free; multipart read with the standard library's email parser, no extra dependency).

    POST /v1/audio/transcriptions   multipart/form-data: file (required), model, language,
    POST /v1/audio/translations     prompt, temperature, response_format (json | text | srt |
                                    vtt | verbose_json); translations take no language
        ──the upload to a temporary file──▶ SpeechModel.transcribe (one at a time, in a
          worker thread) ──▶ the answer in its response_format
    GET  /v1/models, /health

Every failure is an OpenAI error object: a body over MAX_UPLOAD 413, a missing file, a file
that is not audio libsndfile reads, a bad field 400 (naming it and what is allowed), an
unknown model 404, more than max_queue waiting 429, a missing or wrong key 401. Fields tinyt
does not honour (word timestamps, stream) are refused by name.
"""
from __future__ import annotations

import asyncio
import email.parser
import email.policy
import math
import tempfile
from pathlib import Path

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request as HttpRequest
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from tinyt.errors import ApiError, TinytError
from tinyt.runtime.subtitles import render
from tinyt.runtime.transcribe import SpeechModel, Transcription

from .handlers import authorize

MAX_UPLOAD = 25 << 20  # bytes of a request body: OpenAI's 25 MB
FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
FIELDS = ("file", "model", "language", "prompt", "temperature", "response_format",
          "timestamp_granularities[]", "stream")


class AudioServer:
    """The routes of a speech server over one SpeechModel."""

    def __init__(self, model: SpeechModel, *, model_id: str, api_key: str | None = None,
                 max_queue: int = 64):
        self.model, self.model_id, self.api_key = model, model_id, api_key
        self.max_queue, self.waiting = max_queue, 0
        self.lock = asyncio.Lock()  # one transcription runs at a time

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/audio/transcriptions", self.transcriptions, methods=["POST"]),
            Route("/v1/audio/translations", self.translations, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"])])

    async def models(self, request: HttpRequest) -> Response:
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_id, "object": "model", "created": 0, "owned_by": "tinyt"}]})

    async def health(self, request: HttpRequest) -> Response:
        return JSONResponse({"status": "ok", "model": self.model_id})

    async def transcriptions(self, request: HttpRequest) -> Response:
        return await self._answer(request, "transcribe")

    async def translations(self, request: HttpRequest) -> Response:
        return await self._answer(request, "translate")

    @staticmethod
    def error(e: ApiError) -> JSONResponse:
        return JSONResponse({"error": {"message": e.message, "type": e.kind, "param": e.param,
                                       "code": None}}, status_code=e.status, headers=e.headers)

    async def _answer(self, request: HttpRequest, task: str) -> Response:
        try:
            self._authorize(request)
            fields, upload = await _form(request)
            kwargs, form = self._settings(fields, task)
            if self.waiting >= self.max_queue:
                raise ApiError(429, f"{self.waiting} transcriptions are waiting; try again "
                                    "later", kind="rate_limit_error", headers={"Retry-After": "1"})
            self.waiting += 1
            try:
                async with self.lock:
                    result = await run_in_threadpool(self._run, upload, kwargs)
            finally:
                self.waiting -= 1
        except ApiError as e:
            return self.error(e)
        return _response(result, form, task)

    def _authorize(self, request: HttpRequest) -> None:
        authorize(self.api_key, request)

    def _settings(self, fields: dict[str, str], task: str) -> tuple[dict, str]:
        """transcribe's keywords and the response format, from the form's fields."""
        unknown = sorted(set(fields) - set(FIELDS))
        if unknown:
            raise ApiError(400, f"unknown field(s) {unknown}; allowed: {', '.join(FIELDS)}",
                           param=unknown[0])
        if fields.get("model") not in (None, self.model_id):
            raise ApiError(404, f"model {fields['model']!r} is not served here; this server "
                                f"serves {self.model_id!r}", param="model",
                           kind="not_found_error")
        if fields.get("stream", "false").lower() not in ("false", "0"):
            raise ApiError(400, "stream is not supported: leave it out", param="stream")
        if fields.get("timestamp_granularities[]", "segment") != "segment":
            raise ApiError(400, "timestamp_granularities: only 'segment' (word timestamps are "
                                "not built)", param="timestamp_granularities[]")
        form = fields.get("response_format", "json")
        if form not in FORMATS:
            raise ApiError(400, f"response_format={form!r} is invalid: one of "
                                f"{', '.join(FORMATS)}", param="response_format")
        if task == "translate" and "language" in fields:
            raise ApiError(400, "language: a translation is into English and detects the "
                                "speech's language; leave it out", param="language")
        try:
            temperature = float(fields.get("temperature", "0"))
        except ValueError:
            temperature = math.nan
        if not 0 <= temperature <= 1:
            raise ApiError(400, f"temperature={fields['temperature']!r} is invalid: a number "
                                "in 0..1", param="temperature")
        return {"language": fields.get("language") or None, "task": task,
                "prompt": fields.get("prompt"), "temperature": temperature,
                "timestamps": form in ("srt", "vtt", "verbose_json")}, form

    def _run(self, upload: tuple[str, bytes], kwargs: dict) -> Transcription:
        name, data = upload
        with tempfile.TemporaryDirectory(prefix="tinyt-audio-") as tmp:
            path = Path(tmp) / ("upload" + Path(name).suffix[:16])
            path.write_bytes(data)
            try:
                return self.model.transcribe(path, **kwargs)
            except TinytError as e:  # not audio, or a bad setting: the client's to fix
                param = "file" if "audio" in str(e) or str(path) in str(e) else None
                raise ApiError(400, str(e).replace(str(path), name or "the file"),
                               param=param) from None


async def _form(request: HttpRequest) -> tuple[dict[str, str], tuple[str, bytes]]:
    """The multipart form's text fields, and its file (name, bytes); ApiError otherwise."""
    kind = request.headers.get("content-type", "")
    if not kind.startswith("multipart/form-data") or "boundary=" not in kind:
        raise ApiError(400, "send multipart/form-data with a 'file' field (the audio)")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_UPLOAD:
        raise ApiError(413, f"the body is {int(declared)} bytes; at most {MAX_UPLOAD} (25 MB)")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_UPLOAD:
            raise ApiError(413, f"the body is over {MAX_UPLOAD} bytes (25 MB)")
    head = f"Content-Type: {kind}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(head + bytes(body))
    fields: dict[str, str] = {}
    upload = None
    for part in message.iter_parts() if message.is_multipart() else ():
        name = part.get_param("name", header="content-disposition")
        data = part.get_payload(decode=True) or b""
        if name == "file":
            upload = (part.get_filename() or "audio", data)
        elif isinstance(name, str):
            fields[name] = data.decode("utf-8", errors="replace")
    if upload is None:
        raise ApiError(400, "the form has no 'file' field (the audio)", param="file")
    return fields, upload


def _response(result: Transcription, form: str, task: str) -> Response:
    """The answer in OpenAI's response_format."""
    if form == "json":
        return JSONResponse({"text": result.text})
    if form == "verbose_json":
        data = result.to_dict()
        return JSONResponse({"task": task, **data, "segments": [
            {**s, "seek": int(round(s["start"] * 100))} for s in data["segments"]]})
    body = render(result, form)
    return PlainTextResponse(body.rstrip("\n") if form == "text" else body)
