"""Ollama's API shapes to and from OpenAI's, as pure functions: no engine, no HTTP.

Requests (Ollama → OpenAI): :func:`chat_request` (``/api/chat``), :func:`generate_request`
(``/api/generate``: a chat of one user message with its ``system``, or a completion for a
backend that speaks only ``completions``), :func:`embed_request` (``/api/embed`` and the
legacy ``/api/embeddings``).  ``options`` map to OpenAI's fields (``num_predict`` →
``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, the penalties; ``top_k``,
``min_p`` and ``repeat_penalty`` pass as the extra fields llama-server and vLLM read),
``format`` → ``response_format``, ``images`` (base64) → image parts, ``tools`` as they are.
A bad request raises :class:`ShapeError` (one line for the client).

Answers (OpenAI → Ollama): :class:`Reply` turns one answer into Ollama's, whole
(:meth:`Reply.whole`) or streamed (:meth:`Reply.chunk` per OpenAI chunk, then
:meth:`Reply.done`: the last line, ``done: true`` with ``done_reason`` and the counts), and
:func:`embed_reply` an embeddings answer; each is checked first, in one place
(:func:`check_answer`): what is not OpenAI's shape raises :class:`BadAnswer`, saying what came
(a 502).  :class:`ChunkReader` reads a job's chunks, whether each is one JSON object (a
worker) or raw bytes cut anywhere (a model server's SSE stream, or JSON body, passed on as
it came).  A model's own error — in OpenAI's, llama-server's, vLLM's or FastAPI's shape, or
the text of an answer whose status is not 2xx — is read by :func:`server_error` and
:func:`answer_error` as one bounded line.  Errors are Ollama's ``{"error": "…"}``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Mapping
from typing import Any

from ..textsafe import visible
from . import openai_fields

STREAMED_BY_DEFAULT = True  # Ollama streams unless the request says "stream": false
# Ollama option -> the OpenAI field it becomes.
OPTIONS = {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "stop": "stop",
           "frequency_penalty": "frequency_penalty", "presence_penalty": "presence_penalty",
           "top_k": "top_k", "min_p": "min_p", "repeat_penalty": "repeat_penalty",
           "num_predict": "max_tokens"}
_IMAGE_TYPES = (("iVBOR", "image/png"), ("/9j/", "image/jpeg"), ("R0lG", "image/gif"),
                ("UklGR", "image/webp"))
MAX_PENDING_BYTES = 1024 * 1024  # of an SSE line not yet ended (a server's malformed stream)


class ShapeError(ValueError):
    """An Ollama request that cannot be translated: the message says what to send."""


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat().replace("+00:00", "Z")


def error_body(message: str) -> dict[str, str]:
    return {"error": message}


def wants_stream(body: Mapping[str, Any]) -> bool:
    value = body.get("stream", STREAMED_BY_DEFAULT)
    if value is None:
        return STREAMED_BY_DEFAULT
    if not isinstance(value, bool):
        raise ShapeError(f"stream: true or false, not {json.dumps(value)[:40]}")
    return value


def model_of(body: Mapping[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise ShapeError("model: the name of a model (GET /api/tags lists them)")
    return model


# -- requests --------------------------------------------------------------------------------
def _image_url(b64: Any) -> dict[str, Any]:
    if not isinstance(b64, str) or not b64:
        raise ShapeError("images: each image is base64 text")
    if b64.startswith("data:"):
        return {"type": "image_url", "image_url": {"url": b64}}
    mime = next((m for prefix, m in _IMAGE_TYPES if b64.startswith(prefix)), "image/png")
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{b64}"}}


def _content(text: Any, images: Any) -> Any:
    if text is None:
        text = ""
    if not isinstance(text, str):
        raise ShapeError("content: a message's content is text")
    if not images:
        return text
    if not isinstance(images, list):
        raise ShapeError("images: a list of base64 images")
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}] if text else []
    return parts + [_image_url(i) for i in images]


class _ToolIds:
    """The ids that pair a conversation's tool calls with their results. Ollama's messages
    carry none (a result names its tool, ``tool_name``, at most); OpenAI's servers want each
    ``tool`` message's ``tool_call_id`` to be the ``id`` of a call made before it (vLLM's
    Mistral templates: 9 letters or digits). A call without an id gets ``call0000N``, the
    N-th of the conversation; a result without one answers the first call still unanswered
    of its tool's name, else the first still unanswered."""

    def __init__(self) -> None:
        self.made = 0
        self.open: list[tuple[str, str]] = []  # (id, tool name) of calls not yet answered

    def call(self, given: Any, name: str) -> str:
        self.made += 1
        call_id = given if isinstance(given, str) and given else f"call{self.made:05d}"
        self.open.append((call_id, name))
        return call_id

    def result(self, given: Any, name: str | None) -> str:
        if isinstance(given, str) and given:
            self.open = [c for c in self.open if c[0] != given]
            return given
        pick = next((c for c in self.open if c[1] == name), None) or \
            (self.open[0] if self.open else None)
        if pick is None:
            return name or ""
        self.open.remove(pick)
        return pick[0]


