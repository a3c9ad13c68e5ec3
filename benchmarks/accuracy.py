"""How close each GGUF weight type and activation dtype keeps speclane to float32: the
numbers behind the defaults (``--dtype bfloat16``, ``--quantization auto``).

For every GGUF file given, each arm computes the next-token logits at every position of
every committed prompt (``benchmarks/data/accuracy_prompts.jsonl``: chat-templated
questions, code, prose, lists; one teacher-forced prefill per prompt, several prompts per
ragged batch, at most ``--max-prompt-tokens`` each), and each cell of the table (a line
per file, a column per arm) compares an arm, position by position, with the float32
reference of the same file:

- top-1 agreement: the share of positions whose argmax is the reference's;
- mean KL(reference || arm) of the next-token distributions, in nats.

speclane's arms run its model forward directly (``build_model`` + ``RaggedBatch``, the
logits ``LlamaModel.logits`` serves): its reference is ``--dtype float32`` (quantization
none: every weight dequantized to float32, the only float32 configuration speclane has),
its other arms ``--dtype bfloat16`` with each ``--arms`` choice of ``--quantization``,
``--kernels``, ``--matmul-inputs`` and ``--head-inputs``. transformers' column is its own bfloat16 on the same file (its GGUF reader
dequantizes every weight) against its float32 on that file; the column "float32:
speclane vs transformers" checks that the two references agree. The last column: how
many top-1 points the first speclane arm is from transformers' bfloat16 on the same file.

    # the SmolLM2 weights in each type, then Gemma 3 (~5 min a file here, one thread)
    python benchmarks/accuracy.py --make-files /tmp/gguf gemma-3-270m --arms auto,none --threads 1 --json acc.json
    python benchmarks/accuracy.py some.gguf --limit 40 --no-transformers    # a quick look

``--make-files DIR`` writes the default model's weights (its Q4_1 file, measured as it
is) in every type of ``MAKE_TYPES`` with llama.cpp's ``llama-quantize --allow-requantize``
(the K types also with ``--pure``: no mixture of types), and skips, saying so, where no
``llama-quantize`` is found (``--llama-quantize``, ``PATH``, or the build of
``build-llama-cpp.sh``). The markdown table it prints pastes into docs/design.md as it is;
``--table JSON`` prints it again from a ``--json`` file.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from speclane.bench.llama_cpp import find_llama_cpp_tool, requantize
from speclane.config import ModelConfig
from speclane.engine.engine import load_tokenizer
from speclane.models.build import build_model
from speclane.models.kv_cache import KVCache
from speclane.models.llama import LlamaModel, RaggedBatch
from speclane.models.loader import read_weights, resolve_model
from speclane.models.tokenizer import Tokenizer
from speclane.models.weights import WeightSet
from speclane.scheduler.block_pool import KV_BLOCK_SIZE

PROMPTS = Path(__file__).with_name("data") / "accuracy_prompts.jsonl"
# llama-quantize's type names: (output file suffix, type, --pure)
MAKE_TYPES = [(name, name, False) for name in ("F32", "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_1", "Q5_0",
                                                "Q4_K_M", "Q4_0")]
# Q6_K is one type already (Q8_0 where a row is not whole 256-blocks), as with --pure
MAKE_TYPES += [(f"{name}-pure", name, True) for name in ("Q5_K_M", "Q4_K_M")]
TRANSFORMERS = "transformers bfloat16"  # its column, against transformers' float32
BATCH_LOGITS = 1 << 25  # logits of one batch per arm (float32: 128 MiB): rows = this / vocab
Logits = Callable[[list[list[int]]], list[torch.Tensor]]  # prompts' ids -> [len, vocab] float32 each


# -- the metrics -------------------------------------------------------------------------
def top1_matches(reference: torch.Tensor, logits: torch.Tensor) -> int:
    """Positions ([N, vocab] each) whose argmax is the reference's."""
    return int((reference.argmax(-1) == logits.argmax(-1)).sum())


