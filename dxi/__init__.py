"""The Decision Index runner (``dxi``): the repository's top-level folders ``runner/``, ``adapters/``,
``scoring/``, ``cache/``, ``evals/`` and ``report/`` are installed as ``dxi.runner``, ``dxi.adapters``, ..."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("decision-index")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
