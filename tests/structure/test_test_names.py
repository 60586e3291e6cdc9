"""Test modules are imported by their file name alone (pytest's default import mode,
no packages under tests/): two files of one name in different folders make the
second fail to collect, and only a run of the whole suite shows it."""
import collections
import os

from paths import REPO


def test_every_test_module_has_a_name_of_its_own():
    places = collections.defaultdict(list)
    for folder, _, files in os.walk(os.path.join(REPO, "tests")):
        for name in files:
            if name.startswith("test_") and name.endswith(".py"):
                places[name].append(os.path.relpath(os.path.join(folder, name), REPO))
    twice = {name: paths for name, paths in places.items() if len(paths) > 1}
    assert not twice, f"test modules sharing a name (rename one): {twice}"
