"""examples/recipes/compare.py on run folders laid out as a recipe writes them (tests/test_recipes.py compares
real runs); and curve.write_curves_png, the picture of several runs."""

import random
import sys
from pathlib import Path

import pytest
from png_reader import pixel, read_png

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "examples"))

from recipes import compare, scoring  # noqa: E402
from recipes.curve import SERIES_COLOURS, CurvePoint, plot_area, write_curves_png  # noqa: E402

CONFIG = (
    "2026-11-27 08:27:21 | INFO | fairseq_cli.train | {{'common': {{'seed': {seed}, 'cpu': True}}, "
    "'model': Namespace(seed={seed}, arch='{arch}', source_lang='en', target_lang='de', dropout=0.2)}}\n"
)
VALID = (
    "2026-11-27 08:{m:02d}:00 | INFO | valid | epoch {e:03d} | valid on 'valid' subset | loss 5.0 | nll_loss 4.0 | "
    "ppl {ppl} | wps 15000 | num_updates {u}\n"
)
INNER = (
    "2026-11-27 08:{m:02d}:00 | INFO | train_inner | epoch {e:03d}:     50 / 100 loss=6.0, nll_loss=5.0, ppl=32.0, "
    "wps={wps}, ups=2.0, num_updates={u}, lr=0.25, wall={wall}\n"
)
TRAIN = (
    "2026-11-27 08:{m:02d}:01 | INFO | train | epoch {e:03d} | loss 6.0 | nll_loss 5.0 | ppl 32.0 | wps 9000 | "
    "num_updates {u} | lr 0.25 | wall {wall}\n"
)
WORDS = "ein Mann mit einem Hund auf der Straße im Park zwei Kinder spielen".split()


def sentences(n, seed):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 9))) for _ in range(n)]


def make_run(root, name, *, arch, seed, ppls, minutes_per_epoch, refs, hyps, wps=(9000, 11000, 10000)):
    """A run folder as a recipe leaves it: train.log, raw/test.de, test.auto.hyp, score-test.auto.txt, chosen.txt."""
    out = root / name
    (out / "raw").mkdir(parents=True)
    (out / "checkpoints").mkdir()
    log = [CONFIG.format(seed=seed, arch=arch)]
    for e, ppl in enumerate(ppls, start=1):
        u, wall = 100 * e, 60 * minutes_per_epoch * e
        log.append(INNER.format(m=e, e=e, wps=wps[e % len(wps)], u=u - 50, wall=wall - 30))
        log.append(VALID.format(m=e, e=e, ppl=ppl, u=u))
        log.append(TRAIN.format(m=e, e=e, u=u, wall=wall))
    (out / "train.log").write_text("".join(log))
    (out / "raw" / "test.de").write_text("".join(r + "\n" for r in refs))
    (out / "test.auto.hyp").write_text("".join(h + "\n" for h in hyps))
    (out / "score-test.auto.txt").write_text(scoring.bleu(hyps, [refs]) + "\n")
    (out / "checkpoints" / "chosen.txt").write_text("checkpoint_best.pt\tcheckpoint_best.pt (validation loss ...)\n")
    return out


@pytest.fixture
def two_runs(tmp_path):
    refs = sentences(200, 0)
    noisy = [h if i % 3 else " ".join(h.split()[:-2]) for i, h in enumerate(refs)]  # a third of them cut short
    worse = [h if i % 2 else " ".join(reversed(h.split())) for i, h in enumerate(noisy)]
    a = make_run(tmp_path, "convs2s_s1", arch="convs2s_iwslt_de_en", seed=1, ppls=[40.0, 12.0, 8.0, 6.0],
                 minutes_per_epoch=7.5, refs=refs, hyps=noisy)  # fmt: skip
    b = make_run(tmp_path, "fconv_s1", arch="fconv_iwslt_de_en", seed=1, ppls=[50.0, 20.0, 10.0, 8.0, 7.0, 6.5],
                 minutes_per_epoch=6.0, refs=refs, hyps=worse)  # fmt: skip
    return a, b, refs, noisy, worse


def row(output, name):
    """The cells of the table's row for run ``name``."""
    line = next(line for line in output.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in line.strip()[1:-1].split("|")]


