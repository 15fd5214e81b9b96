"""Registered experiments: each writes a results JSON, plots and a markdown table under its output folder."""

from .registry import get_experiment, list_experiments, register_experiment

__all__ = ["get_experiment", "list_experiments", "register_experiment"]
