"""Write the instruction_following_procedural benchmark: 120 writing prompts with checkable instructions.

Offline and deterministic (seeded). Each row is a writing task from a fixed topic list plus one
to three verifiable instructions drawn from IFEval's instruction ids (the ids and ``kwargs`` names
NeMo Gym's instruction_following environment reads), never two that contradict each other.

:func:`example_response` writes a response that follows every instruction of a row; tests use
it to drive the scripted model, and it shows what each instruction asks for.

Usage: python benchmarks/instruction_following_procedural/prepare.py [--output PATH]
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nemo_gym.tools.benchmarks import write_prepared_rows

NAME = "instruction_following_procedural"
SEED = 20240605
ROWS = 120
DEFAULT_OUTPUT = Path(__file__).resolve().parent / "data" / f"{NAME}.jsonl"

TOPICS = (
    ("a note to a neighbour about a lost cat", "cat"),
    ("a short guide to watering house plants", "plants"),
    ("a welcome message for new members of a chess club", "chess"),
    ("an explanation of why the sky looks blue", "sky"),
    ("a product description for a reusable water bottle", "bottle"),
    ("advice for someone starting to run", "running"),
    ("a summary of how bees make honey", "honey"),
    ("a thank-you letter to a school librarian", "library"),
    ("a plan for a rainy weekend at home", "weekend"),
    ("a review of an imaginary seaside cafe", "cafe"),
    ("tips for keeping a kitchen tidy", "kitchen"),
    ("a story opening about a lighthouse keeper", "lighthouse"),
    ("an invitation to a community garden day", "garden"),
    ("a description of a walk through an autumn forest", "forest"),
    ("a short history of the bicycle", "bicycle"),
    ("an announcement that a train timetable is changing", "train"),
    ("advice on learning a new language", "language"),
    ("a description of how a rainbow forms", "rainbow"),
    ("a packing list for a camping trip", "camping"),
    ("a note explaining a change to office hours", "office"),
)
KEYWORDS = (
    "lantern",
    "harvest",
    "compass",
    "meadow",
    "copper",
    "whistle",
    "orchard",
    "canvas",
    "pebble",
    "ribbon",
)
FORBIDDEN = ("very", "really", "thing", "stuff", "basically", "actually", "literally", "nice")
END_PHRASES = (
    "Is there anything else I can help with?",
    "Let me know if you have additional questions.",
    "That is all.",
)
LETTER_WORDS = {"e": "green tree", "a": "banana", "o": "good book", "t": "tent", "s": "stress", "r": "river"}
FILLER = (
    "This part of the reply keeps to plain words and short sentences.",
    "Each point here is meant to be clear and easy to follow.",
    "The ideas below come from common experience and simple sense.",
    "A calm and steady approach tends to work best over time.",
    "Small steps taken often can add up to a large change.",
    "It helps to read the whole message once before acting on it.",
)

# Pairs that cannot both hold (or that IFEval never asks together).
CONFLICTS = {
    frozenset({"change_case:english_lowercase", "change_case:english_capital"}),
    frozenset({"detectable_format:number_bullet_lists", "detectable_format:number_highlighted_sections"}),
}


def _choose_kwargs(instruction: str, rng: random.Random) -> dict[str, Any]:
    """The IFEval ``kwargs`` of one instruction (its own argument names)."""
    if instruction == "startend:end_checker":
        return {"end_phrase": rng.choice(END_PHRASES)}
    if instruction == "keywords:existence":
        return {"keywords": rng.sample(KEYWORDS, 2)}
    if instruction == "keywords:forbidden_words":
        return {"forbidden_words": rng.sample(FORBIDDEN, 3)}
    if instruction == "detectable_format:number_bullet_lists":
        return {"num_bullets": rng.randint(2, 5)}
    if instruction == "length_constraints:number_words":
        relation = rng.choice(["at least", "less than"])
        return {
            "relation": relation,
            "num_words": rng.choice([60, 80, 100]) if relation == "at least" else rng.choice([250, 300]),
        }
    if instruction == "detectable_content:postscript":
        return {"postscript_marker": rng.choice(["P.S.", "P.P.S"])}
    if instruction == "length_constraints:number_paragraphs":
        return {"num_paragraphs": rng.randint(2, 4)}
    if instruction == "detectable_format:number_highlighted_sections":
        return {"num_highlights": rng.randint(1, 3)}
    if instruction == "detectable_content:number_placeholders":
        return {"num_placeholders": rng.randint(1, 3)}
    if instruction == "keywords:letter_frequency":
        return {
            "letter": rng.choice(sorted(LETTER_WORDS)),
            "let_frequency": rng.randint(5, 12),
            "let_relation": "at least",
        }
    return {}


DESCRIPTIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "punctuation:no_comma": lambda k: "Do not use a single comma anywhere in your reply.",
    "change_case:english_lowercase": lambda k: (
        "Write the whole reply in English using lowercase letters only; no capital letters at all."
    ),
    "change_case:english_capital": lambda k: "Write the whole reply in English using capital letters only.",
    "startend:end_checker": lambda k: (
        f'End your reply with the exact phrase "{k["end_phrase"]}" and nothing after it.'
    ),
    "keywords:existence": lambda k: f"Use the words {' and '.join(k['keywords'])} somewhere in your reply.",
    "keywords:forbidden_words": lambda k: f"Never use these words: {', '.join(k['forbidden_words'])}.",
    "detectable_format:number_bullet_lists": lambda k: (
        f"Include exactly {k['num_bullets']} markdown bullet points, each on its own line starting with '* '."
    ),
    "length_constraints:number_words": lambda k: f"Use {k['relation']} {k['num_words']} words.",
    "detectable_format:title": lambda k: (
        "Give your reply a title wrapped in double angular brackets, like <<my title>>."
    ),
    "detectable_content:postscript": lambda k: (
        f"Finish with a postscript that starts with {k['postscript_marker']}"
    ),
    "length_constraints:number_paragraphs": lambda k: (
        f"Write exactly {k['num_paragraphs']} paragraphs, separated from each other by the markdown divider ***"
    ),
    "detectable_format:number_highlighted_sections": lambda k: (
        f"Highlight at least {k['num_highlights']} parts of the reply with markdown, like *this part*."
    ),
    "detectable_content:number_placeholders": lambda k: (
        f"Include at least {k['num_placeholders']} placeholders in square brackets, like [name]."
    ),
    "keywords:letter_frequency": lambda k: (
        f"Make the letter '{k['letter']}' appear {k['let_relation']} {k['let_frequency']} times."
    ),
}
INSTRUCTIONS = tuple(DESCRIPTIONS)


def build_row(index: int, rng: random.Random) -> dict[str, Any]:
    """One row: a topic and 1-3 compatible instructions, in NeMo Gym's instruction_following shape."""
    topic, _ = TOPICS[index % len(TOPICS)]
    chosen: list[str] = []
    for _ in range(rng.randint(1, 3)):
        candidates = [
            i
            for i in INSTRUCTIONS
            if i not in chosen and all(frozenset({i, c}) not in CONFLICTS for c in chosen)
        ]
        chosen.append(rng.choice(candidates))
    kwargs = [_choose_kwargs(i, rng) for i in chosen]
    prompt = f"Write {topic}. " + " ".join(DESCRIPTIONS[i](k) for i, k in zip(chosen, kwargs, strict=True))
    return {
        "id": index,
        "instruction_id_list": chosen,
        "kwargs": kwargs,
        "prompt": prompt,
        "responses_create_params": {"input": [{"role": "user", "content": prompt}]},
    }


