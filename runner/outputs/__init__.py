"""What a run or a scoring leaves: the files, the terminal's tables and what produced them.

* ``files``: the cache scored, ``OUT/summary.json`` and ``OUT/answers.parquet`` written;
* ``staging``: a scoring's outputs staged and put in place as one set (never two scorings' files
  side by side), and what ``OUT`` holds when a signal stopped the writing;
* ``legend``: the line under the terminal's index table (its interval's method, the headers'
  abbreviations);
* ``terminal``: the terminal's tables (summary, usage, measures, the dry run), fitted to its width;
* ``history``: ``OUT/run-history.jsonl``, each run's line (what it sent, spent and where it
  stopped);
* ``amounts``: a dollar amount the user gave (a cost bound), written back in fixed-point;
* ``provenance``: what produced a result (``dxi_version``, the checkout's git state, the machine).
"""
