"""Metric wiring on hand-made references, the slot check, the data reader and adapter choice."""

import importlib.util
import json
import re
from pathlib import Path

import pytest
import torch

from conftest import tiny_model
from skipdecode.adapters import lora as adapters
from skipdecode.evaluation import data
from skipdecode.evaluation.data import Item, pairs, parse_mr, read_items, renamed_items, split_items
from skipdecode.evaluation.evaluate import check_held_out, human_scores, names_copied, score, slot_error_rate, slot_realized

ROOT = Path(__file__).resolve().parent.parent
EAGLE = Item("name[The Eagle], eatType[coffee shop], food[French], area[riverside], familyFriendly[yes]",
             ("The Eagle is a family friendly French coffee shop by the riverside.",
              "By the riverside, The Eagle coffee shop serves French food and welcomes kids."))
MILL = Item("name[The Mill], priceRange[less than £20], customer rating[5 out of 5], familyFriendly[no]",
            ("The Mill is a cheap place rated 5 out of 5, not family-friendly.",))


def test_outputs_equal_to_references_score_100():
    result = score([EAGLE, MILL], [EAGLE.refs[1], MILL.refs[0]])
    assert result["bleu"] == pytest.approx(100.0)
    assert result["rouge_l"] == pytest.approx(100.0)
    assert result["chrf"] == pytest.approx(100.0)
    assert result["ser"] == 0.0 and result["names"] == 100.0 and result["length"] == pytest.approx(100.0)
    assert result["bleu_e2e"] == pytest.approx(100.0)


def test_the_challenges_bleu_ignores_case():
    """The E2E challenge's script (e2e-metrics, pymteval) matches n-grams case-insensitively; sacrebleu's
    default does not."""
    shouted = [EAGLE.refs[1].upper(), MILL.refs[0].lower()]
    result = score([EAGLE, MILL], shouted)
    assert result["bleu_e2e"] == pytest.approx(100.0) and result["bleu"] < 50


def test_length_is_output_words_per_reference_word():
    """BLEU's own count: 13a tokens against the closest reference length; a short output is below 100."""
    short = score([MILL], ["The Mill is cheap."])  # 5 tokens against the reference's 15 ("," and "." count)
    assert short["length"] == pytest.approx(100 * 5 / 15)
    assert score([MILL], [MILL.refs[0] + " " + MILL.refs[0]])["length"] == pytest.approx(200.0)


def test_names_copied_counts_exact_names_only():
    outputs = ["The Eagle is a French coffee shop.", "The Mil is cheap."]  # the second misspells it
    assert names_copied([EAGLE, MILL], outputs) == 0.5
    assert names_copied([EAGLE, MILL], [o.upper() for o in outputs]) == 0.5  # case does not matter
    assert names_copied([Item("food[Thai]", ("Thai.",))], ["Thai."]) == 1.0  # no name to copy


def test_made_up_names_replace_name_and_landmark_everywhere():
    near = Item("name[The Mill], food[Thai], near[Café Rouge]",
                ("The Mill serves Thai near Café Rouge.", "Near Café Rouge, The Mill is Thai."))
    renamed = renamed_items([EAGLE, near], seed=3)
    assert renamed == renamed_items([EAGLE, near], seed=3)  # fixed by the seed
    for old, new in zip([EAGLE, near], renamed):
        assert len(new.refs) == len(old.refs)
        for key, value in old.slots.items():
            if key in ("name", "near"):
                assert new.slots[key] != value and all(new.slots[key] in r and value not in r for r in new.refs)
            else:
                assert new.slots[key] == value
    assert len({new.slots["name"] for new in renamed_items([EAGLE] * 20)}) > 10  # many names, not one


