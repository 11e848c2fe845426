"""Evaluation on top of the simulator (:mod:`vertumnus.sim`): the out-of-sample protocol, fixed-composition
search, sensitivity sweeps, the decision audit and the docs/results.md generators. Depends on the simulator,
never the other way round."""
