"""The families' options through every ONNX stage at a real context: export + verify against
PyTorch, `optimize --target cpu` with its fusions counted per form (q/k norms as
SimplifiedLayerNormalization, rotary only where a layer has it), the shared-cache graph on
GroupQueryAttention (scaled rotary tables, q/k norms, `local_window_size`, per-layer rotary,
Granite's scale) checked against its source and PyTorch, INT8 and INT4 with the accuracy report,
and the runtime generating PyTorch's greedy tokens on each fp32 graph.

One model carries every option at once (the graphs do not care which Hugging Face class it
came from; tests/core/test_families.py maps each class to them), at Llama-3.2's 131,072-token
context with its llama3 rope scaling, a window (12) shorter than the prompts, one layer without
rotary and one full-attention layer.
tests/export/test_families_dirs.py takes each family's own directory through the same stages."""
import json

import numpy as np
import onnx
import pytest
import torch
from chain_fixtures import chain as _chain
from hf_fixtures import save_hf, tokenizer

from tinyt.checkpoint import load_checkpoint, save_checkpoint
from tinyt.config import ModelConfig
from tinyt.contract import ONNX_FILE
from tinyt.manifest import check_manifest, read_model_config
from tinyt.model import build_model, generate

LLAMA3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
EVERY = dict(block_size=131072, vocab_size=320, n_layer=3, n_head=4, n_kv_head=2, n_embd=64,
             n_inner=96, norm="rmsnorm", pos_encoding="rotary", activation="swiglu", bias=False,
             rope_theta=500000.0, rope_scaling=LLAMA3, head_size=32, qk_norm=True,
             sliding_window=12, full_attention_layers=(0,), nope_layers=(2,),
             embedding_multiplier=4.0, residual_multiplier=0.5, attention_multiplier=0.125,
             logits_scaling=2.0, tie_weights=True)
PROMPT = list(range(40, 80))  # 40 tokens: past the window


def _random_chain(settings: dict, root, int4=False):
    """A random-weight model of `settings` (std 0.2: logits with margins for greedy), saved
    and taken through the chain."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(**settings))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    ck = save_checkpoint(root / "ck", model, tokenizer())
    return ck, _chain(ck, root, int4)


@pytest.fixture(scope="module")
def every(tmp_path_factory):
    """A random-weight model with every option."""
    return _random_chain(EVERY, tmp_path_factory.mktemp("every"), int4=True)


@pytest.mark.slow
def test_every_graph_verifies_against_pytorch(every):
    from tinyt.export import verify

    ck, chain = every
    for name in ("onnx", "opt", "gqa"):
        report = verify(ck, chain[name])
        assert report["passed"], (name, report)


def test_optimize_counts_each_form_and_gqa_takes_each_option(every):
    ck, chain = every
    cfg = load_checkpoint(ck).config
    ops = check_manifest(chain["opt"])["op_counts"]
    norms = ops.get("SimplifiedLayerNormalization", 0) + \
        ops.get("com.microsoft.SkipSimplifiedLayerNormalization", 0)
    assert norms == 2 * cfg.n_layer + 1 + 2 * cfg.n_layer  # ln_1, ln_2, ln_f; q and k norms
    assert ops.get("com.microsoft.RotaryEmbedding") == 2 * 2  # layers 0 and 1 (2 has none)
    assert ops.get("com.microsoft.MultiHeadAttention") == cfg.n_layer
    gqa = [n for n in onnx.load(str(chain["gqa"] / ONNX_FILE)).graph.node
           if n.op_type == "GroupQueryAttention"]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in gqa]
    assert [a["do_rotary"] for a in attrs] == [1, 1, 0]
    assert [a.get("local_window_size", -1) for a in attrs] == [-1, 12, 12]
    assert all(abs(a["scale"] - 0.125) < 1e-6 for a in attrs)  # sqrt(s)^2 in float32
    assert all(len([i for i in n.input[:3] if i]) == 3 for n in gqa)  # q, k normed apart


def test_quantized_graphs_report_accuracy(every):
    _, chain = every
    for bits in (8, 4):
        acc = check_manifest(chain[f"int{bits}"])["accuracy"]
        assert 0 <= acc["kl_divergence"] < (0.05 if bits == 8 else 0.5), (bits, acc)


def test_the_runtime_generates_pytorch_greedy_tokens_past_the_window(every):
    from tinyt.runtime import load

    ck_dir, chain = every
    ck = load_checkpoint(ck_dir)
    with torch.no_grad():
        want = generate(ck.model, torch.tensor([PROMPT]), 16, temperature=0)[0, 40:].tolist()
    for name in ("onnx", "opt", "gqa"):
        got = load(chain[name]).generate_ids([PROMPT], max_new_tokens=16)[0].token_ids
        assert got == want, name
    for name in ("int8", "int8-gqa", "int4"):
        rows = load(chain[name]).generate_ids([PROMPT, PROMPT[:5]], max_new_tokens=8,
                                              min_new_tokens=8)
        assert [len(r.token_ids) for r in rows] == [8, 8], name


# Gemma 3's and Gemma 2's options on one model (the checks of tests/core/test_families.py hold
# each family's own class to transformers): offset norms, four a block and q/k, GeGLU, a
# window (12) with its own rotary base and one global layer, one KV head, soft caps on the
# attention's logits and the final ones, at Gemma 3's 32,768-token context.
GEMMA = dict(block_size=32768, vocab_size=320, n_layer=3, n_head=4, n_kv_head=1, n_embd=64,
             n_inner=96, norm="rmsnorm", norm_offset=1.0, post_norms=True, norm_eps=1e-6,
             pos_encoding="rotary", activation="geglu_tanh", bias=False, rope_theta=1e6,
             rope_local_theta=1e4, head_size=32, qk_norm=True, sliding_window=12,
             full_attention_layers=(2,), attention_multiplier=256 ** -0.5,
             embedding_multiplier=8.0, attn_softcap=50.0, final_softcap=30.0, tie_weights=True)


@pytest.fixture(scope="module")
def phi4(tmp_path_factory):
    """Phi-4-mini's form as imported: LongRoPE past 4,096 of 131,072, partial rotary."""
    from tinyt.hf import import_hf

    root = tmp_path_factory.mktemp("phi4")
    save_hf("phi4-mini", root / "hf")
    ck = import_hf(root / "hf", root / "ck", log=lambda s: None)
    return ck, _chain(ck, root)


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    return _random_chain(GEMMA, tmp_path_factory.mktemp("gemma"))