def test_word_names_are_names_as_people_type_them_and_no_training_run_draws():
    near = Item("name[The Mill], food[Thai], near[Café Rouge]",
                ("The Mill serves Thai near Café Rouge.", "Near Café Rouge, The Mill is Thai."))
    items = [EAGLE, near] * 40
    assert renamed_items(items) == renamed_items(items, style="syllables")  # the default kind is unchanged
    words = renamed_items(items, seed=3, style="words")
    assert words == renamed_items(items, seed=3, style="words")
    vocabulary = set(data.ADJECTIVES) | set(data.NOUNS) | {"The", "and"}
    for old, new in zip(items, words):
        for key in ("name", "near"):
            if key in old.slots:
                assert set(new.slots[key].split()) <= vocabulary and len(new.slots[key].split()) >= 2
                assert all(new.slots[key] in r and old.slots[key] not in r for r in new.refs)
        if "near" in new.slots:
            assert new.slots["near"] != new.slots["name"]
    names = [i.slots["name"] for i in words]
    assert any(" and " in n for n in names) and any(n.startswith("The ") for n in names)
    trained = {w for p, _ in pairs(items, renamed=1.0, words=1.0) for w in re.findall(r"\w+", p)}
    assert trained & set(data.TRAIN_NOUNS) and not trained & (set(data.NOUNS) | set(data.ADJECTIVES))
    assert not (set(data.TRAIN_NOUNS) | set(data.TRAIN_ADJECTIVES)) & (set(data.NOUNS) | set(data.ADJECTIVES))


def test_training_pairs_rename_the_share_asked_for():
    items = [EAGLE, MILL] * 50
    plain = pairs(items)
    assert plain == pairs(items, renamed=0.0) and plain[0] == (EAGLE.prompt, EAGLE.refs[0])
    assert all("The Eagle" not in p and "The Mill" not in p for p, _ in pairs(items, renamed=1.0))
    assert pairs(items, renamed=0.5, seed=2) == pairs(items, renamed=0.5, seed=2, words=0.0)
    mixed = [re.findall(r"\w+", p) for p, _ in pairs(items, renamed=1.0, words=0.5)]
    assert 0.3 < sum(bool(set(p) & set(data.TRAIN_NOUNS)) for p in mixed) / len(mixed) < 0.7
    half = pairs(items, renamed=0.5, seed=1)
    assert half == pairs(items, renamed=0.5, seed=1)
    changed = sum(a != b for a, b in zip(plain, half)) / len(plain)
    assert 0.35 < changed < 0.65
    for prompt, ref in half:  # the prompt's name is the one its reference uses
        assert parse_mr(prompt.split(": ", 1)[1])["name"] in ref


def test_validation_split_is_the_mrs_training_held_out(tmp_path):
    rows = "".join(f'"name[R{i}], food[Thai]",R{i} serves Thai.\n' for i in range(40))
    (tmp_path / "devset.csv").write_text("mr,ref\n" + rows)
    held = data.eval_items(tmp_path, "validation")
    assert held == split_items(read_items(tmp_path / "devset.csv"), data.VALIDATION_SHARE, data.SPLIT_SEED)[1]
    assert len(held) == 2
    with pytest.raises(ValueError, match="split must be test, dev or validation"):
        data.eval_items(tmp_path, "train")


def test_the_training_split_trains_and_the_whole_devset_chooses(tmp_path):
    """`train --split train` reads trainset.csv whole; `eval --split dev` scores every devset MR; the
    devset-era split trains on the devset MRs that validation holds out from it, and on nothing else."""
    (tmp_path / "trainset.csv").write_text("mr,ref\n" + "".join(f'"name[T{i}]",T{i} is here.\n' for i in range(30)))
    (tmp_path / "devset.csv").write_text("mr,ref\n" + "".join(f'"name[D{i}]",D{i} is there.\n' for i in range(40)))
    train, dev = data.training_split(tmp_path)
    assert [i.mr for i in train] == [f"name[T{i}]" for i in range(30)]
    assert [i.mr for i in data.eval_items(tmp_path, "dev")] == [f"name[D{i}]" for i in range(40)]
    assert dev == data.eval_items(tmp_path, "dev") == data.training_split(tmp_path / "trainset.csv")[1]
    devset_era, held_out = data.training_split(tmp_path, "dev")
    assert held_out == data.eval_items(tmp_path, "validation")
    assert len(devset_era) == 38 and not set(devset_era) & set(held_out)
    with pytest.raises(ValueError, match="training split must be train or dev"):
        data.training_split(tmp_path, "test")


