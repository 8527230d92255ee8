"""Weights of a Llama-family model, one tensor at a time, from a transformers model object or
from a checkpoint directory of safetensors shards (read lazily, so peak memory stays near the
size of the converted weights)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..errors import CuvilError


class TensorSource:
    """get(name) -> the whole tensor as float32; rows(name, start, stop) -> a slice of its first axis
    (read alone: a 128k-vocabulary head converts in blocks without its 2 GiB fp32 copy)."""

    def __init__(self, get, names, rows, shape):
        self._get, self._rows, self._shape = get, rows, shape
        self.names = set(names)
        self._stacks = {}            # joined name -> the tensors stacked along the first axis

    def stacked(self, names) -> str:
        """The first-axis concatenation of `names` as one more tensor, read part by part like the
        others; returns its name. Projections that read the same input (q, k and v; gate and up)
        become one GEMM: a decode step then streams them in one pass over the threads, where three
        small ones each ended on a thread waiting for the other's last chunk."""
        for n in names:
            self._check(n)
        name = "+".join(names)
        self._stacks[name] = list(names)
        self.names.add(name)
        return name

    def __contains__(self, name):
        return name in self.names

    def get(self, name) -> np.ndarray:
        self._check(name)
        if name in self._stacks:
            return np.concatenate([self._get(n) for n in self._stacks[name]])
        return self._get(name)

    def rows(self, name, start, stop) -> np.ndarray:
        self._check(name)
        if name not in self._stacks:
            return self._rows(name, start, stop)
        parts, base = [], 0
        for n in self._stacks[name]:
            count = self._shape(n)[0]
            lo, hi = max(start - base, 0), min(stop - base, count)
            if lo < hi:
                parts.append(self._rows(n, lo, hi))
            base += count
        return np.concatenate(parts)

    def shape(self, name) -> tuple:
        self._check(name)
        if name in self._stacks:
            shapes = [self._shape(n) for n in self._stacks[name]]
            return (sum(s[0] for s in shapes), *shapes[0][1:])
        return self._shape(name)

    def _check(self, name):
        if name not in self.names:
            raise CuvilError(f"checkpoint has no tensor {name!r}")


def from_model(model) -> TensorSource:
    sd = model.state_dict()
    return TensorSource(lambda n: sd[n].detach().float().cpu().numpy(), sd.keys(),
                        lambda n, a, b: sd[n][a:b].detach().float().cpu().numpy(), lambda n: tuple(sd[n].shape))


def from_directory(path) -> TensorSource:
    path = Path(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CuvilError(f"{path} has no .safetensors files (cuvil.llm reads safetensors checkpoints)")
    from safetensors import safe_open
    where = {}
    index = path / "model.safetensors.index.json"
    if index.exists():
        for name, fname in json.loads(index.read_text())["weight_map"].items():
            where[name] = path / fname
    else:
        for f in files:
            with safe_open(str(f), framework="np") as h:
                for name in h.keys():
                    where[name] = f
    import torch

    # the shard is mapped only while one tensor is read: a mapped file's touched pages count as
    # resident, so keeping it open would hold the whole checkpoint in RSS while converting
    def get(name):
        with safe_open(str(where[name]), framework="pt") as h:      # "pt" reads bf16 too
            return h.get_tensor(name).to(torch.float32, copy=True).numpy()     # not a view of the map

    def rows(name, a, b):
        with safe_open(str(where[name]), framework="pt") as h:
            return h.get_slice(name)[a:b].to(torch.float32, copy=True).numpy()

    def shape(name):
        with safe_open(str(where[name]), framework="pt") as h:
            return tuple(h.get_slice(name).get_shape())
    return TensorSource(get, where.keys(), rows, shape)
