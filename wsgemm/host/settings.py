"""The words wsgemm's on/off environment switches accept (``WSGEMM_DISK_CACHE``,
``WSGEMM_CACHE_SHARED``, ``WSGEMM_AUTOTUNE``), in one place for every room that reads one.
Lower-cased and stripped before the comparison."""

FALSE_WORDS = frozenset({"0", "false", "no", "off"})
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