def test_the_whole_devset_scores_only_adapters_that_never_trained_on_it(tmp_path):
    """A devset-era adapter (no split recorded) trained on 95% of the devset: --split dev refuses it and names
    the way out; an adapter of the training split passes, unless it started from a devset-era one."""
    devset_era = fake_adapter(tmp_path, "old", [1], config={"seed": 0, "validation_share": 0.05})
    trained = fake_adapter(tmp_path, "new", [3], config={"split": "train", "seed": 9})
    child = fake_adapter(tmp_path, "child", [3], config={"split": "train", "init": str(devset_era.path)})
    check_held_out([("SkipDecode", trained, 3.0), ("untrained", None, 1.0)], "dev")
    check_held_out([("SkipDecode", trained, 3.0)], "validation")  # its seed is no matter: no devset MR seen
    for adapter in (devset_era, child):
        with pytest.raises(ValueError, match="adapter old was trained on devset MRs .* use --split validation"):
            check_held_out([("SkipDecode", adapter, 3.0)], "dev")


def test_validation_refuses_an_adapter_that_held_out_other_mrs(tmp_path):
    usual = fake_adapter(tmp_path, "usual", [3], config={"seed": 0, "validation_share": 0.05})
    other = fake_adapter(tmp_path, "other", [3], config={"seed": 7, "validation_share": 0.05})
    check_held_out([("SkipDecode", usual, 3.0), ("untrained", None, 1.0)], "validation")
    check_held_out([("SkipDecode", other, 3.0)], "test")  # the test set is held out from every adapter
    with pytest.raises(ValueError, match="adapter other held out other devset MRs"):
        check_held_out([("SkipDecode", other, 3.0)], "validation")


def test_a_larger_validation_share_holds_out_a_superset():
    items = [Item(f"name[R{i}]", ("x",)) for i in range(200)]
    small, large = (set(split_items(items, share, 0)[1]) for share in (0.05, 0.2))
    assert len(small) == 10 and len(large) == 40 and small < large
    with pytest.raises(ValueError, match="between 0 and 1; got 0"):  # train and eval split the same way
        split_items(items, 0, 0)


def test_validation_checks_the_adapters_an_adapter_was_trained_from(tmp_path):
    wide = {"seed": 0, "validation_share": 0.2}
    base = fake_adapter(tmp_path, "base", [1], config={"seed": 0, "validation_share": 0.05})
    teacher = fake_adapter(tmp_path, "teacher", [1], config=wide)
    child = fake_adapter(tmp_path, "child", [3], config={**wide, "init": str(teacher.path), "teacher": str(teacher.path)})
    mixed = fake_adapter(tmp_path, "mixed", [3], config={**wide, "init": str(teacher.path), "teacher": str(base.path)})
    orphan = fake_adapter(tmp_path, "orphan", [3], config={**wide, "init": "/gone/run"})
    check_held_out([("SkipDecode", child, 3.0), ("SkipDecode", orphan, 3.0)], "validation", 0.2)
    check_held_out([("SkipDecode", mixed, 3.0)], "validation", 0.05)  # 0.2 and 0.05 both hold out the 0.05 MRs
    with pytest.raises(ValueError, match="adapter base held out other devset MRs"):
        check_held_out([("SkipDecode", mixed, 3.0)], "validation", 0.2)  # its teacher trained on 0.2's MRs
    with pytest.raises(ValueError, match="adapter base held out"):
        check_held_out([("SkipDecode", base, 1.0)], "validation", 0.2)


def test_human_ceiling_scores_the_first_reference_against_the_others():
    twice = Item(MILL.mr, MILL.refs * 2)
    assert human_scores([MILL]) == {}  # one reference: nothing to score it against
    assert human_scores([twice, MILL]) == {**score([MILL], [MILL.refs[0]]), "mrs": 1}
    assert human_scores([twice])["bleu"] == pytest.approx(100.0)
    assert human_scores([EAGLE])["bleu"] < 50 and human_scores([EAGLE])["ser"] == 0.0


def test_unrelated_outputs_score_low():
    result = score([EAGLE, MILL], ["Hello there.", "Nothing to see."])
    assert result["bleu"] < 5 and result["rouge_l"] < 20 and result["ser"] == 100.0


