"""A module whose import fails: ``capkv check`` must say so in one line."""

1 / 0
