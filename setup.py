"""Builds the op library `kvstats._C` from cuda_ext/csrc (the pytorch/extension-cpp recipe).

The .cpp files always compile (CPU kernels, OpenMP). The .cu files are added, and the build switches
to CUDAExtension, only when torch was built with CUDA and CUDA_HOME is known. Set
KVSTATS_NO_EXTENSION=1 to install the pure-Python package (the references run instead).
"""

import glob
import hashlib
import json
import os
import subprocess

from setuptools import setup

#: the record of what the op library was built from, written beside it (kvstats.study.fingerprint.extension_identity)
BUILD_RECORD = "_C.build.json"


def build_record(here: str, csrc: str, flags: dict, cuda: bool) -> dict:
    """What a build of kvstats._C depends on, independent of where the checkout lies: the sha256 of every file under
    cuda_ext/csrc (relative path and bytes), the compile flags, torch's version and CUDA's, and the compiler's
    first line of ``--version``. The binary itself embeds the checkout's absolute paths (the sources' __FILE__ in
    torch's checks), so its bytes differ between two checkouts of one commit."""
    import torch

    digest = hashlib.sha256()
    for path in sorted(glob.glob(os.path.join(here, csrc, "**", "*"), recursive=True)):
        if os.path.isfile(path):
            digest.update(os.path.relpath(path, here).encode() + b"\0")
            digest.update(open(path, "rb").read())
    try:
        compiler = subprocess.run([os.environ.get("CXX", "c++"), "--version"], capture_output=True, text=True,
                                  check=False).stdout.splitlines()[:1]
    except OSError:
        compiler = []
    return {"sources_sha256": digest.hexdigest(), "flags": {k: list(v) for k, v in flags.items()},
            "torch": torch.__version__,
            "cuda": torch.version.cuda if cuda else None, "compiler": compiler[0] if compiler else "unknown"}

ext_modules = []
cmdclass = {}

if os.environ.get("KVSTATS_NO_EXTENSION", "0") != "1":
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

    here = os.path.dirname(os.path.abspath(__file__))
    csrc = os.path.join("cuda_ext", "csrc")
    sources = sorted(glob.glob(os.path.join(csrc, "*.cpp")) + glob.glob(os.path.join(csrc, "cpu", "*.cpp"))
                     + glob.glob(os.path.join(csrc, "shared", "*.cpp")))
    cuda_sources = sorted(glob.glob(os.path.join(csrc, "cuda", "*.cu")))
    use_cuda = (
        os.environ.get("KVSTATS_FORCE_CPU", "0") != "1"
        and torch.version.cuda is not None
        and CUDA_HOME is not None
        and len(cuda_sources) > 0
    )
    # ninja's default (cores + 2 compilers) oversubscribes a small machine: each compile of these kernels holds
    # about 1 GB, and on 2 busy cores 3-6 of them took 21 min. One compiler per core unless MAX_JOBS says otherwise.
    os.environ.setdefault("MAX_JOBS", str(max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                              else os.cpu_count() or 1)))
    print(f"kvstats: compiling the extension kvstats._C ({len(sources)} C++ files, MAX_JOBS={os.environ['MAX_JOBS']}; "
          "KVSTATS_NO_EXTENSION=1 skips it, the pure-torch references then run)", flush=True)
    debug = os.environ.get("KVSTATS_DEBUG", "0") == "1"
    cxx_flags = ["-O0", "-g"] if debug else ["-O3", "-march=x86-64-v2"]
    # torch.utils.cpp_extension does not add OpenMP: without it at::parallel_for runs on one thread.
    cxx_flags += ["-fopenmp"]
    # No multiply-add is contracted behind the code's back (GCC's C++ default is fast): a kernel compiled for FMA
    # (the row kernels' scores) rounds once per term only where it says so, every query row alike.
    cxx_flags += ["-ffp-contract=off"]
    extra_compile_args = {"cxx": cxx_flags}
    extra_link_args = ["-fopenmp"]
    include_dirs = [os.path.join(here, csrc)]
    Extension = CppExtension
    if use_cuda:
        Extension = CUDAExtension
        sources += cuda_sources
        extra_compile_args["nvcc"] = ["-O3", "-lineinfo"]
        # CUDA 13 wheels of torch ship the CUDA headers inside site-packages/nvidia/cu13/include.
        site_packages = os.path.dirname(os.path.dirname(torch.__file__))
        include_dirs += sorted(glob.glob(os.path.join(site_packages, "nvidia", "cu*", "include")))
    ext_modules = [
        Extension(
            "kvstats._C",
            sources,
            include_dirs=include_dirs,
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
            py_limited_api=True,
        )
    ]
    record = build_record(here, csrc, extra_compile_args, use_cuda)

    class BuildAndRecord(BuildExtension):
        """torch's BuildExtension, then the build record beside the library where it lands (the package folder of
        an in-place build, else the build folder a wheel is made from)."""

        def run(self):
            super().run()
            for ext in self.extensions:
                folder = os.path.dirname(self.get_ext_fullpath(ext.name))
                with open(os.path.join(folder, BUILD_RECORD), "w", encoding="utf-8") as f:
                    json.dump(record, f, indent=2, sort_keys=True)
                    f.write("\n")

    cmdclass = {"build_ext": BuildAndRecord}

setup(
    ext_modules=ext_modules,
    cmdclass=cmdclass,
    options={"bdist_wheel": {"py_limited_api": "cp39"}} if ext_modules else {},
)
