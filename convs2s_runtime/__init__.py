"""The torch-only core of ConvS2S inference: the products, the attention and the decoding step of the fast path.

The plugin (``fairseq_convs2s``) decodes through these files, and a translator that runs without fairseq builds on
them: nothing here imports fairseq or the plugin (``tests/test_runtime_imports.py`` holds it to that).

- ``products.py``: ``x W^T + b`` at inference, through oneDNN with the weight packed once, or MKL;
- ``attention.py``: multi-step attention, the paper's form and the step's form with W_d and W_c moved to the
  sources;
- ``step.py``: one step of incremental decoding on folded weights.
"""
