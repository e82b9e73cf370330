"""The shipped documents (kvstats.data.texts.documents): all of them in order, or the first ``count``."""

from __future__ import annotations

import pytest

from kvstats.data.texts import documents


def test_the_first_count_documents_are_a_prefix_of_all_of_them():
    every = documents()
    assert len(every) == 25 and list(documents(3).items()) == list(every.items())[:3]
    assert documents(25) == every


@pytest.mark.parametrize("count, error", [(0, ValueError), (26, ValueError), (2.0, TypeError), (True, TypeError)])
def test_a_count_the_documents_cannot_give_is_refused_naming_it(count, error):
    with pytest.raises(error, match="count"):
        documents(count)
