"""Adaptive runs (issue 35; docs/adaptive.md): ``dxi run --until precision=P[:all]`` or
``--until separated[=Δ]`` asks each evaluation's questions in rounds down a seeded, stratified
random order (``order``) and stops each model once its answer is settled (``rounds``; the statistics
are ``scoring.sequential``'s). What the run decided (summary.json's ``adaptive`` blocks, the journal
of decisions and the outcome kept in the cache folder) is written by ``runner.outputs.adaptive``."""
