"""Planner, template rendering, compile and link of the K2 kernel."""
