"""`python tests/ddp_worker.py GRADS.safetensors train ...`: the `tinyt` CLI, as a user runs it
(alone or under torchrun), that also saves on rank 0 the gradients of the first step, before
clipping (a clip to norm 1 would hide a gradient scaled by the wrong factor), in float64.

For tests/core/test_ddp.py: the first step is the one both runs take from the same weights, so its
gradients are what data parallelism promises to reproduce.
"""
import os
import sys

import torch
from safetensors.torch import save_file

import tinyt.train as T

path, argv = sys.argv[1], sys.argv[2:]
models: list[torch.nn.Module] = []
_build, _clip = T.build_model, torch.nn.utils.clip_grad_norm_


def build_model(cfg):
    models.append(_build(cfg))
    return models[-1]


def clip_grad_norm_(parameters, *args, **kwargs):
    if int(os.environ.get("RANK", "0")) == 0 and not os.path.exists(path):
        save_file({n: p.grad.detach().to(torch.float64).contiguous()
                   for n, p in models[0].named_parameters() if p.grad is not None}, path)
    return _clip(parameters, *args, **kwargs)


T.build_model = build_model
torch.nn.utils.clip_grad_norm_ = clip_grad_norm_
sys.argv = ["tinyt", *argv]
from tinyt.__main__ import entry  # noqa: E402

entry()
