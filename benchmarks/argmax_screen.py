"""How the output head's int4 screen (``--argmax-screen int4``) ranks the float32 model's
choice: at every position of the committed accuracy prompts
(``benchmarks/data/accuracy_prompts.jsonl``, teacher-forced), where the float32 head's
argmax falls among each coarse pass's logits (the head's own pass, and the int4 copy's),
and whether the logits ``LlamaModel.logits`` serves (the top ``REFINE_TOP`` refined in
float32 from the head's exact rows) pick it.

    .venv/bin/python benchmarks/argmax_screen.py [--model smollm2-135m-instruct] [--limit 60]

A row of greedy decoding picks the float32 argmax wherever that argmax ranks inside the
refined candidates; the table's worst rank is how much room the screen leaves.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from accuracy import encode_prompts, load_prompts  # noqa: E402

from speclane.config import ModelConfig  # noqa: E402
from speclane.engine.engine import load_tokenizer  # noqa: E402
from speclane.models.build import build_model  # noqa: E402
from speclane.models.kv_cache import KVCache  # noqa: E402
from speclane.models.llama import REFINE_TOP, RaggedBatch  # noqa: E402
from speclane.models.loader import read_weights, resolve_model  # noqa: E402
from speclane.scheduler.block_pool import KV_BLOCK_SIZE  # noqa: E402


def ranks(coarse: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Each row's rank (0: the largest) of ``target``'s logit among ``coarse``'s, ties counted above."""
    return (coarse > coarse.gather(-1, target[:, None])).sum(-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=ModelConfig().model)
    parser.add_argument("--limit", type=int, default=0, help="prompts (0: all)")
    parser.add_argument("--max-prompt-tokens", type=int, default=256)
    args = parser.parse_args()
    path = resolve_model(args.model)
    weights = read_weights(str(path))
    model = build_model(weights, ModelConfig(model=args.model))
    if model.argmax_screen is None:
        raise SystemExit(f"{args.model}: its head gets no int4 screen (build.argmax_screen says why)")
    prompts = load_prompts()
    prompts = prompts[: args.limit] if args.limit else prompts
    ids = encode_prompts(load_tokenizer(weights.tokenizer_source), prompts, args.max_prompt_tokens)
    cfg = model.config
    cache = KVCache(cfg.num_layers, -(-args.max_prompt_tokens // KV_BLOCK_SIZE) * 8, KV_BLOCK_SIZE, cfg.num_kv_heads,
                    cfg.head_dim, model.dtype)
    tables = cache.row_tables(8, args.max_prompt_tokens)
    head_table = model.head_table()
    worst = {"head": 0, "int4 screen": 0}
    picked = {"head": 0, "int4 screen": 0}
    positions = 0
    with torch.inference_mode():
        for start in range(0, len(ids), 8):  # a ragged prefill of 8 prompts at a time
            group = ids[start : start + 8]
            batch = RaggedBatch(torch.tensor([t for p in group for t in p]), torch.cat([torch.arange(len(p)) for p in group]),
                                tables[: len(group)], [0] * len(group), [len(p) for p in group])
            hidden = model(batch, cache)
            exact = (hidden.float() @ head_table.T).argmax(-1)
            positions += len(exact)
            for name, coarse_head, flags in (("head", model.lm_head, None),
                                             ("int4 screen", model.argmax_screen, [True] * len(exact))):
                worst[name] = max(worst[name], int(ranks(coarse_head(hidden).float(), exact).max()))
                picked[name] += int((model.logits(hidden, flags).argmax(-1) == exact).sum())
    print(f"{args.model}: {positions} positions of {len(ids)} prompts; the top {REFINE_TOP} of each coarse pass refined")
    print("| coarse pass | worst rank of the float32 argmax (0: first) | positions choosing the float32 argmax |")
    print("|---|---|---|")
    for name in worst:
        print(f"| {name} | {worst[name]} | {picked[name]} of {positions} |")


if __name__ == "__main__":
    main()
