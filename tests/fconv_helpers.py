"""Stock-fairseq fconv models for the converter and hub tests: trained in-process, saved as fairseq saves them."""

import argparse
from pathlib import Path
from types import SimpleNamespace

import torch
from fairseq.models.fconv import FConvModel
from fairseq.models.fconv import base_architecture as fconv_base_architecture
from utils import random_batch

# mixed widths (residual projections), a lookback-2 residual, an even and a kernel-1 block, attention on 3 of 4
ENCODER = "[(16, 3)] * 2 + [(24, 3, 2)] + [(32, 1)]"
DECODER = "[(16, 3)] * 2 + [(24, 2)] + [(32, 1)]"
ATTENTION = "[True, False, True, True]"


def fconv_model_args(share=False) -> argparse.Namespace:
    """The model flags of a tiny fconv_iwslt_de_en, with fconv's defaults filled in."""
    args = argparse.Namespace(
        arch="fconv_iwslt_de_en", encoder_layers=ENCODER, decoder_layers=DECODER, decoder_attention=ATTENTION,
        encoder_embed_dim=12, decoder_embed_dim=12, decoder_out_embed_dim=12 if share else 10, dropout=0.1,
        max_source_positions=40, max_target_positions=50, share_input_output_embed=share,
    )  # fmt: skip
    fconv_base_architecture(args)
    return args


def train_fconv(dictionary, share=False, steps=5, args=None):
    """A tiny stock-fairseq fconv model after a few NAG steps (so g != ||v|| and biases are non-zero).

    ``args`` (default: :func:`fconv_model_args`) are the model's args; they are returned with the model."""
    from fairseq.optim.nag import FairseqNAG

    torch.manual_seed(0)
    args = args or fconv_model_args(share)
    task = SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    model = FConvModel.build_model(args, task)
    optimizer = FairseqNAG(SimpleNamespace(lr=[0.5], momentum=0.9, weight_decay=0.0), list(model.parameters()))
    for step in range(steps):
        src = random_batch(dictionary, [7, 4, 9], seed=step)
        tgt = random_batch(dictionary, [6, 8, 3], seed=100 + step, left_pad=False)
        optimizer.zero_grad()
        logits, _ = model(src, None, tgt)
        torch.nn.functional.cross_entropy(logits.transpose(1, 2), tgt, ignore_index=dictionary.pad()).backward()
        optimizer.step()
    return model.eval(), args


def fairseq_checkpoint(model, args):
    """The dict fairseq 0.12 saves: cfg with the model's Namespace, the state dict, optimizer history."""
    return {
        "cfg": {"model": args, "task": {"_name": "translation"}},
        "model": model.state_dict(),
        "optimizer_history": [{"criterion_name": "x", "optimizer_name": "FairseqNAG", "num_updates": 5}],
        "last_optimizer_state": {"state": {}},
        "extra_state": {},
    }


def write_fconv_archive(folder: Path, dictionary, steps=5) -> Path:
    """A directory laid out like the published fconv archives: ``model.pt`` (a checkpoint with the full training
    ``args`` Namespace, as fairseq wrote them before 0.10) beside ``dict.src.txt`` and ``dict.tgt.txt``."""
    from fairseq import options

    folder.mkdir(parents=True, exist_ok=True)
    parser = options.get_training_parser()
    flags = [str(folder), "--arch", "fconv_iwslt_de_en", "--source-lang", "src", "--target-lang", "tgt", "--cpu"]
    args = options.parse_args_and_arch(parser, flags)
    for key, value in vars(fconv_model_args()).items():
        setattr(args, key, value)
    model, args = train_fconv(dictionary, steps=steps, args=args)
    checkpoint = {
        "args": args,
        "model": model.state_dict(),
        "optimizer_history": [
            {
                "criterion_name": "CrossEntropyCriterion",
                "optimizer_name": "FairseqNAG",
                "lr_scheduler_state": {"best": None},
                "num_updates": steps,
            }
        ],  # fmt: skip
        "extra_state": {},
        "last_optimizer_state": {"state": {}},
    }
    torch.save(checkpoint, folder / "model.pt")
    dictionary.save(str(folder / "dict.src.txt"))
    dictionary.save(str(folder / "dict.tgt.txt"))
    return folder
