"""A transcription written out (torch-free): plain text, JSON, SubRip (.srt) and WebVTT (.vtt),
as `tinyt transcribe --format` and the server's response_format write them.

    Transcription ──text──▶ "the words"
                  ──json──▶ {"text", "language", "duration", "segments": [{"id", "start",
                             "end", "text", "tokens"}]}
                  ──srt───▶ 1\\n00:00:00,000 --> 00:00:02,500\\nthe words\\n\\n2\\n...
                  ──vtt───▶ WEBVTT\\n\\n00:00:00.000 --> 00:00:02.500\\nthe words\\n\\n...
"""
from __future__ import annotations

import json

from tinyt.errors import ConfigError

FORMATS = ("text", "json", "srt", "vtt")


def clock(seconds: float, decimal: str) -> str:
    """HH:MM:SS,mmm (SubRip: decimal ",") or HH:MM:SS.mmm (WebVTT: ".")."""
    ms = max(0, int(round(seconds * 1000)))
    h, ms = divmod(ms, 3_600_000)
    m, ms = divmod(ms, 60_000)
    s, ms = divmod(ms, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{decimal}{ms:03d}"


def render(result, form: str) -> str:
    """The transcription `result` (runtime/transcribe.py's Transcription) in format `form`."""
    if form == "text":
        return result.text + "\n"
    if form == "json":
        return json.dumps(result.to_dict(), ensure_ascii=False) + "\n"
    if form not in ("srt", "vtt"):
        raise ConfigError(f"format {form!r} is invalid: one of {', '.join(FORMATS)}")
    cues = [s for s in result.segments if s.text]
    if form == "srt":
        return "".join(f"{i}\n{clock(s.start, ',')} --> {clock(s.end, ',')}\n{s.text}\n\n"
                       for i, s in enumerate(cues, 1))
    return "WEBVTT\n\n" + "".join(f"{clock(s.start, '.')} --> {clock(s.end, '.')}\n{s.text}\n\n"
                                  for s in cues)
