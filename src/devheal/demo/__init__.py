"""``devheal demo``: the story of a failing GPU, told on the lab."""