def _tool_calls_out(calls: Any, ids: _ToolIds) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise ShapeError("tool_calls: a list of {function: {name, arguments}}")
    out = []
    for call in calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ShapeError("tool_calls: each is {function: {name, arguments}}")
        args = fn.get("arguments", {})
        out.append({"id": ids.call(call.get("id"), fn["name"]), "type": "function",
                    "function": {"name": fn["name"], "arguments":
                                 args if isinstance(args, str) else json.dumps(args)}})
    return out


def _message(msg: Any, ids: _ToolIds) -> dict[str, Any]:
    if not isinstance(msg, Mapping) or not isinstance(msg.get("role"), str):
        raise ShapeError("messages: each is {role, content}")
    role = msg["role"]
    out: dict[str, Any] = {"role": role, "content": _content(msg.get("content"),
                                                             msg.get("images"))}
    if msg.get("tool_calls"):
        out["tool_calls"] = _tool_calls_out(msg["tool_calls"], ids)
    if role == "tool":
        name = msg.get("tool_name")
        name = str(name) if name else None
        out["tool_call_id"] = ids.result(msg.get("tool_call_id"), name)
        if name:
            out["name"] = name
    return out


def _options(body: Mapping[str, Any], out: dict[str, Any]) -> None:
    options = body.get("options") or {}
    if not isinstance(options, Mapping):
        raise ShapeError("options: a mapping such as {\"temperature\": 0.2}")
    for key, field in OPTIONS.items():
        value = options.get(key)
        if value is None:
            continue
        if isinstance(value, float) and math.isfinite(value) and \
                openai_fields.check(field, 1) is None and openai_fields.check(field, 0.5):
            value = int(value)  # a whole-number option sent as 100.0 (Ollama casts it)
        if key == "num_predict" and isinstance(value, int) and value < 0:
            continue  # -1: until the model stops
        if (what := openai_fields.check(field, value)) is not None:
            raise ShapeError(f"options.{key}: {what}")
        out[field] = value
    fmt = body.get("format")
    if fmt == "json":
        out["response_format"] = {"type": "json_object"}
    elif isinstance(fmt, Mapping):
        out["response_format"] = {"type": "json_schema",
                                  "json_schema": {"name": "response", "schema": dict(fmt)}}
    elif fmt not in (None, ""):
        raise ShapeError("format: \"json\", or a JSON schema")
    if body.get("tools"):
        if not isinstance(body["tools"], list):
            raise ShapeError("tools: a list of {type: function, function: {…}}")
        out["tools"] = list(body["tools"])


THINK_LEVELS = ("low", "medium", "high")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0,
             "h": 3600.0}
_GO_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
_GO_DURATION = re.compile(r"[-+]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:ns|us|µs|μs|ms|s|m|h))+")
MAX_KEEP_ALIVE_S = 1e12  # past this (a number of seconds, or a duration): for ever


