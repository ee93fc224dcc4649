"""The compile's own tree walk and string decoder (dra.cel.analysis) stand in for lark's ``iter_subtrees`` and
cel-python's ``celstr``: they must give exactly what those give, on every real selector and on the literal
forms CEL has."""
import lark
import pytest
from celpy.evaluation import celstr

from dra.cel import CELDevice, analysis
from dra.cel.compiler import _parse, compile_expression


def test_subtrees_are_the_parse_tree_children_before_parents(real_selectors):
    for entry in real_selectors:
        tree = _parse(entry["expression"])
        mine = analysis.subtrees(tree)
        assert sorted(map(id, mine)) == sorted(map(id, tree.iter_subtrees()))
        seen: set[int] = set()
        for node in mine:  # every child already listed when its parent comes
            assert all(id(c) in seen for c in node.children if isinstance(c, lark.Tree))
            seen.add(id(node))
        assert mine[-1] is tree


@pytest.mark.parametrize("text", [
    '""', "''", '"abc"', "'abc'", '"""abc"""', "'''a'b'''", '"commit-0504b630"', '"NVIDIA H100 80GB HBM3"',
    '"tab\\tquote\\"end"', "'\\x41\\u00e9\\101'", '"back\\\\slash"', 'r"raw\\d+"', "R'''raw\\n'''",
    '"""line one\nline two"""', '"é ü 中"', '"\'"', "'\"'",
])
def test_decode_string_is_what_cel_python_decodes(text):
    token = lark.Token("STRING_LIT", text)
    assert analysis.decode_string(token) == celstr(token)
    assert type(analysis.decode_string(token)) is type(celstr(token))


@pytest.mark.parametrize(("expression", "expected"), [
    ('device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"', True),
    ('device.attributes["gpu.nvidia.com"].productName == "NVIDIA\\tH100"', False),
    (r'"a\\tb" != "a\tb" && "x" in ["x", "y"] && """m""" == "m" && r"\d" == "\\d"', True),
    ('device.attributes["gpu.nvidia.com"].productName in ["NVIDIA A100", "NVIDIA H100 80GB HBM3"]', True),
])
def test_literals_decoded_by_the_compile_evaluate_as_cel_python_decodes_them(expression, expected):
    device = CELDevice(driver="gpu.nvidia.com",
                       attributes={"productName": {"string": "NVIDIA H100 80GB HBM3"}}, capacity={})
    assert compile_expression(expression).evaluate(device) is expected
