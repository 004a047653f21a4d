"""Build steps that pyproject.toml cannot declare: the native delta engine's CPython
extension, and the protobuf code generated from proto/ (scripts/protogen.py)."""

import sys
from glob import glob
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).resolve().parent / "scripts"))
import protogen


class BuildPyWithProtos(build_py):
    """Generates meridian/v1 into the source tree before the packages are collected,
    so a wheel and an editable install both carry code made from the current .proto
    files."""

    def run(self) -> None:
        protogen.generate()
        super().run()


setup(
    cmdclass={"build_py": BuildPyWithProtos},
    ext_modules=[
        Extension(
            "native._delta",
            sources=["native/python/_deltamodule.c", *sorted(glob("native/src/*.c"))],
            # a header change rebuilds every object (build_ext tracks only these)
            depends=["native/include/meridian_delta.h", "native/src/md_internal.h"],
            include_dirs=["native/include", "native/src"],
            libraries=["xxhash", "zstd", "m"],
            extra_compile_args=["-O3", "-std=c11", "-D_GNU_SOURCE", "-pthread"],
            extra_link_args=["-pthread"],
        )
    ],
)
