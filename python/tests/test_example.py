"""examples/engine_step.py: its logic on the CPU backend (eager, --cpu), and the real thing
(CUDA graph, replayed) on a GPU."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("torch", reason="examples/engine_step.py needs torch (CI installs only "
                    "numpy and pytest)")

import smla  # noqa: E402
from conftest import cuda_available  # noqa: E402

if not smla.HAVE_TORCH:
    pytest.skip("smla was imported without torch (SMLA_NO_TORCH=1)", allow_module_level=True)

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
EXAMPLE = os.path.join(ROOT, "examples", "engine_step.py")


def run(*args):
    r = subprocess.run([sys.executable, EXAMPLE] + list(args), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "all steps match the reference" in r.stdout, r.stdout
    return r.stdout


@pytest.mark.parametrize("fmt", ["bf16", "fp8_ds"])
def test_engine_step_cpu(fmt):
    run("--cpu", "--steps", "2", "--format", fmt)


@pytest.mark.skipif(not cuda_available(), reason="needs torch with a GPU "
                    "(torch.cuda.is_available() is False)")
@pytest.mark.parametrize("fmt,heads", [("bf16", 16), ("bf16", 128), ("fp8_ds", 64)])
def test_engine_step_cuda_graph(fmt, heads):
    out = run("--format", fmt, "--heads", str(heads))
    assert "captured" in out
