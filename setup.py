"""Builds the native delta engine's CPython extension; pyproject.toml holds the metadata."""

from glob import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "native._delta",
            sources=["native/python/_deltamodule.c", *sorted(glob("native/src/*.c"))],
            include_dirs=["native/include", "native/src"],
            libraries=["xxhash", "zstd", "m"],
            extra_compile_args=["-O3", "-std=c11", "-D_GNU_SOURCE", "-pthread"],
            extra_link_args=["-pthread"],
        )
    ]
)
