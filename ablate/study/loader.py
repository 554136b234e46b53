"""Reading a study file safely: bytes -> strict UTF-8 -> YAML with limits -> plain Python data.

A study file is small and hand-written; anything else is refused with one ``StudyError`` line that
names the file and what is wrong, before any of it is expanded:

- not UTF-8 (a binary file, UTF-16, a stray Latin-1 byte): the byte offset of the first bad byte;
- a key given twice in one mapping (YAML says keys are unique; PyYAML would keep the last one
  silently, and a study could quietly get another name): both lines. Merge keys (``<<: *defaults``)
  merge, and a key written beside a merged one overrides it, as YAML 1.1 says;
- nesting deeper than ``MAX_DEPTH`` (PyYAML's composer recurses, so 20,000 nested brackets would
  overflow Python's stack), more than ``MAX_ALIASES`` alias references, more than ``MAX_NODES``
  values once aliases are expanded (a "billion laughs" bomb is a few lines that expand to 10^9
  values), or a file larger than ``MAX_BYTES``.

The depth, alias and size limits are checked on PyYAML's event stream (an iterative parser) before
any node is composed, so a hostile file costs at most a linear scan of its bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ablate.data.paths import not_a_file
from ablate.errors import StudyError
from ablate.study.messages import short_key

MAX_BYTES = 1 << 20  # 1 MiB: a study is a few KB
MAX_DEPTH = 64
MAX_ALIASES = 1_000
MAX_NODES = 200_000  # values after alias expansion; a 10,000-cell grid written out is far less


_MERGE = "tag:yaml.org,2002:merge"


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping, and merges merge keys
    (``<<: *defaults``, ``<<: [*a, *b]``) as YAML 1.1 says: a key written in the mapping overrides
    a merged one, and an earlier merged mapping a later one (PyYAML 6.0.4's own flattening lets the
    later win, and loses an override made in a mapping that is merged in turn)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._flat: set[yaml.Node] = set()  # the mappings already checked and flattened

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        if node in self._flat:  # once: another mapping that merges it may come first
            return
        self._flat.add(node)
        # the keys the mapping wrote, before any merging: a mapping that is only merged in (never
        # constructed on its own) is checked here too
        self._check_unique(node.value)
        merged: list[list[tuple[yaml.Node, yaml.Node]]] = []
        own: list[tuple[yaml.Node, yaml.Node]] = []
        for key_node, value_node in node.value:
            if key_node.tag != _MERGE:
                own.append((key_node, value_node))
                continue
            subs = value_node.value if isinstance(value_node, yaml.SequenceNode) else [value_node]
            for sub in subs:
                if not isinstance(sub, yaml.MappingNode):
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"expected a mapping or a list of mappings to merge (<<), found {sub.id}",
                        sub.start_mark,
                    )
                self.flatten_mapping(sub)
                merged.append(sub.value)
        # each key once, where it first comes (the merged mappings in order, then the mapping's
        # own), with the value that takes precedence: its own, else the earliest merged mapping's
        out: list[tuple[yaml.Node, yaml.Node]] = []
        at: dict[tuple[str, Any], int] = {}
        for pairs, wins in [*((m, False) for m in merged), (own, True)]:
            for k, v in pairs:
                key = (k.tag, k.value) if isinstance(k, yaml.ScalarNode) else None
                if key is None or key not in at:
                    if key is not None:
                        at[key] = len(out)
                    out.append((k, v))
                elif wins:
                    out[at[key]] = (k, v)
        node.value = out

    def _check_unique(self, pairs: list[tuple[yaml.Node, yaml.Node]]) -> None:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in pairs:
            merge = key_node.tag == _MERGE
            key = "<<" if merge else self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: let PyYAML say so
                continue
            if first is not None:
                # keeping one of two merge keys would drop a merged mapping: say how to keep both
                fix = "write one merge key with a list: <<: [*a, *b]" if merge else "keep one"
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {short_key(key)!r} is given twice (line "
                    f"{first.start_mark.line + 1} and line {key_node.start_mark.line + 1}); {fix}",
                    key_node.start_mark,
                )
            seen[key] = key_node


def check_yaml_limits(text: str) -> None:
    """Depth, alias and expanded-size limits, from the event stream (nothing composed yet);
    ValueError saying which. Any YAML the project reads from a user goes through it (a study, a
    recipe variant on the command line)."""
    depth = aliases = 0
    # expanded size of each anchored node, and of the collections being read (a stack)
    sizes: dict[str, int] = {}
    stack: list[list[Any]] = []  # [anchor, size so far]
    total = 0

    def add(n: int) -> None:
        nonlocal total
        if stack:
            stack[-1][1] += n
        else:
            total += n
        if total + sum(s for _, s in stack) > MAX_NODES:
            raise ValueError(
                f"it expands to more than {MAX_NODES:,} values (YAML aliases repeat what they "
                "point at); a study is a few hundred values: write it out without the aliases"
            )

    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                line = event.start_mark.line + 1 if event.start_mark else "?"
                raise ValueError(
                    f"line {line}: nested more than {MAX_DEPTH} levels deep; a study needs a handful"
                )
            stack.append([event.anchor, 1])
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
            anchor, size = stack.pop()
            if anchor is not None:
                sizes[anchor] = size
            add(size)
        elif isinstance(event, yaml.ScalarEvent):
            if event.anchor is not None:
                sizes[event.anchor] = 1
            add(1)
        elif isinstance(event, yaml.AliasEvent):
            aliases += 1
            if aliases > MAX_ALIASES:
                raise ValueError(f"more than {MAX_ALIASES:,} YAML aliases (*name); write it out")
            add(sizes.get(event.anchor or "", 1))


def read_study_text(path: str | Path) -> str:
    """The study file as text; ``StudyError`` if it is missing, too large or not UTF-8."""
    p = Path(path)
    why = not_a_file(p)  # never opens a named pipe: its read would wait for a writer
    if why == "does not exist":
        raise StudyError([f"{path}: no such study file"])
    if why is not None:
        raise StudyError([f"{path}: the study file {why}"])
    size = p.stat().st_size
    if size > MAX_BYTES:
        raise StudyError([f"{path}: {size:,} bytes; a study file is at most {MAX_BYTES:,}"])
    data = p.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise StudyError(
            [
                f"{path}: not UTF-8 text (byte {e.start}: {data[e.start : e.start + 1]!r}); save "
                "the study as UTF-8 YAML"
            ]
        ) from None


def parse_yaml(text: str, source: str | None = None) -> Any:
    """The YAML document in ``text`` as plain data; ``StudyError`` naming what is wrong."""
    try:
        check_yaml_limits(text)
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except ValueError as e:  # the limits above
        raise StudyError([str(e)], source) from None
    except yaml.YAMLError as e:
        raise StudyError([f"not valid YAML: {e}"], source) from None
    except RecursionError:  # a limit above should have caught it; never a 3,000-line traceback
        raise StudyError(["nested too deeply to read"], source) from None
