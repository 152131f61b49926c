"""The E2E NLG data: meaning representations (MRs) of restaurants and human references.

Read by path (option, or $SKIPDECODE_E2E_DIR, or ../shared/data/e2e beside the repo); the files are
CC BY-SA 4.0 (Novikova, Dusek and Rieser, 2017) and are never copied into this repository.
"""

from __future__ import annotations

import csv
import os
import random
import re
from dataclasses import dataclass
from pathlib import Path

from ..adapters.router import INSTRUCTION  # the runtime routes by it; every E2E prompt begins with it

E2E_ENV = "SKIPDECODE_E2E_DIR"
VALIDATION_SHARE = 0.05  # share of devset MRs `skipdecode train` holds out by default
SPLIT_SEED = 0  # and the seed that picks them (train's default --seed)
SLOT = re.compile(r"\s*([^\[,]+?)\s*\[([^\]]*)\]")


@dataclass(frozen=True)
class Item:
    """One meaning representation with all of its references."""

    mr: str
    refs: tuple[str, ...]

    @property
    def prompt(self) -> str:
        return e2e_prompt(self.mr)

    @property
    def slots(self) -> dict[str, str]:
        return parse_mr(self.mr)


def e2e_prompt(mr: str) -> str:
    return INSTRUCTION + mr


def parse_mr(mr: str) -> dict[str, str]:
    """'name[The Eagle], food[French]' -> {'name': 'The Eagle', 'food': 'French'}"""
    return {key.strip(): value.strip() for key, value in SLOT.findall(mr)}


def default_dir() -> Path:
    if os.environ.get(E2E_ENV):
        return Path(os.environ[E2E_ENV])
    return Path(__file__).resolve().parents[3] / "shared" / "data" / "e2e"


def resolve(path_or_name: str | os.PathLike | None, name: str) -> Path:
    """A CSV given by path, or `name` in the E2E folder."""
    path = Path(path_or_name) if path_or_name else default_dir() / name
    if path.is_dir():
        path = path / name
    if not path.exists():
        raise FileNotFoundError(
            f"E2E file not found: {path}. Pass --data PATH or set {E2E_ENV} to the folder holding {name}"
        )
    return path


def read_items(path: str | os.PathLike) -> list[Item]:
    """Rows grouped by MR, in order of first appearance; columns `mr` and `ref` are required."""
    refs: dict[str, list[str]] = {}
    with open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        if not reader.fieldnames or not {"mr", "ref"} <= set(reader.fieldnames):
            raise ValueError(f"{path}: an E2E CSV needs the columns mr and ref; found {reader.fieldnames}")
        for row in reader:
            if row["mr"].strip():
                refs.setdefault(row["mr"].strip(), []).append((row["ref"] or "").strip())
    if not refs:
        raise ValueError(f"{path}: no rows")
    return [Item(mr, tuple(r for r in rs if r)) for mr, rs in refs.items()]


def split_items(items: list[Item], validation_share: float, seed: int) -> tuple[list[Item], list[Item]]:
    """Hold out whole MRs (not single references), so validation MRs are unseen in training."""
    if not 0 < validation_share < 1:
        raise ValueError(f"--validation-share must be between 0 and 1; got {validation_share:g}")
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    held = max(1, round(len(items) * validation_share))
    held_out = set(order[:held])
    return ([it for i, it in enumerate(items) if i not in held_out],
            [it for i, it in enumerate(items) if i in held_out])


SPLIT_FILES = {"train": "trainset.csv", "dev": "devset.csv", "test": "testset_w_refs.csv"}
E2E_TEST = SPLIT_FILES["test"]  # what `skipdecode bench` and the speed experiments time on


def training_split(data=None, split: str = "train", share: float = VALIDATION_SHARE,
                   seed: int = SPLIT_SEED) -> tuple[list[Item], list[Item]]:
    """(MRs to train on, MRs to validate on). "train": the official training split (4,862 MRs, none in dev
    or test), as the paper and the challenge do, validated on the devset beside it. "dev", for comparison
    with the devset-era adapters: the devset MRs not held out, validated on those held out."""
    if split == "train":
        folder = Path(data).parent if data and Path(data).is_file() else data
        return read_items(resolve(data, SPLIT_FILES["train"])), read_items(resolve(folder, SPLIT_FILES["dev"]))
    if split == "dev":
        return split_items(read_items(resolve(data, SPLIT_FILES["dev"])), share, seed)
    raise ValueError(f"training split must be train or dev; got {split!r}")


def eval_items(data=None, split: str = "test", share: float = VALIDATION_SHARE, seed: int = SPLIT_SEED) -> list[Item]:
    """The MRs to score: the test set; the whole devset (where to choose between adapters trained on the
    training split); or the devset MRs that devset-era training held out (unseen by every adapter trained
    with this share and seed)."""
    if split in ("test", "dev"):
        return read_items(resolve(data, SPLIT_FILES[split]))
    if split == "validation":
        return split_items(read_items(resolve(data, SPLIT_FILES["dev"])), share, seed)[1]
    raise ValueError(f"split must be test, dev or validation; got {split!r}")