def test_table_paired_bootstrap_and_picture(two_runs, tmp_path, capsys):
    a, b, refs, noisy, worse = two_runs
    png = tmp_path / "both.png"
    compare.main([str(a), str(b), "--png", str(png)])
    output = capsys.readouterr().out
    header = row(output, "run")
    # at a quarter, a half, three quarters of the shorter run (30 min) and at each run's end
    assert header[6:10] == ["ppl at 7.5 min", "ppl at 15.0 min", "ppl at 22.5 min", "ppl at the end"]
    # convs2s: 4 epochs of 7.5 min, 100 updates each; logged wps 11,000, 10,000, 9,000, 11,000
    assert row(output, "convs2s_s1")[1:12] == [
        "convs2s_iwslt_de_en", "1", "30.0", "400", "10,500", "40.00", "12.00", "8.00", "6.00", "checkpoint_best.pt",
        f"BLEU {scoring.bleu(noisy, [refs]).split()[2]}",
    ]  # fmt: skip
    # fconv: 6 epochs of 6 min; by 7.5, 15 and 22.5 min it had validated 1, 2 and 3 of them
    assert row(output, "fconv_s1")[1:11] == [
        "fconv_iwslt_de_en", "1", "36.0", "600", "10,000", "50.00", "20.00", "10.00", "6.50", "checkpoint_best.pt",
    ]  # fmt: skip

    from sacrebleu.metrics import BLEU

    score_a, score_b = (BLEU().corpus_score(h, [refs]).score for h in (noisy, worse))
    assert score_b < score_a - 5
    assert f"test.auto: BLEU against convs2s_s1 ({score_a:.2f}), paired bootstrap, 1000 resamples" in output
    line = next(line for line in output.splitlines() if line.startswith("   fconv_s1: "))
    assert line.startswith(f"   fconv_s1: {score_b:.2f} ({score_b - score_a:+.2f}, p = 0.0010; mean ")
    # sacreBLEU's fixed seed: the same runs give the same lines
    compare.main([str(a), str(b)])
    assert line in capsys.readouterr().out

    width, height, rows = read_png(png)
    curves = [compare.read_run(out, out.name).curve for out in (a, b)]
    area = plot_area(curves[0] + curves[1])
    for curve, colour in zip(curves, SERIES_COLOURS):
        for point in curve:  # each point's 5x5 marker, which a later curve's 2-pixel line cannot cover whole
            x, y = area.x_pixel(point.minutes), area.y_pixel(point.ppl)
            assert colour in {pixel(rows, x + dx, y + dy) for dx in range(-2, 3) for dy in range(-2, 3)}


def test_the_same_run_twice_is_no_difference(two_runs, capsys):
    a = two_runs[0]
    compare.main([str(a), str(a)])
    output = capsys.readouterr().out
    assert f"| {a} | convs2s_iwslt_de_en |" in output  # two folders of one name: named by path
    assert "(+0.00, the same output as the baseline; mean" in output


def test_perplexity_at_and_headline():
    curve = [CurvePoint(1.0, 1, 10, 5.0, 4.0, 30.0), CurvePoint(2.0, 2, 20, 4.0, 3.0, 9.0)]
    assert [compare.perplexity_at(curve, m) for m in (0.5, 1.0, 1.9, 2.0, 99)] == [None, 30.0, 30.0, 9.0, 9.0]
    assert compare.headline("BLEU = 38.22 68.1/44.5/31.5/22.4 (BP = 1.000 ratio = 1.004)") == "BLEU 38.22"
    rouge = "ROUGE-1 = 35.10  ROUGE-2 = 16.80  ROUGE-L = 32.70  (F1; rouge-score package, Porter stemmer)"
    assert compare.headline(rouge) == "ROUGE-1 = 35.10  ROUGE-2 = 16.80  ROUGE-L = 32.70"


def test_rouge_runs_get_the_table_without_a_paired_test(two_runs, capsys):
    a, b, *_ = two_runs
    for out in (a, b):
        (out / "score-test.auto.txt").write_text("ROUGE-1 = 35.10  ROUGE-2 = 16.80  ROUGE-L = 32.70  (F1; ...)\n")
    compare.main([str(a), str(b)])
    output = capsys.readouterr().out
    assert row(output, "fconv_s1")[11] == "ROUGE-1 = 35.10  ROUGE-2 = 16.80  ROUGE-L = 32.70"
    assert "test.auto: no paired test: the paired bootstrap here is sacreBLEU's, for BLEU scores" in output


def test_a_test_set_one_run_lacks_is_named(two_runs, capsys):
    a, b, *_ = two_runs
    (b / "score-test.auto.txt").rename(b / "score-test.best.txt")
    compare.main([str(a), str(b)])
    output = capsys.readouterr().out
    assert "test.auto: no paired test, not scored in fconv_s1" in output
    assert "test.best: no paired test, not scored in convs2s_s1" in output
    assert row(output, "convs2s_s1")[12] == "-"  # its test.best column


