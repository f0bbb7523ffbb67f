"""Code the tests share: fakes' launchers, synthetic data, clocks. Test files import from here,
never from each other (``tests/test_structure.py`` holds that)."""
