"""The command-line usage error, apart from :mod:`aiter_mla.cli` so that the commands' modules
can raise it without importing the CLI (which imports them)."""
from __future__ import annotations


class CommandLineError(ValueError):
    """The command line names a value the command cannot take (the message says which flag or
    name, what it takes and what it got): ``aiter-mla`` exits 2 on it, as on argparse's own
    errors (:func:`aiter_mla.cli.main`)."""
