"""The language instruction of each Meta-World task, and the one vocabulary that encodes them.

AcceRL's VLA reads a natural-language instruction next to the camera frame (§experiments, MT10).
:func:`instruction_words` builds the tokenizer over every known sentence, once per process, so ids
agree across envs and processes whatever tasks they run. An env that emits token ids declares them
with an ``instruction_table`` (:class:`InstructionTable`), so that a policy with its own tokenizer can
map those rows to its own tokens (``VLAPolicy.bind_instructions``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from fastlight.envs.instruction_tokens import Tokenizer


@dataclass(frozen=True, eq=False)
class InstructionTable:
    """The instructions an env emits: ``sentences`` (T) and their rows ``ids`` / ``mask`` ``[T, L]``
    (int64, the env's own vocabulary, right-padded; 1 = real token), as ``instruction_ids`` /
    ``instruction_mask`` carry them."""

    sentences: tuple[str, ...]
    ids: np.ndarray
    mask: np.ndarray

    def __post_init__(self) -> None:
        t = len(self.sentences)
        if t == 0 or self.ids.ndim != 2 or self.ids.shape[0] != t or self.mask.shape != self.ids.shape:
            raise ValueError(
                f"InstructionTable needs ids and mask [T, L] for T={t} sentences (T >= 1), got "
                f"{self.ids.shape} and {self.mask.shape}"
            )


#: One instruction per MT10 task (lower case, no punctuation: decoding gives them back verbatim).
INSTRUCTIONS = {
    "reach-v3": "reach the goal position with the gripper",
    "push-v3": "push the puck to the goal",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "door-open-v3": "open the door by pulling its handle",
    "drawer-open-v3": "open the drawer",
    "drawer-close-v3": "push the drawer closed",
    "button-press-topdown-v3": "press the button from the top",
    "peg-insert-side-v3": "insert the peg into the hole from the side",
    "window-open-v3": "slide the window open",
    "window-close-v3": "slide the window closed",
}


def instruction_for(name: str) -> str:
    """The sentence of task ``name`` (MT10: :data:`INSTRUCTIONS`; others: the name in words)."""
    return INSTRUCTIONS.get(name, name.removesuffix("-v3").replace("-", " "))


@functools.cache
def instruction_words(extra: tuple[str, ...] = ()) -> Tokenizer:
    """The bare ``tokenizers`` WordLevel tokenizer over every MT10 sentence plus ``extra`` (built once
    per process): what the envs encode with, so that a sampler imports no ``transformers``."""
    from fastlight.envs.instruction_tokens import build_word_tokenizer

    return build_word_tokenizer(sorted(set(INSTRUCTIONS.values()) | set(extra)))
