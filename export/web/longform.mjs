// Whisper's long-form transcription in the browser: what speech.mjs' SpeechModel needs to go
// window by window as tinyt.runtime's SpeechModel.transcribe does (runtime/transcribe.py
// `_windows`, `_cut`, `split_segments`; runtime/whisper_rules.py), greedy:
//
//   features [n_mels x frames] (the whole audio's, its floor set by the whole) ──seek = 0──┐
//     ┌──────────────────────────────────────────────────────────────────────────────────┘
//     ▼
//   cutWindow(seek): 3,000 frames from seek, zeros past the end ──encoder──▶ memory
//     ──decoder, whisperRules (suppress_tokens, begin_suppress_tokens, timestamps in pairs that
//       never decrease, a timestamp first, a timestamp forced where the timestamps' total
//       probability beats every text token's)──▶ tokens
//     ──splitSegments──▶ segments (start, end, tokens) and the frames to move seek on by: to the
//       end of the last complete segment, or the window's end ──▶ again while seek < frames
//
// The page does the runtime's default path (temperature 0, greedy): no temperature fallback,
// no no-speech skip, no conditioning on the previous windows' text, no prompt and no beams
// (transcribe(..., temperature=(0.0, 0.2, ...), compression_ratio_threshold,
// logprob_threshold, no_speech_threshold, condition_on_prev_tokens, prompt, num_beams) are
// tinyt.runtime's and `tinyt transcribe`'s only). One difference in arithmetic: the rule that
// forces a timestamp compares the timestamps' log-sum-exp with the best text logit in float64
// where the runtime takes float32 log-softmaxes; the two part only where those two numbers
// are within float32's rounding of each other (a tie).
import { TinytWebError } from "./tinyt.mjs";

export const TIME_PRECISION = 0.02;  // seconds a timestamp token stands for
export const FRAME_SECONDS = 0.01;  // a feature frame: 160 samples at 16 kHz
export const INPUT_STRIDE = 2;  // feature frames an encoder position reads

/** "mm:ss.xx" of `seconds` (minutes past 59 keep counting: 61:02.00). */
export function clock(seconds) {
  const cs = Math.round(seconds * 100), m = Math.floor(cs / 6000), s = (cs - m * 6000) / 100;
  return `${String(m).padStart(2, "0")}:${s.toFixed(2).padStart(5, "0")}`;
}

/** `x` rounded to 3 decimals as Python's round(x, 3) (the exact value's nearest: a binary
 * double is never exactly half-way at 3 decimals, so toFixed's half-up never differs). */
const round3 = (x) => Number(x.toFixed(3));

/** The window of N frames (3,000) from `seek` of row-major `features` [nMels x total],
 * zero-padded past the end (as the runtime's _cut), and how many of its frames are audio. */
export function cutWindow(features, nMels, total, seek, N = 3000) {
  const frames = Math.min(total - seek, N), window = new Float32Array(nMels * N);
  for (let m = 0; m < nMels; m++) {
    window.set(features.subarray(m * total + seek, m * total + seek + frames), m * N);
  }
  return { window, frames };
}

/** A window's tokens as segments {start, end, tokens} (seconds from the audio's start, to 3
 * decimals) and the frames to move on by: runtime/transcribe.split_segments (transformers'
 * _retrieve_segment), step for step. Consecutive timestamps end a segment; a window that does
 * not end on a lone timestamp drops what follows its last complete segment and resumes at that
 * segment's end. `T`: the first timestamp's id (<|0.00|>). */
