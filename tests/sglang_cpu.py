"""SGLang 0.5.23 in a CPU-only test environment (scripts/install.sh installs it without dependencies).

Its argument resolution, its DSpark loaders and its request types import on CPU, except that
sglang/srt/multimodal/internvl_utils.py imports torchvision at module level, and PyPI's torchvision is
built against CUDA torch (it fails to load beside the CPU torch these tests pin). Where no working
torchvision exists, `require_sglang` puts a stand-in for the three torchvision modules that import
touches; nothing here calls into it (image preprocessing only), and any use would fail loudly.
transformers decides once, at its import, whether torchvision is available: it is imported first, so
it keeps saying no and never reaches for the stand-in.
"""

from __future__ import annotations

import enum
import importlib.machinery
import importlib.util
import sys
import types

import pytest

SGLANG_VERSION = "0.5.23"


def require_sglang() -> None:
    """Skip the calling test module, saying why, unless SGLang's Python package can be imported."""
    if sys.version_info < (3, 11):
        pytest.skip("SGLang publishes no Python 3.10 wheels (3.11+ only)", allow_module_level=True)
    if importlib.util.find_spec("sglang") is None:
        pytest.skip(
            f"sglang is not installed (scripts/install.sh installs sglang=={SGLANG_VERSION} --no-deps "
            "with the dev extra on Python 3.11+)",
            allow_module_level=True,
        )
    install_torchvision_stand_in()


def install_torchvision_stand_in() -> None:
    if "torchvision" in sys.modules:
        return
    try:
        import torchvision  # noqa: F401  (a working one, e.g. on a GPU host)

        return
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
    import transformers  # noqa: F401  (decides torchvision is absent before the stand-in exists)

    class InterpolationMode(enum.Enum):
        NEAREST = "nearest"
        BILINEAR = "bilinear"
        BICUBIC = "bicubic"

    def unavailable(name: str):
        if name.startswith("__"):  # module protocol lookups (inspect, pickle) find nothing, as usual
            raise AttributeError(name)

        def call(*args, **kwargs):
            raise RuntimeError(f"torchvision.{name}: a stand-in on this CPU test machine, not torchvision")

        return call

    modules = {}
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        module.__getattr__ = unavailable
        modules[name] = module
    modules["torchvision"].transforms = modules["torchvision.transforms"]
    modules["torchvision.transforms"].functional = modules["torchvision.transforms.functional"]
    for name in ("torchvision.transforms", "torchvision.transforms.functional"):
        modules[name].InterpolationMode = InterpolationMode
    sys.modules.update(modules)
