"""``aiter-mla`` command line. Each concern registers its own sub-commands:

- ``info``, ``jit ...``, ``deps ...``  -> :mod:`aiter_mla.jit.commands`
- ``metadata``                        -> :mod:`aiter_mla.ops.metadata_dump`
- ``bench``                           -> :mod:`aiter_mla.bench.commands`

Exit status: 0 on success; 2 when the command line itself is wrong (argparse's own errors, and a
value, template parameter, module or variants file it names: ParamError, UnknownModuleError,
VariantsFileError, CommandLineError), as argparse does; 1 when the work failed (a build, a
kernel, a cache folder); 130 / 143 on Ctrl-C / SIGTERM, 141 on a closed pipe.
"""
from __future__ import annotations

import argparse
import re
import sys

from .cli_errors import CommandLineError, missing_module_hint


def build_parser() -> argparse.ArgumentParser:
    from .version import __version__

    parser = argparse.ArgumentParser(
        prog="aiter-mla", description="JIT-compiled MLA decode kernels: build, inspect, benchmark"
    )
    parser.add_argument("--version", action="version", version=f"aiter-mla {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    from .jit import commands as jit_commands
    from .ops import metadata_dump
    from .bench import commands as bench_commands

    jit_commands.register(sub)
    metadata_dump.register(sub)
    bench_commands.register(sub)
    parser.leaves = {}
    _mark_leaves(parser, parser.leaves)
    return parser


_NEGATIVE_LIST = re.compile(r"^-\d[\d.,]*$")   # argparse's own takes -1 and -.5, not -1,1


def _mark_leaves(parser: argparse.ArgumentParser, leaves: dict) -> None:
    """Each sub-command's parser records its name as ``_leaf`` (and ``leaves`` maps it to the
    parser), so that an unknown argument is reported with that sub-command's usage (argparse
    reports it with the top-level one)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                # "-n -1,1" / "--ctx -5,7": a negative list is a value for the flag's own check
                # to refuse, not an unknown option ("expected at least one argument")
                child._negative_number_matcher = _NEGATIVE_LIST
                child.set_defaults(_leaf=child.prog)
                leaves[child.prog] = child
                _mark_leaves(child, leaves)


class _Terminated(KeyboardInterrupt):
    """SIGTERM, unwound like Ctrl-C (exit status 143 instead of 130)."""


def _terminate(signum, frame):
    # SIGTERM (batch schedulers, `timeout`) unwinds like Ctrl-C: builds in flight are killed
    # and their staging folders removed on the way out.
    raise _Terminated


def main(argv: list[str] | None = None) -> int:
    """Runs ``aiter-mla`` with ``argv`` (``sys.argv[1:]`` when None) and returns its exit status:
    0 done, 1 the work failed, 2 a usage error, 130 / 143 interrupted by Ctrl-C / SIGTERM (builds
    in flight are killed and their staging folders removed), 141 the reader of stdout went away.
    Every failure is one line on stderr. argparse's own errors and ``--version`` raise SystemExit,
    as argparse does. While it runs, SIGTERM unwinds like Ctrl-C; the caller's handler is put back
    on return."""
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        parser.leaves.get(getattr(args, "_leaf", None), parser).error(
            f"unrecognized arguments: {' '.join(extra)}")
    import signal
    import threading

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        from . import env

        if not getattr(args, "checks_env_itself", False):   # `info` reports it among the rest
            # a malformed variable is an error on every other command, but the cache root's
            # when --cache-dir replaces it
            env.check_values(("AITER_MLA_CACHE_DIR",) if getattr(args, "cache_dir", None) else ())
        rc = args.func(args)
    except KeyboardInterrupt as exc:
        from .jit.toolchain import kill_running_builds

        kill_running_builds()
        print("interrupted", file=sys.stderr)
        return 143 if isinstance(exc, _Terminated) else 130
    except BrokenPipeError:
        # The reader went away (`aiter-mla metadata ... | head`): stop quietly, as a tool
        # killed by SIGPIPE would (128 + 13); stdout goes to devnull so that the interpreter's
        # final flush does not raise again.
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as exc:  # every failure exits non-zero with a one-line reason
        reason = str(exc) or type(exc).__name__ + (" (out of memory)" if isinstance(exc, MemoryError) else "")
        reason += missing_module_hint(exc)
        reason += _cache_root_hint(exc, getattr(args, "cache_dir", None))
        print(f"aiter-mla {args.command}: error: {reason}", file=sys.stderr)
        return 2 if _is_usage_error(exc) else 1
    finally:
        if previous is not None:   # a caller of main() in-process keeps its own SIGTERM handling
            signal.signal(signal.SIGTERM, previous)
    return int(rc or 0)


def _is_usage_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the command line is wrong (exit 2) rather than that the work failed."""
    from .jit.commands import VariantsFileError
    from .jit.config import ParamError, UnknownModuleError

    return isinstance(exc, (ParamError, UnknownModuleError, VariantsFileError, CommandLineError))


def _cache_root_hint(exc: BaseException, cache_dir=None) -> str:
    """For an OS error on a path inside a JIT cache root (e.g. AITER_MLA_CACHE_DIR names a
    file), where that root came from; else "". ``cache_dir``: the command's --cache-dir, the
    root it used (its block has ended by now). Never raises: it only adds to a message."""
    filename = getattr(exc, "filename", None) if isinstance(exc, OSError) else None
    if not filename:
        return ""
    from pathlib import Path

    from .jit import core
    from .jit.cache import Cache
    from .paths import absolute_path

    try:
        caches = ([Cache(absolute_path(cache_dir, "--cache-dir"), True, "--cache-dir")]
                  if cache_dir else core._get_state().caches)
    except ValueError:   # a malformed AITER_MLA_CACHE_DIR: the error says what it says
        return ""
    for cache in caches:
        if Path(filename).absolute().is_relative_to(cache.root):
            how = f"{cache.origin}={cache.root}" if cache.explicit else "the default cache root"
            return f" (a path in the JIT cache root {cache.root}, {how}: it must be a writable folder)"
    return ""


if __name__ == "__main__":
    sys.exit(main())
