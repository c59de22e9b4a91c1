// Whisper in the browser: a speech package's three graphs on ONNX Runtime Web, run as
// tinyt.runtime's SpeechModel.transcribe runs them on its default path (runtime/transcribe.py:
// greedy, temperature 0). tinyt.mjs's load() gives a SpeechModel for a package whose web.json
// has "speech":
//
//   const asr = await load(".");
//   const samples = await decodeAudio(await file.arrayBuffer());   // 16 kHz mono Float32Array
//   const r = await asr.transcribe(samples, { language: null, timestamps: true,
//                                             onProgress: (done, total) => ... });
//   r.text, r.segments ([{start, end, text, tokens}]), r.tokenIds, r.language, r.windows,
//   r.features (log-mel [n_mels x frames]), r.timings
//
//   audio ──decodeAudio (Web Audio: decodeAudioData into a 16-kHz OfflineAudioContext,
//           channels averaged)──▶ samples ──logMel (runtime/audio.log_mel: Hann 400 every 160,
//           |rfft|^2, the package's mel filters, log10, max - 8, (x + 4) / 4)──▶ features
//     per 30-s window from frame `seek` (longform.mjs' cutWindow):
//     ──encoder_model.onnx──▶ memory ──[language: the first window's decoder step on
//           <|startoftranscript|>, the best language token]──▶ <|sot|> <|lang|> <|task|>
//           [<|notimestamps|>] ──seq2seq.mjs' decode (longform.mjs' whisperRules; greedy)──▶
//           tokens up to <|endoftext|> ──splitSegments──▶ segments, and seek moves on
//
// Audio of at most 30 s is one window padded with silence; longer audio (up to web.json's
// speech.max_seconds: export/web/speech_page.py's MAX_SECONDS) has its features made whole
// and is always decoded with timestamps, each window from the end of the last one's last
// complete segment, as tinyt transcribe does (what the page leaves out of the runtime's
// options: longform.mjs).
import * as ort from "./ort.wasm.min.mjs";
import { cutWindow, INPUT_STRIDE, splitSegments, TIME_PRECISION, tooLong, whisperRules } from "./longform.mjs";
import { Seq2SeqModel } from "./seq2seq.mjs";
import { TinytWebError, yieldNow } from "./tinyt.mjs";

export const SAMPLE_RATE = 16000, N_FFT = 400, HOP = 160, N_SAMPLES = 30 * SAMPLE_RATE;
export const N_FRAMES = N_SAMPLES / HOP;  // 3,000
const OPTIONS = ["language", "task", "timestamps", "maxNewTokens", "onToken", "onProgress", "signal"];

/** Audio bytes (any format the browser decodes: WAV, FLAC, MP3, Ogg...) as mono samples at
 * 16 kHz: decodeAudioData resamples to its context's rate; the channels are averaged, as
 * runtime/audio.load_audio does (its resampler is soxr's, the browser's its own). */
export async function decodeAudio(bytes) {
  if (typeof OfflineAudioContext === "undefined") throw new TinytWebError("decodeAudio needs the Web Audio API (a browser); pass 16 kHz samples instead");
  const ctx = new OfflineAudioContext(1, 1, SAMPLE_RATE);
  let buf;
  try { buf = await ctx.decodeAudioData(bytes instanceof ArrayBuffer ? bytes : bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.byteLength)); }
  catch (e) { throw new TinytWebError(`the browser cannot decode this audio (${e && e.message ? e.message : e})`); }
  const out = new Float32Array(buf.length);
  for (let c = 0; c < buf.numberOfChannels; c++) {
    const x = buf.getChannelData(c);
    for (let i = 0; i < out.length; i++) out[i] += x[i] / buf.numberOfChannels;
  }
  return out;
}

/** Whisper's log-mel features [nMels x frames] (row-major Float32Array) of 16 kHz `samples`,
 * as runtime/audio.log_mel computes them: the first 30 s padded with silence (3,000 frames), or
 * with `whole` every sample's (floor(samples / 160) frames, the right edge reflected, the floor
 * 8 below the whole's maximum: long-form's); the frames and window in float32 as numpy's, the
 * spectrum and the mel sums in float64 (a DFT with exact twiddles: numpy's float32 FFT is the one
 * that rounds), log10 and the rest rounded to float32 step by step. `filters`: Float64Array
 * [N_FFT / 2 + 1, nMels], the package's mel_filters.bin. */
