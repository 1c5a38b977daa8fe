"""explain/svg.py: round ticks that cover the data, labels with the decimals the step needs, valid SVG."""

import math
import xml.etree.ElementTree as ET

import pytest

from hetcompile.explain import svg


@pytest.mark.parametrize("lo,hi", [(0.0, 1.0), (8.8, 36.0), (0.0, 0.0123), (-3.0, 7.0), (0.0, 27000.0), (5.0, 5.0)])
def test_ticks_cover_the_range_at_a_round_step(lo: float, hi: float) -> None:
    t = svg.nice_ticks(lo, hi)
    assert t[0] <= lo and t[-1] >= hi and 2 <= len(t) <= 12
    step = t[1] - t[0]
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 2.5, 5)), step
    assert all(math.isclose(b - a, step, rel_tol=1e-9) for a, b in zip(t, t[1:]))


def test_tick_labels_have_the_decimals_the_step_needs() -> None:
    assert [svg.tick_label(v, [0, 0.25, 0.5]) for v in (0, 0.25, 0.5)] == ["0", "0.25", "0.50"]
    assert [svg.tick_label(v, [0, 0.5, 1.0]) for v in (0, 0.5, 1.0)] == ["0", "0.5", "1.0"]
    assert [svg.tick_label(v, [0, 10, 20]) for v in (0, 10, 20)] == ["0", "10", "20"]
    assert svg.tick_label(-0.0001, [-0.5, 0.0, 0.5]) == "0"


def test_a_document_is_valid_svg_with_escaped_text() -> None:
    doc = svg.Svg(100, 50)
    doc.text(10, 10, "chat <p99> & rag")
    for kind in ("o", "x", "*"):
        doc.marker(kind, 20, 20, "#000")
    root = ET.fromstring(doc.render())
    assert root.tag.endswith("svg") and root.get("viewBox") == "0 0 100 50"
    assert [t.text for t in root.iter() if t.tag.endswith("text")] == ["chat <p99> & rag"]
