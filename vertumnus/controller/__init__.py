"""Window-based split / merge controller over the grouping lattice, under configuration epochs (DESIGN.md §2)."""
