"""Where in a YAML document a field is: the line a validation error points at, a key written
twice, the dotted name of a pydantic error location.

The spec's loader (`sweep.plan.spec.parse_spec`) validates the data PyYAML loads, which has lost
its lines; these functions walk the composed node tree instead, so that an error names the
file's line and field. Pure: no I/O.
"""

from __future__ import annotations

from typing import Any

import yaml


def field_path(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the dotted field a user wrote (`run.env`, `models[0]`),
    without pydantic's markers of which branch of a union it tried."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        elif item in ("str", "catalog", "inline", "InlineModel") or "[" in str(item) \
                or str(item).startswith("literal") or str(item).startswith("function"):
            continue  # pydantic's union-branch markers are not fields
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def first_duplicate_key(node: yaml.Node | None, path: str = "") -> tuple[str, int, int] | None:
    """The first key that a YAML mapping repeats (its dotted path and both 1-based lines), or
    None. PyYAML keeps the last value of a repeated key without a word, so a spec with two
    `constraints:` blocks (say, one pasted from `sweep memory-check --write-constants`) would
    lose the first one's settings silently."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[object, int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            field = f"{path}.{name}" if path else str(name)
            line = key.start_mark.line + 1
            if name is not None and name in seen:
                return field, seen[name], line
            if name is not None:
                seen[name] = line
            found = first_duplicate_key(value, field)
            if found is not None:
                return found
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            found = first_duplicate_key(item, f"{path}[{index}]")
            if found is not None:
                return found
    return None


def line_of(node: yaml.Node | None, loc: tuple[Any, ...]) -> int:
    """The 1-based line of the deepest YAML node that `loc` reaches."""
    line = node.start_mark.line + 1 if node is not None else 0
    for key in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if k.value == key), None)
            if match is None:
                key_node = next((k for k, _ in node.value if k.value == key), None)
                return key_node.start_mark.line + 1 if key_node else line
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            continue
        line = node.start_mark.line + 1
    return line
