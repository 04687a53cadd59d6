"""YAML from files r1trade did not write, read as `yaml.safe_load` reads it but within limits: no alias bomb,
no runaway nesting, no repeated key silently replacing the first, no number that YAML 1.1 reads in another
base."""

from __future__ import annotations

import re
from typing import Any

import yaml

from r1trade.errors import clip

MAX_YAML_NODES = 100_000
"""Nodes a document may expand to, an alias counting as a copy of its anchor (stops alias bombs)."""
MAX_YAML_DEPTH = 50
"""Nesting a document may have (configs need five levels); YAML's composer recurses once a level."""
_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")


class YamlLimitError(yaml.MarkedYAMLError):
    """A document refused by `_BoundedLoader`: too large, too deep, self-referring or ambiguous."""


class _BoundedLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that checks every node as it is composed, before any Python object is built.

    It refuses documents that expand past MAX_YAML_NODES or nest past MAX_YAML_DEPTH, aliases inside their own
    anchor, keys repeated in a mapping (the last would silently win) and plain numbers that YAML 1.1 reads in
    another base (`010` is 8, `1:30` is 90).
    """

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.depth = 0
        self.composed = 0
        self.sizes: dict[int, int] = {}  # id(node) -> nodes it expands to (composed nodes all stay alive)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node:
        """Compose one node, counting it and its children's expanded sizes against the limits."""
        mark = self.peek_event().start_mark
        alias = self.check_event(yaml.AliasEvent)
        if not alias:
            self.composed += 1
        self.depth += 1
        if self.depth > MAX_YAML_DEPTH:
            raise YamlLimitError(problem=f"nested deeper than {MAX_YAML_DEPTH} levels", problem_mark=mark)
        if self.composed > MAX_YAML_NODES:
            raise YamlLimitError(problem=f"more than {MAX_YAML_NODES:,} nodes", problem_mark=mark)
        node = super().compose_node(parent, index)
        self.depth -= 1
        if alias:
            if id(node) not in self.sizes:
                raise YamlLimitError(problem="an alias inside its own anchor", problem_mark=mark)
            return node
        if isinstance(node, yaml.MappingNode):
            self._check_keys(node)
            children = [child for pair in node.value for child in pair]
        elif isinstance(node, yaml.SequenceNode):
            children = node.value
        else:
            self._check_number(node)
            children = []
        size = 1 + sum(self.sizes[id(child)] for child in children)
        if size > MAX_YAML_NODES:
            problem = f"aliases expand to more than {MAX_YAML_NODES:,} nodes"
            raise YamlLimitError(problem=problem, problem_mark=mark)
        self.sizes[id(node)] = size
        return node

    @staticmethod
    def _check_keys(node: yaml.MappingNode) -> None:
        """A repeated key would silently replace the first one's whole value (a whole section, say)."""
        seen: set[tuple[str, str]] = set()
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                if (key.tag, key.value) in seen:
                    problem = f"key '{clip(key.value)}' repeated"
                    raise YamlLimitError(problem=problem, problem_mark=key.start_mark)
                seen.add((key.tag, key.value))

    @staticmethod
    def _check_number(node: yaml.ScalarNode) -> None:
        """YAML 1.1 reads `010` as octal 8 and `1:30` as 90 (base 60): almost never what was meant."""
        if node.tag in _NUMBER_TAGS and (":" in node.value or re.fullmatch(r"[-+]?0[0-9_]+", node.value)):
            raise YamlLimitError(
                problem=f"ambiguous number '{clip(node.value)}' (YAML 1.1 reads a leading 0 as octal and ':'"
                " as base 60): drop the leading zeros, or quote it as text",
                problem_mark=node.start_mark,
            )


def load_yaml(text: str) -> Any:
    """The one document in `text`, as `yaml.safe_load` reads it but within `_BoundedLoader`'s limits."""
    loader = _BoundedLoader(text)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


