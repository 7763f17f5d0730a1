"""Session traces: export a conversation as JSONL and read one back for replay, with no model.

Line 1 is a header {"type": "trace", "version", "engine": {...}}; each turn is a
{"type": "turn", ...} line followed by its {"type": "event", "turn": i, "event": {...}} lines.
Reading is strict: size limits first, then json.loads per line (never pickle or eval), then every
field we use is type-checked; unknown fields are dropped. File paths are never written: a turn keeps
only its attachments' names and kinds, and a replayed trace serves no file.
"""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass

from .session import DEFAULT_SETTINGS, Session, Turn

VERSION = 1
MAX_BYTES = 32 << 20
MAX_LINE_BYTES = 1 << 20
MAX_TURNS = 1000
MAX_EVENTS = 400_000
MAX_TEXT = 200_000
MAX_LIST = 4096
MAX_ACCEPTED = 64                                  # drafts per step are 1..8 today; leave room
GROUP_NAME = re.compile(r"[A-Za-z0-9_]{1,40}")     # cache group names become plot labels


class TraceError(ValueError):
    """A trace that cannot be read; the message names the line and what is wrong."""


@dataclass
class Trace:
    engine: dict
    turns: list[Turn]


def export_lines(session: Session, engine_info: dict) -> list[str]:
    header = {"type": "trace", "version": VERSION, "app": "inkling-playground", "exported_at": time.time(),
              "engine": engine_info}
    lines = [json.dumps(header)]
    for i, turn in enumerate(session.turns):
        lines.append(json.dumps({"type": "turn", "index": i, "user_text": turn.user_text,
                                 "files": [{"name": f["name"], "kind": f["kind"]} for f in turn.files],
                                 "settings": turn.settings, "sent_at": turn.sent_at, "notice": turn.notice}))
        lines += [json.dumps({"type": "event", "turn": i, "event": e}) for e in turn.events]
    return lines


# -- reading -------------------------------------------------------------------------------------
def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _ints(v) -> bool:
    return isinstance(v, list) and len(v) <= MAX_LIST and all(_int(x) for x in v)


def _str(v) -> bool:
    return isinstance(v, str) and len(v) <= MAX_TEXT


def _opt(check):
    return lambda v: v is None or check(v)


def _strs(v) -> bool:
    return isinstance(v, (list, tuple)) and len(v) <= MAX_LIST and all(_str(x) for x in v)


def _probs(v) -> bool:
    return isinstance(v, list) and len(v) <= MAX_LIST and all(_num(x) for x in v)


def _rates(v) -> bool:
    return isinstance(v, list) and len(v) <= MAX_LIST and all(x is None or _num(x) for x in v)


def _groups(v) -> bool:
    """kv.groups: plain names (they become plot labels) to {"used", "total"} numbers."""
    return isinstance(v, dict) and len(v) <= 16 and all(
        isinstance(name, str) and GROUP_NAME.fullmatch(name) and isinstance(g, dict) and g.keys() == {"used", "total"}
        and _num(g["used"]) and _num(g["total"]) for name, g in v.items())


# a dict value is a nested object, checked (and stripped of unknown fields) the same way
SPEC_FIELDS = {"method": _str, "num_spec_tokens": _int, "num_drafts": _int, "num_draft_tokens": _int,
               "num_accepted_tokens": _int, "num_accepted_tokens_per_pos": _ints, "num_drafted_per_pos": _ints,
               "accepted_histogram": _ints, "mean_acceptance_length": _opt(_num), "acceptance_rate": _opt(_num),
               "unconditional_acceptance_per_pos": _rates, "conditional_acceptance_per_pos": _rates}
KV_FIELDS = {"groups": _groups, "conv_state": {"used": _int, "total": _int}, "use_fraction": _num, "block_size": _int,
             "cached_free_blocks": _int, "prefix_hit_blocks": _int, "prefix_hit_rate": _num, "preemptions": _int}
EVENT_FIELDS = {
    "Started": {"request_id": _str, "prompt_tokens": _int, "image_tokens": _int, "audio_tokens": _int,
                "cached_tokens": _int, "notes": _strs},
    "Step": {"request_id": _str, "step": _int, "drafted": _ints, "accepted": _int, "emitted": _ints, "text": _str,
             "time": _num, "emitted_text": _strs, "drafted_text": _strs, "draft_probs": _probs},
    "Metrics": {"time": _num, "tokens_per_s": _num, "running": _int, "waiting": _int, "kv": KV_FIELDS,
                "spec": SPEC_FIELDS},
    "Finished": {"request_id": _str, "reason": _str,
                 "usage": {"prompt_tokens": _int, "completion_tokens": _int, "cached_tokens": _int},
                 "spec_summary": SPEC_FIELDS,
                 "timings": {"ttft_s": _opt(_num), "decode_s": _opt(_num), "total_s": _opt(_num),
                             "tokens_per_s": _opt(_num)}},
    "Error": {"request_id": _str, "message": _str},
}
REQUIRED = {"Started": {"request_id", "prompt_tokens"},
            "Step": {"request_id", "step", "drafted", "accepted", "emitted", "text", "time"},
            "Metrics": {"time", "tokens_per_s", "running", "waiting", "kv"},
            "Finished": {"request_id", "reason"}, "Error": {"request_id", "message"}}
