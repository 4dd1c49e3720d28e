"""The benchmark harness: its FLOP counter (the training bound and the FLOP/s-of-peak column rest on it), its time
split, its report, the training-forms variants and the real-batches comparison."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from cli_helpers import make_splits, preprocess
from utils import build_model

from benchmarks import (
    ablations,
    alone,
    bf16_generation,
    checkpoint_activations,
    data_workers,
    measure,
    pair,
    profile,
    recipe_training,
)
from benchmarks.against_revision import module_at
from benchmarks.measure import count_flops
from benchmarks.op_split import PRODUCTS, OperatorTimer, split_update
from benchmarks.op_split import main as op_split_main
from benchmarks.real_batches import main as real_batches_main
from benchmarks.recipe_training import command as recipe_training_command
from benchmarks.recipe_training import main as recipe_training_main
from benchmarks.report import render
from benchmarks.risk_update import VARIANTS as RISK_VARIANTS
from benchmarks.risk_update import _variant as risk_variant
from benchmarks.train_forms import main as train_forms_main
from benchmarks.train_forms import torch_compile
from convs2s_runtime import products
from fairseq_convs2s.criterions import sequence_risk
from fairseq_convs2s.modules.training_products import training_linear
from fairseq_convs2s.modules.weight_norm import WeightNorm


def test_count_flops_counts_conv_tbc_forward_and_backward():
    # torch's counter knows neither conv_tbc nor the in-place addmm_ products its backward is made of; an
    # earlier version of the harness missed both and reported a training update at half its FLOPs
    time, batch, k, c_in, c_out, pad = 9, 4, 3, 8, 16, 1
    x = torch.randn(time, batch, c_in, requires_grad=True)
    weight = torch.randn(k, c_in, c_out, requires_grad=True)
    bias = torch.zeros(c_out, requires_grad=True)

    def forward_backward():
        torch.conv_tbc(x, weight, bias, pad).sum().backward()

    # the (output step, tap) pairs that read a real input step, not the padding: 8 + 9 + 8 of 9 x 3
    pairs = sum(1 for t in range(time + 2 * pad - k + 1) for tap in range(k) if 0 <= t + tap - pad < time)
    assert pairs == 25
    forward = 2 * pairs * batch * c_in * c_out
    with torch.no_grad():
        assert count_flops(lambda: torch.conv_tbc(x, weight, bias, pad)) == forward
    # backward: the gradient of the input and of the kernel, each as many products as the forward
    assert count_flops(forward_backward) == 3 * forward


def test_count_flops_counts_a_linear_once():
    x = torch.randn(6, 8, requires_grad=True)
    weight = torch.randn(5, 8, requires_grad=True)
    bias = torch.zeros(5, requires_grad=True)
    flops = count_flops(lambda: F.linear(x, weight, bias).sum().backward())
    assert flops == 3 * 2 * 6 * 8 * 5


def test_count_flops_counts_the_onednn_training_linear():
    # the large linears train through oneDNN's product, which torch's counter does not know either: forward and
    # input gradient by oneDNN, weight gradient by MKL, three products in all like F.linear
    x = torch.randn(64, 512, requires_grad=True)
    weight = torch.randn(1024, 512, requires_grad=True)
    bias = torch.zeros(1024, requires_grad=True)
    assert products.onednn_pays(x, 512 * 1024) == torch.backends.mkldnn.is_available()
    flops = count_flops(lambda: training_linear(x, weight, bias).sum().backward())
    assert flops == 3 * 2 * 64 * 512 * 1024


def test_generation_split_times_each_models_vocabulary_projection():
    # convs2s's decoding steps call the projection's folded product, not the module: a split that timed the
    # module's forward saw no vocabulary time at all and charged it to the decoder body
    from benchmarks.measure import generation_split, generator_fn, prepare_for_generation, source_batches
    from benchmarks.pair import Size, build_pair, make_dictionary

    size = Size("convs2s_iwslt_de_en", "[(16, 3)] * 2", "[(16, 3)] * 2", 16, 16, 40)
    dictionary = make_dictionary(size.vocab)
    samples = source_batches(dictionary, 2, 5, 2, torch.device("cpu"))
    for model in build_pair(size, dictionary, dropout=0.0):
        model = prepare_for_generation(model, 2)
        run, _ = generator_fn(model, dictionary, samples, 2, 5)
        split = generation_split(model, run, torch.device("cpu"))
        assert split["vocab_projection"] > 0 and split["decoder_body"] > 0 and split["encoder"] > 0
        parts = split["encoder"] + split["vocab_projection"] + split["decoder_body"] + split["beam_search"]
        assert abs(parts - split["total"]) < 1e-9


def test_report_gives_gpu_memory_its_own_columns_and_names_each_peak():
    results = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    for device, on_gpu in (("cpu", False), ("cuda", True)):
        text = render(json.loads((results / f"{device}.json").read_text()), results / "plot.png", results)
        memory_header = next(line for line in text.splitlines() if line.startswith("| size | model | RSS loaded"))
        assert ("GPU one update" in memory_header) is on_gpu
        assert ("GFLOP/s fp16" in text) is on_gpu  # fp16 is timed on a GPU only
        assert "GFLOP/s fp32" in text and "GFLOP/s bf16" in text


def test_train_forms_compile_variant_swaps_the_model_for_the_update_only():
    """``torch-compile`` runs the update through one compiled wrapper of the same model (same parameters), made
    once, and leaves the step's own model in place afterwards."""
    model = torch.nn.Linear(3, 2)
    step = SimpleNamespace(model=model)
    with torch_compile(step):
        compiled = step.model
        assert compiled is not model and list(compiled.parameters()) == list(model.parameters())
    assert step.model is model
    with torch_compile(step):
        assert step.model is compiled


def test_ablations_variants_decode_the_same_sentences_and_unknown_ones_are_refused(capsys):
    """Each of ``benchmarks.ablations``' variants patches what it names (a missing switch would raise) and decodes;
    a variant the script does not know stops it before any model is built."""
    torch.manual_seed(0)
    model = build_model(dropout=0.0).eval()  # unprepared, as the script runs it
    dictionary = model.decoder.dictionary
    samples = measure.source_batches(dictionary, 2, 5, 2, torch.device("cpu"))
    run, result = measure.generator_fn(model, dictionary, samples, 2, 5)
    for name, variant in ablations.VARIANTS.items():
        with variant():
            run()
        assert len(result["hyps"]) == 2, name
    with pytest.raises(SystemExit):
        ablations.main(["--variants", "module-steps,compiled-steps"])
    assert "unknown variants compiled-steps" in capsys.readouterr().err


