"""Scores on detokenized text: sacrebleu's BLEU for translation, ROUGE (the ``rouge-score`` package) for summaries.

python examples/recipes/scoring.py bleu  --hyp test.hyp --ref test.de
python examples/recipes/scoring.py rouge --hyp test.hyp --ref ref0.txt ref1.txt [--recall-bytes 75]
"""

import argparse
import sys
from pathlib import Path
from typing import Dict, List, Optional, Sequence

if __package__ in (None, ""):  # run as a script: import the recipes package beside this file
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from recipes import text  # noqa: E402

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def bleu(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> str:
    """sacrebleu's corpus BLEU with its default (13a) tokenization, and the signature that makes it reproducible.

    ``references`` is a list of reference streams, each as long as ``hypotheses``.
    """
    from sacrebleu.metrics import BLEU

    metric = BLEU()
    score = metric.corpus_score(list(hypotheses), [list(r) for r in references])
    return f"{score}\nsacrebleu signature: {metric.get_signature()}"


def truncate_bytes(text: str, limit: int) -> str:
    """The first ``limit`` bytes of ``text`` in UTF-8, not cutting a character in two (DUC's 75-byte limit)."""
    return text.encode("utf-8")[:limit].decode("utf-8", errors="ignore")


def rouge(
    hypotheses: Sequence[str], references: Sequence[Sequence[str]], recall_bytes: Optional[int] = None
) -> Dict[str, float]:
    """ROUGE-1/2/L in percent, averaged over sentences, with Porter stemming (ROUGE-1.5.5's ``-m``).

    Default: F1 against the single reference (Gigaword's convention). With ``recall_bytes``: recall of the
    hypothesis cut to that many bytes, averaged over the references (DUC-2004: 75 bytes, four references).
    The official ROUGE-1.5.5 perl script pools counts over references and tokenizes slightly differently, so
    expect small differences from numbers it produced.
    """
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    totals = dict.fromkeys(ROUGE_TYPES, 0.0)
    for i, hyp in enumerate(hypotheses):
        refs = [r[i] for r in references]
        if recall_bytes is None:
            scores = scorer.score(refs[0], hyp)
            for key in ROUGE_TYPES:
                totals[key] += scores[key].fmeasure
        else:
            cut = truncate_bytes(hyp, recall_bytes)
            for ref in refs:
                scores = scorer.score(ref, cut)
                for key in ROUGE_TYPES:
                    totals[key] += scores[key].recall / len(refs)
    n = max(len(hypotheses), 1)
    return {key: 100 * value / n for key, value in totals.items()}


def format_rouge(scores: Dict[str, float], recall_bytes: Optional[int] = None) -> str:
    kind = f"recall, hypotheses cut to {recall_bytes} bytes" if recall_bytes else "F1"
    return (
        f"ROUGE-1 = {scores['rouge1']:.2f}  ROUGE-2 = {scores['rouge2']:.2f}  ROUGE-L = {scores['rougeL']:.2f}"
        f"  ({kind}; rouge-score package, Porter stemmer)"
    )


def _read(path: Path) -> List[str]:
    """The lines of a UTF-8 file, ended by "\n" (or "\r\n") only, as fairseq writes them: a U+2028 or a form feed
    inside a sentence does not split it (``str.splitlines`` did: the file then had more lines than sentences)."""
    return [line.removesuffix("\r") for line in text.read_lines(path)]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("metric", choices=["bleu", "rouge"])
    parser.add_argument("--hyp", type=Path, required=True, help="one detokenized hypothesis a line")
    parser.add_argument("--ref", type=Path, nargs="+", required=True, help="reference file(s), aligned with --hyp")
    parser.add_argument("--recall-bytes", type=int, help="ROUGE recall of hypotheses cut to this many bytes (DUC)")
    args = parser.parse_args(argv)
    try:
        hyps = _read(args.hyp)
        refs = [_read(p) for p in args.ref]
    except (OSError, text.DataError) as error:
        parser.error(str(error))
    for path, ref in zip(args.ref, refs):
        if len(ref) != len(hyps):
            parser.error(f"{path} has {len(ref)} lines, {args.hyp} has {len(hyps)}")
    if args.metric == "bleu":
        print(bleu(hyps, refs))
    else:
        print(format_rouge(rouge(hyps, refs, args.recall_bytes), args.recall_bytes))


if __name__ == "__main__":
    main()
