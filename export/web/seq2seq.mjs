// An encoder-decoder (seq2seq) package in the browser: Optimum's three graphs on ONNX Runtime Web,
// run as tinyt.runtime's Seq2SeqModel runs one row (runtime/encoder_decoder.py). tinyt.mjs's
// load() gives a Seq2SeqModel for a package whose web.json says "graph": "seq2seq":
//
//   const mt = await load(".");
//   const r = await mt.generate("The cat sat on the mat.", { maxNewTokens: 32 });
//   r.tokenIds, r.text, r.finishReason ("eos" | "stop" | "length" | "cancelled"), r.timings
//
//   source ──tokenizer (its special tokens added)──▶ encoder_model.onnx (once) ──▶ memory
//   decoder start ──decoder_model.onnx──▶ logits, self cache, cross keys / values (kept)
//       ──rules, choose (greedy, or sampling as LanguageModel's)──▶ token ──┐
//               ▲                                                         │
//               └── decoder_with_past_model.onnx (the self cache grows) ◀─┘
//
// The rules are generation_config.json's, as the runtime applies them (runtime/rules.py): its
// bad_words_ids, a forced first token (forced_bos_token_id; option forcedBosTokenId) and a
// forced last one (forced_eos_token_id); ids past the tokenizer's are never chosen.
import * as ort from "./ort.wasm.min.mjs";
import { rng, sample, TinytWebError, yieldNow } from "./tinyt.mjs";

const OPTIONS = ["maxNewTokens", "temperature", "topK", "topP", "seed", "stop", "onToken",
                 "signal", "forcedBosTokenId"];

/** A generation's timings from its start `t0` (the decoder's first step ends at r.firstAt). */
export function timings(t0, r) {
  const now = performance.now(), n = r.tokenIds.length;
  return { prefillMs: r.firstAt - t0, totalMs: now - t0,
           decodeMsPerToken: n > 1 ? (now - r.firstAt) / (n - 1) : null };
}

export class Seq2SeqModel {
  constructor(web, tokenizer, [encoder, decoder, withPast]) {
    this.web = web; this.tokenizer = tokenizer;
    this.encoder = encoder; this.decoder = decoder; this.withPast = withPast;
    this.context = web.context;  // decoder positions: its start token and the new tokens
    this.eos = new Set(web.eos_token_ids);
  }

  /** The tokens the rules allow next, in place on `z` (runtime/rules.py's apply, one row);
   * `history`: the decoder start and the tokens so far. */
  _rules(z, history, made, n, forcedBos) {
    for (const word of this.web.bad_words_ids) {
      const k = word.length - 1;
      if (k === 0 || word.slice(0, k).every((t, i) => t === history[history.length - k + i])) {
        z[word[k]] = -Infinity;
      }
    }
    let forced = made === 0 && forcedBos != null ? [forcedBos] : [];
    if (made === n - 1 && this.web.forced_eos_token_ids.length) forced = this.web.forced_eos_token_ids;
    if (forced.length) { z.fill(-Infinity); for (const t of forced) z[t] = 0; }
  }

  /** Logits of the last position (cut to the tokenizer's ids) and the step's outputs. */
  async _step(session, feeds) {
    const out = await session.run(feeds);
    const V = this.web.vocab_size, data = out.logits.data;
    return { z: Float32Array.from(data.subarray(data.length - V, data.length - V + this.web.choosable)), out };
  }

