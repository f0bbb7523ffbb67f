"""Batch mode (``dxi run --batch``, docs/batch.md): a model's uncached requests through its
provider's batch API, at the batch price. This package holds the runner's side; every batch module
of the tree:

* ``runner/batch/driver.py``: the driver, one ``ModelBatches`` per model: requests grouped into
  batches, the cost reserved, submitted, polled, the results downloaded and appended as rows,
  expired or failed requests given back to the synchronous path;
* ``runner/batch/submit.py``: the batches built, submitted in the ledger's intent-first order, and
  the entries of earlier runs reconciled with the provider at start;
* ``runner/batch/collect.py``: an ended batch's results stored as rows, what has none given back;
* ``runner/batch/options.py``: the settings (``BatchOptions``), counts (``BatchStats``) and helpers
  the driver's parts share;
* ``runner/batch/memory.py``: the memory allocators a batch run sets before Polars and PyArrow load;
* ``runner/open_batches.py``: ``dxi batches list / collect / cancel``, the open batches of a cache;
* ``runner/dispatch.py``: which of a model's requests go by batch and which synchronously;
* ``runner/commands/batches.py``: the ``dxi batches`` command line;
* ``adapters/batches.py``: the shapes every batch API shares (``BatchAPI``, a batch's status,
  results);
* ``adapters/openai_batch.py``, ``adapters/anthropic_batch.py``, ``adapters/gemini_batch.py``: each
  provider's batch API, beside the adapter whose request bodies it carries;
* ``cache/ledger.py``: the batch ledger, every batch recorded in the cache folder before it is
  submitted (the intent-first rule), read back to resume, collect or cancel;
* ``cache/claims.py``: the claims that keep two processes from sending one request twice.
"""
