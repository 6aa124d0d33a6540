"""Classes named in a config as ``package.module:ClassName`` (the service, the authenticator,
the authorisation service): found the same way, every failure one line naming the key."""

from __future__ import annotations

import importlib

__all__ = ["find_class"]


def find_class(spec: str, label: str, usage: str, error: type[Exception]) -> type:
    """The class ``spec`` names; ``error(f"{label}: ...")`` when it names none (``usage`` says
    what a valid name looks like)."""
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise error(f"{label}: {usage}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as ex:
        raise error(f"{label}: cannot import {module_name}: {ex}") from None
    cls = getattr(module, class_name, None)
    if cls is None:
        raise error(f"{label}: {module_name} has no {class_name}")
    return cls
