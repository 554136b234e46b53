"""The scaling ladder's report: a recipe's token cost read across model sizes and budgets, and
carried to the user's scale (docs/ladders.md).

A ladder study varies model size N (non-embedding parameters) and token budget D. A rung is one
(size, budget), compared with its own baseline as any study is; the fits here read every rung at
once, as pure functions over a tidy frame of evaluations (one row per run and budget: ``config``,
``params``, ``tokens``, ``seed``, ``val_loss``), and predict each configuration's token ratio at a
target (N*, D*) with a 95% interval. Each layer imports only those above it in this list:

    solver    batched Levenberg-Marquardt with Huber's loss, K fits at once (NumPy only)
    law       Quartet's law L(N, D) fitted on the baseline, each configuration's efficiencies
              effN and effD under it (or effD a power of N), and the token ratio they imply
              (``fit_law``, ``fit_efficiencies``, ``token_ratio``)
    trend     the model-free reading: the token ratio measured at each rung (censored pairs kept)
              and its trend in log N (``pair_ratios``, ``fit_trend``)
    fit       a ladder's fits for K copies of its data at once: the law and two models of each
              configuration's penalty, Quartet's constant one and a sloped one (``fit``, ``Fit``)
    choose    which model predicts the ladder's largest sizes: each refitted without them and
              scored on them (``holdout_scores``)
    predict   the prediction at (N*, D*) from the sloped penalty, with its bootstrap interval over
              whole runs, the back-test on the largest size, ``ladder.csv``'s table (``predict``,
              ``backtest``)
    simulate  synthetic ladders drawn from a known law, which calibrate the intervals (the tests
              and ``python -m ablate.bench.ladder``)
    render    the ladder study's report: every rung's own report (``ablate.report.render``), the
              prediction, back-test, trend and figure, the parent run's metrics

The study side stays with the study: the ``ladder:`` section (``ablate.study.ladder``) and each
cell's rung and configuration (``ablate.study.rungs``). Nothing is imported here: a caller names the
module it needs, so the fits load without the report's matplotlib.
"""
