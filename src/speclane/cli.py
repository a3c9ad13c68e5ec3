"""``speclane``: serve, generate, bench, simulate, models, train-mtp.

Engine flags are generated from the config dataclasses (``config.add_arguments``).
User errors end with one clear line on stderr and exit status 2, never a traceback; a
config field an error names is named as its flag (``--max-model-len``, not ``max_model_len``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence

from speclane import config as cfg

DESCRIPTION = "speclane: an OpenAI-compatible LLM server whose speculative decoding is shared fairly"


def _cmd_models(args: argparse.Namespace) -> int:
    from speclane.models.loader import list_models

    for name, description, path, install in list_models():
        where = path or f"not installed ({install})"
        print(f"{name}\n  {description}\n  -> {where}")
    print("\nAlso accepted: a path to a .gguf file, a local Hugging Face folder, or a Hugging Face repo id.")
    return 0


def _cmd_generate(args: argparse.Namespace) -> int:
    from speclane.llm import LLM
    from speclane.request import SamplingParams

    engine_config = cfg.from_namespace(args)
    sampling = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                              top_k=args.top_k, min_p=args.min_p, seed=args.seed, stop=tuple(args.stop or ()),
                              presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty,
                              repetition_penalty=args.repetition_penalty, min_tokens=args.min_tokens)
    prompt = _prompt_text(args.prompt)
    llm = LLM(config=engine_config)
    prompt_ids = llm.encode_prompt(prompt, chat=not args.raw)
    room = llm.engine.max_model_len - len(prompt_ids)
    if 0 < room < args.max_tokens:  # (a prompt that fills the context is the engine's error, with its numbers)
        raise ValueError(f"--max-tokens is {args.max_tokens} but the prompt has {len(prompt_ids)} tokens and the context "
                         f"is {llm.engine.max_model_len}: ask for at most {room}")
    engine = llm.engine
    engine.add_request("cli", prompt_ids, sampling)
    final = None
    while engine.has_unfinished():
        for out in engine.step():
            sys.stdout.write(out.text)
            sys.stdout.flush()
            if out.finished:
                final = out
    sys.stdout.write("\n")
    if final is not None and args.usage:
        import json

        print(json.dumps(final.usage, indent=2), file=sys.stderr)
    return 0


def _prompt_text(prompt: str | None) -> str:
    """The prompt argument, or standard input where it is ``-`` or left out and piped."""
    if prompt is not None and prompt != "-":
        return prompt
    if sys.stdin is None or (prompt is None and sys.stdin.isatty()):
        raise ValueError("give the prompt as an argument, or pipe it in (`-` reads standard input)")
    text = sys.stdin.read()
    if not text.strip():
        raise ValueError("the prompt read from standard input is empty")
    return text.rstrip("\r\n")


def _cmd_serve(args: argparse.Namespace) -> int:
    from speclane.server.app import serve

    return serve(cfg.from_namespace(args), host=args.host, port=args.port, api_keys=args.api_keys,
                 cluster=cfg.section_from_namespace(cfg.ClusterConfig, args),
                 stream_pacing=cfg.StreamPacing(args.stream_interval_ms, args.stream_pace_streams),
                 reasoning_parser=args.reasoning_parser)


def _cmd_bench(args: argparse.Namespace) -> int:
    from speclane.bench.cli import run_bench

    return run_bench(args, cfg.from_namespace(args))


def _cmd_simulate(args: argparse.Namespace) -> int:
    from speclane.sim.cli import run_simulate

    return run_simulate(args, cfg.from_namespace(args))


def _cmd_train_mtp(args: argparse.Namespace) -> int:
    from speclane.training.cli import run_train_mtp

    return run_train_mtp(args, cfg.from_namespace(args))


def _port(text: str) -> int:
    """A TCP port (argparse type): out of range, uvloop would bind another one silently."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535; got {port}")
    return port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speclane", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("serve", help="OpenAI-compatible HTTP server")
    cfg.add_arguments(p, sections=(*cfg.SECTIONS, cfg.ClusterConfig))
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=_port, default=8000, help="TCP port, 0 to 65535 (0: any free one; default: %(default)s)")
    p.add_argument("--api-keys", default=None, help="JSON or TOML file of API keys (key, tenant, weight, max priority)")
    p.add_argument("--stream-interval-ms", type=float, default=cfg.DEFAULT_STREAM_INTERVAL_MS,
                   help="a stream sends at most one chunk per this many ms (tokens that come meanwhile share it); "
                        "its first and last chunks are never held back; 0: a chunk per tick, or per several ticks "
                        "while the server is still writing the last one (default: %(default)s)")
    p.add_argument("--stream-pace-streams", type=int, default=cfg.DEFAULT_STREAM_PACE_STREAMS,
                   help="with more streams open than this, each stream's interval grows to --stream-interval-ms "
                        "x streams / this, so the server's chunks per second stay those of this many streams "
                        "(each chunk is CPU taken from decoding); 0: the interval never grows (default: %(default)s)")
    p.add_argument("--reasoning-parser", choices=("auto", "think", "none"), default="auto",
                   help="a chat reply's <think>...</think> block goes to message.reasoning_content, the rest to "
                        "content: auto, for models whose chat template writes <think> (Qwen3, QwQ, DeepSeek-R1 "
                        "distills); think, for every model; none, the tags stay in content (default: %(default)s)")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser("generate", help="generate text for one prompt")
    cfg.add_arguments(p)
    p.add_argument("prompt", nargs="?", help="the prompt; `-` or none with a pipe: read from standard input")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens to generate at most (default: %(default)s)")
    p.add_argument("--min-tokens", type=int, default=0, help="no stop ends the answer before it holds this many tokens")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (default: %(default)s)")
    p.add_argument("--top-p", type=float, default=1.0, help="keep the likeliest tokens up to this probability mass "
                   "(default: %(default)s)")
    p.add_argument("--top-k", type=int, default=0, help="keep the k likeliest tokens (0: no cut)")
    p.add_argument("--min-p", type=float, default=0.0, help="drop tokens below this share of the likeliest")
    p.add_argument("--presence-penalty", type=float, default=0.0, help="-2 to 2, once a token is in the answer")
    p.add_argument("--frequency-penalty", type=float, default=0.0, help="-2 to 2, per time a token is in the answer")
    p.add_argument("--repetition-penalty", type=float, default=1.0,
                   help="divides the logits of tokens in the prompt or answer (1: none)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: none)")
    p.add_argument("--stop", action="append", help="stop string (repeatable)")
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.add_argument("--usage", action="store_true", help="print the usage (with speculative counters) to stderr")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("models", help="list known model names and where they resolve")
    p.set_defaults(func=_cmd_models)

    from speclane.bench.cli import SCENARIOS  # names and one line each: no torch imported

    p = sub.add_parser("bench", help="run a benchmark scenario", formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="scenarios:\n" + "\n".join(f"  {name:13s} {what}" for name, what in SCENARIOS.items()))
    p.add_argument("scenario", help="one of the scenarios listed above")
    cfg.add_arguments(p)
    p.add_argument("--out", default="bench-out")
    p.add_argument("--quick", action="store_true", help="a short run (smoke test)")
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("simulate", help="discrete-event simulation of lane policies at scale")
    cfg.add_arguments(p, sections=(cfg.LaneConfig, cfg.SchedulerConfig))
    p.add_argument("--out", default="sim-out")
    p.add_argument("--requests", type=int, default=10_000)
    p.add_argument("--tenants", type=int, default=1_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--calibrate", default=None, help="a bench report.json to fit the cost model")
    p.add_argument("--replicas", type=int, default=1, help="simulate the fair lane over this many replicas "
                   "sharing their lane counters (docs/design.md, Replicas)")
    p.add_argument("--counter-sync-ms", type=float, default=50.0, help="with --replicas: how often the "
                   "replicas' lanes exchange tenant service (simulated time)")
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("train-mtp", help="train an MTP draft head for a model by self-distillation")
    cfg.add_arguments(p, sections=(cfg.ModelConfig,))
    from speclane.training.cli import add_train_arguments

    add_train_arguments(p)
    p.set_defaults(func=_cmd_train_mtp)
    return parser


def _in_flags(message: str, args: argparse.Namespace) -> str:
    """``message`` with the option it opens with (``max_model_len must be ...``, the engine's
    checks speak its Python API's names) written as the user set it: the flag
    (``--max-model-len``), or the environment variable where no flag was given."""
    opening = re.match(r"([a-z]+(?:_[a-z0-9]+)+) ", message)
    if opening is None or not hasattr(args, opening.group(1)):  # not an option of this command
        return message
    field = opening.group(1)
    variable = f"SPECLANE_{field.upper()}"
    name = variable if getattr(args, field) is None and variable in os.environ else cfg.flag(field)
    return name + message[len(field):]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from speclane.models.loader import ModelLoadError

    try:
        return args.func(args)
    except (ValueError, ModelLoadError) as exc:
        print(f"speclane {args.command}: error: {_in_flags(str(exc), args)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
