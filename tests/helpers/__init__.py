"""Code the tests share: real servers on 127.0.0.1 (``servers``, ``slurm``), synthetic and
hand-written data (``synthetic``, ``answers``, ``four_models``, ``realistic_summary``), the SDKs as
an oracle (``sdk_types``), runs, clocks and shells. The fakes of the services live in
``tests/fakes/``. Test files import from here, never from each other (``tests/test_suite_layout.py``
holds that)."""