def test_gemma_forms_through_every_graph(gemma):
    """optimize fuses four norms a block (offset gains folded) plus q/k norms and the GeGLU
    gate, and leaves the capped attention unfused (no contract op takes a cap); the
    shared-cache graph takes it into GroupQueryAttention with its softcap, the windowed
    layers' own cos/sin tables and their window; every graph verifies against PyTorch and
    generates its greedy tokens past the window."""
    from tinyt.export import verify
    from tinyt.runtime import load

    ck_dir, chain = gemma
    cfg = load_checkpoint(ck_dir).config
    ops = check_manifest(chain["opt"])["op_counts"]
    norms = ops.get("SimplifiedLayerNormalization", 0) + \
        ops.get("com.microsoft.SkipSimplifiedLayerNormalization", 0)
    assert norms == 4 * cfg.n_layer + 1 + 2 * cfg.n_layer
    assert ops.get("com.microsoft.FastGelu") == cfg.n_layer
    assert ops.get("Tanh") == cfg.n_layer + 1 and "com.microsoft.MultiHeadAttention" not in ops
    graph = onnx.load(str(chain["gqa"] / ONNX_FILE)).graph
    gqa = [n for n in graph.node if n.op_type == "GroupQueryAttention"]
    attrs = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in gqa]
    assert [a["softcap"] for a in attrs] == [50.0] * 3
    assert [a.get("local_window_size", -1) for a in attrs] == [12, 12, -1]
    assert all(abs(a["scale"] - 0.0625) < 1e-7 for a in attrs)
    assert [n.input[7] for n in gqa] == ["/rotary/local/cos_cache"] * 2 + ["/rotary/cos_cache"]
    assert not [n for n in graph.node if n.op_type in ("Softmax", "MultiHeadAttention")]
    for name in ("onnx", "opt", "gqa"):  # int8-gqa: checked against int8 by its stage
        report = verify(ck_dir, chain[name])
        assert report["passed"], (name, report)
    with torch.no_grad():
        want = generate(load_checkpoint(ck_dir).model, torch.tensor([PROMPT]), 16,
                        temperature=0)[0, 40:].tolist()
    for name in ("onnx", "opt", "gqa"):
        got = load(chain[name]).generate_ids([PROMPT], max_new_tokens=16)[0].token_ids
        assert got == want, name


