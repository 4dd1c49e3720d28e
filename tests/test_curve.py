"""examples/recipes/curve.py: parsing a fairseq-train log into a validation curve, and writing it as TSV and PNG."""

import sys
from pathlib import Path

import pytest
from png_reader import pixel, read_png

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO_ROOT / "examples"))

from recipes.curve import (  # noqa: E402
    HEIGHT,
    LINE_COLOUR,
    WIDTH,
    CurvePoint,
    plot_area,
    read_validation_curve,
    write_curve_png,
    write_curve_tsv,
)

SAMPLE_LOG = """\
2026-11-26 00:12:28 | INFO | valid | epoch 001 | valid on 'valid' subset | loss 8.402 | nll_loss 7.651 | ppl 201.03 | wps 15582 | wpb 2067.6 | bsz 126.8 | num_updates 135
2026-11-26 00:12:29 | INFO | train | epoch 001 | loss 9.867 | nll_loss 9.338 | ppl 647.28 | wps 861.7 | ups 0.25 | wpb 3387.6 | bsz 214.8 | num_updates 135 | lr 0.25 | gnorm 1.256 | clip 100 | train_wall 529 | wall 532
2026-11-26 00:14:49 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 7.403 | nll_loss 6.492 | ppl 90.03 | wps 15801.8 | wpb 2067.6 | bsz 126.8 | num_updates 270 | best_loss 7.403
2026-11-26 00:14:50 | INFO | train | epoch 002 | loss 7.881 | nll_loss 7.051 | ppl 132.57 | wps 3240.1 | ups 0.96 | wpb 3387.6 | bsz 214.8 | num_updates 270 | lr 0.25 | gnorm 0.429 | clip 100 | train_wall 139 | wall 674
"""  # noqa: E501

RESUMED_LOG = """\
2026-11-26 00:14:50 | INFO | fairseq.checkpoint_utils | Saved checkpoint checkpoints/checkpoint2.pt (epoch 2 @ 270 updates, score 7.403) (writing took 1.2 seconds)
Traceback (most recent call last):
  File "fairseq_cli/train.py", line 557, in cli_main
RuntimeError: CUDA error: an illegal memory access was encountered
recipe: resuming from checkpoints/checkpoint1.pt
2026-11-26 00:20:01 | INFO | fairseq_cli.train | task: TranslationTask
2026-11-26 00:20:02 | INFO | fairseq.trainer | Loaded checkpoint checkpoints/checkpoint1.pt (epoch 1 @ 135 updates)
2026-11-26 00:21:11 | INFO | train_inner | epoch 002:     65 / 135 loss=8.259, nll_loss=7.495, ppl=180.42, wps=1951.1, ups=0.57, wpb=3450.7, bsz=220.8, num_updates=200, lr=0.25, gnorm=0.444, clip=100, train_wall=175, wall=635
2026-11-26 00:22:40 | INFO | valid | epoch 002 | valid on 'valid' subset | loss 7.300 | nll_loss 6.400 | ppl 84.45 | wps 15801.8 | wpb 2067.6 | bsz 126.8 | num_updates 270 | best_loss 7.300
2026-11-26 00:22:41 | INFO | train | epoch 002 | loss 7.800 | nll_loss 7.000 | ppl 128.00 | wps 3240.1 | ups 0.96 | wpb 3387.6 | bsz 214.8 | num_updates 270 | lr 0.25 | gnorm 0.429 | clip 100 | train_wall 139 | wall 720
2026-11-26 00:23:30 | INFO | train_inner | epoch 003:     30 / 135 loss=7.100, nll_loss=6.200, ppl=73.52, wps=1951.1, ups=0.57, wpb=3450.7, bsz=220.8, num_updates=300, lr=0.25, gnorm=0.444, clip=100, train_wall=200, wall=760
2026-11-26 00:24:30 | INFO | train_inner | epoch 003:    130 / 135 loss=6.900, nll_loss=6.000, ppl=64.00, wps=1951.1, ups=0.57, wpb=3450.7, bsz=220.8, num_updates=400, lr=0.25, gnorm=0.444, clip=100, train_wall=260, wall=822
2026-11-26 00:24:41 | INFO | valid | epoch 003 | valid on 'valid' subset | loss 6.800 | nll_loss 5.900 | ppl 59.71 | wps 15801.8 | wpb 2067.6 | bsz 126.8 | num_updates 405 | best_loss 6.800
2026-11-26 00:24:45 | INFO | train_inner | epoch 004:      1 / 135 loss=6.900, nll_loss=6.000, ppl=64.00, wps=1951.1, ups=0.57, wpb=3450.7, bsz=220.8, num_updates=406, lr=0.25, gnorm=0.444, clip=100, train_wall=262, wall=900
Killed
"""  # noqa: E501


def test_sample_log():
    assert read_validation_curve(SAMPLE_LOG) == [
        CurvePoint(532 / 60, 1, 135, 8.402, 7.651, 201.03),
        CurvePoint(674 / 60, 2, 270, 7.403, 6.492, 90.03),
    ]


def test_resumed_run_crlf_and_killed_mid_epoch():
    log = (SAMPLE_LOG + RESUMED_LOG).replace("\n", "\r\n")
    assert read_validation_curve(log) == [
        CurvePoint(532 / 60, 1, 135, 8.402, 7.651, 201.03),
        CurvePoint(720 / 60, 2, 270, 7.300, 6.400, 84.45),  # the resumed run's epoch 2 wins
        CurvePoint(822 / 60, 3, 405, 6.800, 5.900, 59.71),  # no train summary: the train_inner wall before it
    ]