def keep_alive_s(body: Mapping[str, Any]) -> float | None:
    """A request's ``keep_alive`` in seconds, read as Ollama reads it: a number of seconds or
    a Go duration (``"5m"``, ``"1h30m"``, ``"0ms"``, ``"0"``); negative: for ever (``inf``);
    None when not given. Anything else is refused, as Ollama refuses it."""
    value = body.get("keep_alive")
    if value is None or value == "":
        return None
    if isinstance(value, int) and not isinstance(value, bool):  # (any size: never float'd)
        return math.inf if value < 0 or value > MAX_KEEP_ALIVE_S else float(value)
    if isinstance(value, float) and not math.isnan(value):
        return math.inf if value < 0 or value > MAX_KEEP_ALIVE_S else value
    if isinstance(value, str) and len(value) <= 64:
        text = value.strip()
        if re.fullmatch(r"[0-9]{1,15}(?:\.[0-9]{1,9})?", text):  # seconds, as text
            return float(text)
        if _GO_DURATION.fullmatch(text):
            total = sum(float(n) * _GO_UNITS[u] for n, u in _GO_PART.findall(text))
            return math.inf if text.startswith("-") and total > 0 else total
    raise ShapeError('keep_alive: a duration ("5m", "1h", "0" to unload) or seconds')


def _think(body: Mapping[str, Any], out: dict[str, Any]) -> None:
    """Ollama's ``think`` for a chat: ``true``/``false`` as the chat template's
    ``enable_thinking`` (llama-server and vLLM pass ``chat_template_kwargs`` to the template:
    Qwen3's, DeepSeek's), a level (``"low"``…``"high"``: gpt-oss) as ``reasoning_effort``
    too. What the model thought comes back as ``thinking`` (its ``reasoning_content``)."""
    think = body.get("think")
    if think is None:
        return
    if think in THINK_LEVELS:
        out["reasoning_effort"] = think
        think = True
    if not isinstance(think, bool):
        raise ShapeError(f"think: true, false, or one of {', '.join(THINK_LEVELS)}")
    out["chat_template_kwargs"] = {"enable_thinking": think}


def _streaming(out: dict[str, Any], stream: bool) -> dict[str, Any]:
    out["stream"] = stream
    if stream:
        out["stream_options"] = {"include_usage": True}
    return out


