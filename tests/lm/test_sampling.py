"""The sampler judged by what it does to the distribution, and the documented defaults pinned
against the documents' own values (docs/serving.md and the README), not the implementation's
constants: changing a default in the code alone, or a filter's behaviour, fails here."""

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from iron.lm.generate import Sampler

REPO = Path(__file__).resolve().parents[2]
DRAWS = 20000


def frequencies(sampler: Sampler, logits: np.ndarray, draws: int = DRAWS) -> np.ndarray:
    counts = np.zeros(logits.size)
    for _ in range(draws):
        counts[sampler(logits)] += 1
    return counts / draws


def assert_frequencies(freq: np.ndarray, p: np.ndarray, draws: int = DRAWS) -> None:
    """Each token's frequency within 5 standard deviations of its probability; a token of
    probability 0 never drawn."""
    sigma = np.sqrt(p * (1 - p) / draws)
    assert np.all(freq[p == 0] == 0), f"filtered tokens drawn: {np.flatnonzero(freq * (p == 0))}"
    assert np.all(np.abs(freq - p) <= 5 * sigma + 1e-12), np.c_[freq, p]


def probabilities(*p: float) -> np.ndarray:
    """Logits whose softmax at temperature 1 is ``p`` (in that order)."""
    return np.log(np.array(p, np.float64)).astype(np.float32)


def test_temperature_one_samples_the_softmax():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    assert_frequencies(frequencies(Sampler(temperature=1.0, seed=1), probabilities(*p)), p)


def test_temperature_sharpens_and_flattens_as_softmax_of_logits_over_t():
    logits = probabilities(0.5, 0.3, 0.15, 0.05)
    for t in (0.5, 2.0):
        p = np.exp(logits / t) / np.exp(logits / t).sum()
        assert_frequencies(frequencies(Sampler(temperature=t, seed=2), logits), p)


def test_top_k_never_draws_outside_the_k_likeliest_over_many_seeds():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(200).astype(np.float32)
    top = set(np.argsort(-logits)[:5].tolist())
    drawn = {Sampler(temperature=1.5, top_k=5, seed=s)(logits) for s in range(3000)}
    assert drawn == top  # every one of the five is drawn, nothing else


def test_top_k_renormalises_the_kept_tokens():
    p = np.array([0.4, 0.3, 0.2, 0.1])
    kept = np.array([0.4, 0.3, 0, 0]) / 0.7
    assert_frequencies(frequencies(Sampler(temperature=1.0, top_k=2, seed=3),
                                   probabilities(*p)), kept)


@pytest.mark.parametrize("top_p,kept", [
    (0.8, [0.5, 0.3, 0, 0]),        # 0.5 + 0.3 reaches 0.8: the nucleus is the first two
    (0.81, [0.5, 0.3, 0.15, 0]),    # one more is needed to pass 0.81
    (0.4, [0.5, 0, 0, 0]),          # the likeliest alone already holds 0.4
])
def test_top_p_keeps_the_smallest_set_holding_the_mass(top_p, kept):
    p = probabilities(0.5, 0.3, 0.15, 0.05)
    kept = np.array(kept) / sum(kept)
    assert_frequencies(frequencies(Sampler(temperature=1.0, top_p=top_p, seed=4), p), kept)


def test_min_p_keeps_tokens_at_least_that_fraction_of_the_likeliest():
    p = probabilities(0.5, 0.3, 0.15, 0.05)
    kept = np.array([0.5, 0.3, 0.15, 0]) / 0.95  # 0.05 < 0.2 * 0.5
    assert_frequencies(frequencies(Sampler(temperature=1.0, min_p=0.2, seed=5), p), kept)


def test_filters_apply_in_order_top_k_then_top_p_then_min_p():
    p = probabilities(0.4, 0.25, 0.2, 0.1, 0.05)
    # top-k 4 drops 0.05 -> (0.421, 0.263, 0.211, 0.105); top-p 0.6 keeps the first two
    # (0.684 >= 0.6); min-p 0.7 then drops the second (0.263 < 0.7 * 0.421)
    sampler = Sampler(temperature=1.0, top_k=4, top_p=0.6, min_p=0.7, seed=6)
    drawn = {sampler(p) for _ in range(500)}
    assert drawn == {0}
    sampler = Sampler(temperature=1.0, top_k=4, top_p=0.6, min_p=0.5, seed=6)
    assert {sampler(p) for _ in range(500)} == {0, 1}


def test_greedy_is_the_argmax_whatever_the_filters():
    rng = np.random.default_rng(7)
    for _ in range(50):
        logits = rng.standard_normal(1000).astype(np.float32)
        assert Sampler(temperature=0.0, top_k=3, top_p=0.5)(logits) == int(np.argmax(logits))


# ---- the documented defaults ---------------------------------------------------------------

def documented_table(path: Path, heading: str) -> dict[str, str]:
    """The two-column markdown table under ``heading`` in ``path``: first cell -> second."""
    text = path.read_text()
    section = text[text.index(heading):]
    rows = {}
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and not set(cells[0]) <= set("-"):
            rows[cells[0]] = cells[1]
    return rows


def test_sampling_defaults_are_the_documented_ones(tmp_path):
    """A request that leaves sampling out, on a bundle whose checkpoint sets none, samples with
    the values docs/serving.md and the README state (llama.cpp's server's)."""
    from iron.lm.serve import sampling_defaults

    table = documented_table(REPO / "docs/serving.md", "### Sampling defaults")
    documented = {k: float(table[k]) for k in ("temperature", "top_k", "top_p", "min_p")}
    assert documented == {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
    readme = (REPO / "README.md").read_text()
    assert "(temperature 0.8,\ntop-k 40, top-p 0.95, min-p 0.05)" in readme
    got = sampling_defaults(tmp_path)  # no generation_config.json there
    assert {k: got[k] for k in documented} == documented
    assert got.get("repetition_penalty", 1.0) == 1.0  # "off"


def test_server_limits_are_the_documented_ones():
    """``iron serve``'s limits, as its own --help states them, are docs/serving.md's table."""
    table = documented_table(REPO / "docs/serving.md", "| limit | default | flag | answer |")
    help_text = subprocess.run([sys.executable, "-m", "iron.lm.serve", "--help"],
                               capture_output=True, text=True, timeout=60, cwd=REPO).stdout
    help_text = " ".join(help_text.split())

    def default_of(flag: str) -> float:
        # the option's own help: its text up to the next option names no other flag
        found = re.search(re.escape(flag) + r" [A-Z_]+ (?:(?!--).)*?\(default ([0-9.]+)\)",
                          help_text)
        assert found, f"{flag} states no default in --help: {help_text}"
        return float(found.group(1))

    assert table["request body"].startswith("1 MiB") and default_of("--max-body") == 1 << 20
    assert table["waiting requests"].startswith("16 ") and default_of("--queue") == 16
    assert table["time for a request to arrive (line, headers, body)"].startswith("15 s")
    assert default_of("--read-timeout") == 15
    assert table["idle kept-alive connection"].startswith("5 s")
    assert default_of("--idle-timeout") == 5