def test_runs_on_other_test_sets_get_the_table_and_curves_without_a_paired_test(two_runs, tmp_path, capsys):
    """Runs of two directions (or corpora) stopped the command after the table, with no picture: their references
    differ, so only the paired test is left out."""
    a, b, *_ = two_runs
    (b / "raw" / "test.de").write_text("other\n" * 200)
    compare.main([str(a), str(b), "--png", str(tmp_path / "c.png")])
    output = capsys.readouterr().out
    assert "test.auto: no paired test: the references of fconv_s1 are not convs2s_s1's" in output
    assert row(output, "fconv_s1")[0] == "fconv_s1" and (tmp_path / "c.png").stat().st_size > 0


@pytest.mark.parametrize(
    "breakage, message",
    [
        (lambda a, b: (b / "train.log").unlink(), "fconv_s1: no train.log, so not a recipe's output folder"),
        (lambda a, b: (b / "train.log").write_text("nothing\n"), "no fairseq-train configuration line"),
        (lambda a, b: (b / "test.auto.hyp").unlink(), "test.auto.hyp is missing beside score-test.auto.txt"),
        (lambda a, b: (b / "test.auto.hyp").write_text("one\n"), "test.auto.hyp: 1 lines against 200 references"),
        (lambda a, b: (a / "raw" / "test.de").unlink(), "test.de is missing: the recipe's references for test"),
    ],
    ids=["no-log", "no-config", "no-hyp", "short-hyp", "no-refs"],
)
def test_bad_folders_are_messages(two_runs, breakage, message):
    a, b, *_ = two_runs
    breakage(a, b)
    with pytest.raises(SystemExit, match=message):
        compare.main([str(a), str(b)])


def test_usage_errors(two_runs, tmp_path, capsys):
    a, b, *_ = two_runs
    with pytest.raises(SystemExit, match="--resamples 0: give at least 1"):
        compare.main([str(a), str(b), "--resamples", "0"])
    with pytest.raises(SystemExit, match="--png draws at most 6 runs in one picture; 7 given"):
        compare.main([str(a)] * 7 + ["--png", str(tmp_path / "x.png")])
    assert not (tmp_path / "x.png").exists()
    for out in (a, b):  # runs that never validated: their table, no picture
        (out / "train.log").write_text(CONFIG.format(seed=1, arch="convs2s_iwslt_de_en"))
    with pytest.raises(SystemExit, match="no run has validation points in its train.log: no picture"):
        compare.main([str(a), str(b), "--png", str(tmp_path / "x.png")])
    # no minutes, updates, words/s or perplexity columns to fill; the model tested and its score still shown
    assert row(capsys.readouterr().out, "fconv_s1")[3:8] == ["-", "-", "-", "-", "checkpoint_best.pt"]


def test_curves_png_more_than_its_colours_is_an_error(tmp_path):
    points = [CurvePoint(1.0, 1, 10, 5.0, 4.0, 30.0)]
    with pytest.raises(ValueError, match="7 curves: one picture draws at most 6"):
        write_curves_png([(str(i), points) for i in range(7)], tmp_path / "x.png", "too many")


def test_curves_png_with_a_run_without_points(tmp_path):
    points = [CurvePoint(1.0, 1, 10, 5.0, 4.0, 30.0), CurvePoint(2.0, 2, 20, 4.0, 3.0, 9.0)]
    path = tmp_path / "x.png"
    write_curves_png([("a", points), ("b", [])], path, "one empty")
    _, _, rows = read_png(path)
    area = plot_area(points)
    assert pixel(rows, area.x_pixel(2.0), area.y_pixel(9.0)) == SERIES_COLOURS[0]
    assert any(pixel(rows, x, y) == SERIES_COLOURS[1] for y in range(area.top, area.top + 40) for x in range(600))


def test_curves_png_long_names_stay_inside_the_picture(tmp_path):
    points = [CurvePoint(1.0, 1, 10, 5.0, 4.0, 30.0), CurvePoint(2.0, 2, 20, 4.0, 3.0, 9.0)]
    path = tmp_path / "x.png"
    names = ["/a/very/long/path/" * 8 + "convs2s_seed1", "/a/very/long/path/" * 8 + "fconv_seed1"]
    write_curves_png([(names[0], points), (names[1], points[:1])], path, "long names")
    _, _, rows = read_png(path)
    area = plot_area(points)
    for colour in SERIES_COLOURS[:2]:  # each run's legend line, its name cut at the front, lies inside the plot
        xs = [x for y in range(area.top, area.top + 40) for x in range(640) if pixel(rows, x, y) == colour]
        assert xs and min(xs) > area.left
