"""Lines of UTF-8 text, checked (without datasets, which costs seconds to import: translation reads
text with it)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

__all__ = ["BOM", "text_lines"]

#: A UTF-8 byte-order mark, which some editors put at the start of a text file: dropped when read.
BOM = "\ufeff"


def text_lines(stream: Iterable[bytes | str], name: str, first: int = 1) -> Iterator[str]:
    """The lines of ``stream`` (bytes, or already decoded text) without their line ends and without a
    UTF-8 byte-order mark at the start. A line that is not UTF-8 text or holds a NUL byte raises
    ``ValueError`` naming ``name`` and the line number. ``first``: the number of the stream's first
    line in its file (a stream that starts mid-file; only line 1 may start with the mark)."""
    for number, raw in enumerate(stream, start=first):
        if isinstance(raw, bytes):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{name}, line {number}: not UTF-8 text (byte 0x{raw[err.start]:02x} at byte {err.start + 1} "
                    "of the line). Give plain UTF-8 text, one sentence per line (convert other encodings with "
                    "e.g. `iconv -f latin1 -t utf-8`)."
                ) from None
        else:
            line = raw
        if number == 1:
            line = line.removeprefix(BOM)
        if "\x00" in line:
            raise ValueError(
                f"{name}, line {number}: a NUL byte, so this is binary data, not text. Give plain UTF-8 text, "
                "one sentence per line."
            )
        yield line.rstrip("\n").rstrip("\r")
