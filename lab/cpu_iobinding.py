"""Does ONNX Runtime I/O binding speed up the CPU decode loop? (Evidence for the runtime's
design: it measured no gain here, so tinyt.runtime feeds numpy arrays.)

Greedy decode of 100 tokens after a 20-token prompt (both capped by the model's block_size),
plain run() vs run_with_iobinding() with ORT-allocated outputs fed back as the next step's
past, interleaved, 15 rounds, medians:

    .venv/bin/python -m lab.cpu_iobinding artifacts/onnx-int8
"""
import statistics
import sys
import time

import numpy as np
import onnxruntime as ort

from tinyt.contract import DECODER_WITH_PAST
from tinyt.manifest import read_model_config
from tinyt.runtime.feeds import grow_mask, prefill_feeds, step_feeds

KIND = DECODER_WITH_PAST


def main(path: str) -> None:
    cfg, _ = read_model_config(path)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.enable_mem_pattern = False
    sess = ort.InferenceSession(f"{path}/model.onnx", opts, providers=["CPUExecutionProvider"])
    names = [x.name for x in sess.get_outputs()]
    prompt_len = min(20, cfg.block_size // 2)
    prompt = np.arange(1, prompt_len + 1, dtype=np.int64)[None]
    N = min(100, cfg.block_size - prompt_len)  # decode steps; the last one fills the context

    def plain():
        feeds = prefill_feeds(cfg, KIND, prompt)
        for _ in range(N):
            outs = sess.run(names, feeds)
            feeds = step_feeds(KIND, feeds, outs[0][:, -1].argmax(-1), names, outs)

    def bound():
        feeds = prefill_feeds(cfg, KIND, prompt)
        binding = sess.io_binding()
        for k, v in feeds.items():
            binding.bind_cpu_input(k, v)
        mask = feeds["attention_mask"]
        for _ in range(N):
            for n in names:
                binding.bind_output(n, "cpu")
            sess.run_with_iobinding(binding)
            outs = binding.get_outputs()
            nxt = outs[0].numpy()[:, -1].argmax(-1)
            mask = grow_mask(mask)
            binding.bind_cpu_input("input_ids", nxt[:, None].astype(np.int64))
            binding.bind_cpu_input("attention_mask", mask)
            binding.bind_cpu_input("position_ids", np.array([[mask.shape[1] - 1]], np.int64))
            for n, v in zip(names[1:], outs[1:]):
                binding.bind_ortvalue_input(n.replace("present", "past_key_values"), v)

    times = {"plain": [], "iobinding": []}
    for _ in range(15):
        for k, f in (("plain", plain), ("iobinding", bound)):
            start = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - start)
    print({k: f"{1e3 * statistics.median(v) / N:.3f} ms/token" for k, v in times.items()})


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "artifacts/onnx-int8")