def build_rows(count: int = ROWS, seed: int = SEED) -> list[dict[str, Any]]:
    """``count`` rows; each one's :func:`example_response` is checked to be buildable."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < count:
        row = build_row(len(rows), rng)
        if _word_budget_ok(row):
            rows.append(row)
    return rows


def _word_budget_ok(row: dict[str, Any]) -> bool:
    words = len(re.findall(r"\w+", example_response(row)))
    for instruction, kwargs in zip(row["instruction_id_list"], row["kwargs"], strict=True):
        if instruction == "length_constraints:number_words" and kwargs["relation"] == "less than":
            return words < kwargs["num_words"]
    return True


def example_response(row: dict[str, Any]) -> str:
    """A reply that follows every instruction of ``row`` (no commas, plain English)."""
    spec = dict(zip(row["instruction_id_list"], row["kwargs"], strict=True))
    _, subject = TOPICS[row["id"] % len(TOPICS)]
    paragraphs = [[f"Here is a short reply about the {subject}.", FILLER[0], FILLER[1]]]
    extra = spec.get("length_constraints:number_paragraphs", {}).get("num_paragraphs", 1) - 1
    for n in range(extra):
        paragraphs.append([FILLER[(n + 2) % len(FILLER)], FILLER[(n + 3) % len(FILLER)]])
    first = paragraphs[0]
    if "keywords:existence" in spec:
        first.append(f"It mentions {' and '.join(spec['keywords:existence']['keywords'])} as asked.")
    if "keywords:letter_frequency" in spec:
        kw = spec["keywords:letter_frequency"]
        first.append(" ".join([LETTER_WORDS[kw["letter"]]] * kw["let_frequency"]) + ".")
    if "detectable_format:number_highlighted_sections" in spec:
        count = spec["detectable_format:number_highlighted_sections"]["num_highlights"]
        first.append(" ".join(f"Note the *key idea {n + 1}* here." for n in range(count)))
    if "detectable_content:number_placeholders" in spec:
        count = spec["detectable_content:number_placeholders"]["num_placeholders"]
        first.append("Please fill in " + " and ".join(f"[detail {n + 1}]" for n in range(count)) + ".")
    target = spec.get("length_constraints:number_words", {})
    if target.get("relation") == "at least":
        n = 0
        while len(re.findall(r"\w+", " ".join(" ".join(p) for p in paragraphs))) < target["num_words"] + 10:
            first.append(FILLER[n % len(FILLER)])
            n += 1
    blocks = [" ".join(p) for p in paragraphs]
    if "detectable_format:number_bullet_lists" in spec:
        bullets = spec["detectable_format:number_bullet_lists"]["num_bullets"]
        blocks[-1] += "\n" + "\n".join(f"* Point {n + 1} about the {subject}" for n in range(bullets))
    text = "\n\n***\n\n".join(blocks) if len(blocks) > 1 else blocks[0]
    if "detectable_format:title" in spec:
        text = f"<<A reply about the {subject}>>\n\n{text}"
    closing = []
    if "detectable_content:postscript" in spec:
        closing.append(f"{spec['detectable_content:postscript']['postscript_marker']} Thank you for reading.")
    if "startend:end_checker" in spec:
        closing.append(spec["startend:end_checker"]["end_phrase"])
    if closing:
        # After the last paragraph without a divider, so the paragraph count stays as asked.
        text += "\n" + " ".join(closing)
    if "change_case:english_lowercase" in spec:
        text = text.lower()
    if "change_case:english_capital" in spec:
        text = text.upper()
    return text


def main() -> None:
    write_prepared_rows(__doc__.splitlines()[0], DEFAULT_OUTPUT, build_rows)


if __name__ == "__main__":
    main()
