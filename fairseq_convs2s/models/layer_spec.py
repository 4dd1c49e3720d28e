"""Safe parsing of layer specs: the fconv syntax, without ``eval``.

A layer spec lists the convolution blocks as ``(width, kernel)`` or ``(width, kernel, residual)`` tuples, where
``residual`` is how many blocks back the residual connection reaches (1 = the previous block, 0 = none). fconv
``eval``s the string; here it is parsed with :mod:`ast` and only list/tuple literals of integers, ``+`` (concatenate)
and ``* n`` (repeat) are accepted, so ``"[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2"`` works and
``"__import__('os')"`` does not. The attention spec uses the same grammar with booleans: ``"True"``,
``"[False] * 2 + [True]"``.
"""

import ast
from typing import Any, Callable, List, NamedTuple, Union

from ..errors import InputError


class LayerSpecError(InputError):
    """A layer or attention spec that cannot be parsed or does not describe a valid model."""


class ConvLayer(NamedTuple):
    """One convolution block: output width d, kernel width k, residual lookback (0 = no residual)."""

    width: int
    kernel: int
    residual: int = 1


_SPEC_HELP = (
    "expected a list of (width, kernel) or (width, kernel, residual) tuples, optionally combined with + and * n, "
    'e.g. "[(512, 3)] * 9 + [(1024, 3)] * 4 + [(2048, 1)] * 2"'
)


def _literal(node: ast.AST, text: str) -> Any:
    """Evaluate the small literal grammar: int/bool constants, lists, tuples, list + list, list * int."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (bool, int)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _literal(node.operand, text)
        if isinstance(value, int) and not isinstance(value, bool):
            return -value
    if isinstance(node, ast.List):
        return [_literal(e, text) for e in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_literal(e, text) for e in node.elts)
    if isinstance(node, ast.BinOp):
        left, right = _literal(node.left, text), _literal(node.right, text)
        if isinstance(node.op, ast.Add) and isinstance(left, list) and isinstance(right, list):
            return _bounded(len(left) + len(right), text, lambda: left + right)
        if isinstance(node.op, ast.Mult):
            if isinstance(left, list) and _is_count(right):
                return _bounded(len(left) * right, text, lambda: left * right)
            if _is_count(left) and isinstance(right, list):
                return _bounded(left * len(right), text, lambda: left * right)
    raise LayerSpecError(f"unsupported expression {ast.get_source_segment(text, node)!r} in {text!r}")


# the most entries a spec's list may reach: far past any model (the presets have at most 20 blocks), and it keeps
# a typo such as "* 10000 * 10000" from building a list of 10^8 layers before anything is checked
MAX_ENTRIES = 10_000


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0  # (the product: _bounded)


def _bounded(entries: int, text: str, build: Callable[[], list]) -> list:
    """``build()``, a list of ``entries`` entries, unless that passes :data:`MAX_ENTRIES`."""
    if entries > MAX_ENTRIES:
        raise LayerSpecError(f"{text!r} has {entries} entries, more than {MAX_ENTRIES}")
    return build()


_ATTENTION_HELP = 'expected True, False or a list of booleans, one per decoder layer, e.g. "[False] * 2 + [True]"'


def _parse(text: str, flag: str, expected: str) -> Any:
    if not isinstance(text, str) or not text.strip():
        raise LayerSpecError(f"{flag}: empty spec; {expected}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise LayerSpecError(f"{flag}: cannot parse {text!r} ({e.msg}); {expected}") from None
    try:
        return _literal(tree.body, text.strip())
    except LayerSpecError as e:
        raise LayerSpecError(f"{flag}: {e}; {expected}") from None


def parse_layer_spec(text: str, flag: str = "--encoder-layers") -> List[ConvLayer]:
    """Parse a conv layer spec into a list of :class:`ConvLayer`; raise :class:`LayerSpecError` with the flag name."""
    value = _parse(text, flag, _SPEC_HELP)
    if isinstance(value, tuple):  # a single layer given without brackets
        value = [value]
    if not isinstance(value, list) or not value:
        raise LayerSpecError(f"{flag}: {text!r} describes no layers; {_SPEC_HELP}")
    layers = []
    for i, item in enumerate(value):
        if not isinstance(item, tuple) or len(item) not in (2, 3) or not all(_is_int(x) for x in item):
            raise LayerSpecError(f"{flag}: layer {i} is {item!r}; {_SPEC_HELP}")
        layer = ConvLayer(*item)
        if layer.width < 1 or layer.kernel < 1:
            raise LayerSpecError(f"{flag}: layer {i} {item!r} needs width >= 1 and kernel >= 1")
        # a residual reaches back at most to the block input (i + 1 outputs exist before block i's output)
        if not 0 <= layer.residual <= i + 1:
            raise LayerSpecError(
                f"{flag}: layer {i} {item!r} has residual lookback {layer.residual}; it must be between 0 and {i + 1}"
            )
        layers.append(layer)
    return layers


def parse_attention_values(text: Union[str, bool], flag: str = "--decoder-attention") -> Union[bool, List[bool]]:
    """Parse ``"True"``/``"False"`` or a list of booleans (the syntax alone; the count needs the layers)."""
    value = text if isinstance(text, bool) else _parse(text, flag, _ATTENTION_HELP)
    if not isinstance(value, bool) and not (isinstance(value, list) and all(isinstance(v, bool) for v in value)):
        raise LayerSpecError(f"{flag}: {_ATTENTION_HELP}, got {text!r}")
    return value


def parse_attention_spec(text: Union[str, bool], num_layers: int, flag: str = "--decoder-attention") -> List[bool]:
    """Parse ``"True"``/``"False"`` or a list of booleans, one per decoder layer."""
    value = parse_attention_values(text, flag)
    if isinstance(value, bool):
        value = [value] * num_layers
    if len(value) != num_layers:
        raise LayerSpecError(f"{flag}: {len(value)} entries for {num_layers} decoder layers in {text!r}")
    if not any(value):
        raise LayerSpecError(f"{flag}: at least one decoder layer must attend to the source, got {text!r}")
    return value


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)
