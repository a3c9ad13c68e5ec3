"""Every build of every kernel source compiles, whatever this CPU runs: a machine loads
only its widest build, so a build no test machine runs would otherwise break unseen."""

import shutil

import pytest

from speclane.kernels import (
    attention_cpu,
    build,
    float_cpu,
    int4_cpu,
    int8_cpu,
    mtp_step_cpu,
    norm_cpu,
    plan_cpu,
)

BUILDS = sorted({(source.name, isa) for source, isas in [
    (int4_cpu.SOURCE, int4_cpu.ISAS), (int4_cpu.TILE_SOURCE, ("amx",)),
    (int4_cpu.INT8_INPUTS_SOURCE, int4_cpu.INT8_INPUTS_ISAS),
    (int8_cpu.SOURCE, int8_cpu.ISAS), (int8_cpu.TILE_SOURCE, ("amx",)),
    (int8_cpu.INT8_INPUTS_SOURCE, int8_cpu.INT8_INPUTS_ISAS),
    (attention_cpu.SOURCE, attention_cpu.ISAS),
    (norm_cpu.SOURCE, norm_cpu.ISAS), (float_cpu.SOURCE, float_cpu.ISAS), (mtp_step_cpu.SOURCE, mtp_step_cpu.ISAS),
    (plan_cpu.SOURCE, plan_cpu.ISAS)] for isa in isas})


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="no C compiler here")
@pytest.mark.parametrize(("source", "isa"), BUILDS)
def test_every_build_compiles(tmp_path, source, isa):
    out = tmp_path / f"{source}-{isa}.so"
    build.compile_build(int4_cpu.SOURCE.with_name(source), isa, out)
    assert out.stat().st_size > 0


def test_a_source_that_includes_another_rebuilds_when_that_one_changes(tmp_path):
    """int8_amx.c includes int8_x86.c: a build cached under the old digest would miss its changes."""
    (tmp_path / "a.h").write_text("// header\n")
    (tmp_path / "inner.c").write_text("int inner(void) { return 1; }\n")
    outer = tmp_path / "outer.c"
    outer.write_text('#include "inner.c"\n')
    before = build.digest(outer)
    (tmp_path / "inner.c").write_text("int inner(void) { return 2; }\n")
    assert build.digest(outer) != before


def test_a_build_that_does_not_compile_falls_back_to_the_next_narrower_one(monkeypatch):
    """An older compiler without the CPU's newest flags (-mavx512bf16 before GCC 10) loses
    that build only, not the kernel: the next narrower build this CPU runs loads instead."""
    runnable = [isa for isa in int4_cpu.ISAS if not build.missing_cpu_flags(isa)]
    if len(runnable) < 2:
        pytest.skip("this CPU runs one build of the int4 kernel")
    tried = []

    def load_build(source, isa, declare):
        tried.append(isa)
        if isa == runnable[0]:
            raise build.KernelUnavailable(f"cc failed on {source.name}: unknown flag")
        return build.Kernel(None, isa)  # type: ignore[arg-type]

    monkeypatch.setattr(build, "load_build", load_build)
    assert build.load(int4_cpu.SOURCE, int4_cpu.declare, int4_cpu.ISAS).isa == runnable[1]
    assert tried == runnable[:2]

    def never(source, isa, declare):
        raise build.KernelUnavailable(f"{isa} failed")

    monkeypatch.setattr(build, "load_build", never)
    with pytest.raises(build.KernelUnavailable, match=f"^{runnable[0]} failed$"):  # the widest build's reason
        build.load(int4_cpu.SOURCE, int4_cpu.declare, int4_cpu.ISAS)
