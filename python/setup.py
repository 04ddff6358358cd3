# SPDX-License-Identifier: BSD-3-Clause
"""chorus_torch for pip: `pip install --no-build-isolation ./python`, `pip wheel --no-build-isolation ./python`.

python/ is built from a chorus clone: pip (>= 21.3) builds a local folder in place, and this file
drives CMake on the whole repository (python/..), which is where the headers and the CMake project
are. The build
  1. configures the project with its tests, benchmarks, examples, CUDA, RDMA and install rules off,
     CHORUS_BUILD_TORCH=ON and CHORUS_TORCH_PYTHON set to the interpreter running pip, so the module
     is compiled for the torch that interpreter imports (its C++ ABI and pybind11 ABI tags);
  2. builds only the target chorus_torch (the module _C and the package assembled beside it, with
     the _version.py that python/CMakeLists.txt writes from include/chorus/version.hpp);
  3. copies _C<EXT_SUFFIX> and _version.py into the wheel's chorus_torch/ (the .py files come from
     python/chorus_torch through setuptools).
The distribution's version is read from include/chorus/version.hpp, the one place it is written, and
the wheel requires the exact torch it was compiled against. No network: --no-build-isolation makes
pip use the setuptools and wheel already installed (Debian's python3-setuptools, python3-wheel).

Environment:
  CMAKE_BUILD_PARALLEL_LEVEL  compile jobs (default 2)
  CMAKE_GENERATOR             CMake's generator (default Ninja where ninja is installed)
  CHORUS_TORCH_BUILD_DIR      the CMake build tree (default: <setuptools build_temp>/cmake). A tree
                              that is already configured (build/release, say) is used as it is,
                              only chorus_torch built in it, provided the interpreter it was
                              configured with has the same torch and module suffix as this one
  CHORUS_TORCH_CMAKE_ARGS     more configure arguments (split on spaces; a new tree only)
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VERSION_HPP = ROOT / "include" / "chorus" / "version.hpp"


def fail(message):
    raise SystemExit("chorus_torch setup.py: " + message)


def chorus_version():
    """"major.minor.patch" from include/chorus/version.hpp (the lines CMakeLists.txt reads too)."""
    if not VERSION_HPP.is_file():
        fail(f"{VERSION_HPP} is missing: python/ is built from a chorus clone (its parent folder is the "
             "repository); copying python/ alone, or an sdist, does not work")
    text = VERSION_HPP.read_text()
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(rf"^#define CHORUS_VERSION_{part} +([0-9]+) *$", text, re.M)
        if not m:
            fail(f"{VERSION_HPP}: no '#define CHORUS_VERSION_{part} <number>' line")
        parts.append(m.group(1))
    return ".".join(parts)


def torch_version():
    """The version of the torch this interpreter imports: the module is built for it."""
    try:
        import torch
    except ImportError as e:
        fail(f"{sys.executable} cannot import torch ({e}). chorus_torch is compiled against the torch "
             "of the interpreter that runs pip: on Debian install python3-torch and libtorch-dev "
             "(scripts/install-deps), use /usr/bin/python3 or a venv made with --system-site-packages, "
             "and pass --no-build-isolation (an isolated build environment has no torch)")
    return torch.__version__


def probe(python):
    """(torch version, module suffix) of an interpreter."""
    code = "import sysconfig, torch; print(torch.__version__); print(sysconfig.get_config_var('EXT_SUFFIX'))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return tuple(out.stdout.split())


def cache_entry(cache, name):
    m = re.search(rf"^{name}:[A-Z]+=(.*)$", cache, re.M)
    return m.group(1) if m else None


class CMakeBuild(build_ext):
    """build_ext for the one extension chorus_torch._C: CMake builds it, this copies it."""

    def build_extension(self, ext):
        build_dir = Path(os.environ.get("CHORUS_TORCH_BUILD_DIR") or Path(self.build_temp) / "cmake").resolve()
        jobs = os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL") or "2"
        suffix = sysconfig.get_config_var("EXT_SUFFIX")
        cache_file = build_dir / "CMakeCache.txt"
        if not cache_file.is_file():
            self.configure(build_dir, self.new_tree_args())
        else:
            self.check_tree(build_dir, cache_file.read_text(), suffix)
        self.run_cmd(["cmake", "--build", str(build_dir), "--target", "chorus_torch", "--parallel", jobs])

        pkg = build_dir / "python" / "chorus_torch"
        module = pkg / ("_C" + suffix)
        for f in (module, pkg / "_version.py"):
            if not f.is_file():
                fail(f"the CMake build did not make {f}")
        dest = Path(self.get_ext_fullpath(ext.name))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(module, dest)
        shutil.copyfile(pkg / "_version.py", dest.parent / "_version.py")

    @staticmethod
    def new_tree_args():
        args = [
            "-DCMAKE_BUILD_TYPE=Release",
            "-DCHORUS_BUILD_TESTS=OFF", "-DCHORUS_BUILD_BENCH=OFF", "-DCHORUS_BUILD_EXAMPLES=OFF",
            "-DCHORUS_WITH_CUDA=OFF", "-DCHORUS_WITH_RDMA=OFF", "-DCHORUS_INSTALL=OFF",
            "-DCHORUS_BUILD_TORCH=ON",
        ]
        if "CMAKE_GENERATOR" not in os.environ and shutil.which("ninja"):
            args += ["-G", "Ninja"]
        return args + os.environ.get("CHORUS_TORCH_CMAKE_ARGS", "").split()

    def configure(self, build_dir, args):
        self.run_cmd(["cmake", "-S", str(ROOT), "-B", str(build_dir), *args,
                      "-DCHORUS_TORCH_PYTHON=" + sys.executable])

    def check_tree(self, build_dir, cache, suffix):
        """A tree configured before (ours from an earlier build, or one named by
        CHORUS_TORCH_BUILD_DIR) is reused as it is when the interpreter it was configured for has
        this one's torch and module suffix. When that interpreter is gone (a venv since deleted),
        the tree is configured again for this one: the same torch flags recompile nothing."""
        if cache_entry(cache, "CHORUS_BUILD_TORCH") == "OFF":
            fail(f"{build_dir} was configured with CHORUS_BUILD_TORCH=OFF")
        python = cache_entry(cache, "CHORUS_TORCH_PYTHON") or "/usr/bin/python3"
        if not Path(python).exists():
            print(f"chorus_torch: {build_dir} was configured for {python}, which is gone", flush=True)
            self.configure(build_dir, [])
            return
        theirs = probe(python)
        ours = (torch_version(), suffix)
        if theirs != ours:
            fail(f"{build_dir} builds chorus_torch for {python} (torch, module suffix: {theirs}), "
                 f"not for {sys.executable} {ours}: name another CHORUS_TORCH_BUILD_DIR or none")
        print(f"chorus_torch: reusing the CMake tree {build_dir} (configured for {python})", flush=True)

    def run_cmd(self, args):
        print("chorus_torch:", " ".join(args), flush=True)
        try:
            subprocess.run(args, check=True)
        except FileNotFoundError:
            fail(f"{args[0]} not found (Debian: cmake, ninja-build; scripts/install-deps)")
        except subprocess.CalledProcessError as e:
            fail(f"'{' '.join(args)}' failed with exit status {e.returncode}")


setup(
    version=chorus_version(),
    install_requires=["torch==" + torch_version()],
    packages=["chorus_torch"],
    ext_modules=[Extension("chorus_torch._C", sources=[])],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
