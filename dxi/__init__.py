"""The Decision Index runner (``dxi``): the repository's top-level folders ``runner/``,
``adapters/``, ``scoring/``, ``cache/``, ``evals/`` and ``report/`` are installed as ``dxi.runner``,
``dxi.adapters``, ...

``dxi.__version__`` is the installed distribution's version ("0+unknown" in a source tree never
installed), looked up when first asked for: importlib.metadata costs ~20 ms, a seventh of `dxi
--help`."""


def __getattr__(name: str) -> str:
    if name != "__version__":
        raise AttributeError(f"module 'dxi' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("decision-index")
    except PackageNotFoundError:  # a source tree that was never installed
        return "0+unknown"
