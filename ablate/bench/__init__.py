"""Benchmarks and machine checks, each a module with one entry point (``python -m ablate.bench.X``).

They measure; they never gate. Figures they print go into ``docs/measured.md`` (or
``docs/gpus.md``) with the command and the machine. ``docs/architecture.md`` lists each with the
command that runs it:

- ``numerics``: the quantizer against a plain copy, and the GEMM backends (any device);
- ``train``: training throughput of the presets per recipe;
- ``data``: what prepared data costs to build and saves at a run's start;
- ``probe``: a probe step's cost relative to a training step;
- ``bias``: how biased a random quantizer is, element by element (Four Over Six under SR);
- ``report``: ``ablate report`` on a large synthetic study;
- ``ladder``: how often a ladder's 95% intervals hold, on synthetic ladders of known laws;
- ``seeds``: how often the report's token-cost intervals hold, paired and unpaired, on simulated
  studies with shared seed effects, censoring and stalls;
- ``sequential``: how often sequential seeds decide wrongly over every look, and the runs they
  spend, on simulated studies;
- ``targets``: which target rule reads a token cost that grows late in training, on simulated
  studies (the rules of ``ablate.targets`` beside the end-of-training equal-loss ratio);
- ``ui``: the MLflow UI's start-up time and memory, MLflow's own against ``ablate ui``;
- ``gpu``: the GPU benchmark (step times, quantizer bandwidth, a profile) into ``reports/gpu/``;
- ``gpu_render``: the GPU benchmark's printed report, its Markdown and the files it writes;
- ``gpu_check``: ``make gpu-check``, a GPU machine checked end to end;
- ``gpu_study``: the check's study stage, trained in one process and reported (partly, when its
  time runs out).
"""