def test_windowed_layers_keep_only_their_window(gemma):
    """The shared-cache graph gives the windowed layers buffers of window + slack tokens (12 +
    64 here), not the context: a batch's prompts (100 tokens) go through temporary buffers
    and keep their window, steps move each row's window to the front when its slack is used
    up, at its own length (one row idling meanwhile), chunked prefill by pieces longer and
    shorter than the slack and the engine's copies into its rows keep it too; each gives
    PyTorch's greedy tokens."""
    from tinyt.contract import WINDOW_INPUTS, compact_window_layers, window_slack
    from tinyt.runtime import load
    from tinyt.runtime.engine import Engine
    from tinyt.runtime.sampling import SamplingParams

    ck_dir, chain = gemma
    cfg = load_checkpoint(ck_dir).config
    assert compact_window_layers(cfg) == (0, 1) and window_slack(12) == 64
    model = load_checkpoint(ck_dir).model
    long, short = list(range(3, 103)), list(range(200, 230))

    def torch_greedy(prompt, n):
        with torch.no_grad():
            return generate(model, torch.tensor([prompt]), n,
                            temperature=0)[0, len(prompt):].tolist()
    want_long, want_short = torch_greedy(long, 90), torch_greedy(short, 90)
    lm = load(chain["gqa"], tune=False)
    assert WINDOW_INPUTS[0] in {i.name for i in lm.session.get_inputs()}
    cache = lm.new_cache(2, 512)
    assert [b.shape[2] for b in cache.kv] == [76, 76, 76, 76, 512, 512]
    steps = []
    orig_keep = cache._keep_window
    cache._keep_window = lambda b: (steps.append((b, int(cache.lens[b]))), orig_keep(b))[1]
    logits = cache.prefill([long, short], lm.pad_id)
    assert cache.wlens.tolist() == [12, 12] and cache.lens.tolist() == [100, 30]
    got, active = [[], []], np.ones(2, bool)
    nxt = logits[:, 0].argmax(-1)
    for i in range(90):
        for b in range(2):
            if active[b]:
                got[b].append(int(nxt[b]))
        if i == 40:
            active[1] = False  # the short row idles for ten steps, its window unchanged
        if i == 50:
            active[1] = True
        logits = cache.step(nxt, active.copy())
        # an idle row's logits are unspecified (its attention ran for no query): it resumes
        # with the token it had when it stopped
        nxt = np.where(active, logits[:, 0].argmax(-1), nxt)
    assert got[0] == want_long
    assert got[1] == want_short[:len(got[1])] and len(got[1]) == 80
    assert steps == [(0, 164), (1, 94)], steps  # 12 + 64 in the buffer: moved
    # one row: the B == 1 step, chunked prefill by pieces longer and shorter than the slack
    for pieces in ([long], [long[:70], long[70:]], [long[:5], long[5:]]):
        one = lm.new_cache(1, 256)
        one.clear()
        for piece in pieces:
            logits = one.extend(piece)
        out = []
        for _ in range(90):
            out.append(int(logits.argmax()))
            logits = one.step(np.array([out[-1]]), None)[0, 0]
        assert out == want_long, [len(p) for p in pieces]
    engine = Engine(lm, max_batch=2, max_queue=4, prefill_chunk=40).start()
    try:
        reqs = [engine.submit(p, SamplingParams(max_new_tokens=90, min_new_tokens=90,
                                                temperature=0)) for p in (long, short)]
        assert [r.out for r in reqs if r.wait(120)] == [want_long, want_short]
    finally:
        engine.stop()


