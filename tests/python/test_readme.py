"""The README's C snippets compile (C99, -Wall -Wextra -Werror against fusedk.h alone) and run,
as cJSON does with its README."""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.environ.get("FUSEDK_SOURCE_ROOT", os.path.join(os.path.dirname(__file__), "..", ".."))


def c_blocks():
    with open(os.path.join(ROOT, "README.md")) as f:
        return [b for b in re.findall(r"```c\n(.*?)```", f.read(), re.S) if "int main" in b]


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
@pytest.mark.parametrize("i", range(len(c_blocks())))
def test_readme_c_snippet_builds_and_runs(i, tmp_path):
    src = tmp_path / "snippet.c"
    src.write_text(c_blocks()[i])
    exe = tmp_path / "snippet"
    subprocess.run(["cc", "-std=c99", "-Wall", "-Wextra", "-Werror", "-I", ROOT, str(src), "-o", str(exe), "-lm"],
                   check=True)
    r = subprocess.run([str(exe)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip(), "the snippet printed nothing"


def test_readme_has_a_c_snippet():
    assert c_blocks()
