"""The plugin's own code calls no API that torch (or Python) marks as deprecated.

A torch release first marks what a later one removes with a FutureWarning or DeprecationWarning; fairseq 0.12's
own modules raise several under torch 2.15 (``torch.nn.utils.weight_norm``, non-full backward hooks, positional
``state_dict`` arguments), the plugin's none. This test records every warning while the plugin's model trains a
step (dropout, weight norm, the fused loss, bf16 autocast), is prepared for inference, decodes incrementally
with a beam reorder, and goes through a checkpoint round trip, and fails on any deprecation among them, so a
new torch's deprecations show up here before its removals do. fairseq's beam search is not run: its warnings
are not the plugin's to fix.
"""

import io
import warnings

import torch
from utils import build_model, make_dictionary, random_batch

from fairseq_convs2s.criterions.fused_label_smoothed import label_smoothed_nll_loss_from_logits

DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def _exercise_the_plugin() -> None:
    """Train a step, decode incrementally with a reorder, save and load: the plugin's code paths, no fairseq search."""
    torch.manual_seed(0)
    dictionary = make_dictionary(30)
    model = build_model(dictionary=dictionary, dropout=0.2)
    src = random_batch(dictionary, [7, 5, 6], seed=1)
    tgt = random_batch(dictionary, [6, 6, 4], seed=2, left_pad=False)
    prev = torch.roll(tgt, 1, dims=1)
    prev[:, 0] = dictionary.eos()

    model.train()
    logits, _ = model(src, None, prev)  # B x T x V
    loss, _ = label_smoothed_nll_loss_from_logits(
        logits.view(-1, logits.size(-1)), tgt.view(-1), 0.1, dictionary.pad(), True
    )
    loss.backward()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(src, None, prev)[0].float().sum().backward()

    buffer = io.BytesIO()
    torch.save({"model": model.state_dict()}, buffer)
    buffer.seek(0)
    model.load_state_dict(torch.load(buffer)["model"])

    model.eval()
    model.make_generation_fast_(need_attn=False)
    with torch.no_grad():
        encoder_out = model.encoder(src, src_lengths=None)
        state: dict = {}
        order = torch.tensor([2, 0, 1])
        for t in range(prev.size(1)):
            step_logits, _ = model.decoder(prev[:, : t + 1], encoder_out, incremental_state=state)
            model.get_normalized_probs((step_logits, None), log_probs=True)
            model.decoder.reorder_incremental_state(state, order)
            encoder_out = model.encoder.reorder_encoder_out(encoder_out, order)
            prev = prev.index_select(0, order)


def test_training_decoding_and_checkpoints_raise_no_deprecation_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _exercise_the_plugin()
    deprecated = [
        f"{w.category.__name__} at {w.filename}:{w.lineno}: {w.message}"
        for w in caught
        if issubclass(w.category, DEPRECATIONS)
    ]
    assert not deprecated, "\n".join(deprecated)
