// tinyt in the browser: the tokenizer and the generation loop of a `tinyt package --format web`
// folder, on ONNX Runtime Web's WebAssembly backend (pinned beside this file: web.json says
// which version). No build step, no dependency but ort.wasm.min.mjs in the same folder.
//
//   import { load } from "./tinyt.mjs";
//   const lm = await load(".", { numThreads: 1 });          // reads web.json, graph(s), tokenizer
//   const r = await lm.generate("def ", { maxNewTokens: 32, temperature: 0,
//                                         onToken: (piece, id) => out.textContent += piece });
//   r.tokenIds, r.text, r.finishReason ("eos" | "stop" | "length" | "cancelled"), r.timings
//
// generate() options: maxNewTokens (default 32), temperature (0: greedy), topK, topP, seed
// (sampling is reproducible for a seed), stop (strings that end the text, cut before them),
// onToken(piece, id) called as each token is chosen, signal (an AbortSignal: cancel),
// minNewTokens (end-of-text is not chosen before that many tokens). Unknown options are errors.
// Errors are TinytWebError with a message that names the problem.
import * as ort from "./ort.wasm.min.mjs";

export class TinytWebError extends Error {}

// -- the tokenizer: byte-level BPE as Hugging Face's tokenizers runs it (GPT-2's scheme) ----------
const GPT2_SPLIT =
  /'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+/gu;

function bytesToUnicode() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) { bs.push(b); cs.push(256 + n); n++; }
  }
  const map = new Array(256);
  bs.forEach((b, i) => { map[b] = String.fromCodePoint(cs[i]); });
  return map;
}

export class Tokenizer {
  constructor(json) {
    const m = json.model || {};
    const pre = json.pre_tokenizer || {};
    if (m.type !== "BPE" || pre.type !== "ByteLevel" || json.normalizer) {
      throw new TinytWebError(
        `tokenizer.json: the web tokenizer runs byte-level BPE (model BPE, pre_tokenizer ` +
        `ByteLevel, no normalizer); this one has model ${m.type}, pre_tokenizer ${pre.type}` +
        `${json.normalizer ? `, normalizer ${json.normalizer.type}` : ""}`);
    }
    this.addPrefixSpace = !!pre.add_prefix_space;
    this.useRegex = pre.use_regex !== false;
    this.vocab = new Map(Object.entries(m.vocab));
    this.idToToken = [];
    for (const [t, id] of this.vocab) this.idToToken[id] = t;
    this.ranks = new Map();
    (m.merges || []).forEach((mg, i) => {
      const [a, b] = Array.isArray(mg) ? mg : mg.split(" ");
      this.ranks.set(a + " " + b, i);
    });
    this.added = (json.added_tokens || []).slice().sort((a, b) => b.content.length - a.content.length);
    for (const t of this.added) this.idToToken[t.id] = t.content;
    this.byteChar = bytesToUnicode();
    this.charByte = new Map(this.byteChar.map((c, b) => [c, b]));
    this.cache = new Map();
    this.encoder = new TextEncoder();
  }

  get vocabSize() { return this.idToToken.length; }

  tokenId(text) {
    const t = this.added.find((a) => a.content === text);
    return t ? t.id : this.vocab.get(text);
  }

  _bpe(word) {
    const hit = this.cache.get(word);
    if (hit) return hit;
    let parts = Array.from(word);
    while (parts.length > 1) {
      let best = -1, rank = Infinity;
      for (let i = 0; i < parts.length - 1; i++) {
        const r = this.ranks.get(parts[i] + " " + parts[i + 1]);
        if (r !== undefined && r < rank) { rank = r; best = i; }
      }
      if (best < 0) break;
      const a = parts[best], b = parts[best + 1], merged = [];
      for (let i = 0; i < parts.length; i++) {  // merge every occurrence of the pair, left first
        if (i < parts.length - 1 && parts[i] === a && parts[i + 1] === b) {
          merged.push(a + b); i++;
        } else merged.push(parts[i]);
      }
      parts = merged;
    }
    const ids = parts.map((p) => {
      const id = this.vocab.get(p);
      if (id === undefined) throw new TinytWebError(`tokenizer.json has no token ${JSON.stringify(p)}`);
      return id;
    });
    if (this.cache.size < 50000) this.cache.set(word, ids);
    return ids;
  }

