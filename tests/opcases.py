"""Operator test cases shared by the kernel tests and the tuner tests: shapes and inputs."""

from __future__ import annotations

import numpy as np

import iron
from iron.operators import (AXPY, GEMM, GEMV, Attention, CacheWrite, ElementwiseAdd,
                            ElementwiseMul, Embedding, QKVRoPE, RMSNorm, RoPE, SiLU, Softmax,
                            SwiGLU)

BF16 = iron.bfloat16


class OneStep(iron.Graph):
    """A graph of a single step: ``cls.step(*inputs, **fields)``."""

    def __init__(self, cls, fields=None, device="cpu"):
        super().__init__(device)
        self.cls, self.fields = cls, dict(fields or {})

    def body(self, *inputs):
        return self.cls.step(*inputs, **self.fields)


def bf(rng, *shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(BF16)


def inv_freq(head_dim, theta=10000.0):
    return (1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)).astype(
        np.float32)


def case_inputs(name: str, shape: dict, rng) -> tuple[type, dict, list]:
    """(operator class, call fields, input arrays) for one named case at one shape."""
    s = shape
    if name in ("AXPY", "ElementwiseAdd", "ElementwiseMul"):
        cls = {"AXPY": AXPY, "ElementwiseAdd": ElementwiseAdd, "ElementwiseMul": ElementwiseMul}
        fields = {"scalar_factor": 1.5} if name == "AXPY" else {}
        return cls[name], fields, [bf(rng, *s["shape"]), bf(rng, *s["shape"])]
    if name == "SiLU":
        return SiLU, {}, [bf(rng, *s["shape"], scale=3)]
    if name == "SwiGLU":
        return SwiGLU, {}, [bf(rng, s["rows"], 2 * s["size"], scale=2)]
    if name == "RMSNorm":
        x = bf(rng, s["rows"], s["size"])
        w = [bf(rng, s["size"])] if s["weighted"] else []
        return RMSNorm, {"eps": 1e-5}, [x, *w]
    if name == "Softmax":
        return Softmax, {}, [bf(rng, s["rows"], s["size"], scale=3)]
    if name == "RoPE":
        pos = rng.integers(0, 4096, s["rows"]).astype(np.int32)
        return RoPE, {}, [bf(rng, s["rows"], s["heads"] * s["head_dim"]), pos,
                          inv_freq(s["head_dim"])]
    if name == "GEMV":
        x = bf(rng, s["K"]) if s["batches"] == 1 else bf(rng, s["batches"], s["K"])
        return GEMV, {}, [bf(rng, s["M"], s["K"], scale=0.1), x]
    if name == "GEMM":
        return GEMM, {}, [bf(rng, s["M"], s["K"]), bf(rng, s["N"], s["K"], scale=0.1)]
    if name == "Embedding":
        tokens = rng.integers(0, s["vocab"], s["rows"]).astype(np.int32)
        return Embedding, {}, [bf(rng, s["vocab"], s["dim"]), tokens]
    if name == "CacheWrite":
        cache = bf(rng, s["kv_heads"], s["ctx"], s["head_dim"])
        x = bf(rng, s["rows"], s["kv_heads"] * s["head_dim"])
        return CacheWrite, {}, [cache, x, np.arange(s["pos"], s["pos"] + s["rows"],
                                                    dtype=np.int32)]
    if name == "QKVRoPE":
        width = (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"]
        k, v = (bf(rng, s["kv_heads"], s["ctx"], s["head_dim"]) for _ in range(2))
        pos = np.arange(s["pos"], s["pos"] + s["rows"], dtype=np.int32)
        return QKVRoPE, {}, [bf(rng, s["rows"], width), pos, inv_freq(s["head_dim"]), k, v]
    if name == "Attention":
        q = bf(rng, s["rows"], s["heads"] * s["head_dim"])
        k, v = (bf(rng, s["kv_heads"], s["ctx"], s["head_dim"]) for _ in range(2))
        pos = np.arange(s["pos"], s["pos"] + s["rows"], dtype=np.int32)
        return Attention, {}, [q, k, v, pos]
    raise KeyError(name)


#: Shapes per operator: odd and minimum sizes, the Llama shapes of SmolLM2.
SHAPES = {
    "AXPY": [{"shape": (1,)}, {"shape": (7,)}, {"shape": (2048,)}, {"shape": (3, 576)}],
    "ElementwiseAdd": [{"shape": (1,)}, {"shape": (13,)}, {"shape": (576,)}],
    "ElementwiseMul": [{"shape": (5,)}, {"shape": (1536,)}],
    "SiLU": [{"shape": (1,)}, {"shape": (9,)}, {"shape": (1536,)}],
    "SwiGLU": [{"rows": 1, "size": 1}, {"rows": 3, "size": 7}, {"rows": 1, "size": 1536}],
    "RMSNorm": [{"rows": 1, "size": 1, "weighted": True}, {"rows": 5, "size": 7, "weighted": False},
                {"rows": 1, "size": 576, "weighted": True}, {"rows": 8, "size": 576,
                                                             "weighted": True}],
    "Softmax": [{"rows": 1, "size": 1}, {"rows": 3, "size": 37}, {"rows": 4, "size": 2048}],
    "RoPE": [{"rows": 1, "heads": 1, "head_dim": 2}, {"rows": 3, "heads": 9, "head_dim": 64},
             {"rows": 4, "heads": 3, "head_dim": 64}],
    "GEMV": [{"M": 1, "K": 1, "batches": 1}, {"M": 7, "K": 3, "batches": 1},
             {"M": 5, "K": 33, "batches": 3}, {"M": 576, "K": 576, "batches": 1},
             {"M": 192, "K": 1536, "batches": 2}],
    "GEMM": [{"M": 1, "K": 1, "N": 1}, {"M": 7, "K": 3, "N": 5}, {"M": 16, "K": 576, "N": 96},
             {"M": 32, "K": 64, "N": 48},
             {"M": 20, "K": 96, "N": 80},  # AMX hosts: a part-filled row tile, odd n tiles
             {"M": 32, "K": 80, "N": 96}],  # K % 32 != 0: the non-AMX kernel even on AMX hosts
    "Embedding": [{"vocab": 1, "dim": 1, "rows": 1}, {"vocab": 50, "dim": 7, "rows": 3},
                  {"vocab": 1000, "dim": 576, "rows": 4}],
    "CacheWrite": [{"kv_heads": 1, "ctx": 1, "head_dim": 1, "rows": 1, "pos": 0},
                   {"kv_heads": 3, "ctx": 64, "head_dim": 64, "rows": 1, "pos": 63},
                   {"kv_heads": 3, "ctx": 64, "head_dim": 64, "rows": 8, "pos": 60}],
    "QKVRoPE": [{"rows": 1, "heads": 1, "kv_heads": 1, "head_dim": 2, "ctx": 1, "pos": 0},
                {"rows": 1, "heads": 9, "kv_heads": 3, "head_dim": 64, "ctx": 64, "pos": 63},
                {"rows": 8, "heads": 4, "kv_heads": 2, "head_dim": 16, "ctx": 40, "pos": 36}],
    "Attention": [{"rows": 1, "heads": 1, "kv_heads": 1, "head_dim": 1, "ctx": 1, "pos": 0},
                  {"rows": 1, "heads": 9, "kv_heads": 3, "head_dim": 64, "ctx": 300, "pos": 0},
                  {"rows": 1, "heads": 9, "kv_heads": 3, "head_dim": 64, "ctx": 300, "pos": 299},
                  {"rows": 5, "heads": 4, "kv_heads": 2, "head_dim": 16, "ctx": 40, "pos": 3},
                  {"rows": 8, "heads": 9, "kv_heads": 3, "head_dim": 64, "ctx": 64, "pos": 56}],
}

#: The shape of each operator whose every legal tunable setting is run.
SWEEP = {
    "AXPY": {"shape": (2048,)}, "ElementwiseAdd": {"shape": (576,)},
    "ElementwiseMul": {"shape": (1536,)}, "SiLU": {"shape": (1536,)},
    "SwiGLU": {"rows": 1, "size": 1536},
    "RMSNorm": {"rows": 8, "size": 576, "weighted": True}, "Softmax": {"rows": 4, "size": 2048},
    "RoPE": {"rows": 4, "heads": 3, "head_dim": 64}, "GEMV": {"M": 576, "K": 576, "batches": 1},
    "GEMM": {"M": 32, "K": 64, "N": 48},
    "Embedding": {"vocab": 1000, "dim": 576, "rows": 4},
    "CacheWrite": {"kv_heads": 3, "ctx": 64, "head_dim": 64, "rows": 8, "pos": 60},
    "Attention": {"rows": 1, "heads": 9, "kv_heads": 3, "head_dim": 64, "ctx": 300, "pos": 299},
    "QKVRoPE": {"rows": 8, "heads": 4, "kv_heads": 2, "head_dim": 16, "ctx": 40, "pos": 36},
}

from iron.tuning.check import (ELEMENTWISE_TOLERANCE, TOLERANCE, assert_close,  # noqa: F401
                                bf16_ulp)
