"""A forward's layers as one C call: the plan of one row count.

Why: a one-token step of the default model calls 8 kernels a layer, 240 in all, and on a
2-core CPU each call's Python and ctypes around it (the wrapper, its checks, an output
tensor) cost about as much as a norm's or an attention's work. A plan makes those calls
from C (``kernels/plan.c``), in the order and on the kernels ``LlamaModel.forward``'s layer
loop uses, so a row's bits are the loop's (a test compares them).

A plan holds a table of steps ([steps, STRIDE] int64, ``kernels/op.h``'s convention) over
activation buffers of its own sized for its row count: per layer, add + RMSNorm, the q/k/v
projection (with Qwen3's and Gemma 3's q and k head norms), RoPE + cache write +
attention, the output projection (with Gemma's norm of it), add + RMSNorm, gate/up, SiLU
or GELU * up, down (with Gemma's norm of it); then the model's final add + RMSNorm. What changes between
forwards (the cache's blocks, the block tables, each row's sequence and length, the rope
tables, draft-tree rows) is written into the attention steps' columns before each run,
and the final norm writes a fresh tensor each run: the hidden states come back as the
Python loop returns them.

A model (``LlamaModel``) runs plans where every layer is our kernels' (``LlamaModel.plan_blocker`` says
why not otherwise: torch's kernels, a bias): the Python loop stays the reference and the
fallback, and it calls the same C functions (``norm_cpu.LayerOps``), so the bits agree.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from speclane.kernels import attention_cpu, norm_cpu

if TYPE_CHECKING:
    from speclane.models.kv_cache import KVCache

STRIDE = 23  # a step's function and up to 22 arguments (the attention step's)
MAX_ROWS = 64  # larger forwards (prefill chunks) run the Python loop: its overhead is small beside them
# Row counts whose plans a model keeps (decode, verify rounds, batch widths). 16 streams
# ending one by one, with their drafts beside them, passed through more than 8 widths a batch
# and rebuilt plans in every batch; a plan's buffers are ~18 KB a row (the default model).
KEPT_PLANS = 24
COLUMNS = attention_cpu.ROPE_ATTENTION_COLUMNS


class ForwardPlan:
    """A model's ``layers`` (``llama.Layer``, of ``config``, attention ``scale``) on ``rows``
    rows as one table of kernel calls."""

    def __init__(self, layers: Sequence, config, scale: float, final_norm: torch.Tensor, rows: int, runner, norm_library,
                 attention_library):
        cfg = config
        hidden, heads, kv_heads, d = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        bf16 = torch.bfloat16
        self.rows = rows
        self.runner = runner
        self.runs = 0  # forwards run (tests and logs: whether a forward took the plan)
        self.x = torch.empty(rows, hidden, dtype=torch.float32)  # the residual stream
        self.h = torch.empty(rows, hidden, dtype=bf16)  # a norm's output
        self.qkv = torch.empty(rows, (heads + 2 * kv_heads) * d, dtype=bf16)
        self.q = torch.empty(rows, heads, d, dtype=bf16)  # the rotated queries
        self.attention = torch.empty(rows, heads * d, dtype=bf16)
        self.a = torch.empty(rows, hidden, dtype=bf16)  # the attention's projected output
        self.gate_up = torch.empty(rows, 2 * cfg.intermediate_size, dtype=bf16)
        self.act = torch.empty(rows, cfg.intermediate_size, dtype=bf16)
        self.branch = torch.empty(rows, hidden, dtype=bf16)  # a layer's MLP output
        ptr = {name: getattr(self, name).data_ptr() for name in ("x", "h", "qkv", "q", "attention", "a", "gate_up", "act", "branch")}
        steps: list[list[int]] = []
        attention_steps = []
        self._scratch: list[torch.Tensor] = []  # what the linears' steps write besides the buffers above

        def linear_steps(linear, x: int, y: int) -> None:
            added = linear.op_steps(x, y, rows, self._scratch)
            if added is None:
                raise ValueError("a forward plan needs every layer's linears on our kernels")
            steps.extend(added)

        for i, layer in enumerate(layers):
            steps.append(norm_cpu.add_rms_norm_row(norm_library, ptr["x"], ptr["branch"] if i else 0,
                                                   layer.attn_norm.data_ptr(), ptr["h"], rows, hidden, layer.eps))
            linear_steps(layer.qkv, ptr["h"], ptr["qkv"])
            for start, count, width, weight in layer.qk_norm_groups:  # in place, as the loop's
                steps.append(norm_cpu.rms_norm_groups_row(norm_library, ptr["qkv"] + 2 * start, rows, self.qkv.shape[1],
                                                          count, width, weight.data_ptr(), layer.eps))
            attention_steps.append(len(steps))
            steps.append(attention_cpu.paged_rope_write_attention_row(
                attention_library, ptr["qkv"], ptr["q"], ptr["attention"], rows, heads, kv_heads, d, scale,
                layer.window, cfg.traits.attn_softcap))
            linear_steps(layer.o, ptr["attention"], ptr["a"])
            if layer.attn_out_norm is not None:
                steps.append(norm_cpu.rms_norm_groups_row(norm_library, ptr["a"], rows, hidden, 1, hidden,
                                                          layer.attn_out_norm.data_ptr(), layer.eps))
            steps.append(norm_cpu.add_rms_norm_row(norm_library, ptr["x"], ptr["a"], layer.mlp_norm.data_ptr(), ptr["h"],
                                                   rows, hidden, layer.eps))
            linear_steps(layer.gate_up, ptr["h"], ptr["gate_up"])
            steps.append(norm_cpu.gated_activation_row(norm_library, cfg.traits.activation, ptr["gate_up"], ptr["act"], rows,
                                                        cfg.intermediate_size))
            linear_steps(layer.down, ptr["act"], ptr["branch"])
            if layer.mlp_out_norm is not None:
                steps.append(norm_cpu.rms_norm_groups_row(norm_library, ptr["branch"], rows, hidden, 1, hidden,
                                                          layer.mlp_out_norm.data_ptr(), layer.eps))
        self._final_step = len(steps)  # its column 4: the output's address, a fresh tensor each run
        steps.append(norm_cpu.add_rms_norm_f32_row(norm_library, ptr["x"], ptr["branch"], final_norm.data_ptr(), 0, rows,
                                                   hidden, cfg.rms_norm_eps))
        # Filled in numpy (a torch tensor per step and torch's indexing made a plan ~4 ms to
        # build, which a batch whose widths come and go pays again at every eviction).
        cells = np.zeros((len(steps), STRIDE), dtype=np.int64)
        for i, step in enumerate(steps):
            cells[i, : len(step)] = step
        self.table = torch.from_numpy(cells)
        self._cells = cells  # the same memory: the per-forward columns are written here
        self._attention_steps = np.array(attention_steps)
        self._rope_of_layer = [layer.rope for layer in layers]
        # The cache and rope tables whose addresses the attention steps hold: written when
        # either changes (a model keeps one cache; its rope tables change when they grow),
        # not on every forward (~120 data_ptr calls of a one-token step's Python).
        self._bound: tuple[object, object] | None = None

    def run(self, x: torch.Tensor, attn, cache: KVCache, rope: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """Every layer over ``x`` (float32 [rows, hidden], the embedded tokens; not changed),
        with ``attn`` (the forward's ``_AttentionPlan``) and ``cache``, and the final norm;
        -> the hidden states, float32 [rows, hidden] (a fresh tensor)."""
        if x.shape[0] != self.rows or attn.row_seq.numel() != self.rows:
            raise ValueError(f"a plan of {self.rows} rows given {x.shape[0]}")
        self.x.copy_(x)
        cells, steps = self._cells, self._attention_steps
        if self._bound is None or self._bound[0] is not cache or self._bound[1] is not rope:
            cells[steps, COLUMNS["k_cache"]] = [k.data_ptr() for k in cache.keys]
            cells[steps, COLUMNS["v_cache"]] = [v.data_ptr() for v in cache.values]
            cells[steps, COLUMNS["cos"]] = [rope[r][0].data_ptr() for r in self._rope_of_layer]
            cells[steps, COLUMNS["signed_sin"]] = [rope[r][1].data_ptr() for r in self._rope_of_layer]
            cells[steps, COLUMNS["block_size"]] = cache.block_size
            self._bound = (cache, rope)
        cells[steps, COLUMNS["tables"]] = attn.tables.data_ptr()
        cells[steps, COLUMNS["table_width"]] = attn.tables.shape[1]
        cells[steps, COLUMNS["row_seq"]] = attn.row_seq.data_ptr()
        cells[steps, COLUMNS["row_len"]] = attn.row_len.data_ptr()
        tree = attn.tree_rows
        cells[steps, COLUMNS["row_pos"]] = 0 if tree is None else tree.pos.data_ptr()
        cells[steps, COLUMNS["extra_start"]] = 0 if tree is None else tree.extra_start.data_ptr()
        cells[steps, COLUMNS["extra"]] = 0 if tree is None else tree.extra.data_ptr()
        hidden = torch.empty(self.x.shape, dtype=torch.float32)
        cells[self._final_step, 4] = hidden.data_ptr()
        self.runner.run_plan(self.table.data_ptr(), len(self.table), STRIDE)
        self.runs += 1
        return hidden


class ForwardPlans:
    """A model's plans by row count (the ``KEPT_PLANS`` most recently used), and the lock
    that keeps two threads from running one plan's buffers at once (the second runs the
    Python loop instead)."""

    def __init__(self, layers: Sequence, config, scale: float, final_norm: torch.Tensor, runner, norm_library,
                 attention_library):
        self._model = (layers, config, scale, final_norm)
        self._libraries = (runner, norm_library, attention_library)
        self._plans: OrderedDict[int, ForwardPlan] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, rows: int) -> ForwardPlan | None:
        """The plan of ``rows`` rows (made on first use), or None for none or beyond ``MAX_ROWS``.
        Call with ``lock`` held."""
        if not 1 <= rows <= MAX_ROWS:
            return None
        plan = self._plans.pop(rows, None) or ForwardPlan(*self._model, rows, *self._libraries)
        self._plans[rows] = plan
        while len(self._plans) > KEPT_PLANS:
            self._plans.popitem(last=False)
        return plan
