"""The SLURM allocation this process runs in, read from the environment SLURM gives a job: its id,
its nodes in order (``SLURM_JOB_NODELIST``, a compressed host list such as ``n[1-3,5],gpu-a[01-02]``,
expanded here), the CPUs of each (``SLURM_JOB_CPUS_PER_NODE``: ``2(x3),1``), the GPUs per node, the
node this process runs on (``SLURMD_NODENAME``; unset in an ``salloc`` shell on the login node) and
how often the job was requeued (``SLURM_RESTART_COUNT``).

Every problem raises ``SlurmError`` naming the variable, its value and what was expected, before
anything starts. Pure functions of a mapping: the tests feed them any environment.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from ablate.errors import CannotRunError

if TYPE_CHECKING:
    from ablate.study import Study

T = TypeVar("T")


class SlurmError(CannotRunError):
    """The SLURM allocation cannot run the study as asked (outside an allocation, a variable that
    does not parse, a cell larger than a node, a port another process holds): a refusal before
    anything starts, exit status 2."""


@dataclass(frozen=True)
class Allocation:
    """What a job holds: ``nodes`` in SLURM's order (the first runs the batch script), the CPUs and
    GPUs of each."""

    job_id: int
    nodes: tuple[str, ...]
    cpus: tuple[int, ...]
    """CPUs of each node, in the order of ``nodes``."""
    gpus_per_node: int
    this_node: str | None
    """The node this process runs on; None outside a job step (an ``salloc`` shell)."""
    restarts: int = 0

    @property
    def head(self) -> str:
        """The node that runs the driver and Ray's head: the first (the batch script's)."""
        return self.nodes[0]

    def cpus_of(self, node: str) -> int:
        return self.cpus[self.nodes.index(node)]

    def describe(self) -> str:
        """One line: job, nodes and what each holds."""
        gpus = f", {self.gpus_per_node} GPU(s) each" if self.gpus_per_node else ""
        per = ", ".join(f"{n}: {c} CPUs" for n, c in zip(self.nodes, self.cpus, strict=True))
        again = f", requeued {self.restarts}x" if self.restarts else ""
        return f"job {self.job_id} on {len(self.nodes)} node(s) ({per}{gpus}{again})"


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_hostlist(text: str) -> list[str]:
    """SLURM's compressed host list, expanded in order: ``n[1-3,5],gpu-a[01-02]`` -> n1, n2, n3, n5,
    gpu-a01, gpu-a02 (zero padding kept; several bracket groups in one name multiply out).
    ``ValueError`` naming what does not parse."""
    text = text.strip()
    if not text:
        raise ValueError("an empty host list")
    names: list[str] = []
    depth, start = 0, 0
    for i, ch in enumerate(text + ","):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ValueError(f"nested brackets at {text[: i + 1]!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError(f"a ']' without its '[' at {text[: i + 1]!r}")
        elif ch == "," and depth == 0:
            names.extend(_expand_one(text[start:i]))
            start = i + 1
    if depth:
        raise ValueError(f"a '[' without its ']' in {text!r}")
    return names


def _expand_one(item: str) -> list[str]:
    """One host expression with any number of bracket groups: ``rack[1-2]-n[01-02]``."""
    if not item:
        raise ValueError("an empty host name (two commas, or a comma at an end)")
    m = re.match(r"^([^\[\]]*)\[([^\[\]]*)\](.*)$", item)
    if not m:
        if re.search(r"[\s\[\]]", item):
            raise ValueError(f"{item!r} is not a host name")
        return [item]
    prefix, ranges, rest = m.groups()
    out: list[str] = []
    for part in ranges.split(","):
        r = _RANGE.match(part.strip())
        if not r:
            raise ValueError(f"{part!r} in [{ranges}] is not a number or a range a-b")
        lo, hi = r.group(1), r.group(2) or r.group(1)
        if int(hi) < int(lo):
            raise ValueError(f"the range {part!r} in [{ranges}] runs backwards")
        if int(hi) - int(lo) > 100_000:
            raise ValueError(f"the range {part!r} in [{ranges}] is implausibly long")
        width = len(lo) if lo.startswith("0") else 0
        for k in range(int(lo), int(hi) + 1):
            out.extend(f"{prefix}{k:0{width}d}{tail}" for tail in _expand_one_rest(rest))
    return out


def _expand_one_rest(rest: str) -> list[str]:
    return _expand_one(rest) if rest else [""]


_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def expand_counts(text: str) -> list[int]:
    """SLURM's compressed per-node counts: ``2(x3),1`` -> 2, 2, 2, 1. ``ValueError`` naming what
    does not parse."""
    out: list[int] = []
    for part in text.strip().split(","):
        m = _COUNT.match(part.strip())
        if not m:
            raise ValueError(f"{part!r} is not a count or count(xN)")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def gpus_from(value: str) -> int:
    """GPUs per node from ``SLURM_GPUS_PER_NODE`` / ``SLURM_GPUS_ON_NODE``: ``4``, ``a100:4``, or a
    list of types ``a100:2,v100:1`` (summed). ``ValueError`` naming what does not parse."""
    total = 0
    for part in value.strip().split(","):
        count = part.rsplit(":", 1)[-1].split("(")[0]
        if not count.isdigit():
            raise ValueError(f"{part!r} is not a GPU count (4, or type:4)")
        total += int(count)
    return total


def _var(env: Mapping[str, str], name: str, parse: Callable[[str], T], what: str) -> T:
    value = env.get(name, "")
    try:
        return parse(value)
    except ValueError as e:
        raise SlurmError(f"{name}={value!r} does not parse as {what}: {e}") from None


def read_allocation(env: Mapping[str, str]) -> Allocation:
    """The allocation described by ``env`` (a job's environment). ``SlurmError`` outside an
    allocation (no ``SLURM_JOB_ID``), or naming the variable that does not parse or does not agree
    with the node list."""
    if not env.get("SLURM_JOB_ID"):
        raise SlurmError(
            "not inside a SLURM allocation (SLURM_JOB_ID is not set): run `ablate slurm run` in "
            "an sbatch script or an salloc session, or let `ablate slurm submit` write the script "
            "and submit it"
        )
    job = _var(env, "SLURM_JOB_ID", int, "a job id")
    listed = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    name = "SLURM_JOB_NODELIST" if env.get("SLURM_JOB_NODELIST") else "SLURM_NODELIST"
    try:
        nodes = expand_hostlist(listed)
    except ValueError as e:
        raise SlurmError(
            f"{name}={listed!r} does not parse as a SLURM host list (such as n[1-3,5],gpu01): {e}"
        ) from None
    if len(set(nodes)) != len(nodes):
        raise SlurmError(f"{name}={listed!r} names a node twice")
    cpus_text = env.get("SLURM_JOB_CPUS_PER_NODE", "")
    if cpus_text:
        cpus = _var(env, "SLURM_JOB_CPUS_PER_NODE", expand_counts, "CPUs per node (2(x3),1)")
        if len(cpus) != len(nodes):
            raise SlurmError(
                f"SLURM_JOB_CPUS_PER_NODE={cpus_text!r} gives {len(cpus)} node(s), but "
                f"{name}={listed!r} lists {len(nodes)}"
            )
    elif env.get("SLURM_CPUS_ON_NODE"):
        cpus = [_var(env, "SLURM_CPUS_ON_NODE", int, "a CPU count")] * len(nodes)
    else:
        raise SlurmError(
            "neither SLURM_JOB_CPUS_PER_NODE nor SLURM_CPUS_ON_NODE is set: not a SLURM job's "
            "environment"
        )
    gpus = 0
    for var in ("SLURM_GPUS_PER_NODE", "SLURM_GPUS_ON_NODE"):
        if env.get(var):
            gpus = _var(env, var, gpus_from, "GPUs per node (4, or a100:4)")
            break
    here = env.get("SLURMD_NODENAME") or None
    if here is not None and here not in nodes:
        raise SlurmError(f"SLURMD_NODENAME={here!r} is not among the job's nodes {nodes}")
    restarts = _var(env, "SLURM_RESTART_COUNT", lambda v: int(v or 0), "a count")
    return Allocation(job, tuple(nodes), tuple(cpus), gpus, here, restarts)


def check_fits(study: Study, alloc: Allocation, *, asked: str = "") -> None:
    """A cell's worker must fit one node's CPUs and GPUs, and a cell's ``resources.workers`` the
    nodes together; ``SlurmError`` naming the fields, what the nodes hold and the fix. ``asked``:
    the ``ablate slurm submit`` options that gave this shape (the message names them)."""
    res = study.file.resources
    each = [
        min(int(c // res.cpus), int(alloc.gpus_per_node // res.gpus) if res.gpus else c)
        for c in alloc.cpus
    ]
    if asked:
        have = (
            f"a node as asked holds {alloc.cpus[0]} CPUs and {alloc.gpus_per_node} GPU(s) ({asked})"
        )
        more = "raise --cpus-per-node / --gpus-per-node"
        nodes = f"--nodes {len(alloc.nodes)}"
    else:
        per = ", ".join(f"{n}: {c} CPUs" for n, c in zip(alloc.nodes, alloc.cpus, strict=True))
        have = f"job {alloc.job_id}'s nodes hold {per}, {alloc.gpus_per_node} GPU(s) each"
        more = "ask SLURM for more per node (sbatch --cpus-per-task, --gpus-per-node)"
        nodes = f"job {alloc.job_id}'s {len(alloc.nodes)} node(s)"
    if max(each) == 0:
        raise SlurmError(
            f"resources: a cell asks for {res.cpus:g} CPU(s) and {res.gpus:g} GPU(s) per worker, "
            f"more than a node has: {have}; lower resources.cpus / resources.gpus, or {more}"
        )
    if sum(each) < res.workers:
        raise SlurmError(
            f"resources.workers: {res.workers} workers of {res.cpus:g} CPU(s) and {res.gpus:g} "
            f"GPU(s) each, but {nodes} fit {sum(each)} ({have}); lower resources.workers, or "
            f"{more} or more nodes"
        )