def test_bf16_generation_prepares_copies_in_each_precision_and_writes_both_speeds(tmp_path, capsys):
    """``benchmarks.bf16_generation`` decodes a bf16 copy and an fp32 copy of one model (the model itself left
    unprepared, its weight norm not folded) and writes each one's sentences/s and their ratio."""
    model = build_model()
    fp32, bf16 = bf16_generation.prepared(model, 5, False), bf16_generation.prepared(model, 5, True)
    assert {p.dtype for p in fp32.parameters()} == {torch.float32}
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    norms = [[m.folded_in_place for m in net.modules() if isinstance(m, WeightNorm)] for net in (model, bf16)]
    assert norms[0] and not any(norms[0]) and all(norms[1]), norms  # folded for good in the copy only

    bf16_generation.main(
        ["--sizes", "iwslt", "--batches", "1", "--repeats", "1", "--src-len", "3", "--out", str(tmp_path)]
    )
    (row,) = json.loads((tmp_path / "bf16_generation_cpu.json").read_text())["rows"]
    assert row["fp32_sentences_per_s"] > 0 and row["bf16_sentences_per_s"] > 0
    assert row["bf16_over_fp32"] == pytest.approx(row["bf16_sentences_per_s"] / row["fp32_sentences_per_s"])
    assert f"= {row['bf16_over_fp32']:.2f}x" in capsys.readouterr().out


