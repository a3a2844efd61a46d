"""Package build: besides the package, the wheel carries the kernels' templates and the JIT
configuration (the repository's fixed top-level ``templates/`` and ``jit_config.json``) as
package data under ``aiter_mla/_data/``, where ``aiter_mla/paths.py`` finds them in an
installed wheel. An editable install reads them from the checkout instead."""
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithData(build_py):
    """build_py that also copies templates/ and jit_config.json into aiter_mla/_data/."""

    def run(self):
        editable = getattr(self, "editable_mode", False)
        if not editable:
            # a stale build/ never mixes in old modules or templates (build_py only adds and
            # overwrites: a module deleted from the package stayed in every later wheel)
            shutil.rmtree(Path(self.build_lib) / "aiter_mla", ignore_errors=True)
        super().run()
        if editable:
            return   # the checkout's own files are used (aiter_mla/paths.py)
        data = Path(self.build_lib) / "aiter_mla" / "_data"
        shutil.copytree(ROOT / "templates", data / "templates",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        shutil.copy2(ROOT / "jit_config.json", data / "jit_config.json")


setup(cmdclass={"build_py": BuildPyWithData})
