"""Our row-by-row attention over the KV cache (``attention_x86.c``, AVX-512 or AVX2 build),
built by ``build.py``.

``select.Kernels`` loads it (``load``) or leaves attention to torch's SDPA; both builds
give the same bits. The functions here take the loaded library (``lib``) as their first
argument: the model holds the one it was built with.
Used for bfloat16 models only: that is where SDPA's kernels round a verify round's
queries differently from a decode step's (float32 models keep SDPA, whose differences
stay below what greedy decoding can see in the tests).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import NamedTuple

import torch

from speclane.kernels import build, plan_cpu

SOURCE = Path(__file__).with_name("attention_x86.c")
ISAS = ("avx512", "avx2")  # the builds of SOURCE, widest first
MAX_HEAD_DIM = 256  # the C file's MAX_HEAD_DIM
BLOCK = 32  # the C file's BLOCK: head_dim must be a multiple


def declare(lib: ctypes.CDLL) -> None:
    pointer, integer = ctypes.c_void_p, ctypes.c_int
    lib.attention.argtypes = [pointer] * 6 + [integer] * 5 + [ctypes.c_float, integer, ctypes.c_float]
    lib.attention.restype = None
    lib.rope_write_attention.argtypes = [pointer] * 9 + [integer] * 5 + [ctypes.c_float, integer, ctypes.c_float]
    lib.rope_write_attention.restype = None
    lib.paged_attention.argtypes = ([pointer] * 4 + [integer] + [pointer] * 6 + [integer] * 5
                                    + [ctypes.c_float, integer, ctypes.c_float])
    lib.paged_attention.restype = None
    lib.paged_rope_write_attention.argtypes = ([pointer] * 6 + [integer] + [pointer] * 7 + [integer] * 5
                                               + [ctypes.c_float, integer, ctypes.c_float])
    lib.paged_rope_write_attention.restype = None


def load(isa: str | None = None) -> build.Kernel:
    """The ``isa`` build (or the widest at or below it), else the widest this CPU runs;
    KernelUnavailable where it cannot be built or run here."""
    return build.load(SOURCE, declare, ISAS, isa)


def source_digest() -> str:
    return build.digest(SOURCE)


def supports(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int) -> bool:
    """Whether ours computes this model's attention (a loaded build runs every shape it supports)."""
    shape_ok = head_dim % BLOCK == 0 and head_dim <= MAX_HEAD_DIM and num_heads % num_kv_heads == 0
    return dtype == torch.bfloat16 and shape_ok


def attention(lib: ctypes.CDLL, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, row_slot: torch.Tensor,
              row_len: torch.Tensor, scale: float, *, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """q [T, heads, d] bfloat16; one layer's caches [slots, kv_heads, max_len, d] (already
    holding this forward's keys and values); row_slot, row_len [T] int32: each query's
    cache slot and its length (position + 1). A query sees the keys of positions
    ``[len - window, len)`` with a ``window`` (a sliding-window layer), else ``[0, len)``;
    ``softcap`` > 0 caps its scores as ``softcap * tanh(score / softcap)`` (Gemma 2).
    -> [T, heads * d] bfloat16."""
    q = q.contiguous()
    rows, heads, head_dim = q.shape
    _, kv_heads, max_len, _ = k_cache.shape
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("attention: the layer's cache tensors must be contiguous")
    if {q.dtype, k_cache.dtype, v_cache.dtype} != {torch.bfloat16}:
        raise ValueError("attention: bfloat16 queries and caches only")
    if row_slot.dtype != torch.int32 or row_len.dtype != torch.int32 or rows not in (row_slot.numel(), row_len.numel()) or row_slot.numel() != row_len.numel():
        raise ValueError("attention: row_slot and row_len must be int32, one per query row")
    out = torch.empty(rows, heads * head_dim, dtype=torch.bfloat16)
    lib.attention(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), row_slot.data_ptr(),
                  row_len.data_ptr(), out.data_ptr(), rows, heads, kv_heads, head_dim, max_len, scale, window, softcap)
    return out