def test_slot_error_rate_counts_missing_values():
    # 5 + 4 slots; the first output misses food and area, the second misses the rating
    outputs = ["The Eagle is a coffee shop for the whole family.",
               "The Mill is inexpensive and not suitable for kids."]
    assert slot_error_rate([EAGLE, MILL], outputs) == pytest.approx(3 / 9)
    assert slot_realized("familyFriendly", "no", "It is not kid friendly.")
    assert not slot_realized("familyFriendly", "no", "It is kid friendly.")
    assert slot_realized("customer rating", "3 out of 5", "a 3 star rating")


def test_reader_groups_references_and_splits_by_mr(tmp_path):
    csv = tmp_path / "mini.csv"
    csv.write_text('mr,ref\n"name[A], food[Thai]",A serves Thai.\n"name[A], food[Thai]",Thai at A.\n'
                   '"name[B], area[riverside]",B is by the river.\n')
    items = read_items(csv)
    assert [len(i.refs) for i in items] == [2, 1]
    assert parse_mr(items[0].mr) == {"name": "A", "food": "Thai"}
    train, val = split_items(items, 0.5, seed=0)
    assert len(train) == 1 and len(val) == 1 and {train[0].mr, val[0].mr} == {items[0].mr, items[1].mr}
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="columns mr and ref"):
        read_items(tmp_path / "bad.csv")


def fake_adapter(folder, name, speedups, base="SmolLM2-135M-Instruct", config=None):
    path = folder / name
    path.mkdir(parents=True)
    (path / "adapter_config.json").write_text("{}")
    meta = {"speedups": speedups, "base_model": base, **({"config": config} if config else {})}
    (path / "skipdecode.json").write_text(json.dumps(meta))
    return adapters.read_adapter(path)


def test_an_adapter_decodes_on_the_schedule_it_was_trained_with(tmp_path):
    flat = fake_adapter(tmp_path, "flat", [3], config={"horizon": 20, "warmup_layers": 1, "decay": "power",
                                                       "mode": "skip", "spread": 1.0})
    schedule = adapters.trained_schedule(flat, 3.0, 30)
    assert (schedule.horizon, schedule.warmup, schedule.decay) == (20, 1, "power")
    assert schedule.max_budget == schedule.min_budget == 10  # spread 1: a constant budget
    assert adapters.trained_schedule(flat, 3.0, 30, horizon=8, warmup=2).horizon == 8  # overrides win
    old = fake_adapter(tmp_path, "old", [3])  # trained before spread was recorded: the default shape
    assert adapters.trained_schedule(old, 3.0, 30).max_budget == 15
    assert adapters.trained_schedule(None, 3.0, 30).horizon == 32
    assert adapters.trained_schedule(flat, 1.0, 30).min_budget == 30


def test_adapter_for_prefers_exact_then_one_for_all_then_nearest(tmp_path, monkeypatch):
    monkeypatch.setenv(adapters.ADAPTERS_ENV, str(tmp_path))
    assert adapters.adapter_for(3) is None
    fake_adapter(tmp_path, "all", [1, 2, 3, 4, 5])
    fake_adapter(tmp_path, "three", [3])
    fake_adapter(tmp_path, "six", [6])
    fake_adapter(tmp_path, "other-model", [2], base="gpt2")
    assert adapters.adapter_for(3).name == "three"
    assert adapters.adapter_for(2).name == "all"
    assert adapters.adapter_for(7).name == "six"
    assert adapters.adapter_for(2, base_model="gpt2").name == "other-model"
    assert adapters.adapter_for(3, base_model="HuggingFaceTB/SmolLM2-135M-Instruct").name == "three"  # Hub copy
    with pytest.raises(ValueError, match="unknown adapter 'nope'; available: all, other-model, six, three"):
        adapters.find_adapter("nope")


