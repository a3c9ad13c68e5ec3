"""``speclane bench gguf``'s logic without a model or llama.cpp: llama-bench's report read,
the aggregate rate of concurrent streams, the servers run one at a time in alternating
rounds, a GGUF file's layer types, the requantized file made once, a server process
started and stopped, and the weight-type table's random blocks valid for every type."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from speclane.bench import gguf_scenario
from speclane.bench.http_streams import StreamResult, aggregate_rate
from speclane.bench.llama_cpp import generation_rate, requantize
from speclane.bench.servers import ServerProcess, free_port, server_process
from speclane.bench.weight_types import (
    SCALE_OFFSETS,
    kept_narrow,
    measured_types,
    random_blocks,
    random_values,
)
from speclane.config import EngineConfig
from speclane.kernels.select import Kernels
from speclane.models.build import file_weight
from speclane.models.gguf_types import FLOAT_DTYPES, TYPES, quantized_tensor

gguf = pytest.importorskip("gguf")


def _test(n_prompt: int, n_gen: int, avg_ts: float) -> dict:
    return {"model_filename": "m.gguf", "n_prompt": n_prompt, "n_gen": n_gen, "n_threads": 2, "avg_ts": avg_ts,
            "samples_ts": [avg_ts]}


def test_generation_rate_is_the_tg_test_of_the_asked_length():
    report = json.dumps([_test(512, 0, 900.0), _test(0, 64, 80.0), _test(0, 128, 70.5)])
    assert generation_rate(report, 128) == 70.5
    assert generation_rate(report, 64) == 80.0
    with pytest.raises(ValueError, match="256 generated tokens"):
        generation_rate(report, 256)


def test_generation_rate_at_a_depth_is_the_tg_test_with_that_much_context():
    report = json.dumps([{**_test(0, 128, 140.0), "n_depth": 0}, {**_test(0, 128, 60.0), "n_depth": 1024},
                         {**_test(0, 128, 25.0), "n_depth": 4096}])
    assert generation_rate(report, 128) == 140.0
    assert generation_rate(report, 128, depth=1024) == 60.0 and generation_rate(report, 128, depth=4096) == 25.0
    with pytest.raises(ValueError, match="at depth 2048"):
        generation_rate(report, 128, depth=2048)


def test_aggregate_rate_is_all_tokens_over_the_streams_wall_time():
    streams = [StreamResult(10.0, 12.0, 100), StreamResult(10.5, 14.0, 128), StreamResult(11.0, 13.0, 28)]
    assert aggregate_rate(streams) == pytest.approx(256 / 4.0)  # 10.0 -> 14.0, not the sum of the durations
    assert math.isnan(aggregate_rate([]))


def test_ratio_needs_both_arms():
    assert gguf_scenario.ratio(150.0, 100.0) == "1.50x"
    assert gguf_scenario.ratio(150.0, None) == "-"


def test_stream_rounds_run_one_server_at_a_time_and_alternate_which_goes_first(monkeypatch):
    events: list[str] = []
    live: list[str] = []
    rates = {"speclane": iter([100.0, 300.0, 200.0, 400.0]), "speclane-int8": iter([120.0, 220.0]),
             "llama.cpp": iter([50.0, 150.0])}
    light_rates = {"speclane": iter([240.0, 260.0]), "llama.cpp": iter([110.0, 90.0])}  # the light client's runs

    def fake_server(base: str):
        @contextlib.contextmanager
        def start(*args, **kwargs):
            int8 = base == "speclane" and len(args) > 1 and list(args[1]) == ["--matmul-inputs", "int8"]
            name = base + "-int8" * int8
            assert not live, f"{name} started while {live} runs"
            live.append(name)
            events.append(name)
            yield ServerProcess(f"http://{name}", pid=1)
            live.remove(name)
        return start

    def fake_streams(url, model, prompts, max_tokens, extra=None):
        name = url.removeprefix("http://")
        if len(prompts) == 1:  # the warm-up
            return [StreamResult(0.0, 1.0, 8)]
        rate = next(rates[name])
        return [StreamResult(0.0, 1.0, rate / len(prompts))] * len(prompts)

    monkeypatch.setattr(gguf_scenario, "speclane_server", fake_server("speclane"))
    monkeypatch.setattr(gguf_scenario, "llama_server", fake_server("llama.cpp"))
    def fake_light_streams(url, model, prompts, max_tokens, extra=None):
        rate = next(light_rates[url.removeprefix("http://")])
        return [StreamResult(0.0, 1.0, rate / len(prompts))] * len(prompts)

    monkeypatch.setattr(gguf_scenario, "concurrent_streams", fake_streams)
    monkeypatch.setattr(gguf_scenario, "light_streams", fake_light_streams)
    monkeypatch.setattr(ServerProcess, "resident_mib", lambda self: 512.0 if "speclane" in self.url else 256.0)
    config = EngineConfig().replace(model="m.gguf")

    cells = gguf_scenario._streams(config, Path("llama-server"), tokens=32, rounds=2, lane=True)

    assert events == ["speclane", "speclane-int8", "llama.cpp", "llama.cpp", "speclane-int8", "speclane"]
    off, on, ref, ratio, int8, int8_ratio, light, per_stream, resident = cells
    assert (off, on, ref, int8) == (150.0, 350.0, 100.0, 170.0)  # medians: off 100 and 200, lane 300 and 400, ...
    assert ratio == "1.50x" and int8_ratio == "1.70x" and resident == "512, 256"
    assert light == "2.50x (250 / 100)"  # each client against llama-server with the same client


def test_stream_rounds_without_llama_server_run_speclane_alone(monkeypatch):
    @contextlib.contextmanager
    def fake_server(*args, **kwargs):
        yield ServerProcess("http://speclane", pid=1)

    monkeypatch.setattr(gguf_scenario, "speclane_server", fake_server)
    monkeypatch.setattr(gguf_scenario, "concurrent_streams",
                        lambda url, model, prompts, max_tokens, extra=None: [StreamResult(0.0, 2.0, 10)] * len(prompts))
    monkeypatch.setattr(gguf_scenario, "light_streams",
                        lambda url, model, prompts, max_tokens, extra=None: [StreamResult(0.0, 1.0, 10)] * len(prompts))
    monkeypatch.setattr(ServerProcess, "resident_mib", lambda self: None)
    off, on, ref, ratio, _, _, light, _, resident = gguf_scenario._streams(EngineConfig(), None, tokens=32, rounds=1,
                                                                            lane=False)
    assert off == pytest.approx(10 * len(gguf_scenario.STREAM_PROMPTS) / 2.0)
    assert (on, ref, ratio, light, resident) == ("-", "not run", "-", "-", "-, -")


def test_layer_types_count_the_layer_matmuls_only(tmp_path):
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    rng = np.random.default_rng(0)
    for name, type_name in [("blk.0.attn_q.weight", "Q8_0"), ("blk.1.attn_q.weight", "Q8_0"),
                            ("blk.0.ffn_down.weight", "Q4_0"), ("token_embd.weight", "Q4_0")]:
        data = gguf.quants.quantize(rng.standard_normal((32, 64)).astype(np.float32), gguf.GGMLQuantizationType[type_name])
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType[type_name])
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert gguf_scenario.layer_types(path) == "Q8_0 x 2, Q4_0 x 1"


def test_requantize_runs_llama_quantize_once_and_reuses_its_file(tmp_path):
    calls = tmp_path / "calls"
    tool = tmp_path / "llama-quantize"
    tool.write_text(f"#!{sys.executable}\nimport sys, pathlib\n"
                    f"pathlib.Path({str(calls)!r}).open('a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                    "pathlib.Path(sys.argv[3]).write_text('quantized ' + sys.argv[4])\n")
    tool.chmod(0o755)
    source, out = tmp_path / "model.gguf", tmp_path / "cache" / "model.Q8_0.gguf"
    source.write_text("source")

    assert requantize(tool, source, out, "Q8_0") == out
    assert requantize(tool, source, out, "Q8_0") == out
    assert out.read_text() == "quantized Q8_0"
    assert calls.read_text().splitlines() == [f"--allow-requantize {source} {out}.partial Q8_0"]
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.Q8_0.gguf"]


def test_server_process_serves_until_the_block_ends_and_reports_its_memory(tmp_path):
    (tmp_path / "health").write_text("ok")
    port = free_port()
    command = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1", "--directory", str(tmp_path)]
    with server_process(command, port, timeout_s=30) as server:
        assert server.url == f"http://127.0.0.1:{port}"
        assert server.resident_mib() > 1
        status = Path(f"/proc/{server.pid}")
    assert not status.exists()


def test_a_server_that_exits_before_serving_is_an_error_with_its_log():
    command = [sys.executable, "-c", "import sys; print('no such model'); sys.exit(3)"]
    with pytest.raises(RuntimeError, match="(?s)status 3.*no such model"), server_process(command, free_port()):
        pass


def test_every_native_type_is_timed():
    measured, skipped = measured_types()
    native = [name for name, kind in TYPES.items() if kind.load == "native"]
    assert measured == native and not skipped
    assert set(measured) == set(SCALE_OFFSETS) | set(FLOAT_DTYPES)


@pytest.mark.parametrize("type_name", sorted(FLOAT_DTYPES))
def test_float_types_run_on_the_float_kernel_in_their_own_element_type(type_name):
    kernels = Kernels.load("auto")
    part = random_values(TYPES[type_name], 32, 64, np.random.default_rng(0))
    assert part.values.dtype == FLOAT_DTYPES[type_name] and 0.01 < float(part.values.float().std()) < 0.03
    weight = file_weight(part, kernels)
    if kernels.float_matmul is None:
        assert weight is None
        return
    x = torch.randn(3, 64).bfloat16()
    expected = x.float() @ part.values.float().T
    torch.testing.assert_close(weight.matmul(x).float(), expected, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("type_name", sorted(SCALE_OFFSETS))
def test_random_blocks_are_valid_weights_of_a_models_size(type_name):
    """A random float16 at a byte that is not the type's scale would be inf, nan or huge."""
    rows, cols = 64, 512
    raw = random_blocks(TYPES[type_name], rows, cols, np.random.default_rng(1))
    values = quantized_tensor(TYPES[type_name], raw, rows, cols).dequantize()
    reference = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[type_name]), np.float32)
    assert np.array_equal(values.numpy(), reference)
    assert np.isfinite(reference).all() and 1e-3 < np.abs(reference).max() < 8


