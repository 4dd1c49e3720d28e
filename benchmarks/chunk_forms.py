"""The fused criterion's chunk on a CPU, piece by piece, in the form it takes and the forms it replaced.

``python -m benchmarks.chunk_forms [--rows 256] [--repeats 41]`` times, on the iwslt size's vocabulary step
(1,664 rows of 256 features, 10,000 words, chunks of ``--rows``), each piece of ``_ProjectedLabelSmoothed``'s loop
against its alternatives, the forms of one piece alternated in one process (medians, ms):
- softmax: softmax's own kernel in place over the logits (``aten._softmax.out``) and its rows' maximum, against
  subtracting the logits' row maximum, ``exp_`` and a sum (the form before dfc8e63); a chunk;
- gradient: the softmax scaled and shifted by scalar ``mul_``/``sub_``, against one ``addcmul`` with rows x 1
  factors broadcast (before dfc8e63); a chunk;
- input gradient: every chunk's product with W by oneDNN reading W^T as a view, against W^T copied and packed
  for oneDNN once (before dfc8e63, the packing timed in), and against MKL's ``mm`` on W;
- weight gradient: every chunk's ``G^T x`` accumulated by MKL's ``addmm_``, against oneDNN's product and an
  ``add_``.
"""

import argparse

import torch

from fairseq_convs2s.modules.weight_norm import _onednn_linear

from . import measure


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=256, help="rows a chunk (the criterion's PROJECTED_CHUNK_ROWS)")
    p.add_argument("--repeats", type=int, default=41)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    n, d, vocab, rows = 1664, 256, 10000, args.rows
    weight, x = torch.randn(vocab, d) * 0.05, torch.randn(n, d)
    logits = torch.randn(rows, vocab) * 3
    z, row_max = torch.empty_like(logits), logits.amax(-1, keepdim=True)
    a, c = 0.9, 1e-5  # the gradient's scale and shift (scalars: every row counted)
    a_rows, c_rows = torch.full((rows, 1), a), torch.full((rows, 1), c)
    grads = torch.randn(n, vocab) * 1e-4  # every chunk's gradient, as the loop has it
    chunks = [(x[s : s + rows], grads[s : s + rows]) for s in range(0, n, rows)]
    grad_weight = torch.zeros(vocab, d)

    def softmax_in_place():  # and the maximum of p, whose -log the criterion takes for the log-sum-exp
        return torch.ops.aten._softmax.out(z.copy_(logits), -1, False, out=z).amax(-1)

    def packed_transpose():
        w_t = torch.ops.mkldnn._reorder_linear_weight(weight.t().contiguous(), None)
        return [_onednn_linear(g, w_t, None) for _, g in chunks]

    pieces = {
        "softmax (a chunk)": {
            "in place, softmax's kernel": softmax_in_place,
            # (both forms take the logits' row maximum first)
            "max subtracted, exp_, sum": lambda: z.copy_(logits).sub_(row_max).exp_().sum(-1),
            "the copy both start from": lambda: z.copy_(logits),
        },
        "gradient (a chunk)": {
            "scalar mul_, sub_": lambda: z.mul_(a).sub_(c),
            "broadcast addcmul": lambda: torch.addcmul(-c_rows, z, a_rows, out=z),
        },
        "input gradient (all chunks)": {
            "oneDNN, W^T a view": lambda: [_onednn_linear(g, weight.t(), None) for _, g in chunks],
            "oneDNN, W^T copied and packed": packed_transpose,
            "MKL mm": lambda: [g.mm(weight) for _, g in chunks],
        },
        "weight gradient (all chunks)": {
            "MKL addmm_": lambda: [grad_weight.addmm_(g.t(), xc) for xc, g in chunks],
            "oneDNN and add_": lambda: [grad_weight.add_(_onednn_linear(g.t(), xc.t(), None)) for xc, g in chunks],
        },
    }
    print(f"{torch.get_num_threads()} threads, chunks of {rows} rows; ms, medians of {args.repeats}, alternated")
    for piece, forms in pieces.items():
        times = measure.alternate(forms, args.repeats, warmup=2, device=torch.device("cpu"))
        ms = {name: 1e3 * measure.median(t) for name, t in times.items()}
        print(f"{piece}: " + "; ".join(f"{name} {t:.2f}" for name, t in ms.items()), flush=True)


if __name__ == "__main__":
    main()
