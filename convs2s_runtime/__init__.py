"""Serve ConvS2S without fairseq: ``Translator(model_dir).translate_batch(sources)``, and the torch-only core of
ConvS2S inference that the plugin's fast path runs on.

A model folder comes from ``python -m fairseq_convs2s.export CHECKPOINT OUT_DIR``; ``python -m convs2s_runtime
MODEL_DIR`` translates stdin. Nothing here imports fairseq or the plugin (``tests/test_layout.py``,
``tests/test_runtime.py``).

- ``products.py``: ``x W^T + b`` at inference, through oneDNN with the weight packed once, or MKL;
- ``attention.py``: multi-step attention, the paper's form and the step's form with W_d and W_c moved to the
  sources;
- ``step.py``: one step of incremental decoding on folded weights (the plugin's fast path);
- ``model.py``: an exported folder's network, the encoder and the steps; ``search.py``: beam search as fairseq's;
- ``translator.py``: the API, after CTranslate2's.
"""

import sys

try:
    from .translator import TranslationHypothesis, TranslationResult, Translator
except KeyboardInterrupt:
    if sys.argv[:1] != ["-m"]:  # (imported by a program, which handles its interrupts)
        raise
    # Ctrl-C in the seconds `python -m convs2s_runtime` spends importing torch: one line, as later
    print("convs2s_runtime: interrupted while starting", file=sys.stderr)
    sys.exit(130)

__all__ = ["Translator", "TranslationResult", "TranslationHypothesis"]
