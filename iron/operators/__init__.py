"""Every operator iron knows, importable from one place."""

from .elementwise import AXPY, SiLU, Elementwise, ElementwiseAdd, ElementwiseMul
from .llm import Attention, CacheWrite, Concat, Embedding, QKVRoPE, SlotAttention, SlotQKVRoPE
from .matrix import GEMM, GEMV
from .rowwise import RMSNorm, RoPE, RowWise, Softmax, SwiGLU

__all__ = ["AXPY", "Attention", "CacheWrite", "Concat", "Elementwise", "ElementwiseAdd",
           "ElementwiseMul", "Embedding", "GEMM", "GEMV", "QKVRoPE", "RMSNorm", "RoPE", "RowWise", "SiLU",
           "SlotAttention", "SlotQKVRoPE", "Softmax", "SwiGLU"]
