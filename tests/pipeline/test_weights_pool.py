"""Bundles whose weights are the same share one file in the build folder's pool: the same
application, weights key and layout of quantized weights (``iron/quant.py``)."""

from iron.pipeline import bundle as bundles


class App:
    name = "demo"

    def __init__(self, key):
        self.key = key

    def weights_key(self):
        return self.key


def test_the_pool_shares_a_weights_file_until_the_key_or_the_quantized_layout_changes(
        tmp_path, monkeypatch):
    monkeypatch.setenv("IRON_BUILD_DIR", str(tmp_path / "build"))
    layout = tmp_path / "quant.py"
    layout.write_text("tiles of 16 rows")
    monkeypatch.setattr(bundles, "QUANT_SOURCE", layout)
    written = []

    def share(name, key, data):
        dest = tmp_path / f"{name}.safetensors"

        def write():
            dest.write_bytes(data)
            written.append(name)
        return dest, bundles.shared_weights(App(key), dest, write)

    a, digest_a = share("a", {"checkpoint": "x"}, b"first layout")
    b, digest_b = share("b", {"checkpoint": "x"}, b"never written")
    assert written == ["a"] and b.stat().st_ino == a.stat().st_ino and digest_b == digest_a
    c, _ = share("c", {"checkpoint": "y"}, b"another checkpoint")
    assert written == ["a", "c"]
    layout.write_text("tiles of 16 rows, q6_k's high bits packed")  # old bytes are stale now
    d, digest_d = share("d", {"checkpoint": "x"}, b"second layout")
    assert written == ["a", "c", "d"] and d.read_bytes() == b"second layout"
    assert digest_d != digest_a and a.read_bytes() == b"first layout"


def test_an_application_without_a_weights_key_never_shares(tmp_path, monkeypatch):
    """``Application.weights_key`` returns None by default: such weights are written for each
    bundle (two demo bundles of different widths once got one pool file, keyed on None)."""
    monkeypatch.setenv("IRON_BUILD_DIR", str(tmp_path / "build"))
    written = []

    def share(name, data):
        dest = tmp_path / f"{name}.safetensors"

        def write():
            dest.write_bytes(data)
            written.append(name)
        return dest, bundles.shared_weights(App(None), dest, write)

    a, _ = share("a", b"hidden=512")
    b, _ = share("b", b"hidden=256")
    assert written == ["a", "b"] and b.read_bytes() == b"hidden=256"
    assert not (tmp_path / "build" / bundles.WEIGHTS_POOL).exists()
