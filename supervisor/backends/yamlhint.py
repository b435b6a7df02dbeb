"""What a YAML syntax error probably means, in words a person fixing the file can act on.

PyYAML says *what* broke ("mapping values are not allowed here"); this adds the likely cause,
looking at the offending line itself: a tab, an indentation that does not match, a missing
space after a colon, an unclosed quote.
"""

from __future__ import annotations


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def explain(problem: str, lines: list[str], line: int | None, column: int | None) -> str:
    """A short hint for ``problem`` at 1-based ``line`` (``column`` 0-based), or ''."""
    text = lines[line - 1] if line is not None and 0 < line <= len(lines) else ""
    before = lines[line - 2] if line is not None and 1 < line <= len(lines) else ""
    lead = text[: len(text) - len(text.lstrip())]
    if "\t" in lead or "'\\t'" in problem or "\\t" in problem:
        col = text.find("\t") + 1
        return (f"a tab at column {col}: YAML indents with spaces only; replace it with "
                "spaces")
    if "mapping values are not allowed" in problem:
        if text.count(": ") > 1:
            return ("this line has a second ': ' — put the value in quotes, e.g. "
                    "description: \"a: b\"")
        if before and _indent(text) > _indent(before) and not before.rstrip().endswith(":"):
            return ("this line is indented deeper than the one above, which is not a "
                    "mapping: line them up, or end the line above with ':'")
        return "probably an indentation that does not match the lines around it"
    if "could not find expected ':'" in problem:
        return "a key without ':' after it (or a quote that is not closed)"
    if "expected <block end>" in problem or "did not find expected key" in problem:
        return ("the indentation of this line does not match the lines above it (keys of one "
                "mapping must start in the same column)")
    if "found unexpected end of stream" in problem or "found unexpected end" in problem:
        return "a quote or a bracket that is not closed"
    if "expected ',' or ']'" in problem or "expected ',' or '}'" in problem:
        return "a list [ ] or mapping { } that is not closed, or a missing comma"
    if "found undefined alias" in problem or "found unhashable key" in problem:
        return "a value starting with '*' or '{' must be quoted"
    if "found character '@'" in problem or "found character '`'" in problem:
        return "a value starting with @ or ` must be quoted"
    return ""
