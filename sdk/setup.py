"""Generates the gRPC code from ../proto before setuptools looks for packages, so a wheel carries it."""

import importlib.util
from pathlib import Path

from setuptools import setup

# Load the generator by path: importing the package would need the code it is about to generate.
_path = Path(__file__).resolve().parent / "dspark_client" / "_codegen.py"
_spec = importlib.util.spec_from_file_location("_dspark_codegen", _path)
_codegen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_codegen)
if _codegen.proto_files():  # absent when building from an sdist that already carries the code
    _codegen.generate()

setup()
