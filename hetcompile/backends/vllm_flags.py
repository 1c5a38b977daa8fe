"""Validate a `vllm serve` argv offline, against the pinned vLLM 0.33.0 flag table.

Importing vLLM needs torch and a 2.3 GB venv (docs/lowering_facts.md §5), so generated launch
commands are checked here in pure Python instead. The table
`hetcompile/data/vllm_serve_args_0.33.0.json` was dumped once from vLLM 0.33.0's own
`make_arg_parser` (321 argparse actions: option strings, nargs, type name, choices). On top of it:

- `FlexibleArgumentParser` rewrites are mirrored: `--a_b` means `--a-b`, `--flag.key v` and
  `-cc.key=v` set one key of a JSON flag, `-O3` means `--optimization-level 3`, and `--model X`
  is moved to the positional model.
- argparse rules are mirrored: `--flag=value`, multi-letter short options (`-tp 2`), nargs
  (0, None, '?', '+'), negative numbers as values, and `--` ending the options.
- `_ENUMS` is a small hand-kept table for string flags whose values vLLM checks only later, in
  pydantic (`CacheConfig`, `ParallelConfig`); the argparse table cannot know them.
- A value that contains `$` (`"$PORT"`, `${X}`, `$(cmd)`) is a shell expansion and opaque: its
  type and choices are not checked. A positional containing `$` may expand to several words
  (`$COMMON`), so it is not reported as an extra argument.
- Abbreviations (`--tensor-parallel` for `--tensor-parallel-size`) are accepted by argparse,
  but a generated script should not rely on them (a new flag can make them ambiguous), so they
  are reported.

`serve_argv_from_script` pulls every `vllm serve` command out of a bash script, so tests can
check what the backends emit.
"""

from __future__ import annotations

import difflib
import json
import re
import shlex
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Sequence

VLLM_VERSION = "0.33.0"
_TABLE_FILE = f"vllm_serve_args_{VLLM_VERSION}.json"

# String-typed flags whose values vLLM validates only after parsing (docs/lowering_facts.md §4).
# Exact names are vLLM 0.32's `CacheDType`; 0.33 adds turboquant_*/octave_* variants, so those
# families are accepted by prefix.
_ENUMS: dict[str, frozenset[str]] = {
    "kv_cache_dtype": frozenset({
        "auto", "float16", "bfloat16",
        "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "nvfp4_ds_mla",
        "turboquant_k8v4", "turboquant_4bit_nc", "turboquant_k3v4_nc", "turboquant_3bit_nc",
        "ultraquant_4bit",
        "int4_per_token_head", "int8_per_token_head", "fp8_per_token_head",
        "nvfp4", "nvfp4_4over6",
    }),
    "distributed_executor_backend": frozenset({"ray", "mp", "uni", "external_launcher"}),
}
_ENUM_PREFIXES: dict[str, tuple[str, ...]] = {"kv_cache_dtype": ("turboquant_", "octave_")}

# Types whose values are JSON (objects): only these accept `--flag.key value`.
_JSON_TYPES = frozenset({"parse_dataclass", "loads", "union_dict_and_str", "_parse_type"})

# argparse: a token that looks like a negative number is a value, not an option.
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


@dataclass(frozen=True)
class _Flag:
    """One argparse action of `vllm serve`, as dumped from the 0.33.0 parser."""

    options: tuple[str, ...]
    dest: str
    kind: str
    nargs: int | str | None
    type: str | None
    choices: tuple[str, ...] | None

    @property
    def name(self) -> str:
        """The canonical spelling: the first long option."""
        return next((o for o in self.options if o.startswith("--")), self.options[0])


@lru_cache(maxsize=1)
def _table() -> dict[str, _Flag]:
    raw = json.loads(resources.files("hetcompile").joinpath("data").joinpath(_TABLE_FILE).read_text())
    table: dict[str, _Flag] = {}
    for action in raw["actions"]:
        if not action["options"]:
            continue  # the positional model_tag
        choices = action["choices"]
        flag = _Flag(
            options=tuple(action["options"]),
            dest=action["dest"],
            kind=action["kind"],
            nargs=action["nargs"],
            type=action["type"],
            choices=tuple(str(c) for c in choices) if choices is not None else None,
        )
        for option in flag.options:
            table[option] = flag
    # The dump leaves out argparse's own help action.
    table.setdefault("--help", _Flag(("--help", "-h"), "help", "_HelpAction", 0, None, None))
    table.setdefault("-h", table["--help"])
    return table


