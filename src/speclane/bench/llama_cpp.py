"""llama.cpp's programs, the reference the benchmarks compare speclane against.

``find_llama_cpp_tool`` finds a program (``llama-server``, ``llama-bench``,
``llama-quantize``) on ``PATH``, else in the newest build of ``build-llama-cpp.sh`` in
``~/.cache/speclane-anchors`` (built for this CPU's vector extensions without ggml's AMX
path). ``llama_server`` starts the server on a free port; ``decode_rate`` is
``llama-bench``'s generation rate of a file; ``requantize`` converts a GGUF file to another
type with ``llama-quantize`` once and reuses the result.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from speclane.bench.servers import ServerProcess, free_port, server_process

ANCHORS = Path.home() / ".cache" / "speclane-anchors"


def find_llama_cpp_tool(name: str) -> Path | None:
    """The program ``name`` on ``PATH``, else in the newest build under ``ANCHORS``, else None."""
    found = shutil.which(name)
    if found:
        return Path(found)
    builds = sorted(ANCHORS.glob(f"llama_cpp_python-*/vendor/llama.cpp/build/bin/{name}"))
    return builds[-1] if builds else None


@contextlib.contextmanager
def llama_server(binary: Path, gguf: Path, threads: int, slots: int = 1, context: int = 2048,
                 extra: Sequence[str] = ()) -> Iterator[ServerProcess]:
    """``llama-server`` on ``gguf`` with ``slots`` parallel sequences sharing ``context``
    tokens of KV cache (``-np``, ``-c``), its Jinja chat template and ``extra`` arguments."""
    port = free_port()
    command = [str(binary), "-m", str(gguf), "-t", str(threads), "-c", str(context), "-np", str(slots), "--jinja",
               "--host", "127.0.0.1", "--port", str(port), *extra]
    with server_process(command, port) as server:
        yield server


def decode_rate(binary: Path, gguf: Path, threads: int, tokens: int, repeats: int, depth: int = 0,
                flash_attention: bool = False) -> float:
    """``llama-bench``'s mean tok/s generating ``tokens`` tokens after an empty prompt
    (its ``tg`` test: ``-p 0 -n tokens``), over ``repeats`` runs after its own warm-up;
    ``depth``: that many tokens already in the context (``-d``, processed before the
    test and not timed); ``flash_attention``: ``-fa 1`` (else the build's default)."""
    command = [str(binary), "-m", str(gguf), "-p", "0", "-n", str(tokens), "-t", str(threads), "-r", str(repeats),
               *(["-d", str(depth)] if depth else []),
               *(["-fa", "1"] if flash_attention else []), "-o", "json"]
    result = subprocess.run(command, capture_output=True, text=True, check=True)
    return generation_rate(result.stdout, tokens, depth)


def generation_rate(report: str, tokens: int, depth: int = 0) -> float:
    """The ``avg_ts`` of the test generating ``tokens`` tokens after an empty prompt, with
    ``depth`` tokens in the context before it, in ``llama-bench -o json``'s output (a list
    of tests; a build without ``-d`` reports no ``n_depth``: 0)."""
    for test in json.loads(report):
        if test.get("n_prompt") == 0 and test.get("n_gen") == tokens and test.get("n_depth", 0) == depth:
            return float(test["avg_ts"])
    raise ValueError(f"llama-bench's report holds no test of {tokens} generated tokens after an empty prompt "
                     f"at depth {depth}")


def requantize(binary: Path, source: Path, out: Path, type_name: str, *, pure: bool = False) -> Path:
    """``source`` converted to ``type_name`` (``Q4_K_M``, ``Q8_0``, ...) at ``out`` by
    ``llama-quantize --allow-requantize`` (``pure``: with ``--pure``, every tensor of that
    type where its rows allow, no K-quant mixture); an existing ``out`` is reused. The file
    appears under its name only once complete."""
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    subprocess.run([str(binary), "--allow-requantize", *(["--pure"] if pure else []), str(source), str(partial),
                    type_name], check=True, capture_output=True)
    partial.rename(out)
    return out
