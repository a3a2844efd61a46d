"""The command-line usage error and the missing-package hint, apart from :mod:`aiter_mla.cli`
so that the commands' modules can use them without importing the CLI (which imports them)."""
from __future__ import annotations


class CommandLineError(ValueError):
    """The command line names a value the command cannot take (the message says which flag or
    name, what it takes and what it got): ``aiter-mla`` exits 2 on it, as on argparse's own
    errors (:func:`aiter_mla.cli.main`)."""


# pyproject.toml's dependencies other than torch, by import name
DEPENDENCIES = ("jinja2", "filelock", "tqdm", "matplotlib")


def missing_module_hint(exc: BaseException) -> str:
    """For a ModuleNotFoundError of torch or of one of :data:`DEPENDENCIES`: `` (how to install
    it)``, to append to its message; ``""`` for anything else."""
    if not isinstance(exc, ModuleNotFoundError):
        return ""
    top = (exc.name or "").split(".")[0]
    if top == "torch":
        return " (this command needs PyTorch: pip install torch)"
    if top in DEPENDENCIES:
        return f" (a dependency of aiter_mla, left out by `pip install --no-deps`: pip install {top})"
    return ""
