"""fairseq-convs2s: ConvS2S (Gehring et al., 2017) as a fairseq plugin."""

import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

try:  # setuptools >= 64 (PEP 660 editable installs)
    from setuptools.command.editable_wheel import editable_wheel
except ImportError:  # older setuptools installs -e with `setup.py develop`, without the .pth (see README)
    editable_wheel = None

# fairseq_convs2s_autoload.py: loads the plugin when fairseq reads a convs2s checkpoint without --user-dir.
# Python runs an "import" line of a .pth file in site-packages at start-up; the module imports only the stdlib.
PTH_NAME = "fairseq_convs2s_autoload.pth"
PTH_LINE = "import fairseq_convs2s_autoload; fairseq_convs2s_autoload.install()\n"


def write_pth(folder: str) -> str:
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, PTH_NAME)
    with open(path, "w", encoding="utf-8") as f:
        f.write(PTH_LINE)
    return path


class BuildPyWithPth(build_py):
    """``pip install .``: the .pth goes to the root of the wheel, that is into site-packages."""

    def run(self):
        super().run()
        write_pth(self.build_lib)

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH_NAME)]


commands = {"build_py": BuildPyWithPth}
if editable_wheel is not None:

    class EditableWheelWithPth(editable_wheel):
        """``pip install -e .`` (PEP 660) builds its wheel without build_py's outputs: add the .pth to it here."""

        def _run_build_commands(self, dist_name, unpacked_wheel, build_lib, tmp_dir):
            result = super()._run_build_commands(dist_name, unpacked_wheel, build_lib, tmp_dir)
            write_pth(str(unpacked_wheel))
            return result

    commands["editable_wheel"] = EditableWheelWithPth


setup(
    name="fairseq-convs2s",
    version="0.1.0",
    description="Convolutional Sequence to Sequence Learning (ConvS2S) as a fairseq plugin",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    packages=find_packages(include=["fairseq_convs2s", "fairseq_convs2s.*", "convs2s_runtime", "convs2s_runtime.*"]),
    py_modules=["fairseq_convs2s_autoload"],
    cmdclass=commands,
    install_requires=[
        # fairseq 0.12.2 does not import on Python 3.11 (mutable dataclass defaults), and on 3.9 and 3.10 pip cannot
        # install it (PyPI has a Linux wheel for 3.8 alone, and its source package lacks
        # fairseq/clib/libbase/balanced_assignment.cpp). fairseq-fixed is a release of fairseq's main branch that
        # installs and passes this plugin's tests on 3.10 to 3.13. Build it with --no-build-isolation against the
        # installed torch.
        "fairseq-fixed==0.12.3.1; python_version >= '3.10'",
        "fairseq>=0.12.2,<0.13; python_version < '3.10'",
        "torch>=1.13",
        "sacrebleu>=2.0",
        "sentencepiece>=0.1.97",
    ],
    extras_require={
        "test": ["pytest>=7", "ruff==0.17.6"],
        "demo": ["matplotlib>=3.5"],
        "recipes": ["rouge-score>=0.1.2"],  # ROUGE for examples/gigaword
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