export function logMel(samples, filters, nMels, { whole = false } = {}) {
  const mel = new LogMel(samples, filters, nMels, whole);
  for (let t = 0; t < mel.frames; t += N_FRAMES) mel.rows(t, Math.min(t + N_FRAMES, mel.frames));
  return mel.finish();
}

/** logMel a window's frames at a time, the event loop turned between them (long audio's
 * features take ~1.6 s a window in JavaScript: the page stays responsive). */
export async function logMelAsync(samples, filters, nMels, { whole = false, signal } = {}) {
  const mel = new LogMel(samples, filters, nMels, whole);
  for (let t = 0; t < mel.frames; t += N_FRAMES) {
    if (signal && signal.aborted) return null;
    mel.rows(t, Math.min(t + N_FRAMES, mel.frames));
    await yieldNow();
  }
  return mel.finish();
}

/** logMel's state: the signal (zero-padded to 30 s, or whole) read through its reflection at
 * both ends, the filters' spans, the log10 values so far and their maximum. */
class LogMel {
  constructor(samples, filters, nMels, whole) {
    this.samples = samples; this.filters = filters; this.nMels = nMels;
    this.n = whole ? samples.length : N_SAMPLES;  // the signal's length
    this.frames = Math.floor(this.n / HOP);
    const bins = N_FFT / 2 + 1;
    this.window = new Float32Array(N_FFT); this.cos = new Float64Array(N_FFT); this.sin = new Float64Array(N_FFT);
    for (let n = 0; n < N_FFT; n++) {
      this.window[n] = 0.5 - 0.5 * Math.cos((2 * Math.PI * n) / N_FFT);
      this.cos[n] = Math.cos((2 * Math.PI * n) / N_FFT); this.sin[n] = Math.sin((2 * Math.PI * n) / N_FFT);
    }
    this.span = [];  // each filter's non-zero bins [first, last]
    for (let m = 0; m < nMels; m++) {
      let a = bins, b = -1;
      for (let k = 0; k < bins; k++) if (filters[k * nMels + m] !== 0) { a = Math.min(a, k); b = k; }
      this.span.push([a, b]);
    }
    this.logs = new Float32Array(nMels * this.frames).fill(-10);  // log10(1e-10): a silent frame's
    this.top = -10;
    this.y = new Float32Array(N_FFT); this.power = new Float64Array(bins);
  }

  /** Sample `i` of the centred signal (i from -N_FFT / 2): reflected at both ends (numpy's
   * pad mode "reflect"), zero past the samples when the signal is 30 s of padded audio. */
  at(i) {
    const n = this.n;
    if (i < 0) i = -i;
    else if (i > n - 1) i = 2 * (n - 1) - i;
    return i < this.samples.length ? this.samples[i] : 0;
  }

  /** The log10 mel energies of frames [from, to). */
  rows(from, to) {
    const { nMels, frames, y, power, window, cos, sin, filters, span, logs } = this;
    const half = N_FFT / 2, bins = half + 1;
    for (let t = from; t < to; t++) {
      let silent = true;
      const start = t * HOP - half;  // the frame's samples, read directly where no edge is near
      const inside = start >= 0 && start + N_FFT <= Math.min(this.n, this.samples.length);
      for (let n = 0; n < N_FFT; n++) {
        y[n] = (inside ? this.samples[start + n] : this.at(start + n)) * window[n];
        if (y[n] !== 0) silent = false;
      }
      if (silent) continue;
      for (let k = 0; k < bins; k++) {
        let re = 0, im = 0;
        for (let n = 0, i = 0; n < N_FFT; n++) {  // i = k n mod N_FFT
          re += y[n] * cos[i]; im -= y[n] * sin[i];
          i += k; if (i >= N_FFT) i -= N_FFT;
        }
        power[k] = re * re + im * im;
      }
      for (let m = 0; m < nMels; m++) {
        let s = 0;
        for (let k = span[m][0]; k <= span[m][1]; k++) s += power[k] * filters[k * nMels + m];
        const v = Math.fround(Math.log10(Math.max(s, 1e-10)));
        logs[m * frames + t] = v;
        if (v > this.top) this.top = v;
      }
    }
  }

  /** The floor 8 below the maximum, then (x + 4) / 4, each step rounded to float32. */
  finish() {
    const { logs } = this, floor = Math.fround(this.top - 8);
    for (let i = 0; i < logs.length; i++) logs[i] = Math.fround(Math.fround(Math.max(logs[i], floor) + 4) / 4);
    return logs;
  }
}

