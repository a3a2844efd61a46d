"""CLI sub-commands of this concern (see aiter_mla/cli.py). Placeholder to be filled in."""


def register(subparsers) -> None:
    pass
