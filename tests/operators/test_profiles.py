"""The profile model: matching, precedence, the file format and every error."""

import json

import numpy as np
import pytest

import iron
from iron.operators import AXPY, GEMV, Elementwise, ElementwiseAdd, RMSNorm
from iron.resolution import resolve


class Scaled(iron.Graph):
    def body(self, x, y):
        return AXPY.step(x, y, scalar_factor=1.5)


class ScaledCall(iron.Graph):
    """The call sets one tunable itself; the other is left to profile and default."""

    def __init__(self, **call):
        super().__init__()
        self.call = call

    def body(self, x, y):
        return AXPY.step(x, y, scalar_factor=1.5, **self.call)


def resolved(graph, size=2048):
    return graph.record(x=(size,), y=(size,)).ops[0]


def test_profile_entry_sets_the_tunables_of_matching_steps():
    graph = Scaled()
    graph.profile = iron.Profile().add(AXPY, size=2048, tile_size=1024, num_aie_columns=2)
    op = resolved(graph)
    assert (op.tile_size, op.num_aie_columns) == (1024, 2)


def test_other_shape_falls_back_to_resolve_defaults():
    graph = Scaled()
    graph.profile = iron.Profile().add(AXPY, size=2048, tile_size=1024, num_aie_columns=1)
    op = resolved(graph, 4096)
    default = resolve(AXPY(size=4096, scalar_factor=1.5), "cpu")
    assert (op.tile_size, op.num_aie_columns) == (default.tile_size, default.num_aie_columns)


def test_precedence_is_decided_per_tunable():
    profile = iron.Profile().add(AXPY, size=2048, tile_size=512)
    graph = ScaledCall(num_aie_columns=1)
    graph.profile = profile
    op = resolved(graph)
    assert (op.tile_size, op.num_aie_columns) == (512, 1)  # profile, call
    graph = ScaledCall(tile_size=256)
    graph.profile = iron.Profile().add(AXPY, size=2048, num_aie_columns=1)
    op = resolved(graph)
    assert (op.tile_size, op.num_aie_columns) == (256, 1)  # call, profile
    graph.profile = None
    op = resolved(graph)
    default = resolve(AXPY(size=2048, scalar_factor=1.5, tile_size=256), "cpu")
    assert op.tile_size == 256 and op.num_aie_columns == default.num_aie_columns  # default


def test_call_beats_profile_for_every_tunable():
    graph = ScaledCall(tile_size=256, num_aie_columns=1, num_channels=1)
    graph.profile = iron.Profile().add(AXPY, size=2048, tile_size=1024, num_aie_columns=2)
    op = resolved(graph)
    assert (op.tile_size, op.num_aie_columns, op.num_channels) == (256, 1, 1)


def test_most_specific_entry_wins_and_wildcards_match_any_value():
    profile = iron.Profile()
    profile.add(AXPY, tile_size=256, num_aie_columns=1)
    profile.add(AXPY, size=2048, tile_size=1024)
    graph = Scaled()
    graph.profile = profile
    op = resolved(graph)
    assert (op.tile_size, op.num_aie_columns) == (1024, 1)
    assert resolved(graph, 4096).tile_size == 256


def test_semantic_params_match_too():
    profile = iron.Profile().add(AXPY, scalar_factor=2.0, tile_size=256)
    graph = Scaled()
    graph.profile = profile
    assert resolved(graph).tile_size != 256  # the step's scalar_factor is 1.5
    profile.add(AXPY, scalar_factor=1.5, tile_size=256)
    assert resolved(graph).tile_size == 256


def test_entry_naming_a_base_class_applies_to_subclasses():
    class Add(iron.Graph):
        def body(self, x, y):
            return ElementwiseAdd.step(x, y)

    graph = Add()
    graph.profile = iron.Profile().add(Elementwise, size=2048, tile_size=128, num_aie_columns=1)
    op = graph.record((2048,), (2048,)).ops[0]
    assert (op.tile_size, op.num_aie_columns) == (128, 1)


