"""The README and the guides in docs/ say what the code does: every example in them is checked.

- every ```yaml block validates. The HTML comment on the line before it says what it is:
  ``<!-- yaml: study -->`` a whole study file (read by the study loader, as ``ablate validate``
  reads one, without looking for its data files), ``<!-- yaml: fragment -->`` top-level keys of a
  study (checked inside a small valid study, ``MINIMAL``), ``<!-- yaml: fragment in base -->`` keys
  of its ``base:``. A block with no such comment fails: an example nobody checks rots;
- every ``ablate ...`` line of a ```bash block parses with the real command line (click's parser:
  the command, its options and arguments exist; nothing runs); inline code that starts with
  ``ablate`` names a command and options that exist;
- every ``python -m MODULE`` names an importable module, every ``python FILE.py`` and ``bash FILE``
  an existing file, every ``make TARGET`` a target of the Makefile, in bash blocks and inline code;
- every ```python block compiles;
- every relative link (and image) points to an existing file, and its ``#anchor`` to a heading of
  that file (GitHub's anchors).

The checks are functions of a Markdown text, so the tests at the end run them on small synthetic
pages to show that each one fails on a broken example.
"""

from __future__ import annotations

import copy
import importlib.util
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

MARKER = re.compile(r"^<!--\s*yaml:\s*(study|fragment|fragment in base)\s*-->$")
MINIMAL: dict[str, Any] = {
    "name": "docs-example",
    "base": {
        "model": {"preset": "tiny"},
        "data": {"corpus": "builtin"},
        "train": {"steps": 20, "batch_size": 4, "seq_len": 32, "eval_every": 10},
    },
    "grid": {"seed": [0]},
}
"""The study a fragment is checked in: valid on its own."""


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int
    """The line of the opening fence, from 1."""
    marker: str | None
    """What the HTML comment on the line before the fence says (``study``, ``fragment``, ...)."""