/** The text of a transcript's ordinary tokens (those below `end`, <|endoftext|>: the special
 * ones and timestamps left out), stripped, as SpeechModel._text; "" where there are none. */
export function transcript(tokenizer, ids, end) {
  const words = ids.filter((t) => t < end);
  return words.length ? tokenizer.hf.decode(words, { skip_special_tokens: true }).trim() : "";
}

/** tinyt.mjs' load() for a speech package: its SpeechModel, the mel filters' bytes checked. */
export function speechModel(web, tokenizer, sessions, bytes) {
  const { n_mels: m, bins } = web.speech, filters = new Float64Array(bytes.slice().buffer);
  if (filters.length !== m * bins) throw new TinytWebError(`${web.speech.mel_filters} holds ${filters.length} numbers; the model's ${m} mel filters over ${bins} bins are ${m * bins}`);
  return new SpeechModel(web, tokenizer, sessions, filters);
}

export class SpeechModel extends Seq2SeqModel {
  constructor(web, tokenizer, sessions, filters) {
    super(web, tokenizer, sessions);
    this.speech = web.speech; this.filters = filters;
    this.languages = this.speech.languages;  // {code: id}
  }

  /** The language token the decoder's first step ranks highest on <|startoftranscript|>
   * (transformers' detect_language: no rule applied). */
  async detectLanguage(memory) {
    const r = await this._step(this.decoder, { input_ids: new ort.Tensor("int64", BigInt64Array.of(BigInt(this.speech.start)), [1, 1]), encoder_hidden_states: memory });
    let best = null;
    for (const id of Object.values(this.languages)) if (best === null || r.z[id] > r.z[best]) best = id;
    return best;
  }

  /** The prompt before the generated tokens (SpeechModel._prefix): start, language, task,
   * and <|notimestamps|> unless timestamps are predicted; the language null: -1, detected
   * later. */
  _prefix(language, task, timestamps) {
    const s = this.speech;
    if (!["transcribe", "translate"].includes(task)) throw new TinytWebError(`task=${task} is invalid: one of transcribe, translate`);
    if (timestamps && !s.timestamps) throw new TinytWebError("timestamps (asked for, or audio over 30 s): this model's tokenizer has no timestamp tokens (<|0.00|> .. <|30.00|>); it takes audio of at most 30 s, without timestamps");
    const tail = timestamps ? [] : [s.no_timestamps];
    if (!s.multilingual) {
      if ((language !== null && language !== "en") || task !== "transcribe") throw new TinytWebError(`language=${language}, task=${task}: this model is English-only; leave language and task out`);
      return [s.start, ...tail];
    }
    let lang = -1;
    if (language !== null) {
      lang = this.languages[String(language).replace(/^<\|(.*)\|>$/, "$1").toLowerCase()];
      if (lang === undefined) throw new TinytWebError(`language=${language} is not one of this model's languages; it takes the codes ${Object.keys(this.languages).sort().join(", ")} (null: detect it)`);
    }
    return [s.start, lang, s.tasks[task], ...tail];
  }

  /** transcribe's options checked, with their defaults. */
  _options(opts, audio) {
    const unknown = Object.keys(opts).filter((k) => !OPTIONS.includes(k));
    if (unknown.length) throw new TinytWebError(`unknown option(s) ${unknown.join(", ")}; options are ${OPTIONS.join(", ")}`);
    const o = { language: this.speech.multilingual ? null : "en", task: "transcribe", timestamps: false,
                temperature: 0, topK: 0, topP: 1, seed: 0, stop: [], ...opts };
    if (typeof o.timestamps !== "boolean") throw new TinytWebError(`timestamps=${o.timestamps} is invalid: true or false`);
    if (!(audio instanceof Float32Array) || !audio.length) throw new TinytWebError("transcribe takes 16 kHz mono samples, a non-empty Float32Array");
    if (audio.length > this.speech.max_seconds * SAMPLE_RATE) throw tooLong(audio.length / SAMPLE_RATE, this.speech.max_seconds);
    for (let i = 0; i < audio.length; i++) if (!Number.isFinite(audio[i])) throw new TinytWebError(`the audio holds a non-finite sample at ${i}`);
    // longer than one window (runtime/transcribe.py's test): long-form, timestamps on
    o.whole = Math.floor(audio.length / HOP) > N_FRAMES;
    o.timestamps ||= o.whole;
    o.prefix = this._prefix(o.language ?? null, o.task, o.timestamps);
    const room = this.context - o.prefix.length;
    o.maxNewTokens ??= room;
    if (!Number.isInteger(o.maxNewTokens) || o.maxNewTokens < 1 || o.maxNewTokens > room) throw new TinytWebError(`maxNewTokens=${o.maxNewTokens} must be an integer in 1..${room} (the decoder's ${this.context} positions less the ${o.prefix.length} prompt tokens)`);
    return o;
  }