SETTINGS_FIELDS = {"temperature": _num, "top_p": _num, "top_k": _int, "seed": _opt(_int), "max_tokens": _int,
                   "spec_method": _str, "num_spec_tokens": _int, "reasoning_effort": _opt(_num),
                   "system_prompt": _str}


def _checked(obj: dict, fields: dict, required: set, where: str) -> dict:
    missing = required - obj.keys()
    if missing:
        raise TraceError(f"{where}: missing {', '.join(sorted(missing))}.")
    out = {}
    for key, check in fields.items():
        if key not in obj:
            continue
        if isinstance(check, dict):
            if not isinstance(obj[key], dict):
                raise TraceError(f"{where}: field {key!r} must be an object.")
            out[key] = _checked(obj[key], check, set(), f"{where}, {key}")
        elif check(obj[key]):
            out[key] = obj[key]
        else:
            raise TraceError(f"{where}: field {key!r} has the wrong type or is too long.")
    return out


def _event(obj, where: str) -> dict:
    kind = obj.get("type") if isinstance(obj, dict) else None
    if kind not in EVENT_FIELDS:
        raise TraceError(f"{where}: unknown event type {kind!r}.")
    event = {"type": kind, **_checked(obj, EVENT_FIELDS[kind], REQUIRED[kind], where)}
    if kind == "Step" and not 0 <= event["accepted"] <= MAX_ACCEPTED:
        raise TraceError(f"{where}: 'accepted' must be between 0 and {MAX_ACCEPTED}.")
    if kind == "Metrics" and "groups" not in event["kv"]:
        raise TraceError(f"{where}: kv.groups is missing.")
    return event


def _turn(obj: dict, where: str) -> Turn:
    if obj.get("index") is not None and not _int(obj["index"]):
        raise TraceError(f"{where}: 'index' must be a whole number.")
    fields = _checked(obj, {"user_text": _str, "files": lambda v: isinstance(v, list) and len(v) <= 64,
                            "settings": lambda v: isinstance(v, dict), "sent_at": _opt(_num), "notice": _opt(_str)},
                      {"user_text", "settings"}, where)
    files = []
    for f in fields.get("files", []):
        if not (isinstance(f, dict) and _str(f.get("name")) and f.get("kind") in ("image", "audio", None)):
            raise TraceError(f"{where}: each file needs a 'name' and a 'kind' (image or audio).")
        files.append({"path": None, "name": f["name"], "kind": f["kind"]})
    settings = {**DEFAULT_SETTINGS, **_checked(fields["settings"], SETTINGS_FIELDS, set(), where + " settings")}
    return Turn(user_text=fields["user_text"], files=files, settings=settings, sent_at=fields.get("sent_at"),
                notice=fields.get("notice"))


def parse(data: bytes) -> Trace:
    """Read a trace exported by `export_lines`; raises TraceError with a fix-it sentence."""
    if len(data) > MAX_BYTES:
        raise TraceError(f"The trace is {len(data) / 2**20:.1f} MB; the limit is {MAX_BYTES >> 20} MB.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise TraceError("The trace is not UTF-8 text; load a .jsonl file exported by this playground.") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise TraceError("The trace is empty; load a .jsonl file exported by this playground.")
    if len(lines) > MAX_TURNS + MAX_EVENTS + 1:
        raise TraceError(f"The trace has {len(lines):,} lines; the limit is {MAX_TURNS + MAX_EVENTS + 1:,}.")
    objects = []
    for number, line in enumerate(lines, 1):
        if len(line) > MAX_LINE_BYTES:
            raise TraceError(f"Line {number} is longer than {MAX_LINE_BYTES >> 10} KB.")
        try:
            obj = json.loads(line, parse_constant=lambda c, number=number: _reject_constant(c, number))
        except json.JSONDecodeError as exc:
            raise TraceError(f"Line {number} is not valid JSON ({exc.msg}).") from None
        if not isinstance(obj, dict):
            raise TraceError(f"Line {number} must be a JSON object.")
        objects.append(obj)
    header = objects[0]
    if header.get("type") != "trace" or header.get("version") != VERSION:
        raise TraceError(f"Line 1 is not a version-{VERSION} trace header; load a .jsonl file exported by this "
                         "playground.")
    engine = header.get("engine") if isinstance(header.get("engine"), dict) else {}
    engine = _checked(engine, {"model": _str, "backend": _str, "device": _str, "dtype": _str}, set(), "Line 1")
    turns: list[Turn] = []
    for number, obj in enumerate(objects[1:], 2):
        where = f"Line {number}"
        if obj.get("type") == "turn":
            if len(turns) >= MAX_TURNS:
                raise TraceError(f"The trace has more than {MAX_TURNS} turns.")
            turns.append(_turn(obj, where))
        elif obj.get("type") == "event":
            if not turns or obj.get("turn") != len(turns) - 1:
                raise TraceError(f"{where}: an event must follow its turn (turn {len(turns) - 1}).")
            turns[-1].events.append(_event(obj.get("event"), where))
        else:
            raise TraceError(f"{where}: unknown line type {obj.get('type')!r}; expected 'turn' or 'event'.")
    return Trace(engine, turns)


def _reject_constant(name: str, number: int):
    raise TraceError(f"Line {number} holds {name}, which is not a number a trace may contain.")
