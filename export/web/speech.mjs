// Whisper in the browser: a speech package's three graphs on ONNX Runtime Web, run as
// tinyt.runtime's SpeechModel transcribes one window (runtime/transcribe.py: greedy, no
// timestamps). tinyt.mjs's load() gives a SpeechModel for a package whose web.json has "speech":
//
//   const asr = await load(".");
//   const samples = await decodeAudio(await file.arrayBuffer());   // 16 kHz mono Float32Array
//   const r = await asr.transcribe(samples, { language: null });    // null: detected
//   r.text, r.tokenIds, r.language, r.features (log-mel [n_mels x 3000]), r.timings
//
//   audio ──decodeAudio (Web Audio: decodeAudioData into a 16-kHz OfflineAudioContext,
//           channels averaged)──▶ samples ──logMel (runtime/audio.log_mel: Hann 400 every 160,
//           |rfft|^2, the package's mel filters, log10, max - 8, (x + 4) / 4)──▶ features
//     ──encoder_model.onnx──▶ memory ──[language: the decoder's first step on
//           <|startoftranscript|>, the best language token]──▶ <|sot|> <|lang|> <|task|>
//           <|notimestamps|> ──seq2seq.mjs' decode (suppress_tokens, begin_suppress_tokens at
//           the first token; greedy)──▶ tokens up to <|endoftext|>
//
// One window: audio over 30 s is refused (tinyt transcribe reads longer audio).
import * as ort from "./ort.wasm.min.mjs";
import { Seq2SeqModel, timings } from "./seq2seq.mjs";
import { TinytWebError } from "./tinyt.mjs";

export const SAMPLE_RATE = 16000, N_FFT = 400, HOP = 160, N_SAMPLES = 30 * SAMPLE_RATE;
export const N_FRAMES = N_SAMPLES / HOP;  // 3,000
const OPTIONS = ["language", "task", "maxNewTokens", "onToken", "signal"];

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

/** Whisper's log-mel features [nMels x N_FRAMES] (row-major Float32Array) of 16 kHz `samples`
 * (the first 30 s, padded with silence), as runtime/audio.log_mel computes them: the frames and
 * window in float32 as numpy's, the spectrum and the mel sums in float64 (a DFT with exact
 * twiddles: numpy's float32 FFT is the one that rounds), log10 and the rest rounded to float32
 * step by step. `filters`: Float64Array [N_FFT / 2 + 1, nMels], the package's mel_filters.bin. */
