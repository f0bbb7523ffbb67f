"""Text from outside made safe to print: the one rule for what a provider's reply or headers, a
served model's name, a run file or the cache may put on the terminal or in a log. Standard library
only, so that any layer may import it (``dxi.layers``).

A hostile server's message ``nope\\x1b]0;TITLE\\x07\\nFORGED: all good, exit 0`` must neither set
the terminal's title nor print a line of its own: every control character (C0 with ESC, CR and
newline, DEL, C1), the bidirectional overrides, isolates and marks, and the line and paragraph
separators are shown as Python's escapes (``\\x1b``, ``\\n``, ``\\u202e``), so the reader sees them
and the terminal acts on none. Used where such text enters a message
(``adapters.errors.AdapterError``, the served models' notes of ``scoring.replies``, the invalid
answers and first errors the terminal lists, the live bars' labels), refused in a model's names
(``adapters.ModelSpec``), and by every console of ``dxi`` (``runner.commands.make_console``, which
keeps its own line breaks and tabs: ``keep``), its warnings' handler
(``runner.commands.log_handler``: one line each) and the notes of a distributed run
(``runner.distributed.setup``)."""

from __future__ import annotations

import re

BIDI = "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
"""The bidirectional marks, embeddings, overrides and isolates: text after one reads reordered."""
_UNSAFE = re.compile(f"[\x00-\x1f\x7f-\x9f\u2028\u2029{BIDI}]")


def shown(text: str, keep: str = "") -> str:
    """``text`` with each unsafe character (see the module docstring) but those of ``keep`` written
    as its Python escape (``repr``'s: ``\\x1b``, ``\\n``, ``\\u202e``); ``text`` itself when it
    holds none."""

    def escaped(found: re.Match) -> str:
        char = found.group()
        return char if char in keep else repr(char)[1:-1]

    return _UNSAFE.sub(escaped, text)
