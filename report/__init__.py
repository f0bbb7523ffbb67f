"""The published report: ``html.write(summary, scored, out)`` -> ``out/report.html``
(self-contained, charts as inline SVG, model output escaped) and every table as CSV and Parquet
under ``out/tables/``. Reads scoring's tables only; never the cache or the network."""
