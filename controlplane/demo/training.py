"""A small real training run for the demo: a two-layer network trained with Adam on a
noisy teacher-student task, saved in safetensors layout at every step (bf16 weights in
one file, fp32 master weights and both Adam moments in another), as a large-model job
writes its checkpoints. numpy only; deterministic from its seed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


def bf16_bits(a: Any) -> Any:
    """fp32 → bf16 bit patterns with round-to-nearest-even (what frameworks store)."""
    u = np.asarray(a, dtype=np.float32).view(np.uint32)
    out = ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
    out[np.isnan(a)] = 0x7FC0
    return out


def save_safetensors(path: Path, tensors: dict[str, tuple[str, Any]]) -> int:
    """Write `tensors` (name → (dtype, array)) as a safetensors file; its size."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset, blobs = 0, []
    for name, (dtype, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        offset += len(raw)
        blobs.append(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the format's alignment of the data
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for raw in blobs:
            f.write(raw)
    tmp.replace(path)
    return 8 + len(text) + offset


def checkpoints(
    folder: Path, *, steps: int, width: int, seed: int = 7, every: int = 1
) -> Iterator[tuple[int, list[Path]]]:
    """Train for `steps` optimizer steps and yield (step, [weights, optimizer]) every
    `every` steps. Weights start near N(0, 0.02), the learning rate is 3e-4 and the
    minibatch is small, so the gradient is mostly noise, as in pretraining: every weight
    moves a little at every step and no block of a checkpoint repeats."""
    rng = np.random.default_rng(seed)
    dims = [(width, width), (width, width // 4)]
    params = {}
    for i, (a, b) in enumerate(dims):
        params[f"layer{i}.weight"] = rng.normal(0, 0.02, (a, b)).astype(np.float32)
        params[f"layer{i}.bias"] = np.zeros(b, np.float32)
    teacher = [rng.normal(0, 1 / np.sqrt(a), (a, b)).astype(np.float32) for a, b in dims]
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(x) for k, x in params.items()}
    lr, b1, b2, eps, batch = 3e-4, 0.9, 0.999, 1e-8, 8
    folder.mkdir(parents=True, exist_ok=True)
    for t in range(1, steps + 1):
        x = rng.normal(0, 1, (batch, width)).astype(np.float32)
        y = np.maximum(x @ teacher[0], 0) @ teacher[1]
        y += rng.normal(0, 1.0, y.shape).astype(np.float32)
        h = np.maximum(x @ params["layer0.weight"] + params["layer0.bias"], 0)
        out = h @ params["layer1.weight"] + params["layer1.bias"]
        g = (out - y) / batch
        grads = {"layer1.weight": h.T @ g, "layer1.bias": g.sum(0)}
        g = (g @ params["layer1.weight"].T) * (h > 0)
        grads["layer0.weight"], grads["layer0.bias"] = x.T @ g, g.sum(0)
        for k in params:
            m[k] = b1 * m[k] + (1 - b1) * grads[k]
            v[k] = b2 * v[k] + (1 - b2) * grads[k] ** 2
            params[k] -= lr * (m[k] / (1 - b1**t)) / (np.sqrt(v[k] / (1 - b2**t)) + eps)
        if t % every:
            continue
        step_dir = folder / f"step-{t:04d}"
        step_dir.mkdir(exist_ok=True)
        weights, optim = step_dir / "model.safetensors", step_dir / "optimizer.safetensors"
        save_safetensors(weights, {k: ("BF16", bf16_bits(p)) for k, p in params.items()})
        state: dict[str, tuple[str, Any]] = {}
        for k, p in params.items():
            state[f"{k}.master"] = ("F32", p)
            state[f"{k}.exp_avg"] = ("F32", m[k])
            state[f"{k}.exp_avg_sq"] = ("F32", v[k])
        save_safetensors(optim, state)
        yield t, [weights, optim]
