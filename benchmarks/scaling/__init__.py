"""The scaling report and map: profiles over a grid of configurations, their tables and figures."""
