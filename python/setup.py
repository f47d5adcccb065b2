"""Builds libsmla with the project's Makefile and bundles it into the package, so that
`pip install ./python` (or a wheel from `python -m build python`) gives an `import smla`
that works with no environment variable.

- The C sources: the repository root above this folder (an in-tree install), or csrc/
  inside an sdist (copied there when the sdist is made).
- CUDA: the Makefile's own detection (nvcc on PATH or in /usr/local/cuda) builds the GPU
  kernels too; SMLA_CUDA=0 in the environment builds the CPU library only. The CUDA runtime
  is linked statically, so the bundled library also loads where there is no GPU or CUDA.
- SMLA_MAKE_JOBS: parallel compile jobs (default: the CPU count).
"""

import os
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
C_PARTS = ["Makefile", "include", "src", "smla.pc.in"]


def c_root():
    for root in (os.path.dirname(HERE), os.path.join(HERE, "csrc")):
        if all(os.path.exists(os.path.join(root, p)) for p in C_PARTS):
            return root
    raise RuntimeError("smla: the C sources (Makefile, include/, src/) are neither above "
                       "python/ nor in csrc/: install from the repository or an sdist")


def build_library(dest_dir):
    root = c_root()
    build = tempfile.mkdtemp(prefix="smla-build-")
    jobs = os.environ.get("SMLA_MAKE_JOBS", str(os.cpu_count() or 2))
    cmd = ["make", "-C", root, "-j" + jobs, "BUILD=" + build, "lib"]
    if os.environ.get("SMLA_CUDA") == "0":
        cmd.append("CUDA=0")
    print("smla: building libsmla:", " ".join(cmd))
    subprocess.check_call(cmd)
    real = [f for f in os.listdir(build) if f.startswith("libsmla.so.") and
            f.count(".") == 4]  # libsmla.so.X.Y.Z, not the soname link
    if len(real) != 1:
        raise RuntimeError("smla: make built %s, expected one libsmla.so.X.Y.Z" % real)
    os.makedirs(dest_dir, exist_ok=True)
    shutil.copy2(os.path.join(build, real[0]), os.path.join(dest_dir, "libsmla.so"))
    shutil.rmtree(build, ignore_errors=True)


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        build_library(os.path.join(self.build_lib, "smla"))


class SdistWithSources(sdist):
    """Copies the C sources into csrc/ so that the sdist can build the library alone."""

    def run(self):
        root = os.path.dirname(HERE)
        dst = os.path.join(HERE, "csrc")
        if all(os.path.exists(os.path.join(root, p)) for p in C_PARTS):
            shutil.rmtree(dst, ignore_errors=True)
            for p in C_PARTS:
                src = os.path.join(root, p)
                (shutil.copytree if os.path.isdir(src) else shutil.copy2)(
                    src, os.path.join(dst, p))
        super().run()


try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70.1
    from wheel.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    """The wheel carries a native library: tagged for the platform, any Python 3 (ctypes)."""

    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        return ("py3", "none", super().get_tag()[2])


setup(cmdclass={"build_py": BuildPyWithLibrary, "sdist": SdistWithSources,
                "bdist_wheel": PlatformWheel})
