"""Argument helpers shared by the ``moir`` commands: the model flags and argparse types."""

from __future__ import annotations

import argparse
import re

__all__ = ["add_model_arguments", "organism_list", "parse_shard", "positive_int"]


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """``--profile`` (required) and ``--device``: how every model-loading command picks its model."""
    p.add_argument("--profile", required=True,
                   help="model profile (data/profiles/<NAME>.yaml) or a YAML path")
    p.add_argument("--device", default=None, help="e.g. cuda, cpu, auto (default: where the model loads)")


def positive_int(text: str) -> int:
    """An argparse type: a positive integer, with a clear message otherwise."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def organism_list(text: str) -> tuple[int, ...]:
    """An argparse type: pocket organisms as ``0,1,2`` (distinct integers >= 0, in the order given)."""
    try:
        organisms = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected organisms like 0,1,2, got {text!r}") from None
    if any(k < 0 for k in organisms) or len(set(organisms)) != len(organisms):
        raise argparse.ArgumentTypeError(f"expected distinct organisms >= 0 like 0,1,2, got {text!r}")
    return organisms


def parse_shard(text: str | None) -> tuple[int, int] | None:
    """``--shard "i/n"`` (0-based shard ``i`` of ``n``) -> ``(i, n)``; ``None`` stays ``None``."""
    if text is None:
        return None
    match = re.fullmatch(r"(\d+)/(\d+)", text.strip())
    if not match:
        raise ValueError(f"--shard must look like i/n (e.g. 0/4), got {text!r}")
    from moir_lib.generation import validate_shard

    return validate_shard((int(match.group(1)), int(match.group(2))))
