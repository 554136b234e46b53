"""A study on a SLURM allocation: ``ablate slurm run`` inside one (an sbatch script, an salloc
session), ``ablate slurm submit`` to get one. This package starts Ray across the allocation's nodes
with ports and folders of the job's own, serves the study's store from the job's MLflow server,
and stops the cells at a checkpoint when SLURM is about to end the job, for the requeued job to
resume. It imports neither Ray nor MLflow: Ray and the server run as programs, and the driver
reaches them through ``ablate.executor`` and ``ablate.tracking``. Its face is light (each node's
``on_node`` imports it): the commands import ``session`` and ``sbatch`` themselves.

Modules, by concept:

    allocation  the allocation from the job's environment (host lists, CPUs and GPUs per node);
                whether the study's cells fit its nodes
    ports       the job's ports and Ray folder, derived from its id; whether they are free
    on_node     ``python -m ablate.slurm.on_node``: a node's Ray, started, supervised and stopped
    supervise   the supervisor of a job's long-running programs, the one that meets SLURM's signals
    ray_nodes   the driver's side: Ray's head here, the other nodes through one ``srun``
    signals     SIGUSR1 (time limit) and SIGTERM (requeue, preemption) as a request to stop
    session     ``run_on_allocation``: ``ablate slurm run`` from the checks to the report
    sbatch      ``ablate slurm submit``: the requeueable batch script, and submitting it
"""

from ablate.slurm.allocation import Allocation, SlurmError, check_fits, read_allocation

__all__ = ["Allocation", "SlurmError", "check_fits", "read_allocation"]
