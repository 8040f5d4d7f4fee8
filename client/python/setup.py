"""setup.py -- puts the C library (build/libapollo-client.so, the one place
the wire format is implemented) inside the package when it is built from a
source checkout: `make` first builds it; this runs `make
build/libapollo-client.so` when it is missing.  Everything else is in
pyproject.toml."""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))


class BuildWithLib(build_py):
    def run(self):
        lib = os.environ.get("APOLLO_LIB") or os.path.join(ROOT, "build", "libapollo-client.so")
        if not os.path.exists(lib) and os.path.exists(os.path.join(ROOT, "Makefile")):
            subprocess.check_call(["make", "-C", ROOT, "build/libapollo-client.so"])
        super().run()
        if os.path.exists(lib):
            dest = os.path.join(self.build_lib, "apollo")
            os.makedirs(dest, exist_ok=True)
            shutil.copy2(lib, os.path.join(dest, "libapollo-client.so"))


setup(cmdclass={"build_py": BuildWithLib})