def test_equally_specific_disagreeing_entries_raise_naming_both():
    profile = iron.Profile()
    profile.add(AXPY, size=2048, tile_size=1024)
    profile.add(AXPY, scalar_factor=1.5, tile_size=512)
    graph = Scaled()
    graph.profile = profile
    with pytest.raises(iron.ProfileError) as e:
        resolved(graph)
    message = str(e.value)
    assert "tile_size" in message and '"size": 2048' in message
    assert '"scalar_factor": 1.5' in message and "equally specific" in message


def test_equally_specific_agreeing_entries_are_fine():
    profile = iron.Profile()
    profile.add(AXPY, size=2048, tile_size=1024)
    profile.add(AXPY, scalar_factor=1.5, tile_size=1024)
    graph = Scaled()
    graph.profile = profile
    assert resolved(graph).tile_size == 1024


def test_add_rejects_a_field_that_is_neither_param_nor_tunable():
    with pytest.raises(iron.ProfileError) as e:
        iron.Profile().add(AXPY, size=2048, tile=1024)
    message = str(e.value)
    assert "'tile'" in message and "tile_size" in message and "scalar_factor" in message


def test_add_rejects_an_entry_without_tunables():
    with pytest.raises(iron.ProfileError, match="sets no tunable.*tile_size"):
        iron.Profile().add(AXPY, size=2048)


@pytest.mark.parametrize("value", [1.5, "2", 0, -1, True, None])
def test_non_integer_or_out_of_range_tunable_is_rejected(value):
    with pytest.raises(iron.ProfileError, match=r"num_aie_columns=.*positive integer"):
        iron.Profile().add(AXPY, size=2048, num_aie_columns=value)


def test_save_is_deterministic_one_entry_per_line_and_round_trips(tmp_path):
    a = iron.Profile(device="cpu")
    a.add(GEMV, M=1536, K=576, tile_size_output=64, num_aie_columns=2)
    a.add(AXPY, size=2048, tile_size=1024, num_aie_columns=2)
    a.add(RMSNorm, tile_size=1)
    b = iron.Profile(device="cpu")
    b.add(RMSNorm, tile_size=1)
    b.add(AXPY, num_aie_columns=2, tile_size=1024, size=2048)
    b.add(GEMV, K=576, M=1536, num_aie_columns=2, tile_size_output=64)
    pa, pb = a.save(tmp_path / "a.json"), b.save(tmp_path / "b.json")
    assert pa.read_bytes() == pb.read_bytes()
    lines = pa.read_text().splitlines()
    assert lines[0] == '{"device": "cpu", "entries": ['
    assert lines[1] == '  {"operator": "AXPY", "size": 2048, "tile_size": 1024, "num_aie_columns": 2},'
    assert len(lines) == 5 and lines[-1] == "]}"
    assert iron.Profile.load(pa) == a
    assert json.loads(pa.read_text())["entries"][1]["M"] == 1536