def test_train_forms_refuses_cpu_only_variants_on_a_gpu(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # (--device cuda is refused without a GPU)
    with pytest.raises(SystemExit):
        train_forms_main(["--device", "cuda", "--variants", "torch-compile,mkl-linears"])
    assert "on a GPU only fairseq-loss, torch-compile apply" in capsys.readouterr().err


def test_real_batches_times_the_four_variants_from_equal_weights(tmp_path, capsys):
    """``benchmarks.real_batches`` on a generated corpus: fairseq's batches (with their padding), every variant
    trained from the same weights, and without dropout the same losses as fconv's, the row-selecting fused
    criterion included."""
    make_splits(tmp_path, {"train": 60, "valid": 4})
    preprocess(tmp_path, "bin", trainpref="train", validpref="valid")
    out = tmp_path / "results" / "real.json"  # a folder not there yet: made
    real_batches_main(
        [str(tmp_path / "bin"), "--batches", "2", "--repeats", "1", "--max-tokens", "200", "--dropout", "0"]
        + ["--default-malloc", "--threads", "0", "--out", str(out)]
    )
    result = json.loads(out.read_text())
    assert [row["variant"] for row in result["rows"]] == ["fconv", "convs2s", "convs2s-fused-all", "convs2s-fused"]
    assert result["batches"] == 2 and result["target_tokens"] < result["target_positions"]  # padded batches
    losses = result["first_pass_losses"]
    assert len(losses["fconv"]) == 2
    for name, values in losses.items():
        assert values == pytest.approx(losses["fconv"], rel=1e-4), name
    assert "padding" in capsys.readouterr().out


def test_recipe_training_alternates_the_recipes_commands_and_gives_ratios(tmp_path, capsys):
    """``benchmarks.recipe_training``: the recipe's own training command per variant (its choices printed), one
    process per variant and round, the medians and each variant's ratio to the first."""
    make_splits(tmp_path, {"train": 200})
    preprocess(tmp_path, "bin", "--joined-dictionary", trainpref="train")  # the recipes' vocabulary is joint
    out = tmp_path / "recipe_training.json"
    small = "--encoder-layers '[(32, 3)]' --decoder-layers '[(32, 3)]' --encoder-embed-dim 32 --decoder-embed-dim 32"
    recipe_training_main(
        [str(tmp_path / "bin"), "--threads", "1", "--updates", "4", "--log-interval", "1", "--rounds", "2"]
        + ["--variants", "convs2s,convs2s-separate,convs2s-fp32"]
        + ["--train-args", small + " --decoder-out-embed-dim 32", "--out", str(out)]
    )
    rows = json.loads(out.read_text())["rows"]
    variants = ("convs2s", "convs2s-separate", "convs2s-fp32")
    assert [row["threads"] for row in rows] == [1]
    assert [len(rows[0][name]) for name in variants] == [2, 2, 2]
    assert all(wps > 0 for name in variants for wps in rows[0][name])
    printed = capsys.readouterr().out
    assert "convs2s: criterion: fused_label_smoothed_cross_entropy (" in printed
    assert "convs2s-fp32: criterion: fused_label_smoothed_cross_entropy (" in printed
    assert "precision: fp32 (--precision fp32)" in printed
    assert re.search(r"^convs2s: .*; embeddings: one table for both languages", printed, re.M)
    assert re.search(r"^convs2s-separate: .*; embeddings: separate source, target and output tables", printed, re.M)
    assert re.search(r"^\| 1 \| \d+ \| \d+ \(\*\*[0-9.]+x\*\*\) \| \d+ \(", printed, re.M), printed


def test_recipe_training_command_validates_and_saves_only_when_asked(tmp_path):
    """``benchmarks.recipe_training.command`` times updates alone unless ``validate``: then the whole run's epoch
    ends, validation and checkpoints, as ``benchmarks.data_workers`` measures them."""
    alone, _ = recipe_training_command(tmp_path, "convs2s", 4, 1, str(tmp_path / "ckpt"))
    whole, _ = recipe_training_command(tmp_path, "convs2s", 4, 1, str(tmp_path / "ckpt"), validate=True)
    assert {"--disable-validation", "--no-save"} <= set(alone)
    assert not {"--disable-validation", "--no-save"} & set(whole)
    assert [c for c in alone if c not in ("--disable-validation", "--no-save")] == whole


@pytest.mark.parametrize("variant, bf16", [("fconv-fused", True), ("fconv-fp32-fused", False)])
def test_recipe_training_gives_fconv_the_fused_criterion_in_its_fused_variants(tmp_path, monkeypatch, variant, bf16):
    """The recipe's fconv command (bf16 or fp32, on a CPU with bf16) with the plugin's criterion in place of
    fairseq's, the only flag that changes: what tells whether the recipe should give fconv the fused criterion."""
    monkeypatch.setattr(recipe_training.training, "cpu_has_bf16", lambda: True)
    cmd, notes = recipe_training_command(tmp_path, variant, 4, 1, str(tmp_path / "ckpt"))
    base, _ = recipe_training_command(tmp_path, "fconv" if bf16 else "fconv-fp32", 4, 1, str(tmp_path / "ckpt"))
    training = recipe_training.training
    assert cmd[cmd.index("--arch") + 1] == "fconv_iwslt_de_en"
    assert (cmd.count("--criterion"), training.given_value(cmd, "--criterion")) == (1, training.FUSED)
    assert (base.count("--criterion"), training.given_value(base, "--criterion")) == (1, training.FAIRSEQ_LOSS)
    assert ("--bf16" in cmd) == bf16
    assert training.without(cmd, {"--criterion"}) == training.without(base, {"--criterion"})
    assert notes[0] == "criterion: fused_label_smoothed_cross_entropy (--train-args)"


def test_real_batches_profile_prints_both_models_operators(tmp_path, capsys):
    make_splits(tmp_path, {"train": 40, "valid": 4})
    preprocess(tmp_path, "bin", trainpref="train", validpref="valid")
    real_batches_main(
        [str(tmp_path / "bin"), "--batches", "2", "--max-tokens", "200", "--profile", "--default-malloc"]
        + ["--threads", "0", "--out", str(tmp_path / "unused.json")]
    )
    out = capsys.readouterr().out
    fconv, convs2s = out.split("convs2s-fused, an update on these batches")
    assert "fconv, an update on these batches" in fconv
    for section in (fconv, convs2s):  # each model's 20 costliest operators, costliest first
        lines = section.splitlines()
        rows = [line.split(" | ") for line in lines[lines.index("|---|---|---|---|") + 1 :] if line.startswith("| ")]
        assert len(rows) == 20
        ms = [float(row[1]) for row in rows]
        assert ms == sorted(ms, reverse=True) and ms[0] > 0
        assert sum(float(row[2].rstrip("%")) for row in rows) <= 101  # shares of one run's total
    assert not (tmp_path / "unused.json").exists()  # profiling times nothing


def test_risk_update_variants_turn_a_shortcut_off_and_back_on():
    model = build_model()
    checks = {
        "repeated-sources": sequence_risk.reads_rows_per_source,
        "log-softmax": sequence_risk.normalizes_by_log_softmax,
        "all-positions": sequence_risk.projects_selected_rows,
    }
    assert sorted(checks) == sorted(RISK_VARIANTS)
    for name, check in checks.items():
        assert check(model)
        with risk_variant(name):
            assert not getattr(sequence_risk, check.__name__)(model)
        assert getattr(sequence_risk, check.__name__) is check


def test_apply_gradients_seconds_times_the_clip_and_optimizer_step_after_an_update():
    from benchmarks.measure import TrainStep, train_sample
    from benchmarks.pair import Size, build_pair, make_dictionary

    size = Size("convs2s_iwslt_de_en", "[(16, 3)] * 2", "[(16, 3)] * 2", 16, 16, 40)
    dictionary = make_dictionary(size.vocab)
    cpu = torch.device("cpu")
    _, convs2s = build_pair(size, dictionary, dropout=0.0)
    step = TrainStep(convs2s, train_sample(dictionary, 4, 5, cpu), dictionary.pad())
    with pytest.raises(RuntimeError, match="run the update first"):
        step.apply_gradients_seconds(1, cpu)
    step()
    before = [p.detach().clone() for p in step.params]
    assert step.apply_gradients_seconds(2, cpu) > 0
    assert any(not torch.equal(a, p) for a, p in zip(before, step.params))  # it steps the weights: 3 more times


def test_train_step_with_the_fused_loss_runs_the_criterion_and_gives_fairseqs_loss(monkeypatch):
    """``TrainStep(fused_loss=True)`` trains through the plugin's criterion itself: for convs2s on a CPU the
    decoder scores its rows in chunks; for fconv the loss comes from its logits. Either way fairseq's loss."""
    from benchmarks.measure import TrainStep, train_sample
    from benchmarks.pair import Size, build_pair, make_dictionary
    from fairseq_convs2s.criterions import fused_label_smoothed

    scored = []
    projected_loss = fused_label_smoothed.projected_label_smoothed_loss
    monkeypatch.setattr(
        fused_label_smoothed,
        "projected_label_smoothed_loss",
        lambda x, *a: scored.append(len(x)) or projected_loss(x, *a),
    )
    size = Size("convs2s_iwslt_de_en", "[(16, 3)] * 2", "[(16, 3)] * 2", 16, 16, 40)
    dictionary = make_dictionary(size.vocab)
    sample = train_sample(dictionary, 4, 5, torch.device("cpu"))
    for model, twin in zip(build_pair(size, dictionary, dropout=0.0), build_pair(size, dictionary, dropout=0.0)):
        twin.load_state_dict(model.state_dict())  # (fconv's weight norm cannot be deep-copied)
        losses = []
        for trained, fused_loss in ((model, False), (twin, True)):
            step = TrainStep(trained, sample, dictionary.pad(), fused_loss=fused_loss)
            step()
            losses.append(step.losses[0])
        assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert scored == [sample["ntokens"]]  # convs2s's fused update, once: every target token, in chunks


def test_training_bound_charges_every_implementation_the_vocabulary_the_body_at_peak_and_the_optimizer():
    from benchmarks.pair import SIZES
    from benchmarks.report import FUSED
    from benchmarks.run import training_bounds

    ntokens, peak = 1664, 200.0
    size = SIZES["iwslt"]
    vocab_gflop = 6 * ntokens * size.out_embed_dim * size.vocab / 1e9
    updates = {"fconv": 0.54, "convs2s": 0.49, FUSED: 0.47}
    row = {"size": "iwslt", "dtype": "fp32"}
    row.update({name: {"seconds_per_update": s, "apply_gradients_s": 0.02} for name, s in updates.items()})
    row["convs2s"]["gflop_per_update"] = vocab_gflop + 33.0  # 33 GFLOP of body: 0.165 s at the peak
    other_rows = [{"size": "iwslt", "dtype": "bf16"}, {"size": "wmt_en_de", "dtype": "fp32"}]
    (bound,) = training_bounds([row] + other_rows, {"stock": 0.24, "fused": 0.2}, ntokens, {"fp32": peak})
    assert bound["body_at_peak_s"] == pytest.approx(0.165)
    assert bound["bound"] == pytest.approx(0.54 / (0.24 + 0.165 + 0.02))
    assert bound["bound_fused"] == pytest.approx(0.54 / (0.2 + 0.165 + 0.02))
    assert bound["vocabulary_fused_form"] == "fused"  # a GPU's: from the logits
    # on a CPU the fused criterion projects and scores in chunks: its bound charges that form
    (bound,) = training_bounds([row], {"stock": 0.24, "fused": 0.2, "projected": 0.18}, ntokens, {"fp32": peak})
    assert bound["vocabulary_fused_form"] == "projected"
    assert bound["bound_fused"] == pytest.approx(0.54 / (0.18 + 0.165 + 0.02))


def test_operator_timer_splits_products_from_other_operators_forward_and_backward():
    x = torch.randn(32, 16, requires_grad=True)
    w = torch.randn(24, 16, requires_grad=True)
    timer = OperatorTimer()
    with timer:
        y = training_linear(x, w, None)  # small: F.linear, an mm
        torch.sigmoid(y).sum().backward()  # the weight and input gradients are two more mm
    assert timer.calls["mm"] == 3 and timer.calls["sigmoid"] == 1 and timer.calls["sigmoid_backward"] == 1
    split = timer.split()
    assert split["products"] == pytest.approx(timer.seconds["mm"])
    assert split["other"] == pytest.approx(sum(timer.seconds.values()) - timer.seconds["mm"])
    assert split["products"] > 0 and split["other"] > 0
    assert {"_linear_pointwise", "addmm_", "conv_tbc"} <= PRODUCTS  # oneDNN's linear, conv_tbc's backward, fconv's
    assert not timer.products  # shapes only when asked for


def test_operator_timer_counts_each_product_shape_with_its_flops():
    x = torch.randn(32, 16, requires_grad=True)
    w = torch.randn(24, 16, requires_grad=True)
    timer = OperatorTimer(by_shape=True)
    with timer:
        for _ in range(2):  # two runs: the rows are per run
            torch.sigmoid(training_linear(x, w, None)).sum().backward()
    rows = timer.product_rows(runs=2)
    # the forward x w^T, the input gradient g w and the weight gradient g^T x: 2 x 32 x 16 x 24 FLOPs each
    assert sorted(r["shapes"] for r in rows) == sorted(
        [((32, 16), (16, 24)), ((32, 24), (24, 16)), ((24, 32), (32, 16))]
    )
    for r in rows:
        assert (r["op"], r["calls"], r["gflop"]) == ("mm", 1, 2 * 32 * 16 * 24 / 1e9)
        assert r["gflops"] == pytest.approx(r["gflop"] / r["seconds"])
    assert [r["seconds"] for r in rows] == sorted((r["seconds"] for r in rows), reverse=True)
    assert sum(r["seconds"] for r in rows) == pytest.approx(timer.seconds["mm"] / 2)
    one = OperatorTimer()
    with one:
        torch.sigmoid(training_linear(x, w, None)).sum().backward()
    split = split_update(lambda: torch.sigmoid(training_linear(x, w, None)).sum().backward(), runs=2)
    assert split["calls"] == sum(one.calls.values()) - one.calls["mm"]  # the other operators' calls, per run
    assert sorted((r["shapes"], r["calls"]) for r in split["products_by_shape"]) == sorted(
        (r["shapes"], 1) for r in rows
    )


def test_split_update_of_several_updates_a_call_is_per_update_with_products_by_operator():
    # a pass over batches of different sizes (op_split --data): each figure divided by the updates a call runs,
    # and the products of the changing shapes summed by operator
    x = torch.randn(32, 16, requires_grad=True)
    w = torch.randn(24, 16, requires_grad=True)

    def a_pass():  # two updates, on 32 and then 8 rows
        for rows in (32, 8):
            x.grad = w.grad = None
            torch.sigmoid(training_linear(x[:rows], w, None)).sum().backward()

    split = split_update(a_pass, runs=3, updates=2)
    (mm,) = split["products_by_shape"]
    assert (mm["op"], mm["shapes"], mm["calls"]) == ("mm", (), 3)  # forward, input and weight gradient
    assert mm["gflop"] == pytest.approx(3 * 2 * (32 + 8) / 2 * 16 * 24 / 1e9)  # per update: the two's mean
    one = OperatorTimer()
    with one:
        a_pass()
    assert split["calls"] == (sum(one.calls.values()) - one.calls["mm"]) // 2
    assert split["products"] == pytest.approx(mm["seconds"])


def test_op_split_on_a_corpus_batches_prints_per_update_figures_for_both_models(tmp_path, capsys):
    make_splits(tmp_path, {"train": 60, "valid": 4})
    preprocess(tmp_path, "bin", trainpref="train", validpref="valid")
    op_split_main(["--data", str(tmp_path / "bin"), "--max-tokens", "200", "--batches", "2", "--repeats", "1"])
    out = capsys.readouterr().out
    assert re.search(r"^iwslt: 2 batches of .*bin \(--max-tokens 200\), \d+ target tokens$", out, re.M), out
    for name in ("fconv", "convs2s"):
        line = re.search(rf"^iwslt {name}: update (\d+) ms = products (\d+) ms \(([0-9.]+) GFLOP at", out, re.M)
        assert line and int(line.group(1)) > 0 and int(line.group(2)) > 0 and float(line.group(3)) > 0, out
    listed = re.findall(r"^  its products by (.*), the 8 slowest:\n((?:    .*\n)+)", out, re.M)
    assert [by for by, _ in listed] == ["operator", "operator"]
    for _, rows in listed:  # one row per operator, no operand shapes after the share of the peak
        ops = [row.split()[0] for row in rows.splitlines()]
        assert len(ops) == len(set(ops)) and set(ops) <= PRODUCTS
        assert all(row.rstrip().endswith("%)") for row in rows.splitlines())
    assert re.search(r"^iwslt: convs2s [0-9.]+x fconv\.", out, re.M)


def test_against_revision_loads_a_module_as_committed_beside_todays():
    from fairseq_convs2s.criterions import label_smoothed_loss

    old = module_at("HEAD", "fairseq_convs2s.criterions.label_smoothed_loss")
    assert old is not label_smoothed_loss and old.__package__ == "fairseq_convs2s.criterions"
    assert old._ProjectedLabelSmoothed is not label_smoothed_loss._ProjectedLabelSmoothed
    assert old.onednn_linear is label_smoothed_loss.onednn_linear  # its imports: today's modules
    logits, target = torch.randn(6, 11, dtype=torch.float64), torch.randint(0, 11, (6,))
    for module in (old, label_smoothed_loss):
        loss, nll = module.label_smoothed_nll_loss_from_logits(logits, target, 0.1, ignore_index=-100)
        torch.testing.assert_close(nll, F.cross_entropy(logits, target, reduction="sum"))


def test_data_workers_measures_a_commands_whole_process_tree():
    """``benchmarks.data_workers``: a run's memory is its processes' together, children included."""
    import sys

    script = (
        "import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3)']); "
    )
    script += "x = b'1' * (200 << 20); time.sleep(2); c.wait()"
    seconds, peak, most = data_workers.run([sys.executable, "-c", script])
    assert seconds >= 3 and most == 2  # the command and its child
    assert peak >= 200  # the parent's 200 MiB of ones: its own pages
    assert data_workers.VARIANTS == {"in-trainer": [], "worker": ["--num-workers", "1"]}


def test_alone_times_a_variant_in_a_fresh_process():
    # in this process: the updates after the untimed ones, each timed
    seconds = alone.update_seconds("convs2s-fused", "iwslt", updates=2, warmup=1)
    assert len(seconds) == 2 and min(seconds) > 0
    # the worker the script starts per variant and round: its own process, the update times on its last line
    from_worker = alone._worker("fconv", "iwslt", updates=1, keep=True)
    assert len(from_worker) == 1 and from_worker[0] > 0
    assert set(alone.VARIANTS) == {"fconv", "convs2s", "convs2s-fused"}


def test_checkpoint_activations_benchmark_runs_each_mode_in_a_process_of_its_own(tmp_path, capsys):
    """Both modes measured in fresh processes: the memory above the built model (at least the gradients and the
    momentum, the same in both modes) and the update times; the ratios are kept over checkpointed memory and
    checkpointed over kept time."""
    out = tmp_path / "ck.json"
    checkpoint_activations.main(
        ["--sizes", "iwslt", "--sentences", "8", "--length", "6", "--rounds", "1", "--updates", "1", "--json", str(out)]
    )
    result = json.loads(out.read_text())["sizes"]["iwslt"]
    (only_round,) = result["rounds"]
    kept, checkpointed = only_round["kept"], only_round["checkpointed"]
    assert kept["state_mib"] == checkpointed["state_mib"] > 0
    assert kept["memory_mib"] > 0.5 * kept["state_mib"] and checkpointed["memory_mib"] > 0.5 * kept["state_mib"]
    assert result["memory_ratio"] == pytest.approx(kept["memory_mib"] / checkpointed["memory_mib"])
    assert result["time_ratio"] == pytest.approx(checkpointed["seconds"] / kept["seconds"])
    assert "iwslt: update memory" in capsys.readouterr().out


def test_one_process_rows_take_medians_over_rounds_and_reach_the_harness_table(monkeypatch):
    """The harness's one-model-per-process training figures: each round's process gives its median update, the
    variants the median over rounds, the speed-ups fconv's median over theirs; the CPU table shows them."""
    from benchmarks import run

    per_process = {"fconv": [[0.6, 0.5, 0.7], [0.4]], "convs2s": [[0.5], [0.5]], "convs2s-fused": [[0.3], [0.2]]}
    calls = []

    def worker(variant, size_name, updates, keep, threads):
        calls.append((variant, size_name, updates, keep, threads))
        return per_process[variant][sum(c[0] == variant for c in calls) - 1]

    monkeypatch.setattr(alone, "_worker", worker)
    args = SimpleNamespace(quick=False, alone_rounds=2, alone_updates=3, keep_freed_memory=False, threads=1)
    r = run.one_process("iwslt", args)
    # variants in turn within a round: fconv, convs2s, fused, then again
    assert [c[0] for c in calls] == ["fconv", "convs2s", "convs2s-fused"] * 2
    assert all(c[1:] == ("iwslt", 3, False, 1) for c in calls)  # the run's malloc setting and threads
    assert r["fconv"]["round_seconds"] == [0.6, 0.4] and r["fconv"]["seconds_per_update"] == pytest.approx(0.5)
    fused = r["convs2s_fused_loss"]
    assert r["convs2s"]["speedup"] == pytest.approx(1.0) and fused["speedup"] == pytest.approx(0.5 / 0.25)
    assert fused["round_speedup_median"] == pytest.approx((2.0 + 2.0) / 2)  # 0.6/0.3 and 0.4/0.2
    results_dir = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    results = json.loads((results_dir / "cpu.json").read_text())
    fp32 = next(row for row in results["training"] if row["dtype"] == "fp32")
    fp32["one_process"] = r
    text = render(results, results_dir / "plot.png", results_dir)
    assert "| 1.00x / **2.00x** |" in text


@pytest.mark.parametrize("flag", [[], ["--keep-freed-memory"]])
def test_profile_runs_under_the_malloc_setting_asked_for_and_says_which(monkeypatch, capsys, flag):
    """With --keep-freed-memory the profile sets the training command's malloc (fairseq's loss then pays no fresh
    pages for its log-probabilities, as in the command); without it, glibc's default. Its first line says which."""
    calls = []
    monkeypatch.setattr(profile, "keep_freed_memory", lambda: calls.append("kept") or True)
    profile.main(["--impl", "fconv", "--runs", "1", "--rows", "2", *flag])  # torch's threads left as they are
    out = capsys.readouterr().out.splitlines()
    assert calls == (["kept"] if flag else [])
    assert out[0].endswith(f"freed memory kept: {bool(flag)}"), out[0]
    assert re.fullmatch(r"fconv, iwslt size, train, fp32: \d+ ms of self CPU time per run \(1 runs\)", out[1]), out
    assert len([row for row in out if re.fullmatch(r"\| \S.* \| [0-9.]+ \| [0-9.]+% \| \d+ \|", row)]) == 2, out


def test_machine_line_names_torch_the_commit_and_the_malloc_setting():
    line = measure.machine_line(kept=True)
    assert f"torch {torch.__version__}" in line and line.endswith("freed memory kept: True")
    assert f"{torch.get_num_threads()} threads" in line and "commit " in line


@pytest.mark.parametrize(
    "module, argv, said",
    [
        ("real_batches", ["{tmp}/gone"], "argument data_bin: {tmp}/gone: no such folder"),
        ("real_batches", ["{tmp}"], "argument data_bin: {tmp} holds no dict.*.txt: not a fairseq-preprocess folder"),
        ("risk_update", ["{tmp}/bin", "{tmp}/gone.pt"], "argument checkpoint: {tmp}/gone.pt: no such file"),
        ("bf16_curve", ["{tmp}/gone"], "argument data: {tmp}/gone: no such folder"),
        ("recipe_training", ["{tmp}/gone"], "argument data: {tmp}/gone: no such folder"),
        ("data_workers", ["{tmp}/bin:{tmp}/gone"], "argument data: {tmp}/gone: no such folder"),
        ("op_split", ["--sizes", "iwslt,big"], "argument --sizes: unknown size 'big': choose from iwslt, wmt_en_de"),
        ("op_split", ["--data", "{tmp}/gone"], "argument --data: {tmp}/gone: no such folder"),
        (
            "checkpoint_activations",
            ["--sizes", "big"],
            "argument --sizes: unknown size 'big': choose from iwslt, wmt_en_de",
        ),
        ("train_forms", ["--sizes", "big"], "argument --sizes: unknown size 'big': choose from iwslt, wmt_en_de"),
        (
            "train_forms",
            ["--sizes", "iwslt", "--variants", "conv-tbc,bogus"],
            "argument --variants: unknown variant 'bogus': choose from mkl-linears, conv-tbc, fairseq-loss, "
            "logits-loss, torch-dropout, torch-compile",
        ),
        (
            "runtime",
            ["--sizes", "iwslt", "--batches", "1", "--dtypes", "fp32,fp16"],
            "argument --dtypes: unknown dtype 'fp16': choose from fp32, bf16",
        ),
        (
            "runtime",
            ["--batches", "1,16x"],
            "argument --batches: '16x' is not a positive integer (comma-separated: 1,16,128)",
        ),
        (
            "ablations",
            ["--batches", "0"],
            "argument --batches: '0' is not a positive integer (comma-separated: 1,16,128)",
        ),
        (
            "bf16_generation",
            ["--batches", "16;128"],
            "argument --batches: '16;128' is not a positive integer (comma-separated: 1,16,128)",
        ),
        (
            "against_revision",
            ["no-such-rev", "criterions.label_smoothed_loss:onednn_pays"],
            "argument revision: 'no-such-rev': not a commit of this repository",
        ),
        ("against_revision", ["HEAD", "nosuch:f"], "argument what: no module fairseq_convs2s.nosuch"),
        (
            "against_revision",
            ["HEAD", "criterions.label_smoothed_loss:onednn_pays,_ProjectedLabelSmoothed.nosuch"],
            "argument what: fairseq_convs2s.criterions.label_smoothed_loss has no _ProjectedLabelSmoothed.nosuch, "
            "now or at HEAD",
        ),
        (
            "bf16_generation",
            ["--data", "{tmp}/gone", "--path", "{tmp}/bin/dict.en.txt"],
            "argument --data: {tmp}/gone: no such folder",
        ),
        (
            "bf16_generation",
            ["--data", "{tmp}/bin", "--path", "{tmp}/gone.pt"],
            "argument --path: {tmp}/gone.pt: no such file",
        ),
        ("runtime_recipe", ["{tmp}/gone"], "argument out: {tmp}/gone: no such folder"),
        ("runtime_recipe", ["{tmp}"], "argument out: {tmp} holds no data-bin: not a recipe's output folder"),
        (
            "recipe_training",
            ["{tmp}/bin", "--threads", "one"],
            "argument --threads: 'one' is not a positive integer (comma-separated: 1,16,128)",
        ),
        ("profile", ["--runs", "0"], "argument --runs: '0' is not a positive integer"),
        ("profile", ["--what", "generate", "--batch", "-1"], "argument --batch: '-1' is not a positive integer"),
        ("alone", ["--rounds", "0"], "argument --rounds: '0' is not a positive integer"),
        ("run", ["--repeats", "two"], "argument --repeats: 'two' is not a positive integer"),
        ("recipe_training", ["{tmp}/bin", "--updates", "0"], "argument --updates: '0' is not a positive integer"),
    ],
)
def test_a_data_folder_or_size_the_tools_cannot_use_is_a_usage_error(module, argv, said, tmp_path, capsys):
    """A DATA_BIN that is not there ended in a FileNotFoundError traceback (real_batches, recipe_training,
    data_workers), a CalledProcessError of the first training (bf16_curve) or fairseq's OSError (risk_update's
    checkpoint); an unknown --sizes name, train_forms' --variants name or runtime's --dtypes name in a KeyError once
    the tool had started (after building its models); a --batches or --threads list that is not of positive
    integers in a ValueError traceback (ablations' batch 0: a range() of step 0, once its model was built);
    against_revision's unknown revision, module or attribute in git's CalledProcessError, a ModuleNotFoundError or
    a KeyError; bf16_generation's --data or --path that is not there in fairseq-generate's failure, after its
    start-up, runtime_recipe's OUT in the export's; a count of 0 (profile's --runs, alone's --rounds) in a
    ZeroDivisionError or StatisticsError once it had measured nothing."""
    import importlib

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "dict.en.txt").write_text("a 1\n", encoding="utf-8")
    tool = importlib.import_module(f"benchmarks.{module}")
    with pytest.raises(SystemExit) as ended:
        tool.main([arg.format(tmp=tmp_path) for arg in argv])
    assert ended.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].split(" error: ", 1)[1] == said.format(tmp=tmp_path)