def rope_write_attention(lib: ctypes.CDLL, qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, row_slot: torch.Tensor, row_len: torch.Tensor, num_heads: int,
                         scale: float, q_scratch: torch.Tensor, *, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """One layer's RoPE, cache write and attention in one call, from the fused projection.

    qkv [T, (heads + 2 kv_heads) * d] bfloat16 (query, key, value heads); cos, signed_sin
    [positions, d] bfloat16 tables (llama.py's, rotate-half layout); the caller has checked
    every row's position (row_len - 1) against the tables and the cache. Writes the rotated
    keys and the values at each row's position, returns the attention [T, heads * d] as
    ``attention`` computes it (``window``, ``softcap``); q_scratch [T, heads, d] bfloat16
    receives the rotated queries.
    """
    rows, width = qkv.shape
    _, kv_heads, max_len, head_dim = k_cache.shape
    if width != (num_heads + 2 * kv_heads) * head_dim or not qkv.is_contiguous():
        raise ValueError(f"rope_write_attention: qkv must be contiguous [T, {(num_heads + 2 * kv_heads) * head_dim}]")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and cos.is_contiguous() and signed_sin.is_contiguous()):
        raise ValueError("rope_write_attention: caches and rotation tables must be contiguous")
    if {qkv.dtype, cos.dtype, signed_sin.dtype, k_cache.dtype, v_cache.dtype, q_scratch.dtype} != {torch.bfloat16}:
        raise ValueError("rope_write_attention: bfloat16 tensors only")
    if q_scratch.shape != (rows, num_heads, head_dim) or row_slot.numel() != rows or row_len.numel() != rows:
        raise ValueError("rope_write_attention: one row_slot, row_len and q_scratch row per qkv row")
    out = torch.empty(rows, num_heads * head_dim, dtype=torch.bfloat16)
    lib.rope_write_attention(qkv.data_ptr(), cos.data_ptr(), signed_sin.data_ptr(), k_cache.data_ptr(),
                             v_cache.data_ptr(), row_slot.data_ptr(), row_len.data_ptr(), q_scratch.data_ptr(),
                             out.data_ptr(), rows, num_heads, kv_heads, head_dim, max_len, scale, window, softcap)
    return out


class TreeRows(NamedTuple):
    """A forward's draft-tree rows for the paged kernels (the C file's ``tree_rows``): row t
    is at RoPE position ``pos[t]`` and sees, after ``[0, row_len[t])``, the cache positions
    ``extra[extra_start[t]:extra_start[t + 1]]`` (its tree ancestors, then its own, where
    its key and value go). int32, contiguous: pos [T], extra_start [T + 1], extra [E]."""

    pos: torch.Tensor
    extra_start: torch.Tensor
    extra: torch.Tensor


def _tree_pointers(tree: TreeRows | None, rows: int) -> tuple[int | None, int | None, int | None]:
    if tree is None:
        return None, None, None
    if any(t.dtype != torch.int32 or not t.is_contiguous() for t in tree):
        raise ValueError("paged attention: tree rows must be contiguous int32 tensors")
    if tree.pos.numel() != rows or tree.extra_start.numel() != rows + 1 or int(tree.extra_start[-1]) != tree.extra.numel():
        raise ValueError("paged attention: tree rows need one pos per row, rows + 1 extra_start and every extra")
    return tree.pos.data_ptr(), tree.extra_start.data_ptr(), tree.extra.data_ptr()


def _check_paged(k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor, row_seq: torch.Tensor,
                 row_len: torch.Tensor, rows: int) -> None:
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()) or k_cache.shape != v_cache.shape:
        raise ValueError("paged attention: the layer's key and value blocks must be contiguous and alike")
    if tables.dtype != torch.int32 or tables.dim() != 2 or not tables.is_contiguous():
        raise ValueError("paged attention: tables must be a contiguous int32 [sequences, width] tensor")
    if row_seq.dtype != torch.int32 or row_len.dtype != torch.int32 or row_seq.numel() != rows or row_len.numel() != rows:
        raise ValueError("paged attention: row_seq and row_len must be int32, one per query row")