def test_training_records_name_an_adapter_so_the_lineage_check_can_find_it(tmp_path, monkeypatch):
    """By name inside the adapters folder, by absolute path outside it (a run in a scratch folder)."""
    shipped, scratch = tmp_path / "adapters", tmp_path / "runs"
    monkeypatch.setenv(adapters.ADAPTERS_ENV, str(shipped))
    inside = fake_adapter(shipped, "e2e-1x", [1])
    outside = fake_adapter(scratch, "e2e-1x", [1])  # the same name, another adapter
    assert adapters.adapter_ref(inside) == "e2e-1x"
    assert adapters.adapter_ref(outside) == str((scratch / "e2e-1x").resolve())
    assert adapters.find_adapter(adapters.adapter_ref(outside)).path.resolve() == outside.path.resolve()


def test_merge_adapter_changes_weights_and_refuses_another_model(tmp_path):
    from peft import LoraConfig, get_peft_model

    peft_model = get_peft_model(tiny_model("llama"), LoraConfig(r=4, target_modules=["q_proj", "up_proj"]))
    for name, p in peft_model.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.1)
    peft_model.save_pretrained(tmp_path / "tiny")
    (tmp_path / "tiny" / "skipdecode.json").write_text(json.dumps({"speedups": [2], "base_model": "tiny"}))
    info = adapters.read_adapter(tmp_path / "tiny")
    base = tiny_model("llama")
    before = base.model.layers[0].self_attn.q_proj.weight.clone()
    merged = adapters.merge_adapter(base, info, "tiny")
    assert not torch.equal(merged.model.layers[0].self_attn.q_proj.weight, before)
    with pytest.raises(ValueError, match="was made for tiny, not gpt2"):
        adapters.merge_adapter(tiny_model("llama"), info, "gpt2")
    with pytest.raises(ValueError, match="does not fit"):
        adapters.merge_adapter(tiny_model("gpt2"), info, "tiny")


def test_eval_command_json_rows(tmp_path, capsys):
    from skipdecode.cli import main

    code = main(["eval", "--limit", "3", "--speedups", "1,3", "--max-new-tokens", "12", "--out",
                 str(tmp_path / "new" / "e2e"), "--json"])  # in-process: the command's code, no interpreter start
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    rows = json.loads(out)
    assert rows[0]["row"] == "untrained 1x" and rows[-1]["speedup"] == 3.0
    for row in rows:
        assert {"bleu", "rouge_l", "chrf", "ser", "avg_layers", "decode_speedup", "adapter"} <= set(row)
        assert 0 <= row["bleu"] <= 100 and row["mrs"] == 3
    assert rows[-1]["avg_layers"] < rows[0]["avg_layers"] == 30.0
    folder = tmp_path / "new"  # made by the command, as assets/results is on a fresh clone
    assert all((folder / name).exists() for name in ("e2e.csv", "e2e.json", "e2e-outputs.jsonl", "e2e-human.json"))


def test_no_untrained_leaves_out_only_the_untrained_row():
    from skipdecode.evaluation.evaluate import plan_rows

    whole = plan_rows([1, 3], None, compare_adapters=False, untrained_skip=False)
    assert whole[0] == ("untrained", None, 1.0)
    assert plan_rows([1, 3], None, False, False, untrained=False) == whole[1:]


def test_baseline_names_the_full_depth_rows_adapter():
    from skipdecode.adapters.lora import find_adapter
    from skipdecode.evaluation.evaluate import plan_rows

    one, five = find_adapter("e2e-1x"), find_adapter("e2e-5x")
    assert plan_rows([5], "e2e-5x", False, False, untrained=False) == [("fine-tuned", five, 1.0),
                                                                      ("SkipDecode", five, 5.0)]
    assert plan_rows([5], "e2e-5x", False, False, untrained=False, baseline="e2e-1x") == [
        ("fine-tuned", one, 1.0), ("SkipDecode", five, 5.0)]
    assert plan_rows([2, 5], None, False, False, untrained=False, baseline="e2e-5x")[0] == ("fine-tuned", five, 1.0)


