"""ablate: controlled ablation studies of FP4/FP8 LLM training recipes.

The numerics live in the sibling package ``backends``; this package holds the tool around them.
``docs/architecture.md`` says what each room owns and may import:

    model      the models a cell trains: the built-in decoder, Hugging Face architectures
    data       the training data: corpora, tokenizers, data prepared once and memory-mapped
    train      the training loop: one run of one configuration, checkpoints, devices, parallelism
    key        how each config field enters a cell's key, and the key built from those rules
    numerics   the numerics version: one integer that names the numbers this code computes
    study      the study file: schema, recipe vocabulary, expansion into cells with keys and labels
    tracking   MLflow, and only here: runs, tags, the study's lock, histories, ``ablate ui``
    executor   where cells run (in process or on Ray) and what a worker runs
    driver     ``ablate run``: planning, preflight checks, data preparation, launching cells
    slurm      a study on a SLURM allocation (``ablate slurm run``, ``ablate slurm submit``)
    tune       ``ablate tune``: Optuna searches whose trials run as the study's cells
    targets    tokens to a target perplexity, shared by the report and tune
    report     ``ablate report``: token costs with intervals, verdicts, figures, the ladder
    export     ``ablate export``: a run's weights as a Hugging Face checkpoint
    bench      benchmarks and machine checks, one entry point each
    errors     every exception the library raises on purpose
    cli        the ``ablate`` command line, a thin click layer
"""

__version__ = "0.1.0"