def test_matmul_peak_multiplies_by_onednn_only_in_a_dtype_onednn_computes_here(monkeypatch):
    """oneDNN refuses a bf16 product on a CPU without AVX-512 (AVX2: "could not create a primitive descriptor"):
    benchmarks.run and training_rows measure the bf16 peak before anything else and ended in that RuntimeError."""
    onednn_dtypes = []

    def onednn_linear(x, weight, bias):
        onednn_dtypes.append(x.dtype)
        if x.dtype != torch.float32:
            raise RuntimeError("could not create a primitive descriptor for the inner product forward primitive")
        return x @ weight.t()

    monkeypatch.setattr(products, "ONEDNN_DTYPES", frozenset({torch.float32}))  # as on an AVX2 CPU
    monkeypatch.setattr(products, "onednn_linear", onednn_linear)
    cpu = torch.device("cpu")
    assert measure.matmul_peak(torch.bfloat16, cpu, n=64) > 0  # MKL's product alone
    assert measure.matmul_peak(torch.float32, cpu, n=64) > 0
    assert onednn_dtypes and set(onednn_dtypes) == {torch.float32}


def _tiny_training_rows(monkeypatch):
    """benchmarks.training_rows at a tiny "iwslt" size, its peaks given (bf16 below half of fp32: skipped) and the
    one-process rounds answered without processes; returns the (size, rounds, updates) they were asked for."""
    from benchmarks import run

    tiny = pair.Size("convs2s_iwslt_de_en", "[(16, 3)] * 2", "[(16, 3)] * 2", 16, 16, 40)
    monkeypatch.setitem(run.SIZES, "iwslt", tiny)
    monkeypatch.setattr(run, "matmul_peaks", lambda device: {"fp32": 100.0, "bf16": 1.0})
    asked = []

    def round_medians(size_name, rounds, updates, keep, threads=0):
        asked.append((size_name, rounds, updates))
        return {variant: [1.0] * rounds for variant in alone.VARIANTS}

    monkeypatch.setattr(alone, "round_medians", round_medians)
    return asked


