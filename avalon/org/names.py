"""Names a model writes (titles, file names, reactions): plain visible text, one line.

A name is shown to every teammate (a title is pinned in each role card and roster; a file name
in every listing), so a name that hides or reorders text would let one agent forge what the
others read. Refused, with a tool error naming the character (`name_problem`):
- control characters (C0, C1, DEL: newlines, tabs, NUL, escape sequences);
- format characters (Unicode category Cf): the bidirectional overrides and isolates
  (U+202A..U+202E, U+2066..U+2069), the directional marks (U+200E, U+200F, U+061C), the
  zero-width space, joiners and word joiner (U+200B..U+200D, U+2060), the byte-order mark, the
  soft hyphen, tag characters, ...;
- line and paragraph separators (U+2028, U+2029), private-use and unassigned code points, lone
  surrogates, and the blank "letters" that render as nothing (Hangul fillers, U+3164, U+FFA0,
  the blank Braille pattern).
A reaction (`allow_joiner=True`) may hold U+200D, the zero-width joiner that composes emoji
sequences (a family, a flag of a region).
"""

from __future__ import annotations

import unicodedata

REFUSED_CATEGORIES = {"Cc": "a control character", "Cf": "an invisible format character",
                      "Zl": "a line separator", "Zp": "a paragraph separator",
                      "Co": "a private-use character", "Cn": "an unassigned code point",
                      "Cs": "a lone surrogate"}
BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
ZERO_WIDTH_JOINER = "\u200d"


def name_problem(text: str, *, allow_joiner: bool = False) -> str | None:
    """Why `text` is not a name teammates can read as written (see the module docstring), or
    None when it is."""
    for i, ch in enumerate(text):
        if allow_joiner and ch == ZERO_WIDTH_JOINER:
            continue
        what = REFUSED_CATEGORIES.get(unicodedata.category(ch))
        if what is None and ch in BLANK_LETTERS:
            what = "a blank character"
        if what is not None:
            label = unicodedata.name(ch, "") if unicodedata.category(ch) != "Cs" else ""
            shown = f"U+{ord(ch):04X}" + (f" {label}" if label else "")
            return f"character {i} is {what} ({shown})"
    return None
