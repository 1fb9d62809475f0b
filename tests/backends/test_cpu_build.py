"""Building the CPU kernels (`backends/cpu_build.py`): without a working compiler each kernel is
reported unavailable with one warning naming it and what is used instead, nothing half-written
is left in the cache, and the process's own registered kernels are untouched."""

import pytest

from avalon.backends import (
    cpu_attention,
    cpu_blas,
    cpu_build,
    cpu_gemm,
    cpu_log_softmax,
    cpu_optimizer,
    cpu_rms_norm,
    cpu_swiglu,
)


@pytest.mark.parametrize("module,what", [(cpu_gemm, "product"), (cpu_attention, "attention"),
                                         (cpu_log_softmax, "log-prob"), (cpu_blas, "BLAS"),
                                         (cpu_optimizer, "optimizer"),
                                         (cpu_rms_norm, "RMSNorm"), (cpu_swiglu, "SwiGLU")])
def test_no_compiler_warns_and_reports_unavailable(module, what, tmp_path, monkeypatch):
    if module is cpu_blas and cpu_blas.find_library() is None:
        pytest.skip("MKL is not installed here: the BLAS kernel is not built at all")
    monkeypatch.setenv(cpu_build.CACHE_ENV, str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.warns(UserWarning, match=f"CPU {what} kernel .* not available"):
        assert module.ready.__wrapped__() is False
    assert not list(tmp_path.iterdir())


def test_a_header_change_is_a_new_build(tmp_path, monkeypatch):
    """Every kernel's cache key covers the headers it includes."""
    monkeypatch.setenv(cpu_build.CACHE_ENV, str(tmp_path))
    before = cpu_build.library_path(cpu_attention.SOURCE)
    header = tmp_path / "extra.h"
    header.write_text("// changed\n")
    monkeypatch.setattr(cpu_build, "HEADERS", (*cpu_build.HEADERS, header))
    assert cpu_build.library_path(cpu_attention.SOURCE) != before


def test_without_mkl_the_blas_kernel_is_off_without_a_warning(tmp_path, monkeypatch):
    """MKL is optional: not finding it is no failure (no build, no warning)."""
    import warnings

    monkeypatch.setattr(cpu_blas, "find_library", lambda: None)
    monkeypatch.setenv(cpu_build.CACHE_ENV, str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cpu_blas.ready.__wrapped__() is False
    assert not list(tmp_path.iterdir())


def test_a_library_that_does_not_load_is_one_warning(tmp_path, monkeypatch):
    monkeypatch.setenv(cpu_blas.LIBRARY_ENV, str(tmp_path / "libmkl_rt.so.3"))
    with pytest.warns(UserWarning, match="CPU BLAS kernel .* does not load"):
        assert cpu_blas.ready.__wrapped__() is False