  _encodePlain(text, out) {
    if (!text) return;
    if (this.addPrefixSpace && !text.startsWith(" ")) text = " " + text;
    const pieces = this.useRegex ? text.match(GPT2_SPLIT) || [] : [text];
    for (const piece of pieces) {
      let mapped = "";
      for (const b of this.encoder.encode(piece)) mapped += this.byteChar[b];
      for (const id of this._bpe(mapped)) out.push(id);
    }
  }

  /** ids of `text`, as tinyt's Tokenizer.encode (special tokens in the text are matched). */
  encode(text) {
    if (typeof text !== "string") throw new TinytWebError("encode takes a string");
    const out = [];
    let rest = text;
    while (rest.length) {
      let at = -1, tok = null;
      for (const t of this.added) {
        const i = rest.indexOf(t.content);
        if (i >= 0 && (at < 0 || i < at)) { at = i; tok = t; }
      }
      if (!tok) { this._encodePlain(rest, out); break; }
      this._encodePlain(rest.slice(0, at), out);
      out.push(tok.id);
      rest = rest.slice(at + tok.content.length);
    }
    return out;
  }

  /** The bytes of `ids` (special tokens as their text). */
  bytes(ids) {
    const out = [];
    for (const id of ids) {
      const t = this.idToToken[id];
      if (t === undefined) throw new TinytWebError(`token id ${id} is not in the vocabulary (${this.vocabSize})`);
      if (this.added.some((a) => a.id === id)) { out.push(...this.encoder.encode(t)); continue; }
      for (const ch of t) {
        const b = this.charByte.get(ch);
        if (b === undefined) out.push(...this.encoder.encode(ch)); else out.push(b);
      }
    }
    return new Uint8Array(out);
  }

  decode(ids) { return new TextDecoder().decode(this.bytes(ids)); }
}

