// Run a web package's module under Node (the same tinyt.mjs and ONNX Runtime Web WebAssembly
// files the page loads): `node check.mjs PACKAGE_DIR < request.json > answer.json`, where the
// request is {"encode": [texts], "encode_prompt": [texts] (special tokens added), "decode": [ids], "generate": [{"prompt_ids": [...],
// "max_new_tokens": n, ...}], "threads": 1} for a language model, and {"rows": [texts or pairs
// [a, b]] (ids and token types, cut where the model cuts), "offsets": [texts] (tokens and their
// [start, end)), "embed" | "classify" | "tag": [texts] (classify: pairs too)} for an encoder
// or a classifier, and {"transcribe": [{"samples": [16 kHz floats], "language": code | null,
// "task", "timestamps", "max_new_tokens", "features": true (to have the log-mel features
// back)}]} for a Whisper (its answer's segments and windows as speech.mjs returns them). tinyt's packaging and tests call it; the page does the same in a browser.
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const dir = path.resolve(process.argv[2]);
const { load } = await import(pathToFileURL(path.join(dir, "tinyt.mjs")).href);
const request = JSON.parse(fs.readFileSync(0, "utf8"));
const answer = { encode: [], generate: [] };
try {
  const lm = await load(dir, {
    numThreads: request.threads || 1,
    fetch: async (url) => new Uint8Array(fs.readFileSync(url)),
  });
  answer.load_ms = lm.loadMs;
  for (const text of request.encode || []) answer.encode.push(lm.tokenizer.encode(text));
  for (const text of request.encode_prompt || []) {  // with the special tokens (a source's)
    (answer.encode_prompt ||= []).push(lm.tokenizer.hf.encode(text, { add_special_tokens: true }).ids);
  }
  for (const ids of request.decode || []) (answer.decode ||= []).push(lm.tokenizer.decode(ids));
  for (const text of request.rows || []) {  // a text, or a pair [a, b]
    const r = typeof text === "string" ? lm.tokenizer.encodeRow(text, lm.maxLength)
      : lm.tokenizer.encodeRow(text[0], lm.maxLength, { pair: text[1] });
    (answer.rows ||= []).push([r.ids, r.typeIds]);
  }
  for (const text of request.offsets || []) {
    const r = lm.tokenizer.encodeRow(text, lm.maxLength, { offsets: true });
    (answer.offsets ||= []).push([r.tokens, r.offsets]);
  }
  if (request.embed) answer.embed = (await lm.embed(request.embed)).map((e) => Array.from(e));
  if (request.classify) answer.classify = await lm.classify(request.classify);
  if (request.tag) answer.tag = await lm.tag(request.tag);
  for (const g of request.generate || []) {
    const r = await lm.generate(g.prompt_ids ?? g.prompt, {
      maxNewTokens: g.max_new_tokens, temperature: g.temperature || 0, topK: g.top_k || 0,
      topP: g.top_p ?? 1, seed: g.seed || 0, stop: g.stop || [] });
    answer.generate.push({ token_ids: r.tokenIds, text: r.text, finish_reason: r.finishReason,
                           timings: r.timings });
  }
  for (const t of request.transcribe || []) {  // a Whisper's: 16 kHz samples
    const r = await lm.transcribe(Float32Array.from(t.samples), {
      language: t.language ?? null, task: t.task || "transcribe", timestamps: !!t.timestamps,
      maxNewTokens: t.max_new_tokens });
    (answer.transcribe ||= []).push({ token_ids: r.tokenIds, text: r.text, language: r.language,
      prompt: r.prompt, finish_reason: r.finishReason, segments: r.segments, windows: r.windows,
      features: t.features ? Array.from(r.features) : null });
  }
} catch (e) {
  answer.error = String(e && e.message ? e.message : e);
}
process.stdout.write(JSON.stringify(answer));