def kl_divergences(reference: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(reference) || softmax(logits)) per position, in nats, float32 [N].

    With d = logits - reference and p = softmax(reference), KL = log(sum p e^d) - sum p d,
    written as log1p(sum p expm1(d)) - sum p d: no difference of two log-sum-exps (each
    ~20 for a 49k vocabulary, where float32 keeps only ~2e-6), so float32 holds a KL of
    1e-7 to a few digits, at a third of float64's time."""
    p = torch.softmax(reference.float(), dim=-1)
    d = logits.float() - reference.float()
    return torch.log1p((p * torch.expm1(d)).sum(-1)) - (p * d).sum(-1)


@dataclass
class Agreement:
    """Running totals of one arm against its reference."""

    positions: int = 0
    top1: int = 0
    kl_sum: float = 0.0

    def add(self, reference: torch.Tensor, logits: torch.Tensor) -> None:
        self.positions += reference.shape[0]
        self.top1 += top1_matches(reference, logits)
        self.kl_sum += float(kl_divergences(reference, logits).sum())

    @property
    def top1_pct(self) -> float:
        return 100.0 * self.top1 / self.positions if self.positions else float("nan")

    @property
    def mean_kl(self) -> float:
        return self.kl_sum / self.positions if self.positions else float("nan")


# -- the prompts -------------------------------------------------------------------------
def load_prompts(path: Path = PROMPTS) -> list[dict[str, str]]:
    """[{"kind": "chat" | "code" | "prose" | "list", "text": ...}] of the JSONL file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def encode_prompts(tokenizer: Tokenizer, prompts: list[dict[str, str]], max_tokens: int) -> list[list[int]]:
    """Each prompt's ids, at most ``max_tokens``: a chat one through the model's chat
    template (as the server renders it), the others as text with the model's BOS."""
    ids = []
    for prompt in prompts:
        if prompt["kind"] == "chat":
            text = tokenizer.apply_chat_template([{"role": "user", "content": prompt["text"]}])
            ids.append(tokenizer.encode(text, add_special_tokens=False)[:max_tokens])
        else:
            ids.append(tokenizer.encode(prompt["text"], add_special_tokens=True)[:max_tokens])
    return ids


def first_new_positions(prompts: list[list[int]]) -> list[int]:
    """Per prompt, its first position that no earlier prompt has scored. A position's
    prediction depends only on the tokens up to it, so where a prompt begins with the same
    tokens as an earlier one (every chat prompt begins with the chat template's system
    prompt) those positions are the same predictions again: counted once per prompt, one
    near tie in the shared prefix that an arm flips would count once per prompt (it did:
    position 9 of SmolLM2's system prompt moved an arm's top-1 by 2.4 points over 60 chat
    prompts). Each position is scored once."""
    firsts = []
    for index, ids in enumerate(prompts):
        shared = 0
        for earlier in prompts[:index]:
            length = 0
            for a, b in zip(ids, earlier, strict=False):
                if a != b:
                    break
                length += 1
            shared = max(shared, length)
        firsts.append(min(shared, len(ids)))
    return firsts


def batches(prompts: list[list[int]], max_rows: int) -> Iterator[list[list[int]]]:
    """Consecutive prompts, at most ``max_rows`` tokens a batch (a longer prompt alone)."""
    batch: list[list[int]] = []
    for ids in prompts:
        if batch and sum(map(len, batch)) + len(ids) > max_rows:
            yield batch
            batch = []
        batch.append(ids)
    if batch:
        yield batch