def chat_request(body: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The OpenAI chat body of an ``/api/chat`` request (``model``: what to send as model)."""
    messages = body.get("messages") or []
    if not isinstance(messages, list):
        raise ShapeError("messages: a list of {role, content}")
    ids = _ToolIds()
    out: dict[str, Any] = {"model": model, "messages": [_message(m, ids) for m in messages]}
    _options(body, out)
    _think(body, out)
    return _streaming(out, wants_stream(body))


def generate_request(body: Mapping[str, Any], model: str, kind: str) -> dict[str, Any]:
    """The OpenAI body of an ``/api/generate`` request, for ``kind`` ``chat`` (a user
    message, after its ``system``) or ``completions`` (the prompt as it is)."""
    prompt = body.get("prompt") or ""
    if not isinstance(prompt, str):
        raise ShapeError("prompt: text")
    out: dict[str, Any] = {"model": model}
    if kind == "completions":
        out["prompt"] = prompt
        if isinstance(body.get("suffix"), str) and body["suffix"]:
            out["suffix"] = body["suffix"]
        if body.get("images"):
            raise ShapeError("images: this model speaks completions, which take no images")
    else:
        messages = []
        if isinstance(body.get("system"), str) and body["system"]:
            messages.append({"role": "system", "content": body["system"]})
        messages.append({"role": "user", "content": _content(prompt, body.get("images"))})
        out["messages"] = messages
        _think(body, out)
    _options(body, out)
    return _streaming(out, wants_stream(body))


def embed_request(body: Mapping[str, Any], model: str, *, legacy: bool = False
                  ) -> dict[str, Any] | None:
    """The OpenAI embeddings body of ``/api/embed`` (``input``: text or a list), or of the
    legacy ``/api/embeddings`` (``prompt``: one text); None when there is nothing to embed
    (``""``, ``[]``, no ``prompt``), which Ollama answers by loading the model.
    ``dimensions`` is not sent: Ollama cuts the vectors itself (:func:`embed_reply`)."""
    key = "prompt" if legacy else "input"
    value = body.get(key)
    if legacy and value is None:
        return None
    if isinstance(value, str):
        texts: Any = value if legacy or not value else [value]
    elif isinstance(value, list) and not legacy and all(isinstance(v, str) for v in value):
        texts = value
    else:
        raise ShapeError(f"{key}: the text to embed" + ("" if legacy else " (or a list)"))
    if not texts:
        return None
    embed_dimensions(body)  # (checked before the model runs)
    return {"model": model, "input": texts, "encoding_format": "float"}


def embed_dimensions(body: Mapping[str, Any]) -> int | None:
    """``/api/embed``'s ``dimensions``: how many of each vector's first numbers to keep."""
    value = body.get("dimensions")
    if value is None or value == 0:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ShapeError("dimensions: a whole number above 0, the length of each vector")
    return value


def _unit(vector: list[float]) -> list[float]:
    """``vector`` scaled to length 1 (as Ollama's ``/api/embed`` answers); 0 stays 0."""
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 and math.isfinite(norm) else vector


# -- answers ---------------------------------------------------------------------------------
MAX_ERROR_CHARS = 400  # of a model's error message passed on to the client
_SHOWN_CHARS = 60  # of a value quoted in an error


class BadAnswer(ValueError):
    """A model's answer that is not OpenAI's shape (a 502): the message says what came."""


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (ValueError, RecursionError):  # nested past printing
        return type(value).__name__


def _shown(value: Any) -> str:
    text = _json_text(value)
    return text if len(text) <= _SHOWN_CHARS else text[:_SHOWN_CHARS] + "…"


def _one_line(text: str) -> str:
    """A model's words as one line a terminal shows as they are, at most MAX_ERROR_CHARS."""
    text = " ".join(text[:MAX_ERROR_CHARS * 4].split())
    cut = text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"
    return visible(cut)


def _detail(detail: Any) -> str:
    """FastAPI's ``detail``: text, or a list of ``{loc, msg}``."""
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list):
        said = [(".".join(str(p) for p in d["loc"]) + ": " if isinstance(d.get("loc"), list)
                 else "") + d["msg"]
                for d in detail if isinstance(d, Mapping) and isinstance(d.get("msg"), str)]
        if said:
            return "; ".join(said)
    return _json_text(detail)


def server_error(data: Any) -> str | None:
    """The message of the error a model answered, one line, bounded: OpenAI's (and
    llama-server's) ``{"error": {"message": …}}`` or ``{"error": "…"}``, vLLM's
    ``{"object": "error", "message": …}``, FastAPI's ``{"detail": …}``; None when ``data``
    is no error."""
    if not isinstance(data, Mapping):
        return None
    err = data.get("error")
    if err is not None:
        said = err.get("message") if isinstance(err, Mapping) else err
        text = said if isinstance(said, str) and said else _json_text(err)
    elif data.get("object") == "error":
        said = data.get("message")
        text = said if isinstance(said, str) and said else _json_text(data)
    elif "detail" in data and "choices" not in data and "data" not in data:
        text = _detail(data["detail"])
    else:
        return None
    return _one_line(text) or "(an empty error)"


def answer_error(body: bytes, status: int) -> str:
    """What a model's answer of a status that is not 2xx says went wrong, as one bounded
    line: its error's message when it is one of the shapes :func:`server_error` reads, else
    its text."""
    try:
        said = server_error(json.loads(body)) if body else None
    except (ValueError, RecursionError):
        said = None
    if said is None:
        said = _one_line(body[:MAX_ERROR_CHARS * 4].decode("utf-8", "replace")) or "(no body)"
    return f"the model answered status {status}: {said}"


def _optional(value: Any, kinds: type | tuple[type, ...]) -> bool:
    return value is None or (isinstance(value, kinds) and not isinstance(value, bool))


def _message_problem(message: Mapping[str, Any], where: str, streamed: bool) -> str | None:
    for key in ("content", "reasoning_content", "reasoning"):
        if not _optional(message.get(key), str):
            return f"{where}.{key} is {_shown(message[key])}, not text"
    calls = message.get("tool_calls")
    if not _optional(calls, list):
        return f"{where}.tool_calls is {_shown(calls)}, not a list"
    for j, call in enumerate(calls or []):
        at = f"{where}.tool_calls[{j}]"
        if not isinstance(call, Mapping):
            return f"{at} is {_shown(call)}, not an object"
        fn = call.get("function")
        if not isinstance(fn, Mapping) and not (streamed and fn is None):
            return f"{at}.function is {_shown(fn)}, not an object"
        fn = fn or {}
        if not _optional(fn.get("name"), str):
            return f"{at}.function.name is {_shown(fn['name'])}, not text"
        if not _optional(fn.get("arguments"), (str, Mapping)):
            return f"{at}.function.arguments is {_shown(fn['arguments'])}, not text"
        if streamed and not _optional(call.get("index"), int):
            return f"{at}.index is {_shown(call['index'])}, not a number"
    return None


def _answer_problem(data: Any, openai: str, streamed: bool) -> str | None:
    if not isinstance(data, Mapping):
        return f"it is {_shown(data)}, not an object"
    choices = data.get("choices")
    if choices is None and not streamed:  # (a stream's usage chunk may have none)
        return "it has no choices"
    if not _optional(choices, list):
        return f"choices is {_shown(choices)}, not a list"
    part = "delta" if streamed else "message"
    for i, choice in enumerate(choices or []):
        where = f"choices[{i}]"
        if not isinstance(choice, Mapping):
            return f"{where} is {_shown(choice)}, not an object"
        if openai != "chat":
            if not _optional(choice.get("text"), str):
                return f"{where}.text is {_shown(choice['text'])}, not text"
            continue
        message = choice.get(part)
        if not _optional(message, Mapping):
            return f"{where}.{part} is {_shown(message)}, not an object"
        if (problem := _message_problem(message or {}, f"{where}.{part}", streamed)):
            return problem
    return None


def check_answer(data: Any, openai: str, *, streamed: bool) -> Mapping[str, Any]:
    """``data`` itself when it is an OpenAI answer of API ``openai`` (``chat`` or
    ``completions``) that :class:`Reply` can read: a whole one, or one chunk of a stream
    (``streamed``); else :class:`BadAnswer`, saying what is not.  The one place an answer's
    shape is checked: what reads it after trusts it."""
    problem = _answer_problem(data, openai, streamed)
    if problem is not None:
        raise BadAnswer(f"the model's answer is not an OpenAI {openai} answer: {problem}")
    return data  # type: ignore[no-any-return]


def _arguments(text: Any) -> Any:
    if not isinstance(text, str):
        return text if isinstance(text, Mapping) else {}
    try:
        value = json.loads(text) if text.strip() else {}
    except (ValueError, RecursionError):  # a model's text: nested past parsing is text too
        return {"arguments": text}
    return value if isinstance(value, Mapping) else {"value": value}


class Reply:
    """One Ollama answer built from OpenAI's (``kind``: ``chat`` or ``generate``; ``openai``:
    the OpenAI API it came from, ``chat`` or ``completions``).  Each answer or chunk is
    checked first (:func:`check_answer`: :class:`BadAnswer` when it is not OpenAI's)."""

    def __init__(self, kind: str, model: str, openai: str = "chat") -> None:
        self.kind = kind
        self.model = model
        self.openai = openai
        self.done_reason = "stop"
        self.usage: Mapping[str, Any] | None = None
        self.pieces = 0
        self.tools: dict[int, dict[str, Any]] = {}  # streamed tool calls, by index

    def line(self, done: bool, text: str = "", thinking: str = "",
              tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "created_at": now_iso()}
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if tool_calls:
                message["tool_calls"] = tool_calls
            out["message"] = message
        else:
            out["response"] = text
            if thinking:
                out["thinking"] = thinking
        out["done"] = done
        return out

    def _reason(self, finish: Any) -> None:
        if isinstance(finish, str) and finish:
            self.done_reason = "length" if finish == "length" else "stop"

    def _usage(self, data: Mapping[str, Any]) -> None:
        if isinstance(data.get("usage"), Mapping):
            self.usage = data["usage"]

    def whole(self, data: Any, total_ns: int) -> dict[str, Any]:
        """A non-streamed OpenAI answer (``chat.completion``/``text_completion``) as Ollama's."""
        data = check_answer(data, self.openai, streamed=False)
        self._usage(data)
        choice = data["choices"][0] if data["choices"] else {}
        self._reason(choice.get("finish_reason"))
        if self.openai != "chat":
            return self._finish(self.line(True, choice.get("text") or ""), total_ns)
        message = choice.get("message") or {}
        thinking = message.get("reasoning_content") or message.get("reasoning") or ""
        calls = [{"function": {"name": c["function"].get("name") or "",
                               "arguments": _arguments(c["function"].get("arguments"))}}
                 for c in message.get("tool_calls") or []]
        out = self.line(True, message.get("content") or "", thinking, calls or None)
        return self._finish(out, total_ns)

    def chunk(self, data: Any) -> list[dict[str, Any]]:
        """The lines of one streamed OpenAI chunk (none for a chunk with nothing to say)."""
        data = check_answer(data, self.openai, streamed=True)
        self._usage(data)
        lines = []
        for choice in data.get("choices") or []:
            self._reason(choice.get("finish_reason"))
            thinking = ""
            if self.openai == "chat":
                # (a server that answers a stream with one whole answer: its message)
                delta = choice.get("delta") or choice.get("message") or {}
                text = delta.get("content") or ""
                thinking = delta.get("reasoning_content") or delta.get("reasoning") or ""
                for call in delta.get("tool_calls") or []:
                    self._tool_piece(call)
            else:
                text = choice.get("text") or ""
            if text or thinking:
                self.pieces += 1
                lines.append(self.line(False, text, thinking))
        return lines

    def _tool_piece(self, call: Mapping[str, Any]) -> None:
        index = call.get("index")
        slot = self.tools.setdefault(len(self.tools) if index is None else index,
                                     {"name": "", "arguments": ""})
        fn = call.get("function") or {}
        if isinstance(fn.get("name"), str):
            slot["name"] += fn["name"]
        if isinstance(fn.get("arguments"), str):
            slot["arguments"] += fn["arguments"]

    def done(self, total_ns: int) -> list[dict[str, Any]]:
        """The last lines of a stream: the tool calls it made, if any, then ``done: true``."""
        lines = []
        if self.tools:
            calls = [{"function": {"name": t["name"], "arguments": _arguments(t["arguments"])}}
                     for _, t in sorted(self.tools.items())]
            lines.append(self.line(False, tool_calls=calls))
        lines.append(self._finish(self.line(True), total_ns))
        return lines

    def _finish(self, out: dict[str, Any], total_ns: int) -> dict[str, Any]:
        out["done_reason"] = self.done_reason
        out["total_duration"] = total_ns
        out["load_duration"] = 0
        usage = self.usage or {}
        if isinstance(usage.get("prompt_tokens"), int):
            out["prompt_eval_count"] = usage["prompt_tokens"]
        out["eval_count"] = usage["completion_tokens"] if isinstance(
            usage.get("completion_tokens"), int) else self.pieces
        return out


def load_reply(kind: str, model: str, reason: str) -> dict[str, Any]:
    """The answer to a request with nothing to generate: the model was loaded (``load``) or
    unloaded (``unload``), as Ollama says it."""
    out = Reply(kind, model).line(True)
    out["done_reason"] = reason
    return out


def _vector_problem(vector: Any) -> bool:
    return not isinstance(vector, list) or not all(
        isinstance(x, int | float) and not isinstance(x, bool) for x in vector)


def _embeddings_problem(data: Any) -> str | None:
    if not isinstance(data, Mapping):
        return f"it is {_shown(data)}, not an object"
    rows = data.get("data")
    if not isinstance(rows, list):
        return f"data is {_shown(rows)}, not a list"
    for i, row in enumerate(rows):
        if not isinstance(row, Mapping):
            return f"data[{i}] is {_shown(row)}, not an object"
        if _vector_problem(row.get("embedding")):
            return f"data[{i}].embedding is {_shown(row.get('embedding'))}, not a list of " \
                "numbers"
        if not _optional(row.get("index"), int):
            return f"data[{i}].index is {_shown(row['index'])}, not a number"
    return None


def embed_reply(data: Any, model: str, total_ns: int, *,
                legacy: bool = False, dimensions: int | None = None) -> dict[str, Any]:
    """An OpenAI embeddings answer as ``/api/embed``'s: each vector cut to ``dimensions``,
    then scaled to length 1, as Ollama's are (the legacy ``/api/embeddings`` gives the
    model's vector as it is); :class:`BadAnswer` when it is not one."""
    problem = _embeddings_problem(data)
    if problem is not None:
        raise BadAnswer(f"the model's answer is not an OpenAI embeddings answer: {problem}")
    rows = sorted(data["data"], key=lambda d: d.get("index") or 0)
    vectors = [d["embedding"] for d in rows]
    if legacy:
        return {"embedding": vectors[0] if vectors else []}
    vectors = [_unit(v[:dimensions] if dimensions else v) for v in vectors]
    out: dict[str, Any] = {"model": model, "embeddings": vectors, "total_duration": total_ns,
                           "load_duration": 0}
    usage = data.get("usage")
    if isinstance(usage, Mapping) and isinstance(usage.get("prompt_tokens"), int):
        out["prompt_eval_count"] = usage["prompt_tokens"]
    return out


class ChunkReader:
    """A job's streamed chunks as the JSON values they carry: a worker sends one JSON object
    per chunk; a model server's bytes come as they arrived, cut anywhere (``server``): SSE
    lines, or a JSON body (its error, say) in as many pieces, each put together again; what
    waits for its end is bounded (MAX_PENDING_BYTES)."""

    def __init__(self, *, server: bool = False) -> None:
        self.server = server
        self.buffer = b""
        self.sse: bool | None = None
        self.ended = False  # saw ``data: [DONE]``

    def feed(self, chunk: bytes) -> list[Any]:
        if self.sse is None:
            head = chunk.lstrip()[:5]
            if not head:
                return []
            self.sse = not head.startswith((b"{", b"["))  # a worker's chunk is JSON
        if not self.sse:
            return self._json(chunk)
        self.buffer += chunk
        out = []
        *lines, self.buffer = self.buffer.split(b"\n")
        if len(self.buffer) > MAX_PENDING_BYTES:
            self.buffer = b""  # a line without end: dropped, the stream goes on
        for raw in lines:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.ended = True
                continue
            try:
                out.append(json.loads(payload))
            except (ValueError, RecursionError):
                continue
        return out

    def _json(self, chunk: bytes) -> list[Any]:
        """A worker's chunk as the JSON it is; a server's piece of a JSON body with those
        before it that did not make one yet (the body once it does)."""
        if self.server:
            chunk = self.buffer + chunk
            self.buffer = b""
        try:
            return [json.loads(chunk)]
        except (ValueError, RecursionError):
            if self.server and len(chunk) <= MAX_PENDING_BYTES:
                self.buffer = chunk  # (not whole yet; past the limit: dropped)
            return []  # not JSON: nothing Ollama's shape can carry