@pytest.mark.slow
def test_longrope_graphs_switch_tables_and_the_runtime_recomputes_past_4096(tmp_path):
    """Phi-4-mini's form (LongRoPE from 4,096, 48 of 64 dims rotating) through every graph:
    the contract graphs choose the short or long frequencies per call, the shared-cache
    graph GroupQueryAttention's cos/sin tables by total_sequence_length; a generation from a
    prompt of 4,092 tokens crosses the original context, where the runtime makes the cache
    again at the long frequencies: PyTorch's greedy tokens from every fp32 graph, and the
    quantized pair runs through it. The engine, whose batch shares one table, is refused a
    context past 4,096 by name."""
    from tinyt.errors import ConfigError
    from tinyt.hf import import_hf
    from tinyt.runtime import load
    from tinyt.runtime.engine import Engine

    save_hf("phi4-mini", tmp_path / "hf")
    ck = import_hf(tmp_path / "hf", tmp_path / "ck", log=lambda s: None)
    chain = _chain(ck, tmp_path)
    gqa = [n for n in onnx.load(str(chain["gqa"] / ONNX_FILE)).graph.node
           if n.op_type == "GroupQueryAttention"]
    assert all(n.input[7] == "/rotary/cos_cache" for n in gqa)
    prompt = torch.randint(1, 318, (1, 4092), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        want = generate(load_checkpoint(ck).model, prompt, 10, temperature=0)[0, 4092:].tolist()
    for name in ("onnx", "opt", "gqa"):
        got = load(chain[name], tune=False).generate_ids(prompt.tolist(), max_new_tokens=10)
        assert got[0].token_ids == want, name
    pair = load(chain["int8-gqa"], tune=False).generate_ids(prompt.tolist(), max_new_tokens=10,
                                                            min_new_tokens=10)
    assert len(pair[0].token_ids) == 10
    with pytest.raises(ConfigError, match="context of at most 4096"):
        Engine(load(chain["gqa"], tune=False))
    Engine(load(chain["gqa"], tune=False, max_context=4096))  # not started: nothing to stop


@pytest.mark.slow
@pytest.mark.parametrize("model", ["every", "gemma", "phi4"])
def test_edge_and_browser_packages_take_every_option(model, request, tmp_path):
    """`--format ort` of the contract and shared-cache graphs (each checked against its source
    by the stage), and `--format web` checked under node with onnxruntime-web: the page's
    tokenizer ids and greedy tokens equal tinyt's (a window, q/k norms, a layer without
    rotary and the llama3 table are all inside the graph; Gemma's: two rotary tables, the
    capped attention, unfused in the contract graph and in GroupQueryAttention in the shared-
    cache one)."""
    import shutil

    from tinyt.export.package import package

    _, chain = request.getfixturevalue(model)
    for name in ("opt", "int8-gqa"):
        out = package(chain[name], tmp_path / f"ort-{name}", format="ort")
        assert (out / "model.ort").is_file()
    if shutil.which("node") is None:
        pytest.skip("node / onnxruntime-web missing: bash scripts/setup-web.sh")
    for name in ("opt", "int8-gqa"):  # the shared cache sized by the call, not 131,072
        web = package(chain[name], tmp_path / f"web-{name}", format="web")
        assert (web / "tinyt.mjs").is_file() and (web / "model.onnx").is_file()
        context = json.loads((web / "web.json").read_text())["context"]
        assert context == (4096 if model == "phi4" else 131072 if model == "every" else 32768)


@pytest.mark.slow
def test_a_window_longer_than_the_checks_is_crossed_by_them(tmp_path, monkeypatch):
    """Mistral's window (300 here, 4096 in the real model) is longer than check_tokens (128):
    verify and the shared-cache check each add one batch-1 case past it, so a graph that
    ignored the window fails the stage (a rewrite without local_window_size, forced here)."""
    from tinyt.errors import SharedCacheError
    from tinyt.export import export_onnx, verify
    from tinyt.export import gqa_graph as G
    from tinyt.export.optimize import optimize
    from tinyt.hf import import_hf

    save_hf("mistral", tmp_path / "hf", sliding_window=300)
    ck = import_hf(tmp_path / "hf", tmp_path / "ck", log=lambda s: None)
    onnx_dir = export_onnx(ck, tmp_path / "onnx")
    report = verify(ck, onnx_dir)
    assert report["passed"] and report["sizes"]["longest_sequence"] == 308, report["sizes"]
    opt = optimize(onnx_dir, tmp_path / "opt", target="cpu")
    attrs = G._attention_attrs
    monkeypatch.setattr(G, "_attention_attrs", lambda cfg, node, layer: {
        k: v for k, v in attrs(cfg, node, layer).items() if k != "local_window_size"})
    with pytest.raises(SharedCacheError, match="differ from its source's"):
        optimize(opt, tmp_path / "gqa", target="gqa")
    monkeypatch.setattr(G, "_attention_attrs", attrs)
    assert verify(ck, optimize(opt, tmp_path / "gqa", target="gqa"))["passed"]


@pytest.mark.parametrize("model", ["every", "gemma", pytest.param("phi4", marks=pytest.mark.slow)])
def test_serve_chats_through_the_models_template(model, request):
    """`tinyt serve` on the every-option, Gemma and Phi-4-mini shared-cache graphs (131,072 /
    32,768-token models, the server's default context of 4096 held: a LongRoPE model's
    longest): a chat request is rendered by the tokenizer's chat template and answered with
    the runtime's own greedy text for that prompt."""
    pytest.importorskip("starlette", reason="the serve extra is not installed")
    pytest.importorskip("openai", reason="the openai client (dev extra) is not installed")
    from live_server import Server

    from tinyt.runtime import load

    _, chain = request.getfixturevalue(model)
    lm = load(chain["gqa"], threads=1, tune=False)
    prompt = "<|im_start|>user\ndef f<|im_end|>\n<|im_start|>assistant\n"
    s = Server(chain["gqa"], "--max-batch", "2", "--api-key", "k")
    try:
        c = s.client("k")
        models = c.models.list().data
        assert [m.model_dump().get("max_model_len") for m in models] == [4096]
        r = c.chat.completions.create(model=models[0].id, max_tokens=6, temperature=0,
                                      messages=[{"role": "user", "content": "def f"}])
        assert r.choices[0].message.content == lm.generate(prompt, max_new_tokens=6)
    finally:
        assert s.stop() == 0


@pytest.mark.slow
def test_the_main_job_makes_every_variant_of_the_every_option_model(every, tmp_path):
    """`tinyt pipeline --skip-train` on the every-option checkpoint (saved by hand: no training
    metrics, which the report says as '?'): every variant, the static INT8, the int8-GEMM, the
    shared-cache pair and the rows graph among them, made and checked at 131,072 tokens."""
    from tinyt.app.pipeline import pipeline
    from tinyt.export.quantize import quantize

    ck, _ = every
    art = tmp_path / "art"
    pipeline(art, skip_train=ck, bench=False, log=lambda s: None)
    quantize(art / "onnx", art / "onnx-int8-static", mode="static")  # by hand: not the main job's
    # the int8-GEMM graph is made and checked either way; kept, or set aside beyond the budget
    qgemm = art / "onnx-int8-qgemm" if (art / "onnx-int8-qgemm").is_dir() else \
        art / "rejected" / "onnx-int8-qgemm"
    for sub in ("onnx", "onnx-opt", "onnx-int8", "onnx-int8-static", qgemm,
                "onnx-int8-gqa", "onnx-int8-rows-gqa"):
        assert check_manifest(tmp_path / "art" / sub)["stage"], sub
        assert read_model_config(tmp_path / "art" / sub)[0] == load_checkpoint(ck).config
    report = (tmp_path / "art" / "report.md").read_text()
    assert "? parameters" in report and "FAILED" not in report


@pytest.mark.slow
def test_qk_norms_with_equal_weights_still_reach_the_shared_cache_graph(tmp_path):
    """A fresh model's q and k norms are all ones: optimization keeps one initializer for
    them, so the rewrite finds each norm from its projection's Split, not by name (found at
    the Qwen3-0.6B shape, where the by-name lookup refused the INT8 graph)."""
    from tinyt.export import export_onnx, verify
    from tinyt.export.optimize import optimize

    cfg = ModelConfig(block_size=40960, vocab_size=320, n_layer=2, n_head=4, n_kv_head=2,
                      n_embd=64, head_size=32, qk_norm=True, norm="rmsnorm",
                      pos_encoding="rotary", activation="swiglu", bias=False)
    torch.manual_seed(0)
    ck = save_checkpoint(tmp_path / "ck", build_model(cfg), tokenizer())  # norms: ones
    opt = optimize(export_onnx(ck, tmp_path / "onnx"), tmp_path / "opt", target="cpu")
    assert verify(ck, optimize(opt, tmp_path / "gqa", target="gqa"))["passed"]