def known_flags() -> frozenset[str]:
    """Every option string `vllm serve` 0.33.0 accepts (long and short spellings)."""
    return frozenset(_table())


def _is_option(token: str) -> bool:
    """Mirror argparse's `_parse_optional`: does `token` start an option (not a value)?"""
    if not token.startswith("-") or token == "-":
        return False
    if token in _table() or token.split("=", 1)[0] in _table():
        return True
    if _NEGATIVE_NUMBER.match(token):
        return False
    return " " not in token


def _normalize(name: str) -> str:
    """FlexibleArgumentParser: `--a_b` means `--a-b` (only the part before a dot)."""
    if not name.startswith("--"):
        return name
    head, dot, tail = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + tail


def _did_you_mean(name: str) -> str:
    longs = sorted(o for o in _table() if o.startswith("--"))
    close = difflib.get_close_matches(name, longs, n=1, cutoff=0.75)
    return f"; did you mean {close[0]}?" if close else ""


def _check_human_int(value: str, *, auto: bool) -> str | None:
    value = value.strip()
    if auto and (value == "-1" or value.lower() == "auto"):
        return None
    match = _HUMAN_INT.fullmatch(value)
    if match:
        number, suffix = match.groups()
        if suffix.isupper() and "." in number:
            return f"decimals are not allowed with the binary suffix {suffix}"
        return None
    try:
        int(value)
    except ValueError:
        forms = "an integer like 4096, 4k, 2K" + (" or 'auto'" if auto else "")
        return f"expected {forms}"
    return None


def _check_value(flag: _Flag, option: str, value: str) -> list[str]:
    """Type and choices of one value; empty when fine or when the value is a shell expansion."""
    if "$" in value:
        return []
    where = f"{option} {value!r}"
    kind = flag.type
    if kind == "_optional_type" and value in ("", "None"):
        return []
    error: str | None = None
    if kind == "int":
        try:
            int(value)
        except ValueError:
            error = "expected an integer"
    elif kind == "float":
        try:
            float(value)
        except ValueError:
            error = "expected a number"
    elif kind in ("human_readable_int", "human_readable_int_or_auto"):
        error = _check_human_int(value, auto=kind.endswith("_or_auto"))
    elif kind in ("loads", "_parse_type"):  # the 0.33 `_parse_type` flags all wrap json.loads
        try:
            json.loads(value)
        except json.JSONDecodeError as exc:
            error = f"expected JSON ({exc.msg})"
    elif kind == "parse_dataclass" and not value.lstrip().startswith("{"):
        error = "expected a JSON object, e.g. '{\"key\": 1}' (or use " + option + ".key value)"
    if error:
        return [f"{where}: {error}"]
    if flag.choices is not None:
        canonical = value
        if kind == "int":
            canonical = str(int(value))
        if canonical not in flag.choices:
            shown = ", ".join(c for c in flag.choices if c != "None")
            return [f"{where}: invalid choice; choose from {shown}"]
    allowed = _ENUMS.get(flag.dest)
    if allowed is not None and value not in allowed:
        if not value.startswith(_ENUM_PREFIXES.get(flag.dest, ())):
            hint = difflib.get_close_matches(value, sorted(allowed), n=1)
            mean = f"; did you mean {hint[0]!r}?" if hint else ""
            return [f"{where}: not a value vLLM accepts (one of {', '.join(sorted(allowed))}){mean}"]
    return []


def _resolve(name: str) -> tuple[_Flag | None, str | None]:
    """Find the flag for an option name; second item is a problem (unknown/abbreviated)."""
    table = _table()
    if name in table:
        return table[name], None
    if name.startswith("--"):
        # argparse's allow_abbrev is on in vLLM's parser: a unique prefix is accepted.
        matches = sorted({table[o].name for o in table if o.startswith(name) and o.startswith("--")})
        if len(matches) == 1:
            return table[matches[0]], f"{name}: abbreviation of {matches[0]}; spell the flag out"
        if len(matches) > 1:
            return None, f"{name}: ambiguous option; could match {', '.join(matches[:5])}"
    return None, f"{name}: unknown flag for vllm serve {VLLM_VERSION}{_did_you_mean(name)}"


