"""fairseq-convs2s: ConvS2S (Gehring et al., 2017) as a fairseq plugin."""

from setuptools import find_packages, setup

setup(
    name="fairseq-convs2s",
    version="0.1.0",
    description="Convolutional Sequence to Sequence Learning (ConvS2S) as a fairseq plugin",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    packages=find_packages(include=["fairseq_convs2s", "fairseq_convs2s.*"]),
    install_requires=[
        # fairseq 0.12.2 does not import on Python 3.11 (mutable dataclass defaults); fairseq-fixed is a release
        # of fairseq's main branch that does. Build it with --no-build-isolation against the installed torch.
        "fairseq-fixed==0.12.3.1; python_version >= '3.11'",
        "fairseq>=0.12.2,<0.13; python_version < '3.11'",
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
