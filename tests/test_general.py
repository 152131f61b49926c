"""General chat prompts: reading them, the held-out validation slice, the scores of `eval --prompts` on
hand-made cases and a tiny model, the command itself, and `train --task general` on a tiny model."""

import json
from pathlib import Path

import pytest
import torch

from conftest import IdTokenizer, tiny_checkpoint, tiny_model
from skipdecode.adapters import lora as adapters
from skipdecode.evaluation import evaluate, general, runs
from skipdecode.engine import Engine
from skipdecode.evaluation.general import Answers, Plan
from skipdecode.training import targets

POOL = general.prompts_dir() / general.POOL_FILE
TOPICS = ["tides", "rainbows", "volcanoes", "bread", "bees", "glaciers", "comets", "tea", "maps", "bridges",
          "owls", "salt", "clocks", "sails", "moss", "kites", "ink", "wool", "caves", "fog"]


class WordTokenizer:
    """Enough of a tokenizer to count a prompt's words as its tokens (no chat template)."""

    chat_template = None

    def __call__(self, text, **_):
        return {"input_ids": list(range(len(text.split())))}


def test_prompt_files_are_json_lines_or_plain_text(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"prompt": " Who is Scottie Pippen? ", "source": "x"}\n\n'
                                      '{"prompt": "Hi there"}\n')
    (tmp_path / "b.txt").write_text("First prompt\n\n  Second prompt  \n")
    (tmp_path / "seed.jsonl").write_text(json.dumps({"instruction": "Sort these.", "instances": [{"input": "3, 1"}]})
                                         + "\n" + json.dumps({"instruction": "Say hi.", "instances": [{"input": ""}]}))
    assert general.read_prompts(tmp_path / "a.jsonl") == ["Who is Scottie Pippen?", "Hi there"]
    assert general.read_prompts(tmp_path / "b.txt") == ["First prompt", "Second prompt"]
    assert general.read_prompts(tmp_path / "seed.jsonl") == ["Sort these.\n\n3, 1", "Say hi."]
    (tmp_path / "bad.jsonl").write_text('{"prompt": "ok"}\n{"text": "no prompt field"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2: a JSON line needs a non-empty `prompt` field"):
        general.read_prompts(tmp_path / "bad.jsonl")
    (tmp_path / "empty.txt").write_text("\n \n")
    with pytest.raises(ValueError, match="no prompts"):
        general.read_prompts(tmp_path / "empty.txt")


def test_the_hash_is_the_pools_own():
    assert general.prompt_hash("Who is Scottie Pippen?") == "b05ea0a33cfb"  # the pool's `hash` of that line
    assert general.prompt_hash("WHO IS SCOTTIE PIPPEN?") == "b05ea0a33cfb"  # lower-cased first


@pytest.fixture
def pool(tmp_path, monkeypatch):
    """A prompt pool of 400 prompts, a few of them long, one an E2E meaning representation."""
    prompts = [f"Tell me one fact about {t} number {i}." for i in range(20) for t in TOPICS]
    prompts[7] = "Please tell me, at great length and in much detail, " + "about the sea " * 60
    prompts[8] = "name[The Eagle], eatType[pub], area[riverside]"
    (tmp_path / "prompts").mkdir()
    (tmp_path / "prompts" / general.POOL_FILE).write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    monkeypatch.setenv(general.PROMPTS_ENV, str(tmp_path / "prompts"))
    return prompts


def test_validation_is_a_fixed_held_out_slice_that_training_never_sees(pool):
    tokenizer = WordTokenizer()
    held = [p for p in pool if general.held_out(p)]
    assert 0.02 < len(held) / len(pool) < 0.09  # 5% by hash
    validation = general.validation_prompts(tokenizer, count=None)
    assert set(validation) <= set(held) and validation == sorted(validation, key=general.prompt_hash)
    assert all(len(p.split()) <= general.MAX_PROMPT_TOKENS for p in validation)
    assert general.validation_prompts(tokenizer, count=5) == validation[:5]
    train = targets.training_prompts(tokenizer)
    assert not set(train) & set(held) and len(train) == len(pool) - len(held) - 2  # no long prompt, no MR
    assert pool[7] not in train and pool[8] not in train
    assert targets.training_prompts(tokenizer, limit=10) == train[:10]  # a larger --limit extends a smaller one
    assert targets.training_prompts(tokenizer, max_prompt_tokens=8) == [p for p in train if len(p.split()) <= 8]
    shuffled = pool[::-1] + pool[:5]  # another file's order, with repeats: the same prompts
    other = Path(general.prompts_dir()) / "other.txt"
    other.write_text("\n".join(p.replace("\n", " ") for p in shuffled))
    assert targets.training_prompts(tokenizer, other) == train


@pytest.mark.slow
@pytest.mark.skipif(not POOL.exists(), reason="the shared prompt pool is not on this machine")
def test_the_real_validation_set(engine):
    validation = general.validation_prompts(engine.tokenizer)
    assert len(validation) == general.VALIDATION_COUNT and all(map(general.held_out, validation))
    assert all(len(engine.encode(p)) <= general.MAX_PROMPT_TOKENS for p in validation)
    assert not set(targets.training_prompts(engine.tokenizer)) & set(validation)


# ---- scores -----------------------------------------------------------------------------------
def test_repetition_counts_word_trigrams_seen_before():
    assert general.repetition("happy to be happy to be happy to be") == pytest.approx(4 / 7)
    assert general.repetition("The sky is blue because air scatters blue light most.") == 0.0
    assert general.repetition("Too short") == 0.0 and general.repetition("") == 0.0
    assert general.repetition("Yes, yes, yes! YES yes.") == pytest.approx(2 / 3)  # words, any case


def test_agreement_is_the_share_of_the_full_answer_at_the_same_position():
    assert general.agreement([5, 6, 7, 8], [5, 6, 7, 8]) == 1.0
    assert general.agreement([5, 6, 9, 8, 10], [5, 6, 7, 8]) == 0.75
    assert general.agreement([5], [5, 6, 7, 8]) == 0.25  # stopping early loses the rest
    assert general.agreement([6, 7, 8], [5, 6, 7, 8]) == 0.0  # one token late is nothing in place


@pytest.fixture(scope="module")
def tiny():
    return Engine(tiny_model("llama", layers=8), IdTokenizer())


PROMPT_IDS = [[1, 10, 20, 30], [1, 11, 21], [1, 12, 22, 32, 42]]


def test_an_answer_equal_to_the_full_one_scores_100_and_a_ratio_of_1(tiny):
    full = general.answer(tiny, PROMPT_IDS, max_new_tokens=10, batch_size=2)
    assert full.texts == [" ".join(map(str, ids)).strip() for ids in full.token_ids]
    copy = Answers(list(full.texts), [list(ids) for ids in full.token_ids])
    loop = Answers(["7 8 9 7 8 9 7 8 9"] * 3, [[7, 8, 9] * 3] * 3)
    same, looping = general.score(tiny.model, PROMPT_IDS, full, [copy, loop])
    assert same == {"rouge_l_vs_full": pytest.approx(100.0), "bleu_vs_full": pytest.approx(100.0),
                    "ppl_ratio": pytest.approx(1.0), "agreement": 100.0, "repetition": pytest.approx(
                        100 * sum(map(general.repetition, full.texts)) / 3)}
    assert looping["repetition"] == pytest.approx(100 * 4 / 7)
    assert looping["ppl_ratio"] > 1.5  # the greedy answer is the full model's likeliest; a made-up one is not
    assert looping["rouge_l_vs_full"] < 50 and looping["agreement"] < 50


def test_rows_of_a_tiny_model_against_its_full_depth_answers(tiny):
    rows, outputs = general.evaluate_prompts(tiny, PROMPT_IDS, [Plan(1.0), Plan(2.0)], max_new_tokens=12,
                                             batch_size=2)
    full, skip = rows
    assert (full.speedup, full.adapter, full.rouge_l_vs_full, full.agreement) == (1.0, "none", 100.0, 100.0)
    assert full.ppl_ratio == pytest.approx(1.0) and full.avg_layers == 8 and full.decode_speedup == 1.0
    assert skip.avg_layers < 8 and skip.prompts == 3 and skip.tokens > 0 and 0 <= skip.agreement <= 100
    # same prefix, full depth: the full answers agree with themselves (float near ties aside); the skipped
    # ones keep credit after their first different token, which `agreement` does not give
    assert full.agreement_tf >= 95 and skip.agreement_tf < full.agreement_tf
    ids = [[int(t) for t in o["2x none"].split()] for o in outputs]  # IdTokenizer's text: the ids themselves
    assert skip.agreement_tf == pytest.approx(general.agreement_tf(tiny.decoder, PROMPT_IDS, ids))
    assert [set(o) for o in outputs] == [{"prompt", "full", "1x none", "2x none"}] * 3
    assert all(o["1x none"] == o["full"] for o in outputs)


# ---- the command ------------------------------------------------------------------------------
def test_rows_pick_the_general_adapters_or_the_base_model(tmp_path, monkeypatch):
    monkeypatch.setenv(adapters.ADAPTERS_ENV, str(tmp_path))

    def fake(name, speedups, **meta):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text("{}")
        (tmp_path / name / "skipdecode.json").write_text(json.dumps(
            {"speedups": speedups, "base_model": "SmolLM2-135M-Instruct", **meta}))

    fake("e2e-3x", [3])
    names = lambda plan: [(row.speedup, row.name) for row in plan]  # noqa: E731
    assert names(general.plan_rows([3, 2])) == [(1.0, "none"), (2.0, "none"), (3.0, "none")]  # never E2E
    fake("general-3x", [3], task="general", held_out=general.HELD_OUT_RULE)
    fake("general-old", [2], task="general")
    plan = general.plan_rows([1, 2, 3])
    assert names(plan) == [(1.0, "none"), (2.0, "general-old"), (3.0, "general-3x")]
    assert names(general.plan_rows([3], adapter="none")) == [(1.0, "none"), (3.0, "none")]
    assert names(general.plan_rows([3], adapter="e2e-3x")) == [(1.0, "e2e-3x"), (3.0, "e2e-3x")]
    general.check_held_out(general.plan_rows([3]) + general.plan_rows([3], adapter="e2e-3x"))
    with pytest.raises(ValueError, match="adapter general-old does not record holding out the validation prompts"):
        general.check_held_out(plan)


def test_only_the_projects_validation_set_writes_to_assets_results(tmp_path, monkeypatch):
    monkeypatch.setattr(runs, "RESULTS_DIR", tmp_path / "results")
    monkeypatch.setattr(general.tempfile, "tempdir", str(tmp_path))
    results = tmp_path / "results"
    assert general.results_place("validation") == (results / "general", results / "general-outputs.jsonl")
    by_adapter = general.results_place("validation", adapter="assets/adapters/general-3x")[0]
    assert by_adapter == results / "general-general-3x"
    assert general.results_place("validation", max_new_tokens=64)[0] == results / "general-64tokens"
    assert general.results_place("validation", out=tmp_path / "mine") == (tmp_path / "mine" / "general",
                                                                          tmp_path / "mine" / "outputs.jsonl")
    for other in (general.results_place("mine.jsonl"), general.results_place("validation", limit=3)):
        assert other[0].parent.parent == tmp_path and other[0].parent.name.startswith("skipdecode-eval-general-")
        assert other[1] == other[0].parent / "outputs.jsonl"
    assert not results.exists()


def test_e2e_options_are_refused_with_prompts():
    parser = __import__("argparse").ArgumentParser()
    evaluate.register(parser.add_subparsers())
    args = parser.parse_args(["eval", "--prompts", "x.txt", "--made-up-names", "--split", "validation"])
    with pytest.raises(ValueError, match="--made-up-names, --split belong to the E2E evaluation"):
        general.cmd_eval(args)


def test_a_failed_prompts_eval_leaves_no_empty_temporary_folder(tmp_path, monkeypatch):
    """As the E2E eval does: a run that fails removes the temporary folder it made, and only that."""
    import tempfile

    from skipdecode import engine as engine_module

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(engine_module.Engine, "load", classmethod(lambda cls, *a, **k: object()))

    def broken(*args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(general, "evaluate_prompts", broken)
    (tmp_path / "keep").mkdir()
    prompts = tmp_path / "keep" / "one.txt"
    prompts.write_text("Write a haiku about the sea.\n")
    parser = __import__("argparse").ArgumentParser()
    evaluate.register(parser.add_subparsers())
    with pytest.raises(RuntimeError, match="out of memory"):
        general.cmd_eval(parser.parse_args(["eval", "--prompts", str(prompts), "--adapter", "none"]))
    assert [p.name for p in tmp_path.iterdir()] == ["keep"]


@pytest.mark.slow
def test_eval_prompts_command_smoke(tmp_path, cli):
    """The real command on three prompts, 8 new tokens, 1x and 3x: the 1x row is the base model at full
    depth (the reference itself), 3x what "auto" picks for a general prompt (general-3x where it ships)."""
    from skipdecode.adapters.lora import pick_adapter

    prompts = tmp_path / "three.txt"
    prompts.write_text("Explain in one paragraph why the sky is blue.\nList three tips for staying focused.\n"
                       "Write a haiku about the sea.\n")
    done = cli("eval", "--prompts", prompts, "--max-new-tokens", "8", "--speedups", "1,3", "--out", tmp_path / "run",
               "--json")  # in-process: the command's code without an interpreter's start
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    at_3x = getattr(pick_adapter(3.0, None, "Write a haiku about the sea.")[0], "name", "none")
    assert [(r["speedup"], r["adapter"]) for r in rows] == [(1.0, "none"), (3.0, at_3x)]
    fields = {"speedup", "adapter", "rouge_l_vs_full", "bleu_vs_full", "ppl_ratio", "agreement", "agreement_tf",
              "repetition",
              "avg_layers", "decode_speedup"}
    assert all(fields <= set(r) and r["prompts"] == 3 for r in rows)
    assert rows[0]["rouge_l_vs_full"] == 100 and rows[0]["ppl_ratio"] == 1 and rows[0]["avg_layers"] == 30
    # a constant 10 layers from the first token fed back; the first token comes from the 30-layer prefill
    assert 10 < rows[1]["avg_layers"] <= (30 + 7 * 10) / 8 and rows[1]["agreement"] < 100
    assert rows[0]["agreement_tf"] >= 95 and 0 <= rows[1]["agreement_tf"] <= 100
    assert f"results written to {tmp_path / 'run' / 'general'}.csv" in done.stderr
    outputs = [json.loads(line) for line in (tmp_path / "run" / "outputs.jsonl").read_text().splitlines()]
    assert [set(o) for o in outputs] == [{"prompt", "full", "1x none", f"3x {at_3x}"}] * 3
    assert (tmp_path / "run" / "general.csv").exists() and (tmp_path / "run" / "general.json").exists()


# ---- training ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_full_depth_answers_are_cached_and_not_generated_again(engine, tmp_path, monkeypatch):
    cache = targets.targets_file(tmp_path, engine, 6)
    assert cache.name == "targets-SmolLM2-135M-Instruct-float32-6tokens.jsonl"
    prompts = ["Name a colour.", "Say hello.", "Name a colour."]
    first = targets.reference_answers(engine, prompts, 6, batch_size=2, cache=cache)
    alone = engine.generate(["Say hello."], max_new_tokens=6).token_ids[0]
    assert first["Say hello."] == alone and len(cache.read_text().splitlines()) == 2  # each prompt once
    with open(cache, "a") as handle:
        handle.write('{"prompt": "cut sh')  # a run stopped mid-line
    monkeypatch.setattr(targets, "answer", lambda *a, **k: pytest.fail("generated again"))
    assert targets.reference_answers(engine, prompts[:2], 6, cache=cache) == {p: first[p] for p in prompts[:2]}


@pytest.mark.slow
def test_a_few_steps_on_general_prompts_lower_the_loss_and_resume_from_the_cache(pool, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from skipdecode.training import train as training

    model = str(tiny_checkpoint(tmp_path / "tiny"))

    def config(name, **kw):
        settings = dict(task="general", model=model, speedups=[2.0], limit=4, batch_size=4, steps=12, lr=2e-2,
                        rank=8, alpha=16, dropout=0.0, warmup_ratio=0.0, max_answer_tokens=10, validation_examples=4,
                        eval_every=100, checkpoint_dir=str(tmp_path / "checkpoints"), precision="fp32")
        return training.TrainConfig(out=str(tmp_path / name), **{**settings, **kw})

    summary = training.train(config("general-2x"))
    losses = [h["loss"] for h in summary["history"]]
    assert sum(losses[-3:]) < 0.8 * sum(losses[:3]), losses
    c = summary["config"]
    assert summary["task"] == "general" and summary["held_out"] == general.HELD_OUT_RULE
    assert (c["horizon"], c["spread"], c["teacher"]) == (10, 1.0, None)  # the general defaults
    info = adapters.read_adapter(tmp_path / "general-2x")
    assert info.task == "general" and "held out and never trained on" in (info.path / "README.md").read_text().lower()
    (cache,) = (tmp_path / "checkpoints").glob("targets-*-10tokens.jsonl")
    cached = [json.loads(line)["prompt"] for line in cache.read_text().splitlines()]
    assert len(cached) == 8 and sum(map(general.held_out, cached)) == 4  # 4 to train on, 4 to validate on

    # a KL run (teacher: the base model) stopped after its step-1 checkpoint resumes without new answers
    monkeypatch.setattr(targets, "answer", lambda *a, **k: pytest.fail("targets generated again"))
    kd = dict(steps=2, distill=0.5, checkpoint_every=1)
    with monkeypatch.context() as patch:
        patch.setattr(training.shutil, "rmtree", lambda *a, **k: None)
        training.train(config("stopped", **kd))
    resumed = training.train(config("stopped", resume=True, **kd))
    assert resumed["resumed_from"] == 1 and resumed["config"]["teacher"] == "none"
    training.train(config("whole", **kd))
    a, b = (load_file(tmp_path / n / "adapter_model.safetensors") for n in ("stopped", "whole"))
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="--renamed are E2E options"):
        training.train(config("bad", renamed=0.5))
    with pytest.raises(ValueError, match="--cut-loops N is a general-task option"):
        training.train(config("bad", task="e2e", cut_loops=8))

    # --cut-loops cuts the training targets (4 prompts), never the validation ones
    cut, real_cut = [], targets.cut_at_loop
    monkeypatch.setattr(targets, "cut_at_loop", lambda ids, n: cut.append(n) or real_cut(ids, n))
    training.train(config("cut", steps=1, cut_loops=2))
    assert cut == [2] * 4
    assert "cut before the first run of 2 tokens" in (tmp_path / "cut" / "README.md").read_text()


def test_a_target_is_cut_where_it_starts_to_loop():
    assert targets.cut_at_loop([1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3], 3) == [1, 2, 3, 4, 5]
    assert targets.cut_at_loop([7, 7, 7, 7], 2) == [7]  # overlapping runs count
    assert targets.cut_at_loop([1, 2, 3, 1, 2, 4], 3) == [1, 2, 3, 1, 2, 4]  # a shorter repeat is kept
    assert targets.cut_at_loop([1, 2], 8) == [1, 2]


@pytest.mark.slow
def test_sequence_unlikelihood_batches_are_the_students_greedy_answers_scored_on_their_repeats(pool, tmp_path,
                                                                                                 monkeypatch):
    """`--sequence-unlikelihood 0.5`: every other batch the student decodes the prompts greedily (the same
    answers its engine gives), and that step's loss is the unlikelihood of its repeats, with no teacher."""
    from skipdecode.training import own_answers
    from skipdecode.training import train as training

    model = str(tiny_checkpoint(tmp_path / "tiny"))
    drawn, sample = [], own_answers.StudentSampler.sample

    def spy(self, examples, schedule):
        out = sample(self, examples, schedule)
        drawn.append((out, self.engine.generate([p for p, _ in examples], schedule, 10).token_ids))
        return out

    monkeypatch.setattr(own_answers.StudentSampler, "sample", spy)
    kinds, forward = [], training.SkipLM.forward

    def watched(self, *args, repeats=False, **kwargs):
        kinds.append(repeats)
        return forward(self, *args, repeats=repeats, **kwargs)

    monkeypatch.setattr(training.SkipLM, "forward", watched)
    config = training.TrainConfig(out=str(tmp_path / "sul"), task="general", model=model, speedups=[2.0], limit=4,
                                  batch_size=4, steps=4, sequence_unlikelihood=0.5, rank=8, alpha=16,
                                  max_answer_tokens=10, validation_examples=4, eval_every=100,
                                  checkpoint_dir=str(tmp_path / "checkpoints"), precision="fp32")
    summary = training.train(config)
    assert [bool(h.get("sequence_unlikelihood")) for h in summary["history"]] == [False, True, False, True]
    assert summary["config"]["teacher"] is None and len(drawn) == 2
    assert kinds[:4] == [False, True, False, True]  # then the validation passes, on the targets
    for out, greedy in drawn:
        assert [ids for _, ids in out] == greedy
    assert "repeated 4-grams" in (tmp_path / "sul" / "README.md").read_text()
    with pytest.raises(ValueError, match="--sequence-unlikelihood is a share of the batches"):
        training.train(training.TrainConfig(out=str(tmp_path / "bad"), task="general", model=model,
                                            sequence_unlikelihood=1.5))
