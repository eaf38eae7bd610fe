"""A plot's SVG (service.ui.plots) made fit to sit inside a page, where its <title> elements show on hover.

An <img> shows an SVG as a picture only: no hover, no titles. In the page, the pages' Content-Security-
Policy (style-src 'self', no inline styles) would drop matplotlib's style="..." attributes and its <style>
element, so every style attribute becomes the presentation attributes it lists (fill, stroke,
stroke-width ... are all SVG attributes, which no CSP governs) and the <style> rule goes to the root.
"""

from __future__ import annotations

import html
import re

_PROLOG = re.compile(r"\A.*?(?=<svg\b)", re.S)
_METADATA = re.compile(r"<metadata>.*?</metadata>\s*", re.S)
_STYLE_ELEMENT = re.compile(r"<style[^>]*>\s*\*\{([^}]*)\}\s*</style>\s*", re.S)
_STYLE_ATTRIBUTE = re.compile(r'style="([^"]*)"')
_PROPERTY = re.compile(r"^[a-z-]+$")
_SIZE = re.compile(r'<svg ([^>]*?)width="[^"]*" height="[^"]*"')


def _attributes(declarations: str) -> str:
    """`fill: #fff; stroke-width: 0.8` as `fill="#fff" stroke-width="0.8"` (unknown shapes dropped)."""
    pairs = []
    for declaration in declarations.split(";"):
        name, _, value = declaration.partition(":")
        name, value = name.strip(), value.strip()
        if _PROPERTY.match(name) and value:
            pairs.append(f'{name}="{html.escape(value)}"')
    return " ".join(pairs)


def inline(svg: bytes, *, css_class: str, label: str) -> str:
    """The SVG document as an element for an HTML page: no prolog, no metadata, no inline style; sized by
    its viewBox (CSS scales it), with `css_class` and `label` (its accessible name)."""
    text = _PROLOG.sub("", svg.decode("utf-8"), count=1)
    text = _METADATA.sub("", text, count=1)
    root = ""
    rule = _STYLE_ELEMENT.search(text)
    if rule is not None:
        root = _attributes(rule.group(1))
        text = text[: rule.start()] + text[rule.end() :]
    text = text.replace("<defs>\n </defs>", "").replace("<defs>\n  </defs>", "")
    text = _STYLE_ATTRIBUTE.sub(lambda match: _attributes(match.group(1)), text)
    return _SIZE.sub(
        lambda match: (
            f'<svg {match.group(1)}class="{html.escape(css_class)}" role="img" '
            f'aria-label="{html.escape(label)}" {root}'
        ),
        text,
        count=1,
    )
