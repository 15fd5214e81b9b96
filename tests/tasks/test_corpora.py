import os

import pytest

from incontext.tasks.corpora import shakespeare_plays, strip_gutenberg


def test_strip_gutenberg_keeps_only_the_body():
    text = "licence blah\n*** START OF THE PROJECT GUTENBERG EBOOK HAMLET ***\nTo be, or not to be\n*** END OF THE PROJECT GUTENBERG EBOOK ***\nmore licence"
    assert strip_gutenberg(text) == "To be, or not to be"
    assert strip_gutenberg("no markers at all") == "no markers at all"


def test_shakespeare_plays_load_from_the_package():
    try:
        plays = shakespeare_plays()
    except FileNotFoundError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(error))
    assert "metadata" not in plays and len(plays) >= 40
    hamlet = [text for name, text in plays.items() if name.startswith("hamlet") and not name.endswith("_f")]
    assert hamlet and "To be, or not to be" in hamlet[0]
    assert all(len(text) > 1000 for text in plays.values())
