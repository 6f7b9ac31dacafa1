"""Fixture for check_imports.py: the import back up into core."""
from .core import load_dict  # noqa: F401


def split(tensors):
    return list(tensors)
