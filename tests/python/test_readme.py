"""The README's examples, so that they cannot rot (as cJSON does with its README):
- its C programs compile (C99, -Wall -Wextra -Werror against fusedk.h) and run: the drop-in ones
  (FUSEDK_IMPLEMENTATION) alone, the others linked with the built libfusedk;
- its Python blocks compile, and run, each in a fresh interpreter: the NumPy one always, the JAX
  ones where JAX is installed (XLA:CPU is enough), the PyTorch and CuPy ones where the framework
  and a CUDA device are there."""
import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys

import pytest

import fusedk

ROOT = os.environ.get("FUSEDK_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))
LIBRARY = os.environ.get("FUSEDK_LIBRARY")  # set by meson test: the built libfusedk


def blocks(lang):
    with open(os.path.join(ROOT, "README.md")) as f:
        return re.findall(rf"```{lang}\n(.*?)```", f.read(), re.S)


def c_blocks():
    return [b for b in blocks("c") if "int main" in b]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
@pytest.mark.parametrize("i", range(len(c_blocks())))
def test_readme_c_snippet_builds_and_runs(i, tmp_path):
    code = c_blocks()[i]
    src = tmp_path / "snippet.c"
    src.write_text(code)
    exe = tmp_path / "snippet"
    cmd = ["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-I", ROOT, str(src), "-o", str(exe)]
    if "#define FUSEDK_IMPLEMENTATION" not in code:  # a program using the installed library
        if not LIBRARY or not os.path.isfile(LIBRARY):
            pytest.skip("FUSEDK_LIBRARY (the built libfusedk) not set")
        cmd += [os.path.abspath(LIBRARY), "-Wl,-rpath," + os.path.dirname(os.path.abspath(LIBRARY))]
    subprocess.run(cmd + ["-lm"], check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip(), "the snippet printed nothing"


def test_readme_has_a_c_snippet():
    assert c_blocks()


def imported(code):
    """The top-level packages a block imports."""
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


PY_BLOCKS = blocks("python")


def _cuda_devices():
    return bool(fusedk.kernel_info()["cuda"].get("devices"))


@pytest.mark.parametrize("i", range(len(PY_BLOCKS)))
def test_readme_python_block_compiles(i):
    compile(PY_BLOCKS[i], f"README.md python block {i}", "exec")


@pytest.mark.parametrize("i", range(len(PY_BLOCKS)))
def test_readme_python_block_runs(i):
    code = PY_BLOCKS[i]
    frameworks = imported(code) - {"numpy", "ml_dtypes", "fusedk"}
    for fw in sorted(frameworks):
        if importlib.util.find_spec(fw) is None:
            pytest.skip(f"{fw} not installed")
    if frameworks & {"torch", "cupy"} and not _cuda_devices():
        pytest.skip(f"{' and '.join(sorted(frameworks))} block: needs a CUDA device")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                       env={**os.environ, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"})
    assert r.returncode == 0, f"README.md python block {i} failed:\n{code}\n{r.stdout}\n{r.stderr}"


def test_readme_numpy_block_is_standalone():
    """One block needs nothing but NumPy, ml_dtypes and fusedk: it runs on any machine."""
    assert any(imported(b) <= {"numpy", "ml_dtypes", "fusedk"} and "numpy" in imported(b) for b in PY_BLOCKS)
