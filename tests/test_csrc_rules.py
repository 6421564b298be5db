"""The rule of csrc/common.h, enforced: no number is streamed into a TORCH_CHECK message. Streaming a number (or an
ArrayRef) from inside the library runs its own copy of libstdc++'s num_put, which crashed the process once; numbers
go through ``text(...)`` (or into a ``std::string`` by ``std::to_string``). Each message argument of every
``TORCH_CHECK*`` call must be a string literal, ``text(...)``, a ``ScalarType`` or ``Device`` (``.scalar_type()``,
``.device()``, or a name declared with that type), a ``const char*``/``std::string`` name, or a ``std::string``
built with ``+``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "csrc"
_CALL = re.compile(r"\b(TORCH_CHECK\w*)\s*\(")
_LITERALS = re.compile(r'("([^"\\]|\\.)*"\s*)+')
_SAFE_TYPES = r"(?:const\s+char\s*\*|std::string(?:_view)?|(?:at|c10)::ScalarType|(?:at|c10)::Device)"


def call_arguments(source: str, start: int) -> list[str]:
    """The top-level arguments of the call whose opening parenthesis ends at ``start``."""
    depth, arguments, current, index, quote = 0, [], [], start, None
    while index < len(source):
        char = source[index]
        current.append(char)
        if quote:
            if char == "\\":
                current.append(source[index + 1])
                index += 1
            elif char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                arguments.append("".join(current[:-1]).strip())
                return arguments
            depth -= 1
        elif char == "," and depth == 0:
            arguments.append("".join(current[:-1]).strip())
            current = []
        index += 1
    raise ValueError(f"unbalanced call at offset {start}")


def unsafe_message_arguments(source: str) -> list[str]:
    """The message arguments of ``source``'s TORCH_CHECK calls that may stream a number."""
    unsafe = []
    for match in _CALL.finditer(source):
        if source[: match.start()].rstrip().endswith("#define"):
            continue
        for argument in call_arguments(source, match.end())[1:]:
            argument = " ".join(argument.split())
            name = re.fullmatch(r"\w+", argument)
            declared_safe = name and re.search(rf"{_SAFE_TYPES}\s*&?\s*\b{argument}\b", source)
            if (_LITERALS.fullmatch(argument) or argument.startswith("text(") or declared_safe
                    or re.search(r"\.(scalar_type|device)\(\)$", argument)
                    or (" + " in argument and ('"' in argument or "std::to_string" in argument))):
                continue
            unsafe.append(argument)
    return unsafe


SOURCES = sorted(p for p in CSRC.rglob("*") if p.suffix in (".cpp", ".cu", ".h", ".cuh"))


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(CSRC)))
def test_no_number_is_streamed_into_a_check_message(path):
    assert unsafe_message_arguments(path.read_text()) == [], path


def test_the_rule_finds_streamed_numbers():
    source = '''
    void f(const at::Tensor& x, int64_t n, const char* op, at::ScalarType dtype) {
      TORCH_CHECK(n > 0, op, ": n must be positive, got ", n);
      TORCH_CHECK_VALUE(x.dim() == 2, "x must be 2-D, got ", x.dim(), " dims, ", x.sizes());
      TORCH_CHECK_TYPE(x.scalar_type() == dtype, op, ": dtype ", x.scalar_type(), " != ", dtype, text(n));
      TORCH_CHECK(x.numel() < 5, "too many: " + std::to_string(x.numel()));
    }'''
    assert unsafe_message_arguments(source) == ["n", "x.dim()", "x.sizes()"]
    assert len(SOURCES) > 10  # the tree was found
