"""Planning: what a command will do, decided before anything is sent. Nothing here sleeps, sends or
writes the cache; every bad input is refused here, before work (exit code 2).

The modules, in the order a plan is built:

* ``config``: the run file (TOML) parsed and validated, every error naming file, key and line;
* ``numbers``: every numeric flag's kind and range (an argparse ``type``);
* ``inputs``: ``PlanInputs``, a run's settings typed, one field per option of ``dxi run``;
* ``datadir``: the default data folder (light: the command line's help reads it);
* ``deadline``: ``--deadline TIME`` resolved to Unix seconds once;
* ``paths``: the output and cache folders checked writable before work;
* ``plan``: ``Plan`` and ``ModelRun``, the models (adapters built, not started), their epochs,
  limits and prices, the suite, the locations and the cost bound;
* ``sample``: ``--sample N --seed S``, a stratified seeded sample of each evaluation;
* ``selection``: which tasks the scoring commands score when given no selection (what the runs
  selected);
* ``shard``: ``--shard K/N``, the requests whose cache key falls in shard K;
* ``tokens``: token counts before a reply arrives (pacing, dry run, cost bound);
* ``estimate``: ``dxi estimate``, the dry run: what is not cached, why, its tokens and cost.
"""