def test_only_the_projects_own_full_runs_write_to_assets_results():
    from skipdecode.evaluation.evaluate import RESULTS_DIR, VALIDATION_DIR, default_prefix

    assert default_prefix() == RESULTS_DIR / "e2e"  # the official test split, every MR
    assert default_prefix(made_up_names=True) == RESULTS_DIR / "e2e-made-up-names"
    assert default_prefix(validation_share=0.2) == RESULTS_DIR / "e2e"  # the share is a devset matter
    assert default_prefix("validation") == VALIDATION_DIR / "e2e-validation"  # the research log's rounds
    assert default_prefix("validation", made_up_names=True) == VALIDATION_DIR / "e2e-validation-made-up-names"
    assert default_prefix(data="other.csv") is None  # another file: never over the shipped e2e.csv
    assert default_prefix(limit=3) is None and default_prefix("validation", limit=3) is None
    assert default_prefix("validation", validation_share=0.2) is None  # other MRs than e2e-validation's
    assert default_prefix(beams=4) == RESULTS_DIR / "e2e-beams4"  # a beam-search table beside the greedy one
    assert default_prefix("dev", made_up_names=True, beams=4) == VALIDATION_DIR / "e2e-dev-made-up-names-beams4"
    assert default_prefix("dev", made_up_names="syllables") == VALIDATION_DIR / "e2e-dev-made-up-names"
    assert default_prefix("dev", made_up_names="words") == VALIDATION_DIR / "e2e-dev-word-names"


def _eval_args(*argv):
    import argparse

    from skipdecode.evaluation import evaluate

    parser = argparse.ArgumentParser()
    evaluate.register(parser.add_subparsers())
    return parser.parse_args(["eval", *argv])


@pytest.fixture
def fake_eval(tmp_path, monkeypatch):
    """`skipdecode eval` with a stand-in for the model run (one row), an empty assets/results and the
    temporary folders made under tmp_path/tmp; the data is a two-MR CSV."""
    from skipdecode.evaluation import evaluate

    def rows(data, speedups, **options):
        items = evaluate.load_items(data, options["split"], options["made_up_names"], options["limit"])
        options["outputs_path"].parent.mkdir(parents=True, exist_ok=True)
        options["outputs_path"].write_text("")
        return [evaluate.Row("fine-tuned 1x", "m", "e2e-1x", 1.0, **evaluate.score(items, [i.refs[0] for i in items]),
                             avg_layers=30.0, ms_per_token=5.0, decode_speedup=1.0, mrs=len(items), tokens=9)]

    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(evaluate, "evaluate", rows)
    monkeypatch.setattr(evaluate, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr(evaluate.tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "other.csv").write_text("mr,ref\n" + "".join(f'"{item.mr}","{ref}"\n' for item in (EAGLE, MILL)
                                                              for ref in item.refs))
    return tmp_path


def test_an_eval_on_other_data_writes_to_a_fresh_temporary_folder_and_says_where(fake_eval, capsys):
    from skipdecode.evaluation.evaluate import _cmd_eval

    assert _cmd_eval(_eval_args("--data", str(fake_eval / "other.csv"), "--speedups", "1")) == 0
    (folder,) = (fake_eval / "tmp").iterdir()
    assert folder.name.startswith("skipdecode-eval-e2e-other-")
    assert f"results written to {folder / 'e2e-other'}.csv" in capsys.readouterr().out
    assert {p.name for p in folder.iterdir()} == {"e2e-other.csv", "e2e-other.json", "e2e-other-outputs.jsonl",
                                                  "e2e-other-human.json"}
    assert not (fake_eval / "results").exists()  # the shipped results are untouched
    # --limit: a temporary folder too, named on stderr when stdout is the JSON rows
    assert _cmd_eval(_eval_args("--data", str(fake_eval / "other.csv"), "--limit", "1", "--json")) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)[0]["mrs"] == 1 and "results written to " in err and "-limit1.csv" in err
    assert len(list((fake_eval / "tmp").iterdir())) == 2 and not (fake_eval / "results").exists()
    # --out: exactly there
    assert _cmd_eval(_eval_args("--data", str(fake_eval / "other.csv"), "--out", str(fake_eval / "mine" / "run"))) == 0
    assert (fake_eval / "mine" / "run.csv").exists() and f"results written to {fake_eval / 'mine' / 'run'}.csv" \
        in capsys.readouterr().out
    assert len(list((fake_eval / "tmp").iterdir())) == 2 and not (fake_eval / "results").exists()
    with pytest.raises(FileNotFoundError):  # a run that fails leaves no empty folder behind
        _cmd_eval(_eval_args("--data", str(fake_eval / "missing.csv")))
    assert len(list((fake_eval / "tmp").iterdir())) == 2


