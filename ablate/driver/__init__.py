"""The driver of ``ablate run``: what happens on the machine the user typed the command on.

- ``runner``: ``run_study``, the study from its file to finished cells (skip, resume, create);
- ``planning``: what happens to each cell, planned against what MLflow holds (``ablate plan``);
- ``preflight``: every check made before anything is written (``validate``, ``plan``, ``tune``);
- ``preparing``: each distinct data configuration prepared once, before the cells start;
- ``progress``: the progress display while cells run.

It imports the study, the executor and tracking; the trainer runs in the executor's workers.
"""