# -- the arms ----------------------------------------------------------------------------
def speclane_logits(model: LlamaModel, max_prompts: int, max_len: int) -> Logits:
    """speclane's forward: one ragged prefill of the prompts (a row of the paged pool each)
    and the logits of every position, as the engine computes them (``LlamaModel.logits``)."""
    cfg = model.config
    block_size = KV_BLOCK_SIZE
    cache = KVCache(cfg.num_layers, max_prompts * -(-max_len // block_size), block_size, cfg.num_kv_heads,
                    cfg.head_dim, model.dtype)
    tables = cache.row_tables(max_prompts, max_len)

    def run(prompts: list[list[int]]) -> list[torch.Tensor]:
        batch = RaggedBatch(input_ids=torch.tensor([t for ids in prompts for t in ids]),
                            positions=torch.cat([torch.arange(len(ids)) for ids in prompts]),
                            block_tables=tables[: len(prompts)],
                            starts=[0] * len(prompts), num_new=[len(ids) for ids in prompts])
        return list(model.logits(model(batch, cache)).split(batch.num_new))

    return run


def transformers_logits(path: Path, dtype: torch.dtype) -> Logits:
    """transformers' model of the GGUF file (its reader dequantizes every tensor) in
    ``dtype``: the prompts right-padded into one batch, each one's logits in float32."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype).eval()

    def run(prompts: list[list[int]]) -> list[torch.Tensor]:
        longest = max(map(len, prompts))
        ids = torch.zeros(len(prompts), longest, dtype=torch.long)
        mask = torch.zeros(len(prompts), longest, dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, : len(prompt)] = torch.tensor(prompt)
            mask[row, : len(prompt)] = 1
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask).logits.float()
        return [logits[row, : len(prompt)] for row, prompt in enumerate(prompts)]

    return run


@dataclass(frozen=True)
class Row:
    """One measurement: an arm against its reference on one file (a cell of the table)."""

    file: str
    weights: str  # the file's layer matmul types, e.g. "Q4_K x90, Q6_K x15"
    arm: str  # the column: "speclane bfloat16 auto", "transformers bfloat16", ...
    runs_as: str  # speclane's effective quantization (build.effective_quantization); "" otherwise
    positions: int
    top1_pct: float
    mean_kl: float


@dataclass(frozen=True)
class Settings:
    """What ``measure`` runs: the bfloat16 arms as (--quantization, --kernels, --matmul-inputs,
    --head-inputs)."""

    arms: tuple[tuple[str, str, str, str], ...] = (("auto", "auto", "bfloat16", "auto"),)
    transformers: bool = True
    max_prompt_tokens: int = 128
    batch_tokens: int = 1024  # tokens per forward, fewer for a large vocabulary (BATCH_LOGITS)


def weight_types(path: Path) -> str:
    """The types of the file's layer matmul weights (``blk.*``, 2-D), most common first."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    counts = Counter(t.tensor_type.name for t in reader.tensors if t.name.startswith("blk.") and len(t.shape) == 2)
    return ", ".join(f"{name} x{count}" for name, count in counts.most_common())


def measure_file(path: Path, prompts: list[dict[str, str]], settings: Settings) -> list[Row]:
    """Every arm of one file against its reference, over all the prompts."""
    started = time.perf_counter()
    weights = read_weights(str(path))
    ids = encode_prompts(load_tokenizer(weights.tokenizer_source), prompts, settings.max_prompt_tokens)
    rows = measure(weights, path, ids, settings)
    print(f"{path.name}: {sum(map(len, ids))} positions of {len(ids)} prompts, {time.perf_counter() - started:.0f} s",
          file=sys.stderr)
    return rows


@dataclass(frozen=True)
class Comparison:
    """A cell of the table: the logits of ``arm`` against those of ``reference``."""

    label: str
    runs_as: str
    arm: str
    reference: str


def measure(weights: WeightSet, path: Path, prompts: list[list[int]], settings: Settings) -> list[Row]:
    """Every comparison of ``weights`` (read from ``path``) on ``prompts``: each batch
    through every arm once, each comparison's totals updated from those logits."""
    max_rows = max(settings.max_prompt_tokens, min(settings.batch_tokens, BATCH_LOGITS // weights.config.vocab_size))
    max_prompts = max(len(b) for b in batches(prompts, max_rows))
    arms, comparisons = _arms(weights, path, settings, max_prompts)
    totals = [Agreement() for _ in comparisons]
    firsts = iter(first_new_positions(prompts))  # batches keep the prompts' order
    for batch in batches(prompts, max_rows):
        logits = {name: arm(batch) for name, arm in arms.items()}
        skip = [next(firsts) for _ in batch]
        for c, agreement in zip(comparisons, totals, strict=True):
            for first, reference, ours in zip(skip, logits[c.reference], logits[c.arm], strict=True):
                if first < reference.shape[0]:
                    agreement.add(reference[first:], ours[first:])
    types = weight_types(path)
    return [Row(path.name, types, c.label, c.runs_as, a.positions, a.top1_pct, a.mean_kl)
            for c, a in zip(comparisons, totals, strict=True)]


def _arms(weights: WeightSet, path: Path, settings: Settings, max_prompts: int
          ) -> tuple[dict[str, Logits], list[Comparison]]:
    """The arms by name (speclane's float32 reference ``speclane-f32``, its bfloat16 arms,
    transformers' two) and the comparisons of the table."""
    def speclane(dtype: str, quantization: str, kernels: str = "auto", inputs: str = "bfloat16", head: str = "auto"
                 ) -> tuple[LlamaModel, Logits]:
        model = build_model(weights, ModelConfig(dtype=dtype, quantization=quantization, kernels=kernels,
                                                 matmul_inputs=inputs, head_inputs=head))
        return model, speclane_logits(model, max_prompts, settings.max_prompt_tokens)

    arms: dict[str, Logits] = {"speclane-f32": speclane("float32", "none")[1]}
    comparisons = []
    # (effective quantization, kernels, inputs, the head's effective inputs) -> its arm
    runs: dict[tuple[str, str, str, str], str] = {}
    for quantization, kernels, inputs, head in settings.arms:
        model, logits = speclane("bfloat16", quantization, kernels, inputs, head)
        name = runs.setdefault((model.quantization, kernels, inputs, model.kernels.head_inputs),
                               f"speclane-{quantization}-{kernels}-{inputs}-{head}")
        arms.setdefault(name, logits)  # --quantization none where auto runs dense: the same model, run once
        label = (f"speclane bfloat16 {quantization}" + ("" if kernels == "auto" else f", kernels {kernels}")
                 + ("" if inputs == "bfloat16" else f", {inputs} matmul inputs")
                 + ("" if head == "auto" else f", head inputs {head}"))
        comparisons.append(Comparison(label, model.quantization, name, "speclane-f32"))
    if settings.transformers:
        arms["transformers-f32"] = transformers_logits(path, torch.float32)
        arms["transformers-bf16"] = transformers_logits(path, torch.bfloat16)
        comparisons.append(Comparison(TRANSFORMERS, "", "transformers-bf16", "transformers-f32"))
        # the two references agree: speclane's float32 against transformers' float32
        comparisons.append(Comparison("float32: speclane vs transformers", "", "speclane-f32", "transformers-f32"))
    return arms, comparisons


# -- the table ---------------------------------------------------------------------------
def markdown(rows: list[Row]) -> str:
    """One line per file, a column per arm: top-1 agreement % / mean KL (speclane's arms
    also say what they run as); the last column, the first speclane arm's top-1 points
    from transformers' bfloat16 on the same file (the defaults keep it above -1)."""
    files = list(dict.fromkeys(r.file for r in rows))
    labels = list(dict.fromkeys(r.arm for r in rows))
    cells = {(r.file, r.arm): r for r in rows}
    lines = ["| file | layer weights | positions | " + " | ".join(f"{label}: top-1 % / KL" for label in labels)
             + f" | top-1 vs {TRANSFORMERS} (points) |", "|---" * (len(labels) + 4) + "|"]
    for file in files:
        mine = [r for r in rows if r.file == file]
        line = [file, mine[0].weights, str(mine[0].positions)]
        for label in labels:
            r = cells.get((file, label))
            line.append("-" if r is None else f"{r.top1_pct:.2f} / {r.mean_kl:.5f}" + (f" ({r.runs_as})" if r.runs_as else ""))
        ours = next((r for r in mine if r.arm.startswith("speclane bfloat16")), None)
        theirs = cells.get((file, TRANSFORMERS))
        line.append(f"{ours.top1_pct - theirs.top1_pct:+.2f}" if ours and theirs else "-")
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)


# -- the files ---------------------------------------------------------------------------
def make_files(directory: Path, source: Path, binary: Path | None) -> list[Path]:
    """``source`` written in each of ``MAKE_TYPES`` into ``directory`` (files already there
    kept), with ``source`` itself (the Q4_1 file) first; [] with a message where
    ``llama-quantize`` is not found."""
    if binary is None:
        print("llama-quantize not found (--llama-quantize, PATH, or ~/.cache/speclane-anchors): no files made",
              file=sys.stderr)
        return []
    stem = source.name.split(".")[0]
    return [source] + [requantize(binary, source, directory / f"{stem}.{suffix}.gguf", kind, pure=pure)
                       for suffix, kind, pure in MAKE_TYPES]


def arm_of(spec: str) -> tuple[str, str, str, str]:
    """``QUANTIZATION[:KERNELS[:INPUTS[:HEAD]]]`` -> (quantization, kernels, matmul inputs, head inputs)."""
    parts = spec.split(":")
    if len(parts) > 4:
        raise SystemExit(f"--arms: {spec!r} is not QUANTIZATION[:KERNELS[:INPUTS[:HEAD]]]")
    defaults = ("auto", "auto", "bfloat16", "auto")
    quantization, kernels, inputs, head = (value or default for value, default
                                           in zip([*parts, *defaults[len(parts):]], defaults, strict=True))
    return quantization, kernels, inputs, head


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", help="GGUF files or model names (default: the default model)")
    parser.add_argument("--make-files", type=Path, metavar="DIR",
                        help="write the default model in every type of MAKE_TYPES into DIR, and measure those")
    parser.add_argument("--llama-quantize", type=Path, help="llama.cpp's llama-quantize (default: found)")
    parser.add_argument("--prompts", type=Path, default=PROMPTS)
    parser.add_argument("--limit", type=int, default=0, help="the first N prompts only (0: all)")
    parser.add_argument("--max-prompt-tokens", type=int, default=128)
    parser.add_argument("--batch-tokens", type=int, default=1024, help="tokens per forward (fewer for a large vocabulary)")
    parser.add_argument("--arms", default="auto", help="the bfloat16 arms, comma-separated: "
                        "QUANTIZATION[:KERNELS[:INPUTS[:HEAD]]] (speclane's --quantization, --kernels, --matmul-inputs "
                        "and --head-inputs; auto, auto, bfloat16 and auto where not given)")
    parser.add_argument("--no-transformers", dest="transformers", action="store_false",
                        help="skip transformers' arms (and the check of the two references)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--table", type=Path, metavar="JSON", help="print the table of a --json file, measure nothing")
    args = parser.parse_args(argv)
    if args.table:
        print(markdown([Row(**row) for row in json.loads(args.table.read_text())]))
        return
    settings = Settings(arms=tuple(arm_of(spec) for spec in args.arms.split(",") if spec),
                        transformers=args.transformers, max_prompt_tokens=args.max_prompt_tokens,
                        batch_tokens=args.batch_tokens)
    if args.threads:
        torch.set_num_threads(args.threads)
    files = []
    if args.make_files:
        binary = args.llama_quantize or find_llama_cpp_tool("llama-quantize")
        files = make_files(args.make_files, resolve_model("smollm2-135m-instruct"), binary)
    files += [resolve_model(f) for f in args.files]
    files = files or [resolve_model("smollm2-135m-instruct")]
    prompts = load_prompts(args.prompts)[: args.limit or None]
    rows: list[Row] = []
    for path in files:
        rows += measure_file(path, prompts, settings)
        if args.json:  # after each file: a long run keeps what it measured
            args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    print(markdown(rows))


if __name__ == "__main__":
    main()