def test_eval_on_held_out_mrs_with_made_up_names(tmp_path, cli):
    done = cli("eval", "--split", "validation", "--made-up-names", "--limit", "2", "--speedups", "1",
               "--max-new-tokens", "12", "--out", tmp_path / "val", "--json")  # in-process, as cli's docstring says
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    assert [r["row"] for r in rows] == ["untrained 1x", "fine-tuned 1x"] and all(r["mrs"] == 2 for r in rows)
    assert all(0 <= r["names"] <= 100 for r in rows)
    devset_names = {i.slots["name"] for i in read_items(data.resolve(None, "devset.csv"))}
    decoded = [json.loads(line) for line in (tmp_path / "val-outputs.jsonl").read_text().splitlines()]
    assert len(decoded) == 2 and all(parse_mr(d["mr"])["name"] not in devset_names for d in decoded)


def test_eval_refuses_a_validation_share_the_adapters_trained_on(tmp_path, cli, monkeypatch):
    """In-process (`cli`): a refusal is a return code and a message; any other exception fails the test."""
    fake_adapter(tmp_path, "devset-1x", [1])  # devset-era (no split recorded), 5% of the devset held out
    with monkeypatch.context() as patch:
        patch.setenv(adapters.ADAPTERS_ENV, str(tmp_path))
        done = cli("eval", "--split", "validation", "--validation-share", "0.2", "--speedups", "1", "--limit", "1")
    assert done.returncode != 0 and "adapter devset-1x held out other devset MRs" in done.stderr
    assert "Traceback" not in done.stderr
    done = cli("eval", "--split", "validation", "--validation-share", "1.5")
    assert done.returncode != 0 and "--validation-share must be between 0 and 1; got 1.5" in done.stderr


def test_slot_misses_count_each_value_a_row_leaves_out():
    """experiments/slot_misses.py: per row, which attributes' values the outputs miss, by eval's matcher."""
    spec = importlib.util.spec_from_file_location("slot_misses", ROOT / "experiments" / "slot_misses.py")
    slot_misses = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(slot_misses)
    lines = [{"mr": "name[Aromi], eatType[pub], customer rating[low]", "full": "Aromi is a pub with a low rating.",
              "skip": "Aromi is a pub."},
             {"mr": "name[Strada], area[riverside]", "full": "Strada is by the riverside.", "skip": "Strada is nice."}]
    counts = slot_misses.misses(lines)
    assert counts["full"]["(slots)"] == 5 and sum(counts["full"].values()) == 5  # nothing missed
    assert counts["skip"] == {"(slots)": 5, "customer rating": 1, "area": 1, "name": 0, "eatType": 0}


def test_paired_bootstrap_tells_a_real_gain_from_a_tie(tmp_path):
    spec = importlib.util.spec_from_file_location("significance", ROOT / "experiments" / "significance.py")
    significance = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(significance)
    paired_bootstrap = significance.paired_bootstrap
    foods = ["Thai", "Indian", "French", "Italian", "Chinese", "English", "Japanese", "fast food"]
    mrs = [f"name[R{i}], food[{f}], area[riverside]" for i in range(5) for f in foods]
    ref = "R{i} serves {f} food by the river and is worth a visit for dinner."
    rows = [(mr, ref.format(i=mr[6:mr.index("]")], f=mr.split("food[")[1].split("]")[0])) for mr in mrs]
    (tmp_path / "refs.csv").write_text("mr,ref\n" + "".join(f'"{mr}",{r}\n' for mr, r in rows))
    out = tmp_path / "outputs.jsonl"
    cut = [r.split(" by ")[0] + "." for _, r in rows]
    out.write_text("".join(json.dumps({"mr": mr, "copy": r, "short": s, "half": (r, s)[k % 2], "other half": (s, r)[k % 2]})
                           + "\n" for k, ((mr, r), s) in enumerate(zip(rows, cut))))
    n, ((_, copy), (_, short)) = paired_bootstrap(out, "copy", "short", data=tmp_path / "refs.csv")
    assert n == 40 and copy.score == pytest.approx(100) and short.score < 30 and short.p_value < 0.01
    _, ((_, half), (_, other)) = paired_bootstrap(out, "half", "other half", data=tmp_path / "refs.csv")
    assert short.score < half.score < 100 and abs(half.score - other.score) < 1 and other.p_value > 0.2
    with pytest.raises(SystemExit, match="no row 'nope'"):
        paired_bootstrap(out, "copy", "nope", data=tmp_path / "refs.csv")


