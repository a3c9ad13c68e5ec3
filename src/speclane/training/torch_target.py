"""The frozen target in transformers, on any torch device: it writes the MTP head's
training text and hidden states where our CPU kernels do not run (a GPU).

The same GGUF file the engine serves is dequantized by transformers to float32, so its
greedy text and final (normed) hidden states are those of the engine's forward up to
float rounding. Matmuls stay float32 (no TF32): the labels are the target's greedy
choices, and a lower precision would change more of them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from speclane.models.mtp_head import MTPConfig
from speclane.training.objective import WINDOW, Log
from speclane.training.samples import Sample


class TorchTarget:
    def __init__(self, model: torch.nn.Module, device: torch.device, pad_id: int):
        self.model = model
        self.device = device
        self.pad_id = pad_id

    @classmethod
    def from_gguf(cls, path: Path, device: str) -> TorchTarget:
        from transformers import AutoModelForCausalLM

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        model = model.to(device).eval()
        pad = model.config.pad_token_id
        return cls(model, torch.device(device), int(pad if pad is not None else 0))

    def mtp_config(self, draft_vocab: int) -> MTPConfig:
        c = self.model.config
        rope_theta = getattr(c, "rope_theta", None) or (getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
        return MTPConfig(hidden_size=c.hidden_size, intermediate_size=c.intermediate_size, num_heads=c.num_attention_heads,
                         num_kv_heads=c.num_key_value_heads, draft_vocab=draft_vocab, rms_norm_eps=c.rms_norm_eps,
                         rope_theta=float(rope_theta), window=WINDOW)

    def embedding_table(self) -> torch.Tensor:
        return self.model.get_input_embeddings().weight.detach().float()

    def head_table(self) -> torch.Tensor:
        return self.model.get_output_embeddings().weight.detach().float()

    def _padded(self, rows: Sequence[Sequence[int]], left: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids [len(rows), longest] padded with ``pad_id`` on the left or the right, and
        the attention mask (1 on a row's own tokens), on the device."""
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            span = slice(width - len(r), width) if left else slice(0, len(r))
            ids[i, span] = torch.tensor(list(r), dtype=torch.long)
            mask[i, span] = 1
        return ids.to(self.device), mask.to(self.device)

    @torch.inference_mode()
    def answer(self, prompts: Sequence[Sequence[int]], max_new_tokens: int, stop_ids: Sequence[int], batch_size: int,
               log: Log, deadline: float = math.inf) -> list[list[int]]:
        """Each prompt's greedy continuation, up to and including a stop token; prompts of
        batches not begun by ``deadline`` (a ``time.perf_counter()`` value) get none."""
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))  # like lengths share a batch
        answers: list[list[int]] = [[] for _ in prompts]
        stops = set(stop_ids)
        for at in range(0, len(order), batch_size):
            if time.perf_counter() > deadline:
                log(f"[data] out of time: {len(order) - at} prompts left unanswered")
                break
            chunk = order[at : at + batch_size]
            ids, mask = self._padded([prompts[i] for i in chunk], left=True)  # every row's next token at the end
            width = ids.shape[1]
            out = self.model.generate(input_ids=ids, attention_mask=mask,
                                      max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None,
                                      top_k=None, eos_token_id=list(stop_ids), pad_token_id=self.pad_id)
            for row, i in enumerate(chunk):
                tokens = []
                for t in out[row, width:].tolist():
                    tokens.append(t)
                    if t in stops:
                        break
                answers[i] = tokens
            log(f"[data] answered {min(at + batch_size, len(order))}/{len(order)} prompts")
        return answers

    @torch.inference_mode()
    def samples(self, texts: Sequence[Sequence[int]], prompt_lengths: Sequence[int], batch_size: int) -> list[Sample]:
        """Samples of whole token sequences: every fed position's final hidden state (bfloat16, on the device)."""
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        out: list[Sample | None] = [None] * len(texts)
        for at in range(0, len(order), batch_size):
            chunk = order[at : at + batch_size]
            # Right padding: a causal position never sees what follows it. The last token is never fed.
            ids, mask = self._padded([texts[i][:-1] for i in chunk], left=False)
            hidden = self.model.model(input_ids=ids, attention_mask=mask).last_hidden_state
            for row, i in enumerate(chunk):
                n = len(texts[i]) - 1
                out[i] = Sample(list(texts[i]), prompt_lengths[i], hidden[row, :n].to(torch.bfloat16).clone())
        return [s for s in out if s is not None]
