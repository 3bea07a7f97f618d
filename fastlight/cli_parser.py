"""``FastlightArgumentParser``: jsonargparse's refusal of a bad setting, as one line naming the flag.

jsonargparse checks ``Literal`` settings and unknown keys while parsing and reports them as a
nested, many-line message. Two refusals become the one line the rest of fastlight prints
(:func:`fastlight.cli_output.one_line_errors`):

- a value outside a ``Literal``: ``--data.reset_mode must be one of dpsa | sgr | autoreset |
  sequential, got 'foo'``;
- an old flat data setting that moved into a settings object: ``--data.heartbeat_s has moved:
  write --data.faults.heartbeat_s`` (:mod:`fastlight.data.legacy`).

Anything else keeps jsonargparse's own message.
"""

from __future__ import annotations

import ast
import re
from typing import NoReturn

from lightning.pytorch.cli import LightningArgumentParser

from fastlight.data.legacy import MOVED, moved_line

_KEY = re.compile(r'Parser key "([^"]+)"')
_LITERAL = re.compile(r"Expected a typing\.Literal\[([^\]]*)\]")
#: The refused value: "Got value: foo", or for an optional Literal the inner "Given value: foo".
_GOT = re.compile(r"(?:Got|Given) value: (?!NestedArg)(.*)")
_UNKNOWN = re.compile(r"""(?:Option|Key|key) ["']([^"']+)["'] (?:is not accepted|is not expected)""")


def parser_error_line(message: str) -> str | None:
    """The one line for jsonargparse error ``message``, or None when it is not one of the two kinds."""
    keys = [k for k in _KEY.findall(message) if k != "init_args"]
    unknown = _UNKNOWN.search(message)
    if unknown is not None and keys[:1] == ["data"]:
        name = unknown.group(1).split(".")[-1]
        if name in MOVED:
            return moved_line(name)
    literal, got = _LITERAL.search(message), _GOT.search(message)
    if literal is None or got is None or not keys:
        return None
    try:
        allowed = ast.literal_eval(f"({literal.group(1)},)")
    except (ValueError, SyntaxError):
        return None
    flag = "--" + ".".join(keys)
    null = "null or " if f"typing.Literal[{literal.group(1)}], <class 'NoneType'>" in message else ""
    values = " | ".join(str(a) for a in allowed)
    return f"{flag} must be {null}one of {values}, got {got.group(1).strip()!r}"


class FastlightArgumentParser(LightningArgumentParser):
    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        # Only the command's own parsers exit on error; the nested ones jsonargparse builds for a
        # class raise, and their message reaches the top one inside its own.
        # FASTLIGHT_DEBUG=1: one_line_errors lets the ValueError's traceback through.
        line = parser_error_line(message) if self.exit_on_error else None
        if line is None:
            super().error(message, ex)
        raise ValueError(line) from ex