export function logMel(samples, filters, nMels) {
  const half = N_FFT / 2, bins = half + 1, x = new Float32Array(N_SAMPLES + N_FFT);
  x.set(samples.subarray(0, N_SAMPLES), half);
  for (let j = 1; j <= half; j++) {  // centred frames: reflect-padded at both ends
    x[half - j] = x[half + j];
    x[half + N_SAMPLES - 1 + j] = x[half + N_SAMPLES - 1 - j];
  }
  const window = new Float32Array(N_FFT), cos = new Float64Array(N_FFT), sin = new Float64Array(N_FFT);
  for (let n = 0; n < N_FFT; n++) {
    window[n] = 0.5 - 0.5 * Math.cos((2 * Math.PI * n) / N_FFT);
    cos[n] = Math.cos((2 * Math.PI * n) / N_FFT); sin[n] = Math.sin((2 * Math.PI * n) / N_FFT);
  }
  const span = [];  // each filter's non-zero bins [first, last]
  for (let m = 0; m < nMels; m++) {
    let a = bins, b = -1;
    for (let k = 0; k < bins; k++) if (filters[k * nMels + m] !== 0) { a = Math.min(a, k); b = k; }
    span.push([a, b]);
  }
  const logs = new Float32Array(nMels * N_FRAMES).fill(-10);  // log10(1e-10): a silent frame's
  const y = new Float32Array(N_FFT), power = new Float64Array(bins);
  let top = -10;
  for (let t = 0; t < N_FRAMES; t++) {
    let silent = true;
    for (let n = 0; n < N_FFT; n++) { y[n] = x[t * HOP + n] * window[n]; if (y[n] !== 0) silent = false; }
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
      logs[m * N_FRAMES + t] = v;
      if (v > top) top = v;
    }
  }
  const floor = Math.fround(top - 8);
  for (let i = 0; i < logs.length; i++) logs[i] = Math.fround(Math.fround(Math.max(logs[i], floor) + 4) / 4);
  return logs;
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

  /** The prompt before the generated tokens (SpeechModel._prefix without timestamps); the
   * language null: -1, detected later. */
  _prefix(language, task) {
    const s = this.speech;
    if (!["transcribe", "translate"].includes(task)) throw new TinytWebError(`task=${task} is invalid: one of transcribe, translate`);
    if (!s.multilingual) {
      if ((language !== null && language !== "en") || task !== "transcribe") throw new TinytWebError(`language=${language}, task=${task}: this model is English-only; leave language and task out`);
      return [s.start, s.no_timestamps];
    }
    let lang = -1;
    if (language !== null) {
      lang = this.languages[String(language).replace(/^<\|(.*)\|>$/, "$1").toLowerCase()];
      if (lang === undefined) throw new TinytWebError(`language=${language} is not one of this model's languages; it takes the codes ${Object.keys(this.languages).sort().join(", ")} (null: detect it)`);
    }
    return [s.start, lang, s.tasks[task], s.no_timestamps];
  }

  /** Speech to text: `audio` 16 kHz mono samples (a Float32Array: decodeAudio's, or the
   * microphone's). Options: language (a code, or null: detected), task
   * ("transcribe" | "translate"), maxNewTokens (default: the decoder's positions left),
   * onToken(piece, id), signal (an AbortSignal). */
  async transcribe(audio, opts = {}) {
    const unknown = Object.keys(opts).filter((k) => !OPTIONS.includes(k));
    if (unknown.length) throw new TinytWebError(`unknown option(s) ${unknown.join(", ")}; options are ${OPTIONS.join(", ")}`);
    const s = this.speech, nMels = s.n_mels;
    const o = { language: s.multilingual ? null : "en", task: "transcribe", temperature: 0, topK: 0, topP: 1, seed: 0, stop: [], ...opts };
    const prefix = this._prefix(o.language ?? null, o.task);
    const room = this.context - prefix.length;
    o.maxNewTokens ??= room;
    if (!Number.isInteger(o.maxNewTokens) || o.maxNewTokens < 1 || o.maxNewTokens > room) throw new TinytWebError(`maxNewTokens=${o.maxNewTokens} must be an integer in 1..${room} (the decoder's ${this.context} positions less the ${prefix.length} prompt tokens)`);
    if (!(audio instanceof Float32Array) || !audio.length) throw new TinytWebError("transcribe takes 16 kHz mono samples, a non-empty Float32Array");
    if (audio.length > N_SAMPLES) throw new TinytWebError(`the audio lasts ${(audio.length / SAMPLE_RATE).toFixed(1)} s; the page transcribes one 30-s window (tinyt transcribe reads longer audio)`);
    for (let i = 0; i < audio.length; i++) if (!Number.isFinite(audio[i])) throw new TinytWebError(`the audio holds a non-finite sample at ${i}`);
    const t0 = performance.now();
    const features = logMel(audio, this.filters, nMels);
    const tFeatures = performance.now() - t0;
    const enc = await this.encoder.run({ input_features: new ort.Tensor("float32", features, [1, nMels, N_FRAMES]) });
    const memory = enc.last_hidden_state;
    if (prefix[1] === -1) prefix[1] = await this.detectLanguage(memory);
    const language = s.multilingual ? Object.keys(this.languages).find((c) => this.languages[c] === prefix[1]) : "en";
    const suppress = s.suppress_tokens, begin = s.begin_suppress_tokens;
    const rules = (z, _history, made) => {
      if (made === 0) for (const t of begin) z[t] = -Infinity;
      for (const t of suppress) z[t] = -Infinity;
    };
    const r = await this.decode(prefix, { encoder_hidden_states: memory }, o, rules, (ids) => transcript(this.tokenizer, ids, s.end));
    return { tokenIds: r.tokenIds, text: r.text, finishReason: r.finishReason, language, prompt: prefix,
             features, seconds: audio.length / SAMPLE_RATE,
             timings: { featuresMs: tFeatures, ...timings(t0, r) } };
  }
}