// -- sampling: greedy, or temperature / top-k / top-p with a seeded generator -------------------
function rng(seed) {  // mulberry32: small, fast, the same sequence for a seed on every browser
  let a = (seed >>> 0) || 0x9e3779b9;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function argmax(x) {
  let best = 0;
  for (let i = 1; i < x.length; i++) if (x[i] > x[best]) best = i;
  return best;
}

function sample(logits, { temperature, topK, topP }, random) {
  for (let i = 0; i < logits.length; i++) {
    if (Number.isNaN(logits[i]) || logits[i] === Infinity) throw new TinytWebError(`the model produced a non-finite logit (${logits[i]}) at token ${i}`);
  }
  if (!temperature) return argmax(logits);
  let idx = Array.from(logits.keys()).sort((a, b) => logits[b] - logits[a]);
  if (topK) idx = idx.slice(0, topK);
  const top = logits[idx[0]];
  let p = idx.map((i) => Math.exp((logits[i] - top) / temperature));
  let sum = p.reduce((a, b) => a + b, 0);
  p = p.map((v) => v / sum);
  if (topP && topP < 1) {
    let acc = 0, keep = 0;
    while (keep < p.length && acc < topP) acc += p[keep++];
    idx = idx.slice(0, keep); p = p.slice(0, keep);
    sum = p.reduce((a, b) => a + b, 0); p = p.map((v) => v / sum);
  }
  let u = random(), acc = 0;
  for (let k = 0; k < p.length; k++) { acc += p[k]; if (u < acc) return idx[k]; }
  return idx[idx.length - 1];
}

// -- the model ---------------------------------------------------------------------------------
// A turn of the event loop without setTimeout's 4 ms clamp (a token must not cost a timer tick).
function yieldNow() {
  return new Promise((resolve) => {
    const ch = new MessageChannel();
    ch.port1.onmessage = () => { ch.port1.close(); resolve(); };
    ch.port2.postMessage(0);
  });
}

async function fetchBytes(url, what) {
  let r;
  try { r = await fetch(url); } catch (e) { throw new TinytWebError(`cannot fetch ${what} (${url}): ${e.message}`); }
  if (!r.ok) throw new TinytWebError(`cannot fetch ${what} (${url}): HTTP ${r.status}`);
  return new Uint8Array(await r.arrayBuffer());
}

export class LanguageModel {
  constructor(web, tokenizer, step, prompt) {
    this.web = web; this.tokenizer = tokenizer; this.step = step; this.prompt = prompt || step;
    this.context = web.context;
  }

  _feeds(ids, past, cache) {  // one row: the contract's inputs, or the shared-cache graph's
    const n = ids.length, w = this.web, f = {};
    f.input_ids = new ort.Tensor("int64", BigInt64Array.from(ids, BigInt), [1, n]);
    f.position_ids = new ort.Tensor("int64", BigInt64Array.from(ids, (_, i) => BigInt(past + i)), [1, n]);
    if (w.graph === "decoder_gqa") {
      f.seqlens_k = new ort.Tensor("int32", Int32Array.of(past + n - 1), [1]);
      f.total_sequence_length = new ort.Tensor("int32", Int32Array.of(past + n), []);
      if (this.step.inputNames.includes("window_seqlens_k")) {
        // the windowed layers' own counts (tinyt.contract.WINDOW_INPUTS): here their buffers
        // hold the whole past as the others' do, so the counts are the same
        f.window_seqlens_k = f.seqlens_k;
        f.window_total_sequence_length = f.total_sequence_length;
      }
    } else {
      f.attention_mask = new ort.Tensor("int64", new BigInt64Array(past + n).fill(1n), [1, past + n]);
    }
    for (let l = 0; l < w.n_layer; l++) {
      f[`past_key_values.${l}.key`] = cache[2 * l];
      f[`past_key_values.${l}.value`] = cache[2 * l + 1];
    }
    return f;
  }

  _emptyCache(tokens) {
    // a shared-cache graph's buffers hold what this call can reach (prompt + new tokens),
    // never the model's whole context; the contract graph's past starts empty and grows
    const w = this.web, cap = w.graph === "decoder_gqa" ? Math.min(tokens, this.context) : 0;
    // the contract's order (tinyt.contract.kv_axes), symbolic axes filled in
    const shape = w.kv_axes.map((a) => (a === "length" ? cap : typeof a === "string" ? 1 : a));
    const size = shape.reduce((a, b) => a * b, 1);
    return Array.from({ length: 2 * w.n_layer }, () => new ort.Tensor("float32", new Float32Array(size), shape));
  }

  async _run(session, ids, past, cache) {
    const out = await session.run(this._feeds(ids, past, cache));
    const next = [];
    for (let l = 0; l < this.web.n_layer; l++) next.push(out[`present.${l}.key`], out[`present.${l}.value`]);
    const logits = out.logits, V = logits.dims[logits.dims.length - 1];
    return { logits: logits.data.subarray(logits.data.length - V), cache: next };
  }

  /** Generate from `prompt` (a string, or token ids); see the module comment for options. */
  async generate(prompt, opts = {}) {
    const known = ["maxNewTokens", "minNewTokens", "temperature", "topK", "topP", "seed", "stop",
                   "onToken", "signal"];
    const unknown = Object.keys(opts).filter((k) => !known.includes(k));
    if (unknown.length) throw new TinytWebError(`unknown option(s) ${unknown.join(", ")}; options are ${known.join(", ")}`);
    const o = { maxNewTokens: 32, minNewTokens: 0, temperature: 0, topK: 0, topP: 1, seed: 0,
                stop: [], ...opts };
    if (!Number.isInteger(o.maxNewTokens) || o.maxNewTokens < 1) throw new TinytWebError(`maxNewTokens=${o.maxNewTokens} must be an integer >= 1`);
    for (const [k, v] of [["temperature", o.temperature], ["topP", o.topP], ["topK", o.topK]]) {
      if (typeof v !== "number" || !Number.isFinite(v) || v < 0) throw new TinytWebError(`${k}=${v} must be a finite number >= 0`);
    }
    if (o.topP > 1) throw new TinytWebError(`topP=${o.topP} must be at most 1`);
    const ids = typeof prompt === "string" ? this.tokenizer.encode(prompt) : Array.from(prompt);
    if (!ids.length) throw new TinytWebError("the prompt is empty: give at least one token");
    if (ids.length >= this.context) {
      throw new TinytWebError(`the prompt is ${ids.length} tokens; the model's context is ${this.context}, which leaves no room for a token (at most ${this.context - 1} prompt tokens)`);
    }
    const room = Math.min(o.maxNewTokens, this.context - ids.length);
    const random = rng(o.seed), out = [], t0 = performance.now();
    let cache = this._emptyCache(ids.length + room), past = 0, shown = 0, reason = "length", tPrompt = 0;
    let r = await this._run(this.prompt, ids, past, cache);
    past = ids.length; cache = r.cache; tPrompt = performance.now() - t0;
    const eos = this.web.eos_token_id;
    let text = "";
    for (let k = 0; k < room; k++) {
      if (o.signal && o.signal.aborted) { reason = "cancelled"; break; }
      if (eos != null && out.length < o.minNewTokens) r.logits[eos] = -Infinity;  // not yet
      const id = sample(r.logits, o, random);
      if (id === eos) { reason = "eos"; break; }
      out.push(id);
      text = this.tokenizer.decode(out);
      const cut = o.stop.map((s) => text.indexOf(s)).filter((i) => i >= 0);
      if (cut.length) { text = text.slice(0, Math.min(...cut)); reason = "stop"; }
      const safe = reason === "stop" ? text.length : (text.endsWith("\ufffd") ? text.lastIndexOf("\ufffd") : text.length);
      if (o.onToken) o.onToken(safe > shown ? text.slice(shown, safe) : "", id);
      shown = Math.max(shown, safe);
      if (reason === "stop" || k === room - 1) break;
      r = await this._run(this.step, [id], past, cache);
      past += 1; cache = r.cache;
      await yieldNow();  // let the page paint the token
    }
    const ms = performance.now() - t0;
    return { tokenIds: out, text, finishReason: reason, promptTokens: ids.length,
             timings: { prefillMs: tPrompt, totalMs: ms,
                        decodeMsPerToken: out.length > 1 ? (ms - tPrompt) / (out.length - 1) : null } };
  }
}

/** Load a packaged model from `base` (a URL of the package folder). Options: numThreads (1: no
 * threads; more need cross-origin isolation), fetchBytes(url) to load files another way. */
export async function load(base = ".", { numThreads = 1, fetch: get = fetchBytes } = {}) {
  const t0 = performance.now();
  const url = (f) => `${base.replace(/\/$/, "")}/${f}`;
  let web, tokJson;
  try { web = JSON.parse(new TextDecoder().decode(await get(url("web.json"), "web.json"))); }
  catch (e) { throw e instanceof TinytWebError ? e : new TinytWebError(`web.json is not valid JSON: ${e.message}`); }
  try { tokJson = JSON.parse(new TextDecoder().decode(await get(url(web.tokenizer), "the tokenizer"))); }
  catch (e) { throw e instanceof TinytWebError ? e : new TinytWebError(`${web.tokenizer} is not valid JSON: ${e.message}`); }
  const tokenizer = new Tokenizer(tokJson);
  if (tokenizer.vocabSize !== web.vocab_size) {
    throw new TinytWebError(`the tokenizer has ${tokenizer.vocabSize} tokens but the model's vocabulary is ${web.vocab_size}: they are not from the same artifact`);
  }
  ort.env.wasm.numThreads = numThreads;
  const sessions = [];
  for (const f of web.graphs) {
    const bytes = await get(url(f), `the model graph ${f}`);
    try {
      sessions.push(await ort.InferenceSession.create(bytes, { executionProviders: ["wasm"], graphOptimizationLevel: "all" }));
    } catch (e) {
      throw new TinytWebError(`ONNX Runtime Web cannot load ${f}: ${String(e.message || e).slice(0, 300)}`);
    }
  }
  const lm = new LanguageModel(web, tokenizer, sessions[0], sessions[1]);
  lm.loadMs = performance.now() - t0;
  return lm;
}

export { ort };
