"""Bundles whose weights are the same share one file in the build folder's pool: the same
application, weights key, layout of quantized weights (``iron/quant.py``) and code that
computes the weights (``Application.weights_sources``)."""

from iron.pipeline import bundle as bundles


class App:
    name = "demo"

    def __init__(self, key, sources=()):
        self.key, self.sources = key, list(sources)

    def weights_key(self):
        return self.key

    def weights_sources(self):
        return self.sources


def sharer(folder, written):
    """``share(name, app, data)``: a bundle's weights file ``folder/name.safetensors`` put in
    place by ``shared_weights``, whose ``write`` (when called) writes ``data`` and appends
    ``name`` to ``written``; returns the file and its digest."""
    def share(name, app, data):
        dest = folder / f"{name}.safetensors"

        def write():
            dest.write_bytes(data)
            written.append(name)
        return dest, bundles.shared_weights(app, dest, write)
    return share


def test_the_pool_shares_a_weights_file_until_the_key_or_the_quantized_layout_changes(
        tmp_path, monkeypatch):
    monkeypatch.setenv("IRON_BUILD_DIR", str(tmp_path / "build"))
    layout = tmp_path / "quant.py"
    layout.write_text("tiles of 16 rows")
    monkeypatch.setattr(bundles, "QUANT_SOURCE", layout)
    written = []
    share = sharer(tmp_path, written)
    a, digest_a = share("a", App({"checkpoint": "x"}), b"first layout")
    b, digest_b = share("b", App({"checkpoint": "x"}), b"never written")
    assert written == ["a"] and b.stat().st_ino == a.stat().st_ino and digest_b == digest_a
    c, _ = share("c", App({"checkpoint": "y"}), b"another checkpoint")
    assert written == ["a", "c"]
    layout.write_text("tiles of 16 rows, q6_k's high bits packed")  # old bytes are stale now
    d, digest_d = share("d", App({"checkpoint": "x"}), b"second layout")
    assert written == ["a", "c", "d"] and d.read_bytes() == b"second layout"
    assert digest_d != digest_a and a.read_bytes() == b"first layout"


def test_an_application_without_a_weights_key_never_shares(tmp_path, monkeypatch):
    """``Application.weights_key`` returns None by default: such weights are written for each
    bundle (two demo bundles of different widths once got one pool file, keyed on None)."""
    monkeypatch.setenv("IRON_BUILD_DIR", str(tmp_path / "build"))
    written = []
    share = sharer(tmp_path, written)
    a, _ = share("a", App(None), b"hidden=512")
    b, _ = share("b", App(None), b"hidden=256")
    assert written == ["a", "b"] and b.read_bytes() == b"hidden=256"
    assert not (tmp_path / "build" / bundles.WEIGHTS_POOL).exists()


def test_the_pool_is_not_reused_once_the_code_that_computes_the_weights_changed(
        tmp_path, monkeypatch):
    """Same checkpoint, same formats: a bundle rebuilt after a fix of the conversion (one byte
    of a source the application names) must get the new weights, not the pool's old file (a
    deliberately broken RoPE table once went unnoticed so: the key did not cover that code)."""
    monkeypatch.setenv("IRON_BUILD_DIR", str(tmp_path / "build"))
    source = tmp_path / "weights.py"
    source.write_text("theta = 10000.0\n")
    written = []
    share, app = sharer(tmp_path, written), App({"checkpoint": "x"}, [source])
    a, digest_a = share("a", app, b"old table")
    share("b", app, b"never written")
    assert written == ["a"]
    source.write_text("theta = 50000.0\n")  # one byte edited, same size
    c, digest_c = share("c", app, b"new table")
    assert written == ["a", "c"] and c.read_bytes() == b"new table" and digest_c != digest_a
    assert a.read_bytes() == b"old table"


def test_the_bundle_is_rewritten_when_a_weights_source_changes(build_here, tmp_path,
                                                                 monkeypatch):
    """The ``bundle`` task depends on ``weights_sources``: a rebuild after an edit of the code
    that computes the weights writes them again (a no-op build does not)."""
    from buildtools import doit_bundle

    from apps.demo.app import App as Demo

    source = tmp_path / "weights.py"
    source.write_text("scale = 1\n")
    monkeypatch.setattr(Demo, "weights_sources", lambda self: [source])
    computed = []
    weights = Demo.weights

    def counting(self):
        computed.append(1)
        return weights(self)

    monkeypatch.setattr(Demo, "weights", counting)
    assert doit_bundle({"app": "demo"}) == 0 and len(computed) == 1
    assert doit_bundle({"app": "demo"}) == 0 and len(computed) == 1  # current: not rewritten
    source.write_text("scale = 2\n")
    assert doit_bundle({"app": "demo"}) == 0 and len(computed) == 2
