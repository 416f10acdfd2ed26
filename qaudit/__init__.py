"""qaudit: audit Megatron-LM / Transformer Engine quantization and gradient accumulation."""

import sys

if sys.argv[:1] == ["-m"]:
    # `python -m qaudit` (and `torchrun -m qaudit`) put the working directory first on
    # sys.path, where a config under review may sit next to a `yaml.py` or a
    # `transformer_engine/` folder. Python documents argv[0] as "-m" while it locates the
    # module, so only that launch is affected; nothing is imported from there from now on.
    from qaudit._safepath import drop_working_directory

    drop_working_directory()

__version__ = "0.1.0"

import warnings  # noqa: E402  (after the path is safe)

# torch warns at import when NumPy is absent; qaudit never hands tensors to NumPy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")


def __getattr__(name: str):
    """`from qaudit import audit` (qaudit/api.py), loaded on first use so that `import qaudit`
    stays light."""
    if name in ("audit", "AuditReport", "AuditFailed"):
        from qaudit import api

        return getattr(api, name)
    raise AttributeError(f"module 'qaudit' has no attribute {name!r}")
