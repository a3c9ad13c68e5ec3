"""The prompt kernel (kernels/int4_amx.c, SPECLANE_PROMPT_KERNEL=amx): its maths, its batch
invariance, and that the model gives it prompt positions only."""

import pytest
import torch
from int4_weights import random_int4_weight

from speclane.kernels import build, int4_cpu
from speclane.models.linear import Int4Weight

has_amx = int4_cpu.available() and not build.missing_cpu_flags("amx")
needs_amx = pytest.mark.skipif(not has_amx, reason="no AMX (amx_tile, amx_bf16) on this CPU")


@pytest.fixture
def amx():
    with int4_cpu.using_prompt("amx"):
        yield


def test_off_by_default_and_a_bad_value_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(int4_cpu.PROMPT_SWITCH, raising=False)
    int4_cpu._prompt_kernel.cache_clear()
    assert int4_cpu.prompt_library() is None
    with int4_cpu.using_prompt("tiles"), pytest.raises(build.KernelUnavailable, match="expected one of off, amx"):
        int4_cpu.prompt_library()


@pytest.mark.skipif(has_amx or not int4_cpu.available(), reason="this CPU has AMX")
def test_asking_for_it_without_amx_says_what_is_missing(amx):
    with pytest.raises(build.KernelUnavailable, match="amx"):
        int4_cpu.prompt_library()


@needs_amx
@pytest.mark.parametrize("rows", [1, 15, 16, 17, 96])
@pytest.mark.parametrize("shape", [(192, 576), (80, 1536)])
def test_matches_float64_reference_and_the_int4_matmul(amx, rows, shape):
    q, scale, minimum, dense = random_int4_weight(*shape)
    weight = Int4Weight(q, scale, minimum)
    assert weight.prompt_kernel
    x = torch.randn(rows, shape[1]).bfloat16()
    got = weight.matmul_prompt(x)
    assert got.dtype == torch.bfloat16 and got.shape == (rows, shape[0])
    assert torch.allclose(got.double(), x.double() @ dense.double().T, rtol=2**-8, atol=1e-4)
    # The same arithmetic as the int4 matmul but for the tile unit's order of adding a
    # group's 32 products: after the bfloat16 rounding nearly every output is the same.
    assert (got == weight.matmul(x)).float().mean() > 0.99


@needs_amx
def test_a_rows_result_does_not_depend_on_its_neighbours(amx):
    """Row blocks of 16, padding, threads splitting columns: a prompt chunked any way gives the same bits."""
    q, scale, minimum, _ = random_int4_weight(1552, 576)
    weight = Int4Weight(q, scale, minimum)
    x = torch.randn(70, 576).bfloat16()
    whole = weight.matmul_prompt(x)
    for first, last in ((0, 1), (0, 16), (3, 20), (16, 17), (5, 70), (40, 70)):
        assert torch.equal(weight.matmul_prompt(x[first:last].contiguous()), whole[first:last]), (first, last)
