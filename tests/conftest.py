"""The whole suite's environment. The tests mirror the packages (``tests/ablate/data/`` tests
``ablate/data/``); a test module may import a helper of another by its module name (``from
test_runner import tiny_study``) wherever the two live, so every folder of tests is on the import
path (module names are unique across the suite). Prepared data (``ablate.data.prepared``) goes to a folder of
this test process's own, never to the user's ``~/.cache/ablate/data``; subprocesses, Ray workers
and clusters started by a test inherit it. ``train_bpe`` trains the suite's BPE tokenizers. Every test starts in the working directory the suite
started in: a test that runs a worker's code in this process (``run_one`` enters the task's
working directory, as a worker process does) must not move the next test's relative paths. With
``ABLATE_TEST_CPU_LOG`` set, each test's CPU is logged (``tests/cpu_log.py``).

Threads and compilers, for the suite's time on a 2-core machine (what each test checks is the
same):

- When the suite runs in several processes (pytest-xdist, as ``make test`` runs it), each one and
  every process it starts (gloo ranks, the CLI, Ray's workers unless a cell sets its own) computes
  on one thread. Two processes of torch's default two OpenMP threads each on two cores wait at
  every parallel region for a thread the other process holds: a test measured alone at 11 s took
  175 s beside one busy process. Numbers do not depend on it (``test_quant``'s thread-count test,
  the golden trajectories on one thread and two).
- Inductor's C++ backend, which stands in for a GPU's Triton where a test compiles with Inductor,
  generates scalar code (``TORCHINDUCTOR_VEC_ISA_OK=0``) built at ``-O0``
  (``TORCHINDUCTOR_DEBUG_COMPILE=1``): the lowering and fusion under test are the same, the CPU's
  vector code generation (most of a cold compile's time: 69 s against 26 s for one quantizer
  variant) is what no GPU runs. A variable already set is left as it is.
- Inductor inlines a pointwise producer into its consumers up to the GPU's 30 operations before it
  stores it (``realize_opcount_threshold``; torch 2.13 allows the CPU 50): the fused bodies a
  CUDA compile builds, not the CPU's larger ones, whose lowering took most of a quantizer's cold
  compile (one variant: 23 s against 9 s). Every compiled test passes under either limit (an
  FP32 value stored or recomputed is the same value).
- Python's cyclic garbage collector runs less often (``GC_THRESHOLDS``), and what the test process
  imported and collected is frozen (``gc.freeze``) once collection ends, so that no full collection
  walks torch's and the test modules' objects again: 3-5% of the CPU of the compiled, training and
  simulation tests. No number depends on when garbage is collected."""

from __future__ import annotations

import gc
import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

for _folder in sorted({p.parent for p in Path(__file__).resolve().parent.rglob("test_*.py")}):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

_made: list[str] = []

GC_THRESHOLDS = (50_000, 50, 100)
"""The test processes' ``gc.set_threshold`` (Python's default: 700, 10, 10)."""

if os.environ.get("PYTEST_XDIST_WORKER"):  # before anything imports torch in this process
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "0")
os.environ.setdefault("TORCHINDUCTOR_DEBUG_COMPILE", "1")


def pytest_configure(config: pytest.Config) -> None:
    from cpu_log import activate

    gc.set_threshold(*GC_THRESHOLDS)

    activate(config)  # ABLATE_TEST_CPU_LOG: each test's CPU, for the suite's budget
    folder = tempfile.mkdtemp(prefix="ablate-test-data-")
    _made.append(folder)
    os.environ["ABLATE_DATA_CACHE"] = folder


def pytest_collection_finish(session: pytest.Session) -> None:
    """What collection imported lives to the end: out of the collector's way from here on."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config: pytest.Config) -> None:
    for folder in _made:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True)
def _working_directory_kept() -> Iterator[None]:
    cwd = os.getcwd()
    yield
    os.chdir(cwd)


@pytest.fixture(autouse=True, scope="session")
def _inductor_fuses_as_on_a_gpu() -> None:
    """CUDA's limit on an inlined pointwise body for the CPU's compiles too, in each process that
    runs tests (a torch without a CPU limit of its own uses one limit for both: left as it is)."""
    import torch._inductor.config as inductor_config

    gpu_limit = getattr(inductor_config, "_realize_opcount_threshold_default", None)
    if gpu_limit is not None and inductor_config.realize_opcount_threshold is None:
        inductor_config.realize_opcount_threshold = gpu_limit


@pytest.fixture(autouse=True)
def _quantizer_graph_forgotten() -> Iterator[None]:
    """A trainer that compiled a model leaves its ``quantizer_graph`` choice to the process (the
    models it compiles later); each test starts without one (``ABLATE_QUANT_OPS`` decides)."""
    yield
    ops = sys.modules.get("backends.quant.ops")
    if ops is not None:
        ops.set_traced_inline(None)


@pytest.fixture
def train_bpe() -> Callable[[Path, Iterable[str]], Path]:
    """``train_bpe(path, docs)``: a byte-level BPE tokenizer (vocabulary 300, ``<|endoftext|>`` its
    one special token) trained on ``docs`` with ``tokenizers``' own trainer, saved at ``path`` as a
    ``tokenizer.json``; returns ``path``."""
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    def train(path: Path, docs: Iterable[str]) -> Path:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|endoftext|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        )
        tok.train_from_iterator(docs, trainer)
        tok.save(str(path))
        return path

    return train


@pytest.fixture(scope="session", autouse=True)
def _slurm_scenario_in_the_background(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Where the session runs the real-SLURM tests, their scenario (``slurm_scenario``: two
    minutes, most of it waiting for SLURM and for Ray on its nodes) starts in a process of its own
    as the session starts, so that it runs beside the other tests; the tests read its result."""
    if not any(item.path.name == "test_slurm_real.py" for item in request.session.items):
        return
    from slurm_cluster import missing
    from slurm_scenario import scenario_folder, start_in_background

    if missing():
        return  # the tests skip, or fail under CI, themselves
    start_in_background(scenario_folder(tmp_path_factory.getbasetemp()))
