"""Read a spec file into a validated `Spec`, turning every problem into a `SpecError` with a span.

Pydantic reports errors by location (a path of keys and indices); the YAML source map turns the
path into file:line:col. Unknown keys get a "did you mean" from the fields of the model at that
place, the way SkyPilot's schema errors do.
"""

from __future__ import annotations

import types
import typing
from pathlib import Path

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from hetcompile.errors import Span, SpecError, did_you_mean
from hetcompile.ir.spec import MeasuredProfile, Spec
from hetcompile.ir.yaml_spans import SourceMap, decode, load_yaml


def _unwrap(tp: object) -> list[object]:
    """The concrete types inside Annotated / Optional / Union / tuple / list annotations."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        return _unwrap(typing.get_args(tp)[0])
    if origin in (typing.Union, types.UnionType):
        return [t for a in typing.get_args(tp) for t in _unwrap(a)]
    if origin in (tuple, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        return [t for a in args for t in _unwrap(a)]
    if origin is dict:
        return _unwrap(typing.get_args(tp)[1])
    return [tp]


def _model_at(root: type[BaseModel], loc: tuple) -> type[BaseModel] | None:
    """The pydantic model class that owns the mapping at `loc` (for did-you-mean)."""
    current: list[object] = [root]
    for part in loc:
        if isinstance(part, int):
            continue
        nxt: list[object] = []
        for cls in current:
            if isinstance(cls, type) and issubclass(cls, BaseModel) and part in cls.model_fields:
                nxt.extend(_unwrap(cls.model_fields[part].annotation))
        current = nxt
    for cls in current:
        if isinstance(cls, type) and issubclass(cls, BaseModel):
            return cls
    return None


def _clean_loc(loc: tuple, data: object) -> tuple:
    """`loc` as a path into `data`: pydantic puts union-member tags ('MeasuredProfile', 'str',
    'function-before[...]') into locations; a part that is not a key or index of the data there is
    such a tag, unless it is the last part (the key a `missing` error names)."""
    out, cur = [], data
    for i, part in enumerate(loc):
        if isinstance(cur, dict) and part in cur:
            out.append(part)
            cur = cur[part]
        elif isinstance(cur, list) and isinstance(part, int) and 0 <= part < len(cur):
            out.append(part)
            cur = cur[part]
        elif i == len(loc) - 1 and not (isinstance(part, str) and (part[:1].isupper() or "[" in part or part == "str")):
            out.append(part)
    return tuple(out)


def _describe(err: ErrorDetails) -> str:
    msg = str(err.get("msg", "invalid value"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix):]
    return msg


def validation_to_spec_error(exc: ValidationError, smap: SourceMap, root: type[BaseModel], data: object) -> SpecError:
    """The first pydantic error as a SpecError pointing at the YAML (`data`: what was validated)."""
    errors = exc.errors()
    # prefer an unknown-key error: it is usually the cause of the others
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = _clean_loc(tuple(err["loc"]), data)
    field = ".".join(str(p) for p in loc) or "<root>"
    if err["type"] == "extra_forbidden" and loc:
        key = loc[-1]
        owner = _model_at(root, loc[:-1])
        known = list(owner.model_fields) if owner else []
        guess = did_you_mean(str(key), known)
        msg = f"unknown key {key!r}" + (f"; did you mean {guess!r}?" if guess else "")
        hint = f"allowed keys here: {', '.join(known)}" if known else None
        return SpecError(msg, smap.key(loc), hint=hint)
    if err["type"] == "missing" and loc:
        owner = _model_at(root, loc[:-1])
        desc = ""
        if owner is not None and loc[-1] in owner.model_fields:
            desc = owner.model_fields[loc[-1]].description or ""
        return SpecError(
            f"missing required key {loc[-1]!r} in {'.'.join(str(p) for p in loc[:-1]) or 'the spec'}",
            smap.value(loc[:-1]),
            hint=f"add `{loc[-1]}:` ({desc})" if desc else f"add `{loc[-1]}:`",
        )
    if err["type"] == "literal_error" and loc:
        allowed = [str(v).strip("'") for v in str(err.get("ctx", {}).get("expected", "")).replace(" or ", ", ").split(", ") if v]
        given = str(err.get("input", ""))
        alias = ALIASES.get(given.lower())
        guess = alias if alias in allowed else did_you_mean(given, allowed)
        return SpecError(f"{field}: {given!r} is not one of {', '.join(allowed)}" + (f"; did you mean {guess!r}?" if guess else ""),
                         smap.value(loc))
    return SpecError(f"{field}: {_describe(err)}", smap.value(loc))


# names people write for a choice that spelling distance does not find
ALIASES = {"k8s": "kubernetes", "kube": "kubernetes", "amazon": "aws", "google": "gcp", "microsoft": "azure",
           "digitalocean": "do", "oracle": "oci", "min_cost": "min-cost", "max_throughput": "max-throughput"}


def read_spec(path: Path) -> tuple[Spec, SourceMap, bytes]:
    """Parse and validate a spec file. Returns the spec, its source map and the raw bytes (for hashing)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SpecError(f"cannot read spec {str(path)!r}: {exc.strerror}") from None
    data, smap = load_yaml(decode(raw, str(path)), str(path))
    if not isinstance(data, dict):
        raise SpecError("a spec must be a YAML mapping with keys name, models, workloads, regions",
                        smap.value(()) or Span(str(path), 1, 1))
    try:
        spec = Spec.model_validate(data)
    except ValidationError as exc:
        raise validation_to_spec_error(exc, smap, Spec, data) from None
    return spec, smap, raw


def read_profiles(path: Path, where: Span | None = None,
                  kind: type[BaseModel] = MeasuredProfile) -> tuple[list, SourceMap]:
    """A profiles file: a YAML list of `kind` entries (same keys as the inline entries); `where` is
    the spec entry that names it, for errors about the file itself."""
    try:
        path = path.resolve()
        raw = path.read_bytes()
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        why = getattr(exc, "strerror", None) or str(exc)
        raise SpecError(f"cannot read profiles file {str(path)[:200]!r}: {why}", where,
                        hint="a profiles entry is a path relative to the spec, or an inline profile") from None
    data, smap = load_yaml(decode(raw, str(path)), str(path))
    if not isinstance(data, list):
        raise SpecError("a profiles file must be a YAML list of profiles", smap.value(()) or Span(str(path), 1, 1))
    out = []
    for i, item in enumerate(data):
        try:
            out.append(kind.model_validate(item))
        except ValidationError as exc:
            err = validation_to_spec_error(exc, _Shifted(smap, (i,)), kind, item)
            raise err from None
    return out, smap


class _Shifted(SourceMap):
    """A view of a source map with a path prefix, for validating one list item on its own."""

    def __init__(self, base: SourceMap, prefix: tuple):
        super().__init__(file=base.file, lines=base.lines, values=base.values, keys=base.keys)
        self._prefix = prefix

    def value(self, path: tuple) -> Span | None:
        return super().value(self._prefix + tuple(path))

    def key(self, path: tuple) -> Span | None:
        return super().key(self._prefix + tuple(path))