def test_training_rows_runs_on_a_cpu_with_the_harness_one_process_rounds(tmp_path, monkeypatch):
    """On a CPU training_rows ended in AttributeError ('Namespace' object has no attribute 'alone_rounds') after
    its first fp32 row: run.training reads the harness's --alone-rounds (and --threads), which training_rows did not
    define."""
    from benchmarks import training_rows

    asked = _tiny_training_rows(monkeypatch)
    out = tmp_path / "rows.json"
    training_rows.main(
        ["--sizes", "iwslt", "--src-len", "4", "--repeats", "1", "--alone-rounds", "2", "--out", str(out)]
    )
    fp32, bf16 = json.loads(out.read_text())["training"]
    assert fp32["dtype"] == "fp32" and fp32["one_process"]["convs2s"]["speedup"] == pytest.approx(1.0)
    assert asked == [("iwslt", 2, 5)] and "skipped" in bf16


def test_training_rows_quick_writes_beside_the_full_runs_results(tmp_path, monkeypatch):
    """training_rows --quick (16 sentences an update, 2 repeats) wrote benchmarks/results/training_<device>.json,
    over the committed full run, with nothing in it to tell them apart; benchmarks.run --quick has its _quick file."""
    from benchmarks import run, training_rows

    _tiny_training_rows(monkeypatch)
    monkeypatch.setattr(run, "RESULTS", tmp_path)
    training_rows.main(["--sizes", "iwslt", "--src-len", "4", "--quick"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["training_cpu_quick.json"]
    assert json.loads((tmp_path / "training_cpu_quick.json").read_text())["args"]["quick"] is True


def test_runtime_names_the_devices_it_runs_on(capsys):
    """runtime --device took any text and ended in torch's RuntimeError once the models were built."""
    from benchmarks import runtime

    with pytest.raises(SystemExit) as ended:
        runtime.main(["--sizes", "iwslt", "--device", "gpu"])
    assert ended.value.code == 2 and "argument --device: invalid choice: 'gpu'" in capsys.readouterr().err


def test_the_tools_make_the_folder_they_write_their_results_in(tmp_path, monkeypatch):
    """runtime --out, checkpoint_activations --json, training_rows --out (and real_batches --out) naming a folder
    not there yet ended in a FileNotFoundError at the end, once the whole benchmark had run and its figures were
    lost; run and bf16_generation made theirs."""
    from benchmarks import runtime, training_rows

    monkeypatch.setattr(runtime, "compare", lambda *args: [])
    runtime.main(["--sizes", "iwslt", "--out", str(tmp_path / "runtime")])
    assert json.loads((tmp_path / "runtime" / "runtime_cpu.json").read_text())["rows"] == []

    measured = {"seconds": 1.0, "memory_mib": 2.0, "state_mib": 1.0}
    monkeypatch.setattr(checkpoint_activations, "_worker", lambda mode, size_name, args: measured)
    checkpoint_activations.main(["--sizes", "iwslt", "--rounds", "1", "--json", str(tmp_path / "ck" / "ck.json")])
    assert json.loads((tmp_path / "ck" / "ck.json").read_text())["sizes"]["iwslt"]["memory_ratio"] == 1.0

    _tiny_training_rows(monkeypatch)
    training_rows.main(["--sizes", "iwslt", "--src-len", "4", "--quick", "--out", str(tmp_path / "rows" / "r.json")])
    assert json.loads((tmp_path / "rows" / "r.json").read_text())["training"][0]["dtype"] == "fp32"


def test_report_names_the_batch_and_length_the_scaling_rows_ran_at():
    """The scaling table and plot said batch 16 and 25 tokens whatever the run: benchmarks.run --quick decodes
    batches of 4, --src-len sets the beam rows' length."""
    results_dir = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    results = json.loads((results_dir / "cpu.json").read_text())
    assert "batch" not in results["scaling"]  # a run before the batch was recorded: 16
    assert "**Scaling** (ms per sentence, batch 16," in render(results, results_dir / "plot.png", results_dir)
    results["scaling"]["batch"], results["args"]["src_len"] = 4, 10
    text = render(results, results_dir / "plot.png", results_dir)
    assert "**Scaling** (ms per sentence, batch 4, convs2s_iwslt_de_en size):" in text
    assert "| beam (10 tokens) | 1 | 2 | 4 | 8 | 12 |" in text
    beams = results["scaling"]["beam"]
    assert f"| speed-up | {beams[0]['fconv'] / beams[0]['convs2s']:.2f}x |" in text


def test_report_writes_a_saved_runs_section_again_and_leaves_the_rest(tmp_path):
    """``python -m benchmarks.report RESULTS.json`` rewrites that device's section from the saved run (after a
    change to the report) without measuring, and touches nothing outside its markers."""
    from benchmarks import report

    results_dir = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    saved = tmp_path / "cpu.json"
    saved.write_text((results_dir / "cpu.json").read_text())
    document = tmp_path / "B.md"
    document.write_text("# B\n\nbefore\n\n<!-- results:cpu -->\nOLD SECTION\n<!-- /results:cpu -->\n\nafter\n")
    with pytest.raises(SystemExit, match="scaling_cpu.png is missing"):
        report.main([str(saved), "--markdown", str(document)])
    (tmp_path / "scaling_cpu.png").write_bytes(b"")
    report.main([str(saved), "--markdown", str(document)])
    text = document.read_text()
    assert text.startswith("# B\n\nbefore\n\n<!-- results:cpu -->\nMachine: ") and text.endswith("after\n")
    assert "OLD SECTION" not in text and "![scaling](scaling_cpu.png)" in text
    assert text.count("<!-- results:cpu -->") == 1


def test_run_quick_leaves_benchmarks_md_alone_unless_a_markdown_file_is_named(tmp_path, monkeypatch):
    """benchmarks.run --quick, "a small grid, to check the harness", appended a "Results: cpu_quick" section of
    its figures (one repeat, 4-sentence batches) to BENCHMARKS.md, the committed document."""
    from benchmarks import run

    results_dir = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
    full = json.loads((results_dir / "cpu.json").read_text())  # a run's results, given instead of measured
    monkeypatch.setattr(run, "describe_run", lambda args, device: dict(full["machine"]))
    monkeypatch.setattr(run, "matmul_peaks", lambda device: full["machine"]["matmul_gflops"])
    for part in ("generation", "training"):
        monkeypatch.setattr(run, part, lambda size, args, device, *peaks, part=part: full[part][:1])
    monkeypatch.setattr(run, "limits", lambda *args: full["limits"])
    monkeypatch.setattr(run, "scaling", lambda args, device: full["scaling"])
    monkeypatch.setattr(run, "memory", lambda args, device: full["memory"])
    monkeypatch.chdir(tmp_path)
    document = "# Benchmarks\n\n<!-- results:cpu -->\nthe full run\n<!-- /results:cpu -->\n"
    (tmp_path / "BENCHMARKS.md").write_text(document)
    run.main(["--quick", "--sizes", "iwslt", "--out", str(tmp_path / "out")])
    assert (tmp_path / "BENCHMARKS.md").read_text() == document
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cpu_quick.json", "scaling_cpu_quick.png"]
    run.main(["--quick", "--sizes", "iwslt", "--out", str(tmp_path / "out"), "--markdown", "quick.md"])
    assert "<!-- results:cpu_quick -->" in (tmp_path / "quick.md").read_text()


def test_runtime_recipe_names_a_checkpoint_the_recipe_folder_lacks(tmp_path, capsys):
    """runtime_recipe's default --checkpoint avg on a folder without checkpoint_avg.pt (the quickstart's) ended in
    the export's failure, its command line and its output's tail."""
    from benchmarks import runtime_recipe

    for part in ("data-bin", "spm", "raw", "checkpoints"):
        (tmp_path / part).mkdir()
    (tmp_path / "spm" / "spm.model").write_bytes(b"")
    (tmp_path / "checkpoints" / "checkpoint_best.pt").write_bytes(b"")
    with pytest.raises(SystemExit) as ended:
        runtime_recipe.main([str(tmp_path)])
    said = capsys.readouterr().err.splitlines()[-1].split(" error: ", 1)[1]
    assert (
        ended.value.code == 2
        and said == f"argument --checkpoint: {tmp_path}/checkpoints/checkpoint_avg.pt: no such file"
    )


def test_bf16_curve_wants_two_log_intervals_and_says_why_a_training_failed(tmp_path, capsys):
    """bf16_curve's words/s are the median of the log intervals after the first: --updates under two intervals
    ended in a StatisticsError once the first training had run; a failing training (here a folder with a
    dictionary and no train split) in a CalledProcessError that hid fairseq's words."""
    from benchmarks import bf16_curve

    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "dict.en.txt").write_text("a 1\n", encoding="utf-8")
    with pytest.raises(SystemExit) as ended:
        bf16_curve.main([str(tmp_path / "bin"), "--updates", "30", "--log-interval", "20"])
    said = capsys.readouterr().err.splitlines()[-1].split(" error: ", 1)[1]
    assert ended.value.code == 2 and said == "--updates 30 gives fewer than two --log-interval 20 intervals"
    with pytest.raises(SystemExit) as ended:
        bf16_curve.main([str(tmp_path / "bin"), "--updates", "2", "--log-interval", "1", "--out", str(tmp_path / "o")])
    assert str(ended.value.code).startswith("training failed (exit ") and not (tmp_path / "o").exists()


@pytest.mark.parametrize(
    "module", ["run", "training_rows", "train_forms", "checkpoint_activations", "bf16_generation", "runtime"]
)
def test_device_cuda_without_a_gpu_is_a_usage_error(module, monkeypatch, capsys):
    """--device cuda on a machine without a GPU ended in torch's AssertionError ("Torch not compiled with CUDA
    enabled") or RuntimeError, some tools once their models were built."""
    import importlib

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as ended:
        importlib.import_module(f"benchmarks.{module}").main(["--device", "cuda", "--sizes", "iwslt"])
    said = capsys.readouterr().err.splitlines()[-1].split(" error: ", 1)[1]
    assert (
        ended.value.code == 2 and said == f"argument --device: cuda: torch {torch.__version__} has no CUDA device here"
    )


def test_git_ignores_what_a_quick_check_writes_beside_the_results():
    """benchmarks.run --quick and training_rows --quick write cpu_quick.json, scaling_cpu_quick.png and
    training_cpu_quick.json into benchmarks/results, among the committed results: they showed as new files there,
    one `git add benchmarks/results` from being committed beside the full runs."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    written = ["cpu_quick.json", "scaling_cpu_quick.png", "training_cpu_quick.json", "cuda_quick.json"]
    paths = [f"benchmarks/results/{name}" for name in written]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=root, capture_output=True, text=True).stdout
    assert ignored.split() == paths
    committed = ["benchmarks/results/cpu.json", "benchmarks/results/training_cpu.json"]
    assert subprocess.run(["git", "check-ignore", *committed], cwd=root, capture_output=True).returncode == 1  # none


def test_run_split_measures_the_fp32_peak_alone(tmp_path, monkeypatch):
    """--split's bounds take the fp32 matmul peak alone, but it measured bf16's too: on a CPU without bf16
    instructions one emulated 2048^3 product, about a minute of a two-minute run."""
    from benchmarks import run

    measured = []
    monkeypatch.setattr(measure, "matmul_peak", lambda dtype, device: measured.append(dtype) or 100.0)
    monkeypatch.setattr(run, "generation_bounds", lambda *args: [])
    run.main(["--split", "iwslt:1", "--out", str(tmp_path)])
    assert measured == [torch.float32]
    assert json.loads((tmp_path / "split_cpu.json").read_text())["machine"]["matmul_gflops_fp32"] == 100.0