def test_save_is_atomic_and_leaves_no_temporary_files(tmp_path, monkeypatch):
    path = tmp_path / "p.json"
    iron.Profile().add(AXPY, tile_size=16).save(path)
    before = path.read_bytes()

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", fail)
    with pytest.raises(OSError):
        iron.Profile().add(AXPY, tile_size=32).save(path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


def write(tmp_path, text):
    path = tmp_path / "cpu.json"
    path.write_text(text)
    return path


def test_malformed_json_names_file_and_line(tmp_path):
    path = write(tmp_path, '{"device": "cpu", "entries": [\n'
                 '  {"operator": "AXPY", "size": 2048, "tile_size": 1024},\n'
                 '  {"operator": "AXPY" "size": 1024, "tile_size": 256}\n]}\n')
    with pytest.raises(iron.ProfileError, match=rf"{path.name} line 3 column 23: malformed JSON: .*expected ','"):
        iron.Profile.load(path)


def test_unknown_operator_names_file_line_and_known_operators(tmp_path):
    path = write(tmp_path, '{"device": "cpu", "entries": [\n'
                 '  {"operator": "AXPY", "size": 2048, "tile_size": 1024},\n'
                 '  {"operator": "AXPYZ", "size": 1024, "tile_size": 256}\n]}\n')
    with pytest.raises(iron.ProfileError, match=r"line 3: unknown operator 'AXPYZ'.*GEMV"):
        iron.Profile.load(path)


def test_bad_field_in_file_names_the_line(tmp_path):
    path = write(tmp_path, '{"device": "cpu", "entries": [\n'
                 '  {"operator": "GEMV", "M": 64, "tile_size": 8}\n]}\n')
    with pytest.raises(iron.ProfileError, match=r"line 2: GEMV has no field 'tile_size'"):
        iron.Profile.load(path)


def test_bad_top_level_and_device_are_reported(tmp_path):
    with pytest.raises(iron.ProfileError, match="the keys .device. and .entries."):
        iron.Profile.load(write(tmp_path, '{"entries": []}'))
    with pytest.raises(iron.ProfileError, match="unknown device 'gpu'"):
        iron.Profile.load(write(tmp_path, '{"device": "gpu", "entries": []}'))


def test_graph_profile_accepts_file_and_directory(tmp_path):
    iron.Profile(device="cpu").add(AXPY, size=2048, tile_size=512, num_aie_columns=1).save(
        tmp_path / "cpu.json")
    for value in (tmp_path / "cpu.json", tmp_path, str(tmp_path)):
        graph = Scaled()
        graph.profile = value
        op = resolved(graph)
        assert (op.tile_size, op.num_aie_columns) == (512, 1)


def test_profile_for_another_device_is_refused(tmp_path):
    iron.Profile(device="npu2").add(AXPY, tile_size=512).save(tmp_path / "npu2.json")
    graph = Scaled()
    graph.profile = tmp_path / "npu2.json"
    with pytest.raises(iron.ProfileError, match="profile for npu2 cannot apply to a graph on cpu"):
        resolved(graph)


def test_malformed_profile_is_reported_at_assignment(tmp_path):
    graph = Scaled()
    with pytest.raises(iron.ProfileError):
        graph.profile = write(tmp_path, "{")


def test_reference_runs_under_the_same_profile():
    graph = Scaled()
    graph.profile = iron.Profile().add(AXPY, size=2048, tile_size=3)
    x = np.ones(2048, iron.bfloat16)
    with pytest.raises(iron.ResolveError, match="tile_size=3"):
        graph.reference(x, x)


@pytest.mark.parametrize("text, key, line", [
    # an escaped ':' in a string made the text's ':' count match again
    ('{"device": "cpu", "entries": [\n  {"operator": "GEMV", "M": 64, "M": 128, "K": 1, '
     '"tile_size_input": 4}\n], "host": {"cpu": "a\\u003a b"}}', "M", 2),
    # a key spelt with an escape is the same key
    ('{"device": "cpu",\n "d\\u0065vice": "npu1", "entries": []}', "device", 1),
    ('{"device": "cpu", "entries": [\n  {"operator": "GEMV", "M": 64, "\\u004d": 128, '
     '"tile_size_input": 4}\n]}', "M", 2),
    ('{"device": "cpu", "host": {\n  "cores": 2, "c\\u006fres": 4}, "entries": []}', "cores", 1),
])
def test_duplicate_keys_are_found_on_the_parsed_keys_whatever_their_spelling(text, key, line):
    with pytest.raises(iron.ProfileError) as e:
        iron.Profile.loads(text, "x.json")
    assert str(e.value) == (f"x.json line {line}: key {key!r} appears twice in the object that "
                            "starts there; JSON keys must be unique")


def test_escapes_and_colons_in_strings_are_no_duplicates():
    profile = iron.Profile.loads('{"device": "cpu", "host": {"cpu": "a\\u003a b: c", '
                                 '"m\\u0061rch": "native"}, "entries": [\n'
                                 '  {"operator": "GEMV", "M": 64, "tile_size_input": 4}\n]}')
    assert profile.host == {"cpu": "a: b: c", "march": "native"} and len(profile) == 1
