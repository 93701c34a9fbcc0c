"""The environment's on / off switches (``tilesparse._env.switch``): every spelling, the default when
unset, and an error naming the variable for anything else, also through the modules that read them."""

import pytest

from tilesparse._env import OFF, ON, switch
from tilesparse.kernels import _alloc, attention_stored_ds
from tilesparse.ops import dense_dispatch

NAME = "TILESPARSE_TEST_SWITCH"


@pytest.mark.parametrize("default", [True, False])
@pytest.mark.parametrize("value", [None, "", "   "])
def test_unset_or_blank_gives_the_default(monkeypatch, default, value):
    if value is None:
        monkeypatch.delenv(NAME, raising=False)
    else:
        monkeypatch.setenv(NAME, value)
    assert switch(NAME, default) is default


@pytest.mark.parametrize("spelling", [*ON, *OFF, "ON", " Off ", "True", "NO"])
@pytest.mark.parametrize("default", [True, False])
def test_every_spelling_in_any_case(monkeypatch, spelling, default):
    monkeypatch.setenv(NAME, spelling)
    assert switch(NAME, default) is (spelling.strip().lower() in ON)


@pytest.mark.parametrize("value", ["maybe", "2", "enabled", "o n"])
def test_anything_else_is_an_error_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(NAME, value)
    with pytest.raises(ValueError, match=f"{NAME} must be one of .*got {value!r}"):
        switch(NAME, True)


def test_the_modules_read_their_switches_through_it(monkeypatch):
    monkeypatch.setenv("TILESPARSE_POISON", "true")  # was "1" only
    assert _alloc.poison_enabled()
    monkeypatch.setenv("TILESPARSE_POISON", "off")
    assert not _alloc.poison_enabled()
    monkeypatch.setenv("TILESPARSE_DENSE_DISPATCH", "no")
    assert not dense_dispatch.enabled()
    monkeypatch.setenv("TILESPARSE_DENSE_DISPATCH", "yes")
    assert dense_dispatch.enabled()
    monkeypatch.setenv("TILESPARSE_STORED_DS", "On")
    assert attention_stored_ds.enabled()
    monkeypatch.delenv("TILESPARSE_STORED_DS")
    assert attention_stored_ds.enabled() is (attention_stored_ds.MODE in ON)
    readers = {"TILESPARSE_POISON": _alloc.poison_enabled, "TILESPARSE_DENSE_DISPATCH": dense_dispatch.enabled,
               "TILESPARSE_STORED_DS": attention_stored_ds.enabled}
    for name, read in readers.items():
        monkeypatch.setenv(name, "sometimes")
        with pytest.raises(ValueError, match=name):
            read()
        monkeypatch.delenv(name)


def test_a_choice_takes_its_values_in_any_case_and_refuses_others(monkeypatch):
    from tilesparse._env import choice
    from tilesparse.semi24 import value_map
    monkeypatch.delenv(NAME, raising=False)
    assert choice(NAME, "map", ("map", "tile")) == "map"
    monkeypatch.setenv(NAME, " Tile ")
    assert choice(NAME, "map", ("map", "tile")) == "tile"
    monkeypatch.setenv(NAME, "tiles")
    with pytest.raises(ValueError, match=f"{NAME} must be one of map / tile, got 'tiles'"):
        choice(NAME, "map", ("map", "tile"))
    monkeypatch.setenv("TILESPARSE_SEMI24_PACKER", "CSLT")
    assert not value_map.use_value_maps()
    monkeypatch.setenv("TILESPARSE_SEMI24_PACKER", "mapp")  # was silently the cuSPARSELt packer
    with pytest.raises(ValueError, match="TILESPARSE_SEMI24_PACKER"):
        value_map.use_value_maps()


@pytest.mark.parametrize("value", [None, "", "1", " Off ", "caf\u00e9"])
def test_the_fast_read_sees_what_os_environ_holds(monkeypatch, value):
    from tilesparse._env import _raw
    if value is None:
        monkeypatch.delenv(NAME, raising=False)
    else:
        monkeypatch.setenv(NAME, value)
    assert _raw(NAME) == __import__("os").environ.get(NAME)


def test_a_mapping_in_place_of_os_environ_is_read_plainly(monkeypatch):
    import os

    from tilesparse._env import _raw
    monkeypatch.setattr(os, "environ", {NAME: "on"})  # e.g. a test's stand-in: no _data / encodekey
    assert _raw(NAME) == "on" and switch(NAME, False) is True
    assert _raw(NAME + "_UNSET") is None
