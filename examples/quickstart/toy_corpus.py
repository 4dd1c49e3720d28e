"""A generated parallel corpus with structure to learn: a vocabulary mapping, reordering, variable lengths.

The source is English-like ("the small dog sees a red ball in the garden"); the target is a made-up language
whose words are not the source's, where adjectives follow their noun, the verb goes to the end of its clause,
some words become two and some vanish. Deterministic for a given seed, so every run builds the same corpus.
"""

import random
from typing import List, Tuple

NOUNS = {
    "dog": "hunda",
    "cat": "mizo",
    "man": "vira",
    "woman": "femi",
    "child": "kindo",
    "bird": "vogo",
    "ball": "bola",
    "house": "domo",
    "tree": "arbo",
    "car": "auto",
    "river": "fluvo",
    "garden": "gardo",
    "book": "libro",
    "table": "tablo",
    "horse": "ekvo",
    "boat": "boto",
    "street": "strato",
    "city": "urbo",
}
ADJECTIVES = {
    "small": "mala",
    "big": "grana",
    "red": "ruga",
    "blue": "blua",
    "old": "olda",
    "young": "juna",
    "happy": "gaja",
    "green": "verda",
    "fast": "rapida",
    "quiet": "kvieta",
}
VERBS = {
    "sees": "vidas",
    "likes": "amas",
    "finds": "trovas",
    "follows": "sekvas",
    "holds": "tenas",
    "paints": "pentras",
    "watches": "rigardas",
    "carries": "portas",
}
PLACES = {"in": "en", "near": "apud", "behind": "post", "under": "sub"}
DETERMINERS = {"the": "la", "a": None}  # "a" has no word of its own in the target
NUMBERS = {"two": "du", "three": "tri", "four": "kvar"}
CONJUNCTION = ("and", "kaj")


def _noun_phrase(rng: random.Random) -> Tuple[List[str], List[str]]:
    if rng.random() < 0.15:
        number, noun = rng.choice(list(NUMBERS)), rng.choice(list(NOUNS))
        return [number, noun + "s"], [NUMBERS[number], NOUNS[noun] + "j"]  # plural: one suffix
    det = rng.choice(list(DETERMINERS))
    noun = rng.choice(list(NOUNS))
    adjectives = rng.sample(list(ADJECTIVES), k=rng.choice([0, 0, 1, 1, 2]))
    src = [det] + adjectives + [noun]
    tgt = ([DETERMINERS[det]] if DETERMINERS[det] else []) + [NOUNS[noun]] + [ADJECTIVES[a] for a in adjectives]
    return src, tgt


def _clause(rng: random.Random) -> Tuple[List[str], List[str]]:
    subj_s, subj_t = _noun_phrase(rng)
    verb = rng.choice(list(VERBS))
    obj_s, obj_t = _noun_phrase(rng)
    src, tgt = subj_s + [verb] + obj_s, subj_t + obj_t
    if rng.random() < 0.4:
        place = rng.choice(list(PLACES))
        where_s, where_t = _noun_phrase(rng)
        src, tgt = src + [place] + where_s, tgt + [PLACES[place]] + where_t
    return src, tgt + [VERBS[verb]]  # subject-object-verb in the target


def sentence_pair(rng: random.Random) -> Tuple[str, str]:
    src, tgt = _clause(rng)
    if rng.random() < 0.25:
        src2, tgt2 = _clause(rng)
        src, tgt = src + [CONJUNCTION[0]] + src2, tgt + [CONJUNCTION[1]] + tgt2
    return " ".join(src), " ".join(tgt)


def make_corpus(n: int, seed: int) -> List[Tuple[str, str]]:
    """``n`` distinct sentence pairs."""
    rng = random.Random(seed)
    seen, pairs = set(), []
    while len(pairs) < n:
        pair = sentence_pair(rng)
        if pair[0] not in seen:
            seen.add(pair[0])
            pairs.append(pair)
    return pairs
