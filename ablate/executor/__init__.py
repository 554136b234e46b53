"""Where cells run: the executors that take ``Task``s and hand back ``Outcome``s as they end
(``ablate.executor.task``), and ``run_one``, the plain function a worker runs. ``ablate run`` and
``ablate tune`` drive the same two executors:

- ``LocalExecutor``: in this process, one task at a time (tests, tiny studies, debugging);
- ``RayExecutor``: each task a Ray task with the study's resources; a task whose worker dies is
  retried (``resources.max_retries``) and resumes from its checkpoint in the same MLflow run.
  A cell with ``resources.workers`` > 1 is one Ray task (no resources of its own) that runs a Ray
  Train ``TorchTrainer`` of that many workers, each with the per-cell ``cpus``/``gpus`` (NCCL on
  GPUs, gloo on CPUs): ``run_distributed``. Rank 0 logs; a dead worker makes Ray Train restart the
  group (``resources.max_retries`` times), which resumes from the sharded checkpoint.

The interface is ``submit(task)``, ``wait(timeout) -> [Outcome]`` (the tasks that ended, possibly
none), ``cancel(key)``, ``cancel_all()`` and ``close()``. A task that cannot produce an outcome
(its worker died more often than retried) ends as a ``failed`` outcome, never as an exception: one
bad cell does not stop a study. This package is the only one that imports Ray.

Modules, one concept each:

    task           Task and Outcome: what travels between the driver and a worker
    worker         run_one and run_distributed: what runs in a worker
    worker_checks  what a worker checks about itself: the driver's code, the paths it resolved
    devices        what a worker process sees of CUDA, and the device check before a cell trains
    local          the Executor interface and LocalExecutor
    ray_executor   RayExecutor
    cluster        which Ray cluster, whether it is remote, connecting (token authentication)
"""

from ablate.executor.cluster import check_ray_auth, cluster_address, remote_cluster
from ablate.executor.local import Executor, ExecutorName, LocalExecutor
from ablate.executor.ray_executor import RayExecutor
from ablate.executor.worker import run_distributed, run_one

__all__ = [
    "Executor",
    "ExecutorName",
    "LocalExecutor",
    "RayExecutor",
    "check_ray_auth",
    "cluster_address",
    "remote_cluster",
    "run_distributed",
    "run_one",
]