@dataclass
class _Scan:
    """check_serve_argv's walk over one argv: the position, what it found so far, the problems."""

    argv: list[str]
    i: int = 0
    problems: list[str] = field(default_factory=list)
    positionals: list[tuple[int, str]] = field(default_factory=list)  # (argv index, token)
    seen: dict[str, str] = field(default_factory=dict)  # dest -> the option that set it first
    model_flag: str | None = None
    has_config: bool = False
    served_name: bool = False

    def value_follows(self) -> bool:
        """The next token is a value (not an option, not `--`)."""
        return self.i < len(self.argv) and not _is_option(self.argv[self.i]) and self.argv[self.i] != "--"

    def take(self) -> str:
        self.i += 1
        return self.argv[self.i - 1]


def check_serve_argv(argv: Sequence[str]) -> list[str]:
    """Check the arguments that follow `vllm serve` against the 0.33.0 flag table.

    Returns human-readable problems, one per string, in argv order (empty when the argv is fine):
    unknown, ambiguous or abbreviated flags (with a did-you-mean), missing or extra values, bad
    choices, values that are not ints/floats/JSON where the flag needs one, values outside the
    hand-kept enums, flags given twice, and a missing or misplaced model.
    """
    scan = _Scan(list(argv))
    options_done = False
    while scan.i < len(scan.argv):
        token = scan.take()
        if options_done or not _is_option(token):
            scan.positionals.append((scan.i - 1, token))
        elif token == "--":
            options_done = True
        elif token.startswith("-O") and token not in _table():
            _optimization_level(scan, token)
        else:
            _option(scan, token)
    return scan.problems + _model_problems(scan)


def _optimization_level(scan: _Scan, token: str) -> None:
    """FlexibleArgumentParser: -O3, -O=3 and -O 3 mean --optimization-level 3."""
    level = token[3:] if token[2:3] == "=" else token[2:]
    if level:
        return
    if scan.i < len(scan.argv) and scan.argv[scan.i] in {"0", "1", "2", "3"}:
        scan.take()
    else:
        scan.problems.append("-O: expected an optimization level (0-3)")


def _option(scan: _Scan, token: str) -> None:
    """One option and its values: resolved against the table, recorded, its values checked."""
    name, has_eq, inline = token.partition("=")
    name = _normalize(name)
    base, dot, _subkey = name.partition(".")
    if dot:
        _dotted_option(scan, name, base, bool(has_eq))
        return
    flag, problem = _resolve(name)
    if problem:
        scan.problems.append(problem)
    if flag is None:
        # Skip the unknown flag's probable value so it is not reported again as a positional.
        if not has_eq and scan.i < len(scan.argv) and not _is_option(scan.argv[scan.i]):
            scan.take()
        return
    if flag.dest == "model":
        scan.model_flag = name
    scan.has_config |= flag.dest == "config"
    scan.served_name |= flag.dest == "served_model_name"
    if flag.kind not in ("_AppendAction", "_HelpAction"):
        if flag.dest in scan.seen:
            scan.problems.append(f"{name}: sets {flag.dest!r} again (already set by {scan.seen[flag.dest]})")
        scan.seen.setdefault(flag.dest, name)
    for value in _values(scan, flag, name, inline if has_eq else None):
        scan.problems.extend(_check_value(flag, name, value))


def _dotted_option(scan: _Scan, name: str, base: str, has_eq: bool) -> None:
    """`--flag.key value` / `-x.key=value`: vLLM folds these into `--flag '{"key": ...}'`."""
    flag, problem = _resolve(base)
    if problem:
        scan.problems.append(problem.replace(base, name, 1))
    if not has_eq:
        if scan.i < len(scan.argv):
            scan.take()
        else:
            scan.problems.append(f"{name}: expected a value")
    if flag is not None and flag.type not in _JSON_TYPES:
        scan.problems.append(f"{name}: {flag.name} is not a JSON flag, so it takes no .key form")


def _values(scan: _Scan, flag: _Flag, name: str, inline: str | None) -> list[str]:
    """The option's values, by its nargs (`inline`: the value after `=`, None without one)."""
    if flag.nargs == 0:
        if inline is not None:
            scan.problems.append(f"{name}: takes no value (got {inline!r})")
        return []
    if inline is not None:
        return [inline]
    values: list[str] = []
    if flag.nargs == "+":
        while scan.value_follows():
            values.append(scan.take())
        if not values:
            scan.problems.append(f"{name}: expected at least one value")
    elif scan.value_follows():
        values.append(scan.take())
    elif flag.nargs != "?":
        scan.problems.append(f"{name}: expected a value")
    return values