  /** Translate (or summarise) `source` (a string, or token ids with their special tokens);
   * options as LanguageModel.generate's (maxNewTokens defaults to generation_config.json's
   * max_length less the start token), and forcedBosTokenId (a multilingual model's target). */
  async generate(source, opts = {}) {
    const unknown = Object.keys(opts).filter((k) => !OPTIONS.includes(k));
    if (unknown.length) throw new TinytWebError(`unknown option(s) ${unknown.join(", ")}; options are ${OPTIONS.join(", ")}`);
    const w = this.web;
    const o = { maxNewTokens: w.max_new_tokens, temperature: 0, topK: 0, topP: 1, seed: 0, stop: [],
                forcedBosTokenId: w.forced_bos_token_id, ...opts };
    const n = o.maxNewTokens;
    if (!Number.isInteger(n) || n < 1 || n > this.context) throw new TinytWebError(`maxNewTokens=${n} must be an integer in 1..${this.context} (the decoder reads at most ${this.context} positions)`);
    for (const [k, v] of [["temperature", o.temperature], ["topP", o.topP], ["topK", o.topK]]) {
      if (typeof v !== "number" || !Number.isFinite(v) || v < 0) throw new TinytWebError(`${k}=${v} must be a finite number >= 0`);
    }
    const ids = typeof source === "string" ? this.tokenizer.hf.encode(source, { add_special_tokens: true }).ids : Array.from(source);
    if (!ids.length) throw new TinytWebError("the source is empty: give at least one token");
    if (ids.length > w.source_context) throw new TinytWebError(`the source is ${ids.length} tokens; the encoder reads at most ${w.source_context}`);
    const t0 = performance.now(), E = ids.length;
    const mask = new ort.Tensor("int64", new BigInt64Array(E).fill(1n), [1, E]);
    const enc = await this.encoder.run({ input_ids: new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, E]), attention_mask: mask });
    const r = await this.decode([w.decoder_start_token_id], { encoder_attention_mask: mask, encoder_hidden_states: enc.last_hidden_state }, o,
                                (z, history, made) => this._rules(z, history, made, n, o.forcedBosTokenId));
    return { ...r, promptTokens: E, timings: timings(t0, r) };
  }

  /** The decoder's loop over one row, after the encoder (generate's, and speech.mjs'): its
   * first step on the `prompt` tokens (the decoder start, or Whisper's start, language and
   * task), then one token a step with the caches. `memory`: encoder_hidden_states and what
   * else every step reads (a text source's encoder_attention_mask); `rules(z, history, made)`
   * sets, in place, the logits of tokens not allowed; `o`: generate's options (maxNewTokens,
   * sampling, stop, onToken, signal); `textOf(ids)`: the text of the tokens so far. */
  async decode(prompt, memory, o, rules, textOf = (ids) => this.tokenizer.hf.decode(ids, { skip_special_tokens: true })) {
    const w = this.web, n = o.maxNewTokens, random = rng(o.seed);
    const token = (t) => new ort.Tensor("int64", BigInt64Array.of(BigInt(t)), [1, 1]);
    const { encoder_hidden_states: _, ...every } = memory;  // what each later step reads too
    let r = await this._step(this.decoder, { ...memory, input_ids: new ort.Tensor("int64", BigInt64Array.from(prompt, BigInt), [1, prompt.length]) });
    const cross = {};  // the cross keys / values of the source, made once
    for (let l = 0; l < w.n_layer; l++) {
      for (const kv of ["key", "value"]) cross[`past_key_values.${l}.encoder.${kv}`] = r.out[`present.${l}.encoder.${kv}`];
    }
    const firstAt = performance.now(), out = [], history = [...prompt];
    let text = "", shown = 0, reason = "length";
    for (let made = 0; made < n; made++) {
      if (o.signal && o.signal.aborted) { reason = "cancelled"; break; }
      rules(r.z, history, made);
      const id = sample(r.z, o, random);
      if (this.eos.has(id)) { reason = "eos"; break; }
      out.push(id); history.push(id);
      text = textOf(out);
      const cut = o.stop.map((s) => text.indexOf(s)).filter((i) => i >= 0);
      if (cut.length) { text = text.slice(0, Math.min(...cut)); reason = "stop"; }
      const safe = reason === "stop" ? text.length : (text.endsWith("\ufffd") ? text.lastIndexOf("\ufffd") : text.length);
      if (o.onToken) o.onToken(safe > shown ? text.slice(shown, safe) : "", id);
      shown = Math.max(shown, safe);
      if (reason === "stop" || made === n - 1) break;
      const feeds = { ...every, input_ids: token(id), ...cross };
      for (let l = 0; l < w.n_layer; l++) {
        for (const kv of ["key", "value"]) feeds[`past_key_values.${l}.decoder.${kv}`] = r.out[`present.${l}.decoder.${kv}`];
      }
      r = await this._step(this.withPast, feeds);
      await yieldNow();  // let the page paint the token
    }
    return { tokenIds: out, text, finishReason: reason, firstAt };
  }
}
