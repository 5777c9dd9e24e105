import pytest
import torch

from wmrl.core.text import TaskEncoder


def test_token_ids_embed_like_the_strings_they_come_from():
    """The training loop gathers token ids on the device by task index instead of tokenising every step."""
    torch.manual_seed(0)
    enc = TaskEncoder(["push", "the", "red", "cube", "to", "blue", "zone"], dim=8)
    tasks = ["push the red cube", "push the red cube to the blue zone", "Push RED"]
    ids = enc.token_ids(tasks)
    assert ids.shape == (3, 8) and (ids[0, 4:] == 0).all()  # right-padded with the padding id
    assert torch.equal(enc(ids[[2, 0, 0, 1]]), enc([tasks[i] for i in (2, 0, 0, 1)]))


def test_unknown_words_are_ignored_with_one_warning():
    enc = TaskEncoder(["push", "red"], dim=4)
    with pytest.warns(UserWarning, match="outside the training vocabulary.*'green'"):
        a = enc(["push green"])
    assert torch.equal(a, enc(["push"]))
