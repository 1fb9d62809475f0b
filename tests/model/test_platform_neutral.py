"""The model is plain JAX: no module of avalon/model imports a kernel language or the FFI, or
asks which platform it runs on (a platform's functions reach it as `ops.Ops`). The import
contract in .importlinter keeps avalon.backends and jaxlib out; this reads what it cannot
(submodules of jax, and calls)."""

from __future__ import annotations

import ast
from pathlib import Path

import avalon.model

MODEL = Path(avalon.model.__file__).parent
FORBIDDEN_IMPORTS = ("jax.experimental.pallas", "jax.experimental.mosaic", "jax.ffi",
                     "jax.extend", "jax._src", "jaxlib", "avalon.backends")
# Attributes whose use means a question of platform or a kernel call.
FORBIDDEN_ATTRIBUTES = {"default_backend", "devices", "local_devices", "platform",
                        "traced_platform", "ffi_call", "pallas_call"}


def _findings(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        for name in names:
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN_IMPORTS):
                found.append(f"{path.name}:{node.lineno} imports {name}")
        if isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRIBUTES:
            found.append(f"{path.name}:{node.lineno} uses .{node.attr}")
        if isinstance(node, ast.Constant) and node.value in ("cpu", "gpu", "tpu", "cuda", "rocm"):
            found.append(f"{path.name}:{node.lineno} names the platform {node.value!r}")
    return found


def test_the_model_imports_no_kernel_language_and_never_asks_its_platform():
    files = sorted(MODEL.glob("*.py"))
    assert len(files) > 10
    found = [f for path in files for f in _findings(path)]
    assert found == []


def test_the_check_finds_what_it_looks_for(tmp_path):
    """The scan is not blind: each kind of finding in a small module."""
    bad = tmp_path / "bad.py"
    bad.write_text("import jax\nfrom jax.experimental.pallas import tpu\n"
                   "if jax.default_backend() == 'cpu':\n    pass\n"
                   "y = jax.ffi.ffi_call('k', None)\n")
    found = _findings(bad)
    assert any("imports jax.experimental.pallas" in f for f in found)
    assert any(".default_backend" in f for f in found)
    assert any("'cpu'" in f for f in found)
    assert any(".ffi_call" in f for f in found)
