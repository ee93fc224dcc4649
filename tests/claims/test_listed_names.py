"""claims.k8s.check_listed_name: the names of a list's entries (consumer claim entries, gang members)."""
from __future__ import annotations

from claims.k8s import check_listed_name


def test_valid_unique_names_join_the_set_and_repeats_are_duplicates():
    seen: set[str] = set()
    assert check_listed_name("a", "p[0].name", seen) == [] and seen == {"a"}
    assert check_listed_name("a", "p[1].name", seen) == [("p[1].name", 'Duplicate value: "a"')]


def test_invalid_names_are_refused_whatever_their_type_and_do_not_join():
    seen: set[str] = set()
    for bad in ("B_", "", None, ["x"], {"y": 1}, 3):
        errors = check_listed_name(bad, "p.name", seen)
        assert len(errors) == 1 and errors[0][0] == "p.name"
    assert seen == set()