def _model_problems(scan: _Scan) -> list[str]:
    """The model: one positional (or the deprecated --model), first in the argv."""
    problems: list[str] = []
    literal = [(k, p) for k, p in scan.positionals if "$" not in p]
    first = scan.positionals[0] if scan.positionals else None
    if scan.model_flag is not None:
        problems.append(f"{scan.model_flag}: deprecated in `vllm serve`; give the model as the first positional argument")
        extra = literal
    else:
        extra = [(k, p) for k, p in literal if first is None or k != first[0]]
        if first is None and not scan.has_config:
            swallowed = " (a model after --served-model-name is read as another served name)" if scan.served_name else ""
            problems.append(f"no model: give it as the first positional argument of `vllm serve`{swallowed}")
        elif first is not None and first[0] != 0 and scan.served_name and not scan.has_config:
            problems.append(
                f"model {first[1]!r} is not the first argument; vLLM requires `vllm serve <model> ...` "
                "when --served-model-name is used"
            )
    for _, value in extra:
        problems.append(f"unexpected positional argument {value!r} (only the model is positional)")
    return problems


# ---------------------------------------------------------------------------------------------
# Finding `vllm serve` commands in a bash script.

_LEADING_WORDS = frozenset({"exec", "then", "else", "do", "{", "!", "nohup", "command", "time", "env"})
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
_REDIRECT = re.compile(r"\d*(?:&>>?|>>?&?|<&?|<<<?)")


def _simple_commands(text: str) -> list[str]:
    """Split a bash script into the raw text of its simple commands.

    Quote-aware; joins backslash-newline continuations; drops comments and redirections
    (`> log 2>&1`); splits at newlines, `;`, `&&`, `||`, `|` and `&` outside quotes and outside
    `$(...)`. Good enough for generated launch scripts; not a bash parser (no heredocs).
    """
    commands: list[str] = []
    current: list[str] = []
    quote: str | None = None
    depth = 0
    at_word_start = True
    i = 0
    n = len(text)

    def flush() -> None:
        chunk = "".join(current).strip()
        if chunk:
            commands.append(chunk)
        current.clear()

    while i < n:
        ch = text[i]
        if quote == "'":
            current.append(ch)
            quote = None if ch == "'" else quote
            i += 1
            continue
        if ch == "\\" and i + 1 < n:
            if text[i + 1] == "\n":
                i += 2  # line continuation
                continue
            current.append(text[i : i + 2])
            i += 2
            at_word_start = False
            continue
        if quote == '"':
            current.append(ch)
            if ch == '"':
                quote = None
            i += 1
            continue
        if ch in "'\"":
            quote = ch
            current.append(ch)
            at_word_start = False
            i += 1
            continue
        if ch == "$" and text[i + 1 : i + 2] == "(":
            depth += 1
            current.append("$(")
            i += 2
            continue
        if depth:
            depth += ch == "("
            depth -= ch == ")"
            current.append(ch)
            i += 1
            continue
        if ch == "#" and at_word_start:
            while i < n and text[i] != "\n":
                i += 1
            continue
        if at_word_start:
            match = _REDIRECT.match(text, i)
            if match and match.group(0).lstrip("0123456789"):
                # Drop the operator and its target word.
                i = match.end()
                while i < n and text[i] in " \t":
                    i += 1
                while i < n and not text[i].isspace() and text[i] not in ";&|":
                    i += 1
                continue
        if ch in "\n;|&()":
            flush()
            i += 1
            at_word_start = True
            continue
        current.append(ch)
        at_word_start = ch in " \t"
        i += 1
    flush()
    return commands


def serve_argv_from_script(text: str) -> list[list[str]]:
    """Every `vllm serve` command in a bash script, as the argv after `serve` (shlex-split).

    Handles backslash continuations, `exec`, `VAR=x` prefixes, `if ...; then` lines, `&&` chains
    and redirections. Shell expansions stay literal (`"$PORT"` becomes `$PORT`), which
    `check_serve_argv` treats as opaque.
    """
    found: list[list[str]] = []
    for command in _simple_commands(text):
        try:
            words = shlex.split(command, posix=True)
        except ValueError:
            continue  # unbalanced quotes: not a command we generated
        while words and (words[0] in _LEADING_WORDS or _ASSIGNMENT.match(words[0])):
            words.pop(0)
        if len(words) >= 2 and words[0].rsplit("/", 1)[-1] == "vllm" and words[1] == "serve":
            found.append(words[2:])
    return found