# Made-up restaurant names: E2E's devset has only 20 names and 10 landmarks, and half the test set's are
# others, so a model that skips layers learns to recall those 20 instead of copying the name it is given.
SYLLABLES = ("ar", "bel", "cor", "dan", "el", "fen", "gar", "hal", "is", "jor", "kel", "lan", "mor", "nor",
             "ol", "pel", "quin", "ros", "sal", "tam", "ul", "ven", "wil", "yar", "zan", "bri", "cla", "dro")
NAMED_SLOTS = ("name", "near")


# Names as people type them: English words put together ("Blue Heron", "The Brass Anchor", "Oak and Ivy").
# Eval's (`--made-up-names words`); training draws its word names from other words (below).
ADJECTIVES = ("Blue", "Brass", "Copper", "Silver", "Crooked", "Little", "Red", "Velvet", "Quiet", "Hidden",
              "Salty", "Painted", "Wild", "Rusty", "Lucky", "Sleepy", "Amber", "Iron", "Hollow", "Merry")
NOUNS = ("Heron", "Anchor", "Oak", "Ivy", "Kettle", "Lantern", "Fox", "Willow", "Harbour", "Sparrow", "Thistle",
         "Acorn", "Badger", "Compass", "Juniper", "Meadow", "Otter", "Pebble", "Saffron", "Walnut", "Bramble",
         "Clover", "Falcon", "Hazel", "Maple", "Nutmeg", "Orchard", "Quill", "Raven", "Wren")
# Training's word names (`train --renamed-words`): other words, so that eval's "words" stay a kind never drawn.
TRAIN_ADJECTIVES = ("Black", "White", "Gilded", "Lazy", "Jolly", "Honest", "Tipsy", "Cosy", "Humble", "Bold",
                    "Scarlet", "Misty", "Sunny", "Frosty", "Twisted", "Gentle", "Proud", "Wandering", "Dancing", "Tin")
TRAIN_NOUNS = ("Pelican", "Lark", "Thimble", "Barrel", "Candle", "Beacon", "Bell", "Dove", "Elm", "Fern", "Gull",
               "Hare", "Hawk", "Lemon", "Lily", "Magpie", "Moth", "Nettle", "Owl", "Pear", "Plum", "Poppy", "Robin",
               "Rook", "Spoon", "Swan", "Thrush", "Tulip", "Wolf", "Ladle")
WORD_LISTS = {"words": (ADJECTIVES, NOUNS), "train-words": (TRAIN_ADJECTIVES, TRAIN_NOUNS)}
NAME_STYLES = ("syllables", "words")  # what eval offers


def made_up_name(rng: random.Random, style: str = "syllables") -> str:
    """A name no E2E MR has. syllables, the shapes real ones take: 'Zanbel', 'The Corfen', 'Orlan Tamis';
    words: 'Blue Heron', 'The Brass Anchor', 'Oak and Ivy', 'The Lantern'."""
    if style in WORD_LISTS:
        adjectives, nouns = WORD_LISTS[style]
        form = rng.randrange(4)
        if form == 2:
            first, second = rng.sample(nouns, 2)
            return f"{first} and {second}"
        noun = rng.choice(nouns)
        return f"{rng.choice(adjectives)} {noun}" if form == 0 else \
            f"The {rng.choice(adjectives)} {noun}" if form == 1 else f"The {noun}"
    word = lambda: "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()  # noqa: E731
    form = rng.randrange(3)
    return word() if form == 0 else f"The {word()}" if form == 1 else f"{word()} {word()}"


def made_up_names(mr: str, rng: random.Random, style: str = "syllables") -> dict[str, str]:
    """A made-up replacement for the MR's name and landmark: {old value: new value}. Word names are drawn
    again until the two differ (a short list); syllable names keep their draws as they were."""
    out = {}
    for key, value in parse_mr(mr).items():
        if key in NAMED_SLOTS and value:
            new = made_up_name(rng, style)
            while style in WORD_LISTS and new in out.values():  # a short list: "near[X]" about X itself reads wrong
                new = made_up_name(rng, style)
            out[value] = new
    return out


def substitute(text: str, names: dict[str, str]) -> str:
    for old, new in names.items():
        text = text.replace(old, new)
    return text


def renamed_items(items: list[Item], seed: int = SPLIT_SEED, style: str = "syllables") -> list[Item]:
    """Each MR, all its references alike, about a made-up restaurant near a made-up landmark: scores
    copying a name the model has never seen, as half of the test set's names are to a devset model."""
    rng = random.Random(seed)
    out = []
    for item in items:
        names = made_up_names(item.mr, rng, style)
        out.append(Item(substitute(item.mr, names), tuple(substitute(r, names) for r in item.refs)))
    return out


def pairs(items: list[Item], renamed: float = 0.0, seed: int = SPLIT_SEED,
          words: float = 0.0) -> list[tuple[str, str]]:
    """(prompt, reference) training examples, one per reference; a share `renamed` of them (drawn with
    `seed`) name a made-up restaurant and landmark instead, so that copying, not recall, is learned; a share
    `words` of those, names made of training's words ("The Tipsy Pelican", "Plum and Rook")."""
    rng = random.Random(seed)
    out = []
    for item in items:
        for ref in item.refs:
            names = {}
            if rng.random() < renamed:
                style = "train-words" if words and rng.random() < words else "syllables"
                names = made_up_names(item.mr, rng, style)
            out.append((e2e_prompt(substitute(item.mr, names)), substitute(ref, names)))
    return out