  /** Speech to text: `audio` 16 kHz mono samples (a Float32Array: decodeAudio's, or the
   * microphone's), at most speech.max_seconds. Options: language (a code, or null: detected), task
   * ("transcribe" | "translate"), timestamps (audio over 30 s always has them), maxNewTokens
   * (a window's; default: the decoder's positions left), onToken(piece, id), onProgress(done,
   * total) (seconds, before each window and once at the end, as the runtime's progress),
   * signal (an AbortSignal: the windows so far are kept, finishReason "cancelled"). */
  async transcribe(audio, opts = {}) {
    const o = this._options(opts, audio), s = this.speech, t0 = performance.now();
    const features = await logMelAsync(audio, this.filters, s.n_mels, { whole: o.whole, signal: o.signal });
    const tFeatures = performance.now() - t0;
    const r = features ? await this._windows(features, o, t0)
      : { tokens: [], segments: [], windows: [], finishReason: "cancelled", firstAt: NaN, encoderMs: 0, stepsMs: 0 };
    const language = s.multilingual ? Object.keys(this.languages).find((c) => this.languages[c] === o.prefix[1]) ?? null : "en";
    const steps = r.windows.reduce((a, w) => a + Math.max(w.tokens.length - 1, 0), 0);
    return { tokenIds: r.tokens, text: transcript(this.tokenizer, r.tokens, s.end), segments: r.segments,
             finishReason: r.finishReason, language, prompt: o.prefix, timestamps: o.timestamps,
             windows: r.windows, features, seconds: audio.length / SAMPLE_RATE,
             timings: { featuresMs: tFeatures, prefillMs: r.firstAt - t0, encoderMs: r.encoderMs,
                        totalMs: performance.now() - t0, decodeMsPerToken: steps ? r.stepsMs / steps : null } };
  }

  /** Every window's segments and tokens, each from where the last one's complete segments
   * end (runtime/transcribe.SpeechModel._windows at temperature 0, longform.mjs). */
  async _windows(features, o, t0) {
    const s = this.speech, nMels = s.n_mels, total = features.length / nMels, prefix = o.prefix;
    const rules = whisperRules(s, prefix.length, o.timestamps);
    const textOf = (ids) => transcript(this.tokenizer, ids, s.end);
    const r = { tokens: [], segments: [], windows: [], finishReason: "eos", firstAt: t0, encoderMs: 0, stepsMs: 0 };
    const seconds = (frames) => Math.round(frames) / 100;  // frames of 10 ms
    let seek = 0;
    while (seek < total) {
      if (o.signal && o.signal.aborted) { r.finishReason = "cancelled"; break; }
      if (o.onProgress) o.onProgress(seconds(seek), seconds(total));
      const { window, frames } = cutWindow(features, nMels, total, seek, N_FRAMES);
      const tEncoder = performance.now();
      const enc = await this.encoder.run({ input_features: new ort.Tensor("float32", window, [1, nMels, N_FRAMES]) });
      r.encoderMs += performance.now() - tEncoder;
      if (prefix[1] === -1) prefix[1] = await this.detectLanguage(enc.last_hidden_state);
      const d = await this.decode(prefix, { encoder_hidden_states: enc.last_hidden_state }, o, rules, textOf);
      if (!r.windows.length) r.firstAt = d.firstAt;
      r.stepsMs += performance.now() - d.firstAt;
      r.windows.push({ seek, frames, tokens: d.tokenIds, finishReason: d.finishReason });
      r.finishReason = d.finishReason;
      if (d.finishReason === "cancelled") break;
      const offset = seek * TIME_PRECISION / INPUT_STRIDE;
      const { segments, advance } = splitSegments(d.tokenIds, s.timestamp_begin, offset, frames);
      for (const seg of segments) {
        r.segments.push({ ...seg, text: textOf(seg.tokens) });
        r.tokens.push(...seg.tokens);
      }
      seek += Math.max(advance, 1);  // (a timestamp pair never ends at 0.00)
      await yieldNow();
    }
    if (o.onProgress && r.finishReason !== "cancelled") o.onProgress(seconds(total), seconds(total));
    return r;
  }
}
