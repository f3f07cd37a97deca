"""The front ends' ways of taking MemwatchOptions, derived from its fields so that an option declared there
reaches each of them: a Python function's keywords (`takes_options`) and a parser's flags (`option_flags`)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from . import options as declared

R = TypeVar("R")


def _fields() -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(declared.MemwatchOptions)


def _option_parameters() -> list[inspect.Parameter]:
    """The options as parameters: the first may be given by position (`memwatch(20)`), the rest by keyword."""
    out = []
    for index, each in enumerate(_fields()):
        kind = inspect.Parameter.POSITIONAL_OR_KEYWORD if index == 0 else inspect.Parameter.KEYWORD_ONLY
        out.append(inspect.Parameter(each.name, kind, default=each.default, annotation=each.type))
    return out


def takes_options(fn: Callable[..., R]) -> Callable[..., R]:
    """`fn(..., options: MemwatchOptions, *, own...)` as the front end users call: `(..., interval_ms=100.0, *,
    device=None, ..., own...)`, every option a keyword of its own (its signature says so, for `help()` and a
    notebook's tooltips), gathered into one checked MemwatchOptions. An unknown keyword is a TypeError. To a
    type checker the keywords are open (`...`): the signature is made at import, from the declared fields."""
    signature = inspect.signature(fn)
    params = list(signature.parameters.values())
    at = [p.name for p in params].index("options")
    head, own = params[:at], [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params[at + 1:]]
    called_as = signature.replace(parameters=[*head, *_option_parameters(), *own])
    names = {each.name for each in _fields()}

    @functools.wraps(fn)
    def front_end(*args: Any, **kwargs: Any) -> R:
        given = called_as.bind(*args, **kwargs).arguments
        options = declared.MemwatchOptions(**{k: v for k, v in given.items() if k in names})
        rest = {k: v for k, v in given.items() if k not in names}
        return fn(*(rest.pop(p.name) for p in head), options, **rest)

    front_end.__signature__ = called_as  # type: ignore[attr-defined]
    return front_end


def option_flags(where: str = "magic") -> Iterator[tuple[tuple[str, ...], dict[str, Any]]]:
    """(flags, keywords) of `argparse.add_argument` for each option a front end takes as a flag: every one
    for the magic (`where="magic"`, the values as text), those `watch` takes for it (`where="watch"`, parsed by
    argparse); the parsed namespace has each under its field's name (`from_parsed`)."""
    for each in _fields():
        spec = declared.spec_of(each)
        if spec.flag is None or (where == "watch" and not spec.in_watch):
            continue
        flags = (spec.short, spec.flag) if spec.short else (spec.flag,)
        keywords: dict[str, Any] = {"dest": each.name, "help": spec.help.replace("%", "%%"), "default": each.default}
        if isinstance(each.default, bool):
            keywords["action"] = "store_false" if spec.negated else "store_true"
        else:
            keywords["metavar"] = spec.metavar
            # the magic's text is parsed when its MemwatchOptions is made, which says what is wrong in one line
            if spec.from_text is not None and where == "watch":
                keywords["type"] = _argparse_type(spec.from_text)
        yield flags, keywords


def _argparse_type(from_text: Callable[[str], Any]) -> Callable[[str], Any]:
    """`from_text` whose ValueError argparse shows as the message itself (not "invalid value")."""
    import argparse

    def parse(text: str) -> Any:
        try:
            return from_text(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = getattr(from_text, "__name__", "value")
    return parse


def from_parsed(parsed: Any, where: str = "magic") -> declared.MemwatchOptions:
    """The MemwatchOptions of a parsed command line (`option_flags(where)`'s flags)."""
    taken = {flags_dest["dest"] for _, flags_dest in option_flags(where)}
    return declared.MemwatchOptions(**{name: getattr(parsed, name) for name in taken})
