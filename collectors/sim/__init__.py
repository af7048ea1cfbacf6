"""The simulated clock: the real engine driven at simulated time (docs/STUDIES.md "The simulated clock")."""