def test_valid_line_without_any_wall_is_left_out():
    valid_only = SAMPLE_LOG.splitlines()[0] + "\n"
    assert read_validation_curve(valid_only) == []
    assert read_validation_curve("junk\n| INFO | valid | nothing here\n") == []


def test_tsv_round_trip(tmp_path):
    points = read_validation_curve(SAMPLE_LOG)
    path = tmp_path / "curve.tsv"
    write_curve_tsv(points, path)
    lines = path.read_text().splitlines()
    assert lines[0].split("\t") == ["minutes", "epoch", "num_updates", "valid_loss", "valid_nll_loss", "valid_ppl"]
    assert lines[1:] == ["8.87\t1\t135\t8.402\t7.651\t201.03", "11.23\t2\t270\t7.403\t6.492\t90.03"]
    for point, line in zip(points, lines[1:]):
        minutes, epoch, updates, loss, nll, ppl = line.split("\t")
        assert (int(epoch), int(updates), float(loss), float(nll), float(ppl)) == point[1:]
        assert float(minutes) == pytest.approx(point.minutes, abs=0.005)


def test_png_plots_the_points(tmp_path):
    points = read_validation_curve(SAMPLE_LOG + RESUMED_LOG)
    path = tmp_path / "curve.png"
    write_curve_png(points, path, "fconv wmt14 en-de (tiny): 1 GPU")
    width, height, rows = read_png(path)
    assert (width, height) == (WIDTH, HEIGHT)
    assert any(byte != 255 for row in rows for byte in row)
    area = plot_area(points)
    assert area.x_ticks[0] == 0 and area.x_max * 1.01 >= points[-1].minutes
    for point in points:
        x, y = area.x_pixel(point.minutes), area.y_pixel(point.ppl)
        assert area.left < x <= area.right and area.top <= y <= area.bottom
        assert pixel(rows, x, y) == LINE_COLOUR
    # halfway along the line between the first two points
    (x0, y0), (x1, y1) = [(area.x_pixel(p.minutes), area.y_pixel(p.ppl)) for p in points[:2]]
    neighbourhood = [
        pixel(rows, (x0 + x1) // 2 + dx, (y0 + y1) // 2 + dy) for dx in (-1, 0, 1) for dy in (-2, -1, 0, 1, 2)
    ]
    assert LINE_COLOUR in neighbourhood
    assert pixel(rows, width - 1, height - 1) == (255, 255, 255)
    assert pixel(rows, 0, height - 1) == (255, 255, 255)
    # log scale: the y ticks are the nice values 1, 2, 5 x 10^k enclosing the perplexities
    assert area.y_ticks == (50.0, 100.0, 200.0, 500.0)
    assert area.y_pixel(100) - area.y_pixel(1000) == pytest.approx(area.y_pixel(10) - area.y_pixel(100), abs=1)


def test_a_budgets_last_point_just_past_the_minute_keeps_the_axis(tmp_path):
    """A 30-minute budget validates last at 30.08 min: the axis ends at 30, not at the next step (40)."""
    points = [CurvePoint(7.5 * i, i, 100 * i, 5.0, 4.0, 60.0 / i) for i in range(1, 4)]
    points.append(CurvePoint(30.08, 4, 400, 5.0, 4.0, 12.0))
    area = plot_area(points)
    assert area.x_max == 30 and area.x_ticks == (0, 5, 10, 15, 20, 25, 30)
    path = tmp_path / "curve.png"
    write_curve_png(points, path, "budget")
    _, _, rows = read_png(path)
    x, y = area.x_pixel(30.08), area.y_pixel(12.0)
    assert area.right < x < WIDTH and pixel(rows, x, y) == LINE_COLOUR  # in the right margin, drawn
    assert plot_area(points[:-1] + [CurvePoint(30.4, 4, 400, 5.0, 4.0, 12.0)]).x_max >= 30.4  # past 1%: covered


def test_no_points_raises(tmp_path):
    with pytest.raises(ValueError, match="no validation points"):
        write_curve_png([], tmp_path / "curve.png", "empty")
    assert not (tmp_path / "curve.png").exists()


@pytest.mark.parametrize(
    "points",
    [
        [CurvePoint(0.0, 1, 10, 5.0, 4.0, 16.0)],
        [CurvePoint(3.5, 1, 10, 5.0, 4.0, 16.0)],
        [CurvePoint(0.0, 1, 10, 5.0, 4.0, 16.0), CurvePoint(0.0, 2, 20, 5.0, 4.0, 16.0)],
        [CurvePoint(1.0 * i, i, 10 * i, 5.0, 4.0, 7.14) for i in range(1, 6)],
        [CurvePoint(1.0 * i, i, 10 * i, 20.0, 19.0, 2.0**19 / i**4) for i in range(1, 40)],
    ],
    ids=["one-point-at-zero", "one-point", "all-at-zero", "constant-ppl", "many-decades"],
)
def test_edge_cases_give_valid_pngs(tmp_path, points):
    path = tmp_path / "curve.png"
    write_curve_png(points, path, "Edge case: ~unusual~ title {glyphs}")
    width, height, rows = read_png(path)
    area = plot_area(points)
    assert area.top <= area.y_pixel(points[-1].ppl) <= area.bottom
    assert (
        area.y_ticks[0] <= min(p.ppl for p in points) < max(p.ppl for p in points) * 1.0001 <= area.y_ticks[-1] * 1.0001
    )
    assert pixel(rows, area.x_pixel(points[-1].minutes), area.y_pixel(points[-1].ppl)) == LINE_COLOUR
    assert pixel(rows, width - 1, height - 1) == (255, 255, 255)
