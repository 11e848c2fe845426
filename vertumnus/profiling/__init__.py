"""Cost model, its fitting, and the `vertumnus profile` measurement flow."""
