"""Canonical capture points and every framework's native numbering (docs/engines.md#the-convention-zoo)."""
import pytest

from pipeline.points import (
    Point,
    PointError,
    from_native,
    parse_points,
    resolve,
    split_points,
    to_native,
)

N = 61  # Kimi-K2.5
B = Point
F = Point(None)


def labels(points):
    return [p.label for p in points]


def test_parse_canonical_labels_and_aliases():
    pts = parse_points(["final_norm", 31, "b3", "embed", "last"], num_layers=N)
    assert labels(pts) == ["b0", "b3", "b31", "b61", "final_norm"]


@pytest.mark.parametrize("bad", [62, -1, "b62", "layer3", True, 3.5])
def test_parse_rejects_out_of_range_and_garbage(bad):
    with pytest.raises(PointError, match=repr(bad) if not isinstance(bad, float) else "3.5"):
        parse_points([bad], num_layers=N)


def test_duplicates_are_an_error():
    with pytest.raises(PointError, match="b3 is requested twice"):
        parse_points([3, "b3"], num_layers=N)


KIMI = [B(0), B(3), B(31), B(59), B(61), F]


@pytest.mark.parametrize("framework, family, expected", [
    ("hf", "deepseek", [0, 3, 31, 59, None, 61]),          # HF index N is post-norm; bN only through a hook
    ("vllm", "deepseek", [0, 3, 31, 59, 61, None]),        # id k = boundary k, id N = pre-norm last layer
    ("sglang", "llama", [None, 2, 30, 58, None, None]),    # always +1: no embedding, no last layer
    ("sglang", "deepseek", [0, 3, 31, 59, None, None]),    # start of layer i; last layer output not capturable
    ("speculators", "deepseek", [None, 2, 30, 58, 60, None]),
    ("specforge", "deepseek", [None, 2, 30, 58, 60, None]),
    ("trtllm", "deepseek", [None, 2, 30, 58, 60, -1]),
])
def test_to_native_every_framework(framework, family, expected):
    assert to_native(KIMI, framework=framework, family=family, num_layers=N) == expected


def test_sglang_deepseek_plus_one_only_when_first_id_is_1():
    assert labels(from_native([0, 1, 2], framework="sglang", family="deepseek", num_layers=N)) == ["b0", "b1", "b2"]
    assert labels(from_native([1, 2], framework="sglang", family="deepseek", num_layers=N)) == ["b2", "b3"]
    assert labels(from_native([2, 30, 58], framework="sglang", family="deepseek", num_layers=N)) == \
        ["b2", "b30", "b58"]
    # ... so canonical boundary 1 cannot lead the aux list, and saying so beats capturing b2 silently
    with pytest.raises(PointError, match="first id is 1"):
        to_native([B(1), B(4)], framework="sglang", family="deepseek", num_layers=8)
    assert to_native([B(0), B(1), B(4)], framework="sglang", family="deepseek", num_layers=8) == [0, 1, 4]


def test_sglang_llama_always_plus_one():
    assert labels(from_native([1, 2], framework="sglang", family="llama", num_layers=N)) == ["b2", "b3"]
    assert labels(from_native([0], framework="sglang", family="llama", num_layers=N)) == ["b1"]


def test_the_same_draft_ids_select_different_layers_in_different_frameworks():
    ids = [2, 30, 58]
    got = {fw: labels(from_native(ids, framework=fw, family="deepseek", num_layers=N))
           for fw in ("vllm", "sglang", "specforge", "trtllm")}
    assert got == {"vllm": ["b2", "b30", "b58"], "sglang": ["b2", "b30", "b58"],
                   "specforge": ["b3", "b31", "b59"], "trtllm": ["b3", "b31", "b59"]}


@pytest.mark.parametrize("framework", ["hf", "vllm", "speculators", "specforge", "trtllm"])
def test_round_trip_where_expressible(framework):
    ids = to_native(KIMI, framework=framework, family="deepseek", num_layers=N)
    native = [i for i in ids if i is not None]
    back = from_native(native, framework=framework, family="deepseek", num_layers=N)
    assert [p for p, i in zip(KIMI, ids) if i is not None] == back


@pytest.mark.parametrize("framework, bad, match", [
    ("vllm", 62, r"valid ids 0\.\.61"),
    ("hf", 62, r"valid ids 0\.\.60 and 61 for the final norm"),
    ("sglang", -1, r"valid ids 0\.\.60"),
    ("specforge", 61, r"valid ids 0\.\.60"),
])
def test_native_range_checks_name_the_valid_range(framework, bad, match):
    with pytest.raises(PointError, match=match):
        from_native([bad], framework=framework, family="deepseek", num_layers=N)


def test_trtllm_minus_one_is_the_final_norm():
    assert labels(from_native([2, -1], framework="trtllm", family="deepseek", num_layers=N)) == ["b3", "final_norm"]


def test_resolve_config_in_native_ids_with_final_norm():
    pts = resolve([2, 30, 58, "final_norm"], convention="specforge", family="deepseek", num_layers=N)
    assert labels(pts) == ["b3", "b31", "b59", "final_norm"]


def test_unknown_framework_and_family():
    with pytest.raises(PointError, match="capture convention 'tensorrt' is unknown"):
        resolve([1], convention="tensorrt", family="deepseek", num_layers=N)
    with pytest.raises(PointError, match="family 'mamba'"):
        to_native([B(1)], framework="sglang", family="mamba", num_layers=N)


@pytest.mark.parametrize("text, values", [
    ("b3,b31,final_norm", ["b3", "b31", "final_norm"]),
    ("[3, 31, 59]", [3, 31, 59]),
    (" embed , 7 ,last", ["embed", 7, "last"]),
    ("-1,2", [-1, 2]),  # TensorRT-LLM's post-norm id is -1
])
def test_a_point_list_on_a_command_line_reads_as_hydra_reads_capture_points(text, values):
    assert split_points(text) == values


def test_a_command_line_point_list_resolves_as_capture_points_does():
    assert labels(resolve(split_points("[2,30,58]"), convention="specforge", family="deepseek", num_layers=N)) == \
        labels(resolve([2, 30, 58], convention="specforge", family="deepseek", num_layers=N)) == ["b3", "b31", "b59"]
