"""Import-only stand-in for `torchvision` on CPU-only SGLang machines.

The registry's torchvision wheel is CUDA-linked and fails to load next to torch+cpu, yet
SGLang (multimodal processors, config modules) and transformers import it at module level
even when serving a text-only model. Here every `torchvision.<sub>.<module>` imports and
every name in it resolves to a placeholder class, so those imports succeed; calling or
instantiating a placeholder raises, so nothing silently computes with it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+parse.standin"
PARSE_STANDIN = True


class _PlaceholderMeta(type):
    """Metaclass of placeholders: attribute access yields further placeholders."""

    def __getattr__(cls, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _placeholder(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        raise RuntimeError(
            f"torchvision.{cls.__qualname__} is an import-only stand-in installed by "
            "sglang_cpu (CPU-only machine): torchvision is not available here."
        )


def _placeholder(qualname: str) -> type:
    return _PlaceholderMeta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname})


class _StandinModule(types.ModuleType):
    """A torchvision submodule whose missing attributes are placeholders."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        value = _placeholder(f"{self.__name__.removeprefix('torchvision.')}.{name}")
        setattr(self, name, value)
        return value


class _StandinFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves any `torchvision.*` submodule as a package-shaped `_StandinModule`."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandinModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


def __getattr__(name: str):
    """`torchvision.<sub>` without an import statement: import the stand-in submodule."""
    if name.startswith("__"):
        raise AttributeError(name)
    return importlib.import_module(f"{__name__}.{name}")


if not any(isinstance(f, _StandinFinder) for f in sys.meta_path):
    sys.meta_path.append(_StandinFinder())
