"""Static checks of a CEL expression before it is accepted (SPEC §3.4; issue 11 item 4, issue 13 item 4).

The CEL library (``common-expression-language``) offers no cost limit and no syntax tree, and its
evaluation holds the GIL; so the expression's text is tokenized here and refused when it could cost
more than a bounded amount per record, or when it can never match:

- comprehensions (``all``, ``exists``, ``exists_one``, ``map``, ``filter``) must not nest: one
  comprehension over a list of n items costs O(n), nested ones O(n^depth) (the issue's 3.3 KB
  filter nests three over 300 items: 27 million steps, 12 s);
- a list or map literal holds at most ``literal_items_max`` items;
- a filter must be a boolean expression (a comparison, ``&&``/``||``/``!``, ``in``, a boolean
  function such as ``has`` or ``startsWith``, a literal ``true``/``false``, or a conditional);
  ``value.amt`` alone is refused rather than silently matching nothing;
- ``key`` is bytes: comparing it with a string literal or calling a string function on it is
  refused with the fix (``key == b"kk"`` or ``string(key) == "kk"``).
Evaluation is still bounded at run time (``broker.leader.cel_sandbox``): these checks refuse the
obvious cases early with a clear message, the sandbox catches the rest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from broker.core.errors import InvalidArgument

COMPREHENSIONS = frozenset({"all", "exists", "exists_one", "map", "filter"})
BOOLEAN_FUNCTIONS = frozenset({"has", "all", "exists", "exists_one", "startsWith", "endsWith", "contains",
                               "matches"})
_STRING_FUNCTIONS = ("startsWith", "endsWith", "contains", "matches")
_BOOLEAN_OPERATORS = frozenset({"==", "!=", "<", "<=", ">", ">=", "&&", "||", "in", "?"})
_TOKEN = re.compile(r"""
    (?P<space>\s+|//[^\n]*)
  | (?P<str>(?:[rR][bB]?|[bB][rR]?)?(?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''
                                      |"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
  | (?P<num>0[xX][0-9a-fA-F]+[uU]?|\d+(?:\.\d+)?(?:[eE][+-]?\d+)?[uU]?|\.\d+(?:[eE][+-]?\d+)?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>==|!=|<=|>=|&&|\|\||[-+*/%<>!?:.,()\[\]{}])
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True)
class ExpressionLimits:
    """Static bounds on an accepted expression."""

    expression_chars_max: int = 4096
    comprehension_depth_max: int = 1
    literal_items_max: int = 256

    def __post_init__(self) -> None:
        assert 0 < self.expression_chars_max <= 64 * 1024
        assert 0 <= self.comprehension_depth_max <= 2
        assert 0 < self.literal_items_max <= 10_000


LIMITS = ExpressionLimits()


@dataclass(frozen=True)
class Token:
    kind: str  # "str" (or "bytes"), "num", "ident", "op"
    text: str


def tokens(expression: str) -> list[Token]:
    """The tokens of ``expression``; anything unrecognised is left to the CEL parser to report."""
    out: list[Token] = []
    pos = 0
    while pos < len(expression):
        m = _TOKEN.match(expression, pos)
        if m is None:
            pos += 1  # the CEL compiler has accepted the text already; skip what we do not model
            continue
        pos = m.end()
        kind = m.lastgroup or ""
        if kind == "space":
            continue
        text = m.group()
        if kind == "str" and text[:2].lower() in ("b'", 'b"', "br", "rb"):
            kind = "bytes"
        out.append(Token(kind, text))
    return out


def check_length(expression: str, what: str, limits: ExpressionLimits = LIMITS) -> None:
    """Raise :class:`InvalidArgument` when ``expression`` is too long to parse (checked first)."""
    if len(expression) > limits.expression_chars_max:
        raise InvalidArgument(f"{what} is longer than {limits.expression_chars_max} characters")


def check(expression: str, what: str, boolean: bool, limits: ExpressionLimits = LIMITS) -> None:
    """Raise :class:`InvalidArgument` when ``expression`` breaks a limit, or (``boolean``) cannot be a
    filter's true/false; ``what`` names it in messages (``filter``, ``partition_key``). Run on an
    expression the CEL parser accepted: the tokens are read loosely, so a syntax error could pass
    for something else here (``value.status = "paid"`` for a value)."""
    check_length(expression, what, limits)
    toks = tokens(expression)
    _check_structure(toks, what, limits)
    _check_key_usage(toks, what)
    if boolean and not _is_boolean(toks):
        raise InvalidArgument(f"{what} must be a boolean expression (true or false per record), e.g. "
                              "'value.amt > 10' or 'has(value.amt)'; this one yields a value, which would "
                              "match nothing")


def _check_structure(toks: list[Token], what: str, limits: ExpressionLimits) -> None:
    """Comprehension nesting and literal sizes, from the bracket structure."""
    # One entry per open bracket: [closing char, is a comprehension, item count (literals) or -1]
    stack: list[list[object]] = []
    for i, tok in enumerate(toks):
        prev = toks[i - 1] if i else None
        if tok.text in ("(", "[", "{") and tok.kind == "op":
            macro = (tok.text == "(" and prev is not None and prev.kind == "ident" and prev.text in COMPREHENSIONS
                     and i >= 2 and toks[i - 2].text == ".")
            if macro:
                depth = sum(1 for entry in stack if entry[1]) + 1
                if depth > limits.comprehension_depth_max:
                    raise InvalidArgument(
                        f"{what} nests comprehensions ({prev.text if prev else ''} inside another of "
                        f"{', '.join(sorted(COMPREHENSIONS))}); at most {limits.comprehension_depth_max} "
                        "level is allowed, since nested ones cost the product of the list sizes per record")
            literal = tok.text == "{" or (tok.text == "[" and (prev is None or prev.text == "in" or (
                prev.kind == "op" and prev.text not in (")", "]", "}"))))
            stack.append([tok.text, macro, 0 if literal else -1])
            continue
        if tok.kind == "op" and tok.text in (")", "]", "}"):
            if stack:
                entry = stack.pop()
                items = entry[2]
                assert isinstance(items, int)
                if items >= 0 and prev is not None and prev.text not in ("[", "{", ","):
                    items += 1  # the last item (no trailing comma)
                if items > limits.literal_items_max:
                    raise InvalidArgument(f"{what} has a list or map literal of {items} items; at most "
                                          f"{limits.literal_items_max} are allowed")
            continue
        if tok.text == "," and stack and isinstance(stack[-1][2], int) and stack[-1][2] >= 0:
            stack[-1][2] += 1


def _check_key_usage(toks: list[Token], what: str) -> None:
    """``key`` is bytes: a string comparison or a string function on it never matches."""
    for i, tok in enumerate(toks):
        if tok.kind != "ident" or tok.text != "key" or (i and toks[i - 1].text == "."):
            continue
        after = toks[i + 1:i + 3]
        before = toks[max(0, i - 2):i]
        compared = ((len(after) == 2 and after[0].text in ("==", "!=") and after[1].kind == "str")
                    or (len(before) == 2 and before[1].text in ("==", "!=") and before[0].kind == "str"))
        if compared:
            raise InvalidArgument(f"{what} compares key, which is bytes, with a string: that is never equal; "
                                  'write key == b"..." or string(key) == "..."')
        if len(after) == 2 and after[0].text == "." and after[1].text in _STRING_FUNCTIONS:
            raise InvalidArgument(f"{what} calls {after[1].text} on key, which is bytes; "
                                  f"write string(key).{after[1].text}(...)")


def _is_boolean(toks: list[Token]) -> bool:
    """Whether the expression's outermost operation yields a bool (conditionals are left to run time)."""
    while len(toks) >= 2 and toks[0].text == "(" and _closing(toks, 0) == len(toks) - 1:
        toks = toks[1:-1]
    if not toks:
        return False
    depth = 0
    for tok in toks:
        if tok.kind == "op" and tok.text in ("(", "[", "{"):
            depth += 1
        elif tok.kind == "op" and tok.text in (")", "]", "}"):
            depth -= 1
        elif depth == 0 and tok.text in _BOOLEAN_OPERATORS and tok.kind in ("op", "ident"):
            return True
    if toks[0].text == "!":
        return True
    if len(toks) == 1:
        return toks[0].kind == "ident" and toks[0].text in ("true", "false")
    if toks[-1].text != ")":
        return False
    opening = _opening(toks, len(toks) - 1)
    return opening > 0 and toks[opening - 1].kind == "ident" and toks[opening - 1].text in BOOLEAN_FUNCTIONS


def _closing(toks: list[Token], start: int) -> int:
    depth = 0
    for i in range(start, len(toks)):
        if toks[i].kind == "op" and toks[i].text in ("(", "[", "{"):
            depth += 1
        elif toks[i].kind == "op" and toks[i].text in (")", "]", "}"):
            depth -= 1
            if depth == 0:
                return i
    return -1


def _opening(toks: list[Token], end: int) -> int:
    depth = 0
    for i in range(end, -1, -1):
        if toks[i].kind == "op" and toks[i].text in (")", "]", "}"):
            depth += 1
        elif toks[i].kind == "op" and toks[i].text in ("(", "[", "{"):
            depth -= 1
            if depth == 0:
                return i
    return -1