export function splitSegments(tokens, T, offset, frames) {
  const stamp = tokens.map((t) => t >= T), n = tokens.length;
  const single = n >= 2 ? !stamp[n - 2] && stamp[n - 1] : false;  // is_stamp[-2:] == [F, T]
  const cuts = [];
  for (let i = 0; i < n - 1; i++) if (stamp[i] && stamp[i + 1]) cuts.push(i + 1);
  const seg = (start, end, piece) => ({ start: round3(start), end: round3(end), tokens: piece });
  if (!cuts.length) {
    const stamps = tokens.filter((t) => t >= T);
    let last = Math.trunc(frames * FRAME_SECONDS / TIME_PRECISION);
    if (stamps.length && stamps[stamps.length - 1] !== T) last = stamps[stamps.length - 1] - T;
    return { segments: [seg(offset, offset + last * TIME_PRECISION, tokens.slice())], advance: frames };
  }
  if (single) cuts.push(n);
  else cuts[cuts.length - 1] += 1;  // the last segment keeps both of its closing timestamps
  const segments = [];
  let begin = 0;
  cuts.forEach((cut, i) => {
    const piece = tokens.slice(begin, cut);
    const end = i < cuts.length - 1 || single ? piece[piece.length - 1] : piece[piece.length - 2];
    segments.push(seg(offset + (piece[0] - T) * TIME_PRECISION, offset + (end - T) * TIME_PRECISION, piece));
    begin = cut;
  });
  return { segments, advance: single ? frames : (tokens[begin - 2] - T) * INPUT_STRIDE };
}

/** Whisper's rules as seq2seq.mjs' decode applies them, `rules(z, history, made)` in place on
 * one row of logits (runtime/whisper_rules.WhisperRules.apply): begin_suppress_tokens at the
 * first token, suppress_tokens, then with `timestamps` the timestamp rules. `speech`: web.json's
 * speech block; `begin`: the prompt's length (the history's tokens before the generated). */
export function whisperRules(speech, begin, timestamps) {
  const s = speech;
  return (z, history, made) => {
    if (made === 0) for (const t of s.begin_suppress_tokens) z[t] = -Infinity;
    for (const t of s.suppress_tokens) z[t] = -Infinity;
    if (timestamps) timestampRules(z, history.slice(begin), made, s);
  };
}

/** Timestamps come in pairs (but one before the end), never decrease, the first token is one
 * (at most max_initial_timestamp_index), and one is forced where the timestamps' total
 * probability beats every text token's (WhisperRules._timestamp_rules, one row). */
function timestampRules(z, seq, made, s) {
  const T = s.timestamp_begin, n = seq.length;
  z[s.no_timestamps] = -Infinity;
  const last = n >= 1 && seq[n - 1] >= T, penultimate = n < 2 || seq[n - 2] >= T;
  if (last) {
    if (penultimate) z.fill(-Infinity, T);  // a pair just closed: text next
    else z.fill(-Infinity, 0, s.end);  // an open timestamp: its pair or the end
  }
  let latest = -1;
  for (const t of seq) if (t >= T) latest = t;
  if (latest >= 0) z.fill(-Infinity, T, last && !penultimate ? latest : latest + 1);
  if (made === 0) {
    z.fill(-Infinity, 0, T);
    if (s.max_initial_timestamp_index != null) z.fill(-Infinity, T + s.max_initial_timestamp_index + 1);
  }
  let peak = -Infinity, text = -Infinity;
  for (let i = T; i < z.length; i++) if (z[i] > peak) peak = z[i];
  for (let i = 0; i < T; i++) if (z[i] > text) text = z[i];
  let total = peak;
  if (Number.isFinite(peak)) {
    let sum = 0;
    for (let i = T; i < z.length; i++) sum += Math.exp(z[i] - peak);
    total = peak + Math.log(sum);
  }
  if (total > text) z.fill(-Infinity, 0, T);
}

/** The refusal of audio `seconds` long, over `limit` (web.json's speech.max_seconds: what a
 * browser tab holds, export/web/speech_page.py's MAX_SECONDS), as the page and transcribe say
 * it. */
export function tooLong(seconds, limit) {
  return new TinytWebError(`the audio lasts ${clock(seconds)} (${seconds.toFixed(1)} s); the page transcribes at most ${clock(limit)} (what a browser tab holds). Split it, or run tinyt transcribe, which reads up to 4 h`);
}
