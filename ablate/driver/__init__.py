"""The driver of ``ablate run``: what happens on the machine the user typed the command on.

- ``runner``: ``run_study``, the study from its file to finished cells (skip, resume, create),
  one run of it an object (``_StudyRun``) whose steps launch the cells and collect their outcomes;
- ``setup``: what a driver (``ablate run``, ``ablate tune``) sets up around a study: the output
  folder's lock, the executor, the store with the study's lock in it and the parent run;
- ``planning``: what happens to each cell, planned against what MLflow holds (``ablate plan``);
- ``preflight``: every check made before anything is written (``validate``, ``plan``, ``tune``);
- ``preparing``: each distinct data configuration prepared once, before the cells start;
- ``progress``: the progress display while cells run;
- ``branching``: decay branches in ``run`` and ``plan`` (where each cell starts, the steps the
  study costs, the gate that holds a branch until its trunk has passed it);
- ``waves``: sequential seeds (a study's ``seeds:``): the study in waves, each configuration given
  more seeds only while its comparison with the baseline is open;
- ``compute``: the FLOPs and GPU-hours of a study's cells to run (``ablate plan``);
- ``reuse``: baseline seeds copied from the store ``baseline_from`` names instead of trained.

It imports the study, the executor and tracking; the trainer runs in the executor's workers.
"""