def test_rescore_adds_the_new_metrics_and_keeps_what_decoding_measured(tmp_path):
    """scripts/rescore_e2e.py: the metrics again from the saved outputs, the decoding's own columns kept."""
    spec = importlib.util.spec_from_file_location("rescore_e2e", ROOT / "scripts" / "rescore_e2e.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rescore = module.rescore

    from skipdecode.evaluation.evaluate import load_items

    items = load_items(None, "test", limit=3)
    outputs = [item.refs[0].upper() for item in items]
    prefix = tmp_path / "e2e"
    (tmp_path / "e2e-outputs.jsonl").write_text(
        "".join(json.dumps({"mr": item.mr, "fine-tuned 1x e2e-1x": out}) + "\n" for item, out in zip(items, outputs)))
    (tmp_path / "e2e.csv").write_text("row,adapter,bleu,ser,ms_per_token\nfine-tuned 1x,e2e-1x,1.0,99.0,3.5\n")
    frame = rescore(prefix)
    expected = score(items, outputs)
    assert frame.loc[0, "bleu_e2e"] == pytest.approx(expected["bleu_e2e"], abs=1e-3)
    assert frame.loc[0, "bleu"] == pytest.approx(expected["bleu"], abs=1e-3) and frame.loc[0, "ms_per_token"] == 3.5
    assert json.loads((tmp_path / "e2e.json").read_text())[0]["bleu_e2e"] == frame.loc[0, "bleu_e2e"]


def test_eval_parses_the_kind_of_made_up_names():
    from skipdecode.cli import build_parser

    parse = build_parser().parse_args
    assert parse(["eval"]).made_up_names is False
    assert parse(["eval", "--made-up-names"]).made_up_names == "syllables"
    assert parse(["eval", "--made-up-names", "words"]).made_up_names == "words"
    with pytest.raises(SystemExit):
        parse(["eval", "--made-up-names", "emoji"])


def test_name_shapes_split_names_copied_by_the_shape_of_the_name():
    """experiments/name_shapes.py: the share of names copied, per row and per shape of name."""
    spec = importlib.util.spec_from_file_location("name_shapes", ROOT / "experiments" / "name_shapes.py")
    name_shapes = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(name_shapes)
    assert [name_shapes.shape(n) for n in ("The Pebble", "Sleepy Walnut", "The Crooked Willow",
                                           "Walnut and Bramble", "Zanbel")] == ["The N", "A N", "The A N",
                                                                                "N and N", "other"]
    lines = [{"mr": "name[Walnut and Bramble], food[Thai]", "3x": "Walnut is Thai.", "1x": "Walnut and Bramble."},
             {"mr": "name[Oak and Ivy], food[Thai]", "3x": "Oak and Ivy is Thai.", "1x": "Oak and Ivy."},
             {"mr": "name[The Pebble], food[Thai]", "3x": "The Pebble is Thai.", "1x": "the pebble."}]
    assert name_shapes.by_shape(lines) == {"3x": {"The N": (1, 100.0), "N and N": (2, 50.0)},
                                           "1x": {"The N": (1, 100.0), "N and N": (2, 100.0)}}


def test_out_names_a_prefix_with_or_without_an_extension():
    """`--out x/e2e.csv` writes x/e2e.csv, .json, -outputs.jsonl and -human.json, not x/e2e.csv-human.json."""
    from argparse import Namespace

    from skipdecode.evaluation.evaluate import output_prefix

    for out in ("runs/e2e-int4", "runs/e2e-int4.csv", "runs/e2e-int4.json"):
        assert output_prefix(Namespace(out=out)) == Path("runs/e2e-int4")