def blocks(text: str) -> list[Block]:
    """The fenced code blocks of a Markdown text."""
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^\s*(```+|~~~+)\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        fence, lang, start = m.group(1), m.group(2).lower(), i
        prev = next((x.strip() for x in reversed(lines[:i]) if x.strip()), "")
        marker = MARKER.match(prev)
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        out.append(Block(lang, "\n".join(body), start + 1, marker.group(1) if marker else None))
        i += 1
    return out


def prose(text: str) -> str:
    """The text with its fenced blocks blanked (line numbers kept)."""
    lines = text.splitlines()
    for b in blocks(text):
        for j in range(b.line - 1, b.line + b.code.count("\n") + 2):
            if j < len(lines):
                lines[j] = ""
    return "\n".join(lines)


def inline_code(text: str) -> list[tuple[int, str]]:
    """(line, content) of every inline code span outside the fenced blocks."""
    return [
        (n, m.group(2))
        for n, line in enumerate(prose(text).splitlines(), 1)
        for m in re.finditer(r"(`+)([^`]+?)\1", line)
    ]


# --- YAML ----------------------------------------------------------------------------------------


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in extra.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def yaml_problems(text: str, where: str, tmp: Path) -> list[str]:
    """Each ```yaml block: marked, and valid as what its marker says."""
    from ablate.errors import StudyError
    from ablate.study import load_study, parse_study
    from ablate.study.loader import parse_yaml

    out = []
    for b in blocks(text):
        if b.lang not in ("yaml", "yml"):
            continue
        at = f"{where}:{b.line}"
        if b.marker is None:
            out.append(
                f"{at}: a yaml block needs a comment before it saying what it is: "
                "<!-- yaml: study -->, <!-- yaml: fragment --> or <!-- yaml: fragment in base -->"
            )
            continue
        try:
            if b.marker == "study":
                path = tmp / f"example-{b.line}.yaml"
                path.write_text(b.code + "\n")
                load_study(path, output=tmp / "out", check_files=False)
                continue
            raw = parse_yaml(b.code, at)
            if not isinstance(raw, dict):
                out.append(f"{at}: a fragment is a mapping of keys, not {type(raw).__name__}")
                continue
            extra = {"base": raw} if b.marker == "fragment in base" else raw
            merged = _merge(MINIMAL, extra)
            model = merged["base"].get("model", {})
            if isinstance(model, dict) and model.get("hf") is not None:
                model.pop("preset", None)  # the minimal study's preset gives way to an hf model
            parse_study(merged, output=tmp / "out", check_files=False)
        except StudyError as e:
            out.append(f"{at}: the {b.marker} does not validate: {e}")
    return out


# --- commands ------------------------------------------------------------------------------------


def _makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M)}


def _commands(line: str) -> list[list[str]]:
    """The simple commands of one shell line (split at &&, ||, ;, |), comments and leading
    variable assignments dropped."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return [line.split()]
    out: list[list[str]] = [[]]
    for w in words:
        if w in ("&&", "||", ";", "|"):
            out.append([])
        else:
            out[-1].append(w)
    cleaned = []
    for cmd in out:
        while cmd and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", cmd[0]):
            cmd = cmd[1:]
        if cmd:
            cleaned.append(cmd)
    return cleaned


def _shell_lines(code: str) -> list[tuple[int, str]]:
    """(offset, line) of each logical line of a shell block (backslash continuations joined)."""
    out: list[tuple[int, str]] = []
    pending, start = "", 0
    for n, raw in enumerate(code.splitlines()):
        line = raw.strip()
        if line.startswith("$ "):
            line = line[2:]
        if not pending:
            start = n
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append((start, pending + line))
        pending = ""
    if pending:
        out.append((start, pending))
    return out


def ablate_problem(args: list[str], *, complete: bool) -> str | None:
    """Why ``ablate ARGS`` does not parse (None: it does). ``complete``: a whole command line, its
    required arguments given; else (prose) only the command and its options must exist."""
    from ablate.cli import main

    if not args:
        return "no command" if complete else None
    try:
        ctx = main.make_context("ablate", list(args))
        rest = [*ctx.protected_args, *ctx.args]
        cmd = main.get_command(ctx, rest[0]) if rest else None
        if cmd is None:
            return f"no command {rest[0]!r}" if rest else "no command"
        cmd.make_context(rest[0], rest[1:], parent=ctx)
    except click.exceptions.Exit:  # --help, --version
        return None
    except click.MissingParameter as e:
        return e.format_message() if complete else None
    except click.ClickException as e:
        return e.format_message()
    return None


def command_problem(cmd: list[str], *, complete: bool) -> str | None:
    """Why one simple command names something that does not exist (None: nothing to say)."""
    prog = cmd[0].rsplit("/", 1)[-1]
    if prog == "ablate":
        why = ablate_problem(cmd[1:], complete=complete)
        return f"`{shlex.join(cmd)}` does not parse: {why}" if why else None
    if prog in ("python", "python3") and len(cmd) > 1:
        if cmd[1] == "-m" and len(cmd) > 2:
            if importlib.util.find_spec(cmd[2]) is None:
                return f"`python -m {cmd[2]}`: no module {cmd[2]!r}"
        elif cmd[1].endswith(".py") and not (ROOT / cmd[1]).is_file():
            return f"`python {cmd[1]}`: no such file"
    if prog == "bash" and len(cmd) > 1 and not (ROOT / cmd[1]).is_file():
        return f"`bash {cmd[1]}`: no such file"
    if prog == "make":
        targets = [a for a in cmd[1:] if "=" not in a and not a.startswith("-")]
        missing = [t for t in targets if t not in _makefile_targets()]
        if missing:
            return f"`{shlex.join(cmd)}`: the Makefile has no target {', '.join(missing)}"
    return None


def command_problems(text: str, where: str) -> list[str]:
    """Each command of the ```bash blocks (whole lines), and of inline code spans (the command and
    its options only: prose names a command without all its arguments)."""
    out = []
    for b in blocks(text):
        if b.lang not in ("bash", "sh", "shell", "console"):
            continue
        for offset, line in _shell_lines(b.code):
            for cmd in _commands(line):
                if why := command_problem(cmd, complete=True):
                    out.append(f"{where}:{b.line + 1 + offset}: {why}")
    for n, span in inline_code(text):
        if not re.match(r"^(\S+=\S+\s+)*(\S*/)?(ablate|python3?|make|bash)\s", span):
            continue
        for cmd in _commands(span):
            if why := command_problem(cmd, complete=False):
                out.append(f"{where}:{n}: {why}")
    return out


def python_problems(text: str, where: str) -> list[str]:
    out = []
    for b in blocks(text):
        if b.lang == "python":
            try:
                compile(b.code, f"{where}:{b.line}", "exec")
            except SyntaxError as e:
                out.append(f"{where}:{b.line}: the python block does not compile: {e}")
    return out


# --- links ---------------------------------------------------------------------------------------


def anchors(text: str) -> set[str]:
    """GitHub's anchors of a Markdown text's headings: lower case, punctuation dropped, spaces to
    hyphens; a repeated one gets -1, -2, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(text).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def link_problems(text: str, path: Path) -> list[str]:
    """Each relative link and image of the page: the file exists, and so does its anchor."""
    out = []
    body = prose(text)
    for n, line in enumerate(body.splitlines(), 1):
        line = re.sub(r"(`+)[^`]+?\1", "", line)  # inline code is not a link
        for m in re.finditer(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", line):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            where = f"{path.name}:{n}"
            if not dest.exists():
                out.append(f"{where}: link to {target}: no such file")
                continue
            if anchor:
                if dest.suffix != ".md" or dest.is_dir():
                    out.append(
                        f"{where}: link to {target}: an anchor into a file that is not Markdown"
                    )
                elif anchor not in anchors(dest.read_text() if dest != path else text):
                    out.append(f"{where}: link to {target}: no heading #{anchor} in {dest.name}")
    return out


# --- the pages -----------------------------------------------------------------------------------


def _page_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_yaml_example_validates(page, tmp_path):
    assert yaml_problems(page.read_text(), _page_id(page), tmp_path) == []


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_command_names_what_exists(page):
    assert command_problems(page.read_text(), _page_id(page)) == []


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_python_example_compiles(page):
    assert python_problems(page.read_text(), _page_id(page)) == []


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_relative_link_points_to_a_file_and_heading(page):
    assert link_problems(page.read_text(), page) == []


def test_the_pages_have_examples_to_check():
    found = [b for p in PAGES for b in blocks(p.read_text())]
    assert sum(b.lang == "yaml" for b in found) >= 10
    assert sum(b.lang == "bash" for b in found) >= 10
    assert len(PAGES) >= 10


# --- the checker fails on what is broken ------------------------------------------------------------

BROKEN = """# A page

## Good

<!-- yaml: study -->
```yaml
name: fine
base: {model: {preset: tiny}, train: {steps: 10, batch_size: 4, seq_len: 32}}
grid: {seed: [0, 1]}
```

<!-- yaml: fragment in base -->
```yaml
recipe: nvidia_nvfp4
```

```bash
ablate run studies/quickstart.yaml --max-concurrent 2   # a comment
python -m ablate.bench.train --presets tiny
make test-fast
```

## Broken

<!-- yaml: study -->
```yaml
name: typo
base: {model: {preset: tiny}}
grid: {intervention: [none, rth]}
```

<!-- yaml: fragment -->
```yaml
resources: {cpus: 1, gpu: 1}
```

```yaml
name: unmarked
```

```bash
ablate run studies/quickstart.yaml --max-concurent 2
ablate plot studies/quickstart.yaml
ablate validate
python -m ablate.no_such_module
OMP_NUM_THREADS=1 python tests/no_such_script.py
make no-such-target && make test
```

See `ablate recipe --no-such-flag`, `ablate nocommand S.yaml` and `python -m backends.nope`.

```python
def broken(:
```

[a file](no_such_page.md), [a heading](#good), [no heading](#nowhere),
![an image](no_such_image.png), [the web](https://example.org/x.md).
"""


def test_the_checker_finds_each_kind_of_broken_example(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(BROKEN)
    yaml = yaml_problems(BROKEN, "page.md", tmp_path)
    assert len(yaml) == 3, yaml
    assert yaml[0].startswith("page.md:26: the study does not validate:") and "'rth'" in yaml[0]
    assert yaml[1].startswith("page.md:33: the fragment does not validate:") and "gpu" in yaml[1]
    assert yaml[2].startswith("page.md:37: a yaml block needs a comment before it")

    commands = command_problems(BROKEN, "page.md")
    expected = [
        ("page.md:42:", "No such option '--max-concurent'"),
        ("page.md:43:", "no command 'plot'"),
        ("page.md:44:", "Missing argument 'STUDY.yaml'"),
        ("page.md:45:", "no module 'ablate.no_such_module'"),
        ("page.md:46:", "tests/no_such_script.py`: no such file"),
        ("page.md:47:", "no target no-such-target"),
        ("page.md:50:", "No such option '--no-such-flag'"),
        ("page.md:50:", "no command 'nocommand'"),
        ("page.md:50:", "no module 'backends.nope'"),
    ]
    assert len(commands) == len(expected), commands
    for problem, (at, what) in zip(commands, expected, strict=True):
        assert problem.startswith(at) and what in problem, (problem, at, what)

    python = python_problems(BROKEN, "page.md")
    assert len(python) == 1 and python[0].startswith("page.md:52: the python block does not")

    links = link_problems(BROKEN, page)
    assert links == [
        "page.md:56: link to no_such_page.md: no such file",
        "page.md:56: link to #nowhere: no heading #nowhere in page.md",
        "page.md:57: link to no_such_image.png: no such file",
    ]


def test_anchors_follow_github():
    text = "# Memory per device (`ablate plan`)\n## The suite's times\n## Axes\n## Axes\n"
    assert anchors(text) == {
        "memory-per-device-ablate-plan",
        "the-suites-times",
        "axes",
        "axes-1",
    }


def test_make_quickstart_leaves_the_kept_report_alone():
    # a newcomer's clone stays clean: the quickstart's own report goes under runs/ (ignored by
    # git); the kept reports/quickstart/ is rewritten only by an explicit `ablate report`
    import shutil
    import subprocess

    if shutil.which("make") is None:
        pytest.skip("no make")
    dry = subprocess.run(
        ["make", "-n", "quickstart"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    cmds = [shlex.split(line) for line in dry.splitlines() if "bin/ablate " in line]
    runs = [c for c in cmds if c[1] == "run"]
    reports = [c for c in cmds if c[1] == "report"]
    assert runs and all("--no-report" in c for c in runs), dry
    assert reports, dry
    for c in reports:
        out = c[c.index("-o") + 1] if "-o" in c else "reports/quickstart"
        assert out.split("/")[0] == "runs", f"`make quickstart` writes its report into {out}"
    assert "runs/" in (ROOT / ".gitignore").read_text().splitlines()
