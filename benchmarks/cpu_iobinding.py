"""Does ONNX Runtime I/O binding speed up the CPU decode loop? (Evidence for the runtime's
design: it measured no gain here, so tinyt.runtime feeds numpy arrays.)

Greedy decode of 100 tokens after a 20-token prompt, plain run() vs run_with_iobinding() with
ORT-allocated outputs fed back as the next step's past, interleaved, 15 rounds, medians:

    .venv/bin/python benchmarks/cpu_iobinding.py artifacts/onnx-int8
"""
import sys
import time, numpy as np, onnxruntime as ort, statistics
from tinyt.manifest import read_model_config
from tinyt.runtime.feeds import prefill_feeds, step_feeds
d = sys.argv[1] if len(sys.argv) > 1 else "artifacts/onnx-int8"
cfg,_ = read_model_config(d)
o = ort.SessionOptions(); o.intra_op_num_threads=2; o.add_session_config_entry("session.intra_op.allow_spinning","0"); o.enable_mem_pattern=False
s = ort.InferenceSession(f"{d}/model.onnx", o, providers=["CPUExecutionProvider"])
names = [x.name for x in s.get_outputs()]
prompt = np.arange(1, 21, dtype=np.int64)[None]
N = 100
def plain():
    feeds = prefill_feeds(cfg, "decoder_with_past", prompt)
    for _ in range(N):
        outs = s.run(names, feeds); nxt = outs[0][:, -1].argmax(-1)
        feeds = step_feeds("decoder_with_past", feeds, nxt, names, outs)
def bound():
    feeds = prefill_feeds(cfg, "decoder_with_past", prompt)
    b = s.io_binding()
    for k, v in feeds.items(): b.bind_cpu_input(k, v)
    mask = feeds["attention_mask"]
    for _ in range(N):
        for n in names: b.bind_output(n, "cpu")
        s.run_with_iobinding(b)
        outs = b.get_outputs()
        nxt = outs[0].numpy()[:, -1].argmax(-1)
        mask = np.concatenate([mask, np.ones((1, 1), np.int64)], 1)
        b.bind_cpu_input("input_ids", nxt[:, None].astype(np.int64)); b.bind_cpu_input("attention_mask", mask)
        b.bind_cpu_input("position_ids", np.array([[mask.shape[1] - 1]], np.int64))
        for n, v in zip(names[1:], outs[1:]): b.bind_ortvalue_input(n.replace("present", "past_key_values"), v)
t = {"plain": [], "iobinding": []}
for _ in range(15):
    for k, f in (("plain", plain), ("iobinding", bound)):
        a = time.perf_counter(); f(); t[k].append(time.perf_counter() - a)
print({k: f"{1e3*statistics.median(v)/N:.3f} ms/token" for k, v in t.items()})