def paged_attention(lib: ctypes.CDLL, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    tables: torch.Tensor, row_seq: torch.Tensor, row_len: torch.Tensor, scale: float, *,
                    window: int = 0, softcap: float = 0.0, tree: TreeRows | None = None) -> torch.Tensor:
    """``attention`` over a paged cache: one layer's blocks [blocks, kv_heads, block_size, d];
    tables [sequences, width] int32, each sequence's block table (position p in block
    ``table[p // block_size]``, offset ``p % block_size``); row_seq [T] int32, each query's
    sequence; row_len [T] int32, its length (at most width * block_size); ``window`` and
    ``softcap`` as ``attention`` takes them; ``tree``: draft-tree rows (``TreeRows``). A
    position's result does not depend on which blocks hold the keys."""
    q = q.contiguous()
    rows, heads, head_dim = q.shape
    _, kv_heads, block_size, _ = k_cache.shape
    _check_paged(k_cache, v_cache, tables, row_seq, row_len, rows)
    if {q.dtype, k_cache.dtype, v_cache.dtype} != {torch.bfloat16}:
        raise ValueError("paged attention: bfloat16 queries and caches only")
    out = torch.empty(rows, heads * head_dim, dtype=torch.bfloat16)
    lib.paged_attention(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), tables.data_ptr(), tables.shape[1],
                        row_seq.data_ptr(), row_len.data_ptr(), *_tree_pointers(tree, rows), out.data_ptr(), rows, heads,
                        kv_heads, head_dim, block_size, scale, window, softcap)
    return out


# A paged_rope_write_attention step's columns in a forward plan's table (column 0 is the
# function): the arguments a plan fills in before each run, the rest fixed when it is built.
ROPE_ATTENTION_COLUMNS = {"cos": 2, "signed_sin": 3, "k_cache": 4, "v_cache": 5, "tables": 6, "table_width": 7,
                          "row_seq": 8, "row_len": 9, "row_pos": 10, "extra_start": 11, "extra": 12, "block_size": 19}


def paged_rope_write_attention_row(lib: ctypes.CDLL, qkv: int, q_scratch: int, out: int, rows: int, num_heads: int,
                                   num_kv_heads: int, head_dim: int, scale: float, window: int, softcap: float
                                   ) -> list[int]:
    """``paged_rope_write_attention`` as a forward plan's step (``plan_cpu``), with zeros in the
    ``ROPE_ATTENTION_COLUMNS`` a plan fills in per forward."""
    row = [plan_cpu.address(lib, "paged_rope_write_attention_op"), qkv, *[0] * 11, q_scratch, out, rows, num_heads,
           num_kv_heads, head_dim, 0, plan_cpu.float_bits(scale), window, plan_cpu.float_bits(softcap)]
    assert len(row) == 23
    return row


def paged_rope_write_attention(lib: ctypes.CDLL, qkv: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor,
                               k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor, row_seq: torch.Tensor,
                               row_len: torch.Tensor, num_heads: int, scale: float,
                               q_scratch: torch.Tensor, *, window: int = 0, softcap: float = 0.0,
                               tree: TreeRows | None = None) -> torch.Tensor:
    """``rope_write_attention`` over a paged cache (tables and row_seq as in
    ``paged_attention``): each row's rotated key and value go to its position's block and
    offset (a tree row: rotated at ``tree.pos``, written at its last extra position);
    ``window`` and ``softcap`` as ``attention`` takes them; the caller has checked every
    position against the rope tables and the row's table."""
    rows, width = qkv.shape
    _, kv_heads, block_size, head_dim = k_cache.shape
    if width != (num_heads + 2 * kv_heads) * head_dim or not qkv.is_contiguous():
        raise ValueError(f"rope_write_attention: qkv must be contiguous [T, {(num_heads + 2 * kv_heads) * head_dim}]")
    _check_paged(k_cache, v_cache, tables, row_seq, row_len, rows)
    if not (cos.is_contiguous() and signed_sin.is_contiguous()):
        raise ValueError("rope_write_attention: rotation tables must be contiguous")
    if {qkv.dtype, cos.dtype, signed_sin.dtype, k_cache.dtype, v_cache.dtype, q_scratch.dtype} != {torch.bfloat16}:
        raise ValueError("rope_write_attention: bfloat16 tensors only")
    if q_scratch.shape != (rows, num_heads, head_dim):
        raise ValueError("rope_write_attention: one q_scratch row per qkv row")
    out = torch.empty(rows, num_heads * head_dim, dtype=torch.bfloat16)
    lib.paged_rope_write_attention(qkv.data_ptr(), cos.data_ptr(), signed_sin.data_ptr(), k_cache.data_ptr(),
                                   v_cache.data_ptr(), tables.data_ptr(), tables.shape[1], row_seq.data_ptr(),
                                   row_len.data_ptr(), *_tree_pointers(tree, rows), q_scratch.data_ptr(), out.data_ptr(),
                                   rows, num_heads, kv_heads, head_dim, block_size, scale, window, softcap)
    return out
