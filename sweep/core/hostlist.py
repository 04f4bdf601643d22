"""Slurm host lists: `node[1-3,7],gpu01` <-> ["node1", "node2", "node3", "node7", "gpu01"]."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand(hostlist: str) -> list[str]:
    """Every host of a list, in order (what `scontrol show hostnames` prints)."""
    hosts: list[str] = []
    for item in _split_top_level(hostlist):
        match = re.fullmatch(r"([^\[\]]*)\[([^\[\]]+)\](.*)", item)
        if match is None:
            if "[" in item or "]" in item:
                raise ValueError(f"malformed host list entry {item!r}")
            hosts.append(item)
            continue
        prefix, ranges, suffix = match.groups()
        for part in ranges.split(","):
            bounds = _RANGE.match(part)
            if bounds is None:
                raise ValueError(f"malformed range {part!r} in {item!r}")
            low, high = bounds.group(1), bounds.group(2) or bounds.group(1)
            width = len(low) if low.startswith("0") else 0
            for number in range(int(low), int(high) + 1):
                hosts.extend(expand(f"{prefix}{number:0{width}d}{suffix}"))
    return hosts


def _split_top_level(hostlist: str) -> list[str]:
    items, depth, current = [], 0, ""
    for char in hostlist.strip():
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += char
    if depth:
        raise ValueError(f"unbalanced brackets in host list {hostlist!r}")
    items.append(current)
    return [item for item in items if item]
