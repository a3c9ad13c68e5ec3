"""The command line (`speclane generate`, `speclane models`) and errors a user can cause.

User errors end with one line on stderr, ``speclane <command>: error: ...``, and exit
status 2, never a traceback. These run the installed ``speclane`` script in a
subprocess, as a user would.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from speclane.models.loader import resolve_model
from speclane.request import SamplingParams

FAST = ["--dtype", "float32", "--quantization", "none", "--spec-mode", "off", "--num-threads", "1",
        "--max-model-len", "256"]


def speclane(*args: str, timeout: float = 300, stdin: str = "") -> subprocess.CompletedProcess[str]:
    script = Path(sys.executable).parent / "speclane"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "speclane.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout, env=env, input=stdin)


def assert_one_line_error(result: subprocess.CompletedProcess[str], message: str) -> None:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, f"expected one line, got:\n{result.stderr}"
    assert lines[0].startswith("speclane generate: error: ") and message in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def test_cli_rejects_a_negative_temperature():
    assert_one_line_error(speclane("generate", "hi", "--temperature", "-1"), "temperature must be >= 0")


def test_cli_rejects_an_unknown_model():
    assert_one_line_error(speclane("generate", "hi", "--model", "no-such-model"), "unknown model 'no-such-model'")


@pytest.mark.parametrize("where", ["flag", "env"])
def test_cli_rejects_an_unknown_kernel_choice(where):
    """--kernels / SPECLANE_KERNELS is checked with the rest of the config: a bad value is
    a one-line start-up error, not a failure at the first forward."""
    script = Path(sys.executable).parent / "speclane"
    command = [str(script)] if script.exists() else [sys.executable, "-m", "speclane.cli"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", **({"SPECLANE_KERNELS": "cuda"} if where == "env" else {})}
    flag = ["--kernels", "cuda"] if where == "flag" else []
    result = subprocess.run([*command, "generate", "hi", "--spec-mode", "off", "--max-model-len", "256", *flag],
                            capture_output=True, text=True, timeout=300, env=env)
    assert_one_line_error(result, "kernels must be one of auto, native, torch; got 'cuda'")


def test_cli_models_lists_the_default_and_where_it_resolves():
    result = speclane("models")
    assert result.returncode == 0, result.stderr
    assert "smollm2-135m-instruct" in result.stdout
    assert str(resolve_model("smollm2-135m-instruct")) in result.stdout


@pytest.mark.slow
def test_cli_rejects_a_prompt_longer_than_max_model_len():
    result = speclane("generate", "word " * 300, "--raw", *FAST)
    assert_one_line_error(result, "but --max-model-len is 256")


def test_cli_rejects_max_tokens_past_the_context():
    result = speclane("generate", "Hi", "--max-tokens", "3000", *FAST)
    assert_one_line_error(result, "--max-tokens is 3000 but the prompt has")


@pytest.mark.slow
def test_cli_generate_reads_a_piped_prompt():
    for args in ((), ("-",)):
        result = speclane("generate", *args, "--max-tokens", "12", *FAST, stdin="What is the capital of France?\n")
        assert result.returncode == 0 and "Paris" in result.stdout, result.stderr
    assert_one_line_error(speclane("generate", "-", *FAST, stdin="  \n"), "standard input is empty")


@pytest.mark.slow
def test_cli_generate_prints_the_answer():
    result = speclane("generate", "What is the capital of France?", "--max-tokens", "12", *FAST)
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout


@pytest.mark.slow
def test_cli_generate_takes_the_sampling_penalties():
    prompt = ("Copy this line exactly: the cat and the dog and the bird and the fish and the cow and the horse and "
              "the goat.")
    plain = speclane("generate", prompt, "--max-tokens", "24", *FAST)
    penalised = speclane("generate", prompt, "--max-tokens", "24", "--frequency-penalty", "1.5",
                         "--repetition-penalty", "1.3", "--min-p", "0.05", *FAST)
    assert plain.returncode == penalised.returncode == 0, penalised.stderr
    assert penalised.stdout.strip() and penalised.stdout != plain.stdout
    assert_one_line_error(speclane("generate", "hi", "--min-p", "2", *FAST), "--min-p must be in [0, 1]")


@pytest.mark.slow
def test_api_rejects_a_prompt_longer_than_max_model_len(llm_f32):
    too_long = [1] * llm_f32.engine.max_model_len
    with pytest.raises(ValueError, match=f"{len(too_long)} tokens but --max-model-len is {len(too_long)}"):
        llm_f32.generate([too_long], SamplingParams(max_tokens=1))
    with pytest.raises(ValueError, match="temperature must be >= 0"):
        llm_f32.generate(["hi"], SamplingParams(temperature=-1))


def test_speclane_script_is_installed():
    assert shutil.which("speclane", path=str(Path(sys.executable).parent)) is not None


@pytest.mark.slow
def test_cli_generate_with_the_shipped_mtp_head_reports_drafts():
    result = speclane("generate", "--drafter", "mtp", "--num-draft-tokens", "2", "--max-tokens", "24", "--usage",
                      "--num-threads", "1", "--max-model-len", "256", "Why is the sky blue?")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert '"draft_tokens"' in result.stderr or "draft_tokens" in result.stderr, result.stderr


def test_cli_mtp_head_for_another_model_is_one_line_error(tmp_path):
    head = tmp_path / "head"
    shutil.copytree(Path(__file__).resolve().parents[2] / "src/speclane/heads/smollm2-135m-instruct", head)
    config = (head / "config.json").read_text().replace('"hidden_size": 576,\n    "num_layers"', '"hidden_size": 640,\n    "num_layers"')
    (head / "config.json").write_text(config)
    result = speclane("generate", *FAST[:4], "--drafter", "mtp", "--mtp-head", str(head), "hello")
    assert_one_line_error(result, "was trained for 'smollm2-135m-instruct'")


@pytest.mark.slow
def test_cli_train_mtp_end_to_end_on_a_tiny_budget(tmp_path):
    """The whole command: data from the real target, a few steps, a loadable head, a report."""
    out = tmp_path / "mtp"
    result = speclane("train-mtp", "--out", str(out), "--prompts", "4", "--max-new-tokens", "12", "--concurrency", "4",
                      "--steps", "3", "--batch-size", "2", "--held-out", "0.25", "--num-threads", "1", timeout=600)
    assert result.returncode == 0, result.stderr
    assert "[data] 4/4 prompts" in result.stderr and "[train] step 3/3" in result.stderr
    assert (out / "mtp-head" / "model.safetensors").exists() and (out / "report.json").exists()
    again = speclane("train-mtp", "--out", str(out), "--prompts", "4", "--steps", "3", "--num-threads", "1", timeout=600)
    assert again.returncode == 0 and "4 samples already generated" in again.stderr  # resumes from its shards