@pytest.mark.parametrize(("type_name", "narrow"), [("Q5_0", True), ("Q6_K", True), ("Q8_0", False), ("Q4_0", False),
                                                   ("F16", False), ("F32", False)])
def test_the_byte_layout_arm_runs_for_the_types_kept_in_5_or_6_bits(type_name, narrow):
    kernels = Kernels.load("auto")
    if kernels.int8 is None:
        pytest.skip("no int8-group kernel here")
    rows, cols = 32, 256
    rng = np.random.default_rng(2)
    part = (random_values(TYPES[type_name], rows, cols, rng) if type_name in FLOAT_DTYPES
            else quantized_tensor(TYPES[type_name], random_blocks(TYPES[type_name], rows, cols, rng), rows, cols))
    weight = file_weight(part, kernels)
    assert kept_narrow(weight) is narrow
    if narrow:
        assert not kept_narrow(file_weight(part, Kernels.load("auto", narrow_weights=False)))


def test_load_note_warns_only_where_another_process_kept_a_core_busy():
    """A high load average after the scenario is its own engines' and clients' threads:
    the warning follows the other processes' CPU at its start."""
    quiet = gguf_scenario.load_note(0.5, 3.8, cores=2, threads=2, others=0.05)
    assert "Another process" not in quiet and "3.8 after" in quiet and "0.05 cores" in quiet
    assert "Another process kept a core busy" in gguf_scenario.load_note(1.2, 3.0, cores=2, threads=2, others=0.9)
    assert "Another process" not in gguf_scenario.load_note(1.2, 3.0, cores=2, threads=1, others=0.9)


def test_a_busy_neighbour_is_seen_at_the_start(monkeypatch):
    from speclane.engine import threads

    samples = iter([threads.CpuSample(busy_s=10.0, ours_s=1.0), threads.CpuSample(busy_s=10.9, ours_s=1.1)])
    monkeypatch.setattr(threads, "read_sample", lambda: next(samples))
    monkeypatch.setattr(gguf_scenario.time, "sleep", lambda s: None)
    assert gguf_scenario.busy_elsewhere(1.0) == pytest.approx(0.8)
