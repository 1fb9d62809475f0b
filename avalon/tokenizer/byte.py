"""A byte-level tokenizer: ids 0-255 are UTF-8 bytes, then one id per `Special`."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from avalon.tokenizer.base import REPLACEMENT, Special, utf8_bytes


class ByteTokenizer:
    """256 byte ids followed by the special tokens (in `Special` declaration order)."""

    def __init__(self):
        self._special_ids = {s: 256 + i for i, s in enumerate(Special)}
        self._special_by_id = {i: s for s, i in self._special_ids.items()}

    @property
    def vocab_size(self) -> int:
        return 256 + len(Special)

    @property
    def special_ids(self) -> Mapping[Special, int]:
        return self._special_ids

    def encode(self, text: str) -> list[int]:
        return list(utf8_bytes(text))

    def decode(self, ids: Iterable[int]) -> str:
        out: list[str] = []
        buf = bytearray()
        for i in ids:
            i = int(i)
            if 0 <= i < 256:
                buf.append(i)
                continue
            out.append(buf.decode("utf-8", errors="replace"))
            buf.clear()
            special = self._special_by_id.get(i)
            out.append(special.value if special is not None else REPLACEMENT)
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)
