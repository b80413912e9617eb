"""Comparing pipeline results with transformers' (nested dicts and lists of labels, spans and scores)."""


def assert_results_close(ours, theirs, atol: float = 1e-4) -> None:
    """Same structure, equal strings and integers, floats within `atol`."""
    if isinstance(theirs, dict):
        assert set(ours) == set(theirs)
        for key in theirs:
            assert_results_close(ours[key], theirs[key], atol)
    elif isinstance(theirs, list):
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert_results_close(a, b, atol)
    elif isinstance(theirs, (str, int)):
        assert ours == theirs
    else:
        assert abs(float(ours) - float(theirs)) < atol
