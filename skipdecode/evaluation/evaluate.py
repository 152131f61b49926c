"""E2E evaluation: decode every distinct test MR and score it against all of its references.

Rows: the untrained model at 1x, the fine-tuned model at 1x (the fair baseline: the paper compares
against a model fine-tuned on the same data) and SkipDecode at each speedup. Metrics: BLEU and chrF
(sacrebleu), ROUGE-L (rouge-score, best reference), and the slot error rate, the share of MR values a
lenient lexical check cannot find in the output (the E2E challenge's own sanity measure).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from .data import NAME_STYLES, SPLIT_SEED, VALIDATION_SHARE, Item, eval_items, parse_mr, renamed_items
from .runs import RESULTS_DIR, TEMP_PREFIX, VALIDATION_DIR, decode, drop_empty_temp, write

METRICS = ("bleu", "rouge_l", "chrf", "ser", "names", "length")

# How a slot value may be realized in text, beyond the value itself (lower case).
REALIZATIONS = {
    ("area", "city centre"): ("city centre", "city center", "centre", "center", "downtown"),
    ("area", "riverside"): ("riverside", "river"),
    ("priceRange", "cheap"): ("cheap", "inexpensive", "affordable", "low price", "low-price", "low cost", "budget"),
    ("priceRange", "less than £20"): ("less than £20", "under £20", "less than 20", "less than twenty", "cheap",
                                      "inexpensive", "low price", "low-price", "low cost", "affordable"),
    ("priceRange", "moderate"): ("moderate", "mid", "average price", "reasonabl", "medium"),
    ("priceRange", "£20-25"): ("£20-25", "£20-£25", "20-25", "20 to 25", "moderate", "average price", "mid",
                               "medium", "reasonabl"),
    ("priceRange", "high"): ("high", "expensive", "pricey", "costly", "more than £30"),
    ("priceRange", "more than £30"): ("more than £30", "over £30", "above £30", "£30", "expensive", "high price",
                                      "high-price", "pricey", "costly"),
    ("customer rating", "low"): ("low", "poor", "bad", "1 out of 5", "one star", "1 star", "1-star"),
    ("customer rating", "average"): ("average", "3 out of 5", "three star", "3 star", "3-star", "moderate", "decent"),
    ("customer rating", "high"): ("high", "5 out of 5", "five star", "5 star", "5-star", "excellent", "great"),
    ("customer rating", "1 out of 5"): ("1 out of 5", "one out of five", "1 star", "one star", "1-star", "low", "poor",
                                        "bad"),
    ("customer rating", "3 out of 5"): ("3 out of 5", "three out of five", "3 star", "three star", "3-star",
                                        "average"),
    ("customer rating", "5 out of 5"): ("5 out of 5", "five out of five", "5 star", "five star", "5-star", "high",
                                        "excellent"),
    ("eatType", "coffee shop"): ("coffee shop", "coffee-shop", "café", "cafe"),
    ("food", "fast food"): ("fast food", "fast-food", "burger", "take-away", "takeaway"),
}
FAMILY = re.compile(r"famil|kid|child|adult")
NEGATION = re.compile(r"\bnot\b|\bno\b|n't|\bnon\b|\badults?\b|\bisn|\baren")


def slot_realized(key: str, value: str, text: str) -> bool:
    text, value = text.lower(), value.lower()
    if key == "familyFriendly":
        mentioned = FAMILY.search(text) is not None
        return mentioned and ((NEGATION.search(text) is None) == (value == "yes"))
    return any(form in text for form in REALIZATIONS.get((key, value), (value,)))


def slot_misses(items: list[Item], outputs: list[str]) -> tuple[Counter, int]:
    """(attribute -> outputs that miss its value, values in all): the slot error rate broken down by
    attribute, which shows which facts a skipping model drops (experiments/slot_misses.py)."""
    missed, total = Counter(), 0
    for item, text in zip(items, outputs):
        for key, value in parse_mr(item.mr).items():
            total += 1
            missed[key] += not slot_realized(key, value, text)
    return missed, total


def slot_error_rate(items: list[Item], outputs: list[str]) -> float:
    missed, total = slot_misses(items, outputs)
    return sum(missed.values()) / total if total else 0.0


def names_copied(items: list[Item], outputs: list[str]) -> float:
    """Share of outputs that spell the restaurant's name exactly: where skipping breaks first, on names
    the fine-tuning data never had."""
    named = [(item.slots["name"], text) for item, text in zip(items, outputs) if item.slots.get("name")]
    return sum(slot_realized("name", name, text) for name, text in named) / len(named) if named else 1.0


def reference_streams(items: list[Item]) -> list[list[str | None]]:
    """sacrebleu's layout for multi-reference scoring: the k-th reference of every MR, None where an MR
    has fewer."""
    depth = max(len(item.refs) for item in items)
    return [[item.refs[k] if k < len(item.refs) else None for item in items] for k in range(depth)]


def score(items: list[Item], outputs: list[str]) -> dict[str, float]:
    """Corpus BLEU and chrF against every reference of each MR, mean best-reference ROUGE-L F1,
    slot error rate, names copied, and length: output words per reference word as BLEU counts them
    (below 100 costs BLEU its brevity penalty, the skip adapters' main loss); all in percent."""
    import sacrebleu

    from .quality import rouge_l

    streams = reference_streams(items)
    rouge = [rouge_l(out, item.refs) for item, out in zip(items, outputs)]
    bleu = sacrebleu.corpus_bleu(outputs, streams)
    return {
        "bleu": bleu.score,
        "bleu_e2e": sacrebleu.corpus_bleu(outputs, streams, lowercase=True).score,
        "rouge_l": sum(rouge) / len(rouge),
        "chrf": sacrebleu.corpus_chrf(outputs, streams).score,
        "ser": 100.0 * slot_error_rate(items, outputs),
        "names": 100.0 * names_copied(items, outputs),
        "length": 100.0 * bleu.sys_len / max(bleu.ref_len, 1),
    }


def human_scores(items: list[Item]) -> dict[str, float]:
    """The ceiling the metrics allow on this data: the first reference of each MR scored, as an output,
    against the others (MRs with one reference left out). Its slot error rate is the matcher's own error
    plus what the human writers dropped."""
    kept = [item for item in items if len(item.refs) > 1]
    if not kept:
        return {}
    return {**score([Item(i.mr, i.refs[1:]) for i in kept], [i.refs[0] for i in kept]), "mrs": len(kept)}


@dataclass
class Row:
    row: str
    model: str
    adapter: str
    speedup: float
    bleu: float
    rouge_l: float
    chrf: float
    ser: float
    names: float  # % of outputs with the restaurant name spelled exactly
    length: float  # output length in % of the reference length BLEU compares it with
    avg_layers: float  # layers run per generated token, the prefill's last position counted for token 0
    ms_per_token: float  # decode phase, over the tokens decoded
    decode_speedup: float  # ms_per_token of the fine-tuned 1x row / this row's, same run
    mrs: int
    tokens: int
    beams: int = 1  # 1: greedy; else beam search of that width (length penalty in the run's command)
    bleu_e2e: float = 0.0  # BLEU as the E2E challenge's script computes it: case-insensitive


def plan_rows(speedups, adapter, compare_adapters: bool, untrained_skip: bool, untrained: bool = True,
              baseline=None):
    """(label, adapter or None, speedup) for each row of the table; `untrained=False` leaves out the
    untrained 1x row, the same in every run on one split (scoring each snapshot of a run needs it once).
    `baseline` names the fine-tuned 1x row's adapter, the decode-speedup reference: an adapter trained for
    3x only, forced by `adapter`, writes on past the end at full depth, so its own 1x row means nothing."""
    from ..adapters.lora import adapter_for, available_adapters, find_adapter

    forced = find_adapter(adapter) if adapter else None
    full = find_adapter(baseline) if baseline else None

    def pick(speedup):
        if speedup == 1.0 and full:
            return full
        return forced or adapter_for(speedup)

    rows = [("untrained", None, 1.0)] if untrained else []
    for s in sorted(set(speedups) | {1.0}):
        label = "fine-tuned" if s == 1.0 else "SkipDecode"
        if s != 1.0 or pick(1.0) is not None:
            rows.append((label, pick(s), s))
        if untrained_skip and s != 1.0:
            rows.append(("untrained", None, s))
        if compare_adapters:
            rows += [(label, a, s) for a in available_adapters()
                     if a.task == "e2e" and s in a.speedups and a != pick(s)]  # general adapters: eval --prompts
    return rows


def load_items(data=None, split: str = "test", made_up_names: bool | str = False, limit: int | None = None,
               share: float = VALIDATION_SHARE):
    """The MRs to score; made_up_names: False, True or "syllables" (the names training draws), or "words"."""
    items = eval_items(data, split, share)
    return (renamed_items(items, style=name_style(made_up_names)) if made_up_names else items)[:limit]


def name_style(made_up_names: bool | str) -> str:
    return "syllables" if made_up_names is True else made_up_names


def add_made_up_names(parser) -> None:
    """`--made-up-names [syllables|words]`, for eval and the scripts that rescore its outputs."""
    parser.add_argument("--made-up-names", nargs="?", const="syllables", default=False, choices=NAME_STYLES,
                        help="replace every restaurant name and landmark (outputs and references) with a made-up "
                             "one: syllables (default; the kind `train --renamed` draws, 'The Corfen') or words "
                             "(as people type them, 'The Brass Anchor', from words no training run draws)")


def check_held_out(plan, split: str, share: float = VALIDATION_SHARE) -> None:
    """Devset scores mean something only on MRs an adapter never trained on, nor the adapters it started
    from (--init) or learned from (--teacher). Adapters trained on the training split (or on chat prompts)
    never saw a devset MR. A devset-era adapter trained on most of the devset: it may score only on the MRs
    it held out (--split validation). One seed's splits are nested (each is a prefix of the same shuffle),
    so an adapter that held out a share at least as large held out every MR scored there."""
    if split in ("dev", "validation"):
        for _, info, _ in plan:
            _check_lineage(info, split, share, set())


def _check_lineage(info, split: str, share: float, seen: set) -> None:
    from ..adapters.lora import find_adapter

    if info is None or info.path in seen:
        return
    seen.add(info.path)
    c = info.config
    if info.task == "e2e" and c.get("split", "dev") == "dev":
        if split == "dev":
            raise ValueError(f"adapter {info.name} was trained on devset MRs (the devset-era recipe): --split dev "
                             f"scores adapters trained on the training split; use --split validation for it")
        if c.get("seed", SPLIT_SEED) != SPLIT_SEED or c.get("validation_share", VALIDATION_SHARE) < share:
            raise ValueError(f"adapter {info.name} held out other devset MRs (seed {c.get('seed')}, share "
                             f"{c.get('validation_share')}); --split validation follows seed {SPLIT_SEED}, "
                             f"share {share}")
    for ancestor in filter(None, (c.get("init"), c.get("teacher"))):
        try:
            parent = find_adapter(ancestor)
        except ValueError:  # an intermediate run that no longer exists cannot be checked
            continue
        _check_lineage(parent, split, share, seen)


def evaluate(data=None, speedups=(1, 2, 3, 4, 5), limit=None, adapter=None, batch_size=16, max_new_tokens=64,
             horizon=None, warmup=None, compare_adapters=False, untrained_skip=False, untrained=True, model=None,
             outputs_path: Path | None = None, split: str = "test", made_up_names: bool = False,
             validation_share: float = VALIDATION_SHARE, baseline=None, beam=None) -> list[Row]:
    from tqdm.auto import tqdm

    from ..engine import Engine
    from ..adapters.lora import trained_schedule

    items = load_items(data, split, made_up_names, limit, validation_share)
    plan = plan_rows([float(s) for s in speedups], adapter, compare_adapters, untrained_skip, untrained, baseline)
    check_held_out(plan, split, validation_share)
    engines, rows, all_outputs = {}, [], {}
    bar = tqdm(total=len(plan) * len(items), desc="eval", unit="mr")
    keys = [info.name if info else "none" for _, info, _ in plan]
    for i, (label, info, speedup) in enumerate(plan):
        key = keys[i]
        if key not in engines:
            engines[key] = engine = Engine.load(model, adapter=info)
            engine.generate([it.prompt for it in items[:batch_size]], max_new_tokens=4)  # warm-up, untimed
        engine = engines[key]
        L = engine.num_layers
        schedule = trained_schedule(info, speedup, L, horizon, warmup)
        bar.set_postfix_str(f"{label} {speedup:g}x {key}")
        outputs, ms, layers, tokens = decode(engine, items, schedule, batch_size, max_new_tokens, bar, beam)
        all_outputs[f"{label} {speedup:g}x {key}"] = outputs
        rows.append(Row(f"{label} {speedup:g}x", engine.base_name, key, speedup, **score(items, outputs),
                        avg_layers=layers, ms_per_token=ms, decode_speedup=0.0, mrs=len(items), tokens=tokens,
                        beams=beam.width if beam else 1))
        if key not in keys[i + 1:]:  # free a merged model no later row needs (eleven held 12 GB)
            del engines[key], engine
    bar.close()
    reference = next((r for r in rows if r.row == "fine-tuned 1x"), rows[0])
    for r in rows:
        r.decode_speedup = reference.ms_per_token / r.ms_per_token
    if outputs_path is not None:
        Path(outputs_path).parent.mkdir(parents=True, exist_ok=True)
        with open(outputs_path, "w") as handle:
            for i, item in enumerate(items):
                handle.write(json.dumps({"mr": item.mr, **{k: v[i] for k, v in all_outputs.items()}}) + "\n")
    return rows


def markdown(rows: list[Row]) -> str:
    head = ("| row | adapter | BLEU (uncased) | ROUGE-L | chrF | SER % | names % | length % | layers/token |"
            " decode speedup |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        lines.append(f"| {r.row} | {r.adapter} | {r.bleu:.1f} ({r.bleu_e2e:.1f}) | {r.rouge_l:.1f} | {r.chrf:.1f} | {r.ser:.1f} | "
                     f"{r.names:.1f} | {r.length:.1f} | {r.avg_layers:.1f} | {r.decode_speedup:.2f}x |")
    return "\n".join(lines)


def register(subparsers) -> None:
    p = subparsers.add_parser("eval", help="E2E quality table: BLEU, ROUGE-L, chrF, slot errors, speed",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=None,
                   help="CSV with columns mr, ref (default: the E2E testset_w_refs.csv, or devset.csv for --split "
                        "validation)")
    p.add_argument("--split", choices=("test", "dev", "validation"), default="test",
                   help="dev: every devset MR, to choose between adapters trained on the training split without the "
                        "test set; validation: the devset MRs that devset-era training held out")
    p.add_argument("--validation-share", type=float, default=VALIDATION_SHARE,
                   help="with --split validation: the share of devset MRs held out (every adapter scored, and the "
                        "adapters it was trained from, must have held out at least this share)")
    add_made_up_names(p)
    p.add_argument("--prompts", default=None, metavar="FILE|validation",
                   help="score general chat prompts instead of E2E: JSON lines with a prompt field, or plain text "
                        "one a line; 'validation' is the project's held-out slice of ../shared/data/prompts (its "
                        "results go to assets/results/general*; other files to --out DIR or a temporary folder). "
                        "Reference: the full-depth base model's greedy answer (see skipdecode/evaluation/general.py)")
    p.add_argument("--speedups", default=None, help="comma list (default 1,2,3,4,5; with --prompts 1,2,3,5)")
    p.add_argument("--limit", type=int, default=None, help="first N distinct MRs only")
    p.add_argument("--adapter", default=None, help="adapter name or path for every fine-tuned row")
    p.add_argument("--baseline", default=None, metavar="ADAPTER",
                   help="adapter name or path for the fine-tuned 1x row, the decode-speedup reference (default: "
                        "--adapter, or the served 1x); for an --adapter trained only at 2x-5x")
    p.add_argument("--compare-adapters", action="store_true", help="also every other adapter trained for a speedup")
    p.add_argument("--untrained-skip", action="store_true", help="also the untrained model at each speedup")
    p.add_argument("--no-untrained", action="store_true",
                   help="leave out the untrained 1x row (the same in every run on a split: once is enough)")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per batch (with --beams, each is that many rows)")
    p.add_argument("--beams", type=int, default=1,
                   help="beam search of this width for every row (default 1: greedy), as the E2E challenge's systems "
                        "decode; results go to <prefix>-beamsN")
    p.add_argument("--length-penalty", type=float, default=1.0,
                   help="with --beams: finished hypotheses score log-probability / length ** this (transformers')")
    p.add_argument("--max-new-tokens", type=int, default=None, help="default 64 (with --prompts 96)")
    p.add_argument("--horizon", type=int, default=None, help="default: the adapter's training horizon")
    p.add_argument("--model", default=None)
    p.add_argument("--out", default=None,
                   help="results prefix (default: assets/results/e2e, or docs/results/e2e-validation with "
                        "--split validation, for full runs on the project's own data only; any other run (--data, --limit, another "
                        "--validation-share) goes to a fresh temporary folder, named in the output)")
    p.add_argument("--json", action="store_true", help="print the rows as one JSON array")
    p.set_defaults(func=_cmd_eval)


def run_name(split: str = "test", made_up_names: bool = False, limit: int | None = None, data=None,
             beams: int = 1) -> str:
    """A results prefix's file name: e2e[-validation][-made-up-names|-word-names][-<data file>][-limitN][-beamsK]."""
    renamed = {"syllables": "-made-up-names", "words": "-word-names"}.get(name_style(made_up_names), "")
    name = "e2e" + ("" if split == "test" else f"-{split}") + (renamed if made_up_names else "")
    name += "" if data is None else f"-{Path(data).stem}"
    return name + ("" if limit is None else f"-limit{limit}") + ("" if beams == 1 else f"-beams{beams}")


def default_prefix(split: str = "test", data=None, limit: int | None = None, made_up_names: bool = False,
                   validation_share: float = VALIDATION_SHARE, beams: int = 1) -> Path | None:
    """Where an eval without --out writes, for the project's own full runs only: assets/results/<run_name>
    for the E2E test set (the app shows it, the README quotes it), docs/results/<run_name> for the devset
    MRs held out at the default share (the validation rounds, with the research log); None for any other run (another --data, a --limit,
    another --validation-share), which must not overwrite them: it goes to a fresh temporary folder."""
    own = data is None and limit is None and (split != "validation" or validation_share == VALIDATION_SHARE)
    if not own:
        return None
    return (RESULTS_DIR if split == "test" else VALIDATION_DIR) / run_name(split, made_up_names, beams=beams)


def output_prefix(args) -> Path:
    """--out when given (a trailing .csv or .json dropped: the files add their own), else the default
    prefix, else <a fresh temporary folder>/<run_name>."""
    if args.out:
        out = Path(args.out)
        return out.with_suffix("") if out.suffix in (".csv", ".json") else out
    prefix = default_prefix(args.split, args.data, args.limit, args.made_up_names, args.validation_share, args.beams)
    if prefix is not None:
        return prefix
    name = run_name(args.split, args.made_up_names, args.limit, args.data, args.beams)
    return Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{name}-")) / name


def _beam(args):
    from ..beam import Beam

    return None if args.beams == 1 else Beam(args.beams, args.length_penalty)


def _cmd_eval(args) -> int:
    if args.prompts is not None:  # general chat prompts against full-depth answers: general.py
        if args.beams != 1:
            raise ValueError("--beams decodes E2E meaning representations; eval --prompts compares greedy answers")
        from .general import cmd_eval

        return cmd_eval(args)
    args.speedups, args.max_new_tokens = args.speedups or "1,2,3,4,5", args.max_new_tokens or 64
    prefix = output_prefix(args)
    try:
        return _eval_to(prefix, args)
    finally:
        drop_empty_temp(prefix.parent)


def _eval_to(prefix: Path, args) -> int:
    started = time.time()
    rows = evaluate(args.data, [float(s) for s in args.speedups.split(",")], limit=args.limit,
                    adapter=args.adapter, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                    horizon=args.horizon, compare_adapters=args.compare_adapters,
                    untrained_skip=args.untrained_skip, untrained=not args.no_untrained, model=args.model,
                    outputs_path=prefix.with_name(prefix.name + "-outputs.jsonl"), split=args.split,
                    made_up_names=args.made_up_names, validation_share=args.validation_share,
                    baseline=args.baseline, beam=_beam(args))
    write(rows, prefix)
    human = human_scores(load_items(args.data, args.split, args.made_up_names, args.limit, args.validation_share))
    prefix.with_name(prefix.name + "-human.json").write_text(json.dumps({k: round(v, 3) for k, v in human.items()}))
    written = f"results written to {prefix}.csv, .json, -outputs.jsonl and -human.json"
    if args.json:  # stdout stays one JSON array
        print(json.dumps([asdict(r) for r in rows]))
        print(written, file=sys.stderr)
    else:
        print(markdown(rows))
        if human:
            print(f"\nhuman reference (the first of each MR against the others, {human['mrs']} MRs): BLEU "
                  f"{human['bleu']:.1f}, ROUGE-L {human['rouge_l']:.1f}, chrF {human['chrf']:.1f}, SER {human['ser']:.1f}%")
        print(f"\n{rows[0].mrs} MRs, {time.time() - started:.0f} s; {written}")
    return 0
