"""Installs the ``yolo`` start-up hook ``patches/yolo_fastdetect_hook.pth`` into site-packages.

Everything else about the package is declared in pyproject.toml; this file only adds the build step that
setuptools cannot express there: a ``.pth`` file must sit at the top of site-packages, outside every package.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HOOK = Path("patches") / "yolo_fastdetect_hook.pth"


class BuildPyWithHook(build_py):
    """``build_py`` that also puts the hook at the root of what is installed.

    A wheel (``pip install .``) installs the root of ``build_lib``. An editable wheel (``pip install -e .``,
    setuptools >= 64) packs only its install directory plus a path finder, so in editable mode the hook is
    written there instead.
    """

    def run(self) -> None:
        super().run()
        target_dir = self.get_finalized_command("install").install_lib if self.editable_mode else self.build_lib
        self.copy_file(str(HOOK), str(Path(target_dir) / HOOK.name))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        return outputs if self.editable_mode else [*outputs, str(Path(self.build_lib) / HOOK.name)]


setup(cmdclass={"build_py": BuildPyWithHook})
